/**
 * The cluster catalog on a real PostgreSQL 15 (a throwaway one, test/support/postgres.ts): schema
 * migrations, host membership, placement and tenant caps, keys and idempotency. Each "node" is a
 * pool of its own, as each host's process would have.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { migrateCluster, openClusterDb } from '../../../src/cluster/db.js';
import { CLUSTER_MIGRATIONS } from '../../../src/cluster/migrations.js';
import { HostMembership, type HostRegistration } from '../../../src/cluster/hosts.js';
import { SandboxDirectory } from '../../../src/cluster/directory.js';
import { ClusterPlacement } from '../../../src/cluster/placement.js';
import { ClusterKeys, KeyCache } from '../../../src/cluster/keys.js';
import '../../../src/service/migrations.js';
import { openDb } from '../../../src/store/db.js';
import { ClusterIdempotency } from '../../../src/cluster/idempotency.js';
import { CollimateError } from '../../../src/errors.js';
import { TIERS } from '../../../src/service/tiers.js';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../../support/postgres.js';

const skip = postgresUnavailable() ?? false;
const COMPAT = { qemuVersion: '7.2.0', machine: 'microvm', cpuModel: 'max', accel: 'tcg' };
/** A lease that lapses within the test (1.5 s), long enough that a slow register still returns holding it. */
const SHORT_LEASE = { heartbeatMs: 50, leaseMs: 1500, deadAfterMs: 2000 };
/** For tests about something else: a lease that outlasts the test without heartbeats. */
const LONG = { heartbeatMs: 1000, leaseMs: 600_000, deadAfterMs: 1_200_000 };
/** Background heartbeats and sweeps, with margins a loaded machine does not use up. */
const BACKGROUND = { heartbeatMs: 100, leaseMs: 2000, deadAfterMs: 3000 };

let server: ThrowawayPostgres;
let dbCount = 0;
const pools: pg.Pool[] = [];

/** A fresh, migrated database and `n` pools on it (one per simulated node). */
async function cluster(n: number): Promise<pg.Pool[]> {
  const url = server.createDatabase(`c${++dbCount}`);
  const mine = Array.from({ length: n }, () => openClusterDb({ url, max: 20 }));
  pools.push(...mine);
  await migrateCluster(mine[0]);
  return mine;
}

function host(id: string, capacity = 10, extra: Partial<HostRegistration> = {}): HostRegistration {
  return { id, address: `http://127.0.0.1:${7000 + Number(id.replace(/\D/g, '') || 0)}`, capacity, compat: COMPAT, ...extra };
}

const report = (templates = ['base'], warm: Record<string, number> = {}) => () => ({ templates, warmPools: warm });

async function until(what: string, cond: () => boolean | Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

function codeOf(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => 'ok',
    (e) => (e instanceof CollimateError ? e.code : `unexpected: ${(e as Error).message}`),
  );
}

