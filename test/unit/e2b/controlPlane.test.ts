/**
 * The E2B control plane driven by the unmodified `e2b` SDK (the newest pinned 2.x and an older
 * 2.x), over a real loopback listener, on the fake sandbox service. The same SDK against real VMs,
 * envd included, is test/integration/e2b.test.ts.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { createServer, request as httpRequest, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import * as e2bNew from 'e2b';
import * as e2bOld from 'e2b-2-30';
import { e2bKeyOf } from '../../../src/service/keys.js';
import { SandboxEnvStore } from '../../../src/e2b/sandboxEnv.js';
import { openDb } from '../../../src/store/db.js';
import { FAKE_SYSTEM_DISK_BYTES, FakeSandboxService } from '../../support/fakeSandboxService.js';
import { serverOn } from '../api/helpers.js';
import type { ApiServer } from '../../../src/api/server.js';

let dir: string;
let api: ApiServer;
let svc: FakeSandboxService;
let apiUrl: string;
let key: string;
let otherKey: string;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'collimate-e2b-'));
  const db = openDb(join(dir, 'collimate.db'));
  svc = new FakeSandboxService({ events: true });
  api = await serverOn(svc, db);
  await api.app.listen({ host: '127.0.0.1', port: 0 });
  apiUrl = `http://127.0.0.1:${(api.app.server.address() as AddressInfo).port}/e2b/api`;
  key = e2bKeyOf(api.keys.create({ tenant: 'acme', tier: 'pro' }).key);
  otherKey = e2bKeyOf(api.keys.create({ tenant: 'other', tier: 'pro' }).key);
});

after(async () => {
  await api.shutdown(100);
  rmSync(dir, { recursive: true, force: true });
});

const envOf = (id: string) => new SandboxEnvStore(api.tenants.db).get(id);

// The older SDK's types differ in details these calls do not touch.
for (const [version, sdk] of [['2.51', e2bNew], ['2.30', e2bOld as unknown as typeof e2bNew]] as const) {
  describe(`e2b ${version} against the control plane`, () => {
    const opts = () => ({ apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' });

    it('creates with template, metadata, envs and timeout; gets and lists it by metadata', async () => {
      const sbx = await sdk.Sandbox.create('python', { ...opts(), metadata: { run: `r-${version}` }, envs: { GREETING: 'hi' }, timeoutMs: 120_000 });
      assert.match(sbx.sandboxId, /^sbx_[0-9a-f]{12}$/);
      assert.deepEqual(envOf(sbx.sandboxId), { GREETING: 'hi' });
      const info = await sdk.Sandbox.getInfo(sbx.sandboxId, opts());
      assert.equal(info.templateId, 'python');
      assert.equal(info.state, 'running');
      assert.deepEqual(info.metadata, { run: `r-${version}` });
      const endsIn = info.endAt.getTime() - Date.now();
      assert.ok(endsIn > 100_000 && endsIn <= 120_000, `ends in ${endsIn} ms`);

      const paginator = sdk.Sandbox.list({ ...opts(), query: { metadata: { run: `r-${version}` } } });
      const items = await paginator.nextItems();
      assert.deepEqual(items.map((s) => s.sandboxId), [sbx.sandboxId]);
      const none = await sdk.Sandbox.list({ ...opts(), query: { metadata: { run: 'nobody' } } }).nextItems();
      assert.equal(none.length, 0);
      await sdk.Sandbox.kill(sbx.sandboxId, opts());
    });

    it('sets the timeout as a lease from now', async () => {
      const sbx = await sdk.Sandbox.create('python', { ...opts(), timeoutMs: 60_000 });
      await sbx.setTimeout(600_000);
      const info = await sdk.Sandbox.getInfo(sbx.sandboxId, opts());
      const endsIn = info.endAt.getTime() - Date.now();
      assert.ok(endsIn > 590_000 && endsIn <= 600_000, `ends in ${endsIn} ms`);
      await sbx.kill();
    });

    it('pauses (then says it was already paused), connects to resume, and lists the paused state', async () => {
      const sbx = await sdk.Sandbox.create('python', { ...opts(), metadata: { pause: version } });
      assert.equal(await sdk.Sandbox.betaPause(sbx.sandboxId, opts()), true);
      assert.equal(svc.get(sbx.sandboxId).state, 'suspended');
      assert.equal(await sdk.Sandbox.betaPause(sbx.sandboxId, opts()), false);
      const listed = await sdk.Sandbox.list({ ...opts(), query: { metadata: { pause: version }, state: ['paused'] } }).nextItems();
      assert.deepEqual(listed.map((s) => [s.sandboxId, s.state]), [[sbx.sandboxId, 'paused']]);
      const again = await sdk.Sandbox.connect(sbx.sandboxId, opts());
      assert.equal(again.sandboxId, sbx.sandboxId);
      assert.equal(svc.get(sbx.sandboxId).state, 'running');
      // Connecting to a running one leaves it running.
      await sdk.Sandbox.connect(sbx.sandboxId, opts());
      assert.equal(svc.get(sbx.sandboxId).state, 'running');
      await sbx.kill();
    });

    it('kills: true once, then false; a deleted sandbox takes its envs with it', async () => {
      const sbx = await sdk.Sandbox.create('python', { ...opts(), envs: { A: '1' } });
      assert.equal(await sdk.Sandbox.kill(sbx.sandboxId, opts()), true);
      assert.equal(await sdk.Sandbox.kill(sbx.sandboxId, opts()), false);
      assert.deepEqual(envOf(sbx.sandboxId), {});
    });

    it('surfaces errors as the SDK error classes: a bad key, a missing sandbox, another tenant\'s sandbox, a bad template', async () => {
      await assert.rejects(sdk.Sandbox.create('python', { ...opts(), apiKey: 'e2b_' + '0'.repeat(80) }), (e: Error) => e instanceof sdk.AuthenticationError);
      await assert.rejects(sdk.Sandbox.getInfo('sbx_000000000000', opts()), (e: Error) => e instanceof sdk.NotFoundError || e.name === 'SandboxNotFoundError');
      const mine = await sdk.Sandbox.create('python', opts());
      await assert.rejects(sdk.Sandbox.getInfo(mine.sandboxId, { ...opts(), apiKey: otherKey }), (e: Error) => e instanceof sdk.NotFoundError || e.name === 'SandboxNotFoundError');
      await assert.rejects(sdk.Sandbox.create('no-such-template', opts()), (e: Error) => e instanceof sdk.SandboxError && /No template no-such-template/.test(e.message));
      await mine.kill();
    });
  });
}

describe('e2b 2.51 fork', () => {
  it('forks into count children that inherit the envs, each with its own timeout and envd token', async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const parent = await e2bNew.Sandbox.create('python', { ...opts, envs: { SEED: '7' } });
    const children = await e2bNew.Sandbox.fork(parent.sandboxId, { ...opts, count: 2, timeoutMs: 300_000 });
    assert.equal(children.length, 2);
    for (const child of children) {
      assert.ok(!(child instanceof Error), String(child));
      const c = child as InstanceType<typeof e2bNew.Sandbox>;
      assert.notEqual(c.sandboxId, parent.sandboxId);
      assert.deepEqual(envOf(c.sandboxId), { SEED: '7' });
      const info = await e2bNew.Sandbox.getInfo(c.sandboxId, opts);
      const endsIn = info.endAt.getTime() - Date.now();
      assert.ok(endsIn > 290_000 && endsIn <= 300_000, `ends in ${endsIn} ms`);
    }
    assert.equal(svc.get(parent.sandboxId).children.length, 2);
  });

  it('takes the fork count limit every door has (64): 65 is a 400 from E2B\'s door with REST\'s words, before any child starts', async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const parent = await e2bNew.Sandbox.create('python', opts);
    const fork = (count: number) => api.app.inject({ method: 'POST', url: `/e2b/api/sandboxes/${parent.sandboxId}/fork`, headers: { 'x-api-key': key, 'content-type': 'application/json' }, payload: JSON.stringify({ count }) });
    const over = await fork(65);
    assert.equal(over.statusCode, 400);
    assert.equal(over.json().error_code, 'validation_error');
    assert.equal(over.json().message, 'count must be a whole number from 1 to 64, not 65.');
    assert.equal(svc.get(parent.sandboxId).children.length, 0);
    const rest = await api.app.inject({ method: 'POST', url: `/v1/sandboxes/${parent.sandboxId}/fork`, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, payload: JSON.stringify({ count: 65 }) });
    assert.equal(rest.statusCode, 400);
    assert.match(rest.json().error.message, /count/);
    await parent.kill();
  });
});

describe('e2b 2.51 metrics', () => {
  it('answers the reading now only for a time range that holds now', async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const sbx = await e2bNew.Sandbox.create('python', opts);
    const now = Date.now();
    assert.equal((await sbx.getMetrics()).length, 1);
    assert.equal((await sbx.getMetrics({ start: new Date(now - 60_000), end: new Date(now + 60_000) })).length, 1);
    assert.equal((await sbx.getMetrics({ start: new Date(now - 3_600_000), end: new Date(now - 1_800_000) })).length, 0, 'a range before the sandbox holds nothing');
    await sbx.kill();
  });

  it("reports the guest's disk use and size from the samples (df /), and 0 used of the disk size where the guest cannot tell", async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const engine = svc as FakeSandboxService & { vmmUsage?: (ids: readonly string[]) => Map<string, { cpuSecs: number; rssBytes: number }> };
    engine.vmmUsage = (ids) => new Map(ids.map((id) => [id, { cpuSecs: 1, rssBytes: 100 * 1048576 }]));
    try {
      const sbx = await e2bNew.Sandbox.create('python', opts);
      await svc.writeFile(sbx.sandboxId, '/root/twenty', Buffer.alloc(20 * 1048576));
      const [m] = await sbx.getMetrics();
      assert.equal(m.diskUsed, FAKE_SYSTEM_DISK_BYTES + 20 * 1048576);
      assert.equal(m.diskTotal, svc.get(sbx.sandboxId).disk_mib * 1048576);
      assert.equal(m.memUsed, 100 * 1048576);
      await sbx.kill();

      const old = await e2bNew.Sandbox.create('python', opts);
      svc.diskUnreadable.add(old.sandboxId);
      const [n] = await old.getMetrics();
      assert.deepEqual([n.diskUsed, n.diskTotal], [0, svc.get(old.sandboxId).disk_mib * 1048576]);
      await old.kill();
    } finally {
      delete engine.vmmUsage;
    }
  });
});

describe('E2B logs, v1 and v2', () => {
  const get = (path: string, k = key) => api.app.inject({ method: 'GET', url: `/e2b/api${path}`, headers: { 'x-api-key': k } });
  const rest = (id: string, body: object) =>
    api.app.inject({ method: 'POST', url: `/v1/sandboxes/${id}/exec`, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, payload: JSON.stringify(body) });

  it("answer the sandbox's log in E2B's shapes, filtered as asked, only to its tenant", async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const sbx = await e2bNew.Sandbox.create('python', opts);
    const id = sbx.sandboxId;
    await rest(id, { command: 'echo from-e2b' });
    await rest(id, { command: 'exit 5' });

    const v2 = await get(`/v2/sandboxes/${id}/logs`);
    assert.equal(v2.statusCode, 200, v2.body);
    const entries = v2.json().logs as Array<{ timestamp: string; level: string; message: string; fields: Record<string, string> }>;
    assert.deepEqual(entries.map((e) => e.fields.event), ['lifecycle', 'exec', 'exec']);
    for (const e of entries) {
      assert.deepEqual(Object.keys(e).sort(), ['fields', 'level', 'message', 'timestamp'], "E2B's SandboxLogEntry");
      assert.ok(['debug', 'info', 'warn', 'error'].includes(e.level));
      assert.equal(new Date(e.timestamp).toISOString(), e.timestamp);
      for (const v of Object.values(e.fields)) assert.equal(typeof v, 'string');
    }
    assert.deepEqual((await get(`/v2/sandboxes/${id}/logs?level=warn`)).json().logs.map((e: { fields: { command: string } }) => e.fields.command), ['exit 5']);
    assert.deepEqual((await get(`/v2/sandboxes/${id}/logs?search=from-e2b&direction=backward`)).json().logs.length, 1);
    assert.deepEqual((await get(`/v2/sandboxes/${id}/logs?direction=backward&limit=1`)).json().logs[0].fields.command, 'exit 5');
    assert.deepEqual((await get(`/v2/sandboxes/${id}/logs?cursor=${Date.parse(entries[2].timestamp) + 1}`)).json(), { logs: [] });
    assert.deepEqual((await get(`/v2/sandboxes/${id}/logs?limit=0`)).json(), { logs: [] }, "E2B's limit 0");

    // v1 (deprecated): from `start`, oldest first, as JSON lines (which E2B's CLI parses) and as entries.
    const v1 = await get(`/sandboxes/${id}/logs?start=0&limit=2`);
    assert.equal(v1.statusCode, 200, v1.body);
    const body = v1.json();
    assert.deepEqual(body.logEntries, entries.slice(0, 2));
    assert.equal(body.logs.length, 2);
    const line = JSON.parse(body.logs[1].line);
    assert.equal(body.logs[1].timestamp, entries[1].timestamp);
    assert.equal(line.level, 'info');
    assert.equal(line.logger, 'collimate');
    assert.equal(line.message, entries[1].message);
    assert.equal(line.command, 'echo from-e2b');

    // Bad values: 400 in E2B's shape. Another tenant's sandbox, or none: E2B's 404.
    for (const q of ['level=fatal', 'direction=sideways', 'limit=1001', 'cursor=-5', `search=${'s'.repeat(257)}`]) {
      const bad = await get(`/v2/sandboxes/${id}/logs?${q}`);
      assert.equal(bad.statusCode, 400, q);
      assert.deepEqual([bad.json().code, bad.json().error_code], [400, 'validation_error']);
    }
    assert.equal((await get(`/sandboxes/${id}/logs?start=soon`)).statusCode, 400);
    for (const path of [`/v2/sandboxes/${id}/logs`, `/sandboxes/${id}/logs`]) {
      const foreign = await get(path, otherKey);
      assert.equal(foreign.statusCode, 404);
      assert.deepEqual([foreign.json().code, foreign.json().error_code], [404, 'sandbox_not_found']);
      assert.ok(!foreign.body.includes('from-e2b'));
    }
    assert.equal((await get('/v2/sandboxes/sbx_000000000000/logs')).statusCode, 404);
    await sbx.kill();
    assert.equal((await get(`/v2/sandboxes/${id}/logs`)).statusCode, 404, 'gone with the sandbox');
  });
});

describe('e2b 2.51 network', () => {
  it("updateNetwork replaces the sandbox's egress: deny all with an allowOut list is an allowlist, nothing is everything, some denials are a denylist less what allowOut names", async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const sbx = await e2bNew.Sandbox.create('python', opts);
    const egress = async () => ((await (await fetch(`${apiUrl.replace('/e2b/api', '')}/v1/sandboxes/${sbx.sandboxId}`, { headers: { authorization: `Bearer ${key}` } })).json()) as { egress: unknown }).egress;
    await sbx.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: ['1.1.1.1', '93.184.0.0/16', 'example.com'] } as never);
    assert.deepEqual(await egress(), { cidrs: ['1.1.1.1/32', '93.184.0.0/16'], domains: ['example.com'], ports: [] });
    await sbx.updateNetwork({ allowInternetAccess: false } as never);
    assert.equal(await egress(), 'none');
    await sbx.updateNetwork({} as never);
    assert.equal(await egress(), 'allow', 'omitting every field clears the rules');
    await sbx.updateNetwork({ denyOut: ['8.8.8.8', '203.0.113.0/24'] } as never);
    assert.deepEqual(await egress(), { deny: ['203.0.113.0/24', '8.8.8.8/32'] }, 'every public address but these');
    await sbx.updateNetwork({ denyOut: ['8.8.8.8', '203.0.113.0/24'], allowOut: ['8.8.8.8'] } as never);
    assert.deepEqual(await egress(), { deny: ['203.0.113.0/24'] }, 'allowOut wins over denyOut, as on E2B');
    await sbx.updateNetwork({ denyOut: ['8.8.8.8'], allowOut: ['8.8.8.8/32'] } as never);
    assert.equal(await egress(), 'allow', 'nothing left denied');
    // What a denylist cannot say is refused, saying why, and the policy is left as it was.
    await assert.rejects(sbx.updateNetwork({ denyOut: ['203.0.113.0/24'], allowOut: ['203.0.113.7'] } as never), /203\.0\.113\.7\/32 lies inside a denied range/);
    await assert.rejects(sbx.updateNetwork({ denyOut: ['example.com'] } as never), /is a name/);
    await assert.rejects(sbx.updateNetwork({ denyOut: ['8.8.8.8'], allowOut: ['example.com'] } as never), /next to a denyOut of some addresses/);
    await assert.rejects(sbx.updateNetwork({ denyOut: ['8.8.8.8/33'] } as never), /network\.denyOut/);
    assert.equal(await egress(), 'allow');
    // Created with a network config too.
    const limited = await e2bNew.Sandbox.create('python', { ...opts, network: { denyOut: ['0.0.0.0/0'], allowOut: ['example.org'] } } as never);
    assert.equal((await e2bNew.Sandbox.getInfo(limited.sandboxId, opts)).sandboxId, limited.sandboxId);
    for (const s of [sbx, limited]) await s.kill();
  });
});

describe('e2b 2.51 network: allowPublicTraffic and maskRequestHost', () => {
  const PORT = 8080;
  let upstream: Server;
  before(async () => {
    // The sandbox's server: answers with the Host it saw and whether a token reached it.
    upstream = createServer((req, res) => res.end(JSON.stringify({ host: req.headers.host, token: req.headers['e2b-traffic-access-token'] ?? null })));
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    svc.portMap.set(PORT, (upstream.address() as AddressInfo).port);
  });
  after(async () => {
    svc.portMap.delete(PORT);
    upstream.closeAllConnections();
    await new Promise((r) => upstream.close(r));
  });
  /** A request by getHost's name (`<port>-<id>.<domain>`) to the server, as a browser with E2B_DOMAIN pointed here sends it. */
  const byHost = (host: string, headers: Record<string, string> = {}) => new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = httpRequest(apiUrl.replace('/e2b/api', '/'), { headers: { ...headers, host } }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode!, body }));
    });
    req.on('error', reject);
    req.end();
  });

  it("allowPublicTraffic: true opens the sandbox's ports without the traffic token, maskRequestHost is the Host its server sees, getInfo answers both", async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const open = await e2bNew.Sandbox.create('python', { ...opts, network: { allowPublicTraffic: true, maskRequestHost: 'custom-host.example.com:${PORT}' } });
    const host = `${PORT}-${open.sandboxId}.localhost`;
    assert.ok(open.getHost(PORT).startsWith(`${PORT}-${open.sandboxId}.`));
    const r = await byHost(host);
    assert.equal(r.status, 200, r.body);
    assert.deepEqual(JSON.parse(r.body), { host: `custom-host.example.com:${PORT}`, token: null });
    const info = await e2bNew.Sandbox.getInfo(open.sandboxId, opts);
    assert.equal(info.network?.allowPublicTraffic, true);
    assert.equal(info.network?.maskRequestHost, 'custom-host.example.com:${PORT}');
    const rest = (await (await fetch(`${apiUrl.replace('/e2b/api', '')}/v1/sandboxes/${open.sandboxId}`, { headers: { authorization: `Bearer ${key}` } })).json()) as { public_ports: boolean; port_host: string };
    assert.deepEqual([rest.public_ports, rest.port_host], [true, 'custom-host.example.com:${PORT}']);
    // A fork keeps both.
    const [child] = await e2bNew.Sandbox.fork(open.sandboxId, { ...opts, count: 1 } as never) as unknown as e2bNew.Sandbox[];
    assert.equal(JSON.parse((await byHost(`${PORT}-${child.sandboxId}.localhost`)).body).host, `custom-host.example.com:${PORT}`);

    // allowPublicTraffic: false (and the default): the traffic token is needed, and the server sees localhost:PORT.
    const closed = await e2bNew.Sandbox.create('python', { ...opts, network: { allowPublicTraffic: false } });
    assert.equal((await byHost(`${PORT}-${closed.sandboxId}.localhost`)).status, 401);
    const withToken = await byHost(`${PORT}-${closed.sandboxId}.localhost`, { 'e2b-traffic-access-token': closed.trafficAccessToken! });
    assert.deepEqual(JSON.parse(withToken.body), { host: `localhost:${PORT}`, token: null }, 'the token stays at the proxy');
    assert.equal((await e2bNew.Sandbox.getInfo(closed.sandboxId, opts)).network?.allowPublicTraffic, false);

    // Bad values are E2B's 400 naming the field; an update cannot change them.
    await assert.rejects(e2bNew.Sandbox.create('python', { ...opts, network: { maskRequestHost: 'evil\r\nX-Injected: 1' } }), /line breaks/);
    await assert.rejects(e2bNew.Sandbox.create('python', { ...opts, network: { maskRequestHost: 'not a host' } }), /port_host .* is not a host/);
    await assert.rejects(e2bNew.Sandbox.create('python', { ...opts, network: { allowPublicTraffic: 'yes' } } as never), /allowPublicTraffic must be a boolean/);
    const put = await fetch(`${apiUrl}/sandboxes/${closed.sandboxId}/network`, { method: 'PUT', headers: { 'x-api-key': key, 'content-type': 'application/json' }, body: JSON.stringify({ allowPublicTraffic: true }) });
    assert.equal(put.status, 400);
    assert.equal((await byHost(`${PORT}-${closed.sandboxId}.localhost`)).status, 401, 'still closed');
    for (const s of [open, child, closed]) await s.kill();
  });
});

