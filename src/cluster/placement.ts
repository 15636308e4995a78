/**
 * Placement and tenant caps across hosts, in one PostgreSQL transaction per create, fork or resume:
 *
 *   1. a capped tenant's transaction takes the tenant's advisory lock, so its admissions run one at
 *      a time cluster-wide, then counts its running sandboxes on alive hosts plus the slots of
 *      reservations still leased; over the cap → concurrency_limit;
 *   2. it picks a host: alive, lease current, of the asked compatibility class, holding the template
 *      (any host, for an environment: it pulls what it lacks), with capacity left (capacity − running
 *      − reserved ≥ slots); warm pools first, then hosts holding the artifact, then most room.
 *      A start from a snapshot prefers the hosts holding it, and may take fewer slots than asked
 *      (`upTo`): as many as a holder has room for, the rest spilling over to other hosts.
 *      Warm pools come from each host's heartbeat (every 2 s, so a pool just emptied may still
 *      count); artifacts held from blob_locations, which every host publishes anyway for pulls
 *      (every 30 s and after each pull): a host reported late only costs a pull that finds
 *      everything here, never a wrong answer.
 *      The host row is locked (FOR UPDATE, skipping rows other placements hold, so concurrent creates
 *      spread), which makes the capacity count exact too;
 *   3. it inserts a reservation of the slots on that host with a lease.
 *
 * The reservation counts against the cap and the host until the request ends (released then, after
 * the owner has written the new sandbox to the directory) or its lease runs out (a node that died
 * mid-create). Counting both for a moment over-counts, never under-counts: the cap never overshoots.
 * The owner still re-checks its own resources (memory, CPU, claims) and may refuse: the caller then
 * places again elsewhere.
 */
import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import { CollimateError, msg, see } from '../errors.js';
import { concurrencyLimit } from '../service/admission.js';
import type { Tier } from '../service/tiers.js';
import { inTransaction } from './db.js';

/** How long a reservation holds its slots if its request never ends (the node died mid-create). */
export const RESERVATION_LEASE_MS = 60_000;

export interface PlaceRequest {
  tenant: string;
  tier: Tier;
  slots: number;
  /** For the error message: "create", "fork of 4", "resume". */
  operation: string;
  /** A new sandbox from this template: any host holding it. */
  template?: string;
  /**
   * A new sandbox from a tenant's environment (instead of `template`): any host may take it, since
   * a host that lacks it pulls it (environmentPull.ts). Hosts with a warm pool for it come first
   * (`warmKey`, as hosts report their pools), then hosts holding its artifact (`artifactKey`), then
   * the rest.
   */
  environment?: { warmKey: string; artifactKey: string | null };
  /** Only hosts of this compatibility class (compatKey). */
  compat?: string;
  /** The sandbox must go on this host (fork children, a resume). */
  host?: string;
  /** Hosts that already refused this request. */
  exclude?: string[];
  /** Hosts to choose first (those holding a snapshot started from: they need not pull it). */
  prefer?: string[];
  /**
   * Take fewer slots than asked where there is room for fewer: a preferred host with room for some
   * gets what it has room for (Placement.slots), else a host with room for all, else the one with
   * room for the most; the caller places the rest in another round (a start of N from a snapshot
   * spilling over several hosts).
   */
  upTo?: boolean;
}

export interface Placement {
  reservationId: string;
  hostId: string;
  address: string;
  /** The slots reserved: all asked, or with `upTo` maybe fewer (at least one). */
  slots: number;
}

/** A host's capacity left (alias h): capacity − running sandboxes − leased reservations. */
export const FREE_OF_H = `h.capacity
  - (SELECT count(*) FROM sandboxes s WHERE s.host_id = h.id AND s.state = 'running')
  - (SELECT coalesce(sum(slots), 0) FROM reservations r WHERE r.host_id = h.id AND r.lease_until > now())`;

export class ClusterPlacement {
  constructor(private readonly pool: pg.Pool) {}

  async place(req: PlaceRequest): Promise<Placement> {
    return inTransaction(this.pool, async (tx) => {
      if (req.tier.maxRunning !== null) await this.checkCap(tx, req, req.tier.maxRunning);
      const host = await this.pickHost(tx, req);
      const id = 'rsv_' + randomBytes(8).toString('hex');
      await tx.query(
        `INSERT INTO reservations (id, tenant, host_id, slots, lease_until) VALUES ($1, $2, $3, $4, now() + $5 * interval '1 millisecond')`,
        [id, req.tenant, host.id, host.slots, RESERVATION_LEASE_MS],
      );
      return { reservationId: id, hostId: host.id, address: host.address, slots: host.slots };
    });
  }

  /** Ends a reservation (idempotent). */
  async release(reservationId: string): Promise<void> {
    await this.pool.query('DELETE FROM reservations WHERE id = $1', [reservationId]);
  }

