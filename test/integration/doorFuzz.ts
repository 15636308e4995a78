/**
 * Fuzzing every door at volume (issue 31), shared by test/integration/doorFuzz.test.ts (the short
 * form `npm test` runs) and bench/fuzz-doors.ts (the long form, 10,000 requests per door).
 *
 * One real server on a real engine serves six doors; each gets its own seeded generator of valid,
 * invalid and hostile requests, sent over real sockets, and its own judge of the answers:
 *
 * - rest: the route-table generator of fuzzHarness.ts (runFuzz), as fuzz.test.ts runs it.
 * - mcp: JSON-RPC 2.0 at /mcp — every tool with arguments of the wrong kind, unknown tools and
 *   methods, envelopes without `jsonrpc` or with odd ids, batches, notifications, wrong Accept and
 *   Content-Type, foreign origins, bad keys, another tenant's sandbox ids, guest paths with
 *   traversal and NULs, bodies over the limit, deep, badly encoded, slow, stalled and aborted.
 * - e2b: the control plane at /e2b/api — every route with bodies of the wrong kind, unknown and
 *   foreign ids, bad and foreign keys, creates, pauses, resumes and forks of its own sandboxes, and
 *   snapshots of them: taken, listed, started from (as a templateID) and deleted (as a template),
 *   refused to another tenant's key.
 * - envd: Connect at /e2b/envd — every method unary and enveloped, truncated, oversized and
 *   compressed envelopes, invalid UTF-8, missing/foreign/rotated tokens and another tenant's
 *   sandbox id, /files up and down (multipart, signatures forged or expired, traversal, NUL).
 * - terminal: WebSocket upgrades of /v1/sandboxes/:id/processes/:pid/terminal — handshakes
 *   without a key, version or subprotocol, foreign and non-PTY processes; on an open one keystrokes,
 *   resizes, bad text frames, invalid UTF-8, unmasked, reserved-opcode and oversized frames,
 *   clients that vanish mid-frame.
 * - ports: the keyed path, signed URLs (altered, another port's), host-routed requests with the
 *   traffic token (the envd token, another tenant's, none), a real server in the guest and ports
 *   where nothing listens, bad ports, traversal and NULs, huge headers, slow and aborted bodies,
 *   upgrades, malformed HTTP.
 *
 * The rules every answer meets: no 5xx but the documented ones (503 with a documented code; 502
 * port/agent/VMM codes only where a port or VMM is involved; Connect's `unavailable` for a sandbox
 * that is not running and `unimplemented` for what envd does not serve), error bodies in the door's
 * own shape (REST `{error:{code,message}}`, MCP JSON-RPC errors or `isError` tool results whose text
 * starts with the code, E2B `{code,message,error_code}`, Connect `{code,message}`), and no secret of
 * the host (its environment, the API keys, another tenant's tokens) in any byte of any answer. RSS
 * of the process (the server runs in it) is sampled every 250 ms and reported per door.
 *
 * Lanes of a door run concurrently, each with its own generator (seed, door, lane), so that
 * `FUZZ_SEED=<seed>` replays a lane's requests whatever the timing.
 */
import assert from 'node:assert/strict';
import { Agent } from 'node:http';
import { connect, type Socket } from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { ERROR_CODES, type ErrorCode } from '../../src/errors.ts';
import { INPUTS } from '../../src/mcp/tools.ts';
import { e2bKeyOf } from '../../src/service/keys.ts';
import { rng, type Rng } from '../support/rng.ts';
import { acceptKey, encodeFrame } from '../support/ws.ts';
import { runFuzz, send, wrongValue, type FuzzAnswer, type FuzzRequest } from './fuzzHarness.ts';

export const DOORS = ['rest', 'mcp', 'e2b', 'envd', 'terminal', 'ports'] as const;
export type DoorName = (typeof DOORS)[number];

/** What the doors are aimed at: the fuzzing tenant's sandbox, prepared by prepareDoorTarget. */
export interface DoorTarget {
  base: URL;
  keys: { main: string; demo: string; victim: string };
  /** The main tenant's running sandbox: a PTY shell, a plain process and an HTTP server on `httpPort`. */
  sandbox: string;
  victimSandbox: string;
  envdToken: string;
  trafficToken: string;
  /** The victim's own tokens: no request of ours may be let in with them on our sandbox, and no answer may carry them. */
  victimEnvdToken: string;
  victimTrafficToken: string;
  /** A token the main sandbox had before a rotation (null where the server has no rotation). */
  rotatedEnvdToken: string | null;
  ptyPid: number;
  plainPid: number;
  httpPort: number;
  /** /v1/p/<token>/ of `httpPort`, and of a port nothing listens on. */
  signedPath: string;
  signedClosedPath: string;
}

export interface DoorFuzzOptions {
  seed: number;
  /** Requests per door. */
  requests: number;
  lanes?: number;
  doors?: readonly DoorName[];
  log?: (line: string) => void;
  /** Strings only the host has (its environment's secret, /etc/shadow lines): no answer may contain one. */
  hostSecrets?: string[];
  /** For the REST door's traversing writes (see fuzzHarness.ts). */
  escapeMarker: string;
}

export interface RssFigures { startMiB: number; peakMiB: number; endMiB: number }

export interface DoorStats {
  door: DoorName;
  sent: number;
  byStatus: Record<string, number>;
  byKind: Record<string, number>;
  fiveHundreds: Record<string, number>;
  failures: string[];
  ms: number;
  rss: RssFigures;
}

const SECONDS = 1000;
const MAX_FAILURES = Number(process.env.FUZZ_MAX_FAILURES ?? 20);
const MiB = 1024 * 1024;
const mib = (n: number) => Math.round((n / MiB) * 10) / 10;

// ---- shared vocabulary ---------------------------------------------------------------------------


function deepJson(r: Rng, wrap: (inner: string) => string = (s) => s): Buffer {
  const depth = r.pick([1_000, 10_000, 100_000]);
  return Buffer.from(wrap(r.chance(0.5) ? '['.repeat(depth) + ']'.repeat(depth) : '{"a":'.repeat(depth) + '1' + '}'.repeat(depth)));
}

const BAD_UTF8 = [[0xff], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xe2, 0x82], [0x80], [0xfe, 0xff]];
/** A JSON text with invalid UTF-8 inside a string of it: `before` + bad bytes + `after`. */
function badUtf8(r: Rng, before: string, after: string): Buffer {
  return Buffer.concat([Buffer.from(before), Buffer.from(r.pick(BAD_UTF8)), Buffer.from(after)]);
}

function randomBytesFrom(r: Rng, n: number): Buffer {
  const b = Buffer.alloc(n);
  for (let i = 0; i < n; i++) b[i] = r.int(256);
  return b;
}

const json = (v: unknown) => Buffer.from(JSON.stringify(v));
/** Paths for calls that change the guest: none of them may break what the doors share (/tmp/www, the processes). */
const SAFE_MUTATE_PATHS = ['/tmp/doorfuzz/x', '/nonexistent/x', '/tmp/a\u0000b', '/proc/self/mem', '/proc/kcore', '/sys/kernel/notes', 'relative/x', '/' + 'a/'.repeat(2000), '', '/dev/full', '/tmp/doorfuzz/../doorfuzz/y'];
const GUEST_PATHS = ['/tmp', '/etc/hostname', '/', '/proc/self/environ', '/../../../../etc/shadow', '/tmp/a\u0000b', 'relative/x', '/' + 'a/'.repeat(2000), '/dev/zero', '/proc/kcore', '/nonexistent', '/tmp/' + 'x'.repeat(300), ''];

/** Malformed HTTP aimed at a door's path. */
function malformedHttp(r: Rng, path: string, extra = ''): Buffer {
  const raws = [
    `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n${extra}Connection: close\r\n\r\n0\r\n\r\n`,
    `POST ${path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n${extra}Connection: close\r\n\r\nzz\r\nabc\r\n0\r\n\r\n`,
    `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n${extra}Connection: close\r\n\r\n`,
    `GET ${path}\xff\xfe HTTP/1.1\r\nHost: x\r\n${extra}Connection: close\r\n\r\n`,
    `GET ${path} HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n${extra}Connection: close\r\n\r\n`,
    `GET ${path} HTTP/9.9\r\nHost: x\r\n${extra}Connection: close\r\n\r\n`,
    `GET ${path} HTTP/1.1\r\nHost: x\r\nX-Big: ${'h'.repeat(20_000)}\r\n${extra}Connection: close\r\n\r\n`,
    `\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03`,
  ];
  return Buffer.from(r.pick(raws), 'latin1');
}

/** A slow, stalled or aborted body on a door's path (the server's request timeout answers the stalled one). */
function timingHostile(r: Rng, kind: string, method: string, path: string, headers: Record<string, string>, body: Buffer): FuzzRequest {
  const h = { ...headers, 'content-length': String(body.length) };
  switch (r.int(3)) {
    case 0: return { kind: `${kind}:slow`, method, path, headers: h, body, slow: { chunk: 1 + r.int(40), delayMs: 20 + r.int(60) }, mayReset: true };
    case 1: return { kind: `${kind}:abort`, method, path, headers: h, body, abortAfter: { bytes: r.int(Math.max(1, body.length - 1)), pauseMs: r.int(200) } };
    default: return { kind: `${kind}:stall`, method, path, headers: h, body, stallAfter: r.int(Math.max(1, body.length - 1)), mayReset: true };
  }
}

// ---- what every door's answers must be -------------------------------------------------------------

/** Codes a REST-shaped answer (the router's, the server's body limit and timeout) may carry on any door's path. */
const ROUTER_CODES = new Set<string>(['not_found', 'method_not_allowed', 'validation_error', 'payload_too_large', 'unauthorized', 'unsupported_media_type', 'invalid_json', 'shutting_down', 'origin_forbidden']);
/** What a 502/503 may be. */
const DOCUMENTED_5XX: Record<number, readonly string[]> = {
  502: ['agent_unavailable', 'vmm_failed', 'port_unreachable'],
  503: ['host_at_capacity', 'shutting_down', 'template_not_ready'],
};
const CONNECT_CODES: Record<string, number> = {
  canceled: 499, unknown: 500, invalid_argument: 400, deadline_exceeded: 504, not_found: 404, already_exists: 409,
  permission_denied: 403, resource_exhausted: 429, failed_precondition: 400, aborted: 409, out_of_range: 400,
  unimplemented: 501, internal: 500, unavailable: 503, unauthenticated: 401,
};

interface Judged { kind: string; status: number; note?: string }

/** A REST-shaped error: `{error:{code,message}}` with a code of the registry sent with its status. */
function restError(res: FuzzAnswer): string {
  assert.match(String(res.headers['content-type']), /^application\/json/, 'an error without a JSON body');
  const e = res.json()?.error;
  assert.equal(typeof e?.code, 'string', 'an error without error.code');
  assert.equal(typeof e?.message, 'string', 'an error without error.message');
  assert.ok(e.code in ERROR_CODES, `unknown error code ${e.code}`);
  assert.equal(ERROR_CODES[e.code as ErrorCode], res.status, `code ${e.code} sent with status ${res.status}`);
  return e.code;
}

function fiveHundredAllowed(status: number, code: string, may502: boolean): void {
  assert.ok(DOCUMENTED_5XX[status]?.includes(code), `undocumented ${status} ${code}`);
  if (status === 502) assert.ok(may502, `a VMM, agent or port fault (${code}) where none should be involved`);
}

// ---- requests beyond HTTP: WebSocket sessions --------------------------------------------------------

export interface WsPlan {
  /** The handshake's headers (Host and the request line are added). */
  headers: Record<string, string>;
  /** Frames (or raw bytes) written after a 101, with a pause between. */
  frames: Buffer[];
  pauseMs: number;
  /** Destroy the socket right after the last write instead of closing politely. */
  vanish?: boolean;
  /** How long to wait for frames after the last write. */
  listenMs: number;
}

export interface WsAnswer {
  status: number;
  headers: Record<string, string>;
  /** The body of a refused handshake. */
  body: Buffer;
  /** Frames the server sent after a 101. */
  frames: Array<{ opcode: number; payload: Buffer }>;
  /** The close frame's code, if one came. */
  closeCode?: number;
}

