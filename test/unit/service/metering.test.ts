import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { assertErrorBody, fixture } from '../api/helpers.js';

const T0 = Date.UTC(2026, 0, 10, 12, 0, 0);

async function meteredFixture(events = false) {
  let t = T0;
  const clock = { now: () => t, advance: (secs: number) => (t += secs * 1000) };
  const f = await fixture({ fake: { now: clock.now, opDelayMs: 0, events }, server: { now: clock.now } });
  return { f, clock, key: f.key('meter', 'pro') };
}

const usage = async (f: any, key: string, q: string) => {
  const r = await f.req('getUsage', { url: `/v1/usage${q}`, key });
  assert.equal(r.statusCode, 200, r.body);
  return r.json();
};

describe('metering', () => {
  for (const events of [false, true]) {
    test(`running and suspended time × resources, from the API's transitions (engine events: ${events})`, async () => {
      const { f, clock, key } = await meteredFixture(events);
      try {
        const s = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json(); // 1 vCPU, 512 MiB, 1024 MiB disk
        clock.advance(10);
        await f.req('suspendSandbox', { url: `/v1/sandboxes/${s.id}/suspend`, key });
        clock.advance(20);
        await f.req('resumeSandbox', { url: `/v1/sandboxes/${s.id}/resume`, key });
        clock.advance(5);
        await f.req('deleteSandbox', { url: `/v1/sandboxes/${s.id}`, key });
        clock.advance(100);
        const u = await usage(f, key, `?from=${(T0 - 1000_000) / 1000}&to=${new Date(T0 + 1000_000).toISOString()}`);
        assert.deepEqual(u.totals, {
          running_secs: 15,
          vcpu_secs: 15,
          memory_mib_secs: 15 * 512,
          disk_mib_secs: 15 * 1024,
          suspended_secs: 20,
          snapshot_mib_secs: 20 * 512,
        });
        assert.equal(u.sandboxes.length, 1);
        assert.equal(u.sandboxes[0].id, s.id);
        assert.equal(u.sandboxes[0].template, 'python');

        // A window clips the intervals: [T0+5, T0+12) holds 5 s running and 2 s suspended.
        const w = await usage(f, key, `?from=${(T0 + 5000) / 1000}&to=${(T0 + 12000) / 1000}`);
        assert.equal(w.totals.running_secs, 5);
        assert.equal(w.totals.suspended_secs, 2);
        assert.equal(w.from, new Date(T0 + 5000).toISOString());
      } finally {
        await f.close();
      }
    });
  }

  test('fork children are metered from the fork; an open interval counts up to now', async () => {
    const { f, clock, key } = await meteredFixture();
    try {
      const p = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'node' } })).json(); // 2 vCPUs
      clock.advance(10);
      await f.req('forkSandbox', { url: `/v1/sandboxes/${p.id}/fork`, key, body: { count: 2 } });
      clock.advance(10);
      const u = await usage(f, key, `?from=${T0 / 1000}`);
      assert.equal(u.totals.running_secs, 20 + 10 + 10);
      assert.equal(u.totals.vcpu_secs, 2 * 40);
      assert.equal(u.sandboxes.length, 3);
    } finally {
      await f.close();
    }
  });

  test('reconcile meters sandboxes made behind the API and closes vanished ones at their expiry', async () => {
    const { f, clock, key } = await meteredFixture();
    try {
      const hidden = await f.svc.create({ template: 'base', timeoutSecs: 30 }, { tenant: 'meter' }); // e.g. via MCP
      clock.advance(10);
      f.api.reconcile();
      clock.advance(40); // past its 30 s session
      f.svc.reap(hidden.id);
      f.api.reconcile();
      clock.advance(100);
      const u = await usage(f, key, `?from=${T0 / 1000}`);
      assert.equal(u.totals.running_secs, 30, 'from created_at to expiry');
    } finally {
      await f.close();
    }
  });

  test('engine events carry the snapshot size', async () => {
    const { f, clock, key } = await meteredFixture(true);
    try {
      const s = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json();
      await f.svc.suspend(s.id, { tenant: 'meter' }); // not through the API: only the event tells
      clock.advance(10);
      const u = await usage(f, key, `?from=${T0 / 1000}`);
      assert.equal(u.totals.suspended_secs, 10);
      assert.equal(u.totals.snapshot_mib_secs, 10 * 256);
      assert.equal(u.totals.running_secs, 0);
    } finally {
      await f.close();
    }
  });

  test('usage query validation', async () => {
    const { f, key } = await meteredFixture();
    try {
      for (const q of ['?per=week', `?per=day&from=${T0 / 1000 - 366 * 86400}&to=${T0 / 1000}`, '?from=yesterday', '?to=abc', '?to=9007199254740991', '?from=-99999999999999', `?from=${T0 / 1000}&to=${T0 / 1000}`, `?from=${T0 / 1000 + 10}&to=${T0 / 1000}`, '?window=1']) {
        assertErrorBody(await f.req('getUsage', { url: `/v1/usage${q}`, key }), 'validation_error');
      }
      const u = await usage(f, key, '');
      assert.equal(u.from, new Date(Date.UTC(2026, 0, 1)).toISOString(), 'defaults to the start of the month');
      assert.equal(u.to, new Date(T0).toISOString());
    } finally {
      await f.close();
    }
  });

  test('per=day splits the totals at UTC midnights, clipping the first and last days to the range', async () => {
    const { f, clock, key } = await meteredFixture();
    try {
      // T0 is 12:00 UTC: the sandbox runs 12 h into the next day, then is suspended for 30 h.
      const s = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json(); // 1 vCPU, 512 MiB
      clock.advance(36 * 3600);
      await f.req('suspendSandbox', { url: `/v1/sandboxes/${s.id}/suspend`, key });
      clock.advance(30 * 3600);
      await f.req('deleteSandbox', { url: `/v1/sandboxes/${s.id}`, key });
      const from = T0 - 6 * 3600_000; // 06:00 on day 1
      const u = await usage(f, key, `?per=day&from=${from / 1000}&to=${(T0 + 100 * 3600_000) / 1000}`);
      const day1 = Date.UTC(2026, 0, 10);
      assert.deepEqual(u.days.map((d: any) => [d.from, d.to]), [
        [new Date(from).toISOString(), new Date(day1 + 86_400_000).toISOString()],
        ...[1, 2, 3].map((i) => [new Date(day1 + i * 86_400_000).toISOString(), new Date(day1 + (i + 1) * 86_400_000).toISOString()]),
        [new Date(day1 + 4 * 86_400_000).toISOString(), new Date(T0 + 100 * 3600_000).toISOString()], // ends at 16:00 on day 5
      ]);
      const h = 3600;
      assert.deepEqual(u.days.map((d: any) => [d.totals.running_secs, d.totals.suspended_secs]), [
        [12 * h, 0], // day 1: 12:00–24:00
        [24 * h, 0], // day 2
        [0, 24 * h], // day 3: suspended from day 3 00:00 …
        [0, 6 * h], // day 4: … until 06:00, deleted
        [0, 0],
      ]);
      assert.equal(u.days[2].totals.snapshot_mib_secs, 24 * h * 512);
      // The days add up to the totals.
      for (const k of Object.keys(u.totals)) assert.equal(u.days.reduce((a: number, d: any) => a + d.totals[k], 0), u.totals[k], k);
      // Without per=day there are no days.
      assert.equal((await usage(f, key, `?from=${from / 1000}`)).days, undefined);
    } finally {
      await f.close();
    }
  });
});