describe('e2b 2.51 lifecycle', () => {
  it("onTimeout 'pause' and autoResume become the sandbox's on_timeout and auto_resume, and getInfo says so", async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const paused = await e2bNew.Sandbox.create('python', { ...opts, lifecycle: { onTimeout: 'pause', autoResume: true } } as never);
    const info = await e2bNew.Sandbox.getInfo(paused.sandboxId, opts);
    assert.deepEqual((info as unknown as { lifecycle: unknown }).lifecycle, { onTimeout: 'pause', autoResume: true });
    const rest = await fetch(`${apiUrl.replace('/e2b/api', '')}/v1/sandboxes/${paused.sandboxId}`, { headers: { authorization: `Bearer ${key}` } });
    const view = (await rest.json()) as { on_timeout: string; auto_resume: boolean };
    assert.deepEqual([view.on_timeout, view.auto_resume], ['suspend', true]);
    const killed = await e2bNew.Sandbox.create('python', opts);
    assert.deepEqual((await e2bNew.Sandbox.getInfo(killed.sandboxId, opts) as unknown as { lifecycle: unknown }).lifecycle, { onTimeout: 'kill', autoResume: false });
    // A filesystem-only pause: keep_memory false, for the pause at the timeout and for a pause that does not say.
    const fsOnly = await e2bNew.Sandbox.create('python', { ...opts, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } } as never);
    const fsView = await (await fetch(`${apiUrl.replace('/e2b/api', '')}/v1/sandboxes/${fsOnly.sandboxId}`, { headers: { authorization: `Bearer ${key}` } })).json() as { on_timeout: string; keep_memory: boolean };
    assert.deepEqual([fsView.on_timeout, fsView.keep_memory], ['suspend', false]);
    assert.equal(svc.get(fsOnly.sandboxId, { tenant: 'acme' }).keep_memory, false);
    // sandbox.pause({keepMemory}) sends {memory}: false keeps only the files; the SDK's default (true) the memory too.
    await e2bNew.Sandbox.pause(fsOnly.sandboxId, { ...opts, keepMemory: false } as never);
    assert.equal(svc.get(fsOnly.sandboxId, { tenant: 'acme' }).memory_kept, false);
    // Connect with onResume 'reboot' is what such a sandbox gets anyway; one paused with its memory is refused it.
    await e2bNew.Sandbox.connect(fsOnly.sandboxId, { ...opts, onResume: 'reboot' } as never);
    assert.equal(svc.get(fsOnly.sandboxId, { tenant: 'acme' }).state, 'running');
    await e2bNew.Sandbox.pause(paused.sandboxId, opts);
    assert.equal(svc.get(paused.sandboxId, { tenant: 'acme' }).memory_kept, true);
    await assert.rejects(e2bNew.Sandbox.connect(paused.sandboxId, { ...opts, onResume: 'reboot' } as never), /paused with its memory/);
    // What E2B's API refuses, raw (the SDK refuses it before sending): without autoPause, or with autoResume.
    for (const body of [{ autoPauseMemory: false }, { autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } }, { autoPause: true, autoPauseMemory: 'no' }]) {
      const res = await fetch(`${apiUrl}/sandboxes`, { method: 'POST', headers: { 'x-api-key': key, 'content-type': 'application/json' }, body: JSON.stringify({ templateID: 'python', ...body }) });
      assert.equal(res.status, 400, JSON.stringify(body));
      assert.match(((await res.json()) as { message: string }).message, /autoPauseMemory/);
    }
    for (const s of [paused, killed, fsOnly]) await s.kill();
  });
});

