import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Admission } from '../../../src/service/admission.js';
import { TIERS } from '../../../src/service/tiers.js';
import { assertErrorBody, fixture, type Fixture } from '../api/helpers.js';

const ENV = { id: 'my-env', kind: 'environment' as const, description: 'own image', interpreter: ['sh'], ready: true, vcpus: 1, memory_mib: 256 };

describe('demo tier cap', () => {
  let f: Fixture;
  before(async () => (f = await fixture({ fake: { opDelayMs: 5, environments: { d: [ENV], p: [ENV] } } })));
  after(() => f.close());

  const create = (key: string, body: unknown = { template: 'base' }, headers?: Record<string, string>) =>
    f.req('createSandbox', { url: '/v1/sandboxes', key, body, headers, allow5xx: f.svc.failCreates > 0 });

  test('third concurrent create is 429 concurrency_limit with Retry-After; suspend frees a slot; resume needs one', async () => {
    const key = f.key('capped');
    const rs = await Promise.all([create(key), create(key), create(key)]);
    const codes = rs.map((r) => r.statusCode).sort();
    assert.deepEqual(codes, [201, 201, 429]);
    const limited = rs.find((r) => r.statusCode === 429)!;
    assertErrorBody(limited, 'concurrency_limit');
    assert.match(String(limited.headers['retry-after']), /^\d+$/);
    assert.equal(limited.json().error.limit, 2);
    assert.match(limited.json().error.message, /suspend/i);

    const [s1] = rs.filter((r) => r.statusCode === 201).map((r) => r.json());
    assert.equal((await f.req('suspendSandbox', { url: `/v1/sandboxes/${s1.id}/suspend`, key })).statusCode, 200);
    const s3 = await create(key);
    assert.equal(s3.statusCode, 201, 'suspended sandboxes do not count');
    assertErrorBody(await create(key), 'concurrency_limit');
    assertErrorBody(await f.req('resumeSandbox', { url: `/v1/sandboxes/${s1.id}/resume`, key }), 'concurrency_limit');
    assert.equal((await f.req('deleteSandbox', { url: `/v1/sandboxes/${s3.json().id}`, key })).statusCode, 204);
    assert.equal((await f.req('resumeSandbox', { url: `/v1/sandboxes/${s1.id}/resume`, key })).statusCode, 200);
    assert.equal(f.svc.countRunning('capped'), 2);
  });

  test('100 concurrent creates at the cap never overshoot', async () => {
    const key = f.key('stampede');
    let max = 0;
    const orig = f.svc.create.bind(f.svc);
    f.svc.create = async (o, s) => {
      const info = await orig(o, s);
      max = Math.max(max, f.svc.countRunning(s.tenant));
      return info;
    };
    try {
      const rs = await Promise.all(Array.from({ length: 100 }, () => create(key)));
      const ok = rs.filter((r) => r.statusCode === 201).length;
      assert.equal(ok, 2);
      assert.equal(rs.filter((r) => r.statusCode === 429).length, 98);
      assert.ok(max <= 2, `peak ${max}`);
      assert.equal(f.svc.countRunning('stampede'), 2);
      assert.equal(f.api.admission!.inFlight('stampede'), 0);
    } finally {
      f.svc.create = orig;
    }
  });

  test('100 concurrent mixed creates and forks at the cap never overshoot', async () => {
    const key = f.key('mixed');
    const first = (await create(key)).json();
    const rs = await Promise.all(
      Array.from({ length: 100 }, (_, i) =>
        i % 2 ? create(key) : f.req('forkSandbox', { url: `/v1/sandboxes/${first.id}/fork`, key, body: { count: 1 } }),
      ),
    );
    assert.equal(rs.filter((r) => r.statusCode === 201).length, 1);
    assert.equal(f.svc.countRunning('mixed'), 2);
  });

  test('fork of N children counts N slots', async () => {
    const key = f.key('forker');
    const p = (await create(key)).json();
    assertErrorBody(await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key, body: { count: 2 } }), 'concurrency_limit');
    assert.equal((await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key, body: { count: 1 } })).statusCode, 201);
    assertErrorBody(await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key, body: { count: 1 } }), 'concurrency_limit');
  });

  test('a failed create releases its slot', async () => {
    const key = f.key('failing');
    f.svc.failCreates = 2;
    const rs = await Promise.all([create(key), create(key)]);
    for (const r of rs) assertErrorBody(r, 'vmm_failed');
    assert.equal(f.api.admission!.inFlight('failing'), 0);
    assert.deepEqual((await Promise.all([create(key), create(key)])).map((r) => r.statusCode), [201, 201]);
  });

  test('demo keys may only use catalog templates; pro may use its own', async () => {
    const demo = f.key('d');
    const r = await create(demo, { template: 'my-env' });
    assertErrorBody(r, 'template_forbidden');
    assert.match(r.json().error.message, /catalog/);
    assert.equal((await create(f.key('p', 'pro'), { template: 'my-env' })).statusCode, 201);
  });

  test('timeout_secs is checked against the tier maximum and defaults per tier', async () => {
    const demo = f.key('timeouts');
    assertErrorBody(await create(demo, { template: 'base', timeout_secs: 901 }), 'tier_forbidden');
    const s = (await create(demo, { template: 'base', timeout_secs: 900 })).json();
    assert.equal(s.timeout_secs, 900);
    const d = (await create(demo, { template: 'base' }));
    assert.equal(d.json().timeout_secs, TIERS.demo.defaultSessionSecs);
    const pro = f.key('timeouts-pro', 'pro');
    assert.equal((await create(pro, { template: 'base', timeout_secs: 86400 })).statusCode, 201);
    assertErrorBody(await create(pro, { template: 'base', timeout_secs: 86401 }), 'tier_forbidden');
    const ent = f.key('timeouts-ent', 'enterprise');
    assert.equal((await create(ent, { template: 'base', timeout_secs: 7 * 86400 })).statusCode, 201);
    assertErrorBody(await create(ent, { template: 'base', timeout_secs: 7 * 86400 + 1 }), 'tier_forbidden');
  });

  test('pro and enterprise have no cap', async () => {
    const key = f.key('wide', 'pro');
    const rs = await Promise.all(Array.from({ length: 20 }, () => create(key)));
    assert.ok(rs.every((r) => r.statusCode === 201));
  });

  test('changing the tenant tier applies to its existing keys', async () => {
    const key = f.key('upgrader');
    assertErrorBody(await create(key, { template: 'base', timeout_secs: 3600 }), 'tier_forbidden');
    f.api.keys.setTier('upgrader', 'pro');
    assert.equal((await create(key, { template: 'base', timeout_secs: 3600 })).statusCode, 201);
  });
});

