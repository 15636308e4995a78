/**
 * The SDKs' networking surface against a real API server on the fake service (whose portTarget
 * points at a server this test starts): create with egress, ports(), signed port URLs, requests to a
 * sandbox port, and the new error classes. The Python half runs python/test_ports.py.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { fileURLToPath } from 'node:url';
import { fixture, type Fixture } from '../api/helpers.js';
import { Collimate, EgressForbiddenError, InvalidStateError, NetworkUnavailableError, NotFoundError, PortUnreachableError, TierForbiddenError, ValidationError } from '../../../src/sdk/index.js';

let f: Fixture;
let base: string;
let app: Server;
const PORT = 8000;

before(async () => {
  f = await fixture({ fake: { templateEgress: { node: { domains: ['registry.npmjs.org'], cidrs: [], ports: [443] } } } });
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  // The "sandbox's" server: echoes method, path and body; 404 on /missing.
  app = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      res.writeHead(req.url === '/missing' ? 404 : 200, { 'content-type': 'application/json', 'x-app': 'yes' });
      res.end(JSON.stringify({ method: req.method, url: req.url, body: Buffer.concat(chunks).toString(), auth: req.headers.authorization ?? null }));
    });
  });
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', r));
  f.svc.portMap.set(PORT, (app.address() as { port: number }).port);
  f.svc.portMap.set(PORT + 1, 1); // nothing listens there
});
after(async () => {
  await f.close();
  app.closeAllConnections();
  await new Promise((r) => app.close(r));
});

test('TypeScript SDK: egress at create, ports(), portUrl(), fetch() to a sandbox port, and the new error classes', async () => {
  const client = new Collimate({ baseUrl: base, apiKey: f.key('ts-sdk', 'pro') });
  await using sb = await client.sandboxes.create({ template: 'python', egress: { domains: ['PyPI.org'], ports: [443] } });
  assert.deepEqual(sb.egress, { domains: ['pypi.org'], cidrs: [], ports: [443] });
  await assert.rejects(client.sandboxes.create({ template: 'node', egress: 'allow' }), (e: unknown) => e instanceof EgressForbiddenError && e instanceof TierForbiddenError && (e as EgressForbiddenError).status === 403);
  await assert.rejects(client.sandboxes.create({ template: 'python', egress: { domains: ['no spaces.com'] } }), ValidationError);

  f.svc.listen(sb.id, [PORT]);
  assert.deepEqual(await sb.ports(), [{ port: PORT, protocol: 'tcp', url: `${base}/v1/sandboxes/${sb.id}/ports/${PORT}/` }]);

  const r = await sb.fetch(PORT, '/items?x=1', { method: 'POST', body: 'payload', headers: { 'content-type': 'text/plain' } });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-app'), 'yes');
  assert.deepEqual(await r.json(), { method: 'POST', url: '/items?x=1', body: 'payload', auth: null });
  const missing = await sb.fetch(PORT, 'missing');
  assert.equal(missing.status, 404, "the app's own 404 is an answer, not an error");
  await assert.rejects(sb.fetch(PORT + 1, '/'), (e: unknown) => e instanceof PortUnreachableError && (e as PortUnreachableError).code === 'port_unreachable');
  f.svc.networkUnavailable = true;
  await assert.rejects(sb.fetch(PORT, '/'), (e: unknown) => e instanceof NetworkUnavailableError && e instanceof InvalidStateError);
  f.svc.networkUnavailable = false;

  const url = await sb.portUrl(PORT, { expiresInSecs: 120 });
  assert.match(url, new RegExp(`^${base}/v1/p/[A-Za-z0-9_-]+/$`));
  const viaUrl = await fetch(url + 'open?y=2');
  assert.deepEqual(await viaUrl.json(), { method: 'GET', url: '/open?y=2', body: '', auth: null });
  await assert.rejects(sb.portUrl(0), ValidationError);

  // Public ports: a plain fetch with no key reaches the port; the port Host is what the server sees.
  await using pub = await client.sandboxes.create({ template: 'python', publicPorts: true, portHost: 'app.test:${PORT}' });
  assert.deepEqual([pub.publicPorts, pub.portHost, sb.publicPorts, sb.portHost], [true, 'app.test:${PORT}', false, null]);
  const open = await fetch(`${base}/v1/sandboxes/${pub.id}/ports/${PORT}/hi`);
  assert.deepEqual(await open.json(), { method: 'GET', url: '/hi', body: '', auth: null });
  assert.equal((await fetch(`${base}/v1/sandboxes/${sb.id}/ports/${PORT}/hi`)).status, 401, 'without public ports a key is needed');
  await assert.rejects(client.sandboxes.create({ template: 'python', portHost: 'no spaces' }), ValidationError);

  const other = new Collimate({ baseUrl: base, apiKey: f.key('ts-sdk-other', 'pro') });
  const foreign = await other.sandboxes.create({ template: 'python' });
  await assert.rejects(new Collimate({ baseUrl: base, apiKey: f.key('ts-sdk', 'pro') }).sandboxes.get(foreign.id), NotFoundError);
  await foreign.delete();
});

test('Python SDK: the same surface (python/test_ports.py against this server)', async () => {
  const script = fileURLToPath(new URL('./python/test_ports.py', import.meta.url));
  const env = { ...process.env, COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: f.key('py-sdk', 'pro'), TEST_PORT: String(PORT) };
  const listen = (id: string) => f.svc.listen(id, [PORT]);
  // The script prints the sandbox id, then waits for a line on stdin once the test has "started a server" in it.
  const child = execFile('/usr/bin/python3', [script], { env, timeout: 60_000 });
  let out = '';
  child.stdout!.on('data', (c: Buffer) => {
    out += c.toString();
    const m = /^SANDBOX (sbx_[0-9a-f]{12})$/m.exec(out);
    if (m && !out.includes('#listening')) {
      out += '#listening';
      listen(m[1]);
      child.stdin!.write('go\n');
    }
  });
  let err = '';
  child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
  const code = await new Promise<number | null>((r) => child.on('close', r));
  assert.equal(code, 0, `${out}\n${err}`);
  assert.match(err, /Ran \d+ tests?[\s\S]*\nOK\s*$/);
});

