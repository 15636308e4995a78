/**
 * The REST API server: HTTP set-up, drain on shutdown, and the front doors bound to one tenant
 * service — the JSON routes (binder.ts + handlers/), MCP (src/mcp) and the ports proxy. It only
 * translates: every rule a tenant meets lives in src/service/tenantService.ts.
 */
import type { IncomingHttpHeaders } from 'node:http';
import Fastify, { LogController, type FastifyInstance, type FastifyReply, type FastifyServerOptions } from 'fastify';
import { fileLimits } from '../config.js';
import { CollimateError } from '../errors.js';
import type { Admission } from '../service/admission.js';
import type { KeyStore } from '../service/keys.js';
import type { Meter } from '../service/metering.js';
import type { MetricsRegistry } from '../service/metrics.js';
import type { TenantService } from '../service/tenantService.js';
import type { IdempotencyRunner, Scope } from '../service/types.js';
import { registerMcp } from '../mcp/index.js';
import { toClientError } from '../wire/errors.js';
import { bindRoutes, sendError } from './binder.js';
import { bearerKey } from '../service/keys.js';
import { accountHandlers } from './handlers/account.js';
import { registerConsole } from './console.js';
import { terminalBridge } from './terminal.js';
import { imageHandlers } from './handlers/images.js';
import { logLifecycle, registerRequestLogging, requestIdOf } from './logging.js';
import { operationHandlers, type HealthInfo } from './handlers/operations.js';
import { sandboxHandlers } from './handlers/sandboxes.js';
import { processHandlers } from './handlers/processes.js';
import { codeHandlers } from './handlers/code.js';
import { fileHandlers } from './handlers/files.js';
import { registerHttpMetrics } from './httpMetrics.js';
import { headerRoutedUrl, hostRoutedUrl, registerPortsProxy, type UpgradeInterceptor } from './portsProxy.js';
import { registerE2bControlPlane } from '../e2b/controlPlane.js';
import { SandboxEnvStore, type SandboxEnvs } from '../e2b/sandboxEnv.js';
import { registerEnvd, type EnvdBackend } from '../e2b/envd.js';
import { tenantEnvdBackend } from '../e2b/envdBackend.js';
import { matchPath, ROUTES } from './routes.js';
import { SseStreams } from './sse.js';

export type { HealthInfo } from './handlers/operations.js';

export const DEFAULT_MAX_JSON_BYTES = 16 * 1024 * 1024;
/** The largest upload (PUT /files) by default: COLLIMATE_MAX_UPLOAD_MIB, else 1 GiB. */
export const DEFAULT_MAX_FILE_BYTES = fileLimits().maxUploadBytes;
/**
 * How long a client may take to send one whole request, headers and body (a 64 MiB upload at
 * 250 KB/s). Fastify turns Node's own limit off: a client that stalled mid-body held its connection,
 * and a descriptor, for ever. Once the request is in, a long exec or an event stream is not limited.
 */
export const DEFAULT_REQUEST_TIMEOUT_MS = 300_000;

export interface BuildServerOptions {
  /** The tenant service every front door calls. The caller closes it (after shutdown). */
  tenants: TenantService;
  /** Fastify's logger options (logging.ts serverLoggerOptions for the server's JSON lines); none by default. */
  logger?: FastifyServerOptions['logger'];
  /** Serve HTTPS with this certificate chain and private key (PEM). */
  tls?: { cert: string | Buffer; key: string | Buffer };
  /** Readiness for /healthz; defaults to the engine's isReady()/accel when it has them. */
  health?: () => HealthInfo;
  maxJsonBodyBytes?: number;
  /** The largest upload (PUT /files, streamed to the guest). Default COLLIMATE_MAX_UPLOAD_MIB, else 1 GiB. */
  maxFileBytes?: number;
  /** How long a client may take to send a whole request before its connection is answered and closed. Default 300 s. */
  requestTimeoutMs?: number;
  /** How long shutdown lets in-flight requests finish before failing them with 503. Default 5 s. */
  shutdownGraceMs?: number;
  now?: () => number;
  /** The console bundle served at /console (default dist/console of this checkout). */
  consoleDir?: string;
  /** What E2B's envd front door drives (default: the tenant service's processes and files); tests give one on the host. */
  envdBackend?: EnvdBackend;
  /** Routes of a cluster host's own (its peers' operations, blobs, moves), installed before the doors. */
  beforeRoutes?: (app: FastifyInstance) => void;
  /** Sees every HTTP upgrade first (a cluster host's peer tunnels to its sandboxes' ports). */
  interceptUpgrade?: UpgradeInterceptor;
  /** Where E2B sandboxes' envVars are kept; default this server's database (a cluster host passes the cluster's). */
  e2bEnv?: SandboxEnvs;
  /** The domain under which sandbox ports have origins of their own (`<port>-<id>.<domain>`); see PortsProxyOptions. */
  sandboxDomain?: string;
  /** The operator's bearer token for a /metrics scrape that names tenants' environments; without it they are summed. */
  metricsToken?: string;
}

