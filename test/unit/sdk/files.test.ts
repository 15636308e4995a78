/**
 * Both SDKs' files API against a real API server on the fake service: list, stat, exists, mkdir,
 * remove, rename, streamed upload and download (to and from local files), watch, and the file error
 * classes. The Python half runs python/test_files.py against the same server.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { fixture, type Fixture } from '../api/helpers.js';
import { Collimate, FileConflictError, NotFoundError, PayloadTooLargeError, type WatchEvent } from '../../../src/sdk/index.js';

let f: Fixture;
let base: string;
let dir: string;

before(async () => {
  f = await fixture({ server: { maxFileBytes: 2 * 1024 * 1024 } });
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  dir = mkdtempSync(join(tmpdir(), 'collimate-sdk-files-'));
});
after(async () => {
  await f.close();
  rmSync(dir, { recursive: true, force: true });
});

test('TypeScript SDK: directory operations, streamed transfers, watch and the file errors', async () => {
  const client = new Collimate({ baseUrl: base, apiKey: f.key('ts-files', 'pro') });
  await using sb = await client.sandboxes.create({ template: 'base' });

  assert.deepEqual(await sb.files.mkdir('/data/in', { mode: 0o750 }).then((r) => [r.created, r.entry.mode]), [true, 0o750]);
  assert.equal((await sb.files.mkdir('/data/in')).created, false);
  await sb.files.write('/data/in/a.txt', 'alpha');
  const entry = await sb.files.stat('/data/in/a.txt');
  assert.equal(entry.size, 5);
  assert.equal(entry.type, 'file');
  assert.equal(entry.permissions, 'rw-r--r--');
  assert.equal(await sb.files.exists('/data/in/a.txt'), true);
  assert.equal(await sb.files.exists('/data/none'), false);
  const listing = await sb.files.list('/data', { depth: 2 });
  assert.deepEqual(listing.entries.map((e) => e.path), ['/data/in', '/data/in/a.txt']);
  assert.equal(listing.truncated, false);
  assert.equal((await sb.files.rename('/data/in/a.txt', '/data/b.txt')).path, '/data/b.txt');
  await assert.rejects(sb.files.stat('/data/in/a.txt'), (e: unknown) => e instanceof NotFoundError && (e as NotFoundError).code === 'file_not_found');
  await assert.rejects(sb.files.mkdir('/data/b.txt'), (e: unknown) => e instanceof FileConflictError && (e as FileConflictError).code === 'file_exists' && (e as FileConflictError).status === 409);

  // Streamed: from a local file up, back down to another local file, byte for byte.
  const data = randomBytes(1536 * 1024 + 3);
  writeFileSync(join(dir, 'up.bin'), data);
  assert.deepEqual(await sb.files.uploadFrom(join(dir, 'up.bin'), '/data/blob.bin', { mode: 0o600 }), { path: '/data/blob.bin', size: data.length });
  assert.deepEqual(await sb.files.downloadTo('/data/blob.bin', join(dir, 'down.bin')), { size: data.length });
  assert.ok(readFileSync(join(dir, 'down.bin')).equals(data));
  const { size, mode, stream } = await sb.files.download('/data/blob.bin');
  assert.equal(size, data.length);
  assert.equal(mode, 0o600);
  let got = 0;
  for await (const c of stream as unknown as AsyncIterable<Uint8Array>) got += c.length;
  assert.equal(got, data.length);
  await assert.rejects(sb.files.upload('/data/huge.bin', Readable.from([Buffer.alloc(3 * 1024 * 1024)])), PayloadTooLargeError);
  // A body far over the limit: fetch reads no answer before it has sent the whole body, so the server reads and drops the rest first.
  for (let i = 0; i < 3; i++) {
    await assert.rejects(sb.files.upload('/data/huge.bin', Readable.from(Array.from({ length: 80 }, () => Buffer.alloc(512 * 1024)))), PayloadTooLargeError);
  }
  await assert.rejects(sb.files.downloadTo('/data/none', join(dir, 'none.bin')), NotFoundError);
  assert.deepEqual(readdirSync(dir).sort(), ['down.bin', 'up.bin'], 'a failed download leaves no partial file');

  // Watch: changes as they happen, then the end when the sandbox is suspended.
  const seen: WatchEvent[] = [];
  const watching = (async () => {
    for await (const ev of sb.files.watch('/data', { recursive: true })) seen.push(ev);
  })();
  await new Promise((r) => setTimeout(r, 100));
  await sb.files.write('/data/in/new.txt', 'x');
  await sb.files.remove('/data/b.txt');
  while (seen.length < 2) await new Promise((r) => setTimeout(r, 10));
  await sb.suspend();
  await watching;
  assert.deepEqual(seen, [
    { type: 'change', op: 'create', name: 'in/new.txt' },
    { type: 'change', op: 'remove', name: 'b.txt' },
    { type: 'end', reason: 'sandbox_suspended' },
  ]);
  await sb.resume();

  // Breaking out of a watch stops it on the server.
  const box = (f.svc as any).boxes.get(sb.id);
  const trigger = (async () => {
    await new Promise((r) => setTimeout(r, 100));
    await sb.files.write('/data/trigger', 'x');
  })();
  for await (const ev of sb.files.watch('/data')) {
    assert.deepEqual(ev, { type: 'change', op: 'create', name: 'trigger' });
    break;
  }
  await trigger;
  for (let i = 0; i < 100 && box.watchers.size > 0; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal(box.watchers.size, 0);
});

test('Python SDK: the same surface (python/test_files.py against this server)', async () => {
  const script = fileURLToPath(new URL('./python/test_files.py', import.meta.url));
  const env = { ...process.env, COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: f.key('py-files', 'pro'), COLLIMATE_TEST_DIR: dir };
  const r = await promisify(execFile)('/usr/bin/python3', [script], { env, timeout: 60_000 }).catch((e) => e);
  assert.equal(r.code ?? 0, 0, `${r.stdout}\n${r.stderr}`);
  assert.match(r.stderr, /Ran 1 test[\s\S]*\nOK\s*$/);
});
