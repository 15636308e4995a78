/**
 * Per-tenant quotas (src/service/quotas.ts) over REST: tier defaults and the operator's overrides in
 * GET /v1/limits with current use, 429 quota_exceeded naming the quota, concurrent requests that
 * cannot pass a quota together, and one tenant at its quota leaving the others alone.
 */
import assert from 'node:assert/strict';
import { request, type ClientRequest } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { parseQuotaOverrides, QUOTA_DEFAULTS } from '../../../src/service/quotas.js';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

function quotaError(r: { statusCode: number; json(): any }, quota: string): any {
  assertErrorBody(r as never, 'quota_exceeded');
  assert.equal(r.statusCode, 429);
  const e = r.json().error;
  assert.equal(e.quota, quota);
  assert.match(e.message, new RegExp(`Quota ${quota} is ${e.limit} `));
  return e;
}

describe('quotas', () => {
  let f: Fixture;
  before(async () => {
    f = await fixture({
      server: {
        quotas: parseQuotaOverrides(JSON.stringify({
          pro: { suspended_sandboxes: 2, keys: 3 },
          'tenant:tight': { suspended_mib: 300, open_streams: 1 },
        })),
      },
    });
  });
  after(() => f.close());

  const create = async (key: string) => (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json().id as string;
  const suspend = (key: string, id: string) => f.req('suspendSandbox', { url: `/v1/sandboxes/${id}/suspend`, key });

  test('GET /v1/limits shows every quota with its limit (default, tier override, tenant override) and use', async () => {
    const demo = (await f.req('getLimits', { url: '/v1/limits', key: f.key('d', 'demo') })).json();
    assert.deepEqual(Object.fromEntries(Object.entries(demo.quotas).map(([k, v]: [string, any]) => [k, v.limit])), QUOTA_DEFAULTS.demo);
    const pro = (await f.req('getLimits', { url: '/v1/limits', key: f.key('p', 'pro') })).json();
    assert.equal(pro.quotas.suspended_sandboxes.limit, 2, 'the tier override');
    assert.equal(pro.quotas.open_streams.limit, QUOTA_DEFAULTS.pro.open_streams, 'the default where nothing overrides');
    assert.equal(pro.quotas.keys.used, 1);
    const tight = (await f.req('getLimits', { url: '/v1/limits', key: f.key('tight', 'pro') })).json();
    assert.equal(tight.quotas.suspended_mib.limit, 300, "the tenant's own override");
    assert.equal(tight.quotas.suspended_sandboxes.limit, 2, "its tier's where the tenant has none");
  });

  test('a suspend past suspended_sandboxes is 429 naming it and the sandbox keeps running; others are not held back', async () => {
    const key = f.key('acme', 'pro');
    const ids = [await create(key), await create(key), await create(key)];
    assert.equal((await suspend(key, ids[0])).statusCode, 200);
    assert.equal((await suspend(key, ids[1])).statusCode, 200);
    const e = quotaError(await suspend(key, ids[2]), 'suspended_sandboxes');
    assert.deepEqual([e.limit, e.used], [2, 2]);
    assert.equal((await f.req('getSandbox', { url: `/v1/sandboxes/${ids[2]}`, key })).json().state, 'running');
    // Another tenant of the same tier suspends as before.
    const other = f.key('globex', 'pro');
    assert.equal((await suspend(other, await create(other))).statusCode, 200);
    const limits = (await f.req('getLimits', { url: '/v1/limits', key })).json();
    assert.deepEqual(limits.quotas.suspended_sandboxes, { limit: 2, used: 2 });
    // Deleting a suspended one makes room.
    assert.equal((await f.req('deleteSandbox', { url: `/v1/sandboxes/${ids[0]}`, method: 'DELETE', key })).statusCode, 204);
    assert.equal((await suspend(key, ids[2])).statusCode, 200);
  });

  test('suspended_mib counts each suspended sandbox at its memory plus disk size', async () => {
    const key = f.key('tight', 'pro');
    const a = await create(key);
    const size = (await f.req('getSandbox', { url: `/v1/sandboxes/${a}`, key })).json();
    assert.ok(size.memory_mib + size.disk_mib > 300, 'the fake template is larger than the quota');
    const e = quotaError(await suspend(key, a), 'suspended_mib');
    assert.deepEqual([e.used, e.adding], [0, size.memory_mib + size.disk_mib]);
  });

  test('concurrent suspends cannot pass the quota together: exactly as many as it allows succeed', async () => {
    const key = f.key('initech', 'pro');
    const ids = await Promise.all([0, 1, 2, 3, 4].map(() => create(key)));
    const results = await Promise.all(ids.map((id) => suspend(key, id)));
    assert.deepEqual(results.map((r) => r.statusCode).sort(), [200, 200, 429, 429, 429]);
    for (const r of results.filter((x) => x.statusCode === 429)) quotaError(r, 'suspended_sandboxes');
  });

  test('keys: past the quota a new key is 429; revoking one makes room', async () => {
    const key = f.key('umbrella', 'pro');
    const made: string[] = [];
    for (let i = 0; i < 2; i++) made.push((await f.req('createKey', { url: '/v1/keys', key })).json().record.id);
    quotaError(await f.req('createKey', { url: '/v1/keys', key }), 'keys');
    assert.equal((await f.req('revokeKey', { url: `/v1/keys/${made[0]}`, method: 'DELETE', key })).statusCode, 204);
    assert.equal((await f.req('createKey', { url: '/v1/keys', key })).statusCode, 201);
  });

  test('open_streams: a second stream is 429 while the first is open, and allowed once it closes', async () => {
    const key = f.key('tight', 'pro');
    const base = new URL(await f.api.app.listen({ host: '127.0.0.1', port: 0 }));
    const open = () => new Promise<{ status: number; body: string; req: ClientRequest }>((resolve, reject) => {
      const req = request(new URL('/v1/events', base), { headers: { authorization: `Bearer ${key}` } }, (res) => {
        if (res.statusCode === 200) return resolve({ status: 200, body: '', req });
        let body = '';
        res.on('data', (c) => (body += c)).on('end', () => resolve({ status: res.statusCode!, body, req }));
      });
      req.on('error', reject).end();
    });
    const first = await open();
    assert.equal(first.status, 200);
    const second = await open();
    assert.equal(second.status, 429);
    assert.equal(JSON.parse(second.body).error.quota, 'open_streams');
    assert.equal((await f.req('getLimits', { url: '/v1/limits', key })).json().quotas.open_streams.used, 1);
    first.req.destroy();
    for (let i = 0; i < 100 && (await f.req('getLimits', { url: '/v1/limits', key })).json().quotas.open_streams.used !== 0; i++) await new Promise((r) => setTimeout(r, 20));
    const third = await open();
    assert.equal(third.status, 200, 'the closed stream no longer counts');
    third.req.destroy();
  });
});

test('COLLIMATE_QUOTAS: a bad setting is refused with what to fix', () => {
  assert.deepEqual(parseQuotaOverrides(undefined), {});
  assert.deepEqual(parseQuotaOverrides('{"demo": {"keys": null}}').demo, { keys: null });
  for (const [text, says] of [
    ['{', /not JSON/],
    ['[]', /JSON object/],
    ['{"gold": {}}', /neither a tier/],
    ['{"pro": {"cpus": 1}}', /not a quota; the quotas are suspended_sandboxes/],
    ['{"pro": {"keys": -1}}', /whole number ≥ 0, or null/],
    ['{"pro": {"keys": 1.5}}', /whole number/],
  ] as const) {
    assert.throws(() => parseQuotaOverrides(text), says);
  }
});
