/**
 * The other front doors of a cluster host — MCP (/mcp), E2B's API (/e2b/api), E2B's envd
 * (/e2b/envd, /files) and the ports proxy reached with a token instead of a key (signed port URLs
 * /v1/p/{token}, E2B's traffic token) — routed like the REST API (clusterFront.ts):
 *
 * - a create is placed by the cluster (caps, capacity, placement.ts) and the request forwarded as
 *   it came to the chosen host, whose own front door answers it; a fork or resume is placed on the
 *   sandbox's host the same way. So every door draws on the one cluster-wide cap, and E2B's
 *   envVars are kept on the host that runs the sandbox, where its envd applies them;
 * - anything else naming a sandbox (an MCP tool's `sandbox_id`, E2B's path id, envd's
 *   `E2b-Sandbox-Id`, the sandbox a token was signed for) is proxied to its owner;
 * - listing (MCP's list_sandboxes, E2B's GET /sandboxes) is answered from the directory.
 *
 * This module only decides (doorOf); clusterFront.ts places, forwards and proxies. Each door renders
 * its own errors: MCP as a tool result with isError, E2B as `{code, message}`, the proxy as the API's.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { createHmac } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { CollimateError, sandboxEnded, sandboxNotFound } from '../errors.js';
import { e2bListed, e2bListQuery, sendE2bError } from '../e2b/controlPlane.js';
import { signedFileUrl } from '../e2b/envd.js';
import { allowedOriginsFromEnv, originAllowed } from '../mcp/origin.js';
import { errorResult, INPUTS } from '../mcp/tools.js';
import type { SandboxInfo } from '../sandboxes/types.js';
import type { PortUrlSigner } from '../service/portUrls.js';
import type { Scope, TenantService } from '../service/tenantService.js';
import * as S from '../wire/schemas.js';
import type { DirectoryEntry } from '../cluster/directory.js';
import type { ClusterNode } from '../cluster/node.js';
import { sendError } from './binder.js';
import { bearerKey } from '../service/keys.js';
import { PROXY_ERROR_HEADER, TRAFFIC_TOKEN_HEADER } from './portsProxy.js';

/** What the cluster front does with a front-door request; undefined: this host answers it. */
export type DoorRoute =
  | { kind: 'owner'; entry: DirectoryEntry }
  | { kind: 'create'; scope: Scope; template?: string }
  | { kind: 'placed'; scope: Scope; entry: DirectoryEntry; slots: number; operation: string }
  | { kind: 'answer'; status: number; body: unknown; headers?: Record<string, string> };

export interface Door {
  /** Where the request goes (may consult the directory; throws on a database failure). */
  route(): Promise<DoorRoute | undefined>;
  /** Renders an error the way this door's clients read them. */
  fail(reply: FastifyReply, err: CollimateError): void;
  /** Sandboxes a create, fork or resume forwarded here would start (the owner's capacity re-check). */
  slots: number;
}

/** The key every host signs port URLs and sandbox tokens with: derived from the cluster's peer secret, so all hosts share it. */
export function clusterSigningKey(peerSecret: string): Buffer {
  return createHmac('sha256', peerSecret).update('collimate port url key').digest();
}

/** The parsed JSON object of a buffered body, or undefined. */
function jsonOf(req: FastifyRequest): unknown {
  if (!Buffer.isBuffer(req.body) || req.body.length === 0) return undefined;
  try {
    return JSON.parse(req.body.toString('utf8'));
  } catch {
    return undefined;
  }
}

