/**
 * The ports proxy and signed port URLs on the fake service, whose portTarget points at real
 * servers this test starts on 127.0.0.1: HTTP of every method, 5 MB streamed both ways without
 * buffering, headers in and out (the key never reaches the sandbox), the error codes, WebSocket
 * echo, signed URLs (ok, expired, altered, other port, deleted sandbox), live `ports` and egress.
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { statSync } from 'node:fs';
import { createServer as createNetServer } from 'node:net';
import { Agent, createServer, request, type IncomingHttpHeaders, type IncomingMessage, type Server } from 'node:http';
import { dirname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { wsConnect, wsEcho } from '../../support/ws.js';
import { fixture, assertErrorBody, serverOn, type Fixture } from './helpers.js';
import { SHARED_ORIGIN_CSP as SHARED_ORIGIN_CSP_TEXT } from '../../../src/api/portsProxy.js';

const MB = 1024 * 1024;
const SANDBOX_PORT = 8000;
const CLOSED_PORT = 8001;
/** A server like busybox httpd: every answer has a body (a HEAD's too) and `Connection: close`. */
const SLOPPY_PORT = 8002;

interface Seen { method: string; url: string; headers: IncomingHttpHeaders; bytes: number }

function deferred<T = void>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([p, new Promise<T>((_, rej) => setTimeout(() => rej(new Error(`timed out: ${what}`)), ms).unref())]);
}

/** The sandbox's server: echoes requests as JSON, plus a few special paths. */
function backend() {
  const seen: Seen[] = [];
  const upgrades: IncomingMessage[] = [];
  const hooks = { uploadStarted: (): void => {}, downloadReceived: Promise.resolve() };
  const server = createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0];
    if (path === '/upload') {
      const h = createHash('sha256');
      let bytes = 0;
      req.on('data', (c: Buffer) => {
        if (bytes === 0) hooks.uploadStarted();
        bytes += c.length;
        h.update(c);
      });
      req.on('end', () => res.end(JSON.stringify({ bytes, sha256: h.digest('hex') })));
      return;
    }
    if (path === '/download') {
      // 1 MiB, then the rest only once the client has seen the first bytes: a proxy that buffers deadlocks here.
      const data = downloadBytes;
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'x-sha256': createHash('sha256').update(data).digest('hex') });
      res.write(data.subarray(0, MB));
      void hooks.downloadReceived.then(() => res.end(data.subarray(MB)));
      return;
    }
    if (path === '/teapot') {
      res.writeHead(418, "I'm a teapot", ['Set-Cookie', 'a=1', 'Set-Cookie', 'b=2; Domain=localhost; Path=/', 'Service-Worker-Allowed', '/', 'X-Custom', 'yes', 'Content-Type', 'text/plain']);
      res.end('short and stout');
      return;
    }
    let bytes = 0;
    req.on('data', (c: Buffer) => (bytes += c.length));
    req.on('end', () => {
      const s: Seen = { method: req.method!, url: req.url!, headers: req.headers, bytes };
      seen.push(s);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(req.method === 'HEAD' ? undefined : JSON.stringify(s));
    });
  });
  wsEcho(server, (req) => upgrades.push(req));
  return { server, seen, upgrades, hooks };
}
const downloadBytes = randomBytes(5 * MB);

async function listen(s: Server | import('node:net').Server): Promise<number> {
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  return (s.address() as { port: number }).port;
}

async function freePort(): Promise<number> {
  const s = createServer();
  const p = await listen(s);
  await new Promise((r) => s.close(r));
  return p;
}

