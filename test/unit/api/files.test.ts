/**
 * REST: a sandbox's files and directories (/v1/sandboxes/{id}/fs/..., streamed /files) on the fake
 * service. Streaming (uploads, aborted uploads, watch streams) goes over a real listening socket.
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

let f: Fixture;
let key: string;
let base: string;

async function create(): Promise<string> {
  return (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json().id;
}

function request(method: string, path: string, opts: { body?: Readable | Buffer; headers?: Record<string, string> } = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${base}${path}`, { method, headers: { authorization: `Bearer ${key}`, ...(opts.headers ?? {}) } }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(parts) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    if (opts.body instanceof Readable) opts.body.pipe(req);
    else req.end(opts.body);
  });
}

/** An SSE stream's events as they come. */
class SseReader {
  readonly events: Array<{ event: string; data: any }> = [];
  ended = false;
  private buffer = '';

  constructor(readonly res: http.IncomingMessage) {
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => {
      this.buffer += chunk;
      let end;
      while ((end = this.buffer.indexOf('\n\n')) >= 0) {
        const block = this.buffer.slice(0, end);
        this.buffer = this.buffer.slice(end + 2);
        const event = /^event: (.*)$/m.exec(block)?.[1];
        const data = /^data: (.*)$/m.exec(block)?.[1];
        if (event && data) this.events.push({ event, data: JSON.parse(data) });
      }
    });
    res.on('end', () => (this.ended = true));
  }

  async until(match: (e: { event: string; data: any }) => boolean, timeoutMs = 10_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = this.events.find(match);
      if (found) return found;
      if (Date.now() > deadline) throw new Error(`no matching event in ${JSON.stringify(this.events)}`);
      await sleep(10);
    }
  }
}

async function openWatch(id: string, query: string): Promise<{ status: number; reader?: SseReader; body?: any; req: http.ClientRequest }> {
  const req = http.request(`${base}/v1/sandboxes/${id}/fs/watch?${query}`, { headers: { authorization: `Bearer ${key}` } });
  req.end();
  const [res] = (await once(req, 'response')) as [http.IncomingMessage];
  if (res.statusCode !== 200) {
    const parts: Buffer[] = [];
    for await (const c of res) parts.push(c as Buffer);
    return { status: res.statusCode!, body: JSON.parse(Buffer.concat(parts).toString()), req };
  }
  return { status: 200, reader: new SseReader(res), req };
}

before(async () => {
  f = await fixture({ server: { maxFileBytes: 4 * 1024 * 1024 } });
  key = f.key('files-tenant', 'pro');
  const address = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  base = address.startsWith('http') ? address : `http://127.0.0.1:${(f.api.app.server.address() as AddressInfo).port}`;
});
after(() => f.close());

