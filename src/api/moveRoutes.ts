import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { parseJsonObject } from '../wire/jsonBody.js';
import { CollimateError, ERROR_CODES, type ErrorCode } from '../errors.js';
import type { LocalBlobs } from '../images/localBlobs.js';
import { BlobFetcher } from '../cluster/blobFetcher.js';
import { BlobLocations } from '../cluster/blobLocations.js';
import { compatKey } from '../cluster/hosts.js';
import { localSandboxes, peerRequest, SandboxMoves, type MoveTarget } from '../cluster/moves.js';
import type { ClusterNode } from '../cluster/node.js';
import { PEER_HEADER } from '../cluster/peerHeader.js';
import type { MoveEngine, MoveManifest } from '../sandboxes/move.js';
import type { SandboxInfo } from '../sandboxes/types.js';
import { sendError } from './binder.js';

/**
 * Moving suspended sandboxes between cluster hosts, over HTTP between the hosts. Operators ask
 * (`collimate cluster move` / `collimate cluster drain`, src/cli/cluster.ts), with the peer secret;
 * tenants cannot: which host holds a sandbox is the operator's business, and a tenant's key on
 * these paths is refused like a missing one. The paths are outside /v1.
 *
 * - `POST /cluster/moves` `{sandbox, to?}` on the sandbox's host: prepares it (engine: move.ts),
 *   picks receivers (moves.ts), offers its files on this host's blob API by digest, asks a receiver
 *   to take it, flips the directory, and removes its copy here. Answers what moved where.
 * - `POST /cluster/drain` `{to?}` on a host: moves every suspended sandbox it holds, one at a time;
 *   running ones stay (a live move is not built) and are counted in the answer.
 * - `POST /cluster/moves/incoming` `{manifest, source}` on the receiver: pulls the files from the
 *   source by digest (verified, sparse) into a pending sandbox; `POST …/incoming/{id}/commit` makes it
 *   this host's once the directory flipped (`?delete=1`: then deletes it, a delete having reached the
 *   source meanwhile); `DELETE …/incoming/{id}` removes a pending one.
 */

export interface MoveRoutesOptions {
  node: ClusterNode;
  /** The engine's moves of suspended sandboxes (Engine.moves). */
  moves: MoveEngine;
  engine: { get(id: string): SandboxInfo; list(f: { state?: 'running' | 'suspended'; limit?: number; after?: string }): { sandboxes: SandboxInfo[]; next: string | null }; delete(id: string): Promise<void> };
  blobs: LocalBlobs;
}

export interface MoveResult {
  id: string;
  from: string;
  to: string;
  /** The files' sizes, and the bytes that crossed the network for them (holes are not sent). */
  bytes: number;
  transferred: number;
  ms: number;
}

