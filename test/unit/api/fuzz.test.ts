/**
 * Generated requests — random methods, paths, queries, headers and bodies (malformed JSON, wrong
 * types, unknown fields, huge bodies) — against a server on the fake service. Every response must be
 * below 500, every error must have the {error:{code,message}} shape with the code's status, and every
 * success must match its documented schema. Reproduce a failure with FUZZ_SEED=<seed>.
 */
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { test } from 'node:test';
import { ROUTES } from '../../../src/api/routes.js';
import { checkResponse, fixture } from './helpers.js';
import { rng, type Rng } from '../../support/rng.ts';

const N = Number(process.env.FUZZ_N ?? 1500);
const SEED = Number(process.env.FUZZ_SEED ?? 0xc0111a7e);

type R = Rng;

const WEIRD_STRINGS = ['', ' ', 'a', 'python', 'base', 'node', 'nope', '../../etc/passwd', '/etc/passwd', '\u0000', '\u202e', '😀', 'x'.repeat(300), '%', '%zz', 'a=b', '=', 'k=', '{"a":1}', 'null', '0', '-1', '1e309', 'running', 'suspended', 'deleted', 'sbx_0123456789ab', 'echo hi', 'cat'];

function value(r: R, depth = 0): unknown {
  switch (r.int(depth > 2 ? 6 : 9)) {
    case 0: return r.pick(WEIRD_STRINGS);
    case 1: return r.pick([0, 1, -1, 1.5, 64, 65, 900, 901, 3600, 3601, 1e9, -0, Number.MAX_SAFE_INTEGER]);
    case 2: return r.chance(0.5);
    case 3: return null;
    case 4: return r.pick(WEIRD_STRINGS) + r.int(1000);
    case 5: return r.int(100);
    case 6: return Array.from({ length: r.int(4) }, () => value(r, depth + 1));
    case 7: case 8: {
      const o: Record<string, unknown> = {};
      for (let i = r.int(4); i > 0; i--) setKey(o, r.pick(FIELDS), value(r, depth + 1));
      return o;
    }
  }
  return undefined;
}

/** An own enumerable key even for `__proto__`, so JSON.stringify sends it (prototype-poisoning probes). */
function setKey(o: Record<string, unknown>, k: string, v: unknown): void {
  Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
}

const str = (v: unknown) => (v !== null && typeof v === 'object' ? JSON.stringify(v) : String(v));

const FIELDS = ['template', 'labels', 'timeout_secs', 'command', 'code', 'commands', 'files', 'env', 'cwd', 'stdin', 'timeout', 'count', 'path', 'content', 'encoding', 'mode', 'egress', 'port', 'expires_in_secs', 'extra', '__proto__', 'constructor', 'prototype', 'a', 'k'];

/** A plausible body for the route, then mutated. */
function body(r: R, op: string, mutate = true): unknown {
  const valid: Record<string, () => unknown> = {
    createSandbox: () => ({ template: r.pick(['base', 'python', 'node', 'nope']), ...(r.chance(0.3) ? { labels: { k: 'v' } } : {}), ...(r.chance(0.3) ? { timeout_secs: r.pick([1, 60, 900, 901, 86400]) } : {}), ...(r.chance(0.3) ? { egress: r.pick(['none', 'allow', { domains: ['pypi.org', '*.example.com'] }, { cidrs: ['10.0.0.0/8'], ports: [443] }, { ports: [80] }]) } : {}) }),
    createPortUrl: () => ({ port: r.pick([1, 80, 8000, 65535]), ...(r.chance(0.5) ? { expires_in_secs: r.pick([1, 60, 3600, 604800]) } : {}) }),
    execSandbox: () => r.pick([{ command: r.pick(['echo hi', 'exit 3', 'cat', 'stderr x', 'printf-bytes ff']) }, { code: 'print(1)' }, { commands: [['echo', 'a'], ['exit', '1']] }, { command: 'cat', stdin: 'x', files: [{ path: '/a', content: 'eA==', encoding: 'base64' }], env: { A: 'b' } }]),
    forkSandbox: () => ({ count: r.pick([1, 2, 3, 64, 65, 0]) }),
  };
  let b: unknown = valid[op]?.() ?? (r.chance(0.5) ? {} : undefined);
  if (mutate && r.chance(0.5)) {
    // mutate: change a field, add an unknown one, or replace wholesale
    const m = r.int(3);
    if (m === 0 && b && typeof b === 'object') setKey(b as any, r.pick(FIELDS), value(r));
    else if (m === 1 && b && typeof b === 'object') setKey(b as any, r.pick(['extra', 'x', 'TEMPLATE']), value(r));
    else b = value(r);
  }
  return b;
}

function rawBody(r: R, b: unknown): string | Buffer | undefined {
  switch (r.int(12)) {
    case 0: return '{"template": ';
    case 1: return '{bad json}';
    case 2: return Buffer.from([0xff, 0xfe, 0x00, 0x7b]);
    case 3: return '[' .repeat(5000);
    case 4: return JSON.stringify(b) + 'trailing';
    case 5: return '';
    case 6: return '   ';
    default: return b === undefined ? undefined : JSON.stringify(b);
  }
}

