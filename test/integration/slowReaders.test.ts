/**
 * Slow readers on real VMs, through a real API server that runs in this process: for every kind of
 * stream the server writes or relays, a sandbox produces more than any bound (PRODUCED_MIB) while
 * the client reads nothing (a raw socket, paused: no client library buffering for it), and
 *  (a) the server's RSS, read after a full collection with the client still attached, grows by less
 *      than RSS_BOUND_MIB, and what its heap and Buffers reference by less than REFERENCED_BOUND_MIB:
 *      a server that held everything would grow by at least what was produced;
 *  (b) the client was paused (the producer in the guest blocked, or the client's sends stalled),
 *      bounded (output past the bound skipped: a gap, an overflow, the exec's output cap, dropped
 *      terminal output) or cut off (the connection closed mid-stream), as that stream is documented;
 *  (c) afterwards the sandbox and the server still answer.
 * Kinds that relay a process's output share one producer (REST SSE, envd Process/Connect, the web
 * terminal), as do the two directory watches (REST SSE, envd WatchDir): the guest's output crosses
 * to the host at a few MiB/s under TCG. Each check prints
 * `[slow-readers] <kind>: rss +<N> MiB after <M> MiB produced (peak +<P> MiB, referenced +<R> MiB)`
 * (bench/slow-readers.ts collects them). The ports-proxy kinds need networking (root, ip, nft,
 * /dev/net/tun) and are skipped without it.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { setTimeout as sleep } from 'node:timers/promises';
import '../../src/service/migrations.ts';
import { netSettings } from '../../src/config.ts';
import { netAvailability } from '../../src/net/netns.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { SSE_PENDING_MAX } from '../../src/api/sse.ts';
import { STREAM_PENDING_MAX } from '../../src/e2b/connectRpc.ts';
import { acceptKey, encodeFrame, frameReader } from '../support/ws.ts';
import { assertNoLeaks, openEngine, testHome, serveEngine, type Served } from './fixture.ts';
import { waitListening } from './guestServers.ts';

const MiB = 1024 * 1024;
/**
 * What each producer writes. (The guest's output crosses to the host at a few MiB/s under TCG:
 * this sets the file's time.)
 */
const PRODUCED_MIB = 128;
const PRODUCED = PRODUCED_MIB * MiB;
/**
 * What the server's RSS may grow by while its slow readers are attached, read after a full
 * collection (the garbage of what went through, base64 and JSON of every byte, is gone; what is
 * held for the readers is not): below PRODUCED_MIB, which a server that held everything would grow
 * by at least. RSS is a coarse reading (heap pages and malloc arenas are kept once grown: up to
 * ~70 MiB seen after 128 MiB went through), so the tight check is REFERENCED_BOUND_MIB.
 */
const RSS_BOUND_MIB = 96;
/**
 * What the server may still reference for them (heap and Buffers, after the collection): every
 * bound under test is 4 MiB (SSE_PENDING_MAX, STREAM_PENDING_MAX, the terminal's output) or less
 * (1 MiB of terminal input, the exec's 1 MiB output cap, the last 1 MiB of a process's output, a
 * pipe's high-water mark), three readers of one process hold three of them, and an exec's result
 * holds its capped output as JSON (NUL bytes as \u0000: 6 MiB per MiB). A quarter of PRODUCED_MIB.
 */
const REFERENCED_BOUND_MIB = 32;
/** A client whose writes see no drain for this long has been paused (a generous margin over a slow machine's pauses). */
const STALL_MS = 5000;

const net = netAvailability(netSettings());

// A full collection before each reading: what the server holds for a slow reader stays referenced
// until it reads, the garbage of what went through (base64 and JSON of every byte) does not.
setFlagsFromString('--expose-gc');
const collectGarbage = runInNewContext('gc') as () => void;

const referenced = () => {
  const m = process.memoryUsage();
  return m.heapUsed + m.external;
};

/**
 * The server's memory (it runs in this process) while a slow reader is attached: `stop` gives what
 * its RSS grew by (after a full collection, the client still attached and reading nothing), the
 * peak on the way (sampled, garbage included), and what the heap and Buffers still reference.
 */
