/**
 * The REST API server. It only translates: each request is authenticated, validated against the zod
 * schemas of src/api/routes.ts, and becomes one SandboxService call; the service knows nothing of HTTP.
 * Tier caps, idempotency and metering live here, in front of the service.
 */
import { dirname, join } from 'node:path';
import type { IncomingHttpHeaders } from 'node:http';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest, type FastifyServerOptions } from 'fastify';
import type { z } from 'zod';
import { CollimateError, invalidState, sandboxNotFound } from '../errors.js';
import type { Db } from '../store/db.js';
import type { ExecResult, OpenPort, SandboxInfo, SandboxService, Scope, TemplateInfo } from '../sandboxes/types.js';
import { Admission } from './admission.js';
import { fingerprint, IdempotencyStore } from './idempotency.js';
import { KeyStore, type Principal } from './keys.js';
import { Meter, type MeteredSandboxInfo } from './metering.js';
import { Counter, Gauge, Histogram, MetricsRegistry } from './metrics.js';
import { applyApiMigrations } from './migrations.js';
import { renderOpenApi } from './openapi.js';
import { registerPortsProxy } from './portsProxy.js';
import { PortUrlSigner } from './portUrls.js';
import { matchPath, ROUTES, type RouteSpec } from './routes.js';
import * as S from './schemas.js';
import { registerMcp } from '../mcp/index.js';
import type { ImageService } from '../images/service.js';
import type { EnvironmentRow, ImageRow } from '../images/imageRepo.js';

export const DEFAULT_MAX_JSON_BYTES = 16 * 1024 * 1024;
export const DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024;

export interface BuildServerOptions {
  service: SandboxService;
  /** The database the API keeps its tables in (the engine's own database in production). */
  db: Db;
  logger?: FastifyServerOptions['logger'];
  /** Own images and environments (Pro); without it those endpoints answer 404 not_found. */
  images?: ImageService;
  /** Readiness for /healthz; defaults to the service's isReady()/accel when it has them. */
  health?: () => HealthInfo;
  /** Period of the metering reconcile against service.list(); 0 disables the timer. Default 10 s, or 60 s when the service emits transition events. */
  reconcileIntervalMs?: number;
  maxJsonBodyBytes?: number;
  maxFileBytes?: number;
  /**
   * The key file signing port URLs (portUrls.ts). Default: `port-urls.key` beside the database; null
   * (or an in-memory database) keeps a key in memory only, so URLs die with the process.
   */
  portUrlKeyPath?: string | null;
  /** How long shutdown lets in-flight requests finish before failing them with 503. Default 5 s. */
  shutdownGraceMs?: number;
  now?: () => number;
}

/** What /healthz reports beyond readiness: the accelerator mode and how VMMs are confined (docs/security.md). */
export interface HealthInfo {
  ready: boolean;
  accel: string;
  /** `development` under TCG: guests are not a security boundary (QEMU's security policy). */
  mode?: 'development' | 'production';
  isolation?: string;
  confinement?: { enabled: boolean; cgroups?: string; reason?: string };
  /** Per-sandbox networking (docs/networking.md): off when not root or COLLIMATE_NET=off. */
  network?: { enabled: boolean; reason?: string };
}

export interface ApiServer {
  app: FastifyInstance;
  keys: KeyStore;
  meter: Meter;
  admission: Admission;
  idempotency: IdempotencyStore;
  metrics: MetricsRegistry;
  /** Brings the meter in line with the service's current sandboxes. */
  reconcile(): void;
  /**
   * Stops accepting requests (new ones get 503 shutting_down), lets in-flight ones finish for the grace
   * period, fails the rest with 503 shutting_down, and closes the HTTP server. Does not close the
   * service: the caller does, after this resolves.
   */
  shutdown(graceMs?: number): Promise<void>;
}

interface Ctx {
  principal: Principal;
  scope: Scope;
  params: Record<string, string>;
  query: any;
  body: any;
  req: FastifyRequest;
  reply: FastifyReply;
}

/** A handler returns the response, or null when it has written the response itself (SSE, raw bytes). */
type Result = { status: number; body?: unknown; headers?: Record<string, string> } | null;
type Handler = (ctx: Ctx) => Promise<Result> | Result;

// ---------------------------------------------------------------------------------------------
// Views: the wire shapes. Explicit picks, so engine-internal fields never leak.

/** Where the ports proxy serves a port of a sandbox, relative to the API base. */
export function portPath(id: string, port: number): string {
  return `/v1/sandboxes/${id}/ports/${port}/`;
}

