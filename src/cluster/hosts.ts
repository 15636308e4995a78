/**
 * Host membership: a host registers (address, capacity, compatibility class), renews its lease with
 * a heartbeat, and any node marks a host whose heartbeat is stale dead. There is no leader: the sweep
 * is one idempotent UPDATE that any node may run, and PostgreSQL serializes it.
 *
 * Every time here is the database's clock (now()), so hosts with skewed clocks agree. The one local
 * clock is the host's own view of its lease: it counts from the moment it *sent* the heartbeat that
 * renewed it (monotonic), so it always ends no later than the lease the database recorded. A host
 * whose lease has run out by that count fences itself: it takes no create, fork or resume until a
 * heartbeat succeeds again. Since deadAfter > lease, a host is fenced before any peer can mark it
 * dead, so a host marked dead is never still placing VMs it believes are its own.
 *
 * A host marked dead bumps its epoch; its next heartbeat (of the old epoch) is refused, and it must
 * register again, which first tells it which of its sandboxes the cluster marked lost (it stops them).
 */
import { performance } from 'node:perf_hooks';
import type pg from 'pg';
import { inTransaction } from './db.js';

/** What a host can restore: snapshots and fork points move only within one class. */
export interface CompatClass {
  qemuVersion: string;
  machine: string;
  cpuModel: string;
  accel: string;
}

/** The alive hosts of the cluster other than `self`, by id. */
export async function alivePeers(pool: pg.Pool, self: string): Promise<Array<{ id: string; address: string }>> {
  const r = await pool.query<{ id: string; address: string }>(`SELECT id, address FROM hosts WHERE state = 'alive' AND id <> $1 ORDER BY id`, [self]);
  return r.rows;
}

export function compatKey(c: CompatClass): string {
  return `qemu=${c.qemuVersion};machine=${c.machine};cpu=${c.cpuModel};accel=${c.accel}`;
}

export interface HostTimings {
  /** How often the heartbeat runs. Default 1000 ms. */
  heartbeatMs: number;
  /** How long one heartbeat keeps the lease. Default 10000 ms. */
  leaseMs: number;
  /** A host whose last heartbeat is older than this is marked dead by any node. Default 15000 ms; must exceed leaseMs. */
  deadAfterMs: number;
}

export const DEFAULT_TIMINGS: HostTimings = { heartbeatMs: 2000, leaseMs: 10_000, deadAfterMs: 15_000 };

export interface HostReport {
  /** Templates this host can create from now. */
  templates: string[];
  /** Ready warm VMMs per template. */
  warmPools: Record<string, number>;
}

export interface HostRegistration {
  id: string;
  /** How peers reach this host's API (http://ADDR:PORT). */
  address: string;
  capacity: number;
  compat: CompatClass;
}

export interface HostRow {
  id: string;
  address: string;
  capacity: number;
  compat: string;
  state: 'alive' | 'dead';
  epoch: number;
  templates: string[];
  warm_pools: Record<string, number>;
}

export interface MembershipEvents {
  /** Sandboxes of this host the cluster marked lost while it was away: stop their VMs. */
  onLost?: (ids: string[]) => Promise<void> | void;
  /** A heartbeat or sweep failed (the database is unreachable, say). */
  onError?: (err: unknown, what: string) => void;
  /** Hosts this node's sweep marked dead, with the sandboxes that became lost. */
  onSwept?: (hosts: string[], lostSandboxes: number) => void;
}

export class HostMembership {
  private epoch = 0;
  /** performance.now() until which this host's lease certainly holds. */
  private leaseValidUntil = -Infinity;
  private timer: NodeJS.Timeout | null = null;
  private beating: Promise<void> | null = null;
  private stopped = false;

  constructor(
    private readonly pool: pg.Pool,
    readonly self: HostRegistration,
    private readonly report: () => HostReport,
    readonly timings: HostTimings = DEFAULT_TIMINGS,
    private readonly events: MembershipEvents = {},
  ) {
    if (!(timings.deadAfterMs > timings.leaseMs && timings.leaseMs > timings.heartbeatMs)) {
      throw new Error('cluster timings must satisfy heartbeat < lease < dead-after, so a host fences itself before peers declare it dead');
    }
  }

  get hostEpoch(): number {
    return this.epoch;
  }

  /**
   * Whether this host may take a new sandbox (create, fork, resume): registered, and its lease
   * certainly not expired by its own conservative count.
   */
  holdsLease(): boolean {
    return !this.stopped && this.epoch > 0 && performance.now() < this.leaseValidUntil;
  }

