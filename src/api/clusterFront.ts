/**
 * The HTTP front of a cluster host (cluster mode, src/cluster/): every host answers the whole /v1 API. Fastify hooks that run
 * before the ordinary routes decide, per request, whether this host answers it or the host that owns
 * the sandbox does:
 *
 * - keys are loaded from the cluster database before the request is authenticated (KeyCache);
 * - POST /v1/sandboxes is placed (caps and capacity in PostgreSQL, placement.ts) and forwarded to
 *   the chosen host, which re-checks its lease and capacity; a refusal is placed again elsewhere;
 * - fork and resume are placed on the sandbox's own host (children need the fork point's RAM);
 * - any other request about a sandbox is proxied byte for byte to its owner (JSON, SSE, file bodies)
 *   unless this host owns it;
 * - GET /v1/sandboxes lists the tenant's sandboxes from the directory, across hosts;
 * - the tenant's keys (GET/POST /v1/keys, DELETE /v1/keys/{id}) are the cluster's, and GET /v1/limits
 *   counts its running sandboxes on every host.
 *
 * A forwarded request carries the peer secret (PEER_HEADER); the owner handles it locally and never
 * forwards it again, so a stale directory can cost a 404, never a loop.
 */
import { request as httpRequest, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http';
import { connect } from 'node:net';
import type { Duplex } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { sendError } from './binder.js';
import { bearerKey } from '../service/keys.js';
import { socketError, type UpgradeInterceptor } from './portsProxy.js';
import { keyView, limitsView } from './handlers/account.js';
import { CollimateError, sandboxEnded, sandboxNotFound } from '../errors.js';
import { fingerprint, type StoredResponse } from '../service/idempotency.js';
import type { Scope, TenantService } from '../service/tenantService.js';
import { toClientError } from '../wire/errors.js';
import * as S from '../wire/schemas.js';
import { clusterDatabaseUnavailable } from '../cluster/db.js';
import { compatKey } from '../cluster/hosts.js';
import type { KeyCache } from '../cluster/keys.js';
import { PEER_HEADER, REFUSED_HEADER, type ClusterNode } from '../cluster/node.js';
import type { Placement } from '../cluster/placement.js';
import type { UsagePush } from '../cluster/usage.js';
import { doorOf, tokenSandbox, type Door } from './clusterDoors.js';
import { askedEnvironment, ENVIRONMENT_HEADER, environmentPlacement, routeEnvironmentRequest } from './clusterEnvironments.js';
import type { ClusterEnvironmentHost } from '../cluster/environmentHost.js';
import { statsAcrossHosts, usageAcrossHosts } from './clusterViews.js';

/** The Host a forwarded request arrived with at the entry host (trusted only beside the peer secret). */
const ENTRY_HOST_HEADER = 'x-collimate-entry-host';
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host', PEER_HEADER, ENTRY_HOST_HEADER, ENVIRONMENT_HEADER]);
/** How many hosts a create tries when owners refuse it (fenced, full, unreachable). */
const PLACEMENT_ATTEMPTS = 3;

declare module 'fastify' {
  interface FastifyRequest {
    clusterSlot?: { release(): void };
  }
}

function hostUnavailable(what: string): CollimateError {
  return new CollimateError('host_at_capacity', `${what}; retry shortly.`, { retryAfterSecs: 5, details: { resource: 'cluster_host' } });
}

/** The parsed JSON body of a buffered request, or undefined when it is not JSON (the owner then says why). */
function jsonBody(req: FastifyRequest): Record<string, unknown> | undefined {
  if (!Buffer.isBuffer(req.body) || req.body.length === 0) return undefined;
  try {
    const v = JSON.parse(req.body.toString('utf8'));
    return v && typeof v === 'object' && !Array.isArray(v) ? v : undefined;
  } catch {
    return undefined;
  }
}

export function registerClusterFront(app: FastifyInstance, node: ClusterNode, tenants: TenantService, usage?: UsagePush, envs?: ClusterEnvironmentHost): void {
  const keys = tenants.keys as KeyCache;

  app.addHook('onRequest', async (req, reply) => {
    try {
      await keys.load(bearerKey(req.headers.authorization));
      // E2B's SDK sends its key as X-API-Key.
      const apiKey = req.headers['x-api-key'];
      if (typeof apiKey === 'string') await keys.load(apiKey);
    } catch (err) {
      sendError(reply, toClientError(err, req.log, req.id));
      return reply;
    }
  });

  // A request that changed a sandbox is answered only once the directory says so, so the next
  // request (on any host) sees the change.
  app.addHook('onSend', async (req, _reply, payload) => {
    if (req.method !== 'GET') await Promise.all([node.directory.flushed(), envs?.flushed()]);
    return payload;
  });

  app.addHook('preHandler', async (req, reply) => {
    const url = req.routeOptions.url ?? '';
    // MCP, E2B's API and envd, and the ports proxy reached by token (clusterDoors.ts).
    const door = doorOf(req, url, node, tenants);
    if (door && req.method !== 'GET') endAfterDirectory(reply);
    if (door) return node.isPeer(req.headers[PEER_HEADER]) ? ownerSide(req, reply, url, door) : routeDoor(req, reply, door);
    if (!url.startsWith('/v1/')) return;
    try {
      if (node.isPeer(req.headers[PEER_HEADER])) return await ownerSide(req, reply, url);
      let scope: Scope;
      try {
        scope = tenants.authenticate(bearerKey(req.headers.authorization));
      } catch {
        return; // the route answers 401 (or serves what needs no key)
      }
      if (url === '/v1/sandboxes' && req.method === 'POST') return await create(req, reply, scope);
      if (url === '/v1/sandboxes' && req.method === 'GET') return await list(req, reply, scope);
      if (url === '/v1/keys' || url === '/v1/keys/:id') return await ownKeys(req, reply, scope, url);
      if (envs && url.startsWith('/v1/environments')) {
        return await routeEnvironmentRequest(req, reply, scope, url, jsonBody(req), envs.environments, node.hostId, (address) => proxy(req, reply, address));
      }
      if (url === '/v1/usage' && req.method === 'GET') return reply.code(200).type('application/json; charset=utf-8').send(await usageAcrossHosts(req, node, scope, usage));
      if (url === '/v1/stats' && req.method === 'GET') return reply.code(200).type('application/json; charset=utf-8').send(await statsAcrossHosts(req, node, tenants, scope, (address) => forward(req, address)));
      if (url === '/v1/limits' && req.method === 'GET') {
        // Running sandboxes on every alive host (creates in flight are not running yet).
        const { running } = await node.placement.occupancy(scope.tenant);
        return reply.code(200).type('application/json; charset=utf-8').send(limitsView(scope.tier, running));
      }
      if (!url.startsWith('/v1/sandboxes/:id')) return;
      const id = (req.params as { id: string }).id;
      if (!S.SANDBOX_ID_RE.test(id)) return; // the route answers 404
      let entry: Awaited<ReturnType<typeof node.directory.lookup>>;
      try {
        entry = await node.directory.lookup(scope.tenant, id);
      } catch (err) {
        // The cluster database is unreachable: a sandbox this host runs is still served by it, for
        // what leaves its state as it is (a delete, suspend, resume or fork must reach the directory).
        if (!(err instanceof CollimateError) && servesLocallyInOutage(req, url, scope.tenant, id)) return;
        throw err;
      }
      if (!entry) throw sandboxNotFound(id);
      if (entry.state === 'lost') throw sandboxEnded(id, 'the host it ran on stopped answering and the cluster marked it lost');
      const fork = url === '/v1/sandboxes/:id/fork' && req.method === 'POST';
      const resume = url === '/v1/sandboxes/:id/resume' && req.method === 'POST';
      // A resume of a sandbox that is not suspended is invalid_state (its owner says so), not a cap matter.
      if (fork || (resume && entry.state === 'suspended')) {
        const count = fork ? Number(jsonBody(req)?.count ?? 1) : 1;
        const slots = Number.isInteger(count) && count > 0 ? count : 1;
        return await placed(req, reply, scope, { tenant: scope.tenant, tier: scope.tier, slots, operation: fork ? `fork of ${slots}` : 'resume', host: entry.hostId });
      }
      if (entry.hostId === node.hostId) return; // ours: the route answers
      if (!entry.hostAlive) throw hostUnavailable(`Sandbox ${id} is on a host that is not answering`);
      await proxy(req, reply, entry.hostAddress);
    } catch (err) {
      // Anything but a CollimateError here came from the cluster database (the peers' failures are
      // turned into errors where they happen): logged with its cause, answered 503.
      if (!(err instanceof CollimateError)) req.log.error({ err }, 'cluster database request failed');
      sendError(reply, toClientError(err instanceof CollimateError ? err : clusterDatabaseUnavailable(err), req.log, req.id));
      return reply;
    }
  });

  /** Whether this host runs `id` for `tenant` and the request leaves the sandbox's state (and so the directory) as it is. */
  function servesLocallyInOutage(req: FastifyRequest, url: string, tenant: string, id: string): boolean {
    const changesState = (req.method === 'DELETE' && url === '/v1/sandboxes/:id')
      || (req.method === 'POST' && ['/v1/sandboxes/:id/suspend', '/v1/sandboxes/:id/resume', '/v1/sandboxes/:id/fork'].includes(url));
    if (changesState) return false;
    try {
      const info = node.engine.get(id);
      return info.tenant === tenant && info.state === 'running';
    } catch {
      return false;
    }
  }

  /**
   * A request a peer placed here: re-check the lease and capacity for new sandboxes, pull the
   * environment it creates from if this host lacks it, then answer locally.
   */
  async function ownerSide(req: FastifyRequest, reply: FastifyReply, url: string, door?: Door): Promise<FastifyReply | undefined> {
    // A door that builds absolute URLs (MCP's expose_port) builds them on the host the client reached.
    const entryHost = req.headers[ENTRY_HOST_HEADER];
    if (door && typeof entryHost === 'string' && entryHost !== '') req.headers.host = entryHost;
    let slots = door?.slots ?? 0;
    if (!door && req.method === 'POST' && (url === '/v1/sandboxes' || url === '/v1/sandboxes/:id/fork' || url === '/v1/sandboxes/:id/resume')) {
      const count = url.endsWith('/fork') ? Number(jsonBody(req)?.count ?? 1) : 1;
      slots = Number.isInteger(count) && count > 0 ? count : 1;
    }
    if (slots === 0) return undefined;
    const slot = node.admit(slots);
    if (typeof slot === 'string') {
      reply.header(REFUSED_HEADER, '1');
      const err = new CollimateError('host_at_capacity', `This host cannot take it: ${slot}; place it elsewhere.`, { retryAfterSecs: 5, details: { resource: 'cluster_host' } });
      if (door) door.fail(reply, err);
      else sendError(reply, err);
      return reply;
    }
    req.clusterSlot = slot;
    reply.raw.once('close', () => slot.release());
    const asked = askedEnvironment(req);
    if (asked && envs?.puller) {
      try {
        await envs.puller.ensure(asked.tenant, asked.name);
      } catch (err) {
        const e = toClientError(err, req.log, req.id);
        if (door) door.fail(reply, e);
        else sendError(reply, e);
        return reply;
      }
    }
    return undefined;
  }

  /** A front door's request, placed, forwarded, proxied or answered as doorOf says; errors in the door's shape. */
  async function routeDoor(req: FastifyRequest, reply: FastifyReply, door: Door): Promise<FastifyReply | undefined> {
    try {
      const r = await door.route();
      if (!r) return undefined;
      if (r.kind === 'answer') return reply.code(r.status).headers(r.headers ?? {}).type('application/json; charset=utf-8').send(r.body);
      if (r.kind === 'owner') {
        if (!r.entry.hostAlive) throw hostUnavailable(`Sandbox ${r.entry.id} is on a host that is not answering`);
        return await proxy(req, reply, r.entry.hostAddress);
      }
      const placed = r.kind === 'create'
        ? await placeCreate(req, r.scope, r.template)
        : await forwardPlaced(req, await node.placement.place({ tenant: r.scope.tenant, tier: r.scope.tier, slots: r.slots, operation: r.operation, host: r.entry.hostId }));
      if (placed.unreachable !== undefined) throw hostUnavailable(`No host the cluster chose could be reached (last: ${placed.unreachable})`);
      return sendBuffered(reply, placed);
    } catch (err) {
      if (!(err instanceof CollimateError)) req.log.error({ err }, 'cluster database request failed');
      door.fail(reply, toClientError(err instanceof CollimateError ? err : clusterDatabaseUnavailable(err), req.log, req.id));
      return reply;
    }
  }

  /**
   * Holds the end of a front door's answer until this host's directory writes so far are done, as
   * onSend does for /v1 (doors that hijack the reply, MCP's, skip onSend).
   */
  function endAfterDirectory(reply: FastifyReply): void {
    const res = reply.raw;
    const end = res.end.bind(res) as (...a: unknown[]) => unknown;
    res.end = ((...a: unknown[]) => {
      void node.directory.flushed().then(() => end(...a));
      return res;
    }) as typeof res.end;
  }

  async function create(req: FastifyRequest, reply: FastifyReply, scope: Scope): Promise<FastifyReply> {
    const body = jsonBody(req);
    const template = typeof body?.template === 'string' ? body.template : undefined;
    return answerIdempotent(req, reply, scope, () => placeCreate(req, scope, template));
  }

  /** Places a create and forwards it, placing it again elsewhere when a host refuses (PLACEMENT_ATTEMPTS). */
  async function placeCreate(req: FastifyRequest, scope: Scope, template: string | undefined): Promise<Buffered> {
    const exclude: string[] = [];
    // A tenant's environment goes to any host of its artifact's class, which pulls it if it must.
    const env = envs && template !== undefined ? await environmentPlacement(envs.environments, scope, template) : null;
    for (let i = 0; ; i++) {
      const p = await node.placement.place({
        tenant: scope.tenant, tier: scope.tier, slots: 1, operation: 'create', template, exclude,
        // A VM host places within its own class; an API-only node anywhere.
        ...(node.capacity > 0 ? { compat: compatKey(node.compat) } : {}),
        ...(env ? { template: undefined, ...env.place } : {}),
      });
      const r = await forwardPlaced(req, p, env ? { [ENVIRONMENT_HEADER]: env.header } : undefined);
      if (!r.refused || i + 1 >= PLACEMENT_ATTEMPTS) return r;
      exclude.push(p.hostId);
    }
  }

  async function placed(req: FastifyRequest, reply: FastifyReply, scope: Scope, p: Parameters<ClusterNode['placement']['place']>[0]): Promise<FastifyReply> {
    return answerIdempotent(req, reply, scope, async () => forwardPlaced(req, await node.placement.place(p)));
  }

  /** Forwards a placed request to its host, holding the reservation until the owner has answered. */
  async function forwardPlaced(req: FastifyRequest, p: Placement, extra?: OutgoingHttpHeaders): Promise<Buffered> {
    try {
      let up: IncomingMessage;
      try {
        up = await forward(req, p.address, extra);
      } catch (err) {
        req.log.warn({ err, host: p.hostId }, 'cluster peer unreachable');
        return { status: 503, headers: [], body: Buffer.alloc(0), refused: true, unreachable: p.hostId };
      }
      const chunks: Buffer[] = [];
      for await (const c of up) chunks.push(c as Buffer);
      return { status: up.statusCode ?? 502, headers: up.rawHeaders, body: Buffer.concat(chunks), refused: up.statusCode === 503 && up.headers[REFUSED_HEADER] === '1' };
    } finally {
      await node.placement.release(p.reservationId).catch((err) => req.log.error({ err }, 'releasing a cluster reservation failed'));
    }
  }

  /** Runs `exec` under the request's Idempotency-Key across the cluster (or once, without one) and sends its answer. */
  async function answerIdempotent(req: FastifyRequest, reply: FastifyReply, scope: Scope, exec: () => Promise<Buffered>): Promise<FastifyReply> {
    const header = req.headers['idempotency-key'];
    const key = Array.isArray(header) ? header[0] : header;
    if (key === undefined) return sendBuffered(reply, finalOf(await exec()));
    const fp = fingerprint(req.method, req.url.split('?')[0], jsonBody(req) ?? {});
    let raw: Buffered | undefined;
    const r = await node.idempotency.run(scope.tenant, key, fp, async (): Promise<StoredResponse> => {
      raw = finalOf(await exec());
      let parsed: unknown = null;
      try {
        parsed = raw.body.length ? JSON.parse(raw.body.toString('utf8')) : null;
      } catch { /* not JSON: not stored (only 2xx JSON answers are) */ }
      return { status: raw.status, body: parsed };
    });
    if (!r.replayed && raw) return sendBuffered(reply, raw);
    reply.header('idempotent-replayed', 'true');
    reply.code(r.status);
    return r.body === null ? reply.send() : reply.type('application/json; charset=utf-8').send(r.body);
  }

  async function list(req: FastifyRequest, reply: FastifyReply, scope: Scope): Promise<FastifyReply> {
    const q = req.query as Record<string, string | string[] | undefined>;
    const { parseLabelFilter } = await import('./handlers/sandboxes.js');
    const { parseWith } = await import('../wire/errors.js');
    const query = parseWith(S.ListSandboxesQuery, q ?? {}, 'query');
    const page = await node.directory.list(scope.tenant, {
      state: query.state as 'running' | 'suspended' | undefined,
      after: query.after,
      limit: query.limit ?? 100,
      labels: parseLabelFilter(query.label),
    });
    return reply.code(200).type('application/json; charset=utf-8').send({ sandboxes: page.views, next: page.next });
  }

  async function ownKeys(req: FastifyRequest, reply: FastifyReply, scope: Scope, url: string): Promise<FastifyReply | undefined> {
    if (url === '/v1/keys' && req.method === 'GET') {
      return reply.code(200).type('application/json; charset=utf-8').send({ keys: (await node.keys.list({ tenant: scope.tenant })).map(keyView) });
    }
    if (url === '/v1/keys' && req.method === 'POST') {
      const { parseWith } = await import('../wire/errors.js');
      const route = (await import('./routes.js')).ROUTES.find((r) => r.operationId === 'createKey')!;
      const body = parseWith(route.body!, jsonBody(req) ?? {}, 'body') as { name?: string };
      const { key, record } = await node.keys.create({ tenant: scope.tenant, ...(body.name === undefined ? {} : { name: body.name }) });
      return reply.code(201).type('application/json; charset=utf-8').send({ key, record: keyView(record) });
    }
    if (url === '/v1/keys/:id' && req.method === 'DELETE') {
      const id = (req.params as { id: string }).id;
      const rec = await node.keys.get(id);
      if (!rec || rec.tenant !== scope.tenant || rec.revoked_at !== null) {
        throw new CollimateError('not_found', `No key ${JSON.stringify(id.slice(0, 100))} of yours; list them with GET /v1/keys.`);
      }
      await node.keys.revoke(id);
      return reply.code(204).send();
    }
    return undefined;
  }

  /** Sends the request on to `address` (http://ADDR:PORT) as it came, with the peer secret. */
  function forward(req: FastifyRequest, address: string, extra?: OutgoingHttpHeaders): Promise<IncomingMessage> {
    const target = new URL(address);
    const headers: OutgoingHttpHeaders = {};
    const raw = req.raw.rawHeaders;
    const buffered = Buffer.isBuffer(req.body);
    for (let i = 0; i < raw.length; i += 2) {
      const name = raw[i].toLowerCase();
      if (HOP_BY_HOP.has(name) || name === 'idempotency-key' || (buffered && name === 'content-length')) continue;
      const prev = headers[name];
      headers[name] = prev === undefined ? raw[i + 1] : ([] as string[]).concat(prev as string | string[], raw[i + 1]);
    }
    headers[ENTRY_HOST_HEADER] = req.headers.host ?? '';
    headers.host = target.host;
    headers[PEER_HEADER] = node.secret;
    headers['x-forwarded-for'] = req.ip;
    if (buffered) headers['content-length'] = String((req.body as Buffer).length);
    Object.assign(headers, extra);
    return new Promise((resolve, reject) => {
      const up = httpRequest({ protocol: target.protocol, hostname: target.hostname, port: target.port, method: req.method, path: req.url, headers }, resolve);
      up.on('error', reject);
      if (buffered) up.end(req.body as Buffer);
      else if (req.method === 'GET' || req.method === 'HEAD' || req.raw.readableEnded) up.end();
      else req.raw.pipe(up);
      // The client went away: so does the forwarded request.
      req.raw.once('close', () => {
        if (!req.raw.complete) up.destroy();
      });
    });
  }

  /** Streams the owner's answer to the client as it comes (SSE, downloads), status and headers included. */
  async function proxy(req: FastifyRequest, reply: FastifyReply, address: string): Promise<FastifyReply> {
    let up: IncomingMessage;
    try {
      up = await forward(req, address);
    } catch (err) {
      req.log.warn({ err, address }, 'cluster peer unreachable');
      throw hostUnavailable('The host that holds this sandbox does not answer');
    }
    reply.hijack();
    const res = reply.raw;
    res.writeHead(up.statusCode ?? 502, up.statusMessage, endToEnd(up.rawHeaders));
    up.pipe(res);
    up.on('error', () => res.destroy());
    up.on('aborted', () => res.destroy());
    res.on('close', () => up.destroy());
    return reply;
  }
}

interface Buffered {
  status: number;
  headers: string[];
  body: Buffer;
  /** The owner refused with REFUSED_HEADER (or did not answer): place again elsewhere. */
  refused: boolean;
  unreachable?: string;
}

function finalOf(r: Buffered): Buffered {
  if (r.unreachable !== undefined) {
    const err = hostUnavailable(`No host the cluster chose could be reached (last: ${r.unreachable})`);
    return { status: err.status, headers: ['content-type', 'application/json; charset=utf-8', ...Object.entries(err.headers()).flat()], body: Buffer.from(JSON.stringify(err.toJSON())), refused: true };
  }
  return r;
}

function sendBuffered(reply: FastifyReply, r: Buffered): FastifyReply {
  reply.hijack();
  const res = reply.raw;
  const headers = endToEnd(r.headers);
  const flat: string[] = [];
  for (let i = 0; i < headers.length; i += 2) {
    const name = headers[i].toLowerCase();
    if (name !== 'content-length' && name !== REFUSED_HEADER) flat.push(headers[i], headers[i + 1]);
  }
  flat.push('content-length', String(r.body.length));
  res.writeHead(r.status, flat);
  res.end(r.body);
  return reply;
}

/** The end-to-end headers of a raw header list (hop-by-hop ones belong to each connection). */
function endToEnd(raw: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) if (!HOP_BY_HOP.has(raw[i].toLowerCase())) out.push(raw[i], raw[i + 1]);
  return out;
}


