/** `collimate files` against a real API server on the fake service. */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { run, type Io } from '../../../src/cli/commands.js';
import { fixture, type Fixture } from '../api/helpers.js';

let f: Fixture;
let url: string;
let key: string;
let dir: string;

before(async () => {
  f = await fixture();
  key = f.key('cli-files', 'pro');
  url = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  dir = mkdtempSync(join(tmpdir(), 'collimate-cli-files-'));
});
after(async () => {
  await f.close();
  rmSync(dir, { recursive: true, force: true });
});

async function cli(...argv: string[]) {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const io: Io = {
    out: (s) => out.push(Buffer.from(s)),
    err: (s) => err.push(Buffer.from(s)),
    outBytes: (b) => out.push(b),
    errBytes: (b) => err.push(b),
    env: { COLLIMATE_BASE_URL: url, COLLIMATE_API_KEY: key },
  };
  const code = await run(argv, io);
  return { code, out: Buffer.concat(out), err: Buffer.concat(err).toString() };
}

test('files mkdir, upload, ls, stat, exists, mv, download (to a file and to stdout), rm, watch', async () => {
  const id = JSON.parse((await cli('sandboxes', 'create', '--template', 'base', '--json')).out.toString()).id;
  let r = await cli('files', 'mkdir', id, 'proj/src', '--mode', '750');
  assert.equal(r.code, 0, r.err);
  assert.equal(r.out.toString(), 'created /root/proj/src\n');
  assert.equal((await cli('files', 'mkdir', id, '/root/proj/src')).out.toString(), 'exists /root/proj/src\n');

  const data = randomBytes(700 * 1024);
  writeFileSync(join(dir, 'in.bin'), data);
  r = await cli('files', 'upload', id, join(dir, 'in.bin'), 'proj/src/data.bin', '--mode', '600');
  assert.equal(r.code, 0, r.err);
  assert.equal(r.out.toString(), `uploaded ${data.length} bytes to /root/proj/src/data.bin\n`);

  r = await cli('files', 'ls', id, '/root/proj', '--depth', '2');
  assert.match(r.out.toString(), /^TYPE\s+PERMISSIONS\s+OWNER\s+SIZE\s+MODIFIED_AT\s+PATH\n/);
  assert.match(r.out.toString(), /dir\s+rwxr-x---\s+root\s+\d+\s+\S+\s+\/root\/proj\/src\n/);
  assert.match(r.out.toString(), new RegExp(`file\\s+rw-------\\s+root\\s+${data.length}\\s+\\S+\\s+/root/proj/src/data.bin\\n`));
  const listed = JSON.parse((await cli('files', 'ls', id, '/root/proj', '--json')).out.toString());
  assert.deepEqual(listed.entries.map((e: any) => e.name), ['src']);

  r = await cli('files', 'stat', id, '/root/proj/src/data.bin', '--json');
  assert.equal(JSON.parse(r.out.toString()).size, data.length);
  assert.match((await cli('files', 'stat', id, '/root/proj/src/data.bin')).out.toString(), /^name\s+data\.bin\n/);
  assert.deepEqual(await cli('files', 'exists', id, '/root/proj/src/data.bin').then((x) => [x.code, x.out.toString()]), [0, 'true\n']);
  assert.deepEqual(await cli('files', 'exists', id, '/root/nothing').then((x) => [x.code, x.out.toString()]), [1, 'false\n']);

  assert.equal((await cli('files', 'mv', id, '/root/proj/src/data.bin', '/root/proj/moved.bin')).out.toString(), '/root/proj/moved.bin\n');
  r = await cli('files', 'download', id, 'proj/moved.bin', join(dir, 'out.bin'));
  assert.equal(r.code, 0, r.err);
  assert.ok(readFileSync(join(dir, 'out.bin')).equals(data));
  r = await cli('files', 'download', id, '/root/proj/moved.bin', '-');
  assert.ok(r.out.equals(data), 'download to stdout writes the raw bytes');

  r = await cli('files', 'stat', id, '/root/proj/src/data.bin');
  assert.equal(r.code, 1);
  assert.match(r.err, /^error: file_not_found: /);
  assert.equal((await cli('files', 'mkdir', id, '/x', '--mode', 'rwx')).code, 2);
  assert.equal((await cli('files', 'nope', id)).code, 2);

  // watch prints one line per change and stops when the sandbox is suspended.
  const watching = cli('files', 'watch', id, '/root/proj', '--recursive');
  await new Promise((res) => setTimeout(res, 200));
  r = await cli('files', 'rm', id, '/root/proj/moved.bin');
  assert.equal(r.out.toString(), 'removed /root/proj/moved.bin (1 entry)\n');
  await new Promise((res) => setTimeout(res, 100));
  await cli('sandboxes', 'suspend', id);
  const w = await watching;
  assert.equal(w.code, 0, w.err);
  assert.equal(w.out.toString(), 'remove   moved.bin\n');
  assert.equal(w.err, 'watch ended: sandbox_suspended\n');
});