/** A WebSocket handshake and frames over a raw socket, so that anything malformed can be sent. */
export function wsSession(base: URL, path: string, plan: WsPlan, timeoutMs = 60 * SECONDS): Promise<WsAnswer | null> {
  return new Promise((resolve) => {
    const s: Socket = connect(Number(base.port), base.hostname);
    let buf = Buffer.alloc(0);
    let head: { status: number; headers: Record<string, string> } | null = null;
    const frames: WsAnswer['frames'] = [];
    let closeCode: number | undefined;
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      if (!head) return resolve(null);
      resolve({ status: head.status, headers: head.headers, body: head.status === 101 ? Buffer.alloc(0) : buf, frames, closeCode });
    };
    const timer = setTimeout(finish, timeoutMs);
    const readFrames = () => {
      for (;;) {
        if (buf.length < 2) return;
        let len = buf[1] & 0x7f;
        let off = 2;
        if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; }
        else if (len === 127) { if (buf.length < 10) return; len = Number(buf.readBigUInt64BE(2)); off = 10; }
        if (buf.length < off + len) return;
        const opcode = buf[0] & 0x0f;
        const payload = Buffer.from(buf.subarray(off, off + len));
        buf = buf.subarray(off + len);
        frames.push({ opcode, payload });
        if (opcode === 0x8) {
          closeCode = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
          finish();
          return;
        }
      }
    };
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (!head) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const lines = buf.subarray(0, end).toString('latin1').split('\r\n');
        const headers: Record<string, string> = {};
        for (const l of lines.slice(1)) {
          const i = l.indexOf(':');
          if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
        }
        head = { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(lines[0])?.[1] ?? 0), headers };
        buf = buf.subarray(end + 4);
        if (head.status !== 101) {
          // A refusal: its body up to Content-Length (or the close).
          const n = Number(headers['content-length'] ?? NaN);
          if (Number.isFinite(n) && buf.length >= n) { buf = buf.subarray(0, n); finish(); }
          return;
        }
        void (async () => {
          for (const f of plan.frames) {
            if (done) return;
            s.write(f);
            await sleep(plan.pauseMs);
          }
          if (plan.vanish) return finish();
          await sleep(plan.listenMs);
          if (!done) s.write(encodeFrame(Buffer.from([0x03, 0xe8]), 0x8, true));
          await sleep(200);
          finish();
        })();
      }
      if (head.status === 101) readFrames();
      else {
        const n = Number(head.headers['content-length'] ?? NaN);
        if (Number.isFinite(n) && buf.length >= n) { buf = buf.subarray(0, n); finish(); }
      }
    });
    s.on('error', finish);
    s.on('close', finish);
    s.on('connect', () => {
      const lines = Object.entries({ host: `${base.hostname}:${base.port}`, ...plan.headers }).map(([k, v]) => `${k}: ${v}`);
      s.write(Buffer.from(`GET ${path} HTTP/1.1\r\n${lines.join('\r\n')}\r\n\r\n`, 'latin1'));
    });
  });
}

/** A frame with every field chosen (for frames a client must not send). */
function rawFrame(opts: { fin?: boolean; rsv?: number; opcode: number; mask?: boolean; payload: Buffer; lengthLie?: number }): Buffer {
  const len = opts.lengthLie ?? opts.payload.length;
  const b0 = (opts.fin === false ? 0 : 0x80) | ((opts.rsv ?? 0) << 4) | opts.opcode;
  const m = opts.mask === false ? 0 : 0x80;
  const head = len < 126 ? Buffer.from([b0, m | len]) : len < 65536 ? Buffer.from([b0, m | 126, len >> 8, len & 0xff]) : (() => {
    const h = Buffer.alloc(10);
    h[0] = b0;
    h[1] = m | 127;
    h.writeBigUInt64BE(BigInt(len), 2);
    return h;
  })();
  if (opts.mask === false) return Buffer.concat([head, opts.payload]);
  return Buffer.concat([head, Buffer.alloc(4), opts.payload]); // a zero mask: the payload as it is
}

// ---- the run -----------------------------------------------------------------------------------------

type Step = Omit<FuzzRequest, 'expect'> & {
  /** What it must get: a status, and a code in the door's vocabulary (a Connect code for envd). */
  expect?: { status?: number; code?: string };
  /** The door's judge sees it with this, besides the answer. */
  door?: DoorName;
  /** A WebSocket session instead of an HTTP request. */
  ws?: WsPlan;
  /** The Connect method of an envd RPC (undefined for /files and /health). */
  rpc?: string;
  /** Whether the request was sent enveloped (application/connect+json). */
  enveloped?: boolean;
  /** Requests to send after this one's answer (a create's delete, a session's close). */
  then?: (res: FuzzAnswer | null) => Step[];
};

/**
 * Makes the main tenant's sandbox ready for every door: a PTY shell, a plain process, an HTTP
 * server (busybox httpd) on port 8080, its E2B tokens (and one from before a rotation, where the
 * server rotates), and signed URLs of an open and a closed port.
 */