export function sandboxView(i: SandboxInfo): z.infer<typeof S.Sandbox> {
  return {
    id: i.id,
    template: i.template,
    state: i.state,
    labels: i.labels,
    created_at: i.created_at,
    age_secs: i.age_secs,
    idle_secs: i.idle_secs,
    exec_count: i.exec_count,
    parent: i.parent,
    forked_at: i.forked_at,
    children: i.children,
    timeout_secs: i.timeout_secs,
    expires_at: i.expires_at,
    vcpus: i.vcpus,
    memory_mib: i.memory_mib,
    disk_mib: i.disk_mib,
    egress: i.egress,
    ports: (i.ports ?? []).map((p) => ({ port: p.port, protocol: p.protocol, url: portPath(i.id, p.port) })),
  };
}

/**
 * The sandbox with its listening ports read now (GET of one sandbox); other views show the engine's
 * last reading. A failed reading keeps the last one: a port list is not worth failing the GET for.
 */
export async function withLivePorts(service: SandboxService, info: SandboxInfo, scope: Scope, log?: { warn: (o: object, msg: string) => void }): Promise<SandboxInfo> {
  if (info.state !== 'running') return info;
  let ports: OpenPort[];
  try {
    ports = await service.openPorts(info.id, scope);
  } catch (err) {
    if (err instanceof CollimateError && err.code === 'sandbox_not_found') throw err;
    log?.warn({ err, sandbox: info.id }, 'reading open ports failed');
    return info;
  }
  return { ...info, ports };
}

export function templateView(t: TemplateInfo): z.infer<typeof S.Template> {
  return { id: t.id, kind: t.kind, description: t.description, interpreter: t.interpreter, ready: t.ready, vcpus: t.vcpus, memory_mib: t.memory_mib };
}

export function imageView(r: ImageRow): z.infer<typeof S.Image> {
  return {
    id: r.id,
    ref: r.ref,
    source: r.source_kind as 'oci-layout' | 'archive' | 'registry',
    state: r.state,
    error: r.error,
    progress: r.progress,
    layers: r.layers.map((l) => ({ digest: l.digest, diff_id: l.diffId, size: l.size, media_type: l.mediaType, stored_bytes: l.storedBytes })),
    config: {
      env: r.config.env,
      working_dir: r.config.workingDir ?? null,
      user: r.config.user ?? null,
      entrypoint: r.config.entrypoint ?? null,
      cmd: r.config.cmd ?? null,
    },
    warnings: r.runtime?.warnings ?? [],
    transferred_bytes: r.transferred_bytes,
    created_at: new Date(r.created_at).toISOString(),
    updated_at: new Date(r.updated_at).toISOString(),
  };
}

/** Secret values never appear here: only their names. */
export function environmentView(r: EnvironmentRow): z.infer<typeof S.Environment> {
  return {
    name: r.name,
    image: r.image,
    state: r.state,
    error: r.error,
    progress: r.progress,
    log_tail: r.log.trimEnd().split('\n').slice(-20).join('\n'),
    description: r.description,
    interpreter: r.interpreter,
    ready_command: r.ready_command,
    ready_probe: r.ready_probe,
    secret_names: r.secret_names,
    vcpus: r.vcpus,
    memory_mib: r.memory_mib,
    egress: r.egress,
    created_at: new Date(r.created_at).toISOString(),
    updated_at: new Date(r.updated_at).toISOString(),
  };
}

export function execResultView(r: ExecResult): z.infer<typeof S.ExecResult> {
  const v: z.infer<typeof S.ExecResult> = {
    stdout: r.stdout,
    stderr: r.stderr,
    stdout_encoding: r.stdout_encoding,
    stderr_encoding: r.stderr_encoding,
    exit_code: r.exit_code,
    timed_out: r.timed_out,
    stdout_truncated: r.stdout_truncated,
    stderr_truncated: r.stderr_truncated,
    seed: r.seed,
    timing: {
      queued_at: r.timing.queued_at,
      started_at: r.timing.started_at,
      finished_at: r.timing.finished_at,
      queued_ms: r.timing.queued_ms,
      run_ms: r.timing.run_ms,
    },
  };
  if (r.failed_index !== undefined) v.failed_index = r.failed_index;
  if (r.signal !== undefined) v.signal = r.signal;
  if (r.oom_killed) v.oom_killed = true;
  if (r.pids_limited) v.pids_limited = true;
  if (r.error !== undefined) v.error = r.error;
  return v;
}

// ---------------------------------------------------------------------------------------------
// Errors

function validationError(where: string, issues: z.core.$ZodIssue[]): CollimateError {
  const list = issues.slice(0, 20).map((i) => ({
    path: [where, ...i.path.map(String)].join('.'),
    message: i.message,
  }));
  const summary = list.map((i) => `${i.path}: ${i.message}`).join('; ');
  return new CollimateError('validation_error', `Invalid request — ${summary}. See GET /v1/openapi.json.`, { details: { issues: list } });
}

function parseWith<T extends z.ZodType>(schema: T, data: unknown, where: string): z.infer<T> {
  const r = schema.safeParse(data);
  if (!r.success) throw validationError(where, r.error.issues);
  return r.data;
}

