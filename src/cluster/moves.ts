/**
 * Moving suspended sandboxes between hosts, the cluster database's part: which hosts may receive
 * one (alive, lease current, same compatibility class, room to resume it, preferably holding the
 * template's artifact), and the one transaction that makes the receiver the owner. The bytes never
 * pass through PostgreSQL: the receiver pulls them from the source's blob API (moveRoutes.ts).
 *
 * Ownership changes only in `flip`: `UPDATE sandboxes SET host_id = to … WHERE host_id = from AND
 * state = 'suspended'`. Before it commits the source owns the sandbox and a receiver's copy is
 * garbage (removed when the move fails, or when the receiver next joins: `reconcileMoves`); after
 * it the receiver owns it and the source's copy is garbage (removed at once, or when the source
 * next joins). A resume or delete through the cluster reaches the owner the directory names, so
 * there is never a moment with two owners.
 */
import { request as httpRequest } from 'node:http';
import type pg from 'pg';
import { CollimateError } from '../errors.js';
import { PEER_HEADER } from './peerHeader.js';
import { FREE_OF_H } from './placement.js';
import type { SandboxDirectory } from './directory.js';

export interface MoveTarget {
  hostId: string;
  address: string;
}

export class SandboxMoves {
  constructor(private readonly pool: pg.Pool) {}

  /**
   * The hosts that may receive a sandbox now, best first: `to` alone when given (or a clear error
   * saying why it may not), else every alive host of `compat` other than `from` with room for one
   * more running sandbox, those holding the artifact `artifactKey` first, then the most room.
   * host_at_capacity (503) when none may; for `to`: validation_error (unknown host, the source
   * itself), host_at_capacity with details.reason target_dead or target_full, conflict with
   * details.reason incompatible_host.
   */
  async targets(req: { from: string; compat: string; artifactKey: string; to?: string }): Promise<MoveTarget[]> {
    if (req.to !== undefined) {
      const r = await this.pool.query<{ id: string; address: string; alive: boolean; compat: string; capacity: number; free: string }>(
        `SELECT h.id, h.address, (h.state = 'alive' AND h.lease_until > now()) AS alive, h.compat, h.capacity, (${FREE_OF_H}) AS free
         FROM hosts h WHERE h.id = $1`,
        [req.to],
      );
      const h = r.rows[0];
      if (!h) throw new CollimateError('validation_error', `No host ${req.to} in the cluster; name a host by its id (the hosts table, or /healthz's cluster.host_id on that host).`);
      if (h.id === req.from) throw new CollimateError('validation_error', `The sandbox is on host ${req.to} already; name another host, or none to let the cluster choose.`);
      if (!h.alive) throw new CollimateError('host_at_capacity', `Host ${req.to} is not available (its heartbeat lapsed or it stopped); move the sandbox to an alive host.`, { retryAfterSecs: 5, details: { resource: 'cluster_host', reason: 'target_dead' } });
      if (h.compat !== req.compat) throw new CollimateError('conflict', `Host ${req.to} is of another compatibility class (${h.compat}) than the sandbox's host (${req.compat}): a snapshot restores only on the same QEMU, machine, CPU model and accelerator. Move it to a host of its class.`, { details: { reason: 'incompatible_host' } });
      if (h.capacity === 0 || Number(h.free) < 1) throw new CollimateError('host_at_capacity', `Host ${req.to} has no room to run the sandbox (${h.capacity === 0 ? 'an API-only node' : `capacity ${h.capacity}, none left`}); move it to a host with room, or free some there.`, { retryAfterSecs: 5, details: { resource: 'cluster_capacity', reason: 'target_full' } });
      return [{ hostId: h.id, address: h.address }];
    }
    const r = await this.pool.query<{ id: string; address: string }>(
      `SELECT h.id, h.address FROM hosts h, LATERAL (SELECT ${FREE_OF_H} AS free) f
       WHERE h.state = 'alive' AND h.lease_until > now() AND h.capacity > 0 AND h.compat = $1 AND h.id <> $2 AND free >= 1
       ORDER BY EXISTS (SELECT 1 FROM blob_locations b WHERE b.host_id = h.id AND b.of = $3) DESC, free DESC, random()`,
      [req.compat, req.from, req.artifactKey],
    );
    if (r.rows.length === 0) throw new CollimateError('host_at_capacity', 'No other alive host of this host\'s compatibility class has room to receive the sandbox; add a host or free capacity, then move it again.', { retryAfterSecs: 5, details: { resource: 'cluster_capacity', reason: 'no_target' } });
    return r.rows.map((h) => ({ hostId: h.id, address: h.address }));
  }