export async function prepareDoorTarget(base: URL, keys: DoorTarget['keys']): Promise<DoorTarget> {
  const call = async (key: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(new URL(path, base), {
      method,
      headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let parsed: any = null;
    try { parsed = JSON.parse(text); } catch { /* not JSON */ }
    return { status: res.status, text, json: parsed };
  };
  const made = async (key: string) => {
    const r = await call(key, 'POST', '/v1/sandboxes', { template: 'base', timeout_secs: 6 * 3600, labels: { doorfuzz: 'yes' } });
    assert.equal(r.status, 201, r.text);
    return r.json.id as string;
  };
  const sandbox = await made(keys.main);
  const victimSandbox = await made(keys.victim);
  const httpPort = 8080;
  const ex = await call(keys.main, 'POST', `/v1/sandboxes/${sandbox}/exec`, { command: 'mkdir -p /tmp/www && echo door-fuzz > /tmp/www/index.html && mkdir -p /tmp/doorfuzz', timeout: 30 });
  assert.equal(ex.status, 200, ex.text);
  const start = async (body: Record<string, unknown>) => {
    const r = await call(keys.main, 'POST', `/v1/sandboxes/${sandbox}/processes`, body);
    assert.equal(r.status, 201, r.text);
    return r.json.pid as number;
  };
  await start({ argv: ['httpd', '-f', '-p', String(httpPort), '-h', '/tmp/www'], tag: 'httpd' });
  const ptyPid = await start({ command: 'sh', pty: { cols: 80, rows: 24 }, tag: 'pty' });
  const plainPid = await start({ command: 'sleep 100000', tag: 'plain' });
  const listening = await call(keys.main, 'POST', `/v1/sandboxes/${sandbox}/exec`, { command: `for i in $(seq 100); do wget -q -O /dev/null http://127.0.0.1:${httpPort}/ && exit 0; sleep 0.1; done; ps; exit 1`, timeout: 30 });
  assert.equal(listening.json?.exit_code, 0, `httpd did not listen: ${listening.text}`);
  const e2bTokens = async (key: string, id: string) => {
    const r = await call('', 'POST', `/e2b/api/sandboxes/${id}/connect`, { timeout: 6 * 3600 }, { 'x-api-key': e2bKeyOf(key) });
    assert.ok([200, 201].includes(r.status), r.text);
    return { envd: r.json.envdAccessToken as string, traffic: r.json.trafficAccessToken as string };
  };
  let tokens = await e2bTokens(keys.main, sandbox);
  let rotatedEnvdToken: string | null = null;
  const rotated = await call(keys.main, 'POST', `/v1/sandboxes/${sandbox}/tokens/rotate`);
  if (rotated.status === 200) {
    rotatedEnvdToken = tokens.envd;
    tokens = await e2bTokens(keys.main, sandbox);
    assert.notEqual(tokens.envd, rotatedEnvdToken);
  }
  const victimTokens = await e2bTokens(keys.victim, victimSandbox);
  const signed = async (port: number) => {
    const r = await call(keys.main, 'POST', `/v1/sandboxes/${sandbox}/port-urls`, { port, expires_in_secs: 6 * 3600 });
    assert.equal(r.status, 201, r.text);
    return new URL(r.json.url, base).pathname;
  };
  return {
    base, keys, sandbox, victimSandbox,
    envdToken: tokens.envd, trafficToken: tokens.traffic, victimEnvdToken: victimTokens.envd, victimTrafficToken: victimTokens.traffic, rotatedEnvdToken,
    ptyPid, plainPid, httpPort,
    signedPath: await signed(httpPort),
    signedClosedPath: await signed(9),
  };
}

/** RSS samples of this process (the server's), every 250 ms while a door runs. */
class RssSampler {
  private timer?: NodeJS.Timeout;
  peak = 0;
  start(): number {
    const now = process.memoryUsage().rss;
    this.peak = now;
    this.timer = setInterval(() => { this.peak = Math.max(this.peak, process.memoryUsage().rss); }, 250);
    this.timer.unref();
    return now;
  }
  stop(): number {
    clearInterval(this.timer);
    const now = process.memoryUsage().rss;
    this.peak = Math.max(this.peak, now);
    return now;
  }
}

export async function runDoorFuzz(t: DoorTarget, opts: DoorFuzzOptions): Promise<DoorStats[]> {
  const out: DoorStats[] = [];
  for (const door of opts.doors ?? DOORS) out.push(await runDoor(t, opts, door));
  return out;
}

async function runDoor(t: DoorTarget, opts: DoorFuzzOptions, door: DoorName): Promise<DoorStats> {
  const started = Date.now();
  const log = opts.log ?? (() => {});
  const sampler = new RssSampler();
  const rssStart = sampler.start();
  const stats: DoorStats = { door, sent: 0, byStatus: {}, byKind: {}, fiveHundreds: {}, failures: [], ms: 0, rss: { startMiB: mib(rssStart), peakMiB: 0, endMiB: 0 } };
  const finish = () => {
    const end = sampler.stop();
    stats.rss.peakMiB = mib(sampler.peak);
    stats.rss.endMiB = mib(end);
    stats.ms = Date.now() - started;
    return stats;
  };

  if (door === 'rest') {
    // The route-table generator, one lane per lane of the other doors; it throws with its failures.
    try {
      const r = await runFuzz(
        { base: t.base, keys: t.keys, victimSandbox: t.victimSandbox },
        { seed: opts.seed, requests: opts.requests, lanes: opts.lanes ?? 4, hostSecrets: secretsOf(t, opts), escapeMarker: opts.escapeMarker, log: (l) => log(`rest ${l}`) },
      );
      stats.sent = r.sent;
      stats.byKind = r.byKind;
      for (const [s, n] of Object.entries(r.byStatus)) stats.byStatus[s] = n;
      for (const f of r.fiveHundreds) stats.fiveHundreds[`${f.status} ${f.code}`] = (stats.fiveHundreds[`${f.status} ${f.code}`] ?? 0) + 1;
    } catch (e) {
      stats.failures.push((e as Error).message);
    }
    return finish();
  }

  const agent = new Agent({ keepAlive: true, maxSockets: (opts.lanes ?? 4) * 2 });
  const secrets = secretsOf(t, opts);
  let stop = false;
  const exchange = async (lane: number, n: number, step: Step): Promise<void> => {
    stats.sent++;
    stats.byKind[step.kind] = (stats.byKind[step.kind] ?? 0) + 1;
    if (stats.sent % 1000 === 0) log(`${door}: ${stats.sent} requests, ${((Date.now() - started) / 1000).toFixed(0)} s, rss ${mib(process.memoryUsage().rss)} MiB`);
    const where = `seed=${opts.seed} door=${door} lane=${lane} #${n} ${step.kind}: ${step.method} ${step.path.slice(0, 160)}${step.headers.host ? ` host=${step.headers.host}` : ''}${step.body ? ` body=${JSON.stringify(step.body.subarray(0, 200).toString('latin1'))}${step.body.length > 200 ? `…(${step.body.length} bytes)` : ''}` : ''}`;
    let res: FuzzAnswer | null = null;
    try {
      if (step.ws) {
        const w = await wsSession(t.base, step.path, step.ws);
        const judged = judgeWs(door, step, w, secrets);
        stats.byStatus[judged.status] = (stats.byStatus[judged.status] ?? 0) + 1;
      } else {
        try {
          res = await send(t.base, agent, step as FuzzRequest, 120 * SECONDS);
        } catch (e) {
          throw new Error(`no answer: ${(e as Error).message}`);
        }
        if (!res) {
          if (!(step.abortAfter || step.abortStream || step.raw || step.mayReset)) throw new Error('connection closed without an answer');
          stats.byStatus['none'] = (stats.byStatus['none'] ?? 0) + 1;
        } else {
          stats.byStatus[res.status] = (stats.byStatus[res.status] ?? 0) + 1;
          const judged = judgeHttp(door, step, res, secrets);
          if (res.status >= 500) stats.fiveHundreds[`${res.status} ${judged.note ?? ''}`.trim()] = (stats.fiveHundreds[`${res.status} ${judged.note ?? ''}`.trim()] ?? 0) + 1;
        }
      }
    } catch (e) {
      stats.failures.push(`${where}\n→ ${res ? `${res.status} ${res.text.slice(0, 400)}` : ''}\n${(e as Error).message}`);
      if (stats.failures.length >= MAX_FAILURES) stop = true;
    }
    for (const next of step.then?.(res) ?? []) await exchange(lane, n, next);
  };

  const generate = GENERATORS[door];
  const lanesN = opts.lanes ?? 4;
  const quota = Math.ceil(opts.requests / lanesN);
  const doorIndex = DOORS.indexOf(door);
  try {
    await Promise.all(Array.from({ length: lanesN }, async (_, lane) => {
      const r = rng((opts.seed + doorIndex * 0x85ebca6b + lane * 0x9e3779b1) >>> 0);
      for (let n = 1; n <= quota && !stop; n++) await exchange(lane, n, generate(t, r, lane, n));
    }));
  } finally {
    agent.destroy();
  }
  return finish();
}

function secretsOf(t: DoorTarget, opts: DoorFuzzOptions): string[] {
  return [
    ...(opts.hostSecrets ?? []),
    t.keys.main, t.keys.demo, t.keys.victim, e2bKeyOf(t.keys.main), e2bKeyOf(t.keys.victim),
    t.victimEnvdToken, t.victimTrafficToken,
  ];
}

function noSecrets(body: Buffer, headers: Record<string, unknown>, secrets: string[]): void {
  const head = JSON.stringify(headers);
  for (const s of secrets) {
    assert.ok(!body.includes(s), 'an answer carries a secret (a host secret, an API key or another tenant\'s token)');
    assert.ok(!head.includes(s), 'an answer\'s headers carry a secret');
  }
}

// ---- judges ------------------------------------------------------------------------------------------

function judgeHttp(door: DoorName, step: Step, res: FuzzAnswer, secrets: string[]): Judged {
  noSecrets(res.body, res.headers, secrets);
  const status = res.status;
  if (step.expect?.status !== undefined) assert.equal(status, step.expect.status, `expected ${step.expect.status}`);
  if (step.raw && status === 400) {
    // Malformed HTTP is answered by the server's clientErrorHandler, before any door.
    assert.equal(restError(res), 'validation_error');
    return { kind: step.kind, status };
  }
  switch (door) {
    case 'mcp': return judgeMcp(step, res);
    case 'e2b': return judgeE2b(step, res);
    case 'envd': return judgeEnvd(step, res);
    case 'ports': return judgePorts(step, res);
    default: return judgeRestShaped(step, res);
  }
}

/** A REST-shaped answer (the router's, the server's limits, the terminal's plain GET). */
function judgeRestShaped(step: Step, res: FuzzAnswer): Judged {
  if (res.status < 400) {
    if (step.ok) assert.ok(step.ok.includes(res.status), `a valid request failed (expected ${step.ok.join('/')})`);
    return { kind: step.kind, status: res.status };
  }
  const code = restError(res);
  if (step.expect?.code) assert.equal(code, step.expect.code);
  if (res.status >= 500) fiveHundredAllowed(res.status, code, !!step.may502);
  if (step.ok) assert.fail(`a valid request failed (expected ${step.ok.join('/')})`);
  return { kind: step.kind, status: res.status, note: code };
}

/** MCP: JSON-RPC messages (JSON or SSE), tool errors whose text starts with a code; the gate's refusals REST-shaped. */
function judgeMcp(step: Step, res: FuzzAnswer): Judged {
  const status = res.status;
  if (status === 202) {
    assert.equal(res.body.length, 0, 'a 202 (notification accepted) with a body');
    return { kind: step.kind, status };
  }
  const type = String(res.headers['content-type'] ?? '');
  let messages: any[];
  if (type.startsWith('text/event-stream')) {
    assert.equal(status, 200, 'an event stream without 200');
    messages = res.text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
  } else {
    assert.match(type, /^application\/json/, `an MCP answer of type ${type}`);
    const v = res.json();
    if (v && typeof v === 'object' && !Array.isArray(v) && 'error' in v && !('jsonrpc' in v)) {
      // The gate (origin, key) and the server's limits answer in REST's shape.
      const code = restError(res);
      assert.ok(ROUTER_CODES.has(code), `${code} from /mcp's gate`);
      if (status >= 500) fiveHundredAllowed(status, code, false);
      if (step.ok) assert.fail('a valid request failed');
      return { kind: step.kind, status, note: code };
    }
    messages = Array.isArray(v) ? v : [v];
  }
  let note: string | undefined;
  for (const m of messages) {
    assert.equal(m?.jsonrpc, '2.0', 'a message without jsonrpc 2.0');
    if (m.error !== undefined) {
      assert.ok(Number.isInteger(m.error.code), 'a JSON-RPC error without an integer code');
      assert.equal(typeof m.error.message, 'string', 'a JSON-RPC error without a message');
      // The SDK answers arguments that are not an object with -32603 and zod's issues (its parse, before any tool): known, noted.
      if (m.error.code === -32603) assert.ok(['invalid:tool-args-kind', 'invalid:envelope', 'hostile:deep'].includes(step.kind), 'a JSON-RPC internal error');
      note = m.error.code === -32603 ? 'rpc -32603 (the SDK: arguments not an object)' : `rpc ${m.error.code}`;
      if (step.ok) assert.fail('a valid request failed');
      continue;
    }
    if (m.method !== undefined) continue; // a notification (progress) in the stream
    assert.ok('result' in m, 'a response without result or error');
    const r = m.result;
    if (r?.isError) {
      const text = String(r.content?.[0]?.text ?? '');
      const code = /^([a-z_]+): /.exec(text)?.[1];
      if (code) {
        assert.ok(code in ERROR_CODES, `tool error code ${code} is not in the registry`);
        const s = ERROR_CODES[code as ErrorCode];
        if (s >= 500) fiveHundredAllowed(s, code, !!step.may502);
        note = code;
      } else {
        // The SDK's own argument check, before the tool runs.
        assert.match(text, /^MCP error -32\d{3}: /, `a tool error without a code: ${text.slice(0, 100)}`);
        note = 'sdk-argument-error';
      }
      if (step.ok) assert.fail(`a valid tool call failed: ${text.slice(0, 200)}`);
      if (step.expect?.code) assert.equal(code, step.expect.code);
    } else if (step.expect?.code) {
      assert.fail(`expected the tool error ${step.expect.code}`);
    }
  }
  if (status >= 400) {
    assert.ok(status < 500, `MCP answered ${status}`);
  }
  if (step.ok) assert.equal(status, 200, 'a valid request failed');
  return { kind: step.kind, status, note };
}

/** E2B's control plane: `{code: status, message, error_code}`; the router's own answers REST-shaped. */
function judgeE2b(step: Step, res: FuzzAnswer): Judged {
  const status = res.status;
  if (status < 400) {
    if (step.ok) assert.ok(step.ok.includes(status), `a valid request failed (expected ${step.ok.join('/')})`);
    if (status !== 204) res.json();
    return { kind: step.kind, status };
  }
  assert.match(String(res.headers['content-type']), /^application\/json/, 'an error without a JSON body');
  const v = res.json();
  let code: string;
  if (v && typeof v.error === 'object') {
    code = restError(res);
    assert.ok(ROUTER_CODES.has(code), `${code} in REST's shape on E2B's path`);
  } else {
    assert.equal(v?.code, status, 'an E2B error whose code is not its status');
    assert.equal(typeof v.message, 'string', 'an E2B error without a message');
    code = v.error_code;
    assert.ok(code in ERROR_CODES, `unknown error_code ${code}`);
    assert.equal(ERROR_CODES[code as ErrorCode], status, `error_code ${code} with status ${status}`);
  }
  if (step.expect?.code) assert.equal(code, step.expect.code);
  if (status >= 500) fiveHundredAllowed(status, code, !!step.may502);
  if (step.ok) assert.fail(`a valid request failed (expected ${step.ok.join('/')})`);
  return { kind: step.kind, status, note: code };
}

/** Parses a Connect stream's envelopes; the last one ends the stream. */
function envelopesOf(body: Buffer): Array<{ flags: number; message: any }> {
  const out: Array<{ flags: number; message: any }> = [];
  let at = 0;
  while (at < body.length) {
    assert.ok(body.length - at >= 5, 'a truncated envelope in the answer');
    const flags = body[at];
    const len = body.readUInt32BE(at + 1);
    assert.ok(body.length - at - 5 >= len, 'a truncated envelope in the answer');
    out.push({ flags, message: JSON.parse(body.subarray(at + 5, at + 5 + len).toString('utf8')) });
    at += 5 + len;
  }
  return out;
}

function connectError(e: any, status: number | null, step: Step): string {
  assert.equal(typeof e?.code, 'string', 'a Connect error without a code');
  assert.equal(typeof e?.message, 'string', 'a Connect error without a message');
  assert.ok(e.code in CONNECT_CODES, `unknown Connect code ${e.code}`);
  if (status !== null) assert.equal(CONNECT_CODES[e.code], status, `Connect code ${e.code} with status ${status}`);
  assert.ok(!['internal', 'unknown'].includes(e.code), `Connect ${e.code}: ${e.message}`);
  // unavailable: the sandbox is not running (or a VMM fault); unimplemented: what envd does not serve.
  if (e.code === 'unavailable') assert.ok(step.may502, 'unavailable where the sandbox runs');
  if (e.code === 'deadline_exceeded') assert.fail('deadline_exceeded');
  return e.code;
}

/** envd: Connect unary and streams (`{code,message}` errors), /files and /health (`{code: status, message}`), the router's own REST-shaped. */
function judgeEnvd(step: Step, res: FuzzAnswer): Judged {
  const status = res.status;
  const type = String(res.headers['content-type'] ?? '');
  if (type.startsWith('application/connect+json')) {
    assert.equal(status, 200, 'a Connect stream without 200');
    if (step.abortStream) return { kind: step.kind, status };
    const envs = envelopesOf(res.body);
    assert.ok(envs.length > 0 && envs[envs.length - 1].flags & 0x02, 'a Connect stream without its end-stream envelope');
    const end = envs[envs.length - 1].message;
    if (end.error) {
      const code = connectError(end.error, null, step);
      if (step.ok) assert.fail(`a valid call failed: ${code} ${end.error.message}`);
      if (step.expect?.code) assert.equal(code, step.expect.code);
      return { kind: step.kind, status, note: code };
    }
    if (step.expect?.code) assert.fail(`expected ${step.expect.code}`);
    return { kind: step.kind, status };
  }
  if (status < 400) {
    if (step.ok) assert.ok(step.ok.includes(status), `a valid request failed (expected ${step.ok.join('/')})`);
    if (step.expect?.code) assert.fail(`expected ${step.expect.code}`);
    return { kind: step.kind, status };
  }
  assert.match(type, /^application\/json/, 'an error without a JSON body');
  const v = res.json();
  let code: string;
  if (v && typeof v.error === 'object') {
    code = restError(res);
    assert.ok(ROUTER_CODES.has(code), `${code} in REST's shape on envd's path`);
    if (status >= 500) fiveHundredAllowed(status, code, false);
  } else if (typeof v?.code === 'string') {
    assert.ok(step.rpc !== undefined, 'a Connect error from /files or /health');
    code = connectError(v, status, step);
  } else {
    assert.equal(v?.code, status, 'an envd error whose code is not its status');
    assert.equal(typeof v.message, 'string', 'an envd error without a message');
    code = `http ${status}`;
    // envd's 502: the sandbox is not running (E2B's SDK reads it so).
    if (status >= 500) assert.ok(status === 502 && step.may502, `envd answered ${status}: ${v.message}`);
  }
  if (step.ok) assert.fail(`a valid request failed (expected ${step.ok.join('/')})`);
  if (step.expect?.code) assert.equal(code, step.expect.code);
  return { kind: step.kind, status, note: code };
}

/** The ports proxy: its own errors REST-shaped with X-Collimate-Error; the sandbox's answers as they come. */
function judgePorts(step: Step, res: FuzzAnswer): Judged {
  const status = res.status;
  if (step.method === 'HEAD') {
    if (step.ok && !(status === 502 && step.may502)) assert.ok(step.ok.includes(status), `a valid request failed (expected ${step.ok.join('/')})`);
    if (status >= 500 && status !== 502) assert.fail(`HEAD answered ${status}`);
    return { kind: step.kind, status };
  }
  const own = res.headers['x-collimate-error'];
  if (own === undefined && !(status >= 400 && /^application\/json/.test(String(res.headers['content-type'])) && res.json()?.error?.code && !step.ok)) {
    // The sandbox server's own answer (busybox httpd), or a redirect of the proxy's.
    if (step.ok) assert.ok(step.ok.includes(status), `a valid request failed (expected ${step.ok.join('/')})`);
    if (step.expect?.code) assert.fail(`expected the proxy's ${step.expect.code}`);
    return { kind: step.kind, status, note: status >= 500 ? 'from the sandbox' : undefined };
  }
  const code = restError(res);
  if (own !== undefined) assert.equal(own, code, 'X-Collimate-Error and the body disagree');
  if (step.expect?.code) assert.equal(code, step.expect.code);
  if (status >= 500) fiveHundredAllowed(status, code, !!step.may502);
  if (step.ok) assert.fail(`a valid request failed (expected ${step.ok.join('/')})`);
  return { kind: step.kind, status, note: code };
}

/** The terminal: refusals are JSON errors before the upgrade; after it, error frames carry a registry code. */
function judgeWs(door: DoorName, step: Step, w: WsAnswer | null, secrets: string[]): Judged {
  if (!w) {
    assert.ok(step.mayReset || step.ws?.vanish, 'the server closed the handshake without an answer');
    return { kind: step.kind, status: 0 };
  }
  noSecrets(w.body, w.headers, secrets);
  for (const f of w.frames) noSecrets(f.payload, {}, secrets);
  const asHttp: FuzzAnswer = { status: w.status, headers: w.headers, body: w.body, text: w.body.toString('utf8'), json: () => JSON.parse(w.body.toString('utf8')) };
  if (door === 'ports') {
    // Through the proxy: its own refusals JSON with X-Collimate-Error, else the sandbox server's answer.
    if (w.status === 101 || w.headers['x-collimate-error'] === undefined) return { kind: step.kind, status: w.status };
    return judgePorts(step, asHttp);
  }
  if (w.status === 101) {
    assert.equal(w.headers['sec-websocket-protocol'], 'collimate.terminal', 'the server selected another subprotocol than collimate.terminal');
    if (step.expect?.status !== undefined) assert.equal(101, step.expect.status, `expected ${step.expect.status}`);
    for (const f of w.frames) {
      if (f.opcode !== 0x1) continue;
      const m = JSON.parse(f.payload.toString('utf8'));
      if (m.type === 'error') {
        assert.ok(m.error?.code in ERROR_CODES, `an error frame with code ${m.error?.code}`);
        assert.equal(typeof m.error.message, 'string');
        const s = ERROR_CODES[m.error.code as ErrorCode];
        assert.ok(s < 500 || DOCUMENTED_5XX[s]?.includes(m.error.code), `an error frame with ${m.error.code}`);
      } else assert.equal(m.type, 'exit', `a text frame of type ${m.type}`);
    }
    if (w.closeCode !== undefined) assert.ok([1000, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1011].includes(w.closeCode), `close code ${w.closeCode}`);
    if (step.expect?.code === 'validation_error' && step.ws?.frames.length) {
      // A text frame that is not a resize is refused in an error frame.
      assert.ok(w.frames.some((f) => f.opcode === 0x1 && /"validation_error"/.test(f.payload.toString())) || w.closeCode !== undefined, 'a bad text frame went unanswered');
    }
    return { kind: step.kind, status: 101 };
  }
  if (step.ok) assert.fail(`a valid handshake was refused: ${w.status} ${w.body.toString().slice(0, 200)}`);
  if (step.expect?.status !== undefined) assert.equal(w.status, step.expect.status, `expected ${step.expect.status}`);
  const code = restError(asHttp);
  if (step.expect?.code) assert.equal(code, step.expect.code);
  if (w.status >= 500) fiveHundredAllowed(w.status, code, false);
  return { kind: step.kind, status: w.status, note: code };
}

// ---- generators ---------------------------------------------------------------------------------------

type Generator = (t: DoorTarget, r: Rng, lane: number, n: number) => Step;

const badKeyHeaders = (t: DoorTarget, r: Rng): Record<string, string> => r.pick<Record<string, string>>([
  {}, { authorization: 'Bearer' }, { authorization: 'Bearer clm_x' }, { authorization: `Bearer ${t.keys.main}x` }, { authorization: 'Basic YTpi' },
  { authorization: `Bearer clm_${'z'.repeat(40)}` }, { authorization: `Bearer ${t.keys.main} extra` }, { authorization: `Bearer ${t.envdToken}` },
]);

// MCP --------------------------------------------------------------------------------------------------

const TOOL_NAMES = Object.keys(INPUTS);
/** Tools that would end, stall or roll back the shared sandbox, or keep a snapshot of it no step deletes: sent with made-up ids only. */
const DESTRUCTIVE_TOOLS = new Set(['delete_sandbox', 'suspend_sandbox', 'resume_sandbox', 'set_sandbox_timeout', 'fork_sandbox', 'signal_process', 'restore_sandbox', 'snapshot_sandbox']);
/**
 * Tools that act on no sandbox by its id: listings, and those of a snapshot (`list_snapshots`
 * filters by a sandbox id, and one the tenant does not have lists nothing).
 */
const NO_SANDBOX_TOOLS = ['list_images', 'list_sandboxes', 'create_sandbox', 'list_snapshots', 'start_from_snapshot', 'delete_snapshot', 'promote_snapshot'];
const MUTATING_TOOLS = new Set(['write_file', 'remove_path', 'rename_path', 'make_directory']);

/** Valid arguments of every tool, for another tenant's sandbox: each must be sandbox_not_found. */
function foreignArgs(name: string, sandbox_id: string): Record<string, unknown> {
  const more: Record<string, Record<string, unknown>> = {
    exec: { command: 'true' }, fork_sandbox: { count: 1 }, set_sandbox_timeout: { timeout_secs: 60 }, expose_port: { port: 8080 },
    read_file: { path: '/etc/hostname' }, write_file: { path: '/tmp/x', content: 'x' }, list_directory: { path: '/' }, stat_path: { path: '/' }, path_exists: { path: '/' },
    make_directory: { path: '/tmp/d' }, remove_path: { path: '/tmp/d' }, rename_path: { from: '/tmp/a', to: '/tmp/b' }, watch_directory: { path: '/tmp', duration_secs: 0.1 },
    start_process: { command: 'true' }, read_process_output: { pid: 1 }, send_process_input: { pid: 1, input: 'x' }, signal_process: { pid: 1, signal: 'SIGTERM' }, wait_process: { pid: 1, timeout_secs: 0 },
    restore_sandbox: { snapshot_id: 'snap_0000000000000000' },
    run_code: { code: '1' }, restart_code_context: { context: '00000000-0000-4000-8000-000000000000' }, delete_code_context: { context: '00000000-0000-4000-8000-000000000000' },
  };
  return { sandbox_id, ...(more[name] ?? {}) };
}

function mcpStep(t: DoorTarget, kind: string, message: unknown, extra: Partial<Step> = {}, key = t.keys.main): Step {
  return {
    kind, method: 'POST', path: '/mcp',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...(extra.headers ?? {}) },
    body: Buffer.isBuffer(message) ? message : json(message),
    ...extra,
    ...(extra.headers ? { headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...extra.headers } } : {}),
  };
}

