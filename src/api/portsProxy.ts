/**
 * The ports proxy: HTTP of any method and WebSocket upgrades on
 *   /v1/sandboxes/{id}/ports/{port}/<path>   with the tenant's key, and
 *   /v1/p/<token>/<path>                     with a signed URL (portUrls.ts), no key,
 * streamed to where the service says the sandbox's port is (SandboxService.portTarget) and back.
 * Bodies are never buffered: the routes live in a plugin whose content-type parser leaves the
 * request stream untouched, and the handler pipes it upstream. WebSocket upgrades arrive on the
 * HTTP server's `upgrade` event and become a raw TCP tunnel once authorized.
 *
 * A sandbox created with public ports (E2B's allowPublicTraffic) answers on its keyed paths and its
 * port hosts without a key or token: a request no key or token opened is routed to that sandbox's
 * port as one of its owner's, and to nothing else.
 *
 * The tenant's key never reaches the sandbox: Authorization, X-Api-Key and any header carrying the
 * presented key are dropped; the sandbox sees `Host: localhost:<port>` (what dev servers accept), or
 * the Host its port_host names, and X-Forwarded-For/-Proto/-Host/-Prefix. Errors of the proxy itself are the API's error bodies with
 * `X-Collimate-Error: <code>`, so a client can tell them from the sandbox server's own answers.
 */
