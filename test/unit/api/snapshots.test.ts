import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

describe('snapshot endpoints', () => {
  let f: Fixture;
  let key: string;
  before(async () => {
    f = await fixture({ server: { quotas: { 'tenant:tight': { snapshots: 1 } } } });
    key = f.key('acme', 'pro');
  });
  after(() => f.close());

  const created = async (k = key) => {
    const r = await f.req('createSandbox', { url: '/v1/sandboxes', key: k, body: { template: 'base' } });
    assert.equal(r.statusCode, 201, r.body);
    return r.json();
  };
  const snapshotOf = async (id: string, body?: unknown, k = key) => {
    const r = await f.req('createSnapshot', { url: `/v1/sandboxes/${id}/snapshots`, key: k, body });
    assert.equal(r.statusCode, 201, r.body);
    return r.json();
  };

  test('take, list, get and delete a snapshot; another tenant sees none of it', async () => {
    const sb = await created();
    const s = await snapshotOf(sb.id, { name: 'after-setup', labels: { step: '3' } });
    assert.equal(s.sandbox_id, sb.id);
    assert.equal(s.name, 'after-setup');
    assert.deepEqual(s.labels, { step: '3' });
    assert.equal(s.template, 'base');
    assert.equal('tenant' in s, false);
    const unnamed = await snapshotOf(sb.id);
    assert.equal(unnamed.name, null);

    const list = (await f.req('listSnapshots', { url: `/v1/snapshots?sandbox_id=${sb.id}`, key })).json();
    assert.deepEqual(list.snapshots.map((x: any) => x.id).sort(), [s.id, unnamed.id].sort());
    const byLabel = (await f.req('listSnapshots', { url: '/v1/snapshots?label=step=3', key })).json();
    assert.deepEqual(byLabel.snapshots.map((x: any) => x.id), [s.id]);
    const page = (await f.req('listSnapshots', { url: `/v1/snapshots?sandbox_id=${sb.id}&limit=1`, key })).json();
    assert.equal(page.snapshots.length, 1);
    assert.equal(page.next, page.snapshots[0].id);

    assert.equal((await f.req('getSnapshot', { url: `/v1/snapshots/${s.id}`, key })).json().id, s.id);
    const other = f.key('other', 'pro');
    assertErrorBody(await f.req('getSnapshot', { url: `/v1/snapshots/${s.id}`, key: other }), 'snapshot_not_found');
    assertErrorBody(await f.req('deleteSnapshot', { method: 'DELETE', url: `/v1/snapshots/${s.id}`, key: other }), 'snapshot_not_found');
    assert.deepEqual((await f.req('listSnapshots', { url: '/v1/snapshots', key: other })).json().snapshots, []);
    assertErrorBody(await f.req('createSnapshot', { url: `/v1/sandboxes/${sb.id}/snapshots`, key: other }), 'sandbox_not_found');

    assert.equal((await f.req('deleteSnapshot', { method: 'DELETE', url: `/v1/snapshots/${s.id}`, key })).statusCode, 204);
    assertErrorBody(await f.req('getSnapshot', { url: `/v1/snapshots/${s.id}`, key }), 'snapshot_not_found');
  });

  test('POST /v1/sandboxes with snapshot starts one sandbox, or `count` listed in `sandboxes`', async () => {
    const sb = await created();
    const s = await snapshotOf(sb.id);
    const one = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { snapshot: s.id, labels: { k: 'v' } } });
    assert.equal(one.statusCode, 201, one.body);
    assert.equal(one.json().from_snapshot, s.id);
    assert.deepEqual(one.json().labels, { k: 'v' });
    assert.equal('sandboxes' in one.json(), false);
    const many = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { snapshot: s.id, count: 3 } });
    assert.equal(many.statusCode, 201, many.body);
    assert.equal(many.json().sandboxes.length, 3);
    assert.equal(many.json().id, many.json().sandboxes[0].id);
    for (const x of many.json().sandboxes) assert.equal(x.from_snapshot, s.id);
  });

  test('a snapshot promoted to an environment is a template: listed, got, created from (each create a start from it); its name is unique, null or deleting the snapshot takes it away', async () => {
    const sb = await created();
    const s = await snapshotOf(sb.id, { name: 'warm' });
    const promote = (id: string, environment: unknown, k = key) => f.req('promoteSnapshot', { url: `/v1/snapshots/${id}/promote`, key: k, body: { environment } });
    const p = await promote(s.id, 'prepared');
    assert.equal(p.statusCode, 200, p.body);
    assert.equal(p.json().environment, 'prepared');
    assert.equal((await promote(s.id, 'prepared')).statusCode, 200, 'promoting again under its own name is the same');
    const listed = (await f.req('listTemplates', { url: '/v1/templates', key })).json().templates.find((t: any) => t.id === 'prepared');
    assert.deepEqual([listed?.kind, listed?.snapshot_id, listed?.ready], ['snapshot', s.id, true]);
    assert.equal((await f.req('getTemplate', { url: '/v1/templates/prepared', key })).json().snapshot_id, s.id);
    const made = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'prepared', labels: { via: 'env' } } });
    assert.equal(made.statusCode, 201, made.body);
    assert.equal(made.json().from_snapshot, s.id, 'a create with the name starts from the snapshot');
    assert.deepEqual(made.json().labels, { via: 'env' });

    // The name is unique among the catalog, the tenant's snapshots; bad names and tiers are refused.
    const other = await snapshotOf(sb.id);
    for (const [name, status, code] of [['prepared', 409, 'conflict'], ['base', 409, 'conflict'], ['Bad Name', 400, 'validation_error']] as const) {
      const r = await promote(other.id, name);
      assert.equal(r.statusCode, status, r.body);
      assertErrorBody(r, code);
    }
    const globex = f.key('globex', 'pro');
    assertErrorBody(await promote(s.id, 'x', globex), 'snapshot_not_found');
    const demo = f.key('demo-co', 'demo');
    const demoSb = await created(demo);
    const demoSnap = await snapshotOf(demoSb.id, undefined, demo);
    const refused = await promote(demoSnap.id, 'mine', demo);
    assert.equal(refused.statusCode, 403);
    assertErrorBody(refused, 'tier_forbidden');
    // Another tenant's name space is its own; it cannot create from this tenant's name.
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key: globex, body: { template: 'prepared' } }), 'template_not_found');

    // null takes the name away; so does deleting the snapshot.
    assert.equal((await promote(s.id, null)).json().environment, null);
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'prepared' } }), 'template_not_found');
    assert.equal((await promote(other.id, 'prepared')).statusCode, 200, 'the name is free again');
    assert.equal((await f.req('deleteSnapshot', { url: `/v1/snapshots/${other.id}`, method: 'DELETE', key })).statusCode, 204);
    assert.equal((await f.req('listTemplates', { url: '/v1/templates', key })).json().templates.some((t: any) => t.id === 'prepared'), false);
  });

  test('a template name resolves to the snapshot promoted under that name, not to another promoted snapshot of the tenant', async () => {
    const sb = await created();
    const [first, second] = [await snapshotOf(sb.id), await snapshotOf(sb.id)];
    const promote = (id: string, environment: string) => f.req('promoteSnapshot', { url: `/v1/snapshots/${id}/promote`, key, body: { environment } });
    assert.equal((await promote(first.id, 'first-env')).statusCode, 200);
    assert.equal((await promote(second.id, 'second-env')).statusCode, 200);
    // Whichever of the two a lookup would meet first (by id, by time), one of these names would get it.
    for (const [name, snap] of [['first-env', first], ['second-env', second]] as const) {
      const r = await f.req('getTemplate', { url: `/v1/templates/${name}`, key });
      assert.equal(r.statusCode, 200, r.body);
      assert.deepEqual([r.json().id, r.json().kind, r.json().snapshot_id], [name, 'snapshot', snap.id]);
    }
    assertErrorBody(await f.req('getTemplate', { url: '/v1/templates/third-env', key }), 'template_not_found');
    for (const s of [first, second]) await f.req('deleteSnapshot', { url: `/v1/snapshots/${s.id}`, method: 'DELETE', key });
  });

  test('bad starts and rollbacks are clear errors', async () => {
    const sb = await created();
    const s = await snapshotOf(sb.id);
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { snapshot: s.id, template: 'base' } }), 'validation_error');
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base', count: 2 } }), 'validation_error');
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { snapshot: s.id, count: 0 } }), 'validation_error');
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { snapshot: 'snap_0000000000000000' } }), 'snapshot_not_found');
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { snapshot: s.id, egress: 'allow', timeout_secs: 10 ** 9 } }), 'tier_forbidden');
    const other = await created();
    const r = await f.req('restoreSandbox', { url: `/v1/sandboxes/${other.id}/restore`, key, body: { snapshot: s.id } });
    assertErrorBody(r, 'snapshot_mismatch');
    assertErrorBody(await f.req('restoreSandbox', { url: `/v1/sandboxes/${sb.id}/restore`, key, body: {} }), 'validation_error');
    const back = await f.req('restoreSandbox', { url: `/v1/sandboxes/${sb.id}/restore`, key, body: { snapshot: s.id } });
    assert.equal(back.statusCode, 200, back.body);
    assert.equal(back.json().id, sb.id);
    assert.equal(back.json().from_snapshot, s.id);
  });

  test('the snapshots quota: past it is 429 quota_exceeded naming it, and /v1/limits shows the use', async () => {
    const k = f.key('tight', 'pro');
    const sb = await created(k);
    await snapshotOf(sb.id, undefined, k);
    const r = await f.req('createSnapshot', { url: `/v1/sandboxes/${sb.id}/snapshots`, key: k });
    assertErrorBody(r, 'quota_exceeded');
    assert.equal(r.json().error.quota, 'snapshots');
    const limits = (await f.req('getLimits', { url: '/v1/limits', key: k })).json();
    assert.deepEqual(limits.quotas.snapshots, { limit: 1, used: 1 });
    assert.ok(limits.quotas.snapshot_mib.used > 0);
  });
});