test(`fuzz: ${N} generated requests never produce a 5xx and every error has the documented shape`, async () => {
  const f = await fixture({ server: { maxJsonBodyBytes: 256 * 1024, maxFileBytes: 512 * 1024 } });
  const r = rng(SEED);
  try {
    const keys = [f.key('fuzz-pro', 'pro'), f.key('fuzz-demo', 'demo'), f.key('fuzz-ent', 'enterprise')];
    const own: string[] = [];
    for (let i = 0; i < 4; i++) own.push((await f.req('createSandbox', { url: '/v1/sandboxes', key: keys[0], body: { template: 'base' } })).json().id);
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${own[3]}/suspend`, key: keys[0] });
    const other = (await f.req('createSandbox', { url: '/v1/sandboxes', key: f.key('victim', 'pro'), body: { template: 'base' } })).json().id;

    const statuses = new Map<number, number>();
    const codes = new Set<string>();
    for (let i = 0; i < N; i++) {
      if (i % 100 === 0) {
        // Keep live targets around (the fuzz deletes and suspends them), one of them suspended.
        const fresh = (await f.req('createSandbox', { url: '/v1/sandboxes', key: keys[0], body: { template: 'base' } })).json().id;
        const paused = (await f.req('createSandbox', { url: '/v1/sandboxes', key: keys[0], body: { template: 'base' } })).json().id;
        await f.req('suspendSandbox', { url: `/v1/sandboxes/${paused}/suspend`, key: keys[0] });
        own.splice(0, 2, fresh, paused);
      }
      // A fifth of the requests are well-formed, so the fuzz also walks the success paths.
      const valid = r.chance(0.2);
      // The ports proxy (any method, streamed to real sockets) has its own tests (ports.test.ts), and so
      // has the event stream, which never ends by itself (account.test.ts): inject would wait for ever.
      const route = valid || r.chance(0.9) ? r.pick(ROUTES.filter((x) => x.method !== 'ANY' && x.operationId !== 'streamEvents')) : null;
      const method = (valid || r.chance(0.85)) && route ? route.method : r.pick(['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD']);
      let path = route?.path ?? r.pick(['/', '/v1', '/v1/', '/v2/sandboxes', '/v1/sandboxes/', '/v1/sandboxes//exec', '/v1/sandboxes/x/y/z', '/%', '/v1/%zz', '/v1/sandboxes/%E0%A4%A']);
      const id = valid ? r.pick(own) : r.pick([...own, own[0], other, 'sbx_000000000000', 'nope', '..', '%2e%2e', 'sbx_' + 'f'.repeat(12) + 'x', encodeURIComponent(r.pick(WEIRD_STRINGS)) || 'e', 'x'.repeat(r.pick([10, 200, 2000]))]);
      path = path.replace(':id', route?.params?.id === 'template' ? r.pick(valid ? ['python'] : ['python', 'nope', id]) : id);
      const q = new URLSearchParams();
      const qn = route?.query ? Object.keys(route.query.shape) : [];
      for (let j = valid ? 0 : r.int(3); j > 0; j--) q.append(r.chance(0.8) && qn.length ? r.pick(qn) : r.pick(['x', 'label', 'limit', 'path']), str(r.chance(0.5) ? r.pick(WEIRD_STRINGS) : value(r)));
      if (route?.path.endsWith('/files') && r.chance(0.7)) q.set('path', r.pick(['/a', '/tmp/x', 'rel', '/missing']));
      const url = path + (q.size ? '?' + q.toString() : '') + (r.chance(0.05) ? '&&=%' : '');

      const headers: Record<string, string> = {};
      const auth = r.int(10);
      // A well-formed request on its own sandbox is sent with its owner's key; the others with any.
      if (valid) headers.authorization = `Bearer ${keys[0]}`;
      else if (auth < 7) headers.authorization = `Bearer ${r.pick(keys)}`;
      else if (auth === 7) headers.authorization = r.pick(['Bearer', 'Bearer clm_x', 'Basic abc', `Bearer ${keys[0]}x`, 'Bearer ' + 'clm_' + 'z'.repeat(40)]);
      if (!valid && r.chance(0.3)) headers.accept = r.pick(['text/event-stream', 'application/json', '*/*', 'text/html']);
      if (!valid && r.chance(0.2)) headers['idempotency-key'] = r.pick(['k1', 'k2', 'k3', 'x'.repeat(300), ' ', 'é']);

      let payload: string | Buffer | undefined;
      if (valid && route) {
        if (route.path.endsWith('/files')) q.set('path', '/a');
        const res = await f.api.app.inject({
          method: method as any,
          url: path + (q.size ? '?' + q.toString() : ''),
          headers: { ...headers, 'content-type': 'application/json' },
          payload: route.bodyKind === 'raw' ? 'bytes' : route.bodyKind === 'json' ? JSON.stringify(body(r, route.operationId, false) ?? {}) : undefined,
        });
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
        const context = `#${i} seed=${SEED} valid ${method} ${path} → ${res.statusCode} ${res.body.slice(0, 300)}`;
        assert.ok(res.statusCode < 500, context);
        try {
          if (res.statusCode >= 400) codes.add(res.json().error.code);
          checkResponse(route.operationId, res);
        } catch (e) {
          throw new Error(`${context}\n${(e as Error).message}`);
        }
        continue;
      }
      if (route?.bodyKind === 'raw') payload = r.chance(0.05) ? Buffer.alloc(600 * 1024, 1) : Buffer.from(str(value(r)));
      else if (method !== 'GET' && method !== 'HEAD') payload = rawBody(r, body(r, route?.operationId ?? ''));
      if (payload !== undefined && r.chance(0.02)) payload = '{"template":"' + 'x'.repeat(300 * 1024) + '"}'; // over the JSON limit
      if (payload !== undefined && r.chance(0.85)) headers['content-type'] = r.chance(0.85) ? 'application/json' : r.pick(['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/json; charset=latin1', 'application/merge-patch+json', '']);

      const res = await f.api.app.inject({ method: method as any, url, headers, payload });
      statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
      const context = `#${i} seed=${SEED} ${method} ${url.slice(0, 120)} → ${res.statusCode} ${res.body.slice(0, 300)}`;
      assert.ok(res.statusCode < 500, context);
      if (method === 'HEAD') continue;
      const op = route && route.method === method && ROUTES.find((x) => x.method === method && x.path === route.path) ? route.operationId : null;
      try {
        if (res.statusCode >= 400) codes.add(res.json().error.code);
        checkResponse(op, res);
      } catch (e) {
        throw new Error(`${context}\n${(e as Error).message}`);
      }
    }
    // The generator must actually reach the interesting outcomes.
    for (const s of [200, 201, 204, 400, 401, 404, 405, 409, 413, 415]) assert.ok(statuses.has(s), `never saw ${s}: ${JSON.stringify([...statuses])}`);
    for (const c of ['validation_error', 'invalid_json', 'unauthorized', 'sandbox_not_found', 'not_found', 'payload_too_large']) assert.ok(codes.has(c), `never saw ${c}`);
    // The victim's sandbox is untouched.
    const v = await f.req('getSandbox', { url: `/v1/sandboxes/${other}`, key: f.key('victim', 'pro') });
    assert.equal(v.json().exec_count, 0);
    assert.deepEqual(v.json().children, []);
  } finally {
    await f.close();
  }
});