import { request as httpRequest, ServerResponse, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { PortRoute } from '../service/sandboxHost.js';
import type { FastifyBaseLogger, FastifyInstance } from 'fastify';
import { CollimateError, sandboxNotFound } from '../errors.js';
import type { PortTarget } from '../sandboxes/types.js';
import type { TenantService } from '../service/tenantService.js';
import type { ResolvedPort, Scope } from '../service/types.js';
import { bearerKey } from '../service/keys.js';
import { requestHostOf } from '../sandboxes/portHost.js';
import { toClientError } from '../wire/errors.js';
import { SANDBOX_ID_RE } from '../wire/schemas.js';
import { restNames } from './routes.js';
import { isTerminalPath, type TerminalBridge } from './terminal.js';
import { E2B_ENVD_PREFIX } from '../e2b/envd.js';

/** envd's port, which E2B's SDK names in E2b-Sandbox-Port for envd's own calls. */
const E2B_ENVD_PORT = 49983;

export const PROXY_ERROR_HEADER = 'x-collimate-error';
/** E2B's header for a sandbox's traffic token (PortUrlSigner.sandboxToken 'traffic': its ports, nothing else) instead of a key. */
export const TRAFFIC_TOKEN_HEADER = 'e2b-traffic-access-token';
/** `Host: <port>-<sandbox id>.<anything>`: E2B's `sandbox.getHost(port)`, routed to that port. */
const HOST_ROUTE_RE = /^(\d{1,5})-(sbx_[0-9a-f]{12})\.[^/\s]+$/i;
/**
 * On a sandbox port's own origin, the path that takes a signed URL's token (`?token=…&next=/…`) into
 * PORT_COOKIE and sends the browser on; it never reaches the sandbox.
 */
export const SIGNED_ENTRY = '/__collimate/signed';
/** The cookie a sandbox port's own origin keeps a signed URL's token in: HttpOnly, that host only, removed before requests reach the sandbox. */
export const PORT_COOKIE = '__collimate_port';

/**
 * The proxy path a Host-routed request stands for (`3000-sbx_….localhost:8080` → the keyed path of
 * port 3000), or the URL unchanged. Used before routing (Fastify's rewriteUrl) and for upgrades.
 */
export function hostRoutedUrl(host: string | undefined, rawUrl: string): string {
  const m = HOST_ROUTE_RE.exec(host ?? '');
  if (!m) return rawUrl;
  return `/v1/sandboxes/${m[2].toLowerCase()}/ports/${m[1]}${rawUrl.startsWith('/') ? rawUrl : '/' + rawUrl}`;
}
/**
 * The proxy path of a request E2B's SDK sends to its one sandbox URL (E2B_SANDBOX_URL, our
 * /e2b/envd) for a port other than envd's: it names the sandbox and the port in `E2b-Sandbox-Id` and
 * `E2b-Sandbox-Port` (`@e2b/code-interpreter` does, for its port 49999), as E2B's own sandbox proxy
 * routes them. Any other request's URL is returned unchanged.
 */
export function headerRoutedUrl(headers: IncomingHttpHeaders, rawUrl: string): string {
  if (!rawUrl.startsWith(`${E2B_ENVD_PREFIX}/`)) return rawUrl;
  const port = String(headers['e2b-sandbox-port'] ?? '');
  const id = String(headers['e2b-sandbox-id'] ?? '').toLowerCase();
  if (!/^\d{1,5}$/.test(port) || Number(port) === E2B_ENVD_PORT || !SANDBOX_ID_RE.test(id)) return rawUrl;
  return `/v1/sandboxes/${id}/ports/${port}${rawUrl.slice(E2B_ENVD_PREFIX.length)}`;
}
/** How long connecting to a sandbox port may take before the proxy answers 502. */
const CONNECT_TIMEOUT_MS = 10_000;

export interface PortsProxyOptions {
  tenants: TenantService;
  /** The REST API's key check on request headers: the caller's scope, or a thrown `unauthorized`. */
  authenticate: (headers: IncomingHttpHeaders) => Promise<Scope>;
  /**
   * Where sandbox ports have origins of their own: `<port>-<id>.<sandboxDomain>` (with its port, if
   * not the default). Default: for requests to `localhost[:port]`, `localhost:<port>` (browsers
   * resolve *.localhost to loopback); otherwise none, and browsers stay on the API's origin,
   * confined (SHARED_ORIGIN_CSP).
   */
  sandboxDomain?: string;
  /** True once the server is shutting down: new requests and upgrades get 503. */
  draining: () => boolean;
  /** WebSocket upgrades of the web terminal's path go here (the one `upgrade` listener serves both). */
  terminals?: TerminalBridge;
  /**
   * Sees every upgrade first (cluster mode: one for a sandbox on another host is tunnelled there).
   * Returns true when it took the socket; it calls `handleHere` if it decides this server answers after all.
   */
  interceptUpgrade?: UpgradeInterceptor;
}

export type UpgradeInterceptor = (req: IncomingMessage, socket: Duplex, head: Buffer, handleHere: () => void) => boolean;

export interface PortsProxy {
  /** Ends every WebSocket tunnel (at shutdown: they are not requests a grace period could wait for). */
  closeTunnels(): void;
}

/** Where one proxied request goes, and what of its URL the sandbox sees. */
interface Route {
  sandboxId: string;
  port: number;
  target: PortRoute;
  /** The proxy's own part of the path (X-Forwarded-Prefix). */
  prefix: string;
  /** Path and query as the sandbox sees them: what followed the prefix, `/` at least. */
  forwardPath: string;
  /** The key the request authenticated with (dropped wherever it appears); undefined for signed URLs. */
  key?: string;
  /** Whose open_streams quota the connection counts against: the sandbox owner's. */
  holder: Scope;
}

const HOP_BY_HOP = new Set([
  'connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'proxy-authorization', 'proxy-authenticate',
]);
/** Set by the proxy itself; whatever a client sent under these names is replaced. */
const OWN = new Set(['host', 'x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host', 'x-forwarded-prefix', 'forwarded', TRAFFIC_TOKEN_HEADER]);
/** A Collimate key in either shape (keys.ts): never forwarded on a request that did not authenticate with it. */
const COLLIMATE_KEY = /\b(?:clm_[0-9A-Za-z]{40}|e2b_[0-9a-f]{80})\b/;

function validation(message: string): CollimateError {
  return new CollimateError('validation_error', message);
}

/** The proxy route a raw request URL names, or null when it is not a proxy path. */
export function proxyPathOf(rawUrl: string): { kind: 'key'; id: string; port: string } | { kind: 'signed'; token: string } | null {
  const path = rawUrl.split('?', 1)[0];
  const s = path.split('/');
  if (s[1] !== 'v1') return null;
  if (s[2] === 'sandboxes' && s[4] === 'ports' && s.length >= 6) return { kind: 'key', id: s[3], port: s[5] };
  if (s[2] === 'p' && s.length >= 4) return { kind: 'signed', token: s[3] };
  return null;
}

/** Splits a raw URL after its first `segments` path segments: the prefix and the rest (path + query, `/` at least). */
function splitUrl(rawUrl: string, segments: number): { prefix: string; forwardPath: string } {
  const q = rawUrl.indexOf('?');
  const path = q < 0 ? rawUrl : rawUrl.slice(0, q);
  const query = q < 0 ? '' : rawUrl.slice(q);
  const s = path.split('/');
  return { prefix: s.slice(0, segments + 1).join('/'), forwardPath: '/' + s.slice(segments + 1).join('/') + query };
}

function parsePort(raw: string): number {
  if (!/^\d{1,5}$/.test(raw) || Number(raw) < 1 || Number(raw) > 65535) {
    throw validation(`${JSON.stringify(decodeSafe(raw).slice(0, 20))} is not a port; use a TCP port 1..65535, e.g. /v1/sandboxes/{id}/ports/8000/.`);
  }
  return Number(raw);
}

function decodeSafe(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/**
 * Authenticates and resolves a proxy request to its target. Throws the API's errors: 401 without a
 * valid key or token, 404 for ids that are not the caller's (or deleted), 400 for a bad port, and
 * whatever portTarget throws (409 invalid_state / network_unavailable).
 */
async function resolveRoute(opts: PortsProxyOptions, rawUrl: string, headers: IncomingHttpHeaders): Promise<Route> {
  const p = proxyPathOf(rawUrl);
  if (!p) throw new CollimateError('not_found', 'Not a ports proxy path.');
  if (p.kind === 'key') {
    const id = decodeSafe(p.id);
    const traffic = headers[TRAFFIC_TOKEN_HEADER];
    const hasKey = headers.authorization !== undefined;
    const signed = !hasKey && traffic === undefined && ownOrigin(headers) ? cookieOf(headers.cookie, PORT_COOKIE) : undefined;
    if (signed !== undefined) return signedRoute(opts, await signedFor(opts, signed, id, p.port), splitUrl(rawUrl, 5));
    let scope: Scope;
    try {
      scope = !hasKey && typeof traffic === 'string' ? await opts.tenants.accounts.sandboxScope(id, traffic, 'traffic') : await opts.authenticate(headers);
      if (!SANDBOX_ID_RE.test(id)) throw sandboxNotFound(id.slice(0, 100));
    } catch (err) {
      // No key, or one that does not open it: a sandbox with public ports answers all the same.
      if (!(err instanceof CollimateError && err.code === 'unauthorized')) throw err;
      const open = await publicRoute(opts, id, p.port, rawUrl);
      if (!open) throw err;
      return open;
    }
    let target: ResolvedPort;
    try {
      target = await opts.tenants.sandboxes.portTarget(scope, id, parsePort(p.port));
    } catch (err) {
      // Another tenant's key: not its sandbox (404), unless its ports are public.
      if (!(err instanceof CollimateError && err.code === 'sandbox_not_found')) throw err;
      const open = await publicRoute(opts, id, p.port, rawUrl);
      if (!open) throw err;
      return open;
    }
    return { ...target, ...splitUrl(rawUrl, 5), key: bearerKey(headers.authorization), holder: scope };
  }
  return signedRoute(opts, await opts.tenants.sandboxes.signedPortTarget(p.token), splitUrl(rawUrl, 3));
}

/**
 * The route of a request to a sandbox with public ports, as one of its owner's without a key (the
 * headers forwarded as for a signed URL: a Collimate key sent along is dropped); undefined when the
 * sandbox is unknown or its ports are not public, so the caller's refusal stands unchanged.
 */
async function publicRoute(opts: PortsProxyOptions, id: string, port: string, rawUrl: string): Promise<Route | undefined> {
  const tenant = await opts.tenants.sandboxes.publicPortsOwner(id);
  if (tenant === null) return undefined;
  const holder = await opts.tenants.accounts.scopeOf(tenant);
  return { ...(await opts.tenants.sandboxes.portTarget(holder, id, parsePort(port))), ...splitUrl(rawUrl, 5), holder };
}

async function signedRoute(opts: PortsProxyOptions, r: ResolvedPort, path: { prefix: string; forwardPath: string }): Promise<Route> {
  return { ...r, ...path, holder: await opts.tenants.accounts.scopeOf(r.tenant) };
}

/** A signed URL's target, refused unless it names this sandbox and port (a token of another port's origin proves nothing here). */
async function signedFor(opts: PortsProxyOptions, token: string, id: string, port: string): Promise<ResolvedPort> {
  const r = await opts.tenants.sandboxes.signedPortTarget(token);
  if (r.sandboxId !== id || String(r.port) !== port) throw new CollimateError('unauthorized', 'This signed URL is for another sandbox port; open the URL its owner gave you.');
  return r;
}

/** One cookie's value from a Cookie header. */
function cookieOf(header: string | undefined, name: string): string | undefined {
  for (const part of (header ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** The Cookie header without `name` (undefined when nothing is left). */
function withoutCookie(header: string, name: string): string | undefined {
  const kept = header.split(';').map((p) => p.trim()).filter((p) => p && !p.startsWith(`${name}=`));
  return kept.length ? kept.join('; ') : undefined;
}

/**
 * The origin a sandbox port's traffic gets in browsers (`http://8000-sbx_….localhost:7070`), or
 * undefined when there is none for this request's host.
 */
function portOrigin(req: IncomingMessage, sandboxDomain: string | undefined, id: string, port: number): string | undefined {
  const proto = (req.socket as { encrypted?: boolean }).encrypted ? 'https' : 'http';
  let domain = sandboxDomain;
  if (!domain) {
    // Addressed as localhost, browsers resolve <port>-<id>.localhost to this machine too.
    const m = /^localhost(:\d+)?$/i.exec(req.headers.host ?? '');
    if (!m) return undefined;
    domain = `localhost${m[1] ?? ''}`;
  }
  return `${proto}://${port}-${id}.${domain}`;
}

/** The tunnel to a port of a sandbox another host runs (undefined: connect to host:port here). */
async function tunnelOf(route: Route): Promise<Duplex | undefined> {
  return route.target.connect ? route.target.connect() : undefined;
}

/** A failed connect as the client is told it: the ports proxy's words for a socket error, or the host's own error. */
function connectError(err: unknown, route: Route): CollimateError {
  return err instanceof CollimateError ? err : upstreamError(err as NodeJS.ErrnoException, route);
}

/**
 * The request headers the sandbox gets, as a flat raw list: hop-by-hop headers and the proxy's own
 * out, the tenant's key out wherever it is, then Host and the X-Forwarded-* set. With `upgrade`,
 * Connection and Upgrade are kept (the tunnel needs them).
 */
export function forwardHeaders(raw: string[], route: Route, client: { ip?: string; proto: string; host?: string }, upgrade: boolean): string[] {
  const named = new Set<string>();
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].toLowerCase() === 'connection') for (const t of raw[i + 1].split(',')) named.add(t.trim().toLowerCase());
  }
  const out: string[] = [];
  const forwardedFor: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i];
    const value = raw[i + 1];
    const lower = name.toLowerCase();
    if (lower === 'x-forwarded-for') {
      forwardedFor.push(value);
      continue;
    }
    if (OWN.has(lower)) continue;
    if (upgrade && (lower === 'connection' || lower === 'upgrade')) {
      out.push(name, value);
      continue;
    }
    if (HOP_BY_HOP.has(lower) || named.has(lower)) continue;
    if (lower === 'cookie' && value.includes(`${PORT_COOKIE}=`)) {
      const rest = withoutCookie(value, PORT_COOKIE);
      if (rest) out.push(name, rest);
      continue;
    }
    if (route.key !== undefined) {
      // Keyed requests: the key and anything that could carry it stay here.
      if (lower === 'authorization' || lower === 'x-api-key' || (route.key && value.includes(route.key))) continue;
    } else if ((lower === 'authorization' || lower === 'x-api-key') && COLLIMATE_KEY.test(value)) {
      // Signed URLs forward the app's own Authorization, never a Collimate key sent along by mistake.
      continue;
    }
    out.push(name, value);
  }
  if (client.ip) forwardedFor.push(client.ip);
  out.push('Host', route.target.requestHost ?? requestHostOf(null, route.port));
  if (forwardedFor.length) out.push('X-Forwarded-For', forwardedFor.join(', '));
  out.push('X-Forwarded-Proto', client.proto);
  if (client.host) out.push('X-Forwarded-Host', client.host);
  out.push('X-Forwarded-Prefix', route.prefix);
  return out;
}