/** Maps anything thrown to a client-safe CollimateError (logging internal causes). */
export function toClientError(err: unknown, log?: { error: (o: object, msg: string) => void }, requestId?: string): CollimateError {
  if (err instanceof CollimateError) {
    if (err.status >= 500 && log) log.error({ err }, `service error ${err.code}`);
    return err;
  }
  const e = err as { statusCode?: number; code?: string; message?: string };
  if (typeof e?.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    // Fastify's own 4xx (body too large, bad content length, bad URL, ...).
    switch (e.statusCode) {
      case 413:
        return new CollimateError('payload_too_large', 'Request body too large. Bodies are limited to 16 MiB (64 MiB for PUT /files).');
      case 415:
        return new CollimateError('unsupported_media_type', 'Unsupported Content-Type; send application/json.');
      case 404:
        return new CollimateError('not_found', 'No such endpoint. See GET /v1/openapi.json.');
      default:
        return new CollimateError('validation_error', `Malformed request (${e.code ?? e.statusCode}). See GET /v1/openapi.json.`);
    }
  }
  log?.error({ err }, 'internal error');
  const ref = requestId ? ` (request ${requestId})` : '';
  return new CollimateError('internal_error', `Internal error${ref}; it has been logged. Retry, and report it if it persists.`);
}

function sendError(reply: FastifyReply, err: CollimateError): void {
  if (reply.sent || reply.raw.headersSent) return;
  if (err.retryAfterSecs !== undefined) reply.header('retry-after', String(err.retryAfterSecs));
  reply.code(err.status).type('application/json; charset=utf-8').send(err.toJSON());
}

// ---------------------------------------------------------------------------------------------
// Body decoding

const JSON_CT = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

function decodeJsonBody(req: FastifyRequest): unknown {
  const raw = req.body;
  if (raw === undefined || raw === null) return undefined;
  const buf = Buffer.isBuffer(raw) ? raw : Buffer.from(String(raw));
  const text = buf.toString('utf8');
  if (text.trim() === '') return undefined;
  const ct = req.headers['content-type'];
  if (ct !== undefined && !JSON_CT.test(ct)) {
    throw new CollimateError('unsupported_media_type', `Content-Type ${JSON.stringify(ct.slice(0, 100))} is not supported here; send application/json.`);
  }
  try {
    return JSON.parse(text, (k, v) => {
      // Prototype poisoning guard: such keys are never valid in this API.
      if (k === '__proto__' || (k === 'constructor' && v && typeof v === 'object' && 'prototype' in v)) {
        throw new CollimateError('validation_error', `Key ${JSON.stringify(k)} is not allowed.`);
      }
      return v;
    });
  } catch (e) {
    if (e instanceof CollimateError) throw e;
    throw new CollimateError('invalid_json', `Request body is not valid JSON (${(e as Error).message}).`);
  }
}

function parseLabelFilter(label: string | string[] | undefined): Record<string, string> | undefined {
  if (label === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const l of Array.isArray(label) ? label : [label]) {
    const eq = l.indexOf('=');
    if (eq <= 0) throw new CollimateError('validation_error', `label filter ${JSON.stringify(l.slice(0, 100))} must be key=value.`);
    const k = l.slice(0, eq);
    if (!S.LABEL_KEY_RE.test(k)) throw new CollimateError('validation_error', `label key ${JSON.stringify(k.slice(0, 100))} must match ${S.LABEL_KEY_RE.source}.`);
    out[k] = l.slice(eq + 1);
  }
  return out;
}

/** ISO 8601 or epoch seconds. */
function parseTime(s: string, name: string): number {
  const t = /^\d+(\.\d+)?$/.test(s) ? Number(s) * 1000 : Date.parse(s);
  // 8.64e15 ms is the range of a JS Date (year 275760); beyond it there is no ISO form to answer with.
  if (!Number.isFinite(t) || Math.abs(t) > 8.64e15) throw new CollimateError('validation_error', `${name} must be ISO 8601 or epoch seconds.`);
  return t;
}

function wantsSse(req: FastifyRequest): boolean {
  return /\btext\/event-stream\b/i.test(req.headers.accept ?? '');
}

// ---------------------------------------------------------------------------------------------

