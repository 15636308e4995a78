/**
 * The tenant's own account over REST: its keys (list, create, revoke), its tier's limits, and the
 * stream of its sandboxes' changes — each only ever the caller's tenant.
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';
import { FAKE_SYSTEM_DISK_BYTES } from '../../support/fakeSandboxService.js';

describe('keys', () => {
  let f: Fixture;
  before(async () => (f = await fixture()));
  after(() => f.close());

  test('a tenant lists, creates and revokes its own keys; a revoked key is refused at once', async () => {
    const key = f.key('acme', 'pro');
    f.key('other');
    let r = await f.req('listKeys', { url: '/v1/keys', key });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().keys.length, 1);
    assert.equal(r.json().keys[0].prefix, key.slice(0, 12));
    assert.ok(!r.body.includes(key), 'the key itself is never listed');

    r = await f.req('createKey', { url: '/v1/keys', key, body: { name: 'ci' } });
    assert.equal(r.statusCode, 201);
    const created = r.json();
    assert.match(created.key, /^clm_[0-9A-Za-z]{40}$/);
    assert.equal(created.record.name, 'ci');
    // Same tenant and tier: the new key sees the same limits.
    r = await f.req('getLimits', { url: '/v1/limits', key: created.key });
    assert.equal(r.json().tier, 'pro');

    r = await f.req('listKeys', { url: '/v1/keys', key });
    assert.deepEqual(r.json().keys.map((k: { name: string | null }) => k.name), [null, 'ci']);

    r = await f.req('revokeKey', { url: `/v1/keys/${created.record.id}`, key });
    assert.equal(r.statusCode, 204);
    r = await f.req('listKeys', { url: '/v1/keys', key: created.key });
    assertErrorBody(r, 'unauthorized');
    r = await f.req('listKeys', { url: '/v1/keys', key });
    assert.equal(r.json().keys.length, 1);
  });

  test('another tenant\'s key, an unknown id and a revoked one are all 404 not_found', async () => {
    const mine = f.key('acme', 'pro');
    const theirs = f.api.keys.create({ tenant: 'other' });
    for (const id of [theirs.record.id, 'key_000000000000', 'nonsense']) {
      const r = await f.req('revokeKey', { url: `/v1/keys/${id}`, key: mine });
      assertErrorBody(r, 'not_found');
    }
    assert.ok(f.api.keys.authenticate(theirs.key), 'the other tenant\'s key still works');
    const gone = f.api.keys.create({ tenant: 'acme' });
    f.api.keys.revoke(gone.record.id);
    assertErrorBody(await f.req('revokeKey', { url: `/v1/keys/${gone.record.id}`, key: mine }), 'not_found');
  });

  test('a key name must be 1..100 characters and the body has no other fields', async () => {
    const key = f.key('acme', 'pro');
    for (const body of [{ name: '' }, { name: 'x'.repeat(101) }, { tier: 'enterprise' }]) {
      assertErrorBody(await f.req('createKey', { url: '/v1/keys', key, body }), 'validation_error');
    }
    const r = await f.req('createKey', { url: '/v1/keys', key });
    assert.equal(r.statusCode, 201, 'no body: a key without a name');
    assert.equal(r.json().record.name, null);
  });
});

describe('limits', () => {
  let f: Fixture;
  before(async () => (f = await fixture()));
  after(() => f.close());

  test('the tier, its cap and the running count of the caller\'s tenant only', async () => {
    const key = f.key('acme', 'demo');
    const other = f.key('other', 'pro');
    await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } });
    await f.req('createSandbox', { url: '/v1/sandboxes', key: other, body: { template: 'python' } });
    let r = await f.req('getLimits', { url: '/v1/limits', key });
    assert.equal(r.statusCode, 200);
    assert.deepEqual({ tier: r.json().tier, max_running: r.json().max_running, running: r.json().running }, { tier: 'demo', max_running: 2, running: 1 });
    r = await f.req('getLimits', { url: '/v1/limits', key: other });
    assert.deepEqual({ tier: r.json().tier, max_running: r.json().max_running, running: r.json().running }, { tier: 'pro', max_running: null, running: 1 });
  });
});

describe('events', () => {
  let f: Fixture;
  let base: URL;
  before(async () => {
    f = await fixture();
    base = new URL(await f.api.app.listen({ host: '127.0.0.1', port: 0 }));
  });
  after(() => f.close());

  /** Opens GET /v1/events and collects its `sandbox` events' data. */
  function open(key: string): Promise<{ events: any[]; status: number; close(): void; next(): Promise<any> }> {
    return new Promise((resolve, reject) => {
      const events: any[] = [];
      const waiting: Array<(e: any) => void> = [];
      const req = request(new URL('/v1/events', base), { headers: { authorization: `Bearer ${key}` } }, (res) => {
        let buf = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => {
          buf += c;
          for (let i; (i = buf.indexOf('\n\n')) >= 0; ) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const data = /^data: (.*)$/m.exec(block)?.[1];
            if (/^event: sandbox$/m.test(block) && data) {
              const e = JSON.parse(data);
              events.push(e);
              waiting.shift()?.(e);
            }
          }
        });
        res.on('error', () => {});
        resolve({
          events,
          status: res.statusCode!,
          close: () => req.destroy(),
          next: () => new Promise((r) => waiting.push(r)),
        });
      });
      req.on('error', reject);
      req.end();
    });
  }

  test('each change of the tenant\'s own sandboxes, and none of another tenant\'s', async () => {
    const key = f.key('acme');
    const other = f.key('other');
    const stream = await open(key);
    assert.equal(stream.status, 200);
    const created = f.req('createSandbox', { url: '/v1/sandboxes', key: other, body: { template: 'python' } });
    const theirs = (await created).json().id;
    f.svc.emit('transition', { id: theirs, tenant: 'other', state: 'running', op: 'create' });
    const next = stream.next();
    f.svc.emit('transition', { id: 'sbx_0123456789ab', tenant: 'acme', state: 'suspended', op: 'suspend' });
    const e = await next;
    assert.equal(e.sandbox_id, 'sbx_0123456789ab');
    assert.equal(e.op, 'suspend');
    assert.equal(e.state, 'suspended');
    assert.ok(!Number.isNaN(Date.parse(e.at)));
    assert.deepEqual(stream.events.map((x) => x.sandbox_id), ['sbx_0123456789ab'], 'only its own sandboxes');
    stream.close();
  });

  test('a client that goes away is unsubscribed', async () => {
    const key = f.key('acme');
    const stream = await open(key);
    const watchers = (f.api.tenants.events as unknown as { watchers: Set<unknown> }).watchers;
    assert.equal(watchers.size, 1);
    stream.close();
    const deadline = Date.now() + 5000;
    while (watchers.size > 0 && Date.now() < deadline) await new Promise((r) => setImmediate(r));
    assert.equal(watchers.size, 0);
  });

  test('no key, no stream', async () => {
    assertErrorBody(await f.req('streamEvents', { url: '/v1/events' }), 'unauthorized');
  });
});