describe('Admission with a service that counts in-flight operations', () => {
  // The engine counts `resuming` rows as running while the resume is in flight: the count then
  // overlaps the reservation. Admission must neither overshoot nor refuse what fits.
  test('two concurrent operations that fit both succeed, a third is refused, none overshoots', async () => {
    let running = 0;
    const adm = new Admission({ countRunning: () => running });
    const op = async () => {
      const r = await adm.reserve('t', TIERS.demo, 1, 'resume');
      try {
        running++; // the service marks the row resuming at once
        await new Promise((res) => setTimeout(res, 10));
        assert.ok(running <= 2);
        return 'ok';
      } finally {
        r.release();
      }
    };
    const results = await Promise.allSettled([op(), op(), op()]);
    assert.deepEqual(results.map((r) => r.status).sort(), ['fulfilled', 'fulfilled', 'rejected']);
    assert.equal(running, 2);
  });

  test('the synchronous step decides certain cases at once', () => {
    let running = 1;
    const adm = new Admission({ countRunning: () => running });
    const r1 = adm.tryReserve('t', TIERS.demo, 1, 'create', false)!;
    assert.ok(r1);
    assert.equal(adm.tryReserve('t', TIERS.demo, 1, 'create', false), null, 'ambiguous while r1 is in flight');
    running = 2;
    assert.throws(() => adm.tryReserve('t', TIERS.demo, 1, 'create', false), /allows 2/);
    r1.release();
    r1.release();
    assert.equal(adm.inFlight('t'), 0);
  });
});

