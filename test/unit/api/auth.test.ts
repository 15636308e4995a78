import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { ROUTES } from '../../../src/api/routes.js';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

const SOME_ID = 'sbx_0123456789ab';
const urlOf = (path: string, id = SOME_ID) =>
  path.replace(':id', path.startsWith('/v1/templates') ? 'python' : id).replace(':port', '8000').replace(':pid', '100')
    .replace(':context', '00000000-0000-4000-8000-000000000000').replace(/\*$/, 'index.html');
/** The ports proxy answers any method; GET stands for all of them. */
const methodOf = (m: string) => (m === 'ANY' ? 'GET' : m);

describe('authentication', () => {
  let f: Fixture;
  before(async () => (f = await fixture()));
  after(() => f.close());

  test('every authenticated endpoint is 401 without a valid key', async () => {
    const revoked = f.api.keys.create({ tenant: 'gone' });
    f.api.keys.revoke(revoked.record.id);
    const headers: Array<Record<string, string>> = [
      {},
      { authorization: 'Basic dXNlcjpwYXNz' },
      { authorization: 'Bearer' },
      { authorization: 'Bearer clm_notakey' },
      { authorization: 'Bearer clm_' + 'A'.repeat(40) },
      { authorization: `Bearer ${revoked.key}` },
    ];
    for (const route of ROUTES.filter((r) => r.auth)) {
      for (const h of headers) {
        const r = await f.req(route.operationId, { method: methodOf(route.method), url: urlOf(route.path), headers: h, body: route.bodyKind === 'json' ? {} : undefined });
        assertErrorBody(r, 'unauthorized');
      }
    }
  });

  test('the key is checked before the body is read: a request without a valid one is answered while its body is still coming', async () => {
    const base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = new URL(base);
    // REST (JSON and streamed bodies), E2B's API and MCP alike.
    for (const path of ['/v1/sandboxes', `/v1/sandboxes/sbx_000000000000/files?path=/x`, '/e2b/api/sandboxes', '/mcp']) {
      const method = path.includes('files') ? 'PUT' : 'POST';
      const socket = connect(Number(port), '127.0.0.1');
      // Headers announce 8 MiB; 1 KiB is sent and the rest never comes.
      socket.write(`${method} ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer clm_${'A'.repeat(40)}\r\ncontent-type: ${method === 'PUT' ? 'application/octet-stream' : 'application/json'}\r\ncontent-length: ${8 * 1024 * 1024}\r\n\r\n${'{'.repeat(1024)}`);
      const answer = await new Promise<string>((resolve, reject) => {
        let got = '';
        const bound = setTimeout(() => reject(new Error(`no answer to ${method} ${path} before its body came`)), 10_000);
        socket.on('data', (d) => {
          got += d;
          if (got.includes('\r\n\r\n') && /"(error_)?code"/.test(got)) { clearTimeout(bound); resolve(got); }
        });
        socket.on('error', reject);
      });
      socket.destroy();
      assert.match(answer, /^HTTP\/1\.1 401 /);
      assert.match(answer, /connection: close/i);
      assert.match(answer, /"(error_)?code":"unauthorized"/, `${method} ${path}: ${answer}`);
    }
  });

  test('public endpoints need no key', async () => {
    for (const op of ['health', 'metrics', 'getOpenApi']) {
      const route = ROUTES.find((r) => r.operationId === op)!;
      const r = await f.req(op, { url: route.path });
      assert.equal(r.statusCode, 200, op);
    }
  });

  test('the scheme is case-insensitive and the key is exact', async () => {
    const key = f.key('acme');
    let r = await f.req('listSandboxes', { url: '/v1/sandboxes', headers: { authorization: `bearer ${key}` } });
    assert.equal(r.statusCode, 200);
    // Change the last character to a different one (a fixed 'x' matched keys ending in x: 1 run in 62).
    const wrong = key.slice(0, -1) + (key.endsWith('x') ? 'y' : 'x');
    r = await f.req('listSandboxes', { url: '/v1/sandboxes', headers: { authorization: `Bearer ${wrong}` } });
    assertErrorBody(r, 'unauthorized');
  });
});

