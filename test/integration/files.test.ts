/**
 * Files as a native API on real VMs, over HTTP: directory operations, a 200 MiB upload and download
 * streamed with the server's memory bounded and the bytes identical, an aborted upload leaving no
 * file, watch streams seeing events while an exec runs and ending when the sandbox is suspended or
 * deleted, and an idle-paused sandbox woken by a directory request.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import v8 from 'node:v8';
import vm from 'node:vm';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { checkResponse } from '../unit/api/helpers.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, type Served } from './fixture.ts';

const MiB = 1024 * 1024;
const BIG = 200 * MiB;
const IDLE_SECS = 3;

let engine: Engine;
let api: Served;
let home: string;
let base: string;
let key: string;

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

interface Res { status: number; text: string; json(): any }

async function call(op: string, method: string, path: string, body?: unknown): Promise<Res> {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  const h: Record<string, string> = {};
  res.headers.forEach((v, k) => { h[k] = v; });
  checkResponse(op, { statusCode: res.status, headers: h, body: text, json: () => JSON.parse(text) } as any);
  return { status: res.status, text, json: () => JSON.parse(text) };
}

async function createSandbox(): Promise<string> {
  const r = await call('createSandbox', 'POST', '/v1/sandboxes', { template: 'base' });
  assert.equal(r.status, 201, r.text);
  return r.json().id;
}

async function sh(id: string, command: string): Promise<string> {
  const r = (await call('execSandbox', 'POST', `/v1/sandboxes/${id}/exec`, { command, timeout: 300 })).json();
  assert.equal(r.exit_code, 0, `${command}: ${r.stderr}`);
  return r.stdout;
}

/** Peak of the process's ArrayBuffer memory (Buffers) while `fn` runs, sampled after a GC every 100 ms. */
async function peakBufferMemory<T>(fn: () => Promise<T>): Promise<{ result: T; peakMiB: number; baseMiB: number }> {
  gc();
  const baseline = process.memoryUsage().arrayBuffers;
  let peak = baseline;
  const timer = setInterval(() => {
    gc();
    peak = Math.max(peak, process.memoryUsage().arrayBuffers);
  }, 100);
  try {
    const result = await fn();
    return { result, peakMiB: (peak - baseline) / MiB, baseMiB: baseline / MiB };
  } finally {
    clearInterval(timer);
  }
}

/** `total` pseudo-random bytes in 1 MiB pieces, hashed as they are made (never all in memory). */
function randomSource(total: number, hash: ReturnType<typeof createHash>): Readable {
  let sent = 0;
  return new Readable({
    read() {
      if (sent >= total) return void this.push(null);
      const piece = randomBytes(Math.min(MiB, total - sent));
      sent += piece.length;
      hash.update(piece);
      this.push(piece);
    },
  });
}

/** An SSE watch stream's events as they come. */
class Watch {
  readonly events: Array<{ event: string; data: any }> = [];
  ended = false;
  private buffer = '';

  private constructor(readonly req: http.ClientRequest, res: http.IncomingMessage) {
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
    res.on('error', () => (this.ended = true));
  }

  static async open(id: string, path: string, recursive: boolean): Promise<Watch> {
    const req = http.request(`${base}/v1/sandboxes/${id}/fs/watch?path=${encodeURIComponent(path)}&recursive=${recursive}`, { headers: { authorization: `Bearer ${key}` } });
    req.end();
    const [res] = (await once(req, 'response')) as [http.IncomingMessage];
    assert.equal(res.statusCode, 200);
    return new Watch(req, res);
  }

  async until(what: string, match: (e: { event: string; data: any }) => boolean, timeoutMs = 30_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = this.events.find(match);
      if (found) return found;
      assert.ok(Date.now() < deadline, `${what}: not seen in ${JSON.stringify(this.events)}`);
      await sleep(20);
    }
  }

  change(op: string, name: string) {
    return this.until(`${op} ${name}`, (e) => e.event === 'change' && e.data.op === op && e.data.name === name);
  }
}

before(async () => {
  home = testHome('files');
  engine = await openEngine(home, { idlePauseSecs: IDLE_SECS });
  api = await serveEngine(engine, { maxFileBytes: BIG + MiB });
  base = await api.app.listen({ host: '127.0.0.1', port: 0 });
  key = api.keys.create({ tenant: 'files-it', tier: 'pro' }).key;
});

after(async () => {
  await api.close(1000);
  await assertNoLeaks(engine, home);
});

