/**
 * The sandbox directory: which host owns each sandbox, its state, and the view its owner last wrote
 * (what GET /v1/sandboxes lists on every node). Only the owner writes a sandbox's row, from the
 * engine's persisted transitions, in order; a row of an older host epoch is never overwritten by
 * the owner once a sweep marked it lost.
 */
import type pg from 'pg';

export type DirectoryState = 'running' | 'suspended' | 'lost';

export interface DirectoryEntry {
  id: string;
  tenant: string;
  hostId: string;
  hostAddress: string;
  hostAlive: boolean;
  state: DirectoryState;
  view: Record<string, unknown>;
}

export class SandboxDirectory {
  /** The tail of this host's ordered writes: flushed() waits for it. */
  private tail: Promise<void> = Promise.resolve();

  constructor(private readonly pool: pg.Pool, private readonly onError: (err: unknown, what: string) => void = () => {}) {}

  /**
   * Queues this host's write of a sandbox's state (or its removal, state null). Writes run one at a
   * time in the order queued, so the directory never goes back to an older state.
   */
  record(hostId: string, hostEpoch: number, id: string, tenant: string, state: 'running' | 'suspended' | null, view?: Record<string, unknown>): void {
    this.tail = this.tail.then(async () => {
      try {
        if (state === null) {
          await this.pool.query('DELETE FROM sandboxes WHERE id = $1 AND host_id = $2', [id, hostId]);
        } else {
          // A row the cluster marked lost stays lost: the owner learns it when it registers again.
          await this.pool.query(
            `INSERT INTO sandboxes (id, tenant, host_id, host_epoch, state, view) VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, view = EXCLUDED.view, host_epoch = EXCLUDED.host_epoch, updated_at = now()
             WHERE sandboxes.host_id = EXCLUDED.host_id AND sandboxes.state <> 'lost'`,
            [id, tenant, hostId, hostEpoch, state, JSON.stringify(view ?? { id, state })],
          );
        }
      } catch (err) {
        this.onError(err, `recording sandbox ${id} in the cluster directory failed`);
      }
    });
  }

  /** Resolves once every write queued so far is done (a response waits for it before it is sent). */
  flushed(): Promise<void> {
    return this.tail;
  }

  /**
   * Where a tenant's sandbox lives; null when the tenant has no such sandbox (another tenant's reads
   * as none). `tenant` null: whoever's it is (a request that proved access with a token signed for
   * this id, e.g. a signed port URL, names no tenant).
   */
  async lookup(tenant: string | null, id: string): Promise<DirectoryEntry | null> {
    const r = await this.pool.query(
      `SELECT s.id, s.tenant, s.host_id, h.address, (h.state = 'alive') AS alive, s.state, s.view
       FROM sandboxes s JOIN hosts h ON h.id = s.host_id WHERE s.id = $1 AND ($2::text IS NULL OR s.tenant = $2)`,
      [id, tenant],
    );
    const x = r.rows[0];
    return x ? { id: x.id, tenant: x.tenant, hostId: x.host_id, hostAddress: x.address, hostAlive: x.alive, state: x.state, view: x.view } : null;
  }

  /**
   * One page of a tenant's sandboxes across the cluster, by id (the same cursor as a single host's
   * list: `after` is the last id of the previous page). Lost sandboxes are not listed.
   */
  async list(tenant: string, opts: { state?: 'running' | 'suspended'; after?: string; limit: number; labels?: Record<string, string> }): Promise<{ views: Record<string, unknown>[]; next: string | null }> {
    const limit = Math.min(Math.max(opts.limit, 1), 1000);
    const r = await this.pool.query<{ id: string; view: Record<string, unknown> }>(
      `SELECT id, view FROM sandboxes
       WHERE tenant = $1 AND state <> 'lost' AND ($2::text IS NULL OR state = $2) AND ($3::text IS NULL OR id > $3)
         AND ($4::jsonb IS NULL OR view -> 'labels' @> $4)
       ORDER BY id LIMIT $5`,
      [tenant, opts.state ?? null, opts.after ?? null, opts.labels ? JSON.stringify(opts.labels) : null, limit + 1],
    );
    const page = r.rows.slice(0, limit);
    return { views: page.map((x) => x.view), next: r.rows.length > limit ? page[page.length - 1].id : null };
  }

  /** The ids of a host's sandboxes in the directory, by state. */
  async ofHost(hostId: string): Promise<Array<{ id: string; state: DirectoryState }>> {
    const r = await this.pool.query('SELECT id, state FROM sandboxes WHERE host_id = $1 ORDER BY id', [hostId]);
    return r.rows;
  }
}