const call = (id: unknown, name: string, args: unknown) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } });

/** Arguments for a tool, on the fuzzing tenant's sandbox unless `foreign`. */
function toolArgs(t: DoorTarget, r: Rng, name: string, sandbox0: string): Record<string, unknown> {
  // What would end or stall the shared sandbox (a 1-second lease, a delete) goes to a made-up id.
  const sandbox = sandbox0 === t.sandbox && DESTRUCTIVE_TOOLS.has(name) ? 'sbx_000000000000' : sandbox0;
  const path = r.pick(MUTATING_TOOLS.has(name) ? SAFE_MUTATE_PATHS : GUEST_PATHS);
  switch (name) {
    case 'list_images': case 'list_sandboxes': return {};
    case 'create_sandbox': return { template: r.pick(['nope', '', '../base', 'x'.repeat(300)]) };
    case 'exec': return { sandbox_id: sandbox, command: 'echo hi', timeout: 10 };
    case 'fork_sandbox': return { sandbox_id: sandbox, count: r.pick([0, -1, 1e9, 1.5]) };
    case 'set_sandbox_timeout': return { sandbox_id: sandbox, timeout_secs: r.pick([-1, 0, 1e12, 'x']) };
    case 'expose_port': return { sandbox_id: sandbox, port: r.pick([0, 65536, 8080, -1]) };
    case 'read_file': case 'list_directory': case 'stat_path': case 'path_exists': case 'remove_path': case 'watch_directory': case 'make_directory':
      return { sandbox_id: sandbox, path };
    case 'write_file': return { sandbox_id: sandbox, path: r.pick(['/tmp/doorfuzz/mcp', ...SAFE_MUTATE_PATHS]), content: 'x' };
    case 'rename_path': return { sandbox_id: sandbox, from: path, to: r.pick(SAFE_MUTATE_PATHS) };
    case 'start_process': return { sandbox_id: sandbox, command: r.pick(['true', '']) };
    case 'read_process_output': case 'signal_process': case 'wait_process': case 'send_process_input':
      return { sandbox_id: sandbox, pid: r.pick([t.plainPid, 999999, 0, -1, 1.5]), ...(name === 'signal_process' ? { signal: r.pick(['SIGCONT', 'SIGFOO', 9]) } : name === 'send_process_input' ? { text: '' } : name === 'wait_process' ? { timeout_secs: 0 } : {}) };
    default: return { sandbox_id: sandbox };
  }
}

