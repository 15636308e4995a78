/**
 * The server's log: Fastify's own logger (pino), one JSON object per line. What it adds:
 *
 * - a request id on every line a request logs (`reqId`): the client's `X-Request-Id` when it sends
 *   a plausible one (a proxy in front keeps its id), a fresh one otherwise; the response carries it
 *   back in `X-Request-Id`, and an internal error's message names it;
 * - `sandbox_id` on every line of a request to /v1/sandboxes/{id}/…, `tenant` once the key is known;
 * - one line per request when its response ends (`request`: method, url, status, ms), with signed
 *   port-URL tokens cut out of the URL (they are credentials);
 * - one line per lifecycle transition the engine persists (`sandbox transition`), one with the
 *   timings of each create, fork, suspend and resume (`lifecycle phases`), one per reaped session.
 * Internal causes are logged where the error is rendered (wire/errors.ts toClientError), with the
 * request's bindings: the client gets only the message.
 */
import { randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import pino from 'pino';
import type { FastifyBaseLogger, FastifyInstance, FastifyReply, FastifyRequest, FastifyServerOptions } from 'fastify';
import type { HostReadings, ReapedEvent, SandboxTransition } from '../sandboxes/types.js';
import type { PhaseReport } from '../sandboxes/phases.js';

/** Ids a client (or a proxy in front) may choose for its request: short, no spaces or quotes. */
const CLIENT_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

export const REQUEST_ID_HEADER = 'x-request-id';

export function requestIdOf(req: IncomingMessage): string {
  const sent = req.headers[REQUEST_ID_HEADER];
  // Random rather than Fastify's counter: ids stay unique across restarts in one log.
  return typeof sent === 'string' && CLIENT_REQUEST_ID.test(sent) ? sent : `req-${randomBytes(8).toString('hex')}`;
}

/**
 * A URL as logged: credentials are cut out — the token of a signed port URL (/v1/p/{token}/…), and
 * query values that carry one (a signed URL's token on a port's own origin, E2B's file signatures).
 */
export function loggedUrl(url: string): string {
  return url.replace(/^\/v1\/p\/[^/?]+/, '/v1/p/<token>').replace(/([?&](?:token|signature|access_token)=)[^&#]*/gi, '$1<redacted>');
}

/**
 * Logger options for `collimate serve`: JSON lines, level names, ISO timestamps, on stdout unless
 * `stream` is given.
 *
 * Stdout is written synchronously: each line is out when the log call returns. Pino's default
 * destination writes asynchronously and, at process.exit, writes what is still buffered while an
 * earlier write may still be pending in the thread pool, so the last lines of a stopping server
 * (`stopping`, `stopped`) came out in the wrong order, or not at all, on a busy machine.
 */
export function serverLoggerOptions(level: string, stream?: { write(line: string): void }): NonNullable<FastifyServerOptions['logger']> {
  return {
    level,
    timestamp: () => `,"time":"${new Date().toISOString()}"`,
    formatters: { level: (label: string) => ({ level: label }) },
    stream: stream ?? pino.destination({ dest: 1, sync: true }),
  };
}

/** Routes whose `:id` is a sandbox id (the images' and templates' `:id` are not). */
const SANDBOX_ROUTE = /^\/v1\/sandboxes\/:id(?:\/|$)/;

/** Quiet paths: pollers hit them every few seconds; their lines are at debug. */
const POLLED = new Set(['/healthz', '/metrics']);

/** Binds `fields` to every line this request logs from now on (handlers, errors, the request line). */
export function bindToRequest(req: FastifyRequest, reply: FastifyReply, fields: Record<string, string>): void {
  req.log = req.log.child(fields);
  reply.log = req.log;
}

/** The request hooks: response header, sandbox id binding, the line per request. */
export function registerRequestLogging(app: FastifyInstance): void {
  app.addHook('onRequest', async (req, reply) => {
    reply.header(REQUEST_ID_HEADER, req.id);
    const route = req.routeOptions.url;
    const id = (req.params as Record<string, string> | undefined)?.id;
    if (route && id && SANDBOX_ROUTE.test(route)) bindToRequest(req, reply, { sandbox_id: id.slice(0, 100) });
    const started = process.hrtime.bigint();
    let finished = false;
    // On the raw response, so that hijacked replies (the ports proxy, SSE) are logged too.
    reply.raw.once('finish', () => (finished = true));
    reply.raw.once('close', () => {
      const path = req.url.split('?', 1)[0];
      const line = {
        method: req.method,
        url: loggedUrl(req.url).slice(0, 500),
        status: reply.raw.statusCode,
        ms: Math.round(Number(process.hrtime.bigint() - started) / 1e4) / 100,
        // The connection closed before the whole response was sent.
        ...(finished ? {} : { aborted: true }),
      };
      if (POLLED.has(path)) reply.log.debug(line, 'request');
      else reply.log.info(line, 'request');
    });
  });
}

/**
 * Logs the engine's lifecycle events (emitted once a transition is persisted). Returns the
 * unsubscribe. An engine without events (a fake) logs nothing.
 */
export function logLifecycle(e: Pick<HostReadings, 'on' | 'off'>, log: FastifyBaseLogger): () => void {
  const off = e.off?.bind(e);
  if (!e.on || !off) return () => {};
  const onTransition = (t: SandboxTransition) =>
    (t.op === 'lost' ? log.warn.bind(log) : log.info.bind(log))(
      {
        event: 'transition', sandbox_id: t.id, tenant: t.tenant, op: t.op, state: t.state,
        ...(t.snapshotBytes !== undefined ? { snapshot_bytes: t.snapshotBytes } : {}), ...(t.reason ? { reason: t.reason } : {}),
      },
      'sandbox transition',
    );
  const tenths = (m: Record<string, number> | undefined) => Object.fromEntries(Object.entries(m ?? {}).map(([k, v]) => [k, Math.round(v * 10) / 10]));
  const onPhases = (r: PhaseReport) =>
    log.info(
      { event: 'phases', sandbox_id: r.id, op: r.op, total_ms: Math.round(r.totalMs * 10) / 10, phases_ms: tenths(r.phases), cpu_ms: tenths(r.cpuMs) },
      'lifecycle phases',
    );
  const onReaped = (r: ReapedEvent) =>
    log.info({ event: 'reaped', sandbox_id: r.id, action: r.action }, 'session limit reached');
  e.on('transition', onTransition);
  e.on('phases', onPhases);
  e.on('reaped', onReaped);
  return () => {
    off('transition', onTransition);
    off('phases', onPhases);
    off('reaped', onReaped);
  };
}