describe('tenant isolation', () => {
  let f: Fixture;
  let a: string;
  let b: string;
  const ids: { running: string; suspended: string; child: string } = {} as any;
  before(async () => {
    f = await fixture();
    a = f.key('tenant-a', 'pro');
    b = f.key('tenant-b', 'pro');
    const mk = async () => (await f.req('createSandbox', { url: '/v1/sandboxes', key: a, body: { template: 'base', labels: { owner: 'a' } } })).json().id;
    ids.running = await mk();
    ids.suspended = await mk();
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${ids.suspended}/suspend`, key: a });
    ids.child = (await f.req('forkSandbox', { url: `/v1/sandboxes/${ids.running}/fork`, key: a, body: { count: 1 } })).json().sandboxes[0].id;
    await f.req('writeFile', { url: `/v1/sandboxes/${ids.running}/files?path=/secret`, key: a, rawBody: 'a-only' });
  });
  after(() => f.close());

  test("tenant B gets 404 sandbox_not_found on every one of A's ids on every endpoint", async () => {
    const sandboxRoutes = ROUTES.filter((r) => r.params?.id === 'sandbox');
    assert.ok(sandboxRoutes.length >= 8);
    for (const id of Object.values(ids)) {
      for (const route of sandboxRoutes) {
        const body = {
          execSandbox: { command: 'echo hi' }, forkSandbox: { count: 1 }, createPortUrl: { port: 8000 }, setSandboxTimeout: { timeout_secs: 1 }, setSandboxEgress: { egress: 'allow' },
          startProcess: { command: 'sleep 9' }, signalProcess: { signal: 'SIGTERM' }, resizeProcess: { cols: 80, rows: 24 },
          makeDirectory: { path: '/stolen' }, removePath: { path: '/secret' }, renamePath: { from: '/secret', to: '/stolen' },
          restoreSandbox: { snapshot: 'snap_0000000000000000' }, createSnapshot: {}, runCode: { code: '1' },
        }[route.operationId];
        const query = route.path.endsWith('/files') || (route.path.includes('/fs/') && route.method === 'GET') ? '?path=/secret' : '';
        for (const accept of route.sse ? ['application/json', 'text/event-stream'] : ['application/json']) {
          const r = await f.req(route.operationId, {
            method: methodOf(route.method),
            url: urlOf(route.path, id) + query,
            key: b,
            body,
            rawBody: route.bodyKind === 'raw' ? 'overwrite' : undefined,
            headers: { accept, 'idempotency-key': `k-${id}-${route.operationId}` },
          });
          assertErrorBody(r, 'sandbox_not_found');
          assert.ok(!r.body.includes('tenant-a'), 'no owner information leaks');
        }
      }
    }
    // A's sandboxes are untouched.
    const r = await f.req('getSandbox', { url: `/v1/sandboxes/${ids.running}`, key: a });
    assert.equal(r.json().state, 'running');
    assert.equal(r.json().exec_count, 0);
    assert.equal(r.json().children.length, 1);
    assert.equal((await f.req('getSandbox', { url: `/v1/sandboxes/${ids.suspended}`, key: a })).json().state, 'suspended');
    const file = await f.req('readFile', { url: `/v1/sandboxes/${ids.running}/files?path=/secret`, key: a });
    assert.equal(file.body, 'a-only');
  });

  test("A's sandboxes never show in B's list, under any filter or cursor", async () => {
    await f.req('createSandbox', { url: '/v1/sandboxes', key: b, body: { template: 'base', labels: { owner: 'a' } } });
    for (const q of ['', '?state=running', '?state=suspended', '?label=owner=a', '?limit=1', `?after=sbx_000000000000`]) {
      const r = await f.req('listSandboxes', { url: `/v1/sandboxes${q}`, key: b });
      for (const s of r.json().sandboxes) assert.ok(!Object.values(ids).includes(s.id), `leak via ${q}`);
    }
    const all = (await f.req('listSandboxes', { url: '/v1/sandboxes', key: b })).json().sandboxes;
    assert.equal(all.length, 1);
    const mine = (await f.req('listSandboxes', { url: '/v1/sandboxes', key: a })).json().sandboxes;
    assert.equal(mine.length, 3);
  });

  test("B's usage does not include A's sandboxes", async () => {
    const r = await f.req('getUsage', { url: '/v1/usage', key: b });
    for (const s of r.json().sandboxes) assert.ok(!Object.values(ids).includes(s.id));
  });

  test('idempotency keys are per tenant', async () => {
    const body = { template: 'base' };
    const ra = await f.req('createSandbox', { url: '/v1/sandboxes', key: a, body, headers: { 'idempotency-key': 'shared-key' } });
    const rb = await f.req('createSandbox', { url: '/v1/sandboxes', key: b, body, headers: { 'idempotency-key': 'shared-key' } });
    assert.equal(ra.statusCode, 201);
    assert.equal(rb.statusCode, 201);
    assert.notEqual(ra.json().id, rb.json().id);
    assert.equal(rb.headers['idempotent-replayed'], undefined);
  });
});