describe('cluster catalog on PostgreSQL', { skip }, () => {
  before(async () => {
    server = await startPostgres();
  });
  after(async () => {
    await Promise.all(pools.map((p) => p.end()));
    await server?.stop();
  });

  test('migrations started by several hosts at once apply each version once, then none', async () => {
    const url = server.createDatabase('migrations');
    const nodes = Array.from({ length: 5 }, () => openClusterDb({ url }));
    pools.push(...nodes);
    const applied = await Promise.all(nodes.map((p) => migrateCluster(p)));
    const versions = CLUSTER_MIGRATIONS.map((_, i) => i + 1);
    assert.deepEqual(applied.flat().sort((x, y) => x - y), versions, 'exactly one node applied each version');
    assert.deepEqual(await migrateCluster(nodes[0]), []);
    const r = await nodes[0].query('SELECT version FROM schema_migrations ORDER BY version');
    assert.deepEqual(r.rows, versions.map((version) => ({ version })));
    // A database newer than this binary is refused, not guessed at.
    await nodes[0].query('INSERT INTO schema_migrations (version) VALUES (99)');
    await assert.rejects(migrateCluster(nodes[1]), new RegExp(`schema version 99 but this collimate knows only ${versions.length}`));
  });

  test('a host registers and heartbeats; a stale host is marked dead by any node, its running sandboxes lost, and it learns them on rejoining', async () => {
    const [a, b] = await cluster(2);
    const lostSeen: string[][] = [];
    // Staleness is made below by moving h1's heartbeat back in the database: the timings are long,
    // so that on a loaded machine nothing goes stale by itself between two lines of this test.
    const h1 = new HostMembership(a, host('h1'), report(), LONG, { onLost: (ids) => void lostSeen.push(ids) });
    const h2 = new HostMembership(b, host('h2'), report(), LONG);
    await h1.register();
    await h2.register();
    assert.equal(h1.holdsLease(), true);
    assert.equal(await h1.heartbeat(), true);
    const dir = new SandboxDirectory(a);
    dir.record('h1', h1.hostEpoch, 'sbx_000000000001', 't', 'running', { id: 'sbx_000000000001', state: 'running' });
    dir.record('h1', h1.hostEpoch, 'sbx_000000000002', 't', 'suspended', { id: 'sbx_000000000002', state: 'suspended' });
    await dir.flushed();

    // Nothing is stale yet: a sweep changes nothing.
    assert.deepEqual(await h2.sweep(), { hosts: [], lost: 0 });
    // h1's last heartbeat, by the database's clock, long ago.
    await a.query(`UPDATE hosts SET heartbeat_at = now() - interval '1 hour' WHERE id = 'h1'`);
    assert.deepEqual(await h2.sweep(), { hosts: ['h1'], lost: 1 });
    assert.deepEqual(await h2.sweep(), { hosts: [], lost: 0 }, 'idempotent');
    const rows = await dir.ofHost('h1');
    assert.deepEqual(rows, [{ id: 'sbx_000000000001', state: 'lost' }, { id: 'sbx_000000000002', state: 'suspended' }]);
    assert.equal((await dir.lookup('t', 'sbx_000000000001'))!.view.state, 'lost');

    // h1's next heartbeat is of an older epoch: refused, and it fences itself at once.
    assert.equal(await h1.heartbeat(), false);
    assert.equal(h1.holdsLease(), false);
    // The lost sandbox stays lost whatever its old owner writes.
    dir.record('h1', h1.hostEpoch, 'sbx_000000000001', 't', 'running', { id: 'sbx_000000000001', state: 'running' });
    await dir.flushed();
    assert.equal((await dir.lookup('t', 'sbx_000000000001'))!.state, 'lost');
    // Rejoining hands it its lost sandboxes (to stop their VMs) and drops them from the directory.
    await h1.register();
    assert.deepEqual(lostSeen, [['sbx_000000000001']]);
    assert.deepEqual(await dir.ofHost('h1'), [{ id: 'sbx_000000000002', state: 'suspended' }]);
    assert.equal(h1.holdsLease(), true);
  });

  test('a host that cannot renew its lease stops holding it, before peers may mark it dead', async () => {
    const [a] = await cluster(1);
    const h = new HostMembership(a, host('h1'), report(), SHORT_LEASE);
    await h.register();
    assert.equal(h.holdsLease(), true);
    // No heartbeat: the lease runs out by the host's own count.
    await until('the lease to lapse', () => !h.holdsLease());
    // A heartbeat renews it.
    assert.equal(await h.heartbeat(), true);
    assert.equal(h.holdsLease(), true);
    assert.throws(() => new HostMembership(a, host('h9'), report(), { heartbeatMs: 100, leaseMs: 500, deadAfterMs: 500 }), /heartbeat < lease < dead-after/);
  });

  test('start() heartbeats in the background and a stopped host is swept dead by a peer', async () => {
    const [a, b] = await cluster(2);
    // Dead after 3 s: h1 (stopped) goes stale soon enough, while h2, beating every 100 ms, would need
    // a stall of seconds to be swept itself.
    const h1 = new HostMembership(a, host('h1'), report(), BACKGROUND);
    const h2 = new HostMembership(b, host('h2'), report(), BACKGROUND);
    await h1.start();
    await h2.start();
    try {
      const beats = async () => Number((await a.query(`SELECT extract(epoch FROM heartbeat_at) AS t FROM hosts WHERE id = 'h1'`)).rows[0].t);
      const first = await beats();
      await until('a background heartbeat', async () => (await beats()) > first);
      await h1.stop();
      await until('h2 to sweep the silent h1 dead', async () => (await h2.hosts()).find((x) => x.id === 'h1')!.state === 'dead');
      assert.equal((await h2.hosts()).find((x) => x.id === 'h2')!.state, 'alive');
    } finally {
      await h1.stop();
      await h2.stop();
    }
  });

  test('the Demo cap of 2 holds under 50 concurrent creates through 3 nodes, round after round', async () => {
    const nodes = await cluster(3);
    for (const [i, p] of nodes.entries()) await new HostMembership(p, host(`h${i + 1}`), report(), LONG).register();
    const placements = nodes.map((p) => new ClusterPlacement(p));
    const dir = new SandboxDirectory(nodes[0]);
    for (let round = 0; round < 5; round++) {
      const outcomes = await Promise.all(
        Array.from({ length: 50 }, (_, i) =>
          placements[i % 3].place({ tenant: 'demo1', tier: TIERS.demo, slots: 1, operation: 'create', template: 'base' }).then(
            (p) => p,
            (e: CollimateError) => e,
          ),
        ),
      );
      const won = outcomes.filter((o) => !(o instanceof Error)) as Array<{ reservationId: string; hostId: string }>;
      const refused = outcomes.filter((o) => o instanceof CollimateError && o.code === 'concurrency_limit');
      assert.equal(won.length, 2, `round ${round}: exactly 2 admitted`);
      assert.equal(refused.length, 48, `round ${round}: the other 48 refused with concurrency_limit`);
      // The two become running sandboxes (the owner writes the directory), then the reservations end.
      for (const [i, w] of won.entries()) dir.record(w.hostId, 1, `sbx_${round}0000000000${i}`.slice(0, 16), 'demo1', 'running');
      await dir.flushed();
      await Promise.all(won.map((w) => placements[0].release(w.reservationId)));
      assert.deepEqual(await placements[1].occupancy('demo1'), { running: 2, reserved: 0 });
      assert.equal(await codeOf(placements[2].place({ tenant: 'demo1', tier: TIERS.demo, slots: 1, operation: 'create', template: 'base' })), 'concurrency_limit');
      // Deleting them frees the slots for the next round.
      for (const [i, w] of won.entries()) dir.record(w.hostId, 1, `sbx_${round}0000000000${i}`.slice(0, 16), 'demo1', null);
      await dir.flushed();
    }
    // Another tenant is not affected by demo1's use, and an uncapped tier takes no lock.
    assert.equal(await codeOf(placements[0].place({ tenant: 'other', tier: TIERS.demo, slots: 2, operation: 'fork of 2', template: 'base' })), 'ok');
    assert.equal(await codeOf(placements[0].place({ tenant: 'other', tier: TIERS.demo, slots: 1, operation: 'create', template: 'base' })), 'concurrency_limit');
    assert.equal(await codeOf(placements[0].place({ tenant: 'pro1', tier: TIERS.pro, slots: 5, operation: 'create', template: 'base' })), 'ok');
  });

  test('sandboxes on a dead host stop counting against the cap', async () => {
    const [a, b] = await cluster(2);
    const h1 = new HostMembership(a, host('h1'), report(), LONG);
    const h2 = new HostMembership(b, host('h2'), report(), LONG);
    await h1.register();
    await h2.register();
    const dir = new SandboxDirectory(a);
    dir.record('h1', 1, 'sbx_00000000000a', 'd', 'running');
    dir.record('h1', 1, 'sbx_00000000000b', 'd', 'running');
    await dir.flushed();
    const place = new ClusterPlacement(b);
    assert.equal(await codeOf(place.place({ tenant: 'd', tier: TIERS.demo, slots: 1, operation: 'create', template: 'base' })), 'concurrency_limit');
    await a.query(`UPDATE hosts SET heartbeat_at = now() - interval '1 hour' WHERE id = 'h1'`);
    await h2.sweep();
    const p = await place.place({ tenant: 'd', tier: TIERS.demo, slots: 1, operation: 'create', template: 'base' });
    assert.equal(p.hostId, 'h2', 'placed on the alive host only');
  });

  test('placement spreads over alive hosts with room, prefers a warm pool, respects capacity and the compatibility class', async () => {
    const nodes = await cluster(3);
    await new HostMembership(nodes[0], host('h1', 10), report(['base']), LONG).register();
    await new HostMembership(nodes[1], host('h2', 10), report(['base', 'python']), LONG).register();
    await new HostMembership(nodes[2], host('h3', 10), report(['base', 'python'], { python: 1 }), LONG).register();
    await new HostMembership(nodes[2], host('h4', 0), report(['base']), LONG).register(); // API-only
    const place = nodes.map((p) => new ClusterPlacement(p));
    const spread = await Promise.all(Array.from({ length: 30 }, (_, i) => place[i % 3].place({ tenant: 'p', tier: TIERS.pro, slots: 1, operation: 'create', template: 'base' })));
    const per = new Map<string, number>();
    for (const s of spread) per.set(s.hostId, (per.get(s.hostId) ?? 0) + 1);
    assert.deepEqual([...per.keys()].sort(), ['h1', 'h2', 'h3'], `30 creates landed on every VM host (${JSON.stringify([...per])}), none on the API-only one`);
    assert.ok([...per.values()].every((n) => n === 10), 'capacity 10 each: exactly full');
    assert.equal(await codeOf(place[0].place({ tenant: 'p', tier: TIERS.pro, slots: 1, operation: 'create', template: 'base' })), 'host_at_capacity');
    await Promise.all(spread.map((s) => place[0].release(s.reservationId)));
    // The warm pool wins when there is room everywhere.
    assert.equal((await place[0].place({ tenant: 'p', tier: TIERS.pro, slots: 1, operation: 'create', template: 'python' })).hostId, 'h3');
    // Only hosts holding the template; none at all is template_not_found.
    assert.equal((await place[0].place({ tenant: 'p', tier: TIERS.pro, slots: 1, operation: 'create', template: 'python', exclude: ['h3'] })).hostId, 'h2');
    assert.equal(await codeOf(place[0].place({ tenant: 'p', tier: TIERS.pro, slots: 1, operation: 'create', template: 'nope' })), 'template_not_found');
    assert.equal(await codeOf(place[0].place({ tenant: 'p', tier: TIERS.pro, slots: 1, operation: 'create', template: 'base', compat: 'qemu=8;machine=microvm;cpu=max;accel=kvm' })), 'host_at_capacity');
    // A fork stays on its parent's host, or is refused when that host is full.
    assert.equal((await place[0].place({ tenant: 'p', tier: TIERS.pro, slots: 4, operation: 'fork of 4', host: 'h2' })).hostId, 'h2');
    const full = place[0].place({ tenant: 'p', tier: TIERS.pro, slots: 7, operation: 'fork of 7', host: 'h2' });
    await assert.rejects(full, (e: CollimateError) => e.code === 'host_at_capacity' && /stay on their sandbox's host/.test(e.message));
  });

  test('a start from a snapshot prefers the hosts holding it, and with upTo takes what a host has room for, spilling the rest round after round', async () => {
    const nodes = await cluster(1);
    for (const [id, cap] of [['h1', 3], ['h2', 5], ['h3', 5]] as const) await new HostMembership(nodes[0], host(id, cap), report(['base']), LONG).register();
    const place = new ClusterPlacement(nodes[0]);
    const ask = (slots: number, more: Partial<Parameters<ClusterPlacement['place']>[0]> = {}) => place.place({ tenant: 'p', tier: TIERS.pro, slots, operation: `start of ${slots} from a snapshot`, ...more });
    // A holder with room for all wins over roomier hosts that would have to pull.
    const held = await ask(2, { prefer: ['h1'], upTo: true });
    assert.deepEqual([held.hostId, held.slots], ['h1', 2]);
    await place.release(held.reservationId);
    // A holder with room for some takes what it has room for; the rest go to a host with room for all of them.
    const some = await ask(4, { prefer: ['h1'], upTo: true });
    assert.deepEqual([some.hostId, some.slots], ['h1', 3]);
    const rest = await ask(1, { prefer: ['h1'], upTo: true });
    assert.equal(rest.slots, 1);
    assert.notEqual(rest.hostId, 'h1');
    // Without upTo, a start takes all its slots on one host or none: 4 go to a host with room for 4.
    await place.release(some.reservationId);
    await place.release(rest.reservationId);
    const whole = await ask(4, { prefer: ['h1'] });
    assert.equal(whole.slots, 4);
    assert.notEqual(whole.hostId, 'h1');
    await place.release(whole.reservationId);
    // Without upTo, 12 fit nowhere; with it, the spill takes every slot of the cluster in three rounds, the holder first.
    assert.equal(await codeOf(ask(12)), 'host_at_capacity');
    const rounds: Array<[string, number]> = [];
    for (let left = 13; left > 0;) {
      const p = await ask(left, { prefer: ['h1'], upTo: true }).catch((e: CollimateError) => e);
      if (p instanceof CollimateError) {
        assert.equal(p.code, 'host_at_capacity');
        break;
      }
      rounds.push([p.hostId, p.slots]);
      left -= p.slots;
    }
    assert.equal(rounds.reduce((n, [, k]) => n + k, 0), 13, `every slot of the cluster was given: ${JSON.stringify(rounds)}`);
    assert.deepEqual(rounds.map(([, k]) => k).sort(), [3, 5, 5], 'each host gave what it had room for');
    assert.deepEqual(rounds[0], ['h1', 3], 'the holder takes what it has room for first');
    assert.equal(await codeOf(ask(1, { upTo: true })), 'host_at_capacity', 'the cluster is full');
  });

  test('a key made through one node authenticates on every node until it is revoked', async () => {
    const [a, b] = await cluster(2);
    const ka = new ClusterKeys(a);
    const kb = new ClusterKeys(b);
    const { key, record } = await ka.create({ tenant: 'acme', tier: 'pro', name: 'ci' });
    assert.equal(record.tier, 'pro');
    const p = await kb.authenticate(key);
    assert.equal(p?.tenant, 'acme');
    assert.equal(p?.tier.name, 'pro');
    assert.equal((await kb.list({ tenant: 'acme' })).length, 1);
    const second = await kb.create({ tenant: 'acme', tier: 'demo' });
    assert.equal(second.tierChanged, true);
    assert.equal((await ka.authenticate(key))?.tier.name, 'demo', 'the tier belongs to the tenant');
    assert.equal((await ka.revoke(record.id))?.id, record.id);
    assert.equal(await kb.authenticate(key), null);
    assert.equal(await kb.authenticate('clm_' + 'x'.repeat(40)), null);
    await assert.rejects(ka.create({ tenant: 'Bad Name' }), (e: CollimateError) => e.code === 'validation_error');
  });

  test('a host\'s key cache answers from the cluster, learns a revocation after its refresh, and keeps its last answer while the database is unreachable', async () => {
    const [a, b] = await cluster(2);
    const keys = new ClusterKeys(a);
    const { key, record } = await keys.create({ tenant: 'cached', tier: 'pro' });
    const other = await keys.create({ tenant: 'cached2' });
    const cache = new KeyCache(openDb(':memory:'), new ClusterKeys(b), 0);
    assert.equal(cache.authenticate(key), null, 'nothing known before load()');
    await cache.load(key);
    assert.equal(cache.authenticate(key)?.tenant, 'cached');
    assert.equal(cache.tierOf('cached')?.name, 'pro');
    await keys.revoke(record.id);
    await cache.load(key); // refresh period 0: asks again
    assert.equal(cache.authenticate(key), null);
    await cache.load(other.key);
    await b.end(); // the database is gone for this host
    await cache.load(other.key);
    assert.equal(cache.authenticate(other.key)?.tenant, 'cached2', 'the last answer is kept');
    const unseen = (await keys.create({ tenant: 'cached3' })).key;
    await assert.rejects(cache.load(unseen), (e: CollimateError) => e.code === 'host_at_capacity' && e.details?.resource === 'cluster_database');
    pools.splice(pools.indexOf(b), 1);
  });

  test('one Idempotency-Key sent to three nodes at once runs once; a different body under it is refused', async () => {
    const nodes = await cluster(3);
    const idem = nodes.map((p) => new ClusterIdempotency(p));
    let runs = 0;
    const exec = async () => {
      runs++;
      await new Promise((r) => setTimeout(r, 50));
      return { status: 201, body: { id: 'sbx_000000000abc' } };
    };
    const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => idem[i % 3].run('t', 'key-1', 'fp', exec)));
    assert.equal(runs, 1);
    assert.ok(answers.every((a) => a.status === 201 && (a.body as { id: string }).id === 'sbx_000000000abc'));
    assert.equal(answers.filter((a) => !a.replayed).length, 1);
    await assert.rejects(idem[1].run('t', 'key-1', 'other', exec), (e: CollimateError) => e.code === 'idempotency_key_reused');
    // Another tenant's same key is its own.
    await idem[2].run('u', 'key-1', 'other', exec);
    assert.equal(runs, 2);
    // A failure is not stored: a retry runs again.
    await assert.rejects(idem[0].run('t', 'key-2', 'fp', async () => { throw new Error('boom'); }), /boom/);
    assert.equal((await idem[1].run('t', 'key-2', 'fp', exec)).replayed, false);
    // A claim whose node died (lease over) is taken over.
    await nodes[0].query(`INSERT INTO idempotency (tenant, key, fingerprint, state, lease_until) VALUES ('t', 'key-3', 'fp', 'pending', now() - interval '1 second')`);
    assert.equal((await idem[2].run('t', 'key-3', 'fp', exec)).replayed, false);
  });
});