test('directory operations: mkdir, stat, exists, list, rename, remove, and their errors', async () => {
  const id = await createSandbox();
  let r = await call('makeDirectory', 'POST', `/v1/sandboxes/${id}/fs/mkdir`, { path: '/root/proj/src/deep', mode: '750' });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json().created, true);
  assert.equal(r.json().entry.permissions, 'rwxr-x---');
  assert.equal((await call('makeDirectory', 'POST', `/v1/sandboxes/${id}/fs/mkdir`, { path: 'proj/src/deep' })).json().created, false);
  assert.equal((await sh(id, 'stat -c %a /root/proj /root/proj/src /root/proj/src/deep')).trim(), '750\n750\n750');

  await sh(id, 'echo hello > /root/proj/src/main.py && ln -s main.py /root/proj/src/link && useradd -M alice 2>/dev/null || adduser -D -H alice 2>/dev/null; chown alice /root/proj/src/main.py 2>/dev/null; true');
  r = await call('statPath', 'GET', `/v1/sandboxes/${id}/fs/stat?path=/root/proj/src/main.py`);
  const entry = r.json();
  assert.equal(entry.type, 'file');
  assert.equal(entry.size, 6);
  assert.equal(entry.permissions, 'rw-r--r--');
  assert.equal(entry.group, 'root');
  const owner = (await sh(id, 'stat -c %U /root/proj/src/main.py')).trim();
  assert.equal(entry.owner, owner, 'owner name from the guest\'s /etc/passwd');
  const guestMtime = (await sh(id, 'stat -c %Y /root/proj/src/main.py')).trim();
  assert.equal(Math.floor(Date.parse(entry.modified_at) / 1000), Number(guestMtime));
  const link = (await call('statPath', 'GET', `/v1/sandboxes/${id}/fs/stat?path=/root/proj/src/link`)).json();
  assert.equal(link.type, 'symlink');
  assert.equal(link.symlink_target, 'main.py');

  assert.equal((await call('pathExists', 'GET', `/v1/sandboxes/${id}/fs/exists?path=/root/proj/src/main.py`)).json().exists, true);
  assert.equal((await call('pathExists', 'GET', `/v1/sandboxes/${id}/fs/exists?path=/root/proj/nothing`)).json().exists, false);

  const listing = (await call('listDirectory', 'GET', `/v1/sandboxes/${id}/fs/list?path=/root/proj&depth=3`)).json();
  assert.deepEqual(listing.entries.map((e: any) => `${e.type}:${e.path}`), [
    'dir:/root/proj/src', 'dir:/root/proj/src/deep', 'symlink:/root/proj/src/link', 'file:/root/proj/src/main.py',
  ]);
  assert.equal(listing.truncated, false);

  r = await call('renamePath', 'POST', `/v1/sandboxes/${id}/fs/rename`, { from: '/root/proj/src/main.py', to: '/root/proj/app.py' });
  assert.equal(r.json().path, '/root/proj/app.py');
  assert.equal((await sh(id, 'cat /root/proj/app.py')).trim(), 'hello');

  assert.equal((await call('statPath', 'GET', `/v1/sandboxes/${id}/fs/stat?path=/root/proj/src/main.py`)).json().error.code, 'file_not_found');
  assert.equal((await call('makeDirectory', 'POST', `/v1/sandboxes/${id}/fs/mkdir`, { path: '/root/proj/app.py' })).json().error.code, 'file_exists');
  assert.equal((await call('listDirectory', 'GET', `/v1/sandboxes/${id}/fs/list?path=/root/proj/app.py`)).json().error.code, 'not_a_directory');
  assert.equal((await call('renamePath', 'POST', `/v1/sandboxes/${id}/fs/rename`, { from: '/root/proj/app.py', to: '/root/proj/src' })).json().error.code, 'is_a_directory');

  // A pseudo-file states size 0: it is read to its end, sent without a Content-Length.
  const version = await fetch(`${base}/v1/sandboxes/${id}/files?path=/proc/version`, { headers: { authorization: `Bearer ${key}` } });
  assert.equal(version.status, 200);
  assert.equal(version.headers.get('content-length'), null);
  assert.equal(await version.text(), await sh(id, 'cat /proc/version'));

  r = await call('removePath', 'POST', `/v1/sandboxes/${id}/fs/remove`, { path: '/root/proj' });
  assert.equal(r.json().removed, 5);
  assert.equal((await sh(id, 'test -e /root/proj && echo present || echo gone')).trim(), 'gone');
  assert.equal((await call('removePath', 'POST', `/v1/sandboxes/${id}/fs/remove`, { path: '/root/proj' })).json().error.code, 'file_not_found');
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`);
});

test('200 MiB up and down, streamed: identical bytes, the server\'s buffer memory bounded; an aborted upload leaves nothing', async (t) => {
  const id = await createSandbox();
  await sh(id, 'echo previous > /root/big.bin');
  const sent = createHash('sha256');
  const upStart = Date.now();
  const up = await peakBufferMemory(async () => {
    const req = http.request(`${base}/v1/sandboxes/${id}/files?path=/root/big.bin&mode=600`, { method: 'PUT', headers: { authorization: `Bearer ${key}` } });
    randomSource(BIG, sent).pipe(req);
    const [res] = (await once(req, 'response')) as [http.IncomingMessage];
    let body = '';
    for await (const c of res) body += c;
    return { status: res.statusCode, body };
  });
  assert.equal(up.result.status, 200, up.result.body);
  assert.deepEqual(JSON.parse(up.result.body), { path: '/root/big.bin', size: BIG });
  const sentHex = sent.digest('hex');
  t.diagnostic(`upload: ${BIG / MiB} MiB in ${((Date.now() - upStart) / 1000).toFixed(1)} s, buffer memory +${up.peakMiB.toFixed(1)} MiB at most`);
  assert.ok(up.peakMiB < 48, `buffer memory grew by ${up.peakMiB.toFixed(1)} MiB during a ${BIG / MiB} MiB upload`);
  assert.equal((await sh(id, 'sha256sum /root/big.bin')).split(' ')[0], sentHex, 'the guest holds exactly the bytes sent');
  assert.equal((await sh(id, 'stat -c %a /root/big.bin; ls -a /root | grep -c upload || true')).trim(), '600\n0');

  const received = createHash('sha256');
  const downStart = Date.now();
  const down = await peakBufferMemory(async () => {
    const req = http.request(`${base}/v1/sandboxes/${id}/files?path=/root/big.bin`, { headers: { authorization: `Bearer ${key}` } });
    req.end();
    const [res] = (await once(req, 'response')) as [http.IncomingMessage];
    let bytes = 0;
    for await (const c of res) {
      received.update(c as Buffer);
      bytes += (c as Buffer).length;
    }
    return { status: res.statusCode, length: res.headers['content-length'], bytes };
  });
  t.diagnostic(`download: ${BIG / MiB} MiB in ${((Date.now() - downStart) / 1000).toFixed(1)} s, buffer memory +${down.peakMiB.toFixed(1)} MiB at most`);
  assert.equal(down.result.status, 200);
  assert.equal(down.result.length, String(BIG));
  assert.equal(down.result.bytes, BIG);
  assert.equal(received.digest('hex'), sentHex, 'the download is the upload, byte for byte');
  assert.ok(down.peakMiB < 48, `buffer memory grew by ${down.peakMiB.toFixed(1)} MiB during a ${BIG / MiB} MiB download`);

  // Aborted after 8 MiB: neither the target nor the temporary file remains, and the old file is intact.
  await sh(id, 'echo keep > /root/aborted.bin');
  const req = http.request(`${base}/v1/sandboxes/${id}/files?path=/root/aborted.bin`, { method: 'PUT', headers: { authorization: `Bearer ${key}` } });
  req.on('error', () => {});
  for (let i = 0; i < 8; i++) req.write(randomBytes(MiB));
  await sleep(1500);
  req.destroy();
  const deadline = Date.now() + 30_000;
  let names: string[] = [];
  for (;;) {
    names = (await call('listDirectory', 'GET', `/v1/sandboxes/${id}/fs/list?path=/root`)).json().entries.map((e: any) => e.name);
    if (!names.some((n) => n.includes('.upload-')) || Date.now() > deadline) break;
    await sleep(200);
  }
  assert.ok(!names.some((n) => n.includes('.upload-')), `temporary file left: ${names}`);
  assert.equal((await sh(id, 'cat /root/aborted.bin')).trim(), 'keep');

  // Over the limit: refused before a byte is written.
  const tooBig = await new Promise<number>((resolve, reject) => {
    const r = http.request(`${base}/v1/sandboxes/${id}/files?path=/root/huge.bin`, { method: 'PUT', headers: { authorization: `Bearer ${key}`, 'content-length': String(BIG + 2 * MiB) } }, (res) => {
      res.resume();
      resolve(res.statusCode!);
    });
    r.on('error', reject);
    r.write(Buffer.alloc(1024));
  });
  assert.equal(tooBig, 413);
  assert.equal((await call('pathExists', 'GET', `/v1/sandboxes/${id}/fs/exists?path=/root/huge.bin`)).json().exists, false);
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`);
});