/** A raw HTTP request through the proxy; the body is read whole. */
function call(url: string, opts: { method?: string; headers?: Record<string, string>; body?: Buffer | string } = {}) {
  return new Promise<{ status: number; message: string; headers: IncomingHttpHeaders; raw: string[]; body: Buffer; json(): any }>((resolve, reject) => {
    // An explicit length: Node's client would frame a DELETE or OPTIONS body by closing the connection.
    const length = opts.body === undefined ? {} : { 'content-length': String(Buffer.byteLength(opts.body)) };
    const req = request(url, { method: opts.method ?? 'GET', headers: { ...length, ...opts.headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const body = Buffer.concat(chunks);
        resolve({ status: res.statusCode!, message: res.statusMessage!, headers: res.headers, raw: res.rawHeaders, body, json: () => JSON.parse(body.toString()) });
      });
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}

describe('ports proxy', () => {
  let f: Fixture;
  let base: string;
  let key: string;
  let otherKey: string;
  let id: string;
  const b = backend();
  const sloppy = createNetServer((s) => {
    s.on('error', () => {});
    s.once('data', () => s.end('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello'));
  });

  before(async () => {
    // A 1 MiB JSON limit: 5 MB must still stream through, so the proxy's bodies bypass it.
    f = await fixture({ server: { maxJsonBodyBytes: MB, maxFileBytes: MB } });
    base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
    f.svc.portMap.set(SANDBOX_PORT, await listen(b.server));
    f.svc.portMap.set(CLOSED_PORT, await freePort());
    f.svc.portMap.set(SLOPPY_PORT, await listen(sloppy));
    key = f.key('acme', 'pro');
    otherKey = f.key('globex', 'pro');
    id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
  });
  after(async () => {
    await f.close();
    b.server.closeAllConnections();
    await new Promise((r) => b.server.close(r));
    await new Promise((r) => sloppy.close(r));
  });

  const proxied = (path = '/', port = SANDBOX_PORT) => `${base}/v1/sandboxes/${id}/ports/${port}${path}`;
  const auth = () => ({ authorization: `Bearer ${key}` });

  test('GET: path and query as sent, Host localhost:PORT, X-Forwarded-*, and no key in any header', async () => {
    const r = await call(proxied('/a/b%20c/?x=1&y=%2F'), {
      headers: { ...auth(), 'x-api-key': key, 'x-echo-key': `token=${key}`, 'x-app': 'kept', 'x-forwarded-for': '203.0.113.9', 'x-forwarded-host': 'spoofed' },
    });
    assert.equal(r.status, 200);
    const seen = r.json() as Seen;
    assert.equal(seen.url, '/a/b%20c/?x=1&y=%2F');
    assert.equal(seen.headers.host, `localhost:${SANDBOX_PORT}`);
    assert.equal(seen.headers['x-forwarded-for'], '203.0.113.9, 127.0.0.1');
    assert.equal(seen.headers['x-forwarded-proto'], 'http');
    assert.equal(seen.headers['x-forwarded-host'], new URL(base).host);
    assert.equal(seen.headers['x-forwarded-prefix'], `/v1/sandboxes/${id}/ports/${SANDBOX_PORT}`);
    assert.equal(seen.headers['x-app'], 'kept');
    for (const h of ['authorization', 'x-api-key', 'x-echo-key']) assert.equal(seen.headers[h], undefined, `${h} must not reach the sandbox`);
    assert.ok(!JSON.stringify(seen.headers).includes(key), 'the key appears nowhere');
    // Without a trailing slash the sandbox sees `/`.
    assert.equal((await call(`${base}/v1/sandboxes/${id}/ports/${SANDBOX_PORT}`, { headers: auth() })).json().url, '/');
    assert.equal((await call(`${base}/v1/sandboxes/${id}/ports/${SANDBOX_PORT}?q=1`, { headers: auth() })).json().url, '/?q=1');
  });

  test('every method goes through; HEAD has no body; status, reason and repeated headers come back as sent', async () => {
    for (const method of ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'HEAD']) {
      const body = ['POST', 'PUT', 'PATCH', 'DELETE'].includes(method) ? 'x'.repeat(10) : undefined;
      const r = await call(proxied('/m'), { method, headers: { ...auth(), ...(body ? { 'content-type': 'text/plain' } : {}) }, body });
      assert.equal(r.status, 200, method);
      if (method === 'HEAD') assert.equal(r.body.length, 0);
      else {
        assert.equal(r.json().method, method);
        assert.equal(r.json().bytes, body ? 10 : 0, method);
      }
    }
    // On the sandbox port's own origin (Host <port>-<id>.<domain>), the answer as sent; a cookie stays on that host.
    const t = await call(`${base}/teapot`, { headers: { ...auth(), host: `${SANDBOX_PORT}-${id}.localhost` } });
    assert.equal(t.status, 418);
    assert.equal(t.message, "I'm a teapot");
    assert.deepEqual(t.headers['set-cookie'], ['a=1', 'b=2; Path=/']);
    assert.equal(t.headers['service-worker-allowed'], '/');
    assert.equal(t.headers['x-custom'], 'yes');
    assert.equal(t.body.toString(), 'short and stout');
    assert.equal(t.headers['x-collimate-error'], undefined, "the sandbox's own answers are not marked as proxy errors");
    assert.equal(t.headers['content-security-policy'], undefined);
  });

  test("a sandbox's server that sends a body after its HEAD answer does not cost the client its kept-alive connection", async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const one = (method: string) => new Promise<{ status: number; body: string; socket: unknown }>((resolve, reject) => {
        const req = request(proxied('/', SLOPPY_PORT), { method, agent, headers: auth() }, (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c));
          res.on('end', () => resolve({ status: res.statusCode!, body, socket: req.socket }));
        });
        req.on('error', reject);
        req.end();
      });
      const head = await one('HEAD');
      assert.equal(head.status, 200);
      assert.equal(head.body, '');
      // The proxy read a complete answer and then garbage (the HEAD's body): the answer stands and
      // the client's connection is not reset under the next request on it.
      for (let i = 0; i < 3; i++) {
        await new Promise((r) => setTimeout(r, 20));
        const get = await one(i === 1 ? 'HEAD' : 'GET');
        assert.equal(get.status, 200);
        assert.equal(get.socket, head.socket, 'the same kept-alive connection');
      }
    } finally {
      agent.destroy();
    }
  });

  test("on the API's origin a sandbox's answer runs in an opaque origin and cannot set cookies or widen a service worker's scope; a service worker script is refused", async () => {
    const signed = (await f.req('createPortUrl', { url: `/v1/sandboxes/${id}/port-urls`, key, body: { port: SANDBOX_PORT } })).json().url;
    for (const url of [proxied('/teapot'), `${base}${signed}teapot`]) {
      const t = await call(url, { headers: auth() });
      assert.equal(t.status, 418, url);
      assert.equal(t.headers['content-security-policy'], 'sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads');
      for (const h of ['set-cookie', 'service-worker-allowed']) assert.equal(t.headers[h], undefined, `${h} on ${url}`);
      assert.equal(t.headers['x-custom'], 'yes');
      const sw = await call(url, { headers: { ...auth(), 'service-worker': 'script' } });
      assert.equal(sw.status, 403);
      assert.equal(sw.json().error.code, 'origin_forbidden');
    }
  });

  test("a browser opening a signed URL goes to the port's own origin, which keeps the token in an HttpOnly cookie of its own that never reaches the sandbox", async () => {
    const { url } = (await f.req('createPortUrl', { url: `/v1/sandboxes/${id}/port-urls`, key, body: { port: SANDBOX_PORT } })).json();
    const token = url.split('/')[3];
    const nav = { 'sec-fetch-dest': 'document', 'sec-fetch-mode': 'navigate' };
    const apiPort = new URL(base).port;
    // Addressed by IP, the API cannot name an origin per port: the answer stays here, confined.
    assert.equal((await call(`${base}${url}teapot?x=1`, { headers: nav })).status, 418);
    const go = await call(`${base}${url}teapot?x=1`, { headers: { ...nav, host: `localhost:${apiPort}` } });
    assert.equal(go.status, 302);
    const own = `${SANDBOX_PORT}-${id}.localhost:${apiPort}`;
    assert.equal(go.headers.location, `http://${own}/__collimate/signed?token=${token}&next=${encodeURIComponent('/teapot?x=1')}`);
    // The entry on the port's origin: the token becomes a cookie of that host, the browser goes on.
    const entry = new URL(go.headers.location!);
    const set = await call(`${base}${entry.pathname}${entry.search}`, { headers: { ...nav, host: own } });
    assert.equal(set.status, 302);
    assert.equal(set.headers.location, '/teapot?x=1');
    const cookie = set.headers['set-cookie']![0];
    assert.match(cookie, new RegExp(`^__collimate_port=${token}; Path=/; HttpOnly; SameSite=Lax; Max-Age=\\d+$`));
    // Requests on that origin with the cookie reach the port; the sandbox sees its own cookies only.
    const r = await call(`${base}/seen`, { headers: { host: own, cookie: `app=1; __collimate_port=${token}` } });
    assert.equal(r.status, 200, r.body.toString());
    assert.equal(r.json().headers.cookie, 'app=1');
    assert.equal(r.headers['content-security-policy'], undefined, 'its own origin: not confined');
    // The token proves nothing on another port's origin, and a forged one nothing anywhere.
    const other = await call(`${base}/seen`, { headers: { host: `${CLOSED_PORT}-${id}.localhost:${apiPort}`, cookie: `__collimate_port=${token}` } });
    assert.equal(other.status, 401);
    assert.match(other.json().error.message, /another sandbox port/);
    assert.equal((await call(`${base}/seen`, { headers: { host: own, cookie: `__collimate_port=${token.slice(0, -2)}xx` } })).status, 401);
    assert.equal((await call(`${base}/__collimate/signed?token=nope&next=/`, { headers: { host: own } })).status, 401);
    // A client that is not navigating a browser tab is answered on the API's origin, confined.
    assert.equal((await call(`${base}${url}teapot`)).status, 418);
  });

  for (const framing of ['chunked', 'content-length'] as const) {
    test(`5 MB upload streams through (${framing}), past the API's 1 MiB body limit`, async () => {
      const data = randomBytes(5 * MB);
      const started = deferred();
      b.hooks.uploadStarted = started.resolve;
      const res = deferred<IncomingMessage>();
      const req = request(proxied('/upload'), {
        method: 'POST',
        headers: { ...auth(), 'content-type': 'application/octet-stream', ...(framing === 'chunked' ? { 'transfer-encoding': 'chunked' } : { 'content-length': String(data.length) }) },
      }, res.resolve);
      req.write(data.subarray(0, MB));
      // The sandbox sees the first bytes while the client still holds back the rest: nothing buffers the body.
      await within(started.promise, 5000, 'the sandbox never saw the start of the body');
      req.end(data.subarray(MB));
      const r = await res.promise;
      const chunks: Buffer[] = [];
      for await (const c of r) chunks.push(c as Buffer);
      assert.deepEqual(JSON.parse(Buffer.concat(chunks).toString()), { bytes: data.length, sha256: createHash('sha256').update(data).digest('hex') });
    });
  }

  test('5 MB download streams through: the client reads the start before the sandbox sends the rest', async () => {
    const got = deferred();
    b.hooks.downloadReceived = got.promise;
    const res = await new Promise<IncomingMessage>((resolve, reject) => request(proxied('/download'), { headers: auth() }, resolve).on('error', reject).end());
    const h = createHash('sha256');
    let bytes = 0;
    for await (const c of res) {
      if (bytes === 0) got.resolve();
      bytes += (c as Buffer).length;
      h.update(c as Buffer);
    }
    assert.equal(bytes, 5 * MB);
    assert.equal(h.digest('hex'), res.headers['x-sha256']);
  });

  test("by Host, as E2B's getHost(port) names it: with the sandbox's traffic token or a key, never without", async () => {
    const host = `${SANDBOX_PORT}-${id}.localhost:${new URL(base).port}`;
    const scope = await f.api.tenants.accounts.authenticate(key);
    const tokens = await f.api.tenants.accounts.sandboxTokens(scope, id);
    const token = tokens.traffic;
    const viaToken = await call(`${base}/a?b=1`, { headers: { host, 'e2b-traffic-access-token': token } });
    assert.equal(viaToken.status, 200);
    const seen = viaToken.json() as Seen;
    assert.equal(seen.url, '/a?b=1');
    assert.equal(seen.headers['e2b-traffic-access-token'], undefined, 'the token stays at the proxy');
    assert.equal((await call(`${base}/`, { headers: { host, ...auth() } })).status, 200);
    assert.equal((await call(`${base}/`, { headers: { host } })).status, 401);
    assert.equal((await call(`${base}/`, { headers: { host, 'e2b-traffic-access-token': f.api.tenants.signer.sandboxToken('sbx_000000000000', 'traffic', { keyId: scope.keyId!, generation: 0 }) } })).status, 401);
    // One job each: the envd token (which runs commands) opens no port, and the traffic token no envd.
    assert.equal((await call(`${base}/`, { headers: { host, 'e2b-traffic-access-token': tokens.envd } })).status, 401);
    await assert.rejects(f.api.tenants.accounts.sandboxScope(id, token), (e: { code?: string }) => e.code === 'unauthorized');
    // Issued again, the tokens are the same until a rotation, after which the old ones open nothing.
    assert.deepEqual(await f.api.tenants.accounts.sandboxTokens(scope, id), tokens);
    const rotated = (await call(`${base}/v1/sandboxes/${id}/tokens/rotate`, { method: 'POST', headers: auth() })).json() as { traffic_access_token: string; envd_access_token: string; generation: number };
    assert.equal(rotated.generation, 1);
    assert.notEqual(rotated.traffic_access_token, token);
    assert.equal((await call(`${base}/`, { headers: { host, 'e2b-traffic-access-token': token } })).status, 401, 'a rotated-away token still opens the port');
    assert.equal((await call(`${base}/`, { headers: { host, 'e2b-traffic-access-token': rotated.traffic_access_token } })).status, 200);
    assert.equal((await f.api.tenants.accounts.sandboxScope(id, rotated.envd_access_token)).tenant, scope.tenant);
    // Another Host is the API itself.
    assert.equal((await call(`${base}/healthz`)).status, 200);
  });

  test("a sandbox's tokens die with the key they were issued under; a live key gets new ones", async () => {
    const host = `${SANDBOX_PORT}-${id}.localhost:${new URL(base).port}`;
    const tenant = (await f.api.tenants.accounts.authenticate(key)).tenant;
    const doomed = f.api.keys.create({ tenant });
    const doomedScope = await f.api.tenants.accounts.authenticate(doomed.key);
    const rotated = (await call(`${base}/v1/sandboxes/${id}/tokens/rotate`, { method: 'POST', headers: { authorization: `Bearer ${doomed.key}` } })).json() as { traffic_access_token: string; envd_access_token: string };
    assert.equal((await call(`${base}/`, { headers: { host, 'e2b-traffic-access-token': rotated.traffic_access_token } })).status, 200);
    f.api.keys.revoke(doomed.record.id);
    await new Promise((r) => setTimeout(r, 2100)); // a revocation reaches cached key states within 2 s
    assert.equal((await call(`${base}/`, { headers: { host, 'e2b-traffic-access-token': rotated.traffic_access_token } })).status, 401, "a revoked key's traffic token still opens the port");
    await assert.rejects(f.api.tenants.accounts.sandboxScope(id, rotated.envd_access_token), /since revoked/);
    const fresh = await f.api.tenants.accounts.sandboxTokens(await f.api.tenants.accounts.authenticate(key), id);
    assert.notEqual(fresh.envd, rotated.envd_access_token);
    assert.equal((await f.api.tenants.accounts.sandboxScope(id, fresh.envd)).keyId, (await f.api.tenants.accounts.authenticate(key)).keyId);
    assert.equal(doomedScope.keyId, doomed.record.id);
  });

  test("a token of a sandbox since deleted is sandbox_not_found to its holder, not a rotated token", async () => {
    // With transitions, as the engine emits them: a deletion drops the sandbox's token grant.
    const g = await fixture({ fake: { events: true } });
    try {
      const k = g.key('acme', 'pro');
      const scope = await g.api.tenants.accounts.authenticate(k);
      const gone = (await g.req('createSandbox', { url: '/v1/sandboxes', key: k, body: { template: 'python' } })).json().id as string;
      const tokens = await g.api.tenants.accounts.sandboxTokens(scope, gone);
      assert.equal((await g.api.tenants.accounts.sandboxScope(gone, tokens.envd)).tenant, scope.tenant);
      assert.equal((await g.req('deleteSandbox', { url: `/v1/sandboxes/${gone}`, method: 'DELETE', key: k })).statusCode, 204);
      await new Promise((r) => setTimeout(r, 50)); // the grant is dropped on the deletion's transition
      await assert.rejects(g.api.tenants.accounts.sandboxScope(gone, tokens.envd), (e: { code?: string; status?: number }) => e.code === 'sandbox_not_found' && e.status === 404);
      // Without this server's MAC the answer stays 401, whatever the id.
      await assert.rejects(g.api.tenants.accounts.sandboxScope(gone, tokens.envd.slice(0, -2) + 'xx'), (e: { code?: string }) => e.code === 'unauthorized');
    } finally {
      await g.close();
    }
  });

  test('401 without a key, 404 for another tenant and bad ids, 400 for bad ports, 502 when nothing listens, 409 suspended or no network', async () => {
    const err = async (url: string, headers: Record<string, string>, status: number, code: string) => {
      const r = await call(url, { headers, method: 'POST', body: 'ignored' });
      assert.equal(r.status, status, `${url}: ${r.body}`);
      assert.equal(r.json().error.code, code);
      assert.equal(r.headers['x-collimate-error'], code);
      assertErrorBody({ statusCode: r.status, headers: r.headers, body: r.body.toString(), json: r.json } as any, code);
      return r.json().error.message as string;
    };
    await err(proxied('/x'), {}, 401, 'unauthorized');
    await err(proxied('/x'), { authorization: 'Bearer clm_' + 'A'.repeat(40) }, 401, 'unauthorized');
    await err(proxied('/x'), { authorization: `Bearer ${otherKey}` }, 404, 'sandbox_not_found');
    await err(`${base}/v1/sandboxes/sbx_000000000000/ports/8000/`, auth(), 404, 'sandbox_not_found');
    await err(`${base}/v1/sandboxes/nope/ports/8000/`, auth(), 404, 'sandbox_not_found');
    for (const port of ['0', '65536', 'abc', '-1', '8000x', '%38000']) await err(`${base}/v1/sandboxes/${id}/ports/${port}/`, auth(), 400, 'validation_error');
    assert.match(await err(proxied('/x', CLOSED_PORT), auth(), 502, 'port_unreachable'), new RegExp(`Nothing listens on port ${CLOSED_PORT} of sandbox ${id}`));
    assert.equal(b.seen.filter((s) => s.url === '/x').length, 0, 'no refused request reached the sandbox');

    f.svc.networkUnavailable = true;
    await err(proxied('/x'), auth(), 409, 'network_unavailable');
    f.svc.networkUnavailable = false;
    const paused = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${paused}/suspend`, key });
    await err(`${base}/v1/sandboxes/${paused}/ports/8000/`, auth(), 409, 'invalid_state');
    // The connection is still usable after an error answered before the body was read.
    assert.equal((await call(proxied('/after'), { headers: auth() })).status, 200);
  });

  test('WebSocket echo through the proxy; the upgrade carries no key; 401 and 404 before any tunnel', async () => {
    const ws = await wsConnect(proxied('/chat?room=1'), auth());
    ws.send('hello');
    assert.equal(await within(ws.next(), 5000, 'echo'), 'echo:hello');
    ws.send('x'.repeat(70_000));
    assert.equal((await within(ws.next(), 5000, 'big echo')).length, 70_005);
    ws.close();
    const up = b.upgrades.at(-1)!;
    assert.equal(up.url, '/chat?room=1');
    assert.equal(up.headers.authorization, undefined);
    assert.equal(up.headers.host, `localhost:${SANDBOX_PORT}`);
    assert.equal(up.headers['x-forwarded-prefix'], `/v1/sandboxes/${id}/ports/${SANDBOX_PORT}`);
    await assert.rejects(wsConnect(proxied('/chat')), (e: any) => e.status === 401 && e.headers['x-collimate-error'] === 'unauthorized');
    await assert.rejects(wsConnect(proxied('/chat'), { authorization: `Bearer ${otherKey}` }), (e: any) => e.status === 404);
    await assert.rejects(wsConnect(proxied('/chat', CLOSED_PORT), auth()), (e: any) => e.status === 502 && JSON.parse(e.body).error.code === 'port_unreachable');
    await assert.rejects(wsConnect(`${base}/v1/sandboxes`, auth()), (e: any) => e.status === 200 || e.status === 400 || e.status === 404);
  });

  test('an Upgrade header elsewhere (curl --http2 sends h2c) is an ordinary request', async () => {
    const r = await call(`${base}/v1/sandboxes/${id}`, { headers: { ...auth(), connection: 'Upgrade, HTTP2-Settings', upgrade: 'h2c', 'http2-settings': 'AAMAAABkAAQCAAAAAAIAAAAA' } });
    assert.equal(r.status, 200);
    assert.equal(r.json().id, id);
  });

  test('GET of a sandbox reads its ports live, each with its proxy path', async () => {
    f.svc.listen(id, [SANDBOX_PORT, 5432]);
    const s = (await f.req('getSandbox', { url: `/v1/sandboxes/${id}`, key })).json();
    assert.deepEqual(s.ports, [
      { port: SANDBOX_PORT, protocol: 'tcp', url: `/v1/sandboxes/${id}/ports/${SANDBOX_PORT}/` },
      { port: 5432, protocol: 'tcp', url: `/v1/sandboxes/${id}/ports/5432/` },
    ]);
    const listed = (await f.req('listSandboxes', { url: '/v1/sandboxes', key })).json().sandboxes.find((x: any) => x.id === id);
    assert.equal(listed.ports.length, 2);
    f.svc.listen(id, []);
    assert.deepEqual((await f.req('getSandbox', { url: `/v1/sandboxes/${id}`, key })).json().ports, []);
  });

  test("public ports answer anyone, by path, by Host and over WebSocket, with the port_host the sandbox asked for; nothing else of it opens", async () => {
    const pub = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python', public_ports: true, port_host: 'app.example.test:${PORT}' } })).json();
    assert.deepEqual([pub.public_ports, pub.port_host], [true, 'app.example.test:${PORT}']);
    const at = (path: string, sid = pub.id, port = SANDBOX_PORT) => `${base}/v1/sandboxes/${sid}/ports/${port}${path}`;
    // Without a key or token: the sandbox's server answers, and sees the Host it asked for.
    const r = await call(at('/open?x=1'), { headers: { authorization: 'Bearer app-token', 'x-api-key': key } });
    assert.equal(r.status, 200, r.body.toString());
    const seen = r.json() as Seen;
    assert.equal(seen.url, '/open?x=1');
    assert.equal(seen.headers.host, `app.example.test:${SANDBOX_PORT}`);
    assert.equal(seen.headers['x-forwarded-prefix'], `/v1/sandboxes/${pub.id}/ports/${SANDBOX_PORT}`);
    assert.equal(seen.headers['x-api-key'], undefined, 'a Collimate key sent along stays at the proxy');
    assert.equal(r.headers['content-security-policy'], SHARED_ORIGIN_CSP_TEXT, "on the API's origin it is confined as ever");
    // An app's own Authorization passes when it opened nothing here (not a Collimate key).
    const app = await call(at('/app'), { headers: { authorization: 'Bearer app-token' } });
    assert.equal((app.json() as Seen).headers.authorization, 'Bearer app-token');
    // By Host (E2B's getHost), another tenant's key or a wrong token: public all the same, no key forwarded.
    const byHost = await call(`${base}/h`, { headers: { host: `${SANDBOX_PORT}-${pub.id}.localhost` } });
    assert.equal(byHost.status, 200);
    assert.equal((byHost.json() as Seen).headers.host, `app.example.test:${SANDBOX_PORT}`);
    const other = await call(at('/o'), { headers: { authorization: `Bearer ${otherKey}` } });
    assert.equal(other.status, 200);
    assert.ok(!JSON.stringify((other.json() as Seen).headers).includes(otherKey), "the other tenant's key is not forwarded");
    assert.equal((await call(at('/t'), { headers: { 'e2b-traffic-access-token': 'wrong' } })).status, 200);
    assert.equal((await call(at('/k'), { headers: auth() })).status, 200, "the owner's key works as ever");
    // WebSocket without a key.
    const ws = await wsConnect(at('/chat'));
    ws.send('hi');
    assert.equal(await within(ws.next(), 5000, 'public echo'), 'echo:hi');
    ws.close();
    assert.equal(b.upgrades.at(-1)!.headers.host, `app.example.test:${SANDBOX_PORT}`);
    // Errors stay what they are: a bad port 400, nothing listening 502; private and unknown sandboxes 401 alike without a key.
    assert.equal((await call(at('/', pub.id, CLOSED_PORT))).status, 502);
    assert.equal((await call(`${base}/v1/sandboxes/${pub.id}/ports/0/`)).status, 400);
    assert.equal((await call(proxied('/x'))).status, 401, 'a sandbox without public ports still needs a key');
    const unknown = await call(at('/x', 'sbx_000000000000'));
    const closed = await call(proxied('/x'));
    assert.equal(unknown.status, 401);
    assert.equal(unknown.json().error.message, closed.json().error.message, 'unknown and closed look the same from outside');
    assert.equal((await call(`${base}/v1/sandboxes/${pub.id}`)).status, 401, 'the sandbox itself stays behind the key');
    assert.equal((await call(`${base}/v1/sandboxes/${pub.id}/exec`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"command":"id"}' })).status, 401);
    // Forks and sandboxes started from its snapshots keep both.
    const child = (await f.req('forkSandbox', { url: `/v1/sandboxes/${pub.id}/fork`, key, body: { count: 1 } })).json().sandboxes[0];
    assert.deepEqual([child.public_ports, child.port_host], [true, 'app.example.test:${PORT}']);
    assert.equal(((await call(at('/child', child.id))).json() as Seen).headers.host, `app.example.test:${SANDBOX_PORT}`);
    const snap = (await f.req('createSnapshot', { url: `/v1/sandboxes/${pub.id}/snapshots`, key, body: {} })).json();
    const started = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { snapshot: snap.id } })).json();
    assert.deepEqual([started.public_ports, started.port_host], [true, 'app.example.test:${PORT}']);
    assert.equal((await call(at('/s', started.id))).status, 200);
    const narrowed = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { snapshot: snap.id, public_ports: false } })).json();
    assert.equal((await call(at('/s', narrowed.id))).status, 401, 'a start from a snapshot may close its ports');
    // Suspended: 409 as for the owner (a public port says no more than that).
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${started.id}/suspend`, key });
    assert.equal((await call(at('/x', started.id))).status, 409);
  });

  test('port_host alone: the Host the server sees; default localhost:PORT; bad values are 400 validation_error naming the problem', async () => {
    const masked = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python', port_host: '[::1]' } })).json();
    assert.deepEqual([masked.public_ports, masked.port_host], [false, '[::1]']);
    assert.equal(((await call(`${base}/v1/sandboxes/${masked.id}/ports/${SANDBOX_PORT}/`, { headers: auth() })).json() as Seen).headers.host, '[::1]');
    assert.equal((await call(`${base}/v1/sandboxes/${masked.id}/ports/${SANDBOX_PORT}/`)).status, 401, 'a port Host opens nothing');
    const plain = (await f.req('getSandbox', { url: `/v1/sandboxes/${id}`, key })).json();
    assert.deepEqual([plain.public_ports, plain.port_host], [false, null]);
    for (const [bad, why] of [
      ['evil.test\r\nX-Injected: 1', /line breaks/], ['a b', /not a host/], ['host/path', /not a host/], ['', /1 to 260|too small/i],
      ['x'.repeat(261), /260/], ['http://host', /not a host/], ['host:${PORT}:1', /not a host/], ['-lead.test', /not a host/],
    ] as const) {
      const res = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python', port_host: bad } });
      assert.equal(res.statusCode, 400, JSON.stringify(bad));
      assert.equal(res.json().error.code, 'validation_error');
      assert.match(res.json().error.message, why, JSON.stringify(bad));
    }
    const notBool = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python', public_ports: 'yes' } });
    assert.equal(notBool.statusCode, 400);
    assert.equal(notBool.json().error.code, 'validation_error');
  });

  test('shutdown ends open WebSocket tunnels', async () => {
    const g = await fixture();
    try {
      const gBase = await g.api.app.listen({ host: '127.0.0.1', port: 0 });
      g.svc.portMap.set(SANDBOX_PORT, f.svc.portMap.get(SANDBOX_PORT)!);
      const k = g.key('acme', 'pro');
      const sid = (await g.req('createSandbox', { url: '/v1/sandboxes', key: k, body: { template: 'python' } })).json().id;
      const ws = await wsConnect(`${gBase}/v1/sandboxes/${sid}/ports/${SANDBOX_PORT}/`, { authorization: `Bearer ${k}` });
      ws.send('ping');
      assert.equal(await ws.next(), 'echo:ping');
      await within(g.api.shutdown(200), 10_000, 'shutdown with a tunnel open');
    } finally {
      await g.close();
    }
  });
});