/**
 * What a sandbox's page may not do on the API's (and the console's) origin: keep state there or
 * run as it. Its answers there get a Content-Security-Policy `sandbox` (the page runs in an opaque
 * origin of its own: no storage, cookies or service workers of the console's origin, no access to
 * its windows), and lose the headers that act on the origin.
 */
export const SHARED_ORIGIN_CSP = 'sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads';
const ORIGIN_HEADERS = new Set(['set-cookie', 'service-worker-allowed', 'clear-site-data']);

/** Whether a request came by its sandbox port's own origin (`<port>-<id>.<domain>`) rather than the API's. */
function ownOrigin(headers: IncomingHttpHeaders): boolean {
  return HOST_ROUTE_RE.test(headers.host ?? '');
}

/**
 * Response headers going back to the client: the sandbox's, minus hop-by-hop ones. On the API's
 * origin (`shared`: path-based and signed URLs) confined by SHARED_ORIGIN_CSP; on the sandbox's
 * own origin as they are, except that a cookie cannot name a wider domain than that host.
 */
function backwardHeaders(raw: string[], shared: boolean): string[] {
  const named = new Set<string>();
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].toLowerCase() === 'connection') for (const t of raw[i + 1].split(',')) named.add(t.trim().toLowerCase());
  }
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i].toLowerCase();
    if (HOP_BY_HOP.has(lower) || named.has(lower) || (shared && ORIGIN_HEADERS.has(lower))) continue;
    if (!shared && lower === 'set-cookie') out.push(raw[i], raw[i + 1].replace(/;\s*domain=[^;]*/gi, ''));
    else out.push(raw[i], raw[i + 1]);
  }
  if (shared) out.push('Content-Security-Policy', SHARED_ORIGIN_CSP);
  return out;
}