type Growth = { rss: number; peak: number; referenced: number };
function watchMemory(): { stop(): Growth } {
  collectGarbage();
  const before = { rss: process.memoryUsage().rss, referenced: referenced() };
  let peak = before.rss;
  const sample = () => (peak = Math.max(peak, process.memoryUsage().rss));
  const timer = setInterval(sample, 20);
  return {
    stop() {
      clearInterval(timer);
      sample();
      collectGarbage();
      return { rss: (process.memoryUsage().rss - before.rss) / MiB, peak: (peak - before.rss) / MiB, referenced: (referenced() - before.referenced) / MiB };
    },
  };
}

/**
 * (a), printed for bench/slow-readers.ts. `expected`: what the producer must have written for the
 * check to mean something (0 where the point is that it could not: it was paused).
 */
function assertMemory(kind: string, g: Growth, producedBytes: number, expected = PRODUCED): void {
  console.error(`[slow-readers] ${kind}: rss +${g.rss.toFixed(1)} MiB after ${(producedBytes / MiB).toFixed(1)} MiB produced (peak +${g.peak.toFixed(1)} MiB, referenced +${g.referenced.toFixed(1)} MiB)`);
  assert.ok(producedBytes >= expected, `${kind}: the producer wrote only ${producedBytes} bytes`);
  assert.ok(g.rss < RSS_BOUND_MIB, `${kind}: the server's RSS grew by ${g.rss.toFixed(1)} MiB (bound ${RSS_BOUND_MIB} MiB) for a client that read nothing`);
  assert.ok(g.referenced < REFERENCED_BOUND_MIB, `${kind}: the server holds ${g.referenced.toFixed(1)} MiB more (bound ${REFERENCED_BOUND_MIB} MiB) for a client that read nothing`);
}

/** Polls `check` until it gives a value; `cap` is a safety net against a hang, not a timing check. */
async function until<T>(what: string, check: () => Promise<T | undefined> | T | undefined, cap = 120_000): Promise<T> {
  const deadline = Date.now() + cap;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await sleep(100);
  }
}

/**
 * Reads what a socket still sends until it closes or `done` says enough; `done` sees each chunk
 * after the last 8 KiB before it (a marker may straddle two chunks). `cap` is a safety net.
 */
function readRest(socket: Socket, done: (recent: Buffer) => boolean = () => false, cap = 120_000): Promise<{ data: Buffer; ended: boolean }> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let recent = Buffer.alloc(0);
    const timer = setTimeout(() => finish(new Error(`the stream neither closed nor finished within ${cap} ms`)), cap);
    const finish = (err?: Error, ended = false) => {
      clearTimeout(timer);
      socket.off('data', onData);
      if (err) reject(err);
      else resolve({ data: Buffer.concat(chunks, size), ended });
    };
    const onData = (c: Buffer) => {
      chunks.push(c);
      size += c.length;
      recent = Buffer.concat([recent.subarray(-8192), c]);
      if (done(recent)) finish();
    };
    socket.on('data', onData);
    socket.once('close', () => finish(undefined, true));
    socket.resume();
  });
}

/** SSE events of a chunked HTTP answer (the head stripped, chunk sizes dropped). */
function sseEvents(raw: Buffer): Array<{ event: string; data: any }> {
  const text = raw.toString('latin1');
  const body = text.slice(text.indexOf('\r\n\r\n') + 4).replace(/\r\n[0-9a-f]+\r\n/g, '');
  const out: Array<{ event: string; data: any }> = [];
  for (const block of body.split('\n\n')) {
    const event = /^event: (.*)$/m.exec(block)?.[1];
    const data = /^data: (.*)$/m.exec(block)?.[1];
    if (event && data) out.push({ event, data: JSON.parse(data) });
  }
  return out;
}