export async function buildServer(opts: BuildServerOptions): Promise<ApiServer> {
  const { service, db } = opts;
  const now = opts.now ?? Date.now;
  const maxJson = opts.maxJsonBodyBytes ?? DEFAULT_MAX_JSON_BYTES;
  const maxFile = opts.maxFileBytes ?? DEFAULT_MAX_FILE_BYTES;
  const defaultGrace = opts.shutdownGraceMs ?? 5000;
  applyApiMigrations(db);

  const keys = new KeyStore(db);
  const idempotency = new IdempotencyStore(db);
  const meter = new Meter(db, now);
  const admission = new Admission(service);
  const svc = service as SandboxService & { isReady?: () => boolean; accel?: string; poolSizes?: () => Record<string, number> };
  const health: () => HealthInfo =
    opts.health ?? (() => ({ ready: typeof svc.isReady === 'function' ? svc.isReady() : true, accel: svc.accel ?? 'unknown' }));

  const listAll = (): SandboxInfo[] => {
    const out: SandboxInfo[] = [];
    let after: string | undefined;
    for (let page = 0; page < 10_000; page++) {
      const r = service.list({ limit: 1000, after });
      out.push(...r.sandboxes);
      if (!r.next || r.sandboxes.length === 0) break;
      after = r.next;
    }
    return out;
  };

  // Metrics.
  const metrics = new MetricsRegistry();
  const httpRequests = metrics.register(new Counter('collimate_http_requests_total', 'HTTP requests by route and status.'));
  const httpDuration = metrics.register(new Histogram('collimate_http_request_duration_seconds', 'HTTP request latency by route.'));
  const createSeconds = metrics.register(new Histogram('collimate_create_seconds', 'Sandbox create latency (service call).'));
  const execSeconds = metrics.register(new Histogram('collimate_exec_seconds', 'Exec latency including queueing (service call).'));
  const forkSeconds = metrics.register(new Histogram('collimate_fork_seconds', 'Live fork latency (service call), by child count.'));
  metrics.register(
    new Gauge('collimate_sandboxes', 'Sandboxes by state.', () => {
      const counts: Record<string, number> = { running: 0, suspended: 0 };
      for (const s of listAll()) counts[s.state] = (counts[s.state] ?? 0) + 1;
      return Object.entries(counts).map(([state, value]) => ({ labels: { state }, value }));
    }),
  );
  metrics.register(
    new Gauge('collimate_pool_size', 'Warm pool size by template (when the service reports it).', () =>
      typeof svc.poolSizes === 'function' ? Object.entries(svc.poolSizes()).map(([template, value]) => ({ labels: { template }, value })) : [],
    ),
  );
  metrics.register(
    new Gauge('collimate_ready', '1 once the service is ready (catalog templates warm).', () => [{ labels: {}, value: health().ready ? 1 : 0 }]),
  );

  const app = Fastify({
    logger: opts.logger ?? false,
    bodyLimit: maxJson,
    routerOptions: { maxParamLength: 1000 },
    return503OnClosing: false,
    forceCloseConnections: 'idle',
    clientErrorHandler: (err, socket) => {
      if (!socket.writable) return socket.destroy();
      const body = JSON.stringify(new CollimateError('validation_error', 'Malformed HTTP request.').toJSON());
      socket.end(`HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    },
    frameworkErrors: (err, req, reply) => {
      sendError(reply, toClientError(err, req.log, req.id));
    },
  });

  // Every body arrives as bytes; JSON routes decode it themselves (own codes, own limits).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));

  // Shutdown state and in-flight tracking.
  let draining = false;
  const inflight = new Set<FastifyReply>();
  const streams = new Set<(err: CollimateError) => void>();
  const shuttingDown = () => new CollimateError('shutting_down', 'The server is shutting down; retry shortly.', { retryAfterSecs: 5 });

  app.addHook('onRequest', async (req, reply) => {
    (req as any).startedAt = process.hrtime.bigint();
    if (draining) {
      reply.header('connection', 'close');
      sendError(reply, shuttingDown());
      return reply;
    }
    inflight.add(reply);
    const done = () => inflight.delete(reply);
    reply.raw.once('finish', done);
    reply.raw.once('close', done);
  });

  app.addHook('onResponse', async (req, reply) => {
    const route = req.routeOptions.url ?? 'unmatched';
    const secs = Number(process.hrtime.bigint() - ((req as any).startedAt ?? process.hrtime.bigint())) / 1e9;
    httpRequests.inc({ method: req.method, route, status: String(reply.statusCode) });
    httpDuration.observe(secs, { method: req.method, route });
  });

  app.setErrorHandler((err, req, reply) => {
    sendError(reply, toClientError(err, req.log, req.id));
  });

  app.setNotFoundHandler((req, reply) => {
    const path = req.url.split('?')[0];
    const allowed = ROUTES.filter((r) => r.method !== 'ANY' && matchPath(r.path, path)).map((r) => r.method);
    if (allowed.length) {
      reply.header('allow', [...new Set(allowed)].join(', '));
      return sendError(reply, new CollimateError('method_not_allowed', `${req.method} is not allowed here; use ${[...new Set(allowed)].join(' or ')}.`));
    }
    sendError(reply, new CollimateError('not_found', `No endpoint ${req.method} ${path.slice(0, 200)}. See GET /v1/openapi.json.`));
  });

  const authenticateHeaders = (headers: IncomingHttpHeaders): Principal => {
    const h = headers.authorization;
    const m = typeof h === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(h) : null;
    if (!m) throw new CollimateError('unauthorized', 'Missing API key. Send Authorization: Bearer <key> (create one with `collimate keys create`).');
    const p = keys.authenticate(m[1]);
    if (!p) throw new CollimateError('unauthorized', 'Invalid or revoked API key.');
    return p;
  };
  const authenticate = (req: FastifyRequest): Principal => authenticateHeaders(req.headers);

  const observe = (info: SandboxInfo) => {
    try {
      meter.observe(info as MeteredSandboxInfo);
    } catch (err) {
      app.log.error({ err }, 'metering failed'); // metering must never fail a request
    }
  };

  // The engine emits a `transition` for every acknowledged state change, including the reaper's and
  // other front doors'; metering from those is exact. Without events the reconcile timer catches up.
  const emitter = service as unknown as { on?: (e: string, f: (ev: any) => void) => unknown; off?: (e: string, f: (ev: any) => void) => unknown };
  const onTransition = (ev: { id: string; state: string; snapshotBytes?: number }) => {
    try {
      if (ev.state === 'deleted') meter.deleted(ev.id);
      else meter.observe({ ...service.get(ev.id), ...(ev.snapshotBytes === undefined ? {} : { snapshot_bytes: ev.snapshotBytes }) });
    } catch (err) {
      app.log.error({ err }, 'metering a transition failed');
    }
  };
  if (typeof emitter.on === 'function') emitter.on('transition', onTransition);

  /** Reads the sandbox through the tenant's scope; belt and braces against a service that leaks. */
  const getOwn = (id: string, scope: Scope): SandboxInfo => {
    const info = service.get(id, scope);
    if (info.tenant !== scope.tenant) throw sandboxNotFound(id);
    return info;
  };

  const openApiText = renderOpenApi();
  const dbFile = (db as { name?: string }).name;
  const keyPath = opts.portUrlKeyPath !== undefined ? opts.portUrlKeyPath : dbFile && dbFile !== ':memory:' && dbFile !== '' ? join(dirname(dbFile), 'port-urls.key') : null;
  const signer = new PortUrlSigner(keyPath, now);

  const imagesOrThrow = (): ImageService => {
    if (!opts.images) throw new CollimateError('not_found', 'This server runs without an image service.');
    return opts.images;
  };
  const requireOwnImages = (principal: Principal, what: string) => {
    if (!principal.tier.ownImages) {
      throw new CollimateError('tier_forbidden', `The ${principal.tier.name} tier cannot ${what}; it creates from catalog images only (GET /v1/images). Upgrade to Pro to bring your own images.`);
    }
  };
  /** An environment the image service knows but the engine has not (yet) registered. */
  const unbakedEnvironment = (scope: Scope, id: string): EnvironmentRow | undefined => {
    const env = opts.images?.repo.getEnv(scope.tenant, id);
    return env && env.state !== 'ready' ? env : undefined;
  };

  // -------------------------------------------------------------------------------------------
  // Handlers, by operationId.

  const handlers: Record<string, Handler> = {
    async createSandbox({ principal, scope, body }) {
      const tier = principal.tier;
      // A tier limited to the catalog gets 403 for anything else, whether or not such a template exists.
      const inCatalog = service.templates(scope).some((t) => t.id === body.template && t.kind === 'catalog');
      const unbaked = tier.ownImages ? unbakedEnvironment(scope, body.template) : undefined;
      if (unbaked) {
        throw new CollimateError(
          'template_not_ready',
          `Environment ${body.template} is ${unbaked.state}${unbaked.error ? ` (${unbaked.error})` : ''}; create sandboxes from it once GET /v1/environments/${body.template} shows state ready.`,
          unbaked.state === 'failed' ? {} : { retryAfterSecs: 10 },
        );
      }
      const tpl = !tier.ownImages && !inCatalog ? null : service.template(body.template, scope);
      if (!tpl || (tpl.kind !== 'catalog' && !tier.ownImages)) {
        throw new CollimateError(
          'template_forbidden',
          `Template ${body.template} is not in the catalog; the ${tier.name} tier can only create from catalog images (GET /v1/images). Upgrade to Pro to use your own images.`,
        );
      }
      if (body.timeout_secs !== undefined && body.timeout_secs > tier.maxSessionSecs) {
        throw new CollimateError(
          'tier_forbidden',
          `timeout_secs ${body.timeout_secs} exceeds the ${tier.name} tier's maximum session of ${tier.maxSessionSecs} s.`,
        );
      }
      const slot = await admission.reserve(principal.tenant, tier, 1, 'create');
      try {
        const stop = createSeconds.startTimer();
        const info = await service.create(
          {
            template: body.template,
            labels: body.labels ?? {},
            timeoutSecs: body.timeout_secs ?? tier.defaultSessionSecs,
            ...(body.egress === undefined ? {} : { egress: body.egress }),
          },
          scope,
        );
        stop();
        observe(info);
        return { status: 201, body: sandboxView(info) };
      } finally {
        slot.release();
      }
    },

    listSandboxes({ scope, query }) {
      const r = service.list(
        { state: query.state, labels: parseLabelFilter(query.label), after: query.after, limit: query.limit ?? 100 },
        scope,
      );
      return { status: 200, body: { sandboxes: r.sandboxes.filter((s) => s.tenant === scope.tenant).map(sandboxView), next: r.next } };
    },

    async getSandbox({ scope, params, req }) {
      return { status: 200, body: sandboxView(await withLivePorts(service, getOwn(params.id, scope), scope, req.log)) };
    },

    createPortUrl({ scope, params, body }) {
      getOwn(params.id, scope);
      const expiresAt = Math.floor(now() / 1000) + (body.expires_in_secs ?? S.DEFAULT_PORT_URL_SECS);
      const token = signer.sign({ sandboxId: params.id, port: body.port, expiresAt });
      return { status: 201, body: { url: `/v1/p/${token}/`, port: body.port, expires_at: new Date(expiresAt * 1000).toISOString() } };
    },

    async execSandbox({ scope, params, body, req, reply }) {
      if (!wantsSse(req)) {
        const stop = execSeconds.startTimer();
        const r = await service.exec(params.id, body, scope);
        stop();
        return { status: 200, body: execResultView(r) };
      }
      // Check before committing to a 200 stream, so the common mistakes still get their status code.
      const info = getOwn(params.id, scope);
      if (info.state !== 'running') throw invalidState(params.id, info.state, 'exec', ['running']);
      reply.hijack();
      const res = reply.raw;
      res.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
        'x-accel-buffering': 'no',
      });
      let open = true;
      const send = (event: string, data: unknown) => {
        // A client that went away just stops receiving; the exec itself runs to completion.
        if (open && !res.writableEnded && !res.destroyed) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
      };
      const finish = () => {
        if (!open) return;
        open = false;
        clearInterval(ping);
        streams.delete(abort);
        res.end();
      };
      const abort = (err: CollimateError) => {
        send('error', err.toJSON());
        finish();
      };
      streams.add(abort);
      const ping = setInterval(() => open && !res.destroyed && res.write(': ping\n\n'), 15_000);
      ping.unref();
      const stop = execSeconds.startTimer();
      try {
        const r = await service.exec(params.id, body, scope, {
          onStdout: (c) => send('stdout', { data: c.toString('base64') }),
          onStderr: (c) => send('stderr', { data: c.toString('base64') }),
        });
        stop();
        send('result', execResultView(r));
      } catch (err) {
        send('error', toClientError(err, req.log, req.id).toJSON());
      } finally {
        finish();
      }
      return null;
    },

    async forkSandbox({ principal, scope, params, body }) {
      const count = body.count ?? 1;
      const parent = getOwn(params.id, scope);
      if (parent.state !== 'running') throw invalidState(params.id, parent.state, 'fork', ['running']);
      const slot = await admission.reserve(principal.tenant, principal.tier, count, `fork of ${count}`);
      try {
        const stop = forkSeconds.startTimer({ count: String(count) });
        const children = await service.fork(params.id, { count, labels: body.labels }, scope);
        stop();
        children.forEach(observe);
        return { status: 201, body: { sandboxes: children.map(sandboxView) } };
      } finally {
        slot.release();
      }
    },

    async suspendSandbox({ scope, params }) {
      getOwn(params.id, scope);
      const info = await service.suspend(params.id, scope);
      observe(info);
      return { status: 200, body: sandboxView(info) };
    },

    async resumeSandbox({ principal, scope, params }) {
      const cur = getOwn(params.id, scope);
      if (cur.state !== 'suspended') throw invalidState(params.id, cur.state, 'resume', ['suspended']);
      const slot = await admission.reserve(principal.tenant, principal.tier, 1, 'resume');
      try {
        const info = await service.resume(params.id, scope);
        observe(info);
        return { status: 200, body: sandboxView(info) };
      } finally {
        slot.release();
      }
    },

    async deleteSandbox({ scope, params }) {
      getOwn(params.id, scope);
      await service.delete(params.id, scope);
      try {
        meter.deleted(params.id);
      } catch (err) {
        app.log.error({ err }, 'metering failed');
      }
      return { status: 204 };
    },

    async readFile({ scope, params, query, reply }) {
      getOwn(params.id, scope);
      const data = await service.readFile(params.id, query.path, scope);
      reply.code(200).type('application/octet-stream').send(data);
      return null;
    },

    async writeFile({ scope, params, query, body }) {
      getOwn(params.id, scope);
      const data: Buffer = Buffer.isBuffer(body) ? body : Buffer.alloc(0);
      const mode = query.mode === undefined ? undefined : parseInt(query.mode, 8);
      await service.writeFile(params.id, query.path, data, scope, mode);
      return { status: 200, body: { path: query.path, size: data.length } };
    },

    listImages({ scope }) {
      return {
        status: 200,
        body: {
          images: service.templates(scope).filter((t) => t.kind === 'catalog').map(templateView),
          own: (opts.images?.images(scope.tenant) ?? []).map(imageView),
        },
      };
    },

    async createImage({ principal, scope, body }) {
      requireOwnImages(principal, 'register images');
      const img = await imagesOrThrow().pull(scope.tenant, body.source);
      return { status: 202, body: imageView(img) };
    },

    getImage({ scope, params }) {
      if (!/^sha256:[a-f0-9]{64}$/.test(params.id)) throw new CollimateError('image_not_found', `No image ${params.id.slice(0, 80)}; image ids are sha256:<64 hex>.`);
      return { status: 200, body: imageView(imagesOrThrow().image(scope.tenant, params.id)) };
    },

    deleteImage({ scope, params }) {
      if (!/^sha256:[a-f0-9]{64}$/.test(params.id)) throw new CollimateError('image_not_found', `No image ${params.id.slice(0, 80)}; image ids are sha256:<64 hex>.`);
      imagesOrThrow().deleteImage(scope.tenant, params.id);
      return { status: 204 };
    },

    createEnvironment({ principal, scope, body }) {
      requireOwnImages(principal, 'create environments');
      const tier = principal.tier;
      if ((body.vcpus ?? 1) > tier.maxVcpus || (body.memory_mib ?? 256) > tier.maxMemoryMib) {
        throw new CollimateError('tier_forbidden', `The ${tier.name} tier allows at most ${tier.maxVcpus} vCPUs and ${tier.maxMemoryMib} MiB per environment.`);
      }
      const env = imagesOrThrow().createEnvironment(scope.tenant, {
        name: body.name, image: body.image, description: body.description, interpreter: body.interpreter,
        readyCommand: body.ready_command, readyProbe: body.ready_probe, readyTimeoutSecs: body.ready_timeout_secs,
        secrets: body.secrets, vcpus: body.vcpus, memoryMib: body.memory_mib, egress: body.egress,
      });
      return { status: 202, body: environmentView(env) };
    },

    listEnvironments({ scope }) {
      return { status: 200, body: { environments: (opts.images?.environments(scope.tenant) ?? []).map(environmentView) } };
    },

    getEnvironment({ scope, params }) {
      return { status: 200, body: environmentView(imagesOrThrow().environment(scope.tenant, params.name)) };
    },

    getEnvironmentLog({ scope, params, reply }) {
      const env = imagesOrThrow().environment(scope.tenant, params.name);
      reply.code(200).type('text/plain; charset=utf-8').send(env.log);
      return null;
    },

    async deleteEnvironment({ scope, params }) {
      await imagesOrThrow().deleteEnvironment(scope.tenant, params.name);
      return { status: 204 };
    },

    listTemplates({ scope }) {
      const baked = service.templates(scope);
      const unbaked = (opts.images?.templateInfos(scope) ?? []).filter((t) => !t.ready && !baked.some((b) => b.kind === 'environment' && b.id === t.id));
      return { status: 200, body: { templates: [...baked, ...unbaked].map(templateView) } };
    },

    getTemplate({ scope, params }) {
      if (!S.TEMPLATE_ID_RE.test(params.id)) {
        throw new CollimateError('template_not_found', `No template ${params.id.slice(0, 130)}. List them with GET /v1/templates.`);
      }
      const unbaked = unbakedEnvironment(scope, params.id);
      if (unbaked) return { status: 200, body: templateView(opts.images!.templateInfos(scope).find((t) => t.id === params.id)!) };
      return { status: 200, body: templateView(service.template(params.id, scope)) };
    },

    getUsage({ principal, query }) {
      const t = now();
      const d = new Date(t);
      const to = query.to === undefined ? t : parseTime(query.to, 'to');
      const from = query.from === undefined ? Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) : parseTime(query.from, 'from');
      if (!(from < to)) throw new CollimateError('validation_error', '`from` must be before `to`.');
      return { status: 200, body: meter.usage(principal.tenant, from, to) };
    },

    getOpenApi({ reply }) {
      reply.code(200).type('application/json; charset=utf-8').send(openApiText);
      return null;
    },

    health() {
      const h = health();
      const status = draining ? 'shutting_down' : h.ready ? 'ok' : 'starting';
      const extra = {
        ...(h.mode ? { mode: h.mode } : {}),
        ...(h.isolation ? { isolation: h.isolation } : {}),
        ...(h.confinement ? { confinement: h.confinement } : {}),
        ...(h.network ? { network: h.network } : {}),
      };
      return { status: status === 'ok' ? 200 : 503, body: { status, accel: h.accel, templates_ready: h.ready, ...extra } };
    },

    metrics({ reply }) {
      reply.code(200).type('text/plain; version=0.0.4; charset=utf-8').send(metrics.render());
      return null;
    },
  };

  // -------------------------------------------------------------------------------------------
  // Binding: one generic wrapper per route does auth, validation, idempotency and rendering.

  for (const route of ROUTES) {
    if (route.method === 'ANY') continue; // the ports proxy binds its own (portsProxy.ts)
    const handler = handlers[route.operationId];
    if (!handler) throw new Error(`no handler for ${route.operationId}`);
    app.route({
      method: route.method,
      url: route.path,
      bodyLimit: route.bodyKind === 'raw' ? maxFile : maxJson,
      handler: async (req, reply) => {
        try {
          const principal = route.auth ? authenticate(req) : (null as unknown as Principal);
          const scope: Scope = { tenant: principal ? principal.tenant : '' };
          const params = (req.params ?? {}) as Record<string, string>;
          for (const [name, kind] of Object.entries(route.params ?? {})) {
            if (kind === 'sandbox' && !S.SANDBOX_ID_RE.test(params[name])) throw sandboxNotFound(params[name].slice(0, 100));
          }
          const query = parseWith(route.query ?? S.EmptyQuery, req.query ?? {}, 'query');
          let body: unknown;
          if (route.bodyKind === 'json') {
            const decoded = decodeJsonBody(req);
            body = parseWith(route.body!, decoded === undefined && route.bodyOptional ? {} : decoded, 'body');
          } else if (route.bodyKind === 'raw') {
            body = req.body;
          }
          const ctx: Ctx = { principal, scope, params, query, body, req, reply };
          const idemKey = req.headers['idempotency-key'];
          let result: Result;
          if (route.idempotent && idemKey !== undefined) {
            const key = Array.isArray(idemKey) ? idemKey[0] : idemKey;
            const fp = fingerprint(route.method, req.url.split('?')[0], body);
            const r = await idempotency.run(principal.tenant, key, fp, async () => {
              const out = (await handler(ctx))!;
              return { status: out.status, body: out.body };
            });
            result = { status: r.status, body: r.body, headers: r.replayed ? { 'idempotent-replayed': 'true' } : undefined };
          } else {
            result = await handler(ctx);
          }
          if (result === null || reply.sent || reply.raw.headersSent) return reply;
          for (const [k, v] of Object.entries(result.headers ?? {})) reply.header(k, v);
          reply.code(result.status);
          if (result.body === undefined) return reply.send();
          return reply.type('application/json; charset=utf-8').send(result.body);
        } catch (err) {
          if (reply.raw.headersSent) return reply;
          sendError(reply, toClientError(err, req.log, req.id));
          return reply;
        }
      },
    });
  }

  const reconcile = () => {
    try {
      meter.reconcile(listAll() as MeteredSandboxInfo[]);
    } catch (err) {
      app.log.error({ err }, 'metering reconcile failed');
    }
  };
  reconcile();
  const timers: NodeJS.Timeout[] = [];
  // With engine events the reconcile is only a safety net.
  const period = opts.reconcileIntervalMs ?? (typeof emitter.on === 'function' ? 60_000 : 10_000);
  if (period > 0) timers.push(setInterval(reconcile, period));
  timers.push(setInterval(() => idempotency.prune(), 60 * 60 * 1000));
  timers.forEach((t) => t.unref());

  let shutdownPromise: Promise<void> | null = null;
  const shutdown = (graceMs = defaultGrace): Promise<void> => {
    shutdownPromise ??= (async () => {
      draining = true;
      timers.forEach(clearInterval);
      if (typeof emitter.off === 'function') emitter.off('transition', onTransition);
      const closed = app.close(); // stops accepting connections; resolves once they are all gone
      const deadline = Date.now() + graceMs;
      while (inflight.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
      for (const abort of [...streams]) abort(shuttingDown());
      proxy.closeTunnels();
      for (const reply of [...inflight]) {
        if (!reply.sent && !reply.raw.headersSent) {
          reply.header('connection', 'close');
          sendError(reply, shuttingDown());
        }
      }
      const force = setTimeout(() => app.server.closeAllConnections?.(), 2000);
      force.unref();
      await closed;
      clearTimeout(force);
      reconcile();
    })();
    return shutdownPromise;
  };

  registerMcp(app, { service, auth: authenticate, admission, signer });
  const proxy = registerPortsProxy(app, { service, authenticate: authenticateHeaders, signer, draining: () => draining, toClientError: (err, log) => toClientError(err, log) });
  app.addHook('preClose', async () => {
    // app.close() waits for every connection, and a WebSocket tunnel may never end by itself.
    if (!draining) proxy.closeTunnels();
  });

  await app.ready();
  return { app, keys, meter, admission, idempotency, metrics, reconcile, shutdown };
}