/** The client-facing error for a failed connection to the sandbox port. */
function upstreamError(err: NodeJS.ErrnoException, route: Route): CollimateError {
  const where = `port ${route.port} of sandbox ${route.sandboxId}`;
  switch (err.code) {
    case 'ECONNREFUSED':
      return new CollimateError('port_unreachable', `Nothing listens on ${where}: start a server there (listening on 0.0.0.0, not only 127.0.0.1) and retry.`);
    case 'ETIMEDOUT':
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return new CollimateError('port_unreachable', `${where[0].toUpperCase()}${where.slice(1)} did not answer within ${CONNECT_TIMEOUT_MS / 1000} s; is the sandbox's server stuck?`);
    default:
      return new CollimateError('port_unreachable', `The server on ${where} closed the connection without an answer (${err.code ?? 'connection error'}).`);
  }
}

function errorHead(err: CollimateError): { status: number; headers: Record<string, string>; body: string } {
  const headers: Record<string, string> = { 'content-type': 'application/json; charset=utf-8', [PROXY_ERROR_HEADER]: err.code, ...err.headers() };
  return { status: err.status, headers, body: JSON.stringify(err.toJSON(restNames)) };
}

function sendRawError(res: ServerResponse, err: CollimateError): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const h = errorHead(err);
  res.writeHead(h.status, { ...h.headers, 'content-length': String(Buffer.byteLength(h.body)) });
  res.end(h.body);
}

