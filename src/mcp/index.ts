/**
 * The MCP endpoint: `/mcp` on the REST server, Streamable HTTP through the official SDK
 * (McpServer + StreamableHTTPServerTransport), in stateless mode — every POST carries its own
 * Bearer key and gets a fresh server and transport bound to that key's tenant and tier, so there is
 * no session table to keep, lose on restart or pin to one replica; the state an agent cares about
 * lives in the sandboxes, addressed by id. GET (a standalone server→client stream) and DELETE
 * (ending a session) have nothing to do without sessions and answer 405.
 *
 * Authentication and every tenant rule are the tenant service's (src/service/tenantService.ts), the
 * same one REST calls, so both doors draw on one concurrency cap and answer with the same codes.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { IncomingHttpHeaders } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { CollimateError } from '../errors.js';
import type { TenantService } from '../service/tenantService.js';
import type { Scope } from '../service/types.js';
import { toClientError } from '../wire/errors.js';
import { parseJsonBody } from '../wire/jsonBody.js';
import { keyFirst } from '../wire/keyFirst.js';
import { allowedOriginsFromEnv, originAllowed } from './origin.js';
import { mcpNames, registerTools } from './tools.js';

export const MCP_PATH = '/mcp';

export interface RegisterMcpOptions {
  tenants: TenantService;
  /** The key check on request headers: the caller's scope, or a thrown `unauthorized` CollimateError. */
  authenticate: (headers: IncomingHttpHeaders) => Promise<Scope>;
  /** Browser origins allowed besides loopback ones (default: $COLLIMATE_MCP_ALLOWED_ORIGINS). */
  allowedOrigins?: string[];
}

const INSTRUCTIONS =
  'Collimate runs code in isolated Linux microVM sandboxes. Typical flow: list_images → create_sandbox ' +
  '(template "base") → exec (repeat; files and processes persist) → fork_sandbox to branch a prepared ' +
  'state into several live copies → delete_sandbox every sandbox you created. For data work, create ' +
  'from template "python" and use run_code: a stateful IPython kernel whose plots come back as images. Errors start with a ' +
  'stable code such as invalid_state or concurrency_limit, followed by how to fix it.';

function sendError(reply: FastifyReply, err: CollimateError, headers: Record<string, string> = {}): void {
  for (const [k, v] of Object.entries(headers)) reply.header(k, v);
  reply.headers(err.headers());
  reply.code(err.status).type('application/json; charset=utf-8').send(err.toJSON(mcpNames));
}

function jsonRpcError(reply: FastifyReply, status: number, code: number, message: string, headers: Record<string, string> = {}): void {
  for (const [k, v] of Object.entries(headers)) reply.header(k, v);
  reply.code(status).type('application/json; charset=utf-8').send({ jsonrpc: '2.0', error: { code, message }, id: null });
}

export function registerMcp(app: FastifyInstance, opts: RegisterMcpOptions): void {
  const allowed = (opts.allowedOrigins ?? allowedOriginsFromEnv()).map((o) => o.replace(/\/+$/, '').toLowerCase());
  const version = '0.1.0';

  /**
   * Origin first (a foreign page learns nothing, not even whether its key was valid), then the key;
   * both before the body is read (wire/keyFirst.ts).
   */
  const gate = keyFirst(
    async (req: FastifyRequest): Promise<Scope> => {
      const origin = req.headers.origin;
      if (!originAllowed(origin, allowed)) {
        throw new CollimateError('origin_forbidden', `Origin ${String(origin).slice(0, 200)} is not allowed to use ${MCP_PATH}. Allowed: no Origin, loopback origins, and COLLIMATE_MCP_ALLOWED_ORIGINS.`);
      }
      return opts.authenticate(req.headers);
    },
    (req: FastifyRequest, reply: FastifyReply, err) => {
      const e = toClientError(err, req.log, req.id);
      sendError(reply, e, e.code === 'unauthorized' ? { 'www-authenticate': 'Bearer realm="collimate"' } : {});
    },
  );

  app.route({
    method: 'POST',
    url: MCP_PATH,
    onRequest: gate.onRequest,
    handler: async (req, reply) => {
      const scope = gate.scopeOf(req);
      let body: unknown;
      try {
        body = parseJsonBody(req.body);
        if (body === undefined) throw new Error('empty');
      } catch {
        jsonRpcError(reply, 400, -32700, 'Parse error: the body must be a JSON-RPC message (application/json).');
        return reply;
      }
      const server = new McpServer({ name: 'collimate', version }, { instructions: INSTRUCTIONS });
      // Absolute URLs (expose_port) are built on the address the agent reached us at.
      const baseUrl = `${req.protocol}://${req.headers.host ?? req.hostname}`;
      registerTools(server, { tenants: opts.tenants, scope, baseUrl, log: req.log });
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
      reply.hijack();
      reply.raw.on('close', () => {
        void transport.close().catch(() => {});
        void server.close().catch(() => {});
      });
      try {
        await server.connect(transport);
        await transport.handleRequest(req.raw, reply.raw, body);
      } catch (err) {
        req.log.error({ err }, 'mcp request failed');
        if (!reply.raw.headersSent) {
          reply.raw.writeHead(500, { 'content-type': 'application/json; charset=utf-8' });
          reply.raw.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32603, message: 'Internal error' }, id: null }));
        }
      }
      return reply;
    },
  });

  for (const method of ['GET', 'DELETE'] as const) {
    app.route({
      method,
      url: MCP_PATH,
      onRequest: gate.onRequest,
      handler: async (_req, reply) => {
        jsonRpcError(reply, 405, -32000, `Method not allowed: ${MCP_PATH} is stateless; send JSON-RPC messages with POST.`, { allow: 'POST' });
        return reply;
      },
    });
  }
}