export function registerMoveRoutes(app: FastifyInstance, o: MoveRoutesOptions): void {
  const moves = new SandboxMoves(o.node.pool);
  const fetcher = new BlobFetcher(new BlobLocations(o.node.pool), { hostId: o.node.hostId, secret: () => o.node.secret, peerHeader: PEER_HEADER });
  const peerOnly = (req: FastifyRequest, reply: FastifyReply): boolean => {
    if (o.node.isPeer(req.headers[PEER_HEADER])) return true;
    sendError(reply, new CollimateError('unauthorized', 'Moving sandboxes between hosts is for the cluster\'s operators: use `collimate cluster move` or `collimate cluster drain` with --cluster.'));
    return false;
  };
  const answer = async (reply: FastifyReply, f: () => Promise<unknown>) => {
    try {
      return reply.code(200).send(await f());
    } catch (e) {
      sendError(reply, e instanceof CollimateError ? e : new CollimateError('internal_error', `The move failed: ${(e as Error).message}`, { cause: e }));
      return reply;
    }
  };
  /** The request's JSON object (the server hands bodies over as bytes); {} for none. */
  const bodyOf = (req: FastifyRequest): Record<string, unknown> => parseJsonObject(req.body);
  const optionalHost = (v: unknown): string | undefined => {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'string' || !/^[A-Za-z0-9_-]{1,64}$/.test(v)) throw new CollimateError('validation_error', '"to" must be a host id (e.g. host_0123456789ab).');
    return v;
  };

  const moveOne = async (id: string, to?: string): Promise<MoveResult> => {
    const t0 = Date.now();
    const prepared = await o.moves.prepareOut(id);
    try {
      const m = prepared.manifest;
      const targets = await moves.targets({ from: o.node.hostId, compat: compatKey(o.node.compat), artifactKey: m.artifactKey, to });
      const withdraw = o.blobs.offer(m.files.map((f) => ({ digest: f.digest, kind: 'sandbox-move' as const, path: prepared.paths[f.name]!, size: f.size, sparse: f.sparse, of: id })));
      try {
        const refusals: string[] = [];
        let chosen: { target: MoveTarget; transferred: number } | undefined;
        for (const t of targets) {
          const r = await peer(o.node, t.address, 'POST', '/cluster/moves/incoming', { manifest: m, source: { hostId: o.node.hostId, address: o.node.address } });
          if (r.status === 200) {
            chosen = { target: t, transferred: Number((r.json as { transferred?: number }).transferred ?? 0) };
            break;
          }
          const err = errorOf(r, t.hostId);
          // A host named by the operator, or a failure other than a refusal: that is the answer.
          if (to !== undefined || (err.status !== 409 && err.status !== 503)) throw err;
          refusals.push(`${t.hostId}: ${err.message}`);
        }
        if (!chosen) throw new CollimateError('host_at_capacity', `No host could receive sandbox ${id} (${refusals.join('; ')}); it stays where it is.`, { retryAfterSecs: 5, details: { resource: 'cluster_capacity', reason: 'no_target' } });
        const dest = chosen.target;
        let deletedMeanwhile = false;
        try {
          const stillSuspended = () => {
            try { return o.engine.get(id).state === 'suspended'; } catch { return false; }
          };
          ({ deletedMeanwhile } = await o.moves.commitOut(id, m.suspendedAt, dest.hostId, () => moves.flip(id, o.node.hostId, dest.hostId, stillSuspended)));
        } catch (e) {
          // Not moved: the receiver's copy goes (or at its next join, if it cannot be told now).
          await peer(o.node, dest.address, 'DELETE', `/cluster/moves/incoming/${id}`).catch(() => {});
          throw e;
        }
        // Moved. If the receiver cannot be told now, it commits when it next joins (the directory names it).
        const c = await peer(o.node, dest.address, 'POST', `/cluster/moves/incoming/${id}/commit${deletedMeanwhile ? '?delete=1' : ''}`).catch((e: Error) => ({ status: 0, json: { error: { message: e.message } } }));
        if (c.status !== 200) o.node.opts.log?.(null, `sandbox ${id} moved to ${dest.hostId}, which did not confirm (${JSON.stringify(c.json)}); it settles the move when it next joins`);
        return { id, from: o.node.hostId, to: dest.hostId, bytes: m.files.reduce((n, f) => n + f.size, 0), transferred: chosen.transferred, ms: Date.now() - t0 };
      } finally {
        withdraw();
      }
    } finally {
      prepared.discard();
    }
  };

  app.post('/cluster/moves', async (req, reply) => {
    if (!peerOnly(req, reply)) return reply;
    return answer(reply, async () => {
      const b = bodyOf(req);
      if (typeof b.sandbox !== 'string' || !b.sandbox) throw new CollimateError('validation_error', 'Name the sandbox to move: {"sandbox": "sbx_…", "to": "host_…" (optional)}.');
      return moveOne(b.sandbox, optionalHost(b.to));
    });
  });

  app.post('/cluster/drain', async (req, reply) => {
    if (!peerOnly(req, reply)) return reply;
    return answer(reply, async () => {
      const to = optionalHost(bodyOf(req).to);
      const moved: MoveResult[] = [];
      const failed: Array<{ id: string; code: string; message: string }> = [];
      const pendingIn = new Set(o.moves.pendingIn());
      for (const id of localSandboxes(o.engine, 'suspended')) {
        if (pendingIn.has(id)) continue;
        try {
          moved.push(await moveOne(id, to));
        } catch (e) {
          const err = e instanceof CollimateError ? e : new CollimateError('internal_error', (e as Error).message);
          failed.push({ id, code: err.code, message: err.message });
        }
      }
      return { host: o.node.hostId, moved, failed, running: localSandboxes(o.engine, 'running').length };
    });
  });

  app.post('/cluster/moves/incoming', async (req, reply) => {
    if (!peerOnly(req, reply)) return reply;
    return answer(reply, async () => {
      const b = bodyOf(req) as { manifest?: MoveManifest; source?: { hostId?: string; address?: string } };
      const m = b.manifest;
      if (!m || typeof m.id !== 'string' || !Array.isArray(m.files) || typeof b.source?.address !== 'string' || typeof b.source.hostId !== 'string') {
        throw new CollimateError('validation_error', 'A move needs {manifest, source: {hostId, address}}.');
      }
      if (!o.node.membership.holdsLease()) throw new CollimateError('host_at_capacity', 'This host could not renew its cluster lease, so it takes no sandboxes until it can.', { retryAfterSecs: 5, details: { resource: 'cluster_host', reason: 'target_dead' } });
      if (o.node.capacity === 0) throw new CollimateError('host_at_capacity', 'This host is an API-only node (capacity 0): it holds no sandboxes.', { retryAfterSecs: 5, details: { resource: 'cluster_capacity', reason: 'target_full' } });
      const source = { hostId: b.source.hostId, address: b.source.address, size: 0 };
      let transferred = 0;
      await o.moves.importIn(m, async (f, dest) => {
        const got = await fetcher.fetchFrom([{ ...source, size: f.size }], f.digest, dest, { sparse: f.sparse });
        transferred += got.transferred;
      });
      return { id: m.id, transferred };
    });
  });

  app.post('/cluster/moves/incoming/:id/commit', async (req, reply) => {
    if (!peerOnly(req, reply)) return reply;
    return answer(reply, async () => {
      const { id } = req.params as { id: string };
      const committed = o.moves.commitIn(id);
      // The tenant's delete reached the source while the directory flipped: it is this host's to carry out.
      if ((req.query as { delete?: string }).delete === '1') await o.engine.delete(id).catch(() => {});
      return { id, committed };
    });
  });

  app.delete('/cluster/moves/incoming/:id', async (req, reply) => {
    if (!peerOnly(req, reply)) return reply;
    return answer(reply, async () => ({ id: (req.params as { id: string }).id, removed: o.moves.abortIn((req.params as { id: string }).id) }));
  });
}

/** A request to a peer with the peer secret (peerRequest). */
function peer(node: { secret: string }, address: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> {
  return peerRequest(node.secret, address, method, path, body);
}

/** A peer's error answer as an error of this host, with the peer's code, message and details. */
function errorOf(r: { status: number; json: unknown }, hostId: string): CollimateError {
  const e = ((r.json as { error?: Record<string, unknown> })?.error ?? {}) as { code?: string; message?: string } & Record<string, unknown>;
  const { code, message, ...details } = e;
  const known = typeof code === 'string' && code in ERROR_CODES ? code as ErrorCode : 'vmm_failed';
  return new CollimateError(known, `Host ${hostId} did not take the sandbox: ${message ?? `it answered ${r.status}`}`, { details: { ...details, host: hostId } });
}
