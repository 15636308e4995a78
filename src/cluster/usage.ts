/**
 * Usage across hosts. Each host meters its own sandboxes in its SQLite as on a single host
 * (src/service/metering.ts: one row per state interval, closed by the next transition) and pushes
 * those rows to PostgreSQL's usage_intervals in batches: every few seconds, and once more when it
 * leaves. A push is an upsert keyed by (host id, the row's local id), so pushing a row twice, or
 * again after a restart, changes nothing; a row is pushed when it is new and again until it is
 * closed. GET /v1/usage on any host sums the tenant's rows of every host with the single host's
 * arithmetic (usageOfIntervals).
 *
 * Why rows pushed from SQLite rather than written to PostgreSQL at each transition: metering must
 * never fail or slow a request (it does not on one host), and the journal stays the host's own, so
 * a database outage delays the cluster's figures instead of losing them. The cost is a lag of one
 * push period for closed intervals; open ones count up to the moment of the query either way.
 *
 * A host that died cannot close its open intervals. The sweep that marks its running sandboxes lost
 * closes theirs at that moment (a trigger, cluster migration 2), and an interval once closed in
 * PostgreSQL keeps its end, so the host's own later end (when it stops those VMs on return) does
 * not charge the time it was away. Its other open intervals (suspended sandboxes) count until its
 * last heartbeat while it is dead.
 */
import type pg from 'pg';
import type { Db } from '../store/db.js';
import { usageOfIntervals, type IntervalRow, type UsageReport } from '../service/metering.js';

/** How often a host pushes its metering rows (ms). */
export const USAGE_PUSH_MS = 5_000;
/** Rows per INSERT statement. */
const BATCH = 500;

const COLUMNS = ['tenant', 'sandbox', 'template', 'state', 'vcpus', 'memory_mib', 'disk_mib', 'snapshot_bytes', 'expires_ms', 'start_ms', 'end_ms'] as const;

export class UsagePush {
  /** The highest local id PostgreSQL has; rows above it are new. */
  private pushedUpTo = 0;
  /** Local ids pushed while still open: pushed again until PostgreSQL has them closed. */
  private open = new Set<number>();
  private timer?: NodeJS.Timeout;
  private running: Promise<void> = Promise.resolve();
  /** Whether pushedUpTo and open have been learnt from PostgreSQL (once, before the first push). */
  private known = false;
  private stopped = false;

  constructor(
    private readonly pool: pg.Pool,
    private readonly db: Db,
    private readonly hostId: string,
    private readonly onError: (err: unknown, what: string) => void = () => {},
  ) {}

  /** Pushes now, then every period (a failed push is retried at the next). */
  async start(periodMs = USAGE_PUSH_MS): Promise<void> {
    this.timer = setInterval(() => void this.push().catch((err) => this.onError(err, 'pushing usage to the cluster failed')), periodMs);
    this.timer.unref();
    await this.push();
  }

  /** Pushes what changed since the last push; one push at a time. */
  push(): Promise<void> {
    if (this.stopped) return Promise.resolve();
    const next = this.running.then(() => this.pushNow());
    this.running = next.catch(() => {});
    return next;
  }

  /** A last push, then no more. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.push().catch((err) => this.onError(err, 'pushing usage to the cluster failed'));
    this.stopped = true;
  }

  /** What PostgreSQL already has of this host (after a restart): its highest local id and its open rows. */
  private async learn(): Promise<void> {
    const r = await this.pool.query<{ local_id: string; end_ms: string | null }>(
      `SELECT local_id, end_ms FROM usage_intervals WHERE host_id = $1 AND (end_ms IS NULL OR local_id = (SELECT max(local_id) FROM usage_intervals WHERE host_id = $1))`,
      [this.hostId],
    );
    for (const row of r.rows) {
      this.pushedUpTo = Math.max(this.pushedUpTo, Number(row.local_id));
      if (row.end_ms === null) this.open.add(Number(row.local_id));
    }
    this.known = true;
  }

  private async pushNow(): Promise<void> {
    if (!this.known) await this.learn();
    const reopen = [...this.open];
    const rows = this.db
      .prepare(`SELECT * FROM usage_intervals WHERE id > ? OR id IN (SELECT value FROM json_each(?)) ORDER BY id`)
      .all(this.pushedUpTo, JSON.stringify(reopen)) as IntervalRow[];
    for (let i = 0; i < rows.length; i += BATCH) {
      const batch = rows.slice(i, i + BATCH);
      const values: unknown[] = [];
      const tuples = batch.map((row) => {
        const base = values.length;
        values.push(this.hostId, row.id, ...COLUMNS.map((c) => row[c]));
        return `(${Array.from({ length: COLUMNS.length + 2 }, (_, k) => `$${base + k + 1}`).join(', ')})`;
      });
      await this.pool.query(
        `INSERT INTO usage_intervals (host_id, local_id, ${COLUMNS.join(', ')}) VALUES ${tuples.join(', ')}
         ON CONFLICT (host_id, local_id) DO UPDATE SET end_ms = COALESCE(usage_intervals.end_ms, EXCLUDED.end_ms), expires_ms = EXCLUDED.expires_ms, snapshot_bytes = EXCLUDED.snapshot_bytes`,
        values,
      );
      for (const row of batch) {
        this.pushedUpTo = Math.max(this.pushedUpTo, row.id);
        if (row.end_ms === null) this.open.add(row.id);
        else this.open.delete(row.id);
      }
    }
  }
}

/**
 * The tenant's usage in [fromMs, toMs) over every host. An open interval of a dead host counts
 * until that host's last heartbeat (database clock, in ms).
 */
export async function clusterUsage(pool: pg.Pool, tenant: string, fromMs: number, toMs: number, at: number, opts: { perDay?: boolean } = {}): Promise<UsageReport> {
  const r = await pool.query(
    `SELECT u.local_id AS id, u.tenant, u.sandbox, u.template, u.state, u.vcpus, u.memory_mib, u.disk_mib, u.snapshot_bytes,
            u.expires_ms, u.start_ms,
            COALESCE(u.end_ms, CASE WHEN h.state = 'dead' THEN GREATEST(u.start_ms, (extract(epoch FROM h.heartbeat_at) * 1000)::bigint) END) AS end_ms
     FROM usage_intervals u LEFT JOIN hosts h ON h.id = u.host_id
     WHERE u.tenant = $1 AND u.start_ms < $2 AND (u.end_ms IS NULL OR u.end_ms > $3)
     ORDER BY u.sandbox, u.start_ms`,
    [tenant, toMs, fromMs],
  );
  const rows: IntervalRow[] = r.rows.map((x) => ({
    ...x,
    id: Number(x.id),
    expires_ms: x.expires_ms === null ? null : Number(x.expires_ms),
    start_ms: Number(x.start_ms),
    end_ms: x.end_ms === null ? null : Number(x.end_ms),
  }));
  return usageOfIntervals(rows, fromMs, toMs, at, opts);
}