  /** The tenant's occupancy across the cluster: running sandboxes on alive hosts and leased reservations. */
  async occupancy(tenant: string, c: pg.Pool | pg.PoolClient = this.pool): Promise<{ running: number; reserved: number }> {
    const r = await c.query<{ running: string; reserved: string }>(
      `SELECT (SELECT count(*) FROM sandboxes s JOIN hosts h ON h.id = s.host_id WHERE s.tenant = $1 AND s.state = 'running' AND h.state = 'alive') AS running,
              (SELECT coalesce(sum(slots), 0) FROM reservations WHERE tenant = $1 AND lease_until > now()) AS reserved`,
      [tenant],
    );
    return { running: Number(r.rows[0].running), reserved: Number(r.rows[0].reserved) };
  }

  private async checkCap(tx: pg.PoolClient, req: PlaceRequest, max: number): Promise<void> {
    // One admission of this tenant at a time across the cluster; released at commit or rollback.
    await tx.query(`SELECT pg_advisory_xact_lock(hashtextextended('collimate.tenant:' || $1, 0))`, [req.tenant]);
    const { running, reserved } = await this.occupancy(req.tenant, tx);
    if (running + reserved + req.slots > max) throw concurrencyLimit(req.tier, running, reserved, req.operation, req.slots);
  }

  private async pickHost(tx: pg.PoolClient, req: PlaceRequest): Promise<{ id: string; address: string; slots: number }> {
    const exclude = [...(req.exclude ?? [])];
    const least = req.upTo ? 1 : req.slots;
    const query = (skipLocked: boolean) =>
      tx.query<{ id: string; address: string }>(
        `SELECT h.id, h.address FROM hosts h, LATERAL (SELECT ${FREE_OF_H} AS free) f
         WHERE h.state = 'alive' AND h.lease_until > now() AND h.capacity > 0
           AND ($1::text IS NULL OR h.id = $1)
           AND ($2::text IS NULL OR $2 = ANY(h.templates))
           AND ($3::text IS NULL OR h.compat = $3)
           AND NOT (h.id = ANY($4::text[]))
           AND free >= $8
         ORDER BY (h.id = ANY($9::text[])) DESC, (free >= $5) DESC,
           (coalesce((h.warm_pools ->> coalesce($6, $2))::int, 0) > 0) DESC,
           (EXISTS (SELECT 1 FROM blob_locations b WHERE b.host_id = h.id AND b.kind = 'artifact-mem' AND b.of = $7)) DESC,
           free DESC, random()
         LIMIT 1
         FOR UPDATE OF h ${skipLocked ? 'SKIP LOCKED' : ''}`,
        [req.host ?? null, req.template ?? null, req.compat ?? null, exclude, req.slots, req.environment?.warmKey ?? null, req.environment?.artifactKey ?? null, least, req.prefer ?? []],
      );
    for (;;) {
      // Skipping locked rows spreads concurrent placements; if every fitting host is locked, wait for one.
      const picked = (await query(true)).rows[0] ?? (await query(false)).rows[0];
      if (!picked) throw await this.noHost(tx, req);
      // The choice was counted on the statement's snapshot, which may predate a placement that
      // committed on this host while we waited for its lock. Holding the lock now, a new statement
      // sees every reservation made on it: count again.
      const free = Number((await tx.query<{ free: string }>(`SELECT ${FREE_OF_H} AS free FROM hosts h WHERE h.id = $1`, [picked.id])).rows[0].free);
      if (free >= least) return { ...picked, slots: Math.min(free, req.slots) };
      exclude.push(picked.id);
    }
  }

  /** Why no host fits, as the error the client gets. */
  private async noHost(tx: pg.PoolClient, req: PlaceRequest): Promise<CollimateError> {
    if (req.host) {
      const h = (await tx.query<{ alive: boolean }>(`SELECT (state = 'alive' AND lease_until > now()) AS alive FROM hosts WHERE id = $1`, [req.host])).rows[0];
      return new CollimateError(
        'host_at_capacity',
        h?.alive
          ? `The host that holds this sandbox has no capacity left for ${req.operation} (${req.slots} sandbox${req.slots === 1 ? '' : 'es'}); children and resumes stay on their sandbox's host. Retry later, or delete sandboxes there.`
          : `The host that holds this sandbox is not available (its heartbeat lapsed); ${req.operation} cannot run until it returns.`,
        { retryAfterSecs: 5, details: { resource: 'cluster_host' } },
      );
    }
    if (req.template) {
      const any = await tx.query(`SELECT 1 FROM hosts WHERE state = 'alive' AND $1 = ANY(templates) LIMIT 1`, [req.template]);
      if (any.rowCount === 0) {
        return new CollimateError('template_not_found', msg`No host of the cluster offers template ${req.template}. List templates${see('listTemplates')}.`);
      }
    }
    return new CollimateError(
      'host_at_capacity',
      `No host of the cluster has capacity left for ${req.operation}${req.template ? ` from template ${req.template}` : ''}; retry shortly or add hosts (collimate serve --cluster … --capacity N).`,
      { retryAfterSecs: 5, details: { resource: 'cluster_capacity' } },
    );
  }
}