test('malformed HTTP on a real socket gets a 400 with the error shape', async () => {
  const f = await fixture();
  const address = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  const port = Number(new URL(address).port);
  try {
    for (const raw of ['GARBAGE\r\n\r\n', 'GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n', 'GET /healthz HTTP/1.1\r\nContent-Length: abc\r\n\r\n']) {
      const reply = await new Promise<string>((resolve, reject) => {
        const s = connect(port, '127.0.0.1', () => s.write(raw));
        let buf = '';
        s.on('data', (d) => (buf += d));
        s.on('end', () => resolve(buf));
        s.on('error', reject);
        setTimeout(() => (s.destroy(), resolve(buf)), 2000);
      });
      assert.match(reply, /^HTTP\/1\.1 400/, JSON.stringify(raw));
      const bodyText = reply.slice(reply.indexOf('\r\n\r\n') + 4);
      assert.equal(JSON.parse(bodyText).error.code, 'validation_error');
    }
  } finally {
    await f.close();
  }
});

test('a client that stalls mid-body is answered and disconnected once the request timeout passes', async () => {
  const f = await fixture({ server: { requestTimeoutMs: 400 } });
  const address = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  const port = Number(new URL(address).port);
  try {
    const key = f.key('slow', 'pro');
    const started = Date.now();
    const { reply, closedAfterMs } = await new Promise<{ reply: string; closedAfterMs: number }>((resolve, reject) => {
      const s = connect(port, '127.0.0.1', () => s.write(`POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"templ`));
      let buf = '';
      s.on('data', (d) => (buf += d));
      s.on('close', () => resolve({ reply: buf, closedAfterMs: Date.now() - started }));
      s.on('error', reject);
      // Before the limit existed the connection stayed open for good: give up well after it.
      setTimeout(() => s.destroy(), 10_000);
    });
    assert.ok(closedAfterMs < 5000, `the stalled connection stayed open ${closedAfterMs} ms`);
    assert.match(reply, /^HTTP\/1\.1 400/);
    const body = JSON.parse(reply.slice(reply.indexOf('\r\n\r\n') + 4));
    assert.equal(body.error.code, 'validation_error');
    assert.match(body.error.message, /did not arrive whole/);
  } finally {
    await f.close();
  }
});