describe('directories', () => {
  test('mkdir (-p, mode, created), stat, exists, list with depth, rename, remove', async () => {
    const id = await create();
    let r = await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body: { path: '/work/a/b', mode: '750' } });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().created, true);
    assert.equal(r.json().entry.type, 'dir');
    assert.equal(r.json().entry.mode, 0o750);
    assert.equal(r.json().entry.permissions, 'rwxr-x---');
    r = await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body: { path: '/work/a/b' } });
    assert.equal(r.json().created, false);

    await f.req('writeFile', { url: `/v1/sandboxes/${id}/files?path=/work/a/note.txt&mode=640`, key, rawBody: 'hello' });
    r = await f.req('statPath', { url: `/v1/sandboxes/${id}/fs/stat?path=/work/a/note.txt`, key });
    assert.equal(r.statusCode, 200);
    const entry = r.json();
    assert.deepEqual(
      { name: entry.name, path: entry.path, type: entry.type, size: entry.size, mode: entry.mode, permissions: entry.permissions, owner: entry.owner },
      { name: 'note.txt', path: '/work/a/note.txt', type: 'file', size: 5, mode: 0o640, permissions: 'rw-r-----', owner: 'root' },
    );
    assert.match(entry.mtime_ns, /^\d+$/);
    assert.equal(Date.parse(entry.modified_at), Number(BigInt(entry.mtime_ns) / 1_000_000n));

    // Relative paths are under /root.
    await f.req('writeFile', { url: `/v1/sandboxes/${id}/files?path=/root/rel.txt`, key, rawBody: 'r' });
    assert.equal((await f.req('statPath', { url: `/v1/sandboxes/${id}/fs/stat?path=rel.txt`, key })).json().path, '/root/rel.txt');

    assert.deepEqual((await f.req('pathExists', { url: `/v1/sandboxes/${id}/fs/exists?path=/work/a`, key })).json(), { path: '/work/a', exists: true });
    assert.deepEqual((await f.req('pathExists', { url: `/v1/sandboxes/${id}/fs/exists?path=/work/zzz`, key })).json(), { path: '/work/zzz', exists: false });
    // A file in the way above the path: nothing is there either.
    assert.equal((await f.req('pathExists', { url: `/v1/sandboxes/${id}/fs/exists?path=/work/a/note.txt/x`, key })).json().exists, false);

    r = await f.req('listDirectory', { url: `/v1/sandboxes/${id}/fs/list?path=/work`, key });
    assert.deepEqual(r.json().entries.map((e: any) => e.name), ['a']);
    assert.equal(r.json().truncated, false);
    r = await f.req('listDirectory', { url: `/v1/sandboxes/${id}/fs/list?path=/work&depth=3`, key });
    assert.deepEqual(r.json().entries.map((e: any) => e.path), ['/work/a', '/work/a/b', '/work/a/note.txt']);

    r = await f.req('renamePath', { url: `/v1/sandboxes/${id}/fs/rename`, key, body: { from: '/work/a/note.txt', to: '/work/moved.txt' } });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().path, '/work/moved.txt');
    assert.equal(r.json().size, 5);
    assertErrorBody(await f.req('statPath', { url: `/v1/sandboxes/${id}/fs/stat?path=/work/a/note.txt`, key }), 'file_not_found');

    r = await f.req('removePath', { url: `/v1/sandboxes/${id}/fs/remove`, key, body: { path: '/work' } });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().path, '/work');
    assert.ok(r.json().removed >= 3);
    assert.equal((await f.req('pathExists', { url: `/v1/sandboxes/${id}/fs/exists?path=/work`, key })).json().exists, false);
  });

  test('errors keep their codes: not found, file in the way, bad paths, wrong state', async () => {
    const id = await create();
    await f.req('writeFile', { url: `/v1/sandboxes/${id}/files?path=/f`, key, rawBody: 'x' });
    assertErrorBody(await f.req('statPath', { url: `/v1/sandboxes/${id}/fs/stat?path=/nope`, key }), 'file_not_found');
    assertErrorBody(await f.req('listDirectory', { url: `/v1/sandboxes/${id}/fs/list?path=/f`, key }), 'not_a_directory');
    assertErrorBody(await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body: { path: '/f' } }), 'file_exists');
    assertErrorBody(await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body: { path: '/f/sub' } }), 'not_a_directory');
    assertErrorBody(await f.req('removePath', { url: `/v1/sandboxes/${id}/fs/remove`, key, body: { path: '/nope' } }), 'file_not_found');
    assertErrorBody(await f.req('renamePath', { url: `/v1/sandboxes/${id}/fs/rename`, key, body: { from: '/nope', to: '/x' } }), 'file_not_found');
    for (const q of ['', '?path=', '?path=%00x', '?path=/a&depth=0', '?path=/a&depth=33', '?path=/a&other=1']) {
      assertErrorBody(await f.req('listDirectory', { url: `/v1/sandboxes/${id}/fs/list${q}`, key }), 'validation_error');
    }
    for (const body of [{}, { path: '' }, { path: '/a', mode: '999' }, { path: '/a', extra: 1 }]) {
      assertErrorBody(await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body }), 'validation_error');
    }
    assertErrorBody(await f.req('renamePath', { url: `/v1/sandboxes/${id}/fs/rename`, key, body: { from: '/f' } }), 'validation_error');
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${id}/suspend`, key });
    assertErrorBody(await f.req('statPath', { url: `/v1/sandboxes/${id}/fs/stat?path=/f`, key }), 'invalid_state');
    assertErrorBody(await f.req('pathExists', { url: `/v1/sandboxes/${id}/fs/exists?path=/f`, key }), 'invalid_state');
  });
});

describe('streamed files', () => {
  test('a chunked upload streams to the service and downloads back with its length and mode', async () => {
    const id = await create();
    const data = randomBytes(3 * 1024 * 1024 + 11);
    const pieces = Array.from({ length: 30 }, (_, i) => data.subarray(Math.floor((i * data.length) / 30), Math.floor(((i + 1) * data.length) / 30)));
    const put = await request('PUT', `/v1/sandboxes/${id}/files?path=/data/big.bin&mode=600`, { body: Readable.from(pieces) });
    assert.equal(put.status, 200, put.body.toString());
    assert.deepEqual(JSON.parse(put.body.toString()), { path: '/data/big.bin', size: data.length });
    const get = await request('GET', `/v1/sandboxes/${id}/files?path=/data/big.bin`);
    assert.equal(get.status, 200);
    assert.equal(get.headers['content-length'], String(data.length));
    assert.equal(get.headers['x-file-mode'], '600');
    assert.equal(createHash('sha256').update(get.body).digest('hex'), createHash('sha256').update(data).digest('hex'));
  });

  test('uploads over the limit are 413, declared or not, and leave nothing', async () => {
    const id = await create();
    const declared = await request('PUT', `/v1/sandboxes/${id}/files?path=/too-big`, { body: Buffer.alloc(5 * 1024 * 1024) });
    assert.equal(declared.status, 413);
    assert.equal(JSON.parse(declared.body.toString()).error.code, 'payload_too_large');
    assert.match(JSON.parse(declared.body.toString()).error.message, /limit of 4194304 bytes/);
    const chunked = await request('PUT', `/v1/sandboxes/${id}/files?path=/too-big`, {
      body: Readable.from(Array.from({ length: 10 }, () => Buffer.alloc(512 * 1024))),
    });
    assert.equal(chunked.status, 413);
    assert.equal(JSON.parse(chunked.body.toString()).error.code, 'payload_too_large');
    assert.equal((await f.req('pathExists', { url: `/v1/sandboxes/${id}/fs/exists?path=/too-big`, key })).json().exists, false);
  });

  test('a client still sending a refused upload reads the error, and its connection carries the next request', async () => {
    const id = await create();
    // A raw client that sends the whole body before it reads anything, as Python's http.client does.
    const socket = connect(Number(new URL(base).port), '127.0.0.1');
    const received: Buffer[] = [];
    socket.on('data', (c: Buffer) => received.push(c));
    const answer = async (): Promise<string> => {
      for (let i = 0; i < 500 && !/\r\n\r\n[\s\S]*\}$/.test(Buffer.concat(received).toString()); i++) await sleep(10);
      const text = Buffer.concat(received).toString();
      received.length = 0;
      return text;
    };
    const refusals = [
      { label: 'over the limit', path: `/v1/sandboxes/${id}/files?path=/too-big`, status: 413 },
      { label: 'no such sandbox', path: '/v1/sandboxes/sbx_000000000000/files?path=/x', status: 404 },
    ];
    for (const r of refusals) {
      socket.write(`PUT ${r.path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${key}\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n`);
      for (let i = 0; i < 12; i++) socket.write(`80000\r\n${'\0'.repeat(512 * 1024)}\r\n`);
      socket.write('0\r\n\r\n');
      const text = await answer();
      assert.match(text, new RegExp(`^HTTP/1.1 ${r.status} `), `${r.label}: ${text.slice(0, 200)}`);
      assert.doesNotMatch(text, /connection: close/i, `${r.label}: the whole body was read, so the connection stays open`);
    }
    socket.write(`GET /v1/sandboxes/${id}/fs/exists?path=/too-big HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${key}\r\n\r\n`);
    const next = await answer();
    assert.match(next, /^HTTP\/1.1 200 /);
    assert.match(next, /"exists":false/);
    socket.destroy();
  });

  test('an upload aborted mid-body leaves no file and the old content', async () => {
    const id = await create();
    await f.req('writeFile', { url: `/v1/sandboxes/${id}/files?path=/kept`, key, rawBody: 'old' });
    const req = http.request(`${base}/v1/sandboxes/${id}/files?path=/kept`, { method: 'PUT', headers: { authorization: `Bearer ${key}`, 'transfer-encoding': 'chunked' } });
    req.on('error', () => {});
    req.write(Buffer.alloc(300 * 1024, 1));
    await sleep(100);
    req.destroy();
    await sleep(200);
    const back = await request('GET', `/v1/sandboxes/${id}/files?path=/kept`);
    assert.equal(back.body.toString(), 'old');
  });
});

describe('watch', () => {
  test('an SSE stream of changes that ends with the reason when the sandbox is suspended', async () => {
    const id = await create();
    await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body: { path: '/w' } });
    const w = await openWatch(id, 'path=/w&recursive=true');
    assert.equal(w.status, 200);
    const reader = w.reader!;
    await f.req('writeFile', { url: `/v1/sandboxes/${id}/files?path=/w/sub/file.txt`, key, rawBody: 'x' });
    await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body: { path: '/w/d' } });
    await f.req('removePath', { url: `/v1/sandboxes/${id}/fs/remove`, key, body: { path: '/w/d' } });
    await reader.until((e) => e.event === 'change' && e.data.op === 'create' && e.data.name === 'sub/file.txt');
    await reader.until((e) => e.event === 'change' && e.data.op === 'remove' && e.data.name === 'd');
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${id}/suspend`, key });
    const end = await reader.until((e) => e.event === 'end');
    assert.deepEqual(end.data, { reason: 'sandbox_suspended' });
    for (let i = 0; i < 1000 && !reader.ended; i++) await sleep(10);
    assert.ok(reader.ended, 'the stream ends after its end event');
  });

  test('errors before the stream are JSON with their status; closing the connection stops the watch', async () => {
    const id = await create();
    const missing = await openWatch(id, 'path=/nowhere');
    assert.equal(missing.status, 404);
    assert.equal(missing.body.error.code, 'file_not_found');
    const bad = await openWatch(id, 'path=/x&recursive=maybe');
    assert.equal(bad.status, 400);

    await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body: { path: '/w2' } });
    // The stream opens at once, before any change: a client knows the watch is in place.
    // No change ever comes: headers within the bound (generous, for a loaded host) can only be the stream opening.
    const opened = await Promise.race([openWatch(id, 'path=/w2'), sleep(10_000, null, { ref: false })]);
    assert.ok(opened, 'no response headers before the first event');
    const w = opened;
    assert.equal(w.status, 200);
    const box = (f.svc as any).boxes.get(id);
    assert.equal(box.watchers.size, 1);
    w.req.destroy();
    for (let i = 0; i < 1000 && box.watchers.size > 0; i++) await sleep(10);
    assert.equal(box.watchers.size, 0, 'the watch stopped with its connection');
  });

  test('a client that stops reading loses changes past SSE_PENDING_MAX waiting, and is told so (overflow) once it reads again', async () => {
    const id = await create();
    await f.req('makeDirectory', { url: `/v1/sandboxes/${id}/fs/mkdir`, key, body: { path: '/w3' } });
    const w = await openWatch(id, 'path=/w3');
    const reader = w.reader!;
    reader.res.pause();
    const box = (f.svc as any).boxes.get(id);
    const [watch] = [...box.watchers] as Array<{ handlers: { onChange(c: { op: string; name: string }): void } }>;
    // 32 MiB of changes while the client reads nothing: more than the socket's buffers and the bound.
    const name = 'n'.repeat(4000);
    const sent = 8192;
    for (let i = 0; i < sent; i++) {
      watch.handlers.onChange({ op: 'write', name: `${name}${i}` });
      if (i % 256 === 0) await sleep(1);
    }
    reader.res.resume();
    await sleep(200);
    watch.handlers.onChange({ op: 'write', name: 'after' });
    await reader.until((e) => e.event === 'change' && e.data.name === 'after', 10_000);
    const changes = reader.events.filter((e) => e.event === 'change');
    assert.ok(changes.length < sent, `the server held ${changes.length} of ${sent} changes for a client that did not read`);
    const overflowAt = changes.findIndex((e) => e.data.op === 'overflow');
    assert.equal(overflowAt, changes.length - 2, 'overflow comes right before the first change after the gap');
    w.req.destroy();
  });
});
