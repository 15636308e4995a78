/**
 * Fuzzing at volume against a real engine (issue 19 item 4), shared by test/integration/fuzz.test.ts
 * (the short form `npm test` runs) and bench/fuzz.ts (the long form).
 *
 * A seeded generator walks the route table (src/api/routes.ts) and sends, over real sockets to a
 * real server on a real engine: valid requests (execs, file writes and reads, forks, suspends,
 * resumes, deletes, creates, snapshots taken, started from, rolled back to, promoted and deleted — a
 * small share, so that it runs in minutes under TCG), invalid ones
 * (wrong types, missing and unknown fields, out-of-range numbers, unknown and foreign ids, wrong
 * methods, bad keys) and hostile ones (bodies over the limit, JSON nested thousands deep, invalid
 * UTF-8, path traversal and NUL bytes in guest paths, huge headers, slow and stalling clients,
 * bodies and exec streams aborted by the client, malformed HTTP).
 *
 * Every answer is judged as it arrives: no 5xx but the documented 502/503 codes (and a 502 only
 * where the request could meet a VMM fault), every error has the standard body with a code the
 * route documents, every success matches its schema (checkResponse, the OpenAPI contract), a
 * valid request succeeds, and no answer carries a secret of the host. The first failure throws
 * with the seed, the lane and the request, so `FUZZ_SEED=<seed>` replays the same sequence.
 *
 * Lanes run concurrently; each has its own generator (seed + lane) and its own sandboxes, so a
 * lane's sequence of requests does not depend on the others' timing.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { request as httpRequest, Agent, type IncomingHttpHeaders } from 'node:http';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type { z } from 'zod';
import { ERROR_CODES, type ErrorCode } from '../../src/errors.ts';
import { ROUTES, matchPath, type RouteSpec } from '../../src/api/routes.ts';
import { checkResponse } from '../unit/api/helpers.ts';
import { rng, type Rng } from '../support/rng.ts';
import { join } from 'node:path';
import type { Engine, EngineOptions } from '../../src/sandboxes/engine.ts';
import { ImageService } from '../../src/images/service.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, type Served } from './fixture.ts';

// ---- requests and answers ---------------------------------------------------------------------

export interface FuzzRequest {
  /** What the generator meant (for the report and failure messages). */
  kind: string;
  method: string;
  /** Path and query, already percent-encoded (raw requests carry their own bytes). */
  path: string;
  headers: Record<string, string>;
  body?: Buffer;
  /** Write the body this many bytes at a time with this delay between writes (a slow client). */
  slow?: { chunk: number; delayMs: number };
  /** Write this many bytes of the body, pause, then destroy the connection (no answer expected). */
  abortAfter?: { bytes: number; pauseMs: number };
  /** Write this many bytes of the body and wait, never sending the rest: the server must give up, answer and close. */
  stallAfter?: number;
  /** Bytes sent as they are on a fresh connection (malformed HTTP, raw bytes in the request line). */
  raw?: Buffer;
  /** Read the first SSE event, then close the connection (an aborted exec stream). */
  abortStream?: boolean;
  /** A valid request: it must succeed with one of these statuses. */
  ok?: number[];
  /** The server may close the connection while the client still writes (a body or headers over a limit). */
  mayReset?: boolean;
  /** A 502 is possible (the request reaches a sandbox port or a VMM the generator may have broken). */
  may502?: boolean;
  /** Statuses/codes this request must get instead (e.g. 404 for a foreign id). */
  expect?: { status?: number; code?: ErrorCode };
}

export interface FuzzAnswer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
  text: string;
  json(): any;
  /** A slow client's: how long its body took to send, first write to end (the event loop it shares with the server may stretch its pauses). */
  sendMs?: number;
}

/**
 * A slow body designed to take at most ~1 s; one that took longer than this (a loaded host stalling
 * the event loop the client shares with the server) may meet the server's 3 s request deadline,
 * and its 400 saying so is then the right answer.
 */
const SLOW_SEND_GRACE_MS = 1500;

const SECONDS = 1000;
/** The run stops after this many broken rules (FUZZ_MAX_FAILURES), so that one run reports several findings. */
const MAX_FAILURES = Number(process.env.FUZZ_MAX_FAILURES ?? 20);

function answer(status: number, headers: IncomingHttpHeaders, body: Buffer): FuzzAnswer {
  const text = body.toString('utf8');
  return { status, headers, body, text, json: () => JSON.parse(text) };
}

/** One request on `agent` (or a fresh connection), honouring the slow/abort shapes. */
export function send(base: URL, agent: Agent | false, r: FuzzRequest, timeoutMs = 120 * SECONDS): Promise<FuzzAnswer | null> {
  if (r.raw) return sendRaw(base, r.raw, timeoutMs);
  return new Promise((resolve, reject) => {
    const headers = { ...r.headers };
    if (r.body && !r.slow && !('transfer-encoding' in headers)) headers['content-length'] ??= String(r.body.length);
    let early: FuzzAnswer | null = null;
    let sendMs: number | undefined;
    const started = performance.now();
    const req = httpRequest({ host: base.hostname, port: base.port, method: r.method, path: r.path, headers, agent: r.abortAfter || r.abortStream || r.slow || r.stallAfter !== undefined ? false : agent });
    const timer = setTimeout(() => { req.destroy(); reject(new Error(`no answer within ${timeoutMs} ms`)); }, timeoutMs);
    req.on('error', (e) => {
      clearTimeout(timer);
      // The client destroyed it on purpose, or the server answered early (e.g. 413) and closed while we still wrote.
      if (r.abortAfter || r.abortStream) resolve(null);
      else if ((e as NodeJS.ErrnoException).code === 'EPIPE' || (e as NodeJS.ErrnoException).code === 'ECONNRESET') resolve(early ?? null);
      else reject(e);
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      if (r.abortStream) {
        res.once('data', (c: Buffer) => { clearTimeout(timer); res.destroy(); req.destroy(); resolve(answer(res.statusCode!, res.headers, c)); });
        res.once('end', () => { clearTimeout(timer); resolve(answer(res.statusCode!, res.headers, Buffer.concat(chunks))); });
        return;
      }
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        clearTimeout(timer);
        early = answer(res.statusCode!, res.headers, Buffer.concat(chunks));
        // Still sending when the answer came: as long as it has taken so far.
        if (r.slow) early.sendMs = sendMs ?? performance.now() - started;
        resolve(early);
      });
      res.on('error', (e) => { clearTimeout(timer); reject(e); });
    });
    void (async () => {
      const body = r.body ?? Buffer.alloc(0);
      try {
        if (r.abortAfter) {
          req.write(body.subarray(0, r.abortAfter.bytes));
          await sleep(r.abortAfter.pauseMs);
          req.destroy();
          clearTimeout(timer);
          resolve(null);
          return;
        }
        if (r.stallAfter !== undefined) {
          req.write(body.subarray(0, r.stallAfter));
          return;
        }
        if (r.slow) {
          for (let i = 0; i < body.length; i += r.slow.chunk) {
            if (req.destroyed) return;
            req.write(body.subarray(i, i + r.slow.chunk));
            await sleep(r.slow.delayMs);
          }
          req.end();
          sendMs = performance.now() - started;
          return;
        }
        req.end(body.length ? body : undefined);
      } catch (e) {
        reject(e);
      }
    })();
  });
}