describe('signed port URLs', () => {
  let f: Fixture;
  let base: string;
  let key: string;
  let id: string;
  let clock = Date.now();
  const b = backend();

  before(async () => {
    f = await fixture({ server: { now: () => clock } });
    base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
    f.svc.portMap.set(SANDBOX_PORT, await listen(b.server));
    key = f.key('acme', 'pro');
    id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
  });
  after(async () => {
    await f.close();
    b.server.closeAllConnections();
    await new Promise((r) => b.server.close(r));
  });

  const mint = async (body: unknown, k = key, sid = id) => f.req('createPortUrl', { url: `/v1/sandboxes/${sid}/port-urls`, key: k, body });

  test('mint: 201 with a /v1/p/<token>/ URL and its expiry; validation and ownership', async () => {
    const r = await mint({ port: SANDBOX_PORT });
    assert.equal(r.statusCode, 201, r.body);
    const { url, port, expires_at } = r.json();
    assert.match(url, /^\/v1\/p\/[A-Za-z0-9_-]{62}\/$/);
    assert.equal(port, SANDBOX_PORT);
    assert.equal(Date.parse(expires_at), Math.floor(clock / 1000) * 1000 + 3600_000, 'default: one hour');
    const week = (await mint({ port: 1, expires_in_secs: 604800 })).json();
    assert.equal(Date.parse(week.expires_at), Math.floor(clock / 1000) * 1000 + 604800_000);
    for (const body of [{}, { port: 0 }, { port: 65536 }, { port: 80, expires_in_secs: 604801 }, { port: 80, expires_in_secs: 0 }, { port: 80, extra: 1 }]) {
      assertErrorBody(await mint(body), 'validation_error');
    }
    assertErrorBody(await mint({ port: 80 }, f.key('globex', 'pro')), 'sandbox_not_found');
    assertErrorBody(await f.req('createPortUrl', { url: `/v1/sandboxes/${id}/port-urls`, body: { port: 80 } }), 'unauthorized');
  });

  test('the URL proxies HTTP and WebSocket without a key; the sandbox sees its prefix; an app Authorization passes, a Collimate key does not', async () => {
    const { url } = (await mint({ port: SANDBOX_PORT })).json();
    const token = url.split('/')[3];
    const r = await call(`${base}${url}docs/index.html?v=2`, { headers: { authorization: 'Bearer app-token' } });
    assert.equal(r.status, 200, r.body.toString());
    const seen = r.json() as Seen;
    assert.equal(seen.url, '/docs/index.html?v=2');
    assert.equal(seen.headers['x-forwarded-prefix'], `/v1/p/${token}`);
    assert.equal(seen.headers.authorization, 'Bearer app-token');
    const withKey = (await call(`${base}${url}`, { headers: { authorization: `Bearer ${key}` } })).json() as Seen;
    assert.equal(withKey.headers.authorization, undefined, 'a Collimate key is never forwarded');
    assert.equal((await call(`${base}/v1/p/${token}`)).json().url, '/');
    const ws = await wsConnect(`${base}${url}live`);
    ws.send('hi');
    assert.equal(await within(ws.next(), 5000, 'echo'), 'echo:hi');
    ws.close();
  });

  test('expired is 401 url_expired; altered, truncated or re-targeted tokens are 401 unauthorized; a deleted sandbox is 404', async () => {
    const { url } = (await mint({ port: SANDBOX_PORT, expires_in_secs: 60 })).json();
    const token: string = url.split('/')[3];
    const code = async (t: string) => {
      const r = await call(`${base}/v1/p/${t}/`);
      assert.equal(r.headers['x-collimate-error'], r.json().error.code);
      return `${r.status} ${r.json().error.code}`;
    };
    assert.equal((await call(`${base}/v1/p/${token}/`)).status, 200);
    // Another port: the same token with its port bytes changed no longer verifies.
    const raw = Buffer.from(token, 'base64url');
    raw.writeUInt16BE(SANDBOX_PORT + 1, 7);
    assert.equal(await code(raw.toString('base64url')), '401 unauthorized');
    const flipped = token.slice(0, 20) + (token[20] === 'A' ? 'B' : 'A') + token.slice(21);
    for (const t of [flipped, token.slice(0, -1), token + 'A', 'x', '%00', token.slice(0, -2) + '==']) assert.equal(await code(t), '401 unauthorized', t);
    // Another server's key.
    const g = await fixture();
    try {
      const gk = g.key('acme', 'pro');
      const gid = (await g.req('createSandbox', { url: '/v1/sandboxes', key: gk, body: { template: 'base' } })).json().id;
      const foreign = (await g.req('createPortUrl', { url: `/v1/sandboxes/${gid}/port-urls`, key: gk, body: { port: SANDBOX_PORT } })).json().url.split('/')[3];
      assert.equal(await code(foreign), '401 unauthorized');
    } finally {
      await g.close();
    }
    clock += 61_000;
    assert.equal(await code(token), '401 url_expired');
    const ws = wsConnect(`${base}${url}`);
    await assert.rejects(ws, (e: any) => e.status === 401 && JSON.parse(e.body).error.code === 'url_expired');
    const fresh = (await mint({ port: SANDBOX_PORT })).json().url;
    await f.req('deleteSandbox', { url: `/v1/sandboxes/${id}`, key });
    assert.equal(await code(fresh.split('/')[3]), '404 sandbox_not_found');
  });

  test('the signing key is a 0600 file beside the database, and a restarted server honours its URLs', async () => {
    const keyFile = join(dirname(f.dbPath), 'port-urls.key');
    assert.equal(statSync(keyFile).mode & 0o777, 0o600);
    assert.equal(statSync(keyFile).size, 32);
    const k = f.key('acme', 'pro');
    const sid = (await f.req('createSandbox', { url: '/v1/sandboxes', key: k, body: { template: 'python' } })).json().id;
    const url = (await mint({ port: SANDBOX_PORT }, k, sid)).json().url;
    const again = await serverOn(f.svc, f.db, { now: () => clock });
    try {
      const againBase = await again.app.listen({ host: '127.0.0.1', port: 0 });
      const r = await call(`${againBase}${url}`);
      assert.equal(r.status, 200, r.body.toString());
    } finally {
      await again.shutdown(100);
      again.tenants.close();
    }
  });
});

