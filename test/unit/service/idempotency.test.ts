import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { canonicalJson } from '../../../src/service/idempotency.js';
import { assertErrorBody, fixture, type Fixture } from '../api/helpers.js';

describe('Idempotency-Key', () => {
  let f: Fixture;
  let key: string;
  before(async () => {
    f = await fixture({ fake: { opDelayMs: 5 } });
    key = f.key('idem', 'pro');
  });
  after(() => f.close());

  const create = (body: unknown, idem?: string, k = key) =>
    f.req('createSandbox', { url: '/v1/sandboxes', key: k, body, headers: idem ? { 'idempotency-key': idem } : {} });
  const creates = () => f.svc.calls.filter((c) => c === 'create').length;

  test('a retry with the same key and body returns the original status and body', async () => {
    const n = creates();
    const r1 = await create({ template: 'base', labels: { a: '1', b: '2' } }, 'create-1');
    const r2 = await create({ labels: { b: '2', a: '1' }, template: 'base' }, 'create-1');
    assert.equal(r1.statusCode, 201);
    assert.equal(r2.statusCode, 201);
    assert.equal(r2.body, r1.body);
    assert.equal(r2.headers['idempotent-replayed'], 'true');
    assert.equal(r1.headers['idempotent-replayed'], undefined);
    assert.equal(creates(), n + 1);
  });

  test('the same key with a different body is 422 idempotency_key_reused', async () => {
    await create({ template: 'base' }, 'create-2');
    const r = await create({ template: 'python' }, 'create-2');
    assertErrorBody(r, 'idempotency_key_reused');
  });

  test('the same key on another endpoint is 422', async () => {
    const s = (await create({ template: 'base' }, 'create-3')).json();
    const r = await f.req('forkSandbox', { url: `/v1/sandboxes/${s.id}/fork`, key, body: { template: 'base' }, headers: { 'idempotency-key': 'create-3' } });
    assertErrorBody(r, 'validation_error'); // body validation comes first
    const r2 = await f.req('forkSandbox', { url: `/v1/sandboxes/${s.id}/fork`, key, body: {}, headers: { 'idempotency-key': 'create-3' } });
    assertErrorBody(r2, 'idempotency_key_reused');
  });

  test('fork is idempotent too', async () => {
    const s = (await create({ template: 'base' })).json();
    const n = f.svc.calls.filter((c) => c === 'fork').length;
    const r1 = await f.req('forkSandbox', { url: `/v1/sandboxes/${s.id}/fork`, key, body: { count: 3 }, headers: { 'idempotency-key': 'fork-1' } });
    const r2 = await f.req('forkSandbox', { url: `/v1/sandboxes/${s.id}/fork`, key, body: { count: 3 }, headers: { 'idempotency-key': 'fork-1' } });
    assert.equal(r1.statusCode, 201);
    assert.equal(r2.body, r1.body);
    assert.equal(f.svc.calls.filter((c) => c === 'fork').length, n + 1);
    assertErrorBody(await f.req('forkSandbox', { url: `/v1/sandboxes/${s.id}/fork`, key, body: { count: 2 }, headers: { 'idempotency-key': 'fork-1' } }), 'idempotency_key_reused');
  });

  test('resume is idempotent too, on one host as in cluster mode: a retried resume gets its answer, not invalid_state', async () => {
    const s = (await create({ template: 'base' })).json();
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${s.id}/suspend`, key });
    const n = f.svc.calls.filter((c) => c === 'resume').length;
    const resume = (idem: string) => f.req('resumeSandbox', { url: `/v1/sandboxes/${s.id}/resume`, key, headers: { 'idempotency-key': idem } });
    const r1 = await resume('resume-1');
    const r2 = await resume('resume-1');
    assert.equal(r1.statusCode, 200);
    assert.equal(r2.statusCode, 200);
    assert.equal(r2.body, r1.body);
    assert.equal(r2.headers['idempotent-replayed'], 'true');
    assert.equal(f.svc.calls.filter((c) => c === 'resume').length, n + 1);
    // Without a key a second resume is what it always was.
    assertErrorBody(await f.req('resumeSandbox', { url: `/v1/sandboxes/${s.id}/resume`, key }), 'invalid_state');
  });

  test('concurrent duplicates wait for the first and get its response', async () => {
    const n = creates();
    const rs = await Promise.all(Array.from({ length: 10 }, () => create({ template: 'node' }, 'concurrent-1')));
    assert.ok(rs.every((r) => r.statusCode === 201 && r.body === rs[0].body));
    assert.equal(creates(), n + 1);
    const mixed = await Promise.all([create({ template: 'node' }, 'concurrent-2'), create({ template: 'base' }, 'concurrent-2')]);
    assert.equal(mixed[0].statusCode, 201);
    assertErrorBody(mixed[1], 'idempotency_key_reused');
  });

  test('failures are not stored: a retry with the same key runs again', async () => {
    const demo = f.key('idem-demo');
    const a = (await create({ template: 'base' }, undefined, demo)).json();
    await create({ template: 'base' }, undefined, demo);
    assertErrorBody(await create({ template: 'base' }, 'after-limit', demo), 'concurrency_limit');
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${a.id}/suspend`, key: demo });
    const r = await create({ template: 'base' }, 'after-limit', demo);
    assert.equal(r.statusCode, 201);
  });

  test('malformed keys are 400', async () => {
    for (const k of ['x'.repeat(256), ' lead', 'trail ', 'tab\there']) {
      assertErrorBody(await create({ template: 'base' }, k), 'validation_error');
    }
  });

  test('canonical JSON ignores key order', () => {
    assert.equal(canonicalJson({ b: [1, { d: 1, c: 2 }], a: null }), canonicalJson({ a: null, b: [1, { c: 2, d: 1 }] }));
  });
});

test('idempotent responses survive a server restart on the same database', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'collimate-idem-'));
  const dbPath = join(dir, 'collimate.db');
  try {
    const f1 = await fixture({ dbPath });
    const key = f1.api.keys.create({ tenant: 'restart', tier: 'pro' }).key;
    const r1 = await f1.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' }, headers: { 'idempotency-key': 'restart-1' } });
    assert.equal(r1.statusCode, 201);
    await f1.close();

    const f2 = await fixture({ dbPath });
    try {
      const r2 = await f2.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' }, headers: { 'idempotency-key': 'restart-1' } });
      assert.equal(r2.statusCode, 201);
      assert.equal(r2.body, r1.body);
      assert.equal(f2.svc.calls.length, 0, 'nothing re-executed');
      assertErrorBody(await f2.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' }, headers: { 'idempotency-key': 'restart-1' } }), 'idempotency_key_reused');
    } finally {
      await f2.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