/** An HTTP error answer written straight onto a socket that has not become a tunnel. */
/** Answers an upgrade (or a request on its socket) with an error body, then closes the socket. */
export function socketError(socket: Duplex, err: CollimateError): void {
  const h = errorHead(err);
  const lines = Object.entries({ ...h.headers, 'content-length': String(Buffer.byteLength(h.body)), connection: 'close' }).map(([k, v]) => `${k}: ${v}`);
  socket.end(`HTTP/1.1 ${h.status} ${STATUS_TEXT[h.status] ?? 'Error'}\r\n${lines.join('\r\n')}\r\n\r\n${h.body}`);
}

const STATUS_TEXT: Record<number, string> = {
  400: 'Bad Request', 401: 'Unauthorized', 404: 'Not Found', 409: 'Conflict', 500: 'Internal Server Error', 502: 'Bad Gateway', 503: 'Service Unavailable',
};

function clientOf(req: IncomingMessage): { ip?: string; proto: string; host?: string } {
  return { ip: req.socket.remoteAddress, proto: (req.socket as { encrypted?: boolean }).encrypted ? 'https' : 'http', host: req.headers.host };
}

/** Streams one HTTP request to the sandbox and its answer back. */
function proxyHttp(req: IncomingMessage, res: ServerResponse, route: Route, log: FastifyBaseLogger, tunnel?: Duplex): void {
  const headers = forwardHeaders(req.rawHeaders, route, clientOf(req), false);
  const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined;
  if (req.headers['transfer-encoding'] !== undefined && req.headers['content-length'] === undefined) headers.push('Transfer-Encoding', 'chunked');
  const upstream = httpRequest({
    host: route.target.host,
    port: route.target.port,
    method: req.method,
    path: route.forwardPath,
    headers,
    setHost: false,
    // A pooled socket to a sandbox that went away fails the next request; connections are cheap here.
    // (Node takes createConnection only without an agent.)
    ...(tunnel ? { createConnection: () => tunnel as Socket } : { agent: false }),
  });
  let connected = false;
  const connectTimer = setTimeout(() => {
    if (!connected) upstream.destroy(Object.assign(new Error('connect timeout'), { code: 'ETIMEDOUT' }));
  }, CONNECT_TIMEOUT_MS);
  upstream.on('socket', (s: Socket) => {
    if (!s.connecting) connected = true;
    s.once('connect', () => {
      connected = true;
      clearTimeout(connectTimer);
    });
  });
  let answer: IncomingMessage | undefined;
  upstream.on('response', (ures) => {
    answer = ures;
    clearTimeout(connectTimer);
    res.writeHead(ures.statusCode ?? 502, ures.statusMessage, backwardHeaders(ures.rawHeaders, !ownOrigin(req.headers)));
    res.flushHeaders();
    ures.pipe(res);
    ures.on('error', () => res.destroy());
    ures.on('aborted', () => res.destroy());
  });
  upstream.on('error', (err: NodeJS.ErrnoException) => {
    clearTimeout(connectTimer);
    // The whole answer has arrived (and is being passed on): what the sandbox's server sends after it
    // is not the client's business. Busybox httpd sends a body after its answer to a HEAD, which
    // the parser takes for garbage; destroying `res` for that would reset the client's kept-alive
    // connection under its next request.
    if (res.writableEnded || answer?.complete) return;
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const e = upstreamError(err, route);
    log.info({ sandbox: route.sandboxId, port: route.port, err: err.code }, 'ports proxy: upstream failed');
    sendRawError(res, toClientError(e, log));
  });
  // The client went away (or the answer is complete): stop talking to the sandbox.
  res.on('close', () => {
    clearTimeout(connectTimer);
    if (!res.writableFinished) upstream.destroy();
  });
  if (hasBody) req.pipe(upstream);
  else upstream.end();
}