describe('E2B-shaped requests the SDK never sends', () => {
  it('answers bad input with 400 and E2B\'s error shape', async () => {
    const res = await api.app.inject({ method: 'POST', url: '/e2b/api/sandboxes', headers: { 'x-api-key': key, 'content-type': 'application/json' }, payload: JSON.stringify({ templateID: 'python', envVars: { 'BAD NAME': 'x' } }) });
    assert.equal(res.statusCode, 400);
    const body = res.json();
    assert.equal(body.code, 400);
    assert.equal(body.error_code, 'validation_error');
    assert.match(body.message, /not a valid variable name/);
    const auto = await api.app.inject({ method: 'POST', url: '/e2b/api/v2/sandboxes', headers: { 'x-api-key': key }, payload: JSON.stringify({ templateID: 'python', autoPause: 'yes' }) });
    assert.equal(auto.statusCode, 400);
    assert.match(auto.json().message, /autoPause must be true or false/);
    const resumeAlone = await api.app.inject({ method: 'POST', url: '/e2b/api/v2/sandboxes', headers: { 'x-api-key': key }, payload: JSON.stringify({ templateID: 'python', autoResume: { enabled: true } }) });
    assert.equal(resumeAlone.statusCode, 400);
    assert.match(resumeAlone.json().message, /autoResume needs autoPause/);
    // What Collimate does not serve is still answered in E2B's shape ({code, message}), which the SDK prints.
    const unserved = await api.app.inject({ method: 'POST', url: '/e2b/api/snapshots', headers: { 'x-api-key': key } });
    assert.equal(unserved.statusCode, 404);
    assert.equal(unserved.json().code, 404);
    assert.match(unserved.json().message, /POST \/snapshots is not served/);
    const noKey = await api.app.inject({ method: 'GET', url: '/e2b/api/v2/sandboxes' });
    assert.equal(noKey.statusCode, 401);
    assert.equal(noKey.json().code, 401);
  });

  it('pages with X-Next-Token', async () => {
    const opts = { apiKey: key, apiUrl, sandboxUrl: 'http://127.0.0.1:1' };
    const made = [];
    for (let i = 0; i < 3; i++) made.push(await e2bNew.Sandbox.create('python', { ...opts, metadata: { page: 'yes' } }));
    const pages = async (order?: 'asc' | 'desc') => {
      const paginator = e2bNew.Sandbox.list({ ...opts, limit: 2, ...(order ? { order } : {}), query: { metadata: { page: 'yes' } } } as never);
      const seen: string[][] = [];
      while (paginator.hasNext) seen.push((await paginator.nextItems()).map((s) => s.sandboxId));
      return seen;
    };
    const ids = made.map((s) => s.sandboxId);
    // E2B's order: by start time, newest first, pages of `limit`; `order: 'asc'` oldest first.
    assert.deepEqual(await pages(), [[ids[2], ids[1]], [ids[0]]]);
    assert.deepEqual(await pages('asc'), [[ids[0], ids[1]], [ids[2]]]);
    const bad = await fetch(`${apiUrl}/v2/sandboxes?nextToken=garbage`, { headers: { 'x-api-key': key } });
    assert.equal(bad.status, 400);
    assert.match(((await bad.json()) as { message: string }).message, /nextToken/);
  });
});