describe('live stats', () => {
  let f: Fixture;
  let now = 1_000_000;
  before(async () => (f = await fixture({ server: { now: () => now } })));
  after(() => f.close());

  test("memory now and CPU since the previous reading, of the caller's running sandboxes only", async () => {
    const key = f.key('acme', 'pro');
    const mine = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
    const theirs = (await f.req('createSandbox', { url: '/v1/sandboxes', key: f.key('other', 'pro'), body: { template: 'python' } })).json().id;
    // An engine that cannot tell reports nothing.
    assert.deepEqual((await f.req('getLiveStats', { url: '/v1/stats', key })).json(), { sandboxes: [] });
    let cpu = 10;
    const asked: string[][] = [];
    (f.svc as unknown as { vmmUsage: (ids: readonly string[]) => Map<string, { cpuSecs: number; rssBytes: number }> }).vmmUsage = (ids) => {
      asked.push([...ids]);
      return new Map(ids.map((id) => [id, { cpuSecs: cpu, rssBytes: 300 * 1048576 }]));
    };
    let r = await f.req('getLiveStats', { url: '/v1/stats', key });
    assert.deepEqual(r.json(), { sandboxes: [{ id: mine, cpu_percent: null, memory_mib: 300 }] });
    now += 2000;
    cpu += 1;
    r = await f.req('getLiveStats', { url: '/v1/stats', key });
    assert.deepEqual(r.json(), { sandboxes: [{ id: mine, cpu_percent: 50, memory_mib: 300 }] });
    assert.ok(asked.every((ids) => !ids.includes(theirs)), "another tenant's sandbox is never read");
    // Suspended: not running, not listed; a resumed VMM starts its count again.
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${mine}/suspend`, key });
    assert.deepEqual((await f.req('getLiveStats', { url: '/v1/stats', key })).json(), { sandboxes: [] });
  });
});

describe('metrics over time', () => {
  let f: Fixture;
  let now = 5_000_000;
  before(async () => (f = await fixture({ fake: { events: true }, server: { now: () => now } })));
  after(() => f.close());

  test("a sandbox's samples, oldest first, within from..to; another tenant's is not found; a deleted one's are gone", async () => {
    const key = f.key('acme', 'pro');
    const id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
    let cpu = 1;
    (f.svc as unknown as { vmmUsage: (ids: readonly string[]) => Map<string, { cpuSecs: number; rssBytes: number }> }).vmmUsage = (ids) =>
      new Map(ids.map((x) => [x, { cpuSecs: cpu, rssBytes: 200 * 1048576 }]));
    const sampler = f.api.tenants.sandboxMetrics;
    for (let i = 0; i < 3; i++) {
      await sampler.sample();
      now += 5000;
      cpu += 2.5; // half a vCPU busy
      // Disk use is read every 30 s: the file written after the first reading shows in none of these.
      if (i === 0) await f.svc.writeFile(id, '/root/big', Buffer.alloc(1024 * 1024));
    }
    const all = (await f.req('getSandboxMetrics', { url: `/v1/sandboxes/${id}/metrics`, key })).json();
    assert.equal(all.period_secs, 5);
    assert.equal(all.disk_period_secs, 30);
    assert.deepEqual(all.samples.map((s: { cpu_percent: number | null }) => s.cpu_percent), [null, 50, 50]);
    const diskMib = f.svc.get(id).disk_mib;
    assert.deepEqual(
      all.samples.map((s: { disk_used_bytes: number | null; disk_total_bytes: number | null }) => [s.disk_used_bytes, s.disk_total_bytes]),
      Array(3).fill([FAKE_SYSTEM_DISK_BYTES, diskMib * 1048576]),
      'every sample carries the first reading',
    );
    assert.deepEqual(all.samples.map((s: { at: string }) => Date.parse(s.at)), [5_000_000, 5_005_000, 5_010_000]);
    const from = new Date(5_005_000).toISOString();
    const to = new Date(5_005_000).toISOString();
    assert.equal((await f.req('getSandboxMetrics', { url: `/v1/sandboxes/${id}/metrics?from=${from}&to=${to}`, key })).json().samples.length, 1);
    assertErrorBody(await f.req('getSandboxMetrics', { url: `/v1/sandboxes/${id}/metrics?from=yesterday`, key }), 'validation_error');
    assertErrorBody(await f.req('getSandboxMetrics', { url: `/v1/sandboxes/${id}/metrics`, key: f.key('other', 'pro') }), 'sandbox_not_found');
    await f.req('deleteSandbox', { url: `/v1/sandboxes/${id}`, method: 'DELETE', key });
    assert.equal((await sampler.of(id)).length, 0, "a deleted sandbox's samples go with it");
  });
});