export function registerPortsProxy(app: FastifyInstance, opts: PortsProxyOptions): PortsProxy {
  const tunnels = new Set<Duplex>();

  // The routes, in a plugin of their own: its catch-all content-type parser leaves the body stream
  // unread (no buffering, no body limit), so the handler can pipe it to the sandbox.
  void app.register(async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', (_req, _payload, done) => done(null));
    const handler = async (req: import('fastify').FastifyRequest, reply: import('fastify').FastifyReply) => {
      reply.hijack();
      let route: Route;
      try {
        if (req.headers['service-worker'] === 'script' && !ownOrigin(req.headers)) {
          // A service worker on the API's origin would see every later request of the console.
          throw new CollimateError('origin_forbidden', "A sandbox's scripts cannot be service workers on the API's origin; serve the page from the sandbox's own origin (<port>-<sandbox id>.<domain>).");
        }
        if (await signedEntry(req.raw, reply.raw)) return;
        route = await resolveRoute(opts, req.raw.url ?? req.url, req.headers);
        if (toOwnOrigin(req.raw, reply.raw, route)) return;
        opts.tenants.quotas.holdStream(route.holder, reply.raw);
      } catch (err) {
        // Drain what the client sends so the connection stays usable for its next request.
        req.raw.resume();
        sendRawError(reply.raw, toClientError(err, req.log));
        return;
      }
      let tunnel: Duplex | undefined;
      try {
        tunnel = await tunnelOf(route);
      } catch (err) {
        req.raw.resume();
        sendRawError(reply.raw, toClientError(connectError(err, route), req.log));
        return;
      }
      proxyHttp(req.raw, reply.raw, route, req.log, tunnel);
    };
    for (const url of ['/v1/sandboxes/:id/ports/:port', '/v1/sandboxes/:id/ports/:port/*', '/v1/p/:token', '/v1/p/:token/*']) {
      scope.all(url, handler);
    }
  });

  /**
   * A browser opening a signed URL on the API's origin goes to the port's own origin instead,
   * through SIGNED_ENTRY: there the page keeps cookies and storage of its own and the console's are
   * out of reach. Other clients (no Sec-Fetch-Dest: document) are answered here, confined.
   */
  function toOwnOrigin(req: IncomingMessage, res: ServerResponse, route: Route): boolean {
    const p = proxyPathOf(req.url ?? '/');
    if (p?.kind !== 'signed' || req.method !== 'GET' || req.headers['sec-fetch-dest'] !== 'document' || req.headers['sec-fetch-mode'] !== 'navigate') return false;
    const origin = portOrigin(req, opts.sandboxDomain, route.sandboxId, route.port);
    if (!origin) return false;
    req.resume();
    res.writeHead(302, { location: `${origin}${SIGNED_ENTRY}?token=${p.token}&next=${encodeURIComponent(route.forwardPath)}`, 'cache-control': 'no-store', 'content-length': '0' });
    res.end();
    return true;
  }

  /** SIGNED_ENTRY on a port's own origin: checks the token is this port's, keeps it in PORT_COOKIE, sends the browser to `next`. */
  async function signedEntry(req: IncomingMessage, res: ServerResponse): Promise<boolean> {
    const own = HOST_ROUTE_RE.exec(req.headers.host ?? '');
    const p = proxyPathOf(req.url ?? '/');
    if (!own || p?.kind !== 'key') return false;
    const { forwardPath } = splitUrl(req.url ?? '/', 5);
    const at = new URL(forwardPath, 'http://x');
    if (at.pathname !== SIGNED_ENTRY) return false;
    const token = at.searchParams.get('token') ?? '';
    const granted = await signedFor(opts, token, decodeSafe(p.id), p.port);
    const next = at.searchParams.get('next') ?? '/';
    const secure = (req.socket as { encrypted?: boolean }).encrypted ? '; Secure' : '';
    const maxAge = Math.max(0, (granted.expiresAt ?? 0) - Math.floor(Date.now() / 1000));
    req.resume();
    res.writeHead(302, {
      location: next.startsWith('/') && !next.startsWith('//') ? next : '/',
      'set-cookie': `${PORT_COOKIE}=${token}; Path=/; HttpOnly; SameSite=Lax; Max-Age=${maxAge}${secure}`,
      'cache-control': 'no-store',
      'content-length': '0',
    });
    res.end();
    return true;
  }

  app.server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on('error', () => socket.destroy());
    req.url = hostRoutedUrl(req.headers.host, req.url ?? '/');
    if (opts.interceptUpgrade?.(req, socket, head, () => handleUpgrade(req, socket, head))) return;
    handleUpgrade(req, socket, head);
  });

  function handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    void upgrade(req, socket, head).catch((err) => socketError(socket, toClientError(err, app.log)));
  }

  async function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const websocket = /^websocket$/i.test(String(req.headers.upgrade ?? '').trim());
    if (websocket && opts.terminals && isTerminalPath(req.url ?? '')) {
      if (opts.draining()) socketError(socket, new CollimateError('shutting_down', 'The server is shutting down; retry shortly.', { retryAfterSecs: 5 }));
      else opts.terminals.handleUpgrade(req, socket, head, socketError);
      return;
    }
    if (!websocket || !proxyPathOf(req.url ?? '')) {
      // Node sends every request with an Upgrade header here once someone listens; those that are
      // not WebSocket upgrades of a proxy path are ordinary requests (e.g. curl's `Upgrade: h2c`).
      plainRequest(app, req, socket, head);
      return;
    }
    if (opts.draining()) {
      socketError(socket, new CollimateError('shutting_down', 'The server is shutting down; retry shortly.', { retryAfterSecs: 5 }));
      return;
    }
    const route = await resolveRoute(opts, req.url ?? '/', req.headers);
    opts.tenants.quotas.holdStream(route.holder, socket);
    let tunnel: Duplex | undefined;
    try {
      tunnel = await tunnelOf(route);
    } catch (err) {
      socketError(socket, toClientError(connectError(err, route), app.log));
      return;
    }
    const upstream = tunnel ?? connect({ host: route.target.host, port: route.target.port });
    const connectTimer = setTimeout(() => upstream.destroy(Object.assign(new Error('connect timeout'), { code: 'ETIMEDOUT' })), CONNECT_TIMEOUT_MS);
    const join = splice(socket, upstream, tunnels, (err) => {
      clearTimeout(connectTimer);
      socketError(socket, upstreamError(err, route));
    });
    const opened = () => {
      clearTimeout(connectTimer);
      const headers = forwardHeaders(req.rawHeaders, route, clientOf(req), true);
      let head0 = `${req.method} ${route.forwardPath} HTTP/1.1\r\n`;
      for (let i = 0; i < headers.length; i += 2) head0 += `${headers[i]}: ${headers[i + 1].replace(/[\r\n]/g, '')}\r\n`;
      join([head0 + '\r\n', head]);
    };
    if (tunnel) opened();
    else upstream.once('connect', opened);
  }

  return {
    closeTunnels() {
      for (const s of [...tunnels]) s.destroy();
      tunnels.clear();
    },
  };
}