/** Raw bytes on a fresh connection; the answer is parsed by hand (status, headers, body). */
function sendRaw(base: URL, bytes: Buffer, timeoutMs: number): Promise<FuzzAnswer | null> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    const s = connect(Number(base.port), base.hostname, () => s.write(bytes));
    const done = () => {
      clearTimeout(timer);
      s.destroy();
      const all = Buffer.concat(chunks);
      const end = all.indexOf('\r\n\r\n');
      if (end < 0) return resolve(null);
      const head = all.subarray(0, end).toString('latin1').split('\r\n');
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head[0])?.[1] ?? 0);
      const headers: IncomingHttpHeaders = {};
      for (const l of head.slice(1)) {
        const i = l.indexOf(':');
        if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
      }
      let body = all.subarray(end + 4);
      if (/chunked/i.test(String(headers['transfer-encoding'] ?? ''))) {
        const parts: Buffer[] = [];
        let at = 0;
        for (;;) {
          const nl = body.indexOf('\r\n', at);
          if (nl < 0) break;
          const n = parseInt(body.subarray(at, nl).toString('latin1'), 16);
          if (!(n > 0)) break;
          parts.push(body.subarray(nl + 2, nl + 2 + n));
          at = nl + 2 + n + 2;
        }
        body = Buffer.concat(parts);
      } else if (headers['content-length'] !== undefined) {
        body = body.subarray(0, Number(headers['content-length']));
      }
      resolve(status ? answer(status, headers, body) : null);
    };
    const timer = setTimeout(done, timeoutMs);
    s.on('data', (d) => chunks.push(d));
    s.on('end', done);
    s.on('error', done);
    s.on('close', done);
  });
}

// ---- what the route table says -----------------------------------------------------------------

/** Codes any route may answer besides its own (validation, auth, limits, shutdown). */
const GENERIC_CODES: readonly ErrorCode[] = ['validation_error', 'invalid_json', 'unauthorized', 'payload_too_large', 'unsupported_media_type', 'shutting_down'];
/** What a 502 or 503 may be: a VMM, agent or port fault; capacity or shutdown. */
const DOCUMENTED_5XX: Readonly<Record<number, readonly ErrorCode[]>> = {
  502: ['agent_unavailable', 'vmm_failed', 'port_unreachable', 'image_pull_failed'],
  503: ['host_at_capacity', 'shutting_down', 'template_not_ready'],
  507: [],
};

/** The route a method and path reach, the way the server's router would (ANY routes for every method). */
export function routeFor(method: string, pathAndQuery: string): RouteSpec | null {
  const path = pathAndQuery.split('?')[0];
  const m = method === 'HEAD' ? 'GET' : method;
  return ROUTES.find((r) => (r.method === m || r.method === 'ANY') && matchPath(r.path, path)) ?? null;
}

function bodyFields(route: RouteSpec): string[] {
  const shape = (route.body as unknown as { shape?: Record<string, z.ZodType> } | undefined)?.shape;
  return shape ? Object.keys(shape) : [];
}

// ---- the harness ----------------------------------------------------------------------------------

export interface FuzzTarget {
  base: URL;
  /** Keys: the fuzzing tenant (enterprise), a demo tenant, and the victim whose sandbox must stay untouched. */
  keys: { main: string; demo: string; victim: string };
  victimSandbox: string;
}

export interface FuzzOptions {
  seed: number;
  requests: number;
  lanes?: number;
  /** Written to for progress (one line per 1,000 requests). */
  log?: (line: string) => void;
  /** Strings that live only on the host (the server's environment, its /etc/shadow): no answer may contain one. */
  hostSecrets?: string[];
  /** Prefix of host paths a write that escaped the guest would create (the caller checks they do not exist). */
  escapeMarker: string;
}

export interface FuzzStats {
  sent: number;
  byKind: Record<string, number>;
  byStatus: Record<number, number>;
  codes: Record<string, number>;
  fiveHundreds: Array<{ status: number; code: string; kind: string }>;
  /** Answers that broke a rule, with the request (the run stops after MAX_FAILURES). */
  failures: string[];
  /** Sandboxes the lanes hold at the end (each answered an exec). */
  live: string[];
  ms: number;
}

/** A snapshot id of the right shape that no tenant has. */
const NO_SNAPSHOT = 'snap_0000000000000000';

export const WEIRD = ['', ' ', 'a', 'base', 'nope', '../../etc/passwd', '\u0000', '\u202e', '😀', 'x'.repeat(300), '%', 'null', '0', '-1', '1e309', 'sbx_0123456789ab', 'echo hi', '\ud800', '/tmp/a\u0000b'];
const NUMBERS = [0, -1, 1.5, 65, 65536, 1e9, -0, 2 ** 53, 1e308, 3601];

/** A value of the wrong kind for nearly anything (never valid where an object or a bounded number is). */
export function wrongValue(r: Rng, depth = 0): unknown {
  switch (r.int(depth > 1 ? 5 : 7)) {
    case 0: return r.pick(WEIRD);
    case 1: return r.pick(NUMBERS);
    case 2: return r.chance(0.5);
    case 3: return null;
    case 4: return r.pick(WEIRD) + r.int(1000);
    case 5: return Array.from({ length: r.int(4) }, () => wrongValue(r, depth + 1));
    default: return Object.fromEntries(Array.from({ length: 1 + r.int(3) }, () => [r.pick(['a', 'zz', '__proto__', 'constructor', 'path', 'pid', r.pick(WEIRD)]), wrongValue(r, depth + 1)]));
  }
}

/** A valid body per operation: the starting point of every mutation. Never anything that leaves loopback. */
function sampleBody(op: string, r: Rng): Record<string, unknown> | undefined {
  switch (op) {
    // From a snapshot no tenant has (a mutation that stays valid is a 404, never a start).
    case 'createSandbox': return r.chance(0.7) ? { template: 'base', labels: { fuzz: 'yes' } } : { snapshot: NO_SNAPSHOT, count: 1 + r.int(3), labels: { fuzz: 'yes' } };
    case 'createSnapshot': return { name: 'fuzz', labels: { fuzz: 'yes' } };
    case 'promoteSnapshot': return { environment: r.pick(['fuzz-snap', null]) };
    case 'restoreSandbox': return { snapshot: NO_SNAPSHOT };
    case 'execSandbox': return { command: 'true', timeout: 5 };
    case 'forkSandbox': return { count: 1 };
    case 'suspendSandbox': case 'resumeSandbox': return {};
    case 'createPortUrl': return { port: 1 + r.int(65535) };
    case 'createImage': return { source: r.pick([{ kind: 'registry', ref: '127.0.0.1:9/fuzz/none:1' }, { kind: 'oci-layout', path: '/../../../etc' }, { kind: 'archive', path: '/proc/self/environ' }]) };
    case 'createEnvironment': return { name: 'fuzz-env', image: 'sha256:' + '0'.repeat(64) };
    default: return undefined;
  }
}

/**
 * A body that the route's schema must refuse: the sample with one or more invalidating mutations —
 * an unknown field, a field of the wrong type, or not an object at all — and perhaps a field removed.
 */
function invalidBody(route: RouteSpec, r: Rng): unknown {
  const fields = bodyFields(route);
  const b: Record<string, unknown> = { ...(sampleBody(route.operationId, r) ?? {}) };
  if (r.chance(0.3) && Object.keys(b).length) delete b[r.pick(Object.keys(b))];
  switch (r.int(4)) {
    case 0: Object.defineProperty(b, r.pick(['extra', 'TEMPLATE', 'Command', 'x', '__proto__', 'prototype']), { value: wrongValue(r), enumerable: true }); return b;
    case 1: if (fields.length) { b[r.pick(fields)] = r.pick([{ a: { b: 1 } }, [[1]], -1, 1e309, 'x'.repeat(5000), true, ['x'], -3601]); return { ...b, ...(r.chance(0.5) ? { zzz: 1 } : {}) }; } return [b];
    case 2: return r.pick([[], 'string', 42, true, [b]]);
    default: return { ...b, [r.pick(['bogus', 'extra_field', 'count_', 'labelz'])]: wrongValue(r) };
  }
}