const header = (req: FastifyRequest, name: string): string | undefined => {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

/**
 * 1 when `id` is suspended on this host, else 0: a resume (E2B's connect, which the SDK sends on
 * every connect) of a running sandbox starts nothing, so its owner does not refuse it when full.
 */
function suspendedHere(tenants: TenantService, id: unknown): number {
  if (typeof id !== 'string') return 0;
  try {
    return tenants.engine.get(id).state === 'suspended' ? 1 : 0;
  } catch {
    return 0; // unknown here: the door answers not found
  }
}

function slotsOf(count: unknown): number {
  const n = Number(count ?? 1);
  return Number.isInteger(n) && n > 0 ? n : 1;
}

/**
 * The door a request arrived at (by its route's URL), or undefined for the REST API (clusterFront.ts
 * routes that itself).
 */
export function doorOf(req: FastifyRequest, url: string, node: ClusterNode, tenants: TenantService): Door | undefined {
  if (url === '/mcp' && req.method === 'POST') return mcpDoor(req, node, tenants);
  if (url.startsWith('/e2b/api/')) return e2bDoor(req, url, node, tenants);
  if ((url === '/e2b/envd/files' || url === '/files') && typeof (req.query as { signature?: unknown }).signature === 'string' && req.headers['x-access-token'] === undefined) {
    return signedFileDoor(req, node, tenants);
  }
  if (url.startsWith('/e2b/envd/') || url === '/files') return tokenDoor(req, node, tenants, header(req, 'e2b-sandbox-id'), header(req, 'x-access-token'), envdFail);
  if (url.startsWith('/v1/p/:token')) {
    const token = (req.params as { token?: string }).token ?? '';
    return {
      slots: 0,
      fail: proxyFail,
      async route() {
        let id: string;
        try {
          id = tenants.signer.verify(token).sandboxId;
        } catch {
          return undefined; // this host answers why (401, url_expired)
        }
        return owned(node, await node.directory.lookup(null, id));
      },
    };
  }
  if (url.startsWith('/v1/sandboxes/:id/ports/') && req.headers.authorization === undefined && typeof req.headers[TRAFFIC_TOKEN_HEADER] === 'string') {
    return tokenDoor(req, node, tenants, (req.params as { id: string }).id, header(req, TRAFFIC_TOKEN_HEADER), proxyFail);
  }
  return undefined;
}

/**
 * The sandbox a WebSocket upgrade proves access to with a token rather than a key: a signed port
 * URL (/v1/p/{token}/…), or E2B's traffic token on a sandbox's port path without Authorization.
 * Undefined when it carries no valid token (it is then routed by its key, or answered here).
 */
export function tokenSandbox(req: IncomingMessage, signer: PortUrlSigner): string | undefined {
  const url = req.url ?? '';
  const signed = /^\/v1\/p\/([^/?]+)/.exec(url);
  if (signed) {
    try {
      return signer.verify(signed[1]).sandboxId;
    } catch {
      return undefined;
    }
  }
  const port = /^\/v1\/sandboxes\/([^/?]+)\/ports\//.exec(url);
  const token = req.headers[TRAFFIC_TOKEN_HEADER];
  if (!port || req.headers.authorization !== undefined || typeof token !== 'string') return undefined;
  return S.SANDBOX_ID_RE.test(port[1]) && signer.verifySandboxToken(port[1], token) ? port[1] : undefined;
}

/**
 * E2B's signed file URLs name no sandbox: when none of this host's running sandboxes made it, the
 * other hosts' running sandboxes are tried (a MAC each), and the one it was made for gets it.
 */
function signedFileDoor(req: FastifyRequest, node: ClusterNode, tenants: TenantService): Door {
  return {
    slots: 0,
    fail: envdFail,
    async route() {
      let matches: ReturnType<typeof signedFileUrl>;
      try {
        matches = signedFileUrl(req, req.method === 'GET' ? 'read' : 'write');
      } catch {
        return undefined; // expired: this host says so
      }
      if (!matches || tenants.sandboxByToken(matches)) return undefined;
      const r = await node.pool.query<{ id: string }>(`SELECT id FROM sandboxes WHERE state = 'running' AND host_id <> $1`, [node.hostId]);
      const id = r.rows.find((row) => matches(row.id, tenants.signer.sandboxToken(row.id)))?.id;
      return id ? owned(node, await node.directory.lookup(null, id)) : undefined;
    },
  };
}

/** Why a fork or resume of a sandbox the directory does not have (or has lost) cannot go anywhere. */
function missing(entry: DirectoryEntry | null, id: string): never {
  if (entry) throw sandboxEnded(id, 'the host it ran on stopped answering and the cluster marked it lost');
  throw sandboxNotFound(id);
}

/** A sandbox another host owns goes there; ours, unknown or lost ones are answered here. */
function owned(node: ClusterNode, entry: DirectoryEntry | null): DoorRoute | undefined {
  if (!entry || entry.state === 'lost' || entry.hostId === node.hostId) return undefined;
  return { kind: 'owner', entry };
}

/** A request that proves access to one sandbox with its token (E2B's envd and traffic tokens). */
function tokenDoor(req: FastifyRequest, node: ClusterNode, tenants: TenantService, id: string | undefined, token: string | undefined, fail: Door['fail']): Door {
  return {
    slots: 0,
    fail,
    async route() {
      // Checked here too, so nobody without the token learns where a sandbox lives; the owner checks again.
      if (!id || !token || !S.SANDBOX_ID_RE.test(id) || !tenants.signer.verifySandboxToken(id, token)) return undefined;
      return owned(node, await node.directory.lookup(null, id));
    },
  };
}

function proxyFail(reply: FastifyReply, err: CollimateError): void {
  reply.header(PROXY_ERROR_HEADER, err.code);
  sendError(reply, err);
}

/** envd's plain-HTTP error body (envd.ts answers its own the same way). */
function envdFail(reply: FastifyReply, err: CollimateError): void {
  reply.headers(err.headers());
  reply.code(err.status).type('application/json').send({ code: err.status, message: err.message });
}

/** The caller's scope, or undefined when the key does not authenticate (this host then answers 401). */
function scopeOf(tenants: TenantService, key: string | undefined): Scope | undefined {
  try {
    return tenants.authenticate(key);
  } catch {
    return undefined;
  }
}

/**
 * MCP: one JSON-RPC message per POST (stateless). A tools/call naming a sandbox goes to its owner,
 * create_sandbox is placed, fork_sandbox and resume_sandbox are placed on the sandbox's host,
 * list_sandboxes is answered from the directory; everything else (initialize, tools/list,
 * list_images) is answered here.
 */
function mcpDoor(req: FastifyRequest, node: ClusterNode, tenants: TenantService): Door {
  const msg = jsonOf(req) as { id?: unknown; method?: unknown; params?: { name?: unknown; arguments?: Record<string, unknown> } } | undefined;
  const rpcId = msg && !Array.isArray(msg) && (typeof msg.id === 'string' || typeof msg.id === 'number') ? msg.id : null;
  const call = msg && !Array.isArray(msg) && msg.method === 'tools/call' ? msg.params ?? {} : undefined;
  const name = typeof call?.name === 'string' ? call.name : undefined;
  const args = call?.arguments && typeof call.arguments === 'object' ? call.arguments : {};
  const answer = (result: unknown): DoorRoute => ({ kind: 'answer', status: 200, body: { jsonrpc: '2.0', id: rpcId, result } });
  return {
    slots: name === 'create_sandbox' ? 1 : name === 'fork_sandbox' ? slotsOf(args.count) : name === 'resume_sandbox' ? suspendedHere(tenants, args.sandbox_id) : 0,
    fail(reply, err) {
      reply.code(200).type('application/json; charset=utf-8').send({ jsonrpc: '2.0', id: rpcId, result: errorResult(err) });
    },
    async route() {
      if (Array.isArray(msg) && msg.some((m) => m && typeof m === 'object' && (m as { method?: unknown }).method === 'tools/call')) {
        return { kind: 'answer', status: 400, body: { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Invalid Request: a cluster host takes one JSON-RPC message per POST; send each tools/call on its own.' } } };
      }
      // A refused Origin or key is answered here, by the endpoint's own gate (403, 401).
      if (!name || !originAllowed(header(req, 'origin'), allowedOriginsFromEnv())) return undefined;
      const scope = scopeOf(tenants, bearerKey(req.headers.authorization));
      if (!scope) return undefined;
      if (name === 'create_sandbox') {
        // Arguments this host would refuse are refused here, before a slot is taken.
        if (!INPUTS.create_sandbox.safeParse(args).success) return undefined;
        return { kind: 'create', scope, template: String(args.template) };
      }
      if (name === 'list_sandboxes') {
        const a = INPUTS.list_sandboxes.safeParse(args);
        if (!a.success) return undefined;
        const page = await node.directory.list(scope.tenant, { state: a.data.state as 'running' | 'suspended' | undefined, after: a.data.after, limit: a.data.limit ?? 100, labels: a.data.labels });
        const value = { sandboxes: page.views, next: page.next };
        return answer({ content: [{ type: 'text', text: JSON.stringify(value) }], structuredContent: value });
      }
      const id = args.sandbox_id;
      if (typeof id !== 'string' || !S.SANDBOX_ID_RE.test(id)) return undefined;
      const entry = await node.directory.lookup(scope.tenant, id);
      const starts = name === 'fork_sandbox' || name === 'resume_sandbox';
      // A fork or resume is never answered here unplaced: that would start sandboxes past the cap.
      if (!entry || entry.state === 'lost') return starts ? missing(entry, id) : undefined;
      if (name === 'fork_sandbox') return { kind: 'placed', scope, entry, slots: slotsOf(args.count), operation: `fork of ${slotsOf(args.count)}` };
      if (name === 'resume_sandbox' && entry.state === 'suspended') return { kind: 'placed', scope, entry, slots: 1, operation: 'resume' };
      return owned(node, entry);
    },
  };
}

/**
 * E2B's API: creates placed, forks and resumes (connect of a paused sandbox included) placed on the
 * sandbox's host, the list from the directory, anything else about a sandbox proxied to its owner.
 */
function e2bDoor(req: FastifyRequest, url: string, node: ClusterNode, tenants: TenantService): Door {
  const path = url.slice('/e2b/api'.length).replace(/^\/v2/, '');
  const body = (jsonOf(req) ?? {}) as Record<string, unknown>;
  const starts = req.method === 'POST' && (path === '/sandboxes' || /^\/sandboxes\/:id\/(connect|resume)$/.test(path));
  return {
    slots: !starts ? (req.method === 'POST' && path === '/sandboxes/:id/fork' ? slotsOf(body.count) : 0)
      : path === '/sandboxes' ? 1 : suspendedHere(tenants, (req.params as { id?: string }).id),
    fail: sendE2bError,
    async route() {
      const key = header(req, 'x-api-key') ?? bearerKey(req.headers.authorization);
      const scope = scopeOf(tenants, key);
      if (!scope) return undefined;
      if (path === '/sandboxes' && req.method === 'POST') return { kind: 'create', scope, ...(typeof body.templateID === 'string' ? { template: body.templateID } : {}) };
      if (path === '/sandboxes' && req.method === 'GET') {
        const q = e2bListQuery((req.query ?? {}) as Record<string, unknown>, !url.startsWith('/e2b/api/v2/'));
        const page = await node.directory.list(scope.tenant, { ...q.page, limit: q.page.limit ?? 100 });
        const items = (page.views as unknown as SandboxInfo[]).filter(q.keep).map(e2bListed);
        return { kind: 'answer', status: 200, body: items, ...(page.next ? { headers: { 'x-next-token': page.next } } : {}) };
      }
      if (!path.startsWith('/sandboxes/:id')) return undefined;
      const id = (req.params as { id: string }).id;
      if (!S.SANDBOX_ID_RE.test(id)) return undefined;
      const entry = await node.directory.lookup(scope.tenant, id);
      const fork = req.method === 'POST' && path === '/sandboxes/:id/fork';
      if (!entry || entry.state === 'lost') return fork || starts ? missing(entry, id) : undefined;
      if (fork) return { kind: 'placed', scope, entry, slots: slotsOf(body.count), operation: `fork of ${slotsOf(body.count)}` };
      if (starts && entry.state === 'suspended') return { kind: 'placed', scope, entry, slots: 1, operation: 'resume' };
      return owned(node, entry);
    },
  };
}