test('a watch stream sees changes while an exec runs, and ends when the sandbox is suspended or deleted', async () => {
  const id = await createSandbox();
  await call('makeDirectory', 'POST', `/v1/sandboxes/${id}/fs/mkdir`, { path: '/root/w' });
  const w = await Watch.open(id, '/root/w', true);
  let execDone = false;
  const exec = call('execSandbox', 'POST', `/v1/sandboxes/${id}/exec`, {
    command: 'sleep 1; mkdir -p /root/w/sub/deep; sleep 0.5; echo hi > /root/w/sub/deep/f; chmod 600 /root/w/sub/deep/f; mv /root/w/sub/deep/f /root/w/g; rm /root/w/g; sleep 8',
    timeout: 60,
  }).then((r) => { execDone = true; return r; });
  await w.change('create', 'sub');
  await w.until('sub/deep/f appears', (e) => e.event === 'change' && e.data.name === 'sub/deep/f' && e.data.op === 'create');
  await w.change('rename', 'sub/deep/f');
  await w.change('create', 'g');
  await w.change('remove', 'g');
  assert.equal(execDone, false, 'the events came while the exec ran');
  const sub = (await call('statPath', 'GET', `/v1/sandboxes/${id}/fs/stat?path=/root/w/sub/deep`)).json();
  assert.equal(sub.type, 'dir');
  assert.deepEqual((await call('listDirectory', 'GET', `/v1/sandboxes/${id}/fs/list?path=/root/w/sub`)).json().entries.map((e: any) => e.name), ['deep']);
  assert.equal(execDone, false, 'stat and list were answered beside the exec');
  assert.equal((await exec).json().exit_code, 0);

  // An upload is a write of its path, new or replaced (as E2B's envd reports it): its temporary file is never seen.
  for (const body of ['data', 'replaced']) {
    const before = w.events.length;
    await fetch(`${base}/v1/sandboxes/${id}/files?path=/root/w/up.txt`, { method: 'PUT', headers: { authorization: `Bearer ${key}` }, body });
    await w.until(`write up.txt (${body})`, (e) => w.events.indexOf(e) >= before && e.event === 'change' && e.data.op === 'write' && e.data.name === 'up.txt');
  }
  assert.ok(!w.events.some((e) => String(e.data?.name ?? '').includes('.upload-')), `an upload's temporary file was reported: ${JSON.stringify(w.events)}`);

  await call('suspendSandbox', 'POST', `/v1/sandboxes/${id}/suspend`);
  const end = await w.until('end', (e) => e.event === 'end');
  assert.deepEqual(end.data, { reason: 'sandbox_suspended' });
  for (let i = 0; i < 100 && !w.ended; i++) await sleep(20);
  assert.ok(w.ended, 'the stream closed after its end event');

  // After a resume the agent has dropped the old watch (RESTORED); a new one works and ends with the delete.
  await call('resumeSandbox', 'POST', `/v1/sandboxes/${id}/resume`);
  const again = await Watch.open(id, '/root/w', false);
  await sh(id, 'touch /root/w/after-resume');
  await again.change('create', 'after-resume');
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`);
  assert.deepEqual((await again.until('end', (e) => e.event === 'end')).data, { reason: 'sandbox_deleted' });
});

test('an idle-paused sandbox is woken by a directory request and by a watch', async () => {
  const id = await createSandbox();
  await sh(id, 'mkdir -p /root/idle && echo z > /root/idle/z');
  const waitPaused = async () => {
    const deadline = Date.now() + 60_000;
    while (!engine.isIdlePaused(id)) {
      assert.ok(Date.now() < deadline, 'paused once idle');
      await sleep(100);
    }
  };
  await waitPaused();
  const entry = (await call('statPath', 'GET', `/v1/sandboxes/${id}/fs/stat?path=/root/idle/z`)).json();
  assert.equal(entry.size, 2);
  assert.equal(engine.isIdlePaused(id), false, 'the request woke it');

  await waitPaused();
  const w = await Watch.open(id, '/root/idle', false);
  assert.equal(engine.isIdlePaused(id), false, 'the watch woke it');
  await sh(id, 'rm /root/idle/z');
  await w.change('remove', 'z');
  w.req.destroy();
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`);
});