/** Deeply nested JSON, as bytes (built without recursion). */
function deepJson(r: Rng): Buffer {
  const depth = r.pick([1_000, 10_000, 100_000]);
  switch (r.int(4)) {
    case 0: return Buffer.from('['.repeat(depth) + ']'.repeat(depth));
    case 1: return Buffer.from('{"a":'.repeat(depth) + '1' + '}'.repeat(depth));
    case 2: return Buffer.from('{"command":"true","env":' + '{"a":'.repeat(depth) + '"x"' + '}'.repeat(depth) + '}');
    default: return Buffer.from('{"labels":' + '['.repeat(depth) + ']'.repeat(depth) + ',"template":"base"}');
  }
}

/** JSON bodies whose bytes are not valid UTF-8 (lone continuation bytes, overlongs, surrogates, truncated sequences). */
function badUtf8Json(r: Rng): Buffer {
  const bad = r.pick([[0xff], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xe2, 0x82], [0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xfe, 0xff]]);
  const parts = r.pick([['{"command":"echo ', '"}'], ['{"template":"', '"}'], ['{"', '":1}'], ['', '{}'], ['{"port":80', '}']]);
  return Buffer.concat([Buffer.from(parts[0]), Buffer.from(bad), Buffer.from(parts[1])]);
}

/** Guest paths meant to get out of the guest or at things it should not hand out. */
const HOSTILE_READS = [
  '/../../../../etc/shadow', '/etc/shadow', '/proc/self/environ', '/proc/1/environ', '/proc/1/maps', '/proc/self/mem', '/proc/kcore',
  '/proc/sysrq-trigger', '/sys/kernel/notes', '/dev/zero', '/dev/urandom', '/', '/proc', '/etc/../../..', '/root/../../../proc/cpuinfo',
  '/nonexistent/../../etc/hostname', '/tmp/a\u0000b', '/etc/passwd\u0000.png', '/' + 'a'.repeat(300), '/' + 'a/'.repeat(3000), '/dev/vda',
];
const HOSTILE_WRITES = [
  '/dev/full', '/dev/null', '/proc/self/mem', '/proc/1/status', '/sys/kernel/notes', '/', '/etc', '/nonexistent-dir/x', '/tmp/x\u0000y',
  '/' + 'b'.repeat(300), '/tmp/' + 'c/'.repeat(3000) + 'f', '/proc/self/fd/0',
];

interface Lane {
  id: number;
  r: Rng;
  /** A long-lived running sandbox every exec and file request of this lane goes to. */
  main: string;
  /** A sandbox this lane suspends, resumes, deletes and creates again (null while deleted). */
  spare: string | null;
  spareState: 'running' | 'suspended';
  /** Paths this lane wrote, with their content, to read back. */
  written: Map<string, Buffer>;
}

