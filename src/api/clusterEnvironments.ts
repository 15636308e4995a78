/**
 * Environments through any host of a cluster (src/cluster/environments.ts): what the cluster front
 * (clusterFront.ts) asks about them.
 *
 * - GET /v1/environments and GET /v1/environments/{name} answer from the cluster database, so every
 *   host shows every host's environments (the host that made one answers it itself: its row is the
 *   freshest);
 * - the bake log and DELETE go to the host that made the environment (it holds the log, the bake
 *   and the template), proxied as they came; while that host is down they answer 503;
 * - POST /v1/environments of a name another host made is 409, as on one host;
 * - a create from an environment is placed on any host of its artifact's compatibility class
 *   (placement.ts: warm pool, then artifact held, then room), and the chosen host is told which
 *   environment to pull if it lacks it (ENVIRONMENT_HEADER, honoured only beside the peer secret).
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { CollimateError } from '../errors.js';
import type { ClusterEnvironments } from '../cluster/environments.js';
import type { PlaceRequest } from '../cluster/placement.js';
import type { Scope } from '../service/tenantService.js';

/** Names the environment (tenant/name, each URI-encoded) a placed create asks its host to pull. */
export const ENVIRONMENT_HEADER = 'x-collimate-environment';

function hostDown(name: string): CollimateError {
  return new CollimateError('host_at_capacity', `The host that made environment ${name} is not answering; its log and its deletion wait for it. Retry shortly.`, {
    retryAfterSecs: 5,
    details: { resource: 'cluster_host' },
  });
}

/**
 * Answers an /v1/environments request that this host should not answer from its own tables
 * (listing, another host's environment); undefined lets the route answer locally.
 */
export async function routeEnvironmentRequest(
  req: FastifyRequest,
  reply: FastifyReply,
  scope: Scope,
  url: string,
  /** The request's JSON body, when it has one. */
  body: Record<string, unknown> | undefined,
  envs: ClusterEnvironments,
  selfId: string,
  proxy: (address: string) => Promise<FastifyReply>,
): Promise<FastifyReply | undefined> {
  if (url === '/v1/environments' && req.method === 'GET') {
    return reply.code(200).type('application/json; charset=utf-8').send({ environments: await envs.list(scope.tenant) });
  }
  if (url === '/v1/environments' && req.method === 'POST') {
    const name = typeof body?.name === 'string' ? body.name : undefined;
    const row = name === undefined ? null : await envs.get(scope.tenant, name);
    if (row && row.hostId !== selfId) throw new CollimateError('conflict', `Environment ${name} exists; DELETE /v1/environments/${name} first to replace it.`);
    return undefined;
  }
  if (!url.startsWith('/v1/environments/:name')) return undefined;
  const row = await envs.get(scope.tenant, (req.params as { name: string }).name);
  if (!row || row.hostId === selfId) return undefined; // unknown (the route says so), or this host's own
  if (url === '/v1/environments/:name' && req.method === 'GET') return reply.code(200).type('application/json; charset=utf-8').send(row.view);
  if (!row.hostAlive) throw hostDown(row.name);
  return proxy(row.hostAddress);
}

/**
 * How to place a create from `template` when it names one of the tenant's environments: on any host
 * of its compatibility class, preferring warm pools and then hosts holding its artifact, with the
 * header telling the chosen host to pull it. Null when it is no environment (a catalog template).
 * An environment not ready yet is template_not_ready, as on one host; one whose artifact is not
 * described yet (its host has not written it) goes to the host that made it.
 */
export async function environmentPlacement(
  envs: ClusterEnvironments,
  scope: Scope,
  template: string,
): Promise<{ place: Pick<PlaceRequest, 'environment' | 'host' | 'compat'>; header: string } | null> {
  if (!scope.tier.ownImages) return null; // such a tier creates from the catalog only (its host says so)
  const row = await envs.get(scope.tenant, template);
  if (!row) return null;
  if (row.state !== 'ready') {
    throw new CollimateError(
      'template_not_ready',
      `Environment ${template} is ${row.state}${(row.view as { error?: string }).error ? ` (${(row.view as { error?: string }).error})` : ''}; create sandboxes from it once GET /v1/environments/${template} shows state ready.`,
    );
  }
  const header = `${encodeURIComponent(scope.tenant)}/${encodeURIComponent(template)}`;
  if (!row.copy) return { place: { host: row.hostId, compat: row.compat }, header };
  return { place: { environment: { warmKey: `${scope.tenant}/${template}`, artifactKey: row.copy.artifact.key }, compat: row.compat }, header };
}

/** The environment a peer's placed create asks this host to pull (ENVIRONMENT_HEADER), if any. */
export function askedEnvironment(req: FastifyRequest): { tenant: string; name: string } | undefined {
  const v = req.headers[ENVIRONMENT_HEADER];
  const m = typeof v === 'string' ? /^([^/]+)\/([^/]+)$/.exec(v) : null;
  if (!m) return undefined;
  try {
    return { tenant: decodeURIComponent(m[1]), name: decodeURIComponent(m[2]) };
  } catch {
    return undefined;
  }
}