export interface ApiServer {
  app: FastifyInstance;
  tenants: TenantService;
  keys: KeyStore;
  meter: Meter;
  /** The single-host admission (undefined on a cluster host, whose caps are the cluster's). */
  admission?: Admission;
  idempotency: IdempotencyRunner;
  metrics: MetricsRegistry;
  /** Brings the meter in line with the engine's current sandboxes. */
  reconcile(): void;
  /**
   * Stops accepting requests (new ones get 503 shutting_down), lets in-flight ones finish for the grace
   * period, fails the rest with 503 shutting_down, and closes the HTTP server. Does not close the
   * tenant service or the engine: the caller does, after this resolves.
   */
  shutdown(graceMs?: number): Promise<void>;
}

export async function buildServer(opts: BuildServerOptions): Promise<ApiServer> {
  const { tenants } = opts;
  const now = opts.now ?? Date.now;
  const maxJson = opts.maxJsonBodyBytes ?? DEFAULT_MAX_JSON_BYTES;
  const maxFile = opts.maxFileBytes ?? DEFAULT_MAX_FILE_BYTES;
  const defaultGrace = opts.shutdownGraceMs ?? 5000;
  const requestTimeout = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  // Node checks the limit on this period (30 s by default): a short limit is checked as often as it
  // needs. Node enforces it only while the headers' limit (60 s) is no longer than it.
  const checking = {
    connectionsCheckingInterval: Math.max(50, Math.min(30_000, Math.floor(requestTimeout / 4))),
    headersTimeout: Math.min(60_000, requestTimeout),
  };
  const engine = tenants.engine;
  const health: () => HealthInfo =
    opts.health ?? (() => ({ ready: typeof engine.isReady === 'function' ? engine.isReady() : true, accel: engine.accel ?? 'unknown' }));

  const app = Fastify({
    logger: opts.logger ?? false,
    ...(opts.tls ? { https: { cert: opts.tls.cert, key: opts.tls.key, ...checking } } : { http: checking }),
    requestTimeout,
    genReqId: requestIdOf,
    // A reverse proxy on this host terminating TLS (docs/operations.md): X-Forwarded-Proto from it
    // makes the absolute URLs the server hands out (MCP's expose_port) https. Others are not believed.
    trustProxy: 'loopback',
    // One line per request instead (logging.ts), with the sandbox and tenant it concerns.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: maxJson,
    routerOptions: { maxParamLength: 1000 },
    // E2B's sandbox.getHost(port) names a port by Host (`<port>-<sandbox id>.<domain>`), and its SDK's
    // calls to a port through the one sandbox URL by headers: both go to the ports proxy.
    rewriteUrl: (req) => hostRoutedUrl(req.headers.host, headerRoutedUrl(req.headers, req.url ?? '/')),
    return503OnClosing: false,
    forceCloseConnections: 'idle',
    clientErrorHandler: (err, socket) => {
      if (!socket.writable) return socket.destroy();
      const message = (err as NodeJS.ErrnoException).code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? `The request did not arrive whole within ${requestTimeout / 1000} s; send the body without pausing.`
        : 'Malformed HTTP request.';
      const body = JSON.stringify(new CollimateError('validation_error', message).toJSON());
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
  const streams = new SseStreams();
  const shuttingDown = () => new CollimateError('shutting_down', 'The server is shutting down; retry shortly.', { retryAfterSecs: 5 });

  app.addHook('onRequest', async (_req, reply) => {
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
  registerHttpMetrics(app, tenants.metrics, () => health().ready);
  registerRequestLogging(app);
  // The service's own failures (metering, port readings) and the engine's lifecycle go to the same log.
  if (opts.logger) tenants.log = (err, msg) => app.log.error({ err }, msg);
  const stopLifecycleLog = logLifecycle(tenants.engine, app.log);
  app.addHook('onClose', async () => stopLifecycleLog());

  app.setErrorHandler((err, req, reply) => {
    sendError(reply, toClientError(err, req.log, req.id));
  });

  app.setNotFoundHandler((req, reply) => {
    const path = req.url.split('?')[0];
    const allowed = [...new Set<string>(ROUTES.filter((r) => r.method !== 'ANY' && matchPath(r.path, path)).map((r) => r.method))];
    if (allowed.length) {
      reply.header('allow', allowed.join(', '));
      return sendError(reply, new CollimateError('method_not_allowed', `${req.method} is not allowed here; use ${allowed.join(' or ')}.`));
    }
    sendError(reply, new CollimateError('not_found', `No endpoint ${req.method} ${path.slice(0, 200)}. See GET /v1/openapi.json.`));
  });

  opts.beforeRoutes?.(app);
  bindRoutes(
    app,
    {
      ...sandboxHandlers(tenants, streams),
      ...processHandlers(tenants, streams),
      ...codeHandlers(tenants, streams),
      ...fileHandlers(tenants, streams, { maxUploadBytes: maxFile }),
      ...imageHandlers(tenants, streams),
      ...accountHandlers(tenants, streams),
      ...operationHandlers({ tenants, metrics: tenants.metrics, health, draining: () => draining, now, ...(opts.metricsToken ? { metricsToken: opts.metricsToken } : {}) }),
    },
    { tenants, maxJsonBytes: maxJson, maxFileBytes: maxFile },
  );
  registerConsole(app, opts.consoleDir);
  const authenticate = (headers: IncomingHttpHeaders): Promise<Scope> => tenants.accounts.authenticate(bearerKey(headers.authorization));
  registerMcp(app, { tenants, authenticate });
  const e2bEnv = opts.e2bEnv ?? new SandboxEnvStore(tenants.db);
  registerE2bControlPlane(app, { tenants, env: e2bEnv });
  registerEnvd(app, { tenants, env: e2bEnv, backend: opts.envdBackend ?? tenantEnvdBackend(tenants, { maxUploadBytes: maxFile }) });
  const terminals = terminalBridge(tenants, app.log);
  const proxy = registerPortsProxy(app, {
    tenants, authenticate, draining: () => draining, terminals,
    ...(opts.interceptUpgrade ? { interceptUpgrade: opts.interceptUpgrade } : {}),
    ...(opts.sandboxDomain ? { sandboxDomain: opts.sandboxDomain } : {}),
  });
  app.addHook('preClose', async () => {
    // app.close() waits for every connection, and a WebSocket tunnel may never end by itself.
    if (!draining) {
      proxy.closeTunnels();
      terminals.closeAll();
    }
  });

  let shutdownPromise: Promise<void> | null = null;
  const shutdown = (graceMs = defaultGrace): Promise<void> => {
    shutdownPromise ??= (async () => {
      draining = true;
      const closed = app.close(); // stops accepting connections; resolves once they are all gone
      const deadline = Date.now() + graceMs;
      while (inflight.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
      streams.abortAll(shuttingDown());
      proxy.closeTunnels();
      terminals.closeAll();
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
      tenants.usage.reconcile();
    })();
    return shutdownPromise;
  };

  await app.ready();
  return {
    app,
    tenants,
    keys: tenants.keys,
    meter: tenants.meter,
    admission: tenants.admission,
    idempotency: tenants.idempotency,
    metrics: tenants.metrics,
    reconcile: () => tenants.usage.reconcile(),
    shutdown,
  };
}