export async function runFuzz(t: FuzzTarget, opts: FuzzOptions): Promise<FuzzStats> {
  const started = Date.now();
  const lanesN = opts.lanes ?? 4;
  const agent = new Agent({ keepAlive: true, maxSockets: lanesN * 2 });
  const stats: FuzzStats = { sent: 0, byKind: {}, byStatus: {}, codes: {}, fiveHundreds: [], failures: [], live: [], ms: 0 };
  const log = opts.log ?? (() => {});
  const auth = (key: string) => ({ authorization: `Bearer ${key}` });
  const json = (v: unknown) => Buffer.from(JSON.stringify(v));
  const jsonHeaders = (key: string) => ({ ...auth(key), 'content-type': 'application/json' });
  let failed = false;

  /** Sends one request and judges its answer; throws with everything needed to replay it. */
  const exchange = async (lane: Lane | null, n: number, req: FuzzRequest): Promise<FuzzAnswer | null> => {
    stats.sent++;
    stats.byKind[req.kind] = (stats.byKind[req.kind] ?? 0) + 1;
    if (stats.sent % 1000 === 0) log(`fuzz: ${stats.sent} requests, ${((Date.now() - started) / 1000).toFixed(0)} s`);
    const where = `seed=${opts.seed} lane=${lane?.id ?? '-'} #${n} ${req.kind}: ${req.method} ${req.path.slice(0, 160)}${req.body ? ` body=${JSON.stringify(req.body.subarray(0, 200).toString('latin1'))}${req.body.length > 200 ? `…(${req.body.length} bytes)` : ''}` : ''}`;
    let res: FuzzAnswer | null;
    try {
      res = await send(t.base, agent, req);
    } catch (e) {
      throw new Error(`${where}\n→ no answer: ${(e as Error).message}`);
    }
    if (!res) {
      // Only requests the client itself cut short, or malformed HTTP the server may just close, go unanswered.
      if (req.abortAfter || req.abortStream || req.raw || req.mayReset) return null;
      throw new Error(`${where}\n→ connection closed without an answer`);
    }
    stats.byStatus[res.status] = (stats.byStatus[res.status] ?? 0) + 1;
    const context = `${where}\n→ ${res.status} ${res.text.slice(0, 400)}`;
    try {
      judge(req, res);
    } catch (e) {
      // Keep going for a while: one run shows several findings, not just the first.
      stats.failures.push(`${context}\n${(e as Error).message}`);
      if (stats.failures.length >= MAX_FAILURES) failed = true;
    }
    return res;
  };

  const judge = (req: FuzzRequest, res: FuzzAnswer): void => {
    const isHead = req.method === 'HEAD';
    const route = req.raw ? null : routeFor(req.method, req.path);
    let code: string | undefined;
    if (res.status >= 400 && !isHead) {
      // The ports proxy streams a sandbox server's own errors; its own carry X-Collimate-Error.
      const proxied = route?.method === 'ANY' && res.headers['x-collimate-error'] === undefined;
      if (!proxied) {
        assert.match(String(res.headers['content-type']), /^application\/json/, 'an error without a JSON body');
        code = res.json()?.error?.code;
        assert.equal(typeof code, 'string', 'an error without a code');
        stats.codes[code!] = (stats.codes[code!] ?? 0) + 1;
        assert.ok(code! in ERROR_CODES, `unknown error code ${code}`);
        assert.equal(ERROR_CODES[code as ErrorCode], res.status, `code ${code} sent with status ${res.status}`);
      }
    }
    if (res.status >= 500) {
      stats.fiveHundreds.push({ status: res.status, code: code ?? '', kind: req.kind });
      assert.ok(res.status in DOCUMENTED_5XX && DOCUMENTED_5XX[res.status].includes(code as ErrorCode), `undocumented ${res.status} ${code}`);
      if (res.status === 502) assert.ok(req.may502, `a VMM or agent fault (${code}) where nothing should have broken one`);
    }
    if (req.expect?.status !== undefined) assert.equal(res.status, req.expect.status, `expected ${req.expect.status}`);
    if (req.expect?.code !== undefined) assert.equal(code, req.expect.code, `expected ${req.expect.code}`);
    // A slow client stalled past its design by the shared event loop: the deadline's 400 is right.
    const deadlineMet = req.slow && (res.sendMs ?? 0) > SLOW_SEND_GRACE_MS && res.status === 400 && code === 'validation_error' && /did not arrive whole/.test(res.text);
    if (deadlineMet) stats.codes['slow_client_past_deadline'] = (stats.codes['slow_client_past_deadline'] ?? 0) + 1;
    if (req.ok && !deadlineMet && !(res.status >= 500 && res.status !== 500)) assert.ok(req.ok.includes(res.status), `a valid request failed (expected ${req.ok.join('/')}${res.sendMs !== undefined ? `; its body took ${Math.round(res.sendMs)} ms to send` : ''})`);
    for (const secret of opts.hostSecrets ?? []) assert.ok(!res.body.includes(secret), 'an answer carries a secret of the host');
    if (isHead) return;
    if (res.status === 400 && req.raw) {
      // Malformed HTTP is answered by the server's clientErrorHandler, before any route.
      assert.equal(code, 'validation_error');
      return;
    }
    if (route) {
      // Its own code, or one any route may answer; the router's answers for paths no route matches.
      if (code && route.method !== 'ANY') {
        const documented = new Set<string>([...route.errors, ...GENERIC_CODES, ...(route.params?.id === 'sandbox' ? ['sandbox_not_found'] : [])]);
        assert.ok(documented.has(code), `${route.operationId} answered ${code}, which its route does not document`);
      }
      if (route.method !== 'ANY' || res.headers['x-collimate-error'] !== undefined) {
        const h: Record<string, string> = {};
        for (const [k, v] of Object.entries(res.headers)) h[k] = String(v);
        checkResponse(route.method === 'ANY' ? null : route.operationId, { statusCode: res.status, headers: h, body: res.text, json: () => JSON.parse(res.text) } as any, true);
      }
    } else if (code) {
      assert.ok(['not_found', 'method_not_allowed', 'validation_error', 'payload_too_large', 'unauthorized', 'unsupported_media_type', 'invalid_json', 'shutting_down'].includes(code), `${code} for a path no route matches`);
    }
  };

  // ---- generators ------------------------------------------------------------------------------

  const foreignIds = () => [t.victimSandbox, 'sbx_000000000000', 'sbx_ffffffffffff'];
  const garbageIds = ['nope', '..', '%2e%2e', 'sbx_' + 'f'.repeat(12) + 'x', '%00', '%ff%fe', 'x'.repeat(900), 'SBX_0123456789AB', '%E0%A4%A', encodeURIComponent('😀'), '%252e%252e'];

  const fillPath = (route: RouteSpec, lane: Lane, own: boolean): string => {
    const r = lane.r;
    return route.path
      .replace(/:(\w+)/g, (_, name: string) => {
        switch (route.params?.[name]) {
          case 'sandbox': return own ? lane.main : r.pick([...foreignIds(), ...garbageIds]);
          case 'template': return r.pick(['base', 'nope', 'python', '..', '%00', 'x'.repeat(200), 'a:b', '%ff']);
          case 'snapshot': return r.pick([NO_SNAPSHOT, 'snap_ffffffffffffffff', 'snap_0', 'SNAP_0123456789ABCDEF', 'nope', '..', '%2e%2e', '%00', '%ff%fe', 'x'.repeat(300), lane.main]);
          case 'image': return r.pick(['sha256:' + '0'.repeat(64), 'nope', '..%2f..', '%00']);
          case 'environment': return r.pick(['fuzz-env', 'nope', 'UPPER', '..', '%00', 'x'.repeat(100)]);
          case 'port': return String(r.pick([0, 1, 22, 80, 8080, 65535, 65536, -1, 'abc', '1e3', '0x50']));
          case 'token': return r.pick(['x', 'a.b', 'a'.repeat(400), '..', '%00', 'eyJ.eyJ.sig']);
          case 'pid': return String(r.pick([1, 2, 999999, 0, -1, 'abc', '1e3', 'x'.repeat(20), '%00']));
          default: return 'x';
        }
      })
      .replace(/\*$/, () => r.pick(['', 'index.html', '../../etc/passwd', '%2e%2e/%2e%2e', 'a/b?c=d', 'x'.repeat(500)]));
  };

  const fuzzQuery = (route: RouteSpec, r: Rng, valid?: Record<string, string>): string => {
    const q = new URLSearchParams(valid);
    const names = route.query ? Object.keys(route.query.shape) : [];
    for (let j = r.int(3); j > 0; j--) {
      const name = names.length && r.chance(0.7) ? r.pick(names) : r.pick(['x', 'limit', 'label', 'path', 'state', '__proto__', 'from']);
      const v = r.chance(0.5) ? r.pick(WEIRD) : String(r.pick([...NUMBERS, 'running', 'k=v', '=v', 'k=', '2026-01-01T00:00:00Z', '99999999999999999']));
      if (r.chance(0.5)) q.append(name, v); else q.set(name, v);
    }
    const s = q.toString();
    return s ? `?${s}${r.chance(0.05) ? '&&=%' : ''}` : r.chance(0.05) ? '?%zz=%' : '';
  };

  /** Invalid requests derived from one route of the table. */
  const invalidFromRoute = (lane: Lane): FuzzRequest => {
    const r = lane.r;
    const route = r.pick(ROUTES);
    // Own sandboxes only where a mistake cannot change their state (the lanes manage that part).
    const own = route.params?.id === 'sandbox' && ['GET', 'ANY'].includes(route.method) || ['execSandbox', 'writeFile', 'createPortUrl'].includes(route.operationId);
    let path = fillPath(route, lane, own && r.chance(0.6));
    const headers: Record<string, string> = {};
    const authKind = r.int(12);
    if (authKind < 8) headers.authorization = `Bearer ${r.pick([t.keys.main, t.keys.main, t.keys.demo])}`;
    else if (authKind === 8) headers.authorization = r.pick(['Bearer', 'Bearer clm_x', 'Basic YTpi', `Bearer ${t.keys.main}x`, `Bearer clm_${'z'.repeat(40)}`, `bearer  ${t.keys.main}  `, `Bearer ${t.keys.main} extra`]);
    else if (authKind === 9) headers['x-api-key'] = t.keys.main;
    let method: string = route.method === 'ANY' ? r.pick(['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) : route.method;
    let kind = `invalid:${route.operationId}`;
    if (r.chance(0.12)) {
      // A method the path does not have.
      const allowed = ROUTES.filter((x) => matchPath(x.path, path.split('?')[0])).map((x) => x.method);
      if (!allowed.includes('ANY')) {
        method = r.pick(['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'PROPFIND'].filter((m) => !allowed.includes(m as never)));
        kind = `wrong-method:${route.operationId}`;
      }
    }
    path += fuzzQuery(route, r, route.query?.shape && 'path' in route.query.shape ? { path: r.pick(['/tmp/fuzz', '/etc/hostname', 'relative', '/missing']) } : undefined);
    if (r.chance(0.2)) headers.accept = r.pick(['text/event-stream', 'application/json', '*/*', 'text/html', '']);
    if (r.chance(0.15)) headers['idempotency-key'] = r.pick(['k1', 'k2', 'x'.repeat(300), ' ', 'é']);
    let body: Buffer | undefined;
    if (method !== 'GET' && method !== 'HEAD' && method !== 'DELETE' || r.chance(0.1)) {
      if (route.bodyKind === 'raw') body = r.chance(0.5) ? randomBytesFrom(r, r.int(2000)) : Buffer.from(JSON.stringify(wrongValue(r)));
      else {
        const v = r.chance(0.85) ? invalidBody(route, r) : undefined;
        body = v === undefined ? Buffer.from(r.pick(['{"template": ', '{bad json}', '', '   ', 'null', '{}trailing', '\ufeff{}'])) : Buffer.from(JSON.stringify(v));
      }
      if (r.chance(0.9)) headers['content-type'] = r.chance(0.8) ? 'application/json' : r.pick(['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/json; charset=latin1', 'application/merge-patch+json', 'application/octet-stream']);
    }
    const may502 = route.method === 'ANY' || route.operationId === 'createImage';
    // The event stream never ends by itself: read its first bytes, then hang up.
    if (route.operationId === 'streamEvents') return { kind, method, path, headers, body, may502, abortStream: true };
    return { kind, method, path, headers, body, may502 };
  };

  /** Hostile requests: oversized, deep, badly encoded, traversing, huge-headed, slow, aborted, malformed. */
  const hostile = (lane: Lane, n: number): FuzzRequest => {
    const r = lane.r;
    const k = t.keys.main;
    const jsonRoutes = ROUTES.filter((x) => x.bodyKind === 'json');
    const jsonRoute = r.pick(jsonRoutes);
    // A well-formed path of a JSON route (so that the body is what gets judged), never one that runs
    // for real but an exec: other sandbox routes get the victim's id (404).
    const jsonPath = (route: RouteSpec) => route.path.replace(':id', route.operationId === 'execSandbox' ? lane.main : t.victimSandbox).replace(':name', 'fuzz-env').replace(':pid', '1').replace(':snapshot', NO_SNAPSHOT);
    switch (r.int(13)) {
      case 0: {
        // A body over the limit: JSON routes and file uploads.
        const raw = r.chance(0.5);
        return raw
          ? { kind: 'hostile:huge-file', method: 'PUT', path: `/v1/sandboxes/${lane.main}/files?path=/tmp/huge`, headers: auth(k), body: Buffer.alloc(HUGE_FILE, 0x61), expect: { status: 413, code: 'payload_too_large' }, mayReset: true }
          : { kind: 'hostile:huge-json', method: jsonRoute.method, path: jsonPath(jsonRoute), headers: jsonHeaders(k), body: Buffer.from(`{"labels":{"x":"${'y'.repeat(HUGE_JSON)}"}}`), expect: { status: 413, code: 'payload_too_large' }, mayReset: true };
      }
      case 1: return { kind: 'hostile:deep-json', method: jsonRoute.method, path: jsonPath(jsonRoute), headers: jsonHeaders(k), body: deepJson(r), may502: false };
      case 2: return { kind: 'hostile:bad-utf8', method: jsonRoute.method, path: jsonPath(jsonRoute), headers: jsonHeaders(k), body: badUtf8Json(r), expect: { status: 400, code: 'invalid_json' } };
      case 3: {
        const p = r.pick(HOSTILE_READS);
        return { kind: 'hostile:read-path', method: 'GET', path: `/v1/sandboxes/${lane.main}/files?path=${encodeURIComponent(p)}`, headers: auth(k) };
      }
      case 4: {
        // Writes through traversal must land in the guest: a marker the host must never see.
        const hostPath = `${opts.escapeMarker}-${lane.id}-${n}`;
        const p = r.chance(0.5) ? r.pick(HOSTILE_WRITES) : '/..'.repeat(1 + r.int(8)) + hostPath;
        const content = Buffer.from(`fuzz ${n}\n`);
        const req: FuzzRequest = { kind: 'hostile:write-path', method: 'PUT', path: `/v1/sandboxes/${lane.main}/files?path=${encodeURIComponent(p)}`, headers: auth(k), body: content };
        if (p.endsWith(hostPath)) { req.ok = [200]; lane.written.set(hostPath, content); }
        return req;
      }
      case 5: {
        // Exec files and cwd with traversal and NUL bytes.
        const path = r.pick(['/../../../../tmp/exec-escape', '/tmp/a\u0000b', 'relative', '/proc/self/mem', '/dev/full']);
        const body = r.chance(0.5)
          ? { command: 'cat /tmp/exec-escape 2>/dev/null; true', files: [{ path, content: 'x' }], timeout: 10 }
          : { command: 'pwd', cwd: r.pick(['/tmp\u0000/x', '/../../..', '/nonexistent', 'relative', '/proc/1/root']), timeout: 10 };
        return { kind: 'hostile:exec-paths', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: jsonHeaders(k), body: json(body) };
      }
      case 6: {
        // Huge headers: one over Node's 16 KiB header limit, or many, or a huge key.
        const which = r.int(3);
        const headers: Record<string, string> = { ...auth(k) };
        if (which === 0) headers['x-fuzz'] = 'a'.repeat(20_000 + r.int(50_000));
        else if (which === 1) for (let i = 0; i < 150; i++) headers[`x-fuzz-${i}`] = 'v'.repeat(90);
        else headers.authorization = `Bearer ${'k'.repeat(15_000)}`;
        return { kind: 'hostile:huge-headers', method: 'GET', path: '/v1/sandboxes', headers, mayReset: true };
      }
      case 7: {
        // A slow client: the body a few bytes at a time (sometimes chunked).
        const body = json(r.chance(0.5) ? { command: 'echo slow', timeout: 5 } : { port: 8080 });
        const headers: Record<string, string> = { ...jsonHeaders(k), ...(r.chance(0.5) ? {} : { 'content-length': String(body.length) }) };
        const target = body.includes('command') ? `/v1/sandboxes/${lane.main}/exec` : `/v1/sandboxes/${lane.main}/port-urls`;
        return { kind: 'hostile:slow-body', method: 'POST', path: target, headers, body, slow: { chunk: 1 + r.int(4), delayMs: 5 + r.int(20) }, ok: [200, 201] };
      }
      case 8: {
        // A body cut off mid-way (declared length never arrives), after a stall.
        const file = r.chance(0.5);
        const body = file ? Buffer.alloc(64 * 1024, 0x62) : json({ command: 'echo never', timeout: 5 });
        const path = file ? `/v1/sandboxes/${lane.main}/files?path=/tmp/aborted` : `/v1/sandboxes/${lane.main}/exec`;
        if (r.chance(0.1)) {
          // Stalled for good: the server's request timeout answers it and closes the connection.
          return { kind: 'hostile:stall-body', method: file ? 'PUT' : 'POST', path, headers: { ...jsonHeaders(k), 'content-length': String(body.length) }, body, stallAfter: r.int(body.length - 1), expect: { status: 400, code: 'validation_error' }, mayReset: true };
        }
        return { kind: 'hostile:abort-body', method: file ? 'PUT' : 'POST', path, headers: { ...jsonHeaders(k), 'content-length': String(body.length) }, body, abortAfter: { bytes: r.int(body.length - 1), pauseMs: r.int(300) } };
      }
      case 9: {
        // Malformed HTTP: smuggling shapes, bad chunking, raw invalid UTF-8 and NULs in the request line and headers.
        const raws = [
          `POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n`,
          `POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nabc\r\n0\r\n\r\n`,
          `GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\nConnection: close\r\n\r\n`,
          `GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n`,
          `GET /v1/\xff\xfe/sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`,
          `GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xc0\xaf\r\nConnection: close\r\n\r\n`,
          `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\nConnection: close\r\n\r\n`,
          `GET /v1/sandboxes/${lane.main}/files?path=/etc/\xff\xfe HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${k}\r\nConnection: close\r\n\r\n`,
          `GET /../../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`,
          `GET http://evil.example/v1/sandboxes HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer ${k}\r\nConnection: close\r\n\r\n`,
          `GET /healthz HTTP/9.9\r\nHost: x\r\nConnection: close\r\n\r\n`,
          `\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03`,
        ];
        return { kind: 'hostile:malformed-http', method: 'RAW', path: '', headers: {}, raw: Buffer.from(r.pick(raws), 'latin1') };
      }
      case 10: {
        // An exec stream the client walks away from after its first event; the exec still runs out.
        const body = json({ command: 'for i in 1 2 3 4 5; do echo $i; sleep 0.1; done', timeout: 10 });
        return { kind: 'hostile:abort-stream', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: { ...jsonHeaders(k), accept: 'text/event-stream' }, body, abortStream: true };
      }
      case 11: {
        // A plain exec whose client gives up while it runs.
        const body = json({ command: 'sleep 0.3; echo late', timeout: 10 });
        return { kind: 'hostile:abort-exec', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: jsonHeaders(k), body, abortAfter: { bytes: body.length, pauseMs: 50 + r.int(200) } };
      }
      default: {
        // Percent-encoded invalid UTF-8 and NULs in paths and queries.
        const path = r.pick([
          `/v1/sandboxes/${lane.main}/files?path=%2Ftmp%2F%FF%FE`, `/v1/sandboxes/${lane.main}/files?path=%2Ftmp%2Fa%00b`, '/v1/templates/%C0%AF', '/v1/sandboxes?label=%FF%FE%3Dv',
          '/v1/sandboxes?state=%00', `/v1/sandboxes/${lane.main}%00`, '/v1/usage?from=%ED%A0%80', '/v1/environments/%F0%9F', `/v1/sandboxes/${lane.main}/files?path=%2F..%2F..%2Fetc%2Fshadow`,
        ]);
        return { kind: 'hostile:encoded-bytes', method: 'GET', path, headers: auth(k) };
      }
    }
  };

  /** Valid requests that need no VM work. */
  const validLight = (lane: Lane): FuzzRequest => {
    const r = lane.r;
    const k = t.keys.main;
    const choices: Array<() => FuzzRequest> = [
      () => ({ kind: 'valid:list', method: 'GET', path: r.pick(['/v1/sandboxes', '/v1/sandboxes?state=running', '/v1/sandboxes?limit=1', '/v1/sandboxes?label=fuzz%3Dyes']), headers: auth(k), ok: [200] }),
      () => ({ kind: 'valid:get', method: 'GET', path: `/v1/sandboxes/${lane.main}`, headers: auth(k), ok: [200] }),
      () => ({ kind: 'valid:templates', method: 'GET', path: r.pick(['/v1/templates', '/v1/templates/base', '/v1/images', '/v1/environments', '/v1/usage']), headers: auth(k), ok: [200] }),
      () => ({ kind: 'valid:ops', method: 'GET', path: r.pick(['/healthz', '/metrics', '/v1/openapi.json']), headers: {}, ok: [200] }),
      () => ({ kind: 'valid:port-url', method: 'POST', path: `/v1/sandboxes/${lane.main}/port-urls`, headers: jsonHeaders(k), body: json({ port: 1 + r.int(65535), expires_in_secs: 60 }), ok: [201] }),
      () => ({ kind: 'foreign', method: r.pick(['GET', 'DELETE']), path: `/v1/sandboxes/${t.victimSandbox}`, headers: auth(k), expect: { status: 404, code: 'sandbox_not_found' } }),
      () => {
        const [op, body] = r.pick([['exec', { command: 'true' }], ['fork', { count: 1 }], ['suspend', {}], ['resume', {}], ['port-urls', { port: 80 }]] as const);
        return { kind: 'foreign', method: 'POST', path: `/v1/sandboxes/${t.victimSandbox}/${op}`, headers: jsonHeaders(k), body: json(body), expect: { status: 404, code: 'sandbox_not_found' } };
      },
      () => ({ kind: 'no-key', method: 'GET', path: `/v1/sandboxes/${lane.main}`, headers: {}, expect: { status: 401, code: 'unauthorized' } }),
      () => ({ kind: 'valid:snapshots', method: 'GET', path: r.pick(['/v1/snapshots', '/v1/snapshots?limit=1', '/v1/snapshots?label=fuzz%3Dyes', `/v1/snapshots?sandbox_id=${lane.main}`, `/v1/snapshots?sandbox_id=${t.victimSandbox}`]), headers: auth(k), ok: [200] }),
      () => {
        // A snapshot no one has, by every route that names one: not found, nothing made.
        const [method, path, body] = r.pick<[string, string, unknown]>([
          ['GET', `/v1/snapshots/${NO_SNAPSHOT}`, undefined], ['DELETE', `/v1/snapshots/${NO_SNAPSHOT}`, undefined], ['POST', `/v1/snapshots/${NO_SNAPSHOT}/promote`, { environment: 'fuzz-snap' }],
          ['POST', '/v1/sandboxes', { snapshot: NO_SNAPSHOT, count: 2 }], ['POST', `/v1/sandboxes/${lane.main}/restore`, { snapshot: NO_SNAPSHOT }],
        ]);
        return { kind: 'snapshot-not-found', method, path, headers: body === undefined ? auth(k) : jsonHeaders(k), ...(body === undefined ? {} : { body: json(body) }), expect: { status: 404, code: 'snapshot_not_found' } };
      },
      // Each with a body its route takes, so the answer is about whose sandbox it is, not about the body.
      () => {
        const [op, body] = r.pick([['snapshots', r.chance(0.5) ? {} : { name: 'theirs' }], ['restore', { snapshot: NO_SNAPSHOT }]] as const);
        return { kind: 'foreign', method: 'POST', path: `/v1/sandboxes/${t.victimSandbox}/${op}`, headers: jsonHeaders(k), body: json(body), expect: { status: 404, code: 'sandbox_not_found' } };
      },
    ];
    return r.pick(choices)();
  };

  /** Valid requests that work a VM: execs, files, and now and then the spare's lifecycle or a fork. */
  const validVm = (lane: Lane): FuzzRequest | 'lifecycle' | 'fork' | 'snapshot' => {
    const r = lane.r;
    const k = t.keys.main;
    const x = r.next();
    if (x < 0.45) {
      const body = r.pick([
        { command: 'echo hi' }, { command: 'echo err >&2; exit 3' }, { commands: [['true'], ['false'], ['echo', 'no']] }, { command: 'cat', stdin: 'from stdin' },
        { command: 'head -c 300 /dev/urandom' }, { command: 'cat /tmp/fuzz-* 2>/dev/null | wc -c' }, { code: 'echo code' }, { command: 'env | grep -c FUZZ', env: { FUZZ: 'é\u202e' } },
      ]);
      return { kind: 'valid:exec', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: jsonHeaders(k), body: json({ ...body, timeout: 20 }), ok: [200] };
    }
    if (x < 0.55) return { kind: 'valid:exec-stream', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: { ...jsonHeaders(k), accept: 'text/event-stream' }, body: json({ command: 'echo a; echo b >&2', timeout: 20 }), ok: [200] };
    if (x < 0.75) {
      const path = `/tmp/fuzz-${lane.id}-${r.int(20)}`;
      const content = randomBytesFrom(r, r.int(4096));
      lane.written.set(path, content);
      return { kind: 'valid:write', method: 'PUT', path: `/v1/sandboxes/${lane.main}/files?path=${encodeURIComponent(path)}${r.chance(0.3) ? '&mode=600' : ''}`, headers: { ...auth(k), 'content-type': r.pick(['application/octet-stream', 'text/plain', 'application/json']) }, body: content, ok: [200] };
    }
    if (x < 0.93 && lane.written.size) {
      const [path] = r.pick([...lane.written.entries()]);
      return { kind: 'valid:read', method: 'GET', path: `/v1/sandboxes/${lane.main}/files?path=${encodeURIComponent(path)}`, headers: auth(k), ok: [200] };
    }
    return x < 0.96 ? 'lifecycle' : x < 0.985 ? 'snapshot' : 'fork';
  };

  // ---- the lanes ----------------------------------------------------------------------------------

  const create = async (lane: Lane, n: number): Promise<string> => {
    const res = (await exchange(lane, n, { kind: 'valid:create', method: 'POST', path: '/v1/sandboxes', headers: jsonHeaders(t.keys.main), body: json({ template: 'base', labels: { fuzz: 'yes', lane: String(lane.id) } }), ok: [201] }))!;
    return res.json().id;
  };

  /** The spare's next step: suspend, resume, delete or create it again. */
  const lifecycle = async (lane: Lane, n: number): Promise<void> => {
    const k = t.keys.main;
    if (lane.spare === null) {
      lane.spare = await create(lane, n);
      lane.spareState = 'running';
      return;
    }
    const id = lane.spare;
    const step = lane.r.int(3);
    if (step === 0) {
      await exchange(lane, n, { kind: 'valid:delete', method: 'DELETE', path: `/v1/sandboxes/${id}`, headers: auth(k), ok: [204] });
      lane.spare = null;
      await exchange(lane, n, { kind: 'deleted', method: 'GET', path: `/v1/sandboxes/${id}`, headers: auth(k), expect: { status: 404 } });
    } else if (lane.spareState === 'running') {
      // An exec first, so that the suspend has a process to keep.
      await exchange(lane, n, { kind: 'valid:exec', method: 'POST', path: `/v1/sandboxes/${id}/exec`, headers: jsonHeaders(k), body: json({ command: `echo ${n} > /root/n`, timeout: 20 }), ok: [200] });
      const res = await exchange(lane, n, { kind: 'valid:suspend', method: 'POST', path: `/v1/sandboxes/${id}/suspend`, headers: auth(k), ok: [200] });
      if (res?.status === 200) lane.spareState = 'suspended';
      await exchange(lane, n, { kind: 'suspended-exec', method: 'POST', path: `/v1/sandboxes/${id}/exec`, headers: jsonHeaders(k), body: json({ command: 'true' }), expect: { status: 409, code: 'invalid_state' } });
    } else {
      const res = await exchange(lane, n, { kind: 'valid:resume', method: 'POST', path: `/v1/sandboxes/${id}/resume`, headers: auth(k), ok: [200] });
      if (res?.status === 200) lane.spareState = 'running';
      await exchange(lane, n, { kind: 'valid:exec', method: 'POST', path: `/v1/sandboxes/${id}/exec`, headers: jsonHeaders(k), body: json({ command: 'cat /root/n' }), ok: [200] });
    }
  };

  /** A fork of 1–2 of the lane's main sandbox; each child answers an exec, then goes. */
  const fork = async (lane: Lane, n: number): Promise<void> => {
    const k = t.keys.main;
    const count = 1 + lane.r.int(2);
    const res = await exchange(lane, n, { kind: 'valid:fork', method: 'POST', path: `/v1/sandboxes/${lane.main}/fork`, headers: { ...jsonHeaders(k), 'idempotency-key': `fork-${opts.seed}-${lane.id}-${n}` }, body: json({ count }), ok: [201] });
    if (res?.status !== 201) return;
    for (const child of res.json().sandboxes as Array<{ id: string }>) {
      const ex = await exchange(lane, n, { kind: 'valid:exec', method: 'POST', path: `/v1/sandboxes/${child.id}/exec`, headers: jsonHeaders(k), body: json({ command: 'ls /tmp | grep -c fuzz; true' }), ok: [200] });
      assert.ok(ex && ex.json().exit_code === 0, `seed=${opts.seed} fork child ${child.id} did not run: ${ex?.text}`);
      await exchange(lane, n, { kind: 'valid:delete', method: 'DELETE', path: `/v1/sandboxes/${child.id}`, headers: auth(k), ok: [204] });
    }
    // The same key and body replays the answer; another body under it is refused.
    await exchange(lane, n, { kind: 'idempotent-replay', method: 'POST', path: `/v1/sandboxes/${lane.main}/fork`, headers: { ...jsonHeaders(k), 'idempotency-key': `fork-${opts.seed}-${lane.id}-${n}` }, body: json({ count: count === 1 ? 2 : 1 }), expect: { status: 422, code: 'idempotency_key_reused' } });
  };

  /**
   * A snapshot of the spare (running or suspended), 1–2 sandboxes started from it (each answers an
   * exec, then goes), the spare rolled back to it (it stays as it was: running or suspended), the
   * main sandbox refused a rollback to it, a promotion under a name and back; then it is deleted and
   * is gone by every route. Whatever fails on the way, the snapshot is deleted: a run leaves none.
   */
  const snapshotCycle = async (lane: Lane, n: number): Promise<void> => {
    const k = t.keys.main;
    if (lane.spare === null) return lifecycle(lane, n);
    const spare = lane.spare;
    const made = await exchange(lane, n, { kind: 'valid:snapshot', method: 'POST', path: `/v1/sandboxes/${spare}/snapshots`, headers: jsonHeaders(k), body: json({ name: `fuzz ${lane.id}-${n}`, labels: { fuzz: 'yes', lane: String(lane.id) } }), ok: [201] });
    if (made?.status !== 201) return;
    const snap = made.json().id as string;
    try {
      await exchange(lane, n, { kind: 'valid:get-snapshot', method: 'GET', path: `/v1/snapshots/${snap}`, headers: auth(k), ok: [200] });
      await exchange(lane, n, { kind: 'valid:snapshots', method: 'GET', path: `/v1/snapshots?sandbox_id=${spare}&label=lane%3D${lane.id}`, headers: auth(k), ok: [200] });
      const count = 1 + lane.r.int(2);
      const started = await exchange(lane, n, { kind: 'valid:from-snapshot', method: 'POST', path: '/v1/sandboxes', headers: jsonHeaders(k), body: json({ snapshot: snap, count, labels: { fuzz: 'yes' } }), ok: [201] });
      if (started?.status === 201) {
        for (const child of started.json().sandboxes as Array<{ id: string }>) {
          await exchange(lane, n, { kind: 'valid:exec', method: 'POST', path: `/v1/sandboxes/${child.id}/exec`, headers: jsonHeaders(k), body: json({ command: 'true' }), ok: [200] });
          await exchange(lane, n, { kind: 'valid:delete', method: 'DELETE', path: `/v1/sandboxes/${child.id}`, headers: auth(k), ok: [204] });
        }
      }
      await exchange(lane, n, { kind: 'valid:restore', method: 'POST', path: `/v1/sandboxes/${spare}/restore`, headers: jsonHeaders(k), body: json({ snapshot: snap }), ok: [200] });
      await exchange(lane, n, { kind: 'restore-mismatch', method: 'POST', path: `/v1/sandboxes/${lane.main}/restore`, headers: jsonHeaders(k), body: json({ snapshot: snap }), expect: { status: 409, code: 'snapshot_mismatch' } });
      const name = `fuzz-snap-${opts.seed.toString(36)}-${lane.id}-${n}`;
      await exchange(lane, n, { kind: 'valid:promote', method: 'POST', path: `/v1/snapshots/${snap}/promote`, headers: jsonHeaders(k), body: json({ environment: name }), ok: [200] });
      await exchange(lane, n, { kind: 'valid:promote', method: 'POST', path: `/v1/snapshots/${snap}/promote`, headers: jsonHeaders(k), body: json({ environment: null }), ok: [200] });
      await exchange(lane, n, { kind: 'foreign-snapshot', method: 'GET', path: `/v1/snapshots/${snap}`, headers: auth(t.keys.victim), expect: { status: 404, code: 'snapshot_not_found' } });
      await exchange(lane, n, { kind: 'foreign-snapshot', method: 'DELETE', path: `/v1/snapshots/${snap}`, headers: auth(t.keys.victim), expect: { status: 404, code: 'snapshot_not_found' } });
    } finally {
      await exchange(lane, n, { kind: 'valid:delete-snapshot', method: 'DELETE', path: `/v1/snapshots/${snap}`, headers: auth(k), ok: [204] });
    }
    await exchange(lane, n, { kind: 'deleted-snapshot', method: 'GET', path: `/v1/snapshots/${snap}`, headers: auth(k), expect: { status: 404, code: 'snapshot_not_found' } });
    await exchange(lane, n, { kind: 'deleted-snapshot', method: 'POST', path: '/v1/sandboxes', headers: jsonHeaders(k), body: json({ snapshot: snap }), expect: { status: 404, code: 'snapshot_not_found' } });
  };

  /** What the fuzz found once, asked every time on a real guest (each was a 502 or a silent change). */
  const regressions = (lane: Lane): FuzzRequest[] => {
    const k = t.keys.main;
    return [
      { kind: 'regression:cwd-nul', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: jsonHeaders(k), body: json({ command: 'pwd', cwd: '/tmp\u0000/x' }), expect: { status: 400, code: 'validation_error' } },
      { kind: 'regression:kcore', method: 'GET', path: `/v1/sandboxes/${lane.main}/files?path=%2Fproc%2Fkcore`, headers: auth(k), expect: { status: 413, code: 'payload_too_large' } },
      { kind: 'regression:bad-utf8', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: jsonHeaders(k), body: Buffer.from([...Buffer.from('{"command":"echo '), 0xff, ...Buffer.from('"}')]), expect: { status: 400, code: 'invalid_json' } },
      { kind: 'valid:exec', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: jsonHeaders(k), body: json({ command: 'echo still here' }), ok: [200] },
    ];
  };

  const runLane = async (lane: Lane, quota: number): Promise<void> => {
    lane.main = await create(lane, 0);
    lane.spare = await create(lane, 0);
    if (lane.id === 0) for (const req of regressions(lane)) await exchange(lane, 0, req);
    for (let n = 1; n <= quota && !failed; n++) {
      const x = lane.r.next();
      if (x < 0.55) await exchange(lane, n, invalidFromRoute(lane));
      else if (x < 0.77) await exchange(lane, n, hostile(lane, n));
      else if (x < 0.90) await exchange(lane, n, validLight(lane));
      else {
        const v = validVm(lane);
        if (v === 'lifecycle') await lifecycle(lane, n);
        else if (v === 'fork') await fork(lane, n);
        else if (v === 'snapshot') await snapshotCycle(lane, n);
        else await exchange(lane, n, v);
      }
    }
    // Everything this lane wrote through the file API reads back as written, from inside the guest.
    for (const [path, content] of lane.written) {
      const res = await exchange(lane, quota + 1, { kind: 'valid:read', method: 'GET', path: `/v1/sandboxes/${lane.main}/files?path=${encodeURIComponent(path)}`, headers: auth(t.keys.main), ok: [200] });
      assert.ok(res!.body.equals(content), `seed=${opts.seed} lane ${lane.id}: ${path} reads back ${res!.body.length} bytes, wrote ${content.length}`);
    }
    const ex = await exchange(lane, quota + 1, { kind: 'valid:exec', method: 'POST', path: `/v1/sandboxes/${lane.main}/exec`, headers: jsonHeaders(t.keys.main), body: json({ command: 'echo alive' }), ok: [200] });
    assert.equal(ex!.json().stdout, 'alive\n', `seed=${opts.seed} lane ${lane.id}: the main sandbox no longer runs commands`);
    stats.live.push(lane.main, ...(lane.spare ? [lane.spare] : []));
  };

  const lanes: Lane[] = Array.from({ length: lanesN }, (_, i) => ({ id: i, r: rng(opts.seed + i * 0x9e3779b1), main: '', spare: null, spareState: 'running', written: new Map() }));
  const quota = Math.ceil(opts.requests / lanesN);
  try {
    const results = await Promise.allSettled(lanes.map((l) => runLane(l, quota).catch((e) => { failed = true; throw e; })));
    const thrown = results.filter((x): x is PromiseRejectedResult => x.status === 'rejected').map((x) => String(x.reason?.stack ?? x.reason));
    const all = [...stats.failures, ...thrown];
    if (all.length) throw new Error(`seed=${opts.seed}: ${all.length} failure(s) after ${stats.sent} requests:\n\n${all.join('\n\n')}`);
  } finally {
    agent.destroy();
  }
  stats.ms = Date.now() - started;
  return stats;
}

/** A file upload over the (test-sized) limit, and a JSON body over its limit. */
export const HUGE_FILE = 1024 * 1024 + 1;
export const HUGE_JSON = 256 * 1024;

function randomBytesFrom(r: Rng, n: number): Buffer {
  const b = Buffer.alloc(n);
  for (let i = 0; i < n; i++) b[i] = r.int(256);
  return b;
}

/** A fresh string for the server's environment that no answer may ever carry. */
export function hostSecret(): string {
  return `collimate-fuzz-secret-${randomBytes(8).toString('hex')}`;
}

/** The host's own secrets no answer may contain: the root password hash line of its /etc/shadow, if it has one. */
export function hostShadowLines(): string[] {
  try {
    return readFileSync('/etc/shadow', 'utf8').split('\n').filter((l) => /^[^:]+:\$/.test(l)).slice(0, 3);
  } catch {
    return [];
  }
}

/** What both fuzz tests drive: a real engine (pools as given), its image service and the API on loopback. */
export interface FuzzServer {
  engine: Engine;
  images: ImageService;
  api: Served;
  home: string;
  base: URL;
  /** One request on a connection of its own, closed after the answer (no pooled socket skews a count). */
  call(method: string, path: string, key?: string, body?: unknown): Promise<{ status: number; json: any; text: string }>;
  /** Closes the API and the images, then the leak check (every sandbox deleted, nothing left behind). */
  close(): Promise<void>;
}

/**
 * The fuzzed server, with `secret` in its environment (COLLIMATE_FUZZ_HOST_SECRET: no answer may
 * carry it) and small limits, so that bodies over them are cheap to send many times; a stalled body
 * is given up on after 3 s (the slow clients the fuzz sends finish within ~1.5 s).
 */
export async function fuzzServer(name: string, pools: Pick<EngineOptions, 'poolSize' | 'poolMin' | 'poolMax'>, secret: string): Promise<FuzzServer> {
  process.env.COLLIMATE_FUZZ_HOST_SECRET = secret;
  const home = testHome(name);
  const engine = await openEngine(home, pools);
  const images = new ImageService({ host: engine, db: engine.db, importDir: join(home, 'imports'), storeDir: join(home, 'store'), poolSize: 1 });
  await images.restore();
  const api = await serveEngine(engine, { images, maxJsonBodyBytes: HUGE_JSON, maxFileBytes: HUGE_FILE - 1, requestTimeoutMs: 3000 });
  const base = new URL(await api.app.listen({ host: '127.0.0.1', port: 0 }));
  const call: FuzzServer['call'] = (method, path, key, body) => new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = httpRequest(new URL(path, base), {
      method,
      agent: false,
      headers: { connection: 'close', ...(key ? { authorization: `Bearer ${key}` } : {}), ...(payload ? { 'content-type': 'application/json', 'content-length': String(payload.length) } : {}) },
    }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let json: any = null;
        try { json = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
        resolve({ status: res.statusCode!, text, json });
      });
    });
    req.on('error', reject);
    req.end(payload);
  });
  return {
    engine, images, api, home, base, call,
    async close() {
      await api.close(1000);
      await images.close();
      await assertNoLeaks(engine, home);
      delete process.env.COLLIMATE_FUZZ_HOST_SECRET;
    },
  };
}