describe('a lease: POST /v1/sandboxes/{id}/timeout', () => {
  let f: Fixture;
  let t = Date.parse('2026-01-01T00:00:00Z');
  const clock = { now: () => t, advance: (secs: number) => (t += secs * 1000) };
  before(async () => (f = await fixture({ fake: { now: clock.now, opDelayMs: 0 }, server: { now: clock.now } })));
  after(() => f.close());

  const create = (key: string, body: unknown) => f.req('createSandbox', { url: '/v1/sandboxes', key, body });
  const setTimeout = (key: string, id: string, body: unknown) => f.req('setSandboxTimeout', { url: `/v1/sandboxes/${id}/timeout`, key, body });
  const iso = (ms: number) => new Date(ms).toISOString();

  test('sets the end timeout_secs from now, later or sooner; the view shows it and the session length stays', async () => {
    const key = f.key('lease', 'pro');
    const s = (await create(key, { template: 'base', timeout_secs: 600 })).json();
    const started = t;
    assert.equal(s.session_started_at, iso(started));
    assert.equal(s.expires_at, iso(started + 600_000));
    assert.equal(s.remaining_secs, 600);

    clock.advance(100);
    const longer = await setTimeout(key, s.id, { timeout_secs: 3600 });
    assert.equal(longer.statusCode, 200);
    assert.equal(longer.json().expires_at, iso(t + 3600_000));
    assert.equal(longer.json().remaining_secs, 3600);
    assert.equal(longer.json().timeout_secs, 600, 'timeout_secs is the length each start gives, not the lease');
    const shorter = (await setTimeout(key, s.id, { timeout_secs: 2 })).json();
    assert.equal(shorter.expires_at, iso(t + 2000));
    clock.advance(1);
    const read = (await f.req('getSandbox', { url: `/v1/sandboxes/${s.id}`, key })).json();
    assert.equal(read.expires_at, iso(t + 1000));
    assert.equal(read.remaining_secs, 1);
    assert.equal(read.session_started_at, iso(started));
  });

  test("never past the tier's maximum session from the session's start: 403 tier_forbidden saying what is left", async () => {
    const key = f.key('lease-demo');
    const s = (await create(key, { template: 'base', timeout_secs: 60 })).json();
    assert.equal((await setTimeout(key, s.id, { timeout_secs: 900 })).statusCode, 200, 'the whole demo session, asked for at its start');
    clock.advance(600);
    const r = await setTimeout(key, s.id, { timeout_secs: 301 });
    assertErrorBody(r, 'tier_forbidden');
    const err = r.json().error;
    assert.match(err.message, /demo tier's maximum session of 900 s/);
    assert.match(err.message, /300 s of it are left/);
    assert.equal(err.max_session_secs, 900);
    assert.equal(err.max_timeout_secs, 300);
    assert.equal((await f.req('getSandbox', { url: `/v1/sandboxes/${s.id}`, key })).json().remaining_secs, 300, 'a refused lease changes nothing');
    const ok = await setTimeout(key, s.id, { timeout_secs: 300 });
    assert.equal(ok.statusCode, 200);
    assert.equal(ok.json().expires_at, iso(Date.parse(s.session_started_at) + 900_000));

    clock.advance(300);
    const none = await setTimeout(key, s.id, { timeout_secs: 1 });
    assertErrorBody(none, 'tier_forbidden');
    assert.equal(none.json().error.max_timeout_secs, 0);
    assert.match(none.json().error.message, /none of it is left; suspend and resume/);
    await f.req('deleteSandbox', { url: `/v1/sandboxes/${s.id}`, key });
  });

  test('suspended: 409 invalid_state; a resume starts a new session of timeout_secs, which a lease then moves', async () => {
    const key = f.key('lease-suspend', 'pro');
    const s = (await create(key, { template: 'base', timeout_secs: 600 })).json();
    assert.equal((await setTimeout(key, s.id, { timeout_secs: 5000 })).statusCode, 200);
    const suspended = (await f.req('suspendSandbox', { url: `/v1/sandboxes/${s.id}/suspend`, key })).json();
    assert.equal(suspended.remaining_secs, null);
    const r = await setTimeout(key, s.id, { timeout_secs: 60 });
    assertErrorBody(r, 'invalid_state');
    assert.match(r.json().error.message, /resume/i);
    clock.advance(10_000);
    const resumed = (await f.req('resumeSandbox', { url: `/v1/sandboxes/${s.id}/resume`, key })).json();
    assert.equal(resumed.session_started_at, iso(t));
    assert.equal(resumed.expires_at, iso(t + 600_000), 'the lease ended with the session it was set on');
    assert.equal((await setTimeout(key, s.id, { timeout_secs: 86400 })).statusCode, 200, 'the maximum counts from the resume');
  });

  test('bad bodies are 400 validation_error; unknown and other tenants\' ids 404', async () => {
    const key = f.key('lease-bad', 'pro');
    const s = (await create(key, { template: 'base' })).json();
    for (const body of [{}, { timeout_secs: 0 }, { timeout_secs: -5 }, { timeout_secs: 1.5 }, { timeout_secs: '60' }, { timeout_secs: 60, extra: 1 }, { timeout_secs: 2 ** 31 }, [], null]) {
      assertErrorBody(await setTimeout(key, s.id, body), 'validation_error');
    }
    assertErrorBody(await f.req('setSandboxTimeout', { url: `/v1/sandboxes/${s.id}/timeout`, key, rawBody: '{"timeout_secs":', headers: { 'content-type': 'application/json' } }), 'invalid_json');
    assertErrorBody(await setTimeout(f.key('lease-other', 'pro'), s.id, { timeout_secs: 60 }), 'sandbox_not_found');
    assertErrorBody(await setTimeout(key, 'sbx_000000000000', { timeout_secs: 60 }), 'sandbox_not_found');
    assertErrorBody(await f.req('setSandboxTimeout', { url: `/v1/sandboxes/${s.id}/timeout`, body: { timeout_secs: 60 } }), 'unauthorized');
  });
});