  /**
   * Makes `to` the owner of suspended sandbox `id`, in one transaction, if the directory still says
   * `from` owns it suspended and `to` is alive; `stillSuspended` is asked (the source's own
   * journal) with the row locked, just before the commit. Returns whether it flipped.
   */
  async flip(id: string, from: string, to: string, stillSuspended: () => boolean): Promise<boolean> {
    const c = await this.pool.connect();
    try {
      await c.query('BEGIN');
      const r = await c.query(
        `UPDATE sandboxes s SET host_id = $3, host_epoch = h.epoch, updated_at = now()
         FROM hosts h WHERE s.id = $1 AND s.host_id = $2 AND s.state = 'suspended' AND h.id = $3 AND h.state = 'alive'`,
        [id, from, to],
      );
      if (r.rowCount !== 1 || !stillSuspended()) {
        await c.query('ROLLBACK');
        return false;
      }
      await c.query('COMMIT');
      return true;
    } catch (err) {
      await c.query('ROLLBACK').catch(() => {});
      throw err;
    } finally {
      c.release();
    }
  }
}

/** What reconcileMoves needs of the engine: Engine.moves, and its list of suspended sandboxes. */
export interface MovesReconcileEngine {
  moves: {
    pendingIn(): string[];
    commitIn(id: string): boolean;
    abortIn(id: string): boolean;
    dropOut(id: string, to: string): boolean;
  };
  list(f: { state?: 'running' | 'suspended'; limit?: number; after?: string }): { sandboxes: Array<{ id: string }>; next: string | null };
}

/** Every local sandbox in `state` (all pages). */
export function localSandboxes(engine: Pick<MovesReconcileEngine, 'list'>, state?: 'running' | 'suspended'): string[] {
  const out: string[] = [];
  let after: string | undefined;
  do {
    const page = engine.list({ limit: 1000, ...(state ? { state } : {}), ...(after ? { after } : {}) });
    out.push(...page.sandboxes.map((s) => s.id));
    after = page.next ?? undefined;
  } while (after);
  return out;
}

/**
 * Settles moves a crash cut off, when a host joins (before it mirrors its sandboxes into the
 * directory): a sandbox being moved onto it is kept if the directory names it the owner, else
 * removed; a suspended sandbox of its own that the directory places on another host was moved
 * away, and its copy here goes. Returns what it did, for the log.
 */
export async function reconcileMoves(self: string, dir: SandboxDirectory, engine: MovesReconcileEngine): Promise<string[]> {
  const done: string[] = [];
  const pending = engine.moves.pendingIn();
  for (const id of pending) {
    const e = await dir.lookup(null, id);
    if (e?.hostId === self) {
      engine.moves.commitIn(id);
      done.push(`kept sandbox ${id}: its move onto this host had committed`);
    } else {
      engine.moves.abortIn(id);
      done.push(`removed sandbox ${id}: its move onto this host had not committed`);
    }
  }
  for (const id of localSandboxes(engine, 'suspended')) {
    if (pending.includes(id)) continue;
    const e = await dir.lookup(null, id);
    if (e && e.hostId !== self && e.state !== 'lost' && engine.moves.dropOut(id, e.hostId)) done.push(`removed sandbox ${id}: it was moved to host ${e.hostId}`);
  }
  return done;
}

/**
 * A request to a host with the peer secret; its status and JSON body. No time limit (fetch's
 * would cut off a move pulling gigabytes, or a drain of many sandboxes, at 300 s): the host
 * answers once the work is done or has failed.
 */
export function peerRequest(secret: string, address: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = httpRequest(`${address}${path}`, {
      method,
      headers: { [PEER_HEADER]: secret, ...(payload ? { 'content-type': 'application/json', 'content-length': String(payload.length) } : {}) },
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json: unknown;
        try { json = JSON.parse(text); } catch { json = { error: { message: `host ${address} answered ${res.statusCode}: ${text.slice(0, 200)}` } }; }
        resolve({ status: res.statusCode ?? 0, json });
      });
    });
    req.on('error', (err) => reject(new Error(`host ${address} could not be reached: ${err.message}`)));
    req.end(payload);
  });
}