const mcpGenerator: Generator = (t, r) => {
  const x = r.next();
  const id = r.pick<unknown>([1, 'a', 0, -1, 2 ** 53, 'x'.repeat(200), 1.5]);
  if (x < 0.18) {
    // Valid: reads and light tools on its own sandbox; now and then an exec. Ids the SDK takes (JSON-RPC: a string or an integer).
    const id = r.pick<unknown>([1, 'a', 0, -1, 'x'.repeat(200)]);
    const v = r.int(8);
    if (v === 0) return mcpStep(t, 'valid:initialize', { jsonrpc: '2.0', id, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'fuzz', version: '1' } } }, { ok: [200] });
    if (v === 1) return mcpStep(t, 'valid:tools-list', { jsonrpc: '2.0', id, method: 'tools/list' }, { ok: [200] });
    if (v === 2) return mcpStep(t, 'valid:ping', { jsonrpc: '2.0', id, method: 'ping' }, { ok: [200] });
    if (v === 3) return mcpStep(t, 'valid:notification', { jsonrpc: '2.0', method: 'notifications/initialized' }, { expect: { status: 202 } });
    if (v === 4 && r.chance(0.3)) return mcpStep(t, 'valid:exec', call(id, 'exec', { sandbox_id: t.sandbox, command: 'echo hi', timeout: 20 }), { ok: [200], may502: true });
    const [name, args] = r.pick<[string, Record<string, unknown>]>([
      ['get_sandbox', { sandbox_id: t.sandbox }], ['list_sandboxes', { limit: 5 }], ['list_images', {}], ['stat_path', { sandbox_id: t.sandbox, path: '/tmp' }],
      ['list_processes', { sandbox_id: t.sandbox }], ['path_exists', { sandbox_id: t.sandbox, path: '/etc/hostname' }], ['read_file', { sandbox_id: t.sandbox, path: '/tmp/www/index.html' }],
    ]);
    return mcpStep(t, `valid:${name}`, call(id, name, args), { ok: [200], may502: true });
  }
  if (x < 0.30) {
    // Another tenant's sandbox through every tool: not found, never touched.
    const name = r.pick(TOOL_NAMES.filter((n) => !NO_SANDBOX_TOOLS.includes(n)));
    return mcpStep(t, 'foreign-sandbox', call(id, name, foreignArgs(name, r.pick([t.victimSandbox, 'sbx_000000000000']))), { expect: { code: 'sandbox_not_found' } });
  }
  if (x < 0.60) {
    // Invalid: tools with arguments of the wrong kind, unknown tools and methods, broken envelopes.
    switch (r.int(9)) {
      case 0: {
        const name = r.pick(TOOL_NAMES);
        const args = r.chance(0.5) ? toolArgs(t, r, name, t.sandbox) : {};
        const k = r.pick(['sandbox_id', 'path', 'pid', 'extra', 'command', 'count', 'template']);
        const bad: Record<string, unknown> = { ...args, [k]: wrongValue(r) };
        // Never a create that would work ('base' is among the odd strings), never a real id for what ends it.
        if (name === 'create_sandbox' && typeof bad.template === 'string' && bad.template.startsWith('base')) bad.template = 'nope';
        if (DESTRUCTIVE_TOOLS.has(name) && bad.sandbox_id === t.sandbox) bad.sandbox_id = 'sbx_000000000000';
        return mcpStep(t, `invalid:tool-args:${name}`, call(id, name, bad), { may502: true });
      }
      case 1: return mcpStep(t, 'invalid:tool-args-kind', call(id, r.pick(TOOL_NAMES), r.pick([null, [], 'x', 42, [{}]])));
      case 2: return mcpStep(t, 'invalid:unknown-tool', call(id, r.pick(['nope', '', 'EXEC', 'exec ', '__proto__', 'x'.repeat(500), 'list_images\u0000']), {}));
      case 3: return mcpStep(t, 'invalid:unknown-method', { jsonrpc: '2.0', id, method: r.pick(['nope', 'tools/cal', 'resources/list', 'prompts/get', 'sampling/createMessage', 'completion/complete', '', 'rpc.discover']), params: {} });
      case 4: return mcpStep(t, 'invalid:envelope', r.pick<unknown>([
        { id: 1, method: 'tools/list' }, { jsonrpc: '1.0', id: 1, method: 'tools/list' }, { jsonrpc: '2.0', id: {}, method: 'tools/list' }, { jsonrpc: '2.0', id: [], method: 'ping' },
        { jsonrpc: '2.0', id: 1 }, { jsonrpc: '2.0', id: 1, method: 42 }, { jsonrpc: '2.0', id: 1, method: 'tools/call', params: 'x' }, { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 42 } },
        { jsonrpc: '2.0', id: 1, result: {} }, { jsonrpc: '2.0', id: 1, error: { code: 1, message: 'x' } }, 42, 'x', null, true, [],
      ]));
      case 5: return mcpStep(t, 'invalid:batch', Array.from({ length: r.int(5) }, () => r.chance(0.5) ? { jsonrpc: '2.0', id: r.int(100), method: 'ping' } : wrongValue(r)));
      case 6: return mcpStep(t, 'invalid:content-type', { jsonrpc: '2.0', id, method: 'ping' }, { headers: { 'content-type': r.pick(['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', '', 'application/json; charset=latin1']) } });
      case 7: return mcpStep(t, 'invalid:accept', { jsonrpc: '2.0', id, method: 'ping' }, { headers: { accept: r.pick(['text/html', 'application/json', 'text/event-stream', '*/*', '']) } });
      default: {
        const m = r.pick(['GET', 'DELETE', 'PUT', 'PATCH', 'OPTIONS']);
        return { kind: `invalid:method-${m}`, method: m, path: r.pick(['/mcp', '/mcp/', '/mcp?x=1', '/MCP']), headers: { authorization: `Bearer ${t.keys.main}`, accept: 'application/json, text/event-stream' } };
      }
    }
  }
  if (x < 0.72) {
    // Keys and origins.
    if (r.chance(0.3)) return mcpStep(t, 'foreign-origin', { jsonrpc: '2.0', id, method: 'tools/list' }, { headers: { origin: r.pick(['https://evil.example', 'null', 'http://localhost.evil.example', 'file://', 'http://127.0.0.1.nip.io']) }, expect: { status: 403 } });
    const h = badKeyHeaders(t, r);
    return { kind: 'bad-key', method: 'POST', path: '/mcp', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...h }, body: json(call(1, 'list_sandboxes', {})), expect: { status: 401 } };
  }
  // Hostile: huge, deep, badly encoded, traversing, slow, malformed.
  switch (r.int(8)) {
    case 0: return mcpStep(t, 'hostile:huge', Buffer.from(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","arguments":{"sandbox_id":"${t.sandbox}","command":"${'y'.repeat(HUGE_BODY)}"}}}`), { expect: { status: 413 }, mayReset: true });
    case 1: return mcpStep(t, 'hostile:deep', deepJson(r, (s) => `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","arguments":${s}}}`));
    case 2: return mcpStep(t, 'hostile:bad-utf8', badUtf8(r, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","arguments":{"sandbox_id":"${t.sandbox}","command":"echo `, '"}}}'), { expect: { status: 400 } });
    case 3: {
      const name = r.pick(['read_file', 'write_file', 'list_directory', 'stat_path', 'make_directory', 'watch_directory']);
      const path = r.pick(['/../../../../etc/shadow', '/proc/self/environ', '/tmp/a\u0000b', '/proc/kcore', '/dev/zero', '/' + 'a/'.repeat(3000), '/sys/kernel/notes', '/tmp/doorfuzz/../../etc/passwd']);
      return mcpStep(t, `hostile:path:${name}`, call(1, name, { sandbox_id: t.sandbox, path, ...(name === 'write_file' ? { content: 'x' } : {}), ...(name === 'watch_directory' ? { duration_secs: 0.1 } : {}) }), { may502: true });
    }
    case 4: return mcpStep(t, 'hostile:exec-nul', call(1, 'exec', { sandbox_id: t.sandbox, command: 'pwd', cwd: r.pick(['/tmp\u0000/x', '/../../..', 'relative']) }), { may502: true });
    case 5: return { ...timingHostile(r, 'hostile:timing', 'POST', '/mcp', { authorization: `Bearer ${t.keys.main}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, json(call(1, 'list_images', {}))) };
    case 6: return { kind: 'hostile:malformed-http', method: 'RAW', path: '', headers: {}, raw: malformedHttp(r, '/mcp', `Authorization: Bearer ${t.keys.main}\r\n`) };
    default: return mcpStep(t, 'hostile:headers', { jsonrpc: '2.0', id: 1, method: 'tools/list' }, { headers: r.pick<Record<string, string>>([{ 'mcp-protocol-version': r.pick(['1999-01-01', '', 'x'.repeat(300)]) }, { 'mcp-session-id': r.pick(['x', '\u00ff', 'a'.repeat(1000)]) }, { 'last-event-id': 'x' }]) });
  }
};

/** A body over the test server's JSON limit (doorFuzz.test.ts sets it to 256 KiB). */
export const HUGE_BODY = 256 * 1024 + 1;

// E2B control plane ------------------------------------------------------------------------------------

const e2bStep = (t: DoorTarget, kind: string, method: string, path: string, body?: unknown, extra: Partial<Step> = {}, key = e2bKeyOf(t.keys.main)): Step => ({
  kind, method, path: `/e2b/api${path}`,
  headers: { 'x-api-key': key, ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...(extra.headers ?? {}) },
  ...(body !== undefined ? { body: Buffer.isBuffer(body) ? body : json(body) } : {}),
  ...extra,
  ...(extra.headers ? { headers: { 'x-api-key': key, ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...extra.headers } } : {}),
});

const E2B_ROUTES: Array<[string, string]> = [
  ['POST', '/sandboxes'], ['POST', '/v2/sandboxes'], ['GET', '/sandboxes'], ['GET', '/v2/sandboxes'], ['GET', '/sandboxes/:id'], ['DELETE', '/sandboxes/:id'],
  ['POST', '/sandboxes/:id/timeout'], ['POST', '/sandboxes/:id/pause'], ['POST', '/sandboxes/:id/connect'], ['POST', '/v2/sandboxes/:id/connect'],
  ['POST', '/sandboxes/:id/resume'], ['POST', '/sandboxes/:id/fork'], ['GET', '/sandboxes/:id/metrics'],
  ['POST', '/sandboxes/:id/snapshots'], ['GET', '/snapshots'], ['DELETE', '/templates/:snapshot'],
];
/** A snapshot id of the right shape that no tenant has. */
const NO_SNAPSHOT = 'snap_0000000000000000';

/**
 * A snapshot of sandbox `id` through E2B: listed, refused to another tenant (not started, not
 * deleted), a sandbox started from it as a templateID (killed again), then deleted as the template
 * it is, and gone. The delete is sent whatever came before it: a run leaves no snapshot.
 */
function e2bSnapshotSteps(t: DoorTarget, r: Rng, id: string): Step[] {
  const victim = e2bKeyOf(t.keys.victim);
  return [e2bStep(t, 'valid:snapshot', 'POST', `/sandboxes/${id}/snapshots`, { name: 'doorfuzz' }, {
    ok: [201], may502: true,
    then: (res) => {
      const snap = res?.status === 201 ? res.json().snapshotID : null;
      if (typeof snap !== 'string') return [];
      return [
        e2bStep(t, 'valid:list-snapshots', 'GET', `/snapshots?sandboxID=${id}`, undefined, { ok: [200] }),
        e2bStep(t, 'foreign-snapshot', 'POST', '/sandboxes', { templateID: snap, timeout: 60 }, { expect: { status: 404, code: 'snapshot_not_found' }, then: killIfCreated(t) }, victim),
        e2bStep(t, 'foreign-snapshot', 'DELETE', `/templates/${snap}`, undefined, { expect: { status: 404, code: 'snapshot_not_found' } }, victim),
        e2bStep(t, 'valid:from-snapshot', 'POST', r.pick(['/sandboxes', '/v2/sandboxes']), { templateID: snap, timeout: 300, metadata: { doorfuzz: 'e2b' } }, { ok: [201], may502: true, then: killIfCreated(t) }),
        e2bStep(t, 'valid:delete-snapshot', 'DELETE', `/templates/${snap}`, undefined, { ok: [204] }),
        e2bStep(t, 'deleted-snapshot', 'DELETE', `/templates/${snap}`, undefined, { expect: { status: 404, code: 'snapshot_not_found' } }),
        e2bStep(t, 'deleted-snapshot', 'POST', '/sandboxes', { templateID: snap }, { expect: { status: 404, code: 'snapshot_not_found' }, then: killIfCreated(t) }),
      ];
    },
  })];
}

/** A sandbox this lane creates through E2B, pauses, resumes, forks once or snapshots, and kills: the VM part of the door. */
function e2bLifecycle(t: DoorTarget, r: Rng): Step {
  return e2bStep(t, 'valid:create', 'POST', r.pick(['/sandboxes', '/v2/sandboxes']), { templateID: 'base', timeout: 600, metadata: { doorfuzz: 'e2b' }, envVars: { FUZZ: 'é' } }, {
    ok: [201], may502: true,
    then: (res) => {
      const id = res?.status === 201 ? res.json().sandboxID : null;
      if (!id) return [];
      const steps: Step[] = [];
      const v = r.int(3);
      if (v === 2) {
        steps.push(...e2bSnapshotSteps(t, r, id));
      } else if (v === 0) {
        steps.push(e2bStep(t, 'valid:pause', 'POST', `/sandboxes/${id}/pause`, undefined, { ok: [204], may502: true }));
        steps.push(e2bStep(t, 'paused-pause', 'POST', `/sandboxes/${id}/pause`, undefined, { expect: { status: 409, code: 'invalid_state' } }));
        steps.push(e2bStep(t, 'valid:resume', 'POST', r.pick([`/sandboxes/${id}/resume`, `/sandboxes/${id}/connect`, `/v2/sandboxes/${id}/connect`]), { timeout: 300 }, { ok: [201], may502: true }));
      } else {
        steps.push(e2bStep(t, 'valid:fork', 'POST', `/sandboxes/${id}/fork`, { count: 1, timeout: 300 }, {
          ok: [201], may502: true,
          then: (f) => (f?.status === 201 ? (f.json() as Array<{ sandbox?: { sandboxID: string } }>).filter((c) => c.sandbox).map((c) => e2bStep(t, 'valid:kill', 'DELETE', `/sandboxes/${c.sandbox!.sandboxID}`, undefined, { ok: [204] })) : []),
        }));
      }
      steps.push(e2bStep(t, 'valid:kill', 'DELETE', `/sandboxes/${id}`, undefined, { ok: [204] }));
      steps.push(e2bStep(t, 'killed', 'GET', `/sandboxes/${id}`, undefined, { expect: { status: 404, code: 'sandbox_not_found' } }));
      return steps;
    },
  });
}

const killIfCreated = (t: DoorTarget) => (res: FuzzAnswer | null): Step[] => {
  const id = res?.status === 201 ? res.json()?.sandboxID : undefined;
  return typeof id === 'string' ? [e2bStep(t, 'valid:kill', 'DELETE', `/sandboxes/${id}`, undefined, { ok: [204] })] : [];
};

const e2bGenerator: Generator = (t, r) => {
  const x = r.next();
  if (x < 0.015) return e2bLifecycle(t, r);
  if (x < 0.2) {
    const v = r.int(8);
    if (v === 0) return e2bStep(t, 'valid:list', 'GET', r.pick(['/sandboxes', '/v2/sandboxes', '/v2/sandboxes?state=running,paused&limit=5', '/v2/sandboxes?metadata=doorfuzz%3Dyes']), undefined, { ok: [200] });
    if (v === 1) return e2bStep(t, 'valid:get', 'GET', `/sandboxes/${t.sandbox}`, undefined, { ok: [200] });
    if (v === 2) return e2bStep(t, 'valid:metrics', 'GET', `/sandboxes/${t.sandbox}/metrics`, undefined, { ok: [200] });
    if (v === 3) return e2bStep(t, 'valid:connect', 'POST', r.pick([`/sandboxes/${t.sandbox}/connect`, `/v2/sandboxes/${t.sandbox}/connect`]), { timeout: 60 }, { ok: [200] });
    if (v === 4) return e2bStep(t, 'valid:timeout', 'POST', `/sandboxes/${t.sandbox}/timeout`, { timeout: 6 * 3600 }, { ok: [204] });
    if (v === 5) return e2bStep(t, 'valid:list-snapshots', 'GET', r.pick(['/snapshots', '/snapshots?limit=1', `/snapshots?sandboxID=${t.sandbox}`, `/snapshots?sandboxID=${t.victimSandbox}`, '/snapshots?name=doorfuzz', `/snapshots?name=${NO_SNAPSHOT}`]), undefined, { ok: [200] });
    if (v === 6) {
      // A snapshot no one has, as a template to start from or to delete.
      return r.chance(0.5)
        ? e2bStep(t, 'snapshot-not-found', 'DELETE', `/templates/${NO_SNAPSHOT}`, undefined, { expect: { status: 404, code: 'snapshot_not_found' } })
        : e2bStep(t, 'snapshot-not-found', 'POST', r.pick(['/sandboxes', '/v2/sandboxes']), { templateID: NO_SNAPSHOT }, { expect: { status: 404, code: 'snapshot_not_found' }, then: killIfCreated(t) });
    }
    return e2bStep(t, 'template-not-found', 'POST', '/sandboxes', { templateID: r.pick(['nope', 'x'.repeat(200), '..', 'base:latest']) }, { expect: { status: 404 }, then: killIfCreated(t) });
  }
  if (x < 0.35) {
    // Another tenant's sandbox (and made-up ids) on every route with an id.
    if (r.chance(0.1)) return e2bStep(t, 'foreign', 'DELETE', `/templates/${r.pick([NO_SNAPSHOT, 'snap_ffffffffffffffff'])}`, undefined, { expect: { status: 404, code: 'snapshot_not_found' } });
    const [method, path] = r.pick(E2B_ROUTES.filter(([, p]) => p.includes(':id')));
    const id = r.pick([t.victimSandbox, 'sbx_000000000000', 'sbx_ffffffffffff']);
    return e2bStep(t, 'foreign', method, path.replace(':id', id), method === 'POST' ? { timeout: 30, count: 1 } : undefined, { expect: { status: 404, code: 'sandbox_not_found' } });
  }
  if (x < 0.65) {
    // Invalid bodies, queries and ids on every route.
    const [method, path0] = r.pick(E2B_ROUTES);
    const id = r.pick([t.sandbox, 'nope', '..', '%00', 'x'.repeat(900), 'SBX_0123456789AB', '%ff%fe', encodeURIComponent('😀')]);
    let path = path0.replace(':id', id).replace(':snapshot', r.pick([id, NO_SNAPSHOT, 'snap_0', 'SNAP_0123456789ABCDEF', 'snap_' + 'f'.repeat(900)]));
    if (method === 'GET' && r.chance(0.6)) path += '?' + r.pick(['state=x', 'state=running,bogus', 'limit=0', 'limit=1e9', 'limit=-1', 'limit=abc', 'metadata=%ff', 'nextToken=x', 'startedAfter=notadate', 'metadata=a%3Db%26c', 'state=', 'limit=101', 'nextToken=snap_x', 'sandboxID=%00', 'name=' + 'x'.repeat(300), 'name=a:b:c']);
    const bodies: unknown[] = [
      { templateID: wrongValue(r) }, { templateID: 'base', autoPause: true }, { templateID: 'base', mcp: {} }, { templateID: 'base', volumeMounts: [{}] }, { templateID: 'base', network: {} },
      { templateID: 'base', envVars: wrongValue(r) }, { templateID: 'base', metadata: wrongValue(r) }, { templateID: 'base', timeout: r.pick([-1, 1.5, 'x']) },
      { timeout: wrongValue(r) }, { count: r.pick([0, -1, 1e9, 1.5, 'x', 101]) }, [], 'x', 42, null, {},
    ];
    const invalidPauseOrKill = method === 'DELETE' || path0.endsWith('/pause') || path0.endsWith('/timeout');
    // Never pause or kill the shared sandbox for real, nor snapshot it (any body without a bad name
    // would be taken): those go to made-up ids only.
    if ((invalidPauseOrKill || path0.endsWith('/snapshots')) && id === t.sandbox) path = path0.replace(':id', 'sbx_000000000000');
    // A fork or a resume with a valid body of the shared sandbox would work: bodies here are all wrong.
    let body: Buffer | undefined;
    if (method !== 'GET' && method !== 'DELETE') {
      body = r.chance(0.85) ? json(r.pick(bodies)) : Buffer.from(r.pick(['{bad', '', '{}x', '\ufeff{}', 'null', '{"templateID": ']));
      if (path0 === '/sandboxes/:id/fork' && id === t.sandbox) body = json({ count: r.pick([0, -1, 101, 1.5, 'x']) });
      if (path0 === '/sandboxes/:id/resume' && id === t.sandbox) body = json({ timeout: 'x' });
      if ((path0.endsWith('/sandboxes') && method === 'POST')) {
        // A create must be refused before it makes anything: a body that cannot be valid.
        const b = r.pick(bodies.slice(0, 8));
        body = json(b);
        if (typeof b === 'object' && b && 'templateID' in b && typeof (b as any).templateID === 'string' && (b as any).templateID !== '' && Object.keys(b).length === 1) body = json({ templateID: 'nope-' + (b as any).templateID });
      }
    }
    const headers: Record<string, string> = r.chance(0.2) ? { 'content-type': r.pick(['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data']) } : {};
    // A create whose odd body turned out valid (null envVars, say) is killed again.
    return e2bStep(t, `invalid:${method} ${path0}`, method, path, undefined, { body, headers: { ...(body ? { 'content-type': 'application/json' } : {}), ...headers }, then: killIfCreated(t), may502: path0.endsWith('/sandboxes') && method === 'POST' });
  }
  if (x < 0.8) {
    // Keys: none, wrong, a bearer instead, the envd token, another tenant's e2b key on our sandbox.
    const [method, path] = r.pick(E2B_ROUTES);
    const headers = r.pick<Record<string, string>>([
      {}, { 'x-api-key': 'e2b_' + '0'.repeat(80) }, { 'x-api-key': 'e2b_zz' }, { 'x-api-key': t.envdToken }, { 'x-api-key': '' }, { 'x-api-key': `${e2bKeyOf(t.keys.main)}0` },
      { authorization: 'Bearer clm_x' }, { 'x-api-key': t.trafficToken },
    ]);
    return { kind: 'bad-key', method, path: `/e2b/api${path.replace(':id', t.sandbox)}`, headers: { ...headers, ...(method === 'POST' ? { 'content-type': 'application/json' } : {}) }, ...(method === 'POST' ? { body: json({ templateID: 'base' }) } : {}), expect: { status: 401 } };
  }
  switch (r.int(6)) {
    case 0: return e2bStep(t, 'hostile:huge', 'POST', '/sandboxes', Buffer.from(`{"templateID":"nope","metadata":{"x":"${'y'.repeat(HUGE_BODY)}"}}`), { expect: { status: 413 }, mayReset: true });
    case 1: return e2bStep(t, 'hostile:deep', 'POST', r.pick(['/sandboxes', `/sandboxes/${t.sandbox}/timeout`]), deepJson(r, (s) => `{"templateID":"nope","metadata":${s}}`));
    case 2: return e2bStep(t, 'hostile:bad-utf8', 'POST', '/sandboxes', badUtf8(r, '{"templateID":"', '"}'), { expect: { status: 400, code: 'invalid_json' } });
    case 3: return { kind: 'hostile:traversal', method: 'GET', path: `/e2b/api${r.pick(['/sandboxes/..%2f..%2fv1%2fkeys', '/../v1/keys', '/sandboxes/%2e%2e', '/sandboxes/sbx_0123456789ab%00', '/%00', '/sandboxes/' + t.sandbox + '%2fmetrics'])}`, headers: { 'x-api-key': e2bKeyOf(t.keys.main) } };
    case 4: return timingHostile(r, 'hostile:timing', 'POST', `/e2b/api/sandboxes/${t.sandbox}/timeout`, { 'x-api-key': e2bKeyOf(t.keys.main), 'content-type': 'application/json' }, json({ timeout: 6 * 3600 }));
    default: return { kind: 'hostile:malformed-http', method: 'RAW', path: '', headers: {}, raw: malformedHttp(r, '/e2b/api/sandboxes', `X-API-Key: ${e2bKeyOf(t.keys.main)}\r\n`) };
  }
};

// envd (Connect) ---------------------------------------------------------------------------------------

const UNARY = ['process.Process/List', 'process.Process/SendInput', 'process.Process/SendSignal', 'process.Process/CloseStdin', 'process.Process/Update',
  'filesystem.Filesystem/Stat', 'filesystem.Filesystem/MakeDir', 'filesystem.Filesystem/Move', 'filesystem.Filesystem/ListDir', 'filesystem.Filesystem/Remove',
  'filesystem.Filesystem/CreateWatcher', 'filesystem.Filesystem/GetWatcherEvents', 'filesystem.Filesystem/RemoveWatcher'];
const STREAMING = ['process.Process/Start', 'process.Process/Connect', 'filesystem.Filesystem/WatchDir'];
const CONNECT_TYPE = 'application/connect+json';

function envelopeOf(message: unknown, flags = 0): Buffer {
  const body = Buffer.isBuffer(message) ? message : json(message);
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

function envdStep(t: DoorTarget, kind: string, rpc: string, message: unknown, extra: Partial<Step> = {}, auth: Record<string, string> = { 'e2b-sandbox-id': t.sandbox, 'x-access-token': t.envdToken }): Step {
  const enveloped = extra.enveloped ?? STREAMING.includes(rpc);
  const body = Buffer.isBuffer(message) ? message : enveloped ? envelopeOf(message) : json(message);
  const endless = rpc === 'process.Process/Connect' || rpc === 'filesystem.Filesystem/WatchDir';
  return {
    kind, method: 'POST', path: `/e2b/envd/${rpc}`, rpc, enveloped, body,
    ...(endless ? { abortStream: true } : {}),
    ...extra,
    headers: { ...auth, 'content-type': enveloped ? CONNECT_TYPE : 'application/json', 'connect-protocol-version': '1', ...(extra.headers ?? {}) },
  };
}

/** A message for an envd method, valid in shape, on the given paths and pids. */
function envdMessage(t: DoorTarget, r: Rng, rpc: string): Record<string, unknown> {
  const path = r.pick(GUEST_PATHS);
  const pid = r.pick([t.plainPid, 999999, 0]);
  switch (rpc) {
    case 'process.Process/Start': return { process: { cmd: r.pick(['/bin/sh', '/nonexistent', '', 'sh']), args: ['-c', 'true'], envs: {}, cwd: r.pick(['', '/tmp', '/nonexistent', '/tmp\u0000x']) } };
    case 'process.Process/Connect': case 'process.Process/CloseStdin': return { process: r.chance(0.5) ? { pid } : { tag: r.pick(['plain', 'nope', '']) } };
    case 'process.Process/SendInput': return { process: { pid }, input: r.pick([{ stdin: 'eA==' }, { pty: '!!' }, {}, { stdin: 5 }]) };
    case 'process.Process/SendSignal': return { process: { pid: 999999 }, signal: r.pick(['SIGNAL_SIGTERM', 'SIGNAL_SIGKILL', 'SIGNAL_SIGHUP', 15, 'x']) };
    case 'process.Process/Update': return { process: { pid: 999999 }, pty: { size: { cols: r.pick([80, -1, 'x', 1e9]), rows: 24 } } };
    case 'filesystem.Filesystem/Move': return { source: r.pick(SAFE_MUTATE_PATHS), destination: r.pick(SAFE_MUTATE_PATHS) };
    case 'filesystem.Filesystem/MakeDir': return { path: r.pick(['/tmp/doorfuzz/d' + r.int(20), ...GUEST_PATHS]) };
    case 'filesystem.Filesystem/Remove': return { path: r.pick(['/tmp/doorfuzz/d' + r.int(20), '/nonexistent', '', '/tmp/a\u0000b']) };
    case 'filesystem.Filesystem/ListDir': return { path, depth: r.pick([1, 0, -1, 'x', 2]) };
    case 'filesystem.Filesystem/CreateWatcher': case 'filesystem.Filesystem/WatchDir': return { path: r.pick(['/nonexistent', '', '/tmp/a\u0000b', '/etc/hostname']), recursive: r.chance(0.5) };
    case 'filesystem.Filesystem/GetWatcherEvents': case 'filesystem.Filesystem/RemoveWatcher': return { watcherId: r.pick(['w1', 'nope', '', 42, null]) };
    default: return { path };
  }
}

const envdGenerator: Generator = (t, r) => {
  const x = r.next();
  const auth = { 'e2b-sandbox-id': t.sandbox, 'x-access-token': t.envdToken };
  if (x < 0.2) {
    // Valid: light calls, now and then a process start (VM work), files up and down.
    switch (r.int(9)) {
      case 0: return envdStep(t, 'valid:stat', 'filesystem.Filesystem/Stat', { path: r.pick(['/tmp', '/etc/hostname', '/tmp/www/index.html']) }, { ok: [200] });
      case 1: return envdStep(t, 'valid:list-dir', 'filesystem.Filesystem/ListDir', { path: r.pick(['/', '/tmp']), depth: 1 }, { ok: [200] });
      case 2: return envdStep(t, 'valid:processes', 'process.Process/List', {}, { ok: [200] });
      case 3: return r.chance(0.5)
        ? envdStep(t, 'valid:start', 'process.Process/Start', { process: { cmd: '/bin/bash', args: ['-l', '-c', 'echo hi'], envs: { A: 'b' } } }, { ok: [200] })
        : envdStep(t, 'valid:start-unary-json', 'process.Process/Start', { process: { cmd: 'true' } }, { enveloped: false, ok: [200] });
      case 4: return { kind: 'valid:download', method: 'GET', path: `/e2b/envd/files?path=${encodeURIComponent(r.pick(['/etc/hostname', '/tmp/www/index.html']))}`, headers: auth, ok: [200] };
      case 5: return { kind: 'valid:upload', method: 'POST', path: `/e2b/envd/files?path=${encodeURIComponent(`/tmp/doorfuzz/up-${r.int(10)}`)}`, headers: { ...auth, 'content-type': 'application/octet-stream' }, body: randomBytesFrom(r, r.int(4096)), ok: [200] };
      case 6: {
        const boundary = 'fuzzb' + r.int(1000);
        const body = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="/tmp/doorfuzz/mp-${r.int(5)}"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--${boundary}--\r\n`);
        return { kind: 'valid:upload-multipart', method: 'POST', path: '/e2b/envd/files', headers: { ...auth, 'content-type': `multipart/form-data; boundary=${boundary}` }, body, ok: [200] };
      }
      case 7: return { kind: 'valid:health', method: 'GET', path: '/e2b/envd/health', headers: auth, ok: [204] };
      default: return envdStep(t, 'valid:mkdir', 'filesystem.Filesystem/MakeDir', { path: `/tmp/doorfuzz/m${r.int(30)}` }, { may502: false, expect: {} });
    }
  }
  if (x < 0.4) {
    // Tokens: none, wrong, rotated, the traffic token, another tenant's token on our id, ours on another's id, no id.
    const rpc = r.pick([...UNARY, ...STREAMING]);
    const headers = r.pick<Record<string, string>>([
      {}, { 'e2b-sandbox-id': t.sandbox }, { 'e2b-sandbox-id': t.sandbox, 'x-access-token': 'x' }, { 'e2b-sandbox-id': t.sandbox, 'x-access-token': t.trafficToken },
      { 'e2b-sandbox-id': t.sandbox, 'x-access-token': t.victimEnvdToken }, { 'e2b-sandbox-id': t.victimSandbox, 'x-access-token': t.envdToken },
      { 'e2b-sandbox-id': 'sbx_000000000000', 'x-access-token': t.envdToken }, { 'x-access-token': t.envdToken }, { 'e2b-sandbox-id': '..', 'x-access-token': t.envdToken },
      ...(t.rotatedEnvdToken ? [{ 'e2b-sandbox-id': t.sandbox, 'x-access-token': t.rotatedEnvdToken }] : []),
      { 'e2b-sandbox-id': t.sandbox, 'x-access-token': t.keys.main }, { 'e2b-sandbox-id': t.sandbox, authorization: `Bearer ${t.keys.main}` },
    ]);
    if (r.chance(0.25)) {
      const get = r.chance(0.5);
      return { kind: `bad-token:files-${get ? 'get' : 'post'}`, method: get ? 'GET' : 'POST', path: '/e2b/envd/files?path=%2Fetc%2Fhostname', headers: { ...headers, 'content-type': 'application/octet-stream' }, ...(get ? {} : { body: Buffer.from('x') }), expect: { status: headers['e2b-sandbox-id'] === undefined ? 400 : 401 } };
    }
    return envdStep(t, 'bad-token', rpc, envdMessage(t, r, rpc), {}, headers);
  }
  if (x < 0.7) {
    // Invalid messages and envelopes.
    const rpc = r.pick([...UNARY, ...STREAMING, 'process.Process/StreamInput']);
    switch (r.int(8)) {
      case 0: case 1: return envdStep(t, `invalid:${rpc}`, rpc, envdMessage(t, r, rpc), { may502: false });
      case 2: return envdStep(t, 'invalid:wrong-kinds', rpc, { [r.pick(['path', 'process', 'source', 'watcherId', 'signal', 'input', 'pty'])]: wrongValue(r) });
      case 3: return envdStep(t, 'invalid:not-json', rpc, Buffer.from(r.pick(['{bad', '[]', '"x"', '42', 'null', '{}x', '\ufeff{}'])), { enveloped: false });
      case 4: {
        // Broken envelopes: truncated, lying about their length, compressed, over the limit, end-stream first.
        const msg = json({ path: '/tmp' });
        const bodies = [
          Buffer.from([0, 0, 0]), Buffer.concat([Buffer.from([0, 0, 0, 1, 0]), msg]), envelopeOf({ path: '/tmp' }, 0x01), Buffer.concat([Buffer.from([0, 0xff, 0xff, 0xff, 0xff]), msg]),
          envelopeOf({}, 0x02), Buffer.concat([envelopeOf(Buffer.from('not json')), envelopeOf({})]), Buffer.alloc(0), envelopeOf(Buffer.from('{"a":')),
        ];
        return envdStep(t, 'invalid:envelope', r.pick([...STREAMING, 'process.Process/StreamInput']), r.pick(bodies), { enveloped: true });
      }
      case 5: return envdStep(t, 'invalid:unknown-method', r.pick(['process.Process/Nope', 'filesystem.Filesystem/Read', 'x.Y/Z', 'process.Process/start', '..%2F..%2Fv1%2Fkeys']), {}, {});
      case 6: {
        const m = r.pick(['GET', 'PUT', 'DELETE']);
        return { kind: `invalid:method-${m}`, method: m, path: `/e2b/envd/${r.pick(UNARY)}`, headers: auth };
      }
      // A path nothing shares (envd takes any Content-Type, so this one runs: a Remove of /tmp would take the doors' /tmp/www with it).
      default: return envdStep(t, 'invalid:content-type', rpc, { path: '/tmp/doorfuzz/ct' }, { headers: { 'content-type': r.pick(['text/plain', '', 'application/grpc', 'application/proto', 'application/connect+proto']) } });
    }
  }
  // Hostile.
  switch (r.int(9)) {
    case 0: return envdStep(t, 'hostile:bad-utf8', 'filesystem.Filesystem/Stat', badUtf8(r, '{"path":"/tmp/', '"}'), { enveloped: false, expect: { status: 400, code: 'invalid_argument' } });
    case 1: return envdStep(t, 'hostile:bad-utf8-envelope', 'process.Process/Start', envelopeOf(badUtf8(r, '{"process":{"cmd":"/bin/echo","args":["', '"]}}')), { enveloped: true, expect: { code: 'invalid_argument' } });
    case 2: return envdStep(t, 'hostile:deep', r.pick(UNARY), deepJson(r, (s) => `{"path":${s}}`), { enveloped: false });
    case 3: {
      // Paths out of the guest, into /proc, with NULs; reads through /files too.
      const path = r.pick(['/../../../../etc/shadow', '/proc/self/environ', '/tmp/a\u0000b', '/proc/kcore', '/dev/zero', '/' + 'a/'.repeat(3000), '/proc/1/mem']);
      if (r.chance(0.5)) return { kind: 'hostile:files-path', method: 'GET', path: `/e2b/envd/files?path=${encodeURIComponent(path)}`, headers: auth, may502: false };
      return envdStep(t, 'hostile:path', r.pick(['filesystem.Filesystem/Stat', 'filesystem.Filesystem/ListDir', 'filesystem.Filesystem/MakeDir']), { path });
    }
    case 4: {
      // Signed file URLs: forged, expired, for another path.
      const q = r.pick([
        'path=%2Fetc%2Fhostname&signature=v1_forged', `path=%2Fetc%2Fhostname&signature=v1_${'A'.repeat(43)}&signature_expiration=1`, 'path=%2Fetc%2Fhostname&signature=&username=root',
        `path=%2Fetc%2Fhostname&signature=v1_x&signature_expiration=${'9'.repeat(30)}`, 'signature=v1_x', 'path=%2Fetc%2Fhostname&signature=v1_x&signature_expiration=abc',
      ]);
      return { kind: 'hostile:signed-url', method: r.pick(['GET', 'POST']), path: `${r.pick(['/e2b/envd/files', '/files'])}?${q}`, headers: r.chance(0.5) ? { 'e2b-sandbox-id': t.sandbox } : {} };
    }
    case 5: {
      const boundary = 'b';
      const bodies = [
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="../../../../tmp/doorfuzz-escape"\r\n\r\nx\r\n--${boundary}--\r\n`,
        `--${boundary}\r\nContent-Disposition: form-data; name="file"\r\n\r\nx\r\n--${boundary}--\r\n`,
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="/tmp/a\u0000b"\r\n\r\nx\r\n--${boundary}--\r\n`,
        `--${boundary}\r\nbroken`, 'no multipart at all',
      ];
      return { kind: 'hostile:multipart', method: 'POST', path: '/e2b/envd/files', headers: { ...auth, 'content-type': r.pick([`multipart/form-data; boundary=${boundary}`, 'multipart/form-data']) }, body: Buffer.from(r.pick(bodies)) };
    }
    case 6: return { kind: 'hostile:gzip-upload', method: 'POST', path: '/e2b/envd/files?path=%2Ftmp%2Fdoorfuzz%2Fgz', headers: { ...auth, 'content-type': 'application/octet-stream', 'content-encoding': 'gzip' }, body: Buffer.from('x'), expect: { status: 400 } };
    case 7: return timingHostile(r, 'hostile:timing', 'POST', r.chance(0.5) ? '/e2b/envd/filesystem.Filesystem/Stat' : '/e2b/envd/files?path=%2Ftmp%2Fdoorfuzz%2Fslow', { ...auth, 'content-type': 'application/json' }, json({ path: '/tmp' }));
    default: return r.chance(0.1)
      ? envdStep(t, 'hostile:over-limit', 'filesystem.Filesystem/Stat', Buffer.alloc(16 * MiB + 6, 0x20), { enveloped: false, mayReset: true })
      : { kind: 'hostile:malformed-http', method: 'RAW', path: '', headers: {}, raw: malformedHttp(r, '/e2b/envd/filesystem.Filesystem/Stat', `E2b-Sandbox-Id: ${t.sandbox}\r\nX-Access-Token: ${t.envdToken}\r\n`) };
  }
};

// terminal ---------------------------------------------------------------------------------------------

const terminalPath = (id: string, pid: string | number) => `/v1/sandboxes/${id}/processes/${pid}/terminal`;

function handshake(t: DoorTarget, over: Record<string, string | undefined> = {}): Record<string, string> {
  const h: Record<string, string | undefined> = {
    connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': randomBytes(16).toString('base64'),
    'sec-websocket-protocol': `collimate.terminal, bearer.${t.keys.main}`, ...over,
  };
  return Object.fromEntries(Object.entries(h).filter(([, v]) => v !== undefined)) as Record<string, string>;
}

const resize = (cols: unknown, rows: unknown) => encodeFrame(json({ type: 'resize', cols, rows }), 0x1, true);

const terminalGenerator: Generator = (t, r) => {
  const x = r.next();
  const ws = (frames: Buffer[], extra: Partial<WsPlan> = {}): WsPlan => ({ headers: handshake(t), frames, pauseMs: 20, listenMs: 150, ...extra });
  if (x < 0.25) {
    // Valid sessions: keystrokes and resizes, then a polite close.
    const frames = Array.from({ length: 1 + r.int(4) }, () => r.chance(0.6) ? encodeFrame(Buffer.from(r.pick(['echo hi\n', 'true\n', '\n', 'x'])), 0x2, true) : resize(1 + r.int(300), 1 + r.int(100)));
    return { kind: 'valid:session', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws(frames), ok: [101], may502: true };
  }
  if (x < 0.35) {
    // Without Upgrade: the process a WebSocket would attach to, as JSON.
    return { kind: 'plain-get', method: 'GET', path: terminalPath(t.sandbox, r.pick([t.ptyPid, t.plainPid, 999999])), headers: { authorization: `Bearer ${t.keys.main}` } };
  }
  if (x < 0.65) {
    // Refused handshakes.
    const v = r.int(11);
    const pathOf = () => terminalPath(t.sandbox, t.ptyPid);
    const refuse = (kind: string, headers: Record<string, string>, path = pathOf(), status?: number): Step => ({ kind, method: 'GET', path, headers: {}, ws: { headers, frames: [], pauseMs: 0, listenMs: 100 }, ...(status ? { expect: { status } } : {}) });
    switch (v) {
      case 0: return refuse('no-key', handshake(t, { 'sec-websocket-protocol': 'collimate.terminal' }), pathOf(), 401);
      case 1: return refuse('bad-key', handshake(t, { 'sec-websocket-protocol': `collimate.terminal, bearer.${r.pick(['clm_x', t.keys.main + 'x', t.envdToken, t.victimEnvdToken, ''])}` }), pathOf(), 401);
      case 2: return refuse('key-in-authorization', handshake(t, { 'sec-websocket-protocol': 'collimate.terminal', authorization: `Bearer ${t.keys.main}` }), pathOf());
      case 3: return refuse('no-subprotocol', handshake(t, { 'sec-websocket-protocol': `bearer.${t.keys.main}` }), pathOf(), 400);
      case 4: return refuse('foreign-sandbox', handshake(t), terminalPath(r.pick([t.victimSandbox, 'sbx_000000000000']), 1), 404);
      case 5: return refuse('not-a-terminal', handshake(t), terminalPath(t.sandbox, t.plainPid), 409);
      case 6: return refuse('bad-pid', handshake(t), terminalPath(t.sandbox, r.pick(['0', '-1', 'abc', '1e3', '99999999999', '%00', '999999'])));
      case 7: return refuse('bad-id', handshake(t), terminalPath(r.pick(['nope', '..', '%00', '%ff%fe', 'x'.repeat(900), 'SBX_0123456789AB']), t.ptyPid));
      case 8: return refuse('bad-version', handshake(t, { 'sec-websocket-version': r.pick(['8', '0', 'x', '']) }), pathOf());
      case 9: return refuse('bad-ws-key', handshake(t, { 'sec-websocket-key': r.pick(['', 'short', 'x'.repeat(100), undefined as unknown as string]) }), pathOf());
      default: return refuse('not-websocket', handshake(t, { upgrade: r.pick(['h2c', 'WebSocket2', 'tls/1.0']) }), pathOf());
    }
  }
  // Hostile frames on an open session.
  const v = r.int(10);
  switch (v) {
    case 0: return { kind: 'hostile:bad-text', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([encodeFrame(Buffer.from(r.pick(['hello', '{"type":"resize"}', '{"type":"resize","cols":0,"rows":0}', '{"type":"resize","cols":1e9,"rows":1}', 'null', '{"__proto__":{}}', '[]'])), 0x1, true)]), expect: { code: 'validation_error' } };
    case 1: return { kind: 'hostile:text-bad-utf8', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([rawFrame({ opcode: 0x1, payload: Buffer.from([0x7b, 0xff, 0xfe, 0x7d]) })]) };
    case 2: return { kind: 'hostile:unmasked', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([rawFrame({ opcode: 0x2, mask: false, payload: Buffer.from('echo x\n') })]) };
    case 3: return { kind: 'hostile:reserved', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([rawFrame({ opcode: r.pick([0x3, 0x7, 0xb, 0xf]), payload: Buffer.from('x') }), rawFrame({ opcode: 0x2, rsv: 1 + r.int(7), payload: Buffer.from('x') })].slice(r.int(2))) };
    case 4: return { kind: 'hostile:oversized', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([rawFrame({ opcode: 0x2, payload: Buffer.alloc(1024 * 1024 + 1 + r.int(1000), 0x61) })]) };
    case 5: return { kind: 'hostile:length-lie', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([rawFrame({ opcode: 0x2, payload: Buffer.from('x'), lengthLie: r.pick([2 ** 40, 2 ** 31, 1024 * 1024 * 1024]) })], { vanish: r.chance(0.5) }) };
    case 6: return { kind: 'hostile:vanish-mid-frame', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([rawFrame({ opcode: 0x2, payload: Buffer.alloc(1000, 0x62) }).subarray(0, 1 + r.int(900))], { vanish: true }) };
    case 7: return { kind: 'hostile:fragments', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([rawFrame({ fin: false, opcode: 0x1, payload: Buffer.from('{"type":') }), rawFrame({ opcode: 0x9, payload: Buffer.from('ping') }), rawFrame({ opcode: 0x0, payload: Buffer.from('"resize","cols":90,"rows":30}') })]) };
    case 8: return { kind: 'hostile:control-oversized', method: 'GET', path: terminalPath(t.sandbox, t.ptyPid), headers: {}, ws: ws([rawFrame({ opcode: r.pick([0x8, 0x9, 0xa]), payload: Buffer.alloc(200, 0x63) })]) };
    default: return { kind: 'hostile:malformed-http', method: 'RAW', path: '', headers: {}, raw: Buffer.from(`GET ${terminalPath(t.sandbox, t.ptyPid)} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${randomBytes(16).toString('base64')}\r\nSec-WebSocket-Protocol: collimate.terminal, bearer.${t.keys.main}\r\nContent-Length: 5\r\n\r\nhello`, 'latin1'), mayReset: true };
  }
};

// ports ------------------------------------------------------------------------------------------------

const portsGenerator: Generator = (t, r): Step => {
  const x = r.next();
  const key = { authorization: `Bearer ${t.keys.main}` };
  const keyed = (port: number | string, rest = '/') => `/v1/sandboxes/${t.sandbox}/ports/${port}${rest}`;
  const hostOf = (id: string, port: number | string) => `${port}-${id}.localhost:${t.base.port}`;
  if (x < 0.25) {
    switch (r.int(6)) {
      case 0: return { kind: 'valid:keyed', method: r.pick(['GET', 'HEAD']), path: keyed(t.httpPort, r.pick(['/', '/index.html'])), headers: key, ok: [200], may502: true };
      case 1: return { kind: 'valid:signed', method: 'GET', path: t.signedPath + r.pick(['', 'index.html']), headers: {}, ok: [200], may502: true };
      case 2: return { kind: 'valid:host-routed', method: 'GET', path: r.pick(['/', '/index.html']), headers: { host: hostOf(t.sandbox, t.httpPort), 'e2b-traffic-access-token': t.trafficToken }, ok: [200], may502: true };
      case 3: return { kind: 'sandbox-404', method: 'GET', path: keyed(t.httpPort, '/missing-' + r.int(100)), headers: key, ok: [404], may502: true };
      case 4: return { kind: 'closed-port', method: 'GET', path: r.chance(0.5) ? keyed(r.pick([9, 1, 65535, 8081])) : t.signedClosedPath, headers: r.chance(0.5) ? { ...key } : {}, may502: true };
      default: return { kind: 'valid:post', method: 'POST', path: keyed(t.httpPort, '/index.html'), headers: { ...key, 'content-type': 'text/plain' }, body: Buffer.from('x'.repeat(r.int(5000))), may502: true };
    }
  }
  if (x < 0.55) {
    // Who may reach a port: keys, tokens, hosts, signed URLs.
    switch (r.int(10)) {
      case 0: return { kind: 'foreign-sandbox', method: 'GET', path: `/v1/sandboxes/${r.pick([t.victimSandbox, 'sbx_000000000000'])}/ports/${t.httpPort}/`, headers: key, expect: { status: 404, code: 'sandbox_not_found' } };
      case 1: return { kind: 'bad-key', method: 'GET', path: keyed(t.httpPort), headers: badKeyHeaders(t, r), expect: { status: 401 } };
      case 2: return { kind: 'host-no-token', method: 'GET', path: '/', headers: { host: hostOf(t.sandbox, t.httpPort) }, expect: { status: 401 } };
      case 3: return { kind: 'host-wrong-token', method: 'GET', path: '/', headers: { host: hostOf(t.sandbox, t.httpPort), 'e2b-traffic-access-token': r.pick([t.envdToken, t.victimTrafficToken, 'x', '', ...(t.rotatedEnvdToken ? [t.rotatedEnvdToken] : [])]) }, expect: { status: 401 } };
      case 4: return { kind: 'host-foreign', method: 'GET', path: '/', headers: { host: hostOf(t.victimSandbox, t.httpPort), 'e2b-traffic-access-token': t.trafficToken }, expect: { status: 401 } };
      case 5: return { kind: 'host-weird', method: 'GET', path: '/', headers: { host: r.pick([`0-${t.sandbox}.localhost`, `99999-${t.sandbox}.localhost`, `${t.httpPort}-sbx_zz.localhost`, `${t.httpPort}-${t.sandbox}.`, `${t.httpPort}-${t.sandbox}.localhost:${t.base.port}/x`, 'localhost', '']), 'e2b-traffic-access-token': t.trafficToken } };
      case 6: {
        const token = t.signedPath.split('/')[3];
        const altered = r.pick([token.slice(0, -1) + (token.endsWith('A') ? 'B' : 'A'), token + 'x', token.split('.').reverse().join('.'), 'x', '..', '%00', 'a'.repeat(400), t.signedClosedPath.split('/')[3].slice(0, 10) + token.slice(10)]);
        return { kind: 'signed-altered', method: 'GET', path: `/v1/p/${altered}/`, headers: {} };
      }
      case 7: return { kind: 'signed-cookie', method: 'GET', path: '/', headers: { host: hostOf(t.sandbox, t.httpPort), cookie: `__collimate_port=${r.pick(['x', t.signedClosedPath.split('/')[3], ''])}` }, expect: { status: 401 } };
      case 8: return { kind: 'signed-entry', method: 'GET', path: `/__collimate/signed?token=${r.pick(['x', t.signedClosedPath.split('/')[3], ''])}&next=${r.pick(['/', '//evil.example', 'https://evil.example', '/%0d%0aSet-Cookie:x'])}`, headers: { host: hostOf(t.sandbox, t.httpPort) }, expect: { status: 401 } };
      default: return { kind: 'service-worker', method: 'GET', path: keyed(t.httpPort, '/sw.js'), headers: { ...key, 'service-worker': 'script' }, expect: { status: 403, code: 'origin_forbidden' } };
    }
  }
  if (x < 0.75) {
    // Bad ports and paths.
    const port = r.pick(['0', '65536', '-1', 'abc', '1e3', '0x50', '99999', '%00', '8080%00', '']);
    if (r.chance(0.5)) return { kind: 'bad-port', method: 'GET', path: keyed(port), headers: key };
    const rest = r.pick(['/../../../etc/passwd', '/%2e%2e/%2e%2e/etc/passwd', '/a%00b', '/%ff%fe', '/' + 'x'.repeat(5000), '/?' + 'q=1&'.repeat(2000), '/index.html%00.png', '//etc/passwd', '/\\..\\..\\etc\\passwd']);
    return { kind: 'hostile:path', method: 'GET', path: keyed(t.httpPort, rest), headers: key, may502: true };
  }
  switch (r.int(6)) {
    case 0: return { kind: 'hostile:huge-headers', method: 'GET', path: keyed(t.httpPort), headers: { ...key, 'x-big': 'h'.repeat(r.pick([8_000, 20_000, 100_000])) }, mayReset: true, may502: true };
    case 1: return { ...timingHostile(r, 'hostile:timing', 'POST', keyed(t.httpPort, '/index.html'), { ...key, 'content-type': 'text/plain' }, Buffer.from('x'.repeat(200))), may502: true };
    case 2: {
      // WebSocket upgrades through the proxy: to httpd (no WebSocket there), a closed port, a foreign sandbox, with no key.
      const path = r.pick([keyed(t.httpPort), keyed(9), `/v1/sandboxes/${t.victimSandbox}/ports/${t.httpPort}/`, t.signedPath]);
      const headers: Record<string, string> = { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': randomBytes(16).toString('base64'), ...(r.chance(0.7) ? key : {}) };
      return { kind: 'hostile:upgrade', method: 'GET', path, headers: {}, ws: { headers, frames: [encodeFrame(Buffer.from('hi'), 0x1, true)], pauseMs: 20, listenMs: 100 }, may502: true, mayReset: true };
    }
    case 3: return { kind: 'hostile:upgrade-with-body', method: 'RAW', path: '', headers: {}, raw: Buffer.from(`POST ${keyed(t.httpPort)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t.keys.main}\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 5\r\n\r\nhello`, 'latin1'), mayReset: true };
    case 4: return { kind: 'hostile:malformed-http', method: 'RAW', path: '', headers: {}, raw: malformedHttp(r, keyed(t.httpPort), `Authorization: Bearer ${t.keys.main}\r\n`) };
    default: return { kind: 'hostile:abort-get', method: 'GET', path: keyed(t.httpPort), headers: key, abortStream: true, may502: true };
  }
};

const GENERATORS: Record<Exclude<DoorName, 'rest'>, Generator> & { rest: Generator } = {
  rest: () => { throw new Error('the REST door runs fuzzHarness.ts'); },
  mcp: mcpGenerator,
  e2b: e2bGenerator,
  envd: envdGenerator,
  terminal: terminalGenerator,
  ports: portsGenerator,
};

/** One line per door: counts by status, 5xx, RSS. */
export function doorReport(s: DoorStats): string {
  return `door ${s.door}: ${s.sent} requests in ${(s.ms / 1000).toFixed(1)} s; statuses ${JSON.stringify(s.byStatus)}; 5xx ${JSON.stringify(s.fiveHundreds)}; rss start ${s.rss.startMiB} peak ${s.rss.peakMiB} end ${s.rss.endMiB} MiB; failures ${s.failures.length}`;
}
