/**
 * The route binder: one generic wrapper per route of the table (routes.ts) that authenticates,
 * validates path, query and body against the route's schemas, hands an Idempotency-Key to the
 * tenant service, calls the route's handler and renders what it returns. Handlers get their inputs
 * typed from the same schemas (z.infer), so a handler is parse → one service call → render.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from 'fastify';
import type { z } from 'zod';
import { CollimateError, sandboxNotFound, snapshotNotFound } from '../errors.js';
import type { TenantService } from '../service/tenantService.js';
import type { Scope } from '../service/types.js';
import { fingerprint } from '../service/idempotency.js';
import { parseWith, toClientError } from '../wire/errors.js';
import { parseJsonBody } from '../wire/jsonBody.js';
import { keyFirst, type KeyFirst } from '../wire/keyFirst.js';
import * as S from '../wire/schemas.js';
import { bindToRequest } from './logging.js';
import { discardRest } from '../wire/streamedBody.js';
import { bearerKey } from '../service/keys.js';
import { contextNotFound } from '../service/code.js';
import { ROUTES, restNames, type RouteSpec, type BodyOf, type BoundOperationId, type ParamsOf, type QueryOf, type RouteOf } from './routes.js';

export interface Ctx<K extends BoundOperationId> {
  /** The caller's scope (routes without auth have none). */
  scope: RouteOf<K> extends { auth: true } ? Scope : undefined;
  params: ParamsOf<RouteOf<K>>;
  query: QueryOf<RouteOf<K>>;
  body: BodyOf<RouteOf<K>>;
  req: FastifyRequest;
  reply: FastifyReply;
}

/** A handler returns the response, or null when it has written the response itself (SSE, raw bytes). */
export type Result = { status: number; body?: unknown; headers?: Record<string, string> } | null;
export type Handler<K extends BoundOperationId> = (ctx: Ctx<K>) => Promise<Result> | Result;
export type Handlers = { [K in BoundOperationId]: Handler<K> };

export interface BindOptions {
  tenants: TenantService;
  maxJsonBytes: number;
  maxFileBytes: number;
}


export function sendError(reply: FastifyReply, err: CollimateError): void {
  if (reply.sent || reply.raw.headersSent) return;
  reply.headers(err.headers());
  reply.code(err.status).type('application/json; charset=utf-8').send(err.toJSON(restNames));
}

type RestKeys = KeyFirst<Scope, FastifyRequest, FastifyReply>;

export function bindRoutes(app: FastifyInstance, handlers: Handlers, opts: BindOptions): void {
  // One key check for every authenticated route, before its body is read (wire/keyFirst.ts).
  const keys: RestKeys = keyFirst(
    (req: FastifyRequest) => opts.tenants.accounts.authenticate(bearerKey(req.headers.authorization)),
    (req: FastifyRequest, reply: FastifyReply, err) => sendError(reply, toClientError(err, req.log, req.id)),
  );
  const streamed: RouteSpec[] = [];
  for (const route of ROUTES) {
    if (route.method === 'ANY') continue; // the ports proxy binds its own (portsProxy.ts)
    if (route.bodyKind === 'stream') streamed.push(route);
    else bindRoute(app, route, handlers, opts, keys);
  }
  // In a plugin of their own: its catch-all content-type parser leaves the body unread (no
  // buffering, no body limit), so the handler can stream it on as it arrives.
  void app.register(async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', (_req, _payload, done) => done(null));
    for (const route of streamed) bindRoute(scope, route, handlers, opts, keys);
  });
}

function bindRoute(app: FastifyInstance, route: RouteSpec, handlers: Handlers, opts: BindOptions, keys: RestKeys): void {
  const { tenants } = opts;
  {
    const handler = handlers[route.operationId as BoundOperationId] as Handler<BoundOperationId>;
    if (!handler) throw new Error(`no handler for ${route.operationId}`);
    const spec = route;
    const options: RouteOptions = {
      method: route.method,
      url: spec.path,
      bodyLimit: spec.bodyKind === 'raw' ? opts.maxFileBytes : opts.maxJsonBytes,
      ...(spec.auth ? { onRequest: keys.onRequest } : {}),
      handler: async (req, reply) => {
        try {
          const scope = spec.auth ? keys.scopeOf(req) : undefined;
          if (scope) bindToRequest(req, reply, { tenant: scope.tenant });
          const params = (req.params ?? {}) as Record<string, string>;
          for (const [name, kind] of Object.entries(spec.params ?? {})) {
            if (kind === 'sandbox' && !S.SANDBOX_ID_RE.test(params[name])) throw sandboxNotFound(params[name].slice(0, 100));
            if (kind === 'snapshot' && !S.SNAPSHOT_ID_RE.test(params[name])) throw snapshotNotFound(params[name].slice(0, 100));
            if (kind === 'context' && !S.CODE_CONTEXT_RE.test(params[name])) throw contextNotFound(params.id, params[name]);
            if (kind === 'pid' && !/^[1-9][0-9]{0,9}$/.test(params[name])) {
              throw new CollimateError('process_not_found', `No background process ${JSON.stringify(params[name].slice(0, 100))}: a process is named by its pid, a positive integer.`);
            }
          }
          const query = parseWith(spec.query ?? S.EmptyQuery, req.query ?? {}, 'query');
          let body: unknown;
          if (spec.bodyKind === 'json') {
            const decoded = parseJsonBody(req.body, { contentType: req.headers['content-type'] });
            body = parseWith(spec.body!, decoded === undefined && spec.bodyOptional ? {} : decoded, 'body');
          } else if (spec.bodyKind === 'raw') {
            body = req.body;
          } else if (spec.bodyKind === 'stream') {
            body = req.raw;
          }
          const ctx = { scope, params, query, body, req, reply } as Ctx<BoundOperationId>;
          const idemKey = req.headers['idempotency-key'];
          let result: Result;
          if (spec.idempotent && idemKey !== undefined) {
            const key = Array.isArray(idemKey) ? idemKey[0] : idemKey;
            const fp = fingerprint(spec.method, req.url.split('?')[0], body);
            const r = await tenants.sandboxes.idempotent(scope!, key, fp, async () => {
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
          // A streamed body not read to its end is read and discarded first (within a bound), so a
          // client still sending reads this answer instead of a reset connection.
          if (spec.bodyKind === 'stream' && !(await discardRest(req.raw))) reply.header('connection', 'close');
          sendError(reply, toClientError(err, req.log, req.id));
          return reply;
        }
      },
    };
    app.route(options);
  }
}
