/**
 * Usage across hosts on a real PostgreSQL: a host's SQLite metering pushed to usage_intervals is
 * summed to the same figures as the host's own report; pushing again, or again after a restart,
 * adds nothing; a row closed after it was pushed open is updated; two hosts add up; a dead host's
 * open interval ends at its last heartbeat.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { migrateCluster, openClusterDb } from '../../../src/cluster/db.js';
import { clusterUsage, UsagePush } from '../../../src/cluster/usage.js';
import { Meter, type MeteredSandboxInfo } from '../../../src/service/metering.js';
import '../../../src/service/migrations.js';
import { openDb, type Db } from '../../../src/store/db.js';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../../support/postgres.js';

const skip = postgresUnavailable() ?? false;
const T0 = Date.UTC(2026, 5, 1, 12);

function box(id: string, state: 'running' | 'suspended', extra: Partial<MeteredSandboxInfo> = {}): MeteredSandboxInfo {
  return {
    id, tenant: 'acme', template: 'base', state, vcpus: 2, memory_mib: 256, disk_mib: 1024,
    created_at: new Date(T0).toISOString(), expires_at: new Date(T0 + 86_400_000).toISOString(), ...extra,
  } as MeteredSandboxInfo;
}

describe('usage pushed from each host to PostgreSQL', { skip }, () => {
  let server: ThrowawayPostgres;
  let pool: pg.Pool;
  let dir: string;
  const dbs: Db[] = [];

  before(async () => {
    server = await startPostgres();
    pool = openClusterDb({ url: server.createDatabase('usage') });
    await migrateCluster(pool);
    dir = mkdtempSync(join(tmpdir(), 'collimate-usage-'));
  });
  after(async () => {
    for (const d of dbs) d.close();
    await pool?.end();
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const hostDb = (name: string) => {
    const db = openDb(join(dir, `${name}.db`));
    dbs.push(db);
    return db;
  };
  const count = async (host: string) => (await pool.query('SELECT count(*)::int AS n FROM usage_intervals WHERE host_id = $1', [host])).rows[0].n as number;

  test('pushes are idempotent, survive a restart, update closed rows, and sum to the host\'s own figures', async () => {
    const db = hostDb('h1');
    let now = T0;
    const meter = new Meter(db, () => now);
    const push = new UsagePush(pool, db, 'h1');
    meter.observe(box('sbx_000000000001', 'running'), T0);
    meter.observe(box('sbx_000000000002', 'running'), T0);
    await push.start(3_600_000);
    assert.equal(await count('h1'), 2);
    // The first suspends (its running interval closes, a suspended one opens), the second is deleted.
    meter.observe(box('sbx_000000000001', 'suspended', { snapshot_bytes: 64 * 1048576 }), T0 + 60_000);
    meter.deleted('sbx_000000000002', T0 + 90_000);
    await push.push();
    await push.push();
    assert.equal(await count('h1'), 3, 'pushed twice, stored once');
    // A restart: a new pusher learns what PostgreSQL has, pushes nothing twice, and the rows closed since.
    meter.deleted('sbx_000000000001', T0 + 120_000);
    await push.stop();
    const again = new UsagePush(pool, db, 'h1');
    await again.start(3_600_000);
    assert.equal(await count('h1'), 3);
    assert.equal((await pool.query('SELECT count(*)::int AS n FROM usage_intervals WHERE host_id = $1 AND end_ms IS NULL', ['h1'])).rows[0].n, 0, 'every interval closed');
    now = T0 + 3_600_000;
    const range = [T0 - 1000, T0 + 3_600_000] as const;
    const local = meter.usage('acme', ...range, { perDay: true });
    assert.deepEqual(await clusterUsage(pool, 'acme', ...range, now, { perDay: true }), local);
    assert.equal(local.totals.running_secs, 150);
    assert.equal(local.totals.snapshot_mib_secs, 60 * 64);
    // A second host's sandbox adds to the tenant's totals; another tenant's does not.
    const db2 = hostDb('h2');
    const meter2 = new Meter(db2, () => now);
    meter2.observe(box('sbx_000000000003', 'running'), T0);
    meter2.deleted('sbx_000000000003', T0 + 30_000);
    meter2.observe(box('sbx_000000000004', 'running', { tenant: 'other' }), T0);
    const push2 = new UsagePush(pool, db2, 'h2');
    await push2.start(3_600_000);
    await push2.stop();
    await again.stop();
    const both = await clusterUsage(pool, 'acme', ...range, now);
    assert.equal(both.totals.running_secs, 180);
    assert.deepEqual(both.sandboxes.map((s) => s.id).sort(), ['sbx_000000000001', 'sbx_000000000002', 'sbx_000000000003']);
  });

  test('an open interval of a dead host counts until its last heartbeat', async () => {
    const db = hostDb('h3');
    const meter = new Meter(db, () => T0);
    meter.observe(box('sbx_000000000005', 'running', { tenant: 'dead-host' }), T0);
    const push = new UsagePush(pool, db, 'h3');
    await push.start(3_600_000);
    await push.stop();
    const at = T0 + 3_600_000;
    assert.equal((await clusterUsage(pool, 'dead-host', T0, at, at)).totals.running_secs, 3600, 'running: counts up to now');
    await pool.query(
      `INSERT INTO hosts (id, address, capacity, qemu_version, machine, cpu_model, accel, compat, state, epoch, heartbeat_at, lease_until, registered_at)
       VALUES ('h3', 'http://127.0.0.1:1', 1, '7.2', 'microvm', 'max', 'tcg', 'x', 'dead', 1, to_timestamp($1 / 1000.0), to_timestamp($1 / 1000.0), to_timestamp($1 / 1000.0))`,
      [T0 + 600_000],
    );
    assert.equal((await clusterUsage(pool, 'dead-host', T0, at, at)).totals.running_secs, 600, 'its host dead: up to the last heartbeat');
  });

  test('a sandbox the sweep marks lost is charged until then, not until its host returns and stops it', async () => {
    const db = hostDb('h4');
    const start = Date.now() - 60_000;
    const meter = new Meter(db, () => start);
    meter.observe(box('sbx_000000000006', 'running', { tenant: 'lost-one', created_at: new Date(start).toISOString() }), start);
    const push = new UsagePush(pool, db, 'h4');
    await push.start(3_600_000);
    await pool.query(
      `INSERT INTO hosts (id, address, capacity, qemu_version, machine, cpu_model, accel, compat, state, epoch, heartbeat_at, lease_until, registered_at)
       VALUES ('h4', 'http://127.0.0.1:2', 1, '7.2', 'microvm', 'max', 'tcg', 'x', 'alive', 1, now(), now(), now())`,
    );
    await pool.query(`INSERT INTO sandboxes (id, tenant, host_id, host_epoch, state, view) VALUES ('sbx_000000000006', 'lost-one', 'h4', 1, 'running', '{}')`);
    // What a sweep does: the host dead, its running sandboxes lost, in one statement each.
    await pool.query(`UPDATE hosts SET state = 'dead' WHERE id = 'h4'`);
    await pool.query(`UPDATE sandboxes SET state = 'lost' WHERE host_id = 'h4' AND state = 'running'`);
    const closed = (await pool.query(`SELECT end_ms FROM usage_intervals WHERE host_id = 'h4'`)).rows[0].end_ms;
    assert.ok(closed !== null && Number(closed) >= start, 'closed by the sweep');
    // The host returns an hour later and stops the VM: its own end does not replace the sweep's.
    meter.deleted('sbx_000000000006', Date.now() + 3_600_000);
    await push.stop();
    assert.equal((await pool.query(`SELECT end_ms FROM usage_intervals WHERE host_id = 'h4'`)).rows[0].end_ms, closed);
    const at = Date.now() + 7_200_000;
    const u = await clusterUsage(pool, 'lost-one', start - 1000, at, at);
    assert.ok(u.totals.running_secs < 3600, `charged until the sweep only (${u.totals.running_secs} s)`);
  });
});