/** The key of an upgrade: Authorization: Bearer, or the web terminal's `bearer.<key>` subprotocol. */
function upgradeKey(req: IncomingMessage): string | undefined {
  const bearer = bearerKey(req.headers.authorization);
  if (bearer) return bearer;
  const protocols = String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim());
  return protocols.find((p) => p.startsWith('bearer.'))?.slice('bearer.'.length);
}

/**
 * WebSocket upgrades about a sandbox another host owns (the web terminal, WebSockets on its ports)
 * become a TCP tunnel to that host: the request head goes on as it came (Host and the peer secret
 * set), then bytes flow both ways untouched. Anything else — this host's sandboxes, an unknown
 * key, an unknown sandbox — is handed back to this server, which answers as on a single host.
 */
export function clusterUpgrades(node: ClusterNode, tenants: TenantService): { intercept: UpgradeInterceptor; closeAll(): void } {
  const keys = tenants.keys as KeyCache;
  const tunnels = new Set<Duplex>();
  const intercept: UpgradeInterceptor = (req, socket, head, handleHere) => {
    const m = /^\/v1\/sandboxes\/([^/?]+)\//.exec(req.url ?? '');
    const byToken = tokenSandbox(req, tenants.signer);
    if ((!m || !S.SANDBOX_ID_RE.test(m[1])) && !byToken) return false;
    if (node.isPeer(req.headers[PEER_HEADER])) return false;
    const id = byToken ?? m![1];
    void (async () => {
      let tenant: string | null = null; // a token proves access to its sandbox, whoever's it is
      if (!byToken) {
        const key = upgradeKey(req);
        await keys.load(key);
        try {
          tenant = tenants.authenticate(key).tenant;
        } catch {
          return handleHere(); // answered 401 here
        }
      }
      const entry = await node.directory.lookup(tenant, id);
      if (!entry || entry.hostId === node.hostId || entry.state === 'lost') return handleHere();
      if (!entry.hostAlive) return socketError(socket, hostUnavailable(`Sandbox ${id} is on a host that is not answering`));
      const target = new URL(entry.hostAddress);
      const upstream = connect({ host: target.hostname, port: Number(target.port) });
      let open = false;
      upstream.once('connect', () => {
        open = true;
        tunnels.add(socket);
        let head0 = `${req.method} ${req.url} HTTP/1.1\r\n`;
        const raw = req.rawHeaders;
        for (let i = 0; i < raw.length; i += 2) {
          const name = raw[i].toLowerCase();
          if (name === 'host' || name === PEER_HEADER) continue;
          head0 += `${raw[i]}: ${raw[i + 1].replace(/[\r\n]/g, '')}\r\n`;
        }
        head0 += `Host: ${target.host}\r\n${PEER_HEADER}: ${node.secret}\r\n\r\n`;
        upstream.write(head0);
        if (head.length) upstream.write(head);
        upstream.pipe(socket);
        socket.pipe(upstream);
      });
      upstream.on('error', () => {
        if (!open) socketError(socket, hostUnavailable(`The host that holds sandbox ${id} does not answer`));
        else socket.destroy();
      });
      const end = () => {
        tunnels.delete(socket);
        upstream.destroy();
        socket.destroy();
      };
      upstream.on('close', () => open && end());
      socket.on('close', end);
    })().catch((err) => socketError(socket, err instanceof CollimateError ? err : clusterDatabaseUnavailable(err)));
    return true;
  };
  return {
    intercept,
    closeAll() {
      for (const s of [...tunnels]) s.destroy();
      tunnels.clear();
    },
  };
}