describe('egress at create', () => {
  let f: Fixture;
  let key: string;
  before(async () => {
    f = await fixture({ fake: { templateEgress: { node: { domains: ['*.example.com', 'registry.npmjs.org'], cidrs: [], ports: [443] } } } });
    key = f.key('acme', 'pro');
  });
  after(() => f.close());
  const create = (body: unknown) => f.req('createSandbox', { url: '/v1/sandboxes', key, body });

  test('the policy is validated, normalised and shown; a fork inherits it', async () => {
    let r = await create({ template: 'python' });
    assert.equal(r.json().egress, 'allow', "the template's by default");
    r = await create({ template: 'python', egress: 'none' });
    assert.equal(r.json().egress, 'none');
    r = await create({ template: 'python', egress: { domains: ['PyPI.org.', 'pypi.org', '*.pythonhosted.org'], ports: [443, 80, 443] } });
    assert.equal(r.statusCode, 201, r.body);
    assert.deepEqual(r.json().egress, { domains: ['*.pythonhosted.org', 'pypi.org'], cidrs: [], ports: [80, 443] });
    const child = (await f.req('forkSandbox', { url: `/v1/sandboxes/${r.json().id}/fork`, key, body: { count: 1 } })).json().sandboxes[0];
    assert.deepEqual(child.egress, r.json().egress);
  });

  test('bad policies are 400 naming the problem', async () => {
    const cases: Array<[unknown, RegExp]> = [
      ['some', /must be "none", "allow"|is not a policy/],
      [{}, /empty allowlist/],
      [{ domains: ['-bad-.com'] }, /not a domain name/],
      [{ cidrs: ['10.0.0.1/8'] }, /host bits set; did you mean 10\.0\.0\.0\/8/],
      [{ cidrs: ['::1/128'] }, /IPv6/],
      [{ ports: [0] }, /port/],
      [{ hosts: ['x'] }, /unknown key "hosts"/],
      [{ domains: 'pypi.org' }, /array/],
      [['allow'], /must be/],
      [7, /must be/],
    ];
    for (const [egress, re] of cases) {
      const r = await create({ template: 'python', egress });
      assertErrorBody(r, 'validation_error');
      assert.match(r.json().error.message, re, JSON.stringify(egress));
      assert.match(r.json().error.message, /body\.egress/);
    }
  });

  test('a blocked range is 403 egress_forbidden naming it, even where the template allows everything; one the operator opened is fine', async () => {
    for (const [cidr, blocked] of [['169.254.169.254/32', '169.254.0.0/16'], ['10.0.0.0/8', '10.0.0.0/8'], ['192.168.1.0/24', '192.168.0.0/16'], ['0.0.0.0/0', '0.0.0.0/8']]) {
      const r = await create({ template: 'python', egress: { cidrs: [cidr] } });
      assertErrorBody(r, 'egress_forbidden');
      assert.ok(r.json().error.message.includes(`${cidr} reaches into ${blocked}`), r.body);
      assert.equal(r.json().error.blocked, blocked);
    }
    f.svc.openCidrs = ['10.20.0.0/16'];
    try {
      assert.equal((await create({ template: 'python', egress: { cidrs: ['10.20.3.0/24'] } })).statusCode, 201);
      assertErrorBody(await create({ template: 'python', egress: { cidrs: ['10.0.0.0/8'] } }), 'egress_forbidden');
      assert.match((await create({ template: 'python', egress: { cidrs: ['169.254.169.254/32'] } })).json().error.message, /never opened/);
    } finally {
      f.svc.openCidrs = [];
    }
  });

  test('wider than the template is 403 egress_forbidden; narrower is fine', async () => {
    for (const egress of ['allow', { domains: ['evil.com'], ports: [443] }, { domains: ['api.example.com'] }, { domains: ['api.example.com'], ports: [80] }]) {
      const r = await create({ template: 'node', egress });
      assertErrorBody(r, 'egress_forbidden');
    }
    const r = await create({ template: 'node', egress: { domains: ['api.example.com'], ports: [443] } });
    assert.equal(r.statusCode, 201, r.body);
    assert.equal((await create({ template: 'node', egress: 'none' })).statusCode, 201);
  });

  test('PUT /v1/sandboxes/{id}/egress replaces the policy of a running or suspended sandbox, by the same rules as at create', async () => {
    const id = (await create({ template: 'node', egress: 'none' })).json().id;
    const put = (egress: unknown) => f.req('setSandboxEgress', { url: `/v1/sandboxes/${id}/egress`, method: 'PUT', key, body: { egress } });
    let r = await put({ domains: ['registry.npmjs.org'], ports: [443] });
    assert.equal(r.statusCode, 200, r.body);
    assert.deepEqual(r.json().egress, { domains: ['registry.npmjs.org'], cidrs: [], ports: [443] });
    assert.equal(f.svc.calls.filter((c) => c === 'setEgress').length, 1, 'the host applied it');
    for (const wider of ['allow', { domains: ['evil.com'], ports: [443] }]) assertErrorBody(await put(wider), 'egress_forbidden');
    assertErrorBody(await put({ cidrs: ['169.254.169.254/32'] }), 'egress_forbidden');
    assertErrorBody(await put('some'), 'validation_error');
    assert.deepEqual((await f.req('getSandbox', { url: `/v1/sandboxes/${id}`, key })).json().egress, { domains: ['registry.npmjs.org'], cidrs: [], ports: [443] }, 'a refused change leaves the policy');
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${id}/suspend`, key });
    assert.equal((await put('none')).json().egress, 'none', 'suspended: applied when it resumes');
    assertErrorBody(await f.req('setSandboxEgress', { url: '/v1/sandboxes/sbx_000000000000/egress', method: 'PUT', key, body: { egress: 'none' } }), 'sandbox_not_found');
  });
});