/** Connect envelopes of a chunked HTTP answer: flags and JSON. */
function connectEnvelopes(raw: Buffer): Array<{ flags: number; message: any }> {
  const at = raw.indexOf('\r\n\r\n') + 4;
  // Dechunk.
  const parts: Buffer[] = [];
  let i = at;
  while (i < raw.length) {
    const eol = raw.indexOf('\r\n', i);
    if (eol < 0) break;
    const len = parseInt(raw.subarray(i, eol).toString('latin1'), 16);
    if (!(len > 0) || eol + 2 + len > raw.length) {
      if (len > 0) parts.push(raw.subarray(eol + 2));
      break;
    }
    parts.push(raw.subarray(eol + 2, eol + 2 + len));
    i = eol + 4 + len;
  }
  const body = Buffer.concat(parts);
  const out: Array<{ flags: number; message: any }> = [];
  for (let p = 0; p + 5 <= body.length; ) {
    const len = body.readUInt32BE(p + 1);
    if (p + 5 + len > body.length) break;
    out.push({ flags: body[p], message: JSON.parse(body.subarray(p + 5, p + 5 + len).toString('utf8')) });
    p += 5 + len;
  }
  return out;
}

describe('slow readers on real VMs: the server holds a bounded amount for a client that reads nothing', { timeout: 900_000 }, () => {
  let engine: Engine;
  let api: Served;
  let home: string;
  let port: number;
  let key: string;
  let sb: string;
  /** Every raw client socket: a test that fails leaves none open for the server's close to wait on. */
  const sockets = new Set<Socket>();

  before(async () => {
    home = testHome('slow-readers');
    engine = await openEngine(home, { poolSize: 1 });
    api = await serveEngine(engine);
    port = Number(new URL(await api.app.listen({ host: '127.0.0.1', port: 0 })).port);
    key = api.keys.create({ tenant: 'acme', tier: 'pro' }).key;
    sb = (await call('POST', '/v1/sandboxes', { template: 'base' })).id;
  });

  after(async () => {
    for (const s of sockets) s.destroy();
    if (sb) await call('DELETE', `/v1/sandboxes/${sb}`).catch(() => {});
    if (api) await api.close(1000);
    if (engine) await assertNoLeaks(engine, home);
  });

  async function call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<any> {
    const res = await fetch(`http://127.0.0.1:${port}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    assert.ok(res.ok, `${method} ${path}: ${res.status} ${text}`);
    return text ? JSON.parse(text) : undefined;
  }

  const exec = async (command: string, timeout = 120) => {
    const r = await call('POST', `/v1/sandboxes/${sb}/exec`, { command, timeout });
    assert.equal(r.exit_code, 0, `${command}: ${r.stderr}`);
    return r.stdout as string;
  };
  const startProcess = async (body: Record<string, unknown>): Promise<number> => (await call('POST', `/v1/sandboxes/${sb}/processes`, body)).pid;
  const waitExit = (pid: number) =>
    until(`process ${pid} to exit`, async () => {
      const p = await call('POST', `/v1/sandboxes/${sb}/processes/${pid}/wait`, { timeout: 30 });
      return p.status === 'running' ? undefined : p;
    }, 600_000);

  /** (c): the sandbox runs an exec and the server answers, after the slow reader. */
  const stillAnswers = async () => {
    assert.equal(await exec('echo alive'), 'alive\n');
    assert.equal((await call('GET', `/v1/sandboxes/${sb}`)).state, 'running');
  };

  /** A raw HTTP request on a socket that reads nothing: what the client sends goes out, nothing is read. */
  async function pausedRequest(head: string, body: Buffer | string = ''): Promise<Socket> {
    const socket = connect(port, '127.0.0.1');
    sockets.add(socket);
    socket.pause();
    socket.on('error', () => {});
    await once(socket, 'connect');
    socket.write(head);
    if (body.length) socket.write(body);
    return socket;
  }

  /** A WebSocket handshake on a raw socket, read up to the end of the 101 answer; the socket is paused after it. */
  async function pausedWebSocket(path: string, headers: Record<string, string>, checkAccept = true): Promise<{ socket: Socket; rest: Buffer }> {
    const wsKey = randomBytes(16).toString('base64');
    const lines = Object.entries({ Host: '127.0.0.1', Connection: 'Upgrade', Upgrade: 'websocket', 'Sec-WebSocket-Version': '13', 'Sec-WebSocket-Key': wsKey, ...headers });
    const socket = await pausedRequest(`GET ${path} HTTP/1.1\r\n${lines.map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`);
    let got = Buffer.alloc(0);
    await new Promise<void>((resolve, reject) => {
      const onData = (c: Buffer) => {
        got = Buffer.concat([got, c]);
        if (got.indexOf('\r\n\r\n') < 0) return;
        socket.off('data', onData);
        socket.pause();
        resolve();
      };
      socket.on('data', onData);
      socket.once('close', () => reject(new Error(`closed during the handshake: ${got.toString()}`)));
      socket.resume();
    });
    const end = got.indexOf('\r\n\r\n') + 4;
    const head = got.subarray(0, end).toString();
    assert.match(head, /^HTTP\/1\.1 101 /, head);
    if (checkAccept) assert.ok(head.includes(acceptKey(wsKey)), head);
    return { socket, rest: got.subarray(end) };
  }

  const jsonRequest = (method: string, path: string, body: unknown, extra = '') => {
    const json = JSON.stringify(body);
    return pausedRequest(
      `${method} ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\n${extra}Content-Length: ${Buffer.byteLength(json)}\r\n\r\n`,
      json,
    );
  };

  it('REST exec over SSE: output past the exec cap is dropped in the guest, the result says truncated', async () => {
    // Started first (a start waits its turn behind an exec): it ends when the streaming exec is over.
    const waiter = await startProcess({ command: 'while [ ! -e /tmp/exec.done ]; do sleep 0.1; done' });
    const rss = watchMemory();
    const socket = await jsonRequest('POST', `/v1/sandboxes/${sb}/exec`, { command: `head -c ${PRODUCED} /dev/zero; head -c ${2 * MiB} /dev/zero >&2; touch /tmp/exec.done` }, 'Accept: text/event-stream\r\n');
    await waitExit(waiter);
    assertMemory('exec-sse', rss.stop(), PRODUCED + 2 * MiB);
    const { data } = await readRest(socket, lastChunk);
    socket.destroy();
    const events = sseEvents(data);
    const sent = events.filter((e) => e.event === 'stdout' || e.event === 'stderr').reduce((n, e) => n + Buffer.from(e.data.data, 'base64').length, 0);
    const result = events.find((e) => e.event === 'result')?.data;
    assert.ok(result, 'the result came after the output');
    assert.equal(result.stdout_truncated, true);
    assert.equal(result.stderr_truncated, true);
    assert.ok(sent <= 2 * engine.cfg.maxOutputBytes, `the stream carried ${sent} bytes, over twice the exec cap ${engine.cfg.maxOutputBytes}`);
    await stillAnswers();
  });

  /** A directory whose files have names over 3000 characters long from /w: each change is a large event. */
  const DEEP = '/w/' + Array.from({ length: 15 }, () => 'd'.repeat(200)).join('/');
  /** Two files changed in turn (the guest and inotify fold repeats of one change), `n` times each. */
  const changes = (n: number) => `cd ${DEEP} && i=0; while [ $i -lt ${n} ]; do echo >> a; echo >> b; i=$((i+1)); done`;
  /** Enough changes for PRODUCED bytes of SSE (a change to DEEP/a takes its name and some 40 bytes). */
  const CHANGE_ITERATIONS = Math.ceil(PRODUCED / (2 * (DEEP.length + 40)));

  const sseRequest = (path: string) => pausedRequest(`GET ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nAccept: text/event-stream\r\n\r\n`);
  /** The end of a chunked answer: the stream ended. */
  const lastChunk = (recent: Buffer) => recent.subarray(-5).toString() === '0\r\n\r\n';

  /**
   * A REST watch that reads everything, to count what was produced and what the slow readers
   * missed: the bytes of its stream and the changes in them.
   */
  async function countingWatch(): Promise<{ bytes(): number; changes(): number; close(): void }> {
    const socket = await sseRequest(`/v1/sandboxes/${sb}/fs/watch?path=/w&recursive=true`);
    let bytes = 0;
    let count = 0;
    let carry = '';
    socket.on('data', (c: Buffer) => {
      bytes += c.length;
      const text = carry + c.toString('latin1');
      count += text.split('event: change\n').length - 1;
      carry = text.slice(-16);
    });
    socket.resume();
    await until('the counting watch to be open', () => (bytes > 0 ? true : undefined));
    return { bytes: () => bytes, changes: () => count, close: () => socket.destroy() };
  }

  /** The envd of the E2B door: a raw Connect server-streaming call about `sb` that reads nothing. */
  async function envdStream(method: string, message: unknown): Promise<Socket> {
    const token = (await call('GET', `/e2b/api/sandboxes/${sb}`, undefined, { 'x-api-key': key })).envdAccessToken as string;
    const json = Buffer.from(JSON.stringify(message));
    const head = Buffer.alloc(5);
    head.writeUInt32BE(json.length, 1);
    const body = Buffer.concat([head, json]);
    return pausedRequest(
      `POST /e2b/envd/${method} HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: ${sb}\r\nX-Access-Token: ${token}\r\nContent-Type: application/connect+json\r\n` +
        `Connect-Protocol-Version: 1\r\nContent-Length: ${body.length}\r\n\r\n`,
      body,
    );
  }

  /** (b) for envd: the stream was closed without Connect's end-stream message, after a bounded amount. */
  async function assertCutOff(kind: string, socket: Socket): Promise<void> {
    const { data, ended } = await readRest(socket);
    assert.ok(ended, `${kind}: the connection was closed`);
    const envelopes = connectEnvelopes(data);
    assert.ok(envelopes.length > 0, `${kind}: the stream had begun`);
    assert.ok(!envelopes.some((e) => e.flags & 0x02), `${kind}: cut off, not ended normally`);
    assert.ok(data.length < 4 * STREAM_PENDING_MAX + 16 * MiB, `${kind}: the client got ${data.length} bytes`);
  }

  const terminal = (pid: number) => pausedWebSocket(`/v1/sandboxes/${sb}/processes/${pid}/terminal`, { 'Sec-WebSocket-Protocol': `collimate.terminal, bearer.${key}` });

  // One producer for three slow readers of a process's output: each bound is checked by what its
  // client got, the memory by all three together (the guest gives a few MiB/s under TCG: one
  // PRODUCED for each would take minutes).
  it('process output to three clients that read nothing: REST SSE skips to gaps, envd cuts its stream off, the terminal drops output', async () => {
    const pid = await startProcess({ command: `while [ ! -e /tmp/go.out ]; do sleep 0.1; done; head -c ${PRODUCED} /dev/zero`, pty: {} });
    const rss = watchMemory();
    const rest = await sseRequest(`/v1/sandboxes/${sb}/processes/${pid}/output?from=start`);
    const envd = await envdStream('process.Process/Connect', { process: { pid } });
    const { socket: tty, rest: ttyHead } = await terminal(pid);
    await exec('touch /tmp/go.out');
    const p = await waitExit(pid);
    assert.equal(p.output_bytes, PRODUCED);
    assertMemory('process-output', rss.stop(), p.output_bytes);

    // REST: what was not sent is a gap, and sent and skipped account for every byte.
    const { data } = await readRest(rest, lastChunk);
    rest.destroy();
    const events = sseEvents(data);
    const sent = events.filter((e) => e.event === 'pty').reduce((n, e) => n + Buffer.from(e.data.data, 'base64').length, 0);
    const skipped = events.filter((e) => e.event === 'gap').reduce((n, e) => n + e.data.to - e.data.from, 0);
    assert.ok(skipped > 0, 'a gap says what was skipped');
    assert.equal(sent + skipped, PRODUCED, 'sent and skipped account for every byte');
    assert.ok(sent < 4 * SSE_PENDING_MAX + 16 * MiB, `only a bounded amount was queued for the client (${sent})`);
    assert.equal(events.at(-1)?.event, 'exit');

    // envd: cut off once STREAM_PENDING_MAX waited for it.
    await assertCutOff('e2b-process', envd);

    // The terminal: output past its bound was dropped (as a terminal that scrolled), the exit came.
    let received = 0;
    let exit: any;
    const read = frameReader((op, payload) => {
      if (op === 0x2) received += payload.length;
      else if (op === 0x1) exit = JSON.parse(payload.toString());
    });
    read(ttyHead);
    tty.on('data', read);
    await readRest(tty, () => exit !== undefined);
    tty.destroy();
    assert.equal(exit.type, 'exit');
    assert.ok(received < 32 * MiB, `the terminal client got ${received} of ${PRODUCED} bytes`);
    await stillAnswers();
  });

  // One producer of changes for two slow watchers (REST and envd) and a counting one.
  it('directory changes to two watchers that read nothing: REST SSE drops them and says overflow, envd WatchDir cuts its stream off', async () => {
    await exec(`mkdir -p ${DEEP}`);
    const counter = await countingWatch();
    const rss = watchMemory();
    const rest = await sseRequest(`/v1/sandboxes/${sb}/fs/watch?path=/w&recursive=true`);
    const envd = await envdStream('filesystem.Filesystem/WatchDir', { path: '/w', recursive: true });
    const pid = await startProcess({ command: changes(CHANGE_ITERATIONS) });
    await waitExit(pid);
    const produced = await until('the counting watch to see every change', () => (counter.changes() >= 2 * CHANGE_ITERATIONS ? counter.bytes() : undefined));
    assertMemory('fs-watch', rss.stop(), produced);
    counter.close();

    // REST: once the client reads again, the next change comes after an overflow.
    let seen = Buffer.alloc(0);
    const reading = readRest(rest, (recent) => recent.includes('"name":"after"}'));
    rest.on('data', (c: Buffer) => (seen = Buffer.concat([seen.subarray(-8192), c])));
    await until('a change after the client caught up', async () => {
      if (seen.includes('"name":"after"}')) return true;
      await exec('echo >> /w/after');
      await sleep(500);
      return undefined;
    });
    const { data } = await reading;
    rest.destroy();
    const got = sseEvents(data).filter((e) => e.event === 'change');
    assert.ok(got.length < counter.changes() / 4, `the slow reader got ${got.length} of ${counter.changes()} changes`);
    const after = got.findIndex((e) => e.data.name === 'after');
    assert.ok(got.slice(0, after).some((e) => e.data.op === 'overflow'), 'the client is told changes were lost');

    await assertCutOff('e2b-watch', envd);
    await stillAnswers();
  });

  it('web terminal input: a client that types far faster than the terminal takes it is paused, not buffered for', async () => {
    const pid = await startProcess({ argv: ['sleep', '1000'], pty: {} });
    const rss = watchMemory();
    const { socket } = await terminal(pid);
    socket.on('data', () => {}); // the output (echo) is read and dropped: this is about input
    socket.resume();
    // Sent as the kernel takes it (what a client does not send is not in the server's memory);
    // the client is paused once no drain comes for STALL_MS.
    const frame = encodeFrame(Buffer.alloc(64 * 1024, 'k'), 0x2, true);
    let sent = 0;
    let stalled = false;
    while (sent < PRODUCED && !stalled) {
      sent += frame.length;
      if (!socket.write(frame)) stalled = !(await Promise.race([once(socket, 'drain').then(() => true), sleep(STALL_MS).then(() => false)]));
    }
    const held = rss.stop();
    assertMemory('terminal-input', held, sent, 0);
    assert.ok(stalled, `the client sent all ${sent} bytes: its input was not paused`);
    assert.ok(sent < RSS_BOUND_MIB * MiB, `the client got ${sent} bytes out before it was paused`);
    await call('POST', `/v1/sandboxes/${sb}/processes/${pid}/signal`, { signal: 'SIGKILL' });
    await waitExit(pid);
    socket.destroy();
    await stillAnswers();
  });

  /**
   * A TCP server in the guest for the ports proxy (busybox nc -e: the script's stdout is the
   * connection, so its writes block when nobody reads): it reads the request head, answers `head`,
   * then writes `mib` MiB of zeros, counting them in `counter` as it goes.
   */
  async function guestServer(guestPort: number, head: string, mib: number, counter: string): Promise<number> {
    const script = [
      '#!/bin/sh',
      `while IFS= read -r line; do case "$line" in "$(printf '\\r')"|"") break;; esac; done`,
      `printf '${head}'`,
      // Once the connection is gone a write fails: the server ends.
      `i=0; while [ $i -lt ${mib} ]; do head -c ${MiB} /dev/zero || exit 0; i=$((i+1)); echo $i > ${counter}; done`,
    ].join('\n');
    await call('POST', `/v1/sandboxes/${sb}/exec`, { command: 'true', files: [{ path: `/root/serve${guestPort}.sh`, content: script, mode: 0o755 }] });
    const pid = await startProcess({ argv: ['nc', '-l', '-p', String(guestPort), '-e', `/root/serve${guestPort}.sh`] });
    await exec(waitListening(guestPort));
    return pid;
  }

  /** MiB the guest server has written so far. */
  const counted = async (counter: string) => Number((await exec(`cat ${counter} 2>/dev/null || echo 0`)).trim());

  /**
   * Waits for the guest's producer to stop making progress (the same count three readings in a row,
   * a second apart) or to finish; the count then.
   */
  async function stalledAt(counter: string, total: number): Promise<number> {
    let last = -1;
    let same = 0;
    return until(`the producer behind ${counter} to block or finish`, async () => {
      const n = await counted(counter);
      same = n === last ? same + 1 : 0;
      last = n;
      if (n >= total || same >= 2) return n;
      await sleep(1000);
      return undefined;
    });
  }

  it('ports proxy, HTTP: a download of hundreds of MiB to a client that reads nothing blocks the server in the guest; reading resumes it', { skip: net.enabled ? false : `networking unavailable: ${net.reason}` }, async () => {
    const offered = 512;
    const nc = await guestServer(8080, `HTTP/1.1 200 OK\\r\\nContent-Type: application/octet-stream\\r\\nContent-Length: ${offered * MiB}\\r\\nConnection: close\\r\\n\\r\\n`, offered, '/tmp/http.count');
    const memory = watchMemory();
    const socket = await pausedRequest(`GET /v1/sandboxes/${sb}/ports/8080/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n\r\n`);
    const blockedAt = await stalledAt('/tmp/http.count', offered);
    assertMemory('ports-http', memory.stop(), blockedAt * MiB, 0);
    assert.ok(blockedAt < RSS_BOUND_MIB, `the guest wrote ${blockedAt} of ${offered} MiB to a client that read nothing: it was not paused`);
    // Paused, not cut off: once the client reads, the guest's server writes again.
    let got = 0;
    socket.on('data', (c: Buffer) => (got += c.length));
    socket.resume();
    await until('the download to go on', async () => ((await counted('/tmp/http.count')) > blockedAt + 4 ? true : undefined));
    assert.ok(got > blockedAt * MiB, `the client read ${got} bytes`);
    socket.destroy();
    await waitExit(nc);
    await stillAnswers();
  });

  it('ports proxy, WebSocket tunnel: a client that reads nothing blocks the server in the guest', { skip: net.enabled ? false : `networking unavailable: ${net.reason}` }, async () => {
    const nc = await guestServer(8081, 'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n\\r\\n', PRODUCED_MIB, '/tmp/ws.count');
    const rss = watchMemory();
    const { socket } = await pausedWebSocket(`/v1/sandboxes/${sb}/ports/8081/stream`, { Authorization: `Bearer ${key}` }, false);
    const blockedAt = await stalledAt('/tmp/ws.count', PRODUCED_MIB);
    assertMemory('ports-websocket', rss.stop(), blockedAt * MiB, 0);
    assert.ok(blockedAt < RSS_BOUND_MIB, `the guest wrote ${blockedAt} MiB to a client that read nothing: it was not paused`);
    // The client going away ends the tunnel both ways: the guest's server sees it and exits.
    socket.destroy();
    await waitExit(nc);
    await stillAnswers();
  });
});