/**
 * Hands a request that arrived on the `upgrade` event back to the ordinary request pipeline,
 * answering on its socket and closing it afterwards. Bodies are not readable there (the HTTP parser
 * has let go of the socket), so such a request with a body gets 400.
 */
function plainRequest(app: FastifyInstance, req: IncomingMessage, socket: Duplex, head: Buffer): void {
  const body = (req.headers['content-length'] !== undefined && req.headers['content-length'] !== '0') || req.headers['transfer-encoding'] !== undefined;
  if (body || head.length > 0) {
    socketError(socket, validation('Upgrade is only supported for WebSocket on the ports proxy paths; send this request without the Upgrade header.'));
    return;
  }
  const res = new ServerResponse(req);
  res.shouldKeepAlive = false;
  res.assignSocket(socket as Socket);
  res.on('finish', () => {
    res.detachSocket(socket as Socket);
    socket.end();
  });
  req.push(null);
  app.server.emit('request', req, res);
}

/**
 * Joins a client's socket and an upstream connection both ways. Until the returned function is
 * called with what goes upstream first (the request head, the bytes the client sent after it), an
 * upstream error goes to `failed`; from then on the socket is in `tunnels` (the server ends them at
 * shutdown) and either end closing or failing ends both.
 */
export function splice(socket: Duplex, upstream: Duplex, tunnels: Set<Duplex>, failed: (err: NodeJS.ErrnoException) => void): (first: Array<string | Buffer>) => void {
  let open = false;
  upstream.on('error', (err: NodeJS.ErrnoException) => {
    if (!open) failed(err);
    else socket.destroy();
  });
  const end = () => {
    tunnels.delete(socket);
    upstream.destroy();
    socket.destroy();
  };
  upstream.on('close', () => open && end());
  socket.on('close', end);
  return (first) => {
    open = true;
    tunnels.add(socket);
    for (const chunk of first) if (chunk.length) upstream.write(chunk);
    upstream.pipe(socket);
    socket.pipe(upstream);
  };
}