  /**
   * Registers (or re-registers) this host: a new epoch, alive, a fresh lease. Sandboxes the cluster
   * marked lost on this host are handed to onLost first and dropped from the directory.
   */
  async register(): Promise<void> {
    const sent = performance.now();
    const { templates, warmPools } = this.report();
    const c = this.self.compat;
    const lost = await inTransaction(this.pool, async (tx) => {
      const r = await tx.query<{ epoch: string }>(
        `INSERT INTO hosts (id, address, capacity, qemu_version, machine, cpu_model, accel, compat, state, epoch, heartbeat_at, lease_until, registered_at, templates, warm_pools)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'alive', 1, now(), now() + $9 * interval '1 millisecond', now(), $10, $11)
         ON CONFLICT (id) DO UPDATE SET address = EXCLUDED.address, capacity = EXCLUDED.capacity, qemu_version = EXCLUDED.qemu_version,
           machine = EXCLUDED.machine, cpu_model = EXCLUDED.cpu_model, accel = EXCLUDED.accel, compat = EXCLUDED.compat, state = 'alive',
           epoch = hosts.epoch + 1, heartbeat_at = now(), lease_until = EXCLUDED.lease_until, registered_at = now(),
           templates = EXCLUDED.templates, warm_pools = EXCLUDED.warm_pools
         RETURNING epoch`,
        [this.self.id, this.self.address, this.self.capacity, c.qemuVersion, c.machine, c.cpuModel, c.accel, compatKey(c), this.timings.leaseMs, templates, JSON.stringify(warmPools)],
      );
      this.epoch = Number(r.rows[0].epoch);
      const gone = await tx.query<{ id: string }>(`DELETE FROM sandboxes WHERE host_id = $1 AND state = 'lost' RETURNING id`, [this.self.id]);
      return gone.rows.map((x) => x.id);
    });
    this.leaseValidUntil = sent + this.timings.leaseMs;
    if (lost.length > 0) await this.events.onLost?.(lost);
  }

  /**
   * Renews the lease and reports templates and warm pools. Returns false when the cluster no longer
   * knows this host at this epoch (it was marked dead): the caller registers again.
   */
  async heartbeat(): Promise<boolean> {
    const sent = performance.now();
    const { templates, warmPools } = this.report();
    const r = await this.pool.query(
      `UPDATE hosts SET heartbeat_at = now(), lease_until = now() + $3 * interval '1 millisecond', templates = $4, warm_pools = $5
       WHERE id = $1 AND epoch = $2 AND state = 'alive'`,
      [this.self.id, this.epoch, this.timings.leaseMs, templates, JSON.stringify(warmPools)],
    );
    if (r.rowCount === 1) {
      this.leaseValidUntil = sent + this.timings.leaseMs;
      return true;
    }
    this.leaseValidUntil = -Infinity;
    return false;
  }

  /**
   * Marks every host whose heartbeat is older than deadAfter dead (a new epoch), and its running
   * sandboxes lost, in one transaction. Idempotent: any node may run it at any time.
   */
  async sweep(): Promise<{ hosts: string[]; lost: number }> {
    return inTransaction(this.pool, async (tx) => {
      const dead = await tx.query<{ id: string }>(
        `UPDATE hosts SET state = 'dead', epoch = epoch + 1
         WHERE state = 'alive' AND heartbeat_at < now() - $1 * interval '1 millisecond' RETURNING id`,
        [this.timings.deadAfterMs],
      );
      const ids = dead.rows.map((x) => x.id);
      if (ids.length === 0) return { hosts: [], lost: 0 };
      const lost = await tx.query(
        `UPDATE sandboxes SET state = 'lost', updated_at = now(), view = jsonb_set(view, '{state}', '"lost"') WHERE host_id = ANY($1) AND state = 'running'`,
        [ids],
      );
      await tx.query('DELETE FROM reservations WHERE host_id = ANY($1)', [ids]);
      return { hosts: ids, lost: lost.rowCount ?? 0 };
    });
  }

  /** Registers, then heartbeats and sweeps every heartbeatMs until stop(). */
  async start(): Promise<void> {
    await this.register();
    const tick = () => {
      if (this.stopped) return;
      this.beating = this.beat().finally(() => {
        this.beating = null;
        if (!this.stopped) this.timer = setTimeout(tick, this.timings.heartbeatMs);
      });
    };
    this.timer = setTimeout(tick, this.timings.heartbeatMs);
  }

  private async beat(): Promise<void> {
    try {
      if (!(await this.heartbeat())) await this.register();
    } catch (err) {
      this.events.onError?.(err, 'cluster heartbeat failed');
    }
    try {
      const swept = await this.sweep();
      if (swept.hosts.length > 0) this.events.onSwept?.(swept.hosts, swept.lost);
    } catch (err) {
      this.events.onError?.(err, 'cluster sweep failed');
    }
  }

  /** Stops heartbeating (the lease runs out; peers mark the host dead unless it deregisters). */
  async stop(opts: { deregister?: boolean } = {}): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.beating;
    if (opts.deregister && this.epoch > 0) {
      // A clean stop: peers stop placing here at once instead of after deadAfter. The host's
      // sandboxes stay in the directory (their VMs keep running, a restart re-adopts them).
      await this.pool.query(`UPDATE hosts SET lease_until = now() WHERE id = $1 AND epoch = $2`, [this.self.id, this.epoch]);
    }
  }

  /** Every host the cluster knows. */
  async hosts(): Promise<HostRow[]> {
    const r = await this.pool.query(`SELECT id, address, capacity, compat, state, epoch, templates, warm_pools FROM hosts ORDER BY id`);
    return r.rows.map((x) => ({ ...x, epoch: Number(x.epoch) }));
  }
}
