/**
 * Renders the OpenAPI 3.1 document from the route table and the zod schemas (one schema set).
 * Pure and deterministic: the committed docs/openapi.json must equal buildOpenApi() byte for byte
 * (test/unit/api/openapi.test.ts); regenerate with `npm run openapi`.
 */
import { z } from 'zod';
import { ERROR_CODES, type ErrorCode } from '../errors.js';
import { PROXY_METHODS, ROUTES, type RouteSpec } from './routes.js';
import { apiRegistry, ErrorBody } from '../wire/schemas.js';
import { TIERS } from '../service/tiers.js';

type Json = Record<string, any>;

/** The project's licence as package.json states it (no licence has been granted yet: UNLICENSED). */
export const LICENSE = { name: 'UNLICENSED' };

const REF = (id: string) => `#/components/schemas/${id}`;

/** Codes any endpoint can return, by whether it is authenticated. */
const GENERIC_AUTH: ErrorCode[] = ['validation_error', 'invalid_json', 'unsupported_media_type', 'payload_too_large', 'unauthorized', 'shutting_down'];
// Every route's query is strict (an unknown parameter is 400), public ones included.
const GENERIC_PUBLIC: ErrorCode[] = ['validation_error', 'shutting_down'];
/** The ports proxy reads no body itself: only its own checks (a bad port number is validation_error). */
const GENERIC_PROXY: ErrorCode[] = ['validation_error', 'shutting_down'];

function schemaOf(schema: z.ZodType): Json {
  const id = apiRegistry.get(schema)?.id;
  if (id) return { $ref: REF(id) };
  const js = z.toJSONSchema(schema, { metadata: apiRegistry, io: 'input', uri: REF } as any) as Json;
  delete js.$schema;
  return js;
}

function components(): Json {
  const { schemas } = z.toJSONSchema(apiRegistry, { uri: REF, metadata: apiRegistry } as any) as { schemas: Record<string, Json> };
  const out: Json = {};
  for (const id of Object.keys(schemas).sort()) {
    const s = { ...schemas[id] };
    delete s.$schema;
    delete s.$id;
    out[id] = s;
  }
  return out;
}

export function openApiPath(path: string): string {
  return path.replace(/:([A-Za-z_]+)/g, '{$1}').replace(/\/\*$/, '/{path}');
}

const PARAM_DESCRIPTIONS: Record<string, string> = {
  sandbox: 'Sandbox id (^sbx_[0-9a-f]{12}$; anything else is 404).',
  snapshot: 'Snapshot id (^snap_[0-9a-f]{16}$; anything else is 404).',
  template: 'Template id.',
  image: 'Image id: sha256:<64 hex> (the manifest digest).',
  environment: 'Environment name.',
  port: 'A TCP port inside the sandbox, 1..65535 (anything else is 400).',
  token: 'The signed token of a port URL (from POST /v1/sandboxes/{id}/port-urls).',
  pid: 'A background process: its guest pid (from POST /v1/sandboxes/{id}/processes).',
  key: 'An API key id (key_…, from GET /v1/keys).',
  context: 'A code context id, a UUID (from GET /v1/sandboxes/{id}/code/contexts; anything else is 404 context_not_found).',
  path: 'The rest of the path, forwarded as sent (may be empty and may contain slashes); the query string follows it.',
};

const PARAM_SCHEMAS: Record<string, Json> = {
  sandbox: { type: 'string', pattern: '^sbx_[0-9a-f]{12}$' },
  snapshot: { type: 'string', pattern: '^snap_[0-9a-f]{16}$' },
  port: { type: 'integer', minimum: 1, maximum: 65535 },
  pid: { type: 'integer', minimum: 1 },
  context: { type: 'string', format: 'uuid' },
};

function parameters(route: RouteSpec): Json[] {
  const out: Json[] = [];
  for (const [name, kind] of Object.entries(route.params ?? {})) {
    out.push({ name, in: 'path', required: true, description: PARAM_DESCRIPTIONS[kind], schema: PARAM_SCHEMAS[kind] ?? { type: 'string' } });
  }
  if (route.query) {
    for (const [name, field] of Object.entries(route.query.shape as Record<string, z.ZodType>)) {
      const required = !field.safeParse(undefined).success;
      const inner = (field as any).unwrap && !required ? (field as any).unwrap() : field;
      const schema = schemaOf(inner);
      const description = schema.description;
      delete schema.description;
      const p: Json = { name, in: 'query', required, schema };
      if (description) p.description = description;
      if (schema.anyOf) { p.style = 'form'; p.explode = true; }
      out.push(p);
    }
  }
  if (route.idempotent) {
    out.push({
      name: 'Idempotency-Key',
      in: 'header',
      required: false,
      description:
        'Up to 255 printable characters, unique per operation (a UUID is ideal). A retry with the same key and the ' +
        'same body returns the original status and body (kept 24 h, across restarts); the same key with a different ' +
        'body is 422 idempotency_key_reused; a retry while the original is still in flight waits for it. Only ' +
        'successful responses are stored, so a failed request can be retried with the same key.',
      schema: { type: 'string', minLength: 1, maxLength: 255 },
    });
  }
  return out;
}

function errorResponses(route: RouteSpec): Json {
  const generic = route.method === 'ANY' ? (route.auth ? [...GENERIC_PROXY, 'unauthorized' as const] : GENERIC_PROXY) : route.auth ? GENERIC_AUTH : GENERIC_PUBLIC;
  const codes = new Set<ErrorCode>([...generic, ...route.errors]);
  if (route.params?.id === 'sandbox') codes.add('sandbox_not_found');
  if (route.params?.snapshot === 'snapshot') codes.add('snapshot_not_found');
  if (route.bodyKind === undefined) { codes.delete('invalid_json'); codes.delete('unsupported_media_type'); codes.delete('payload_too_large'); }
  if (route.bodyKind === 'raw' || route.bodyKind === 'stream') { codes.delete('invalid_json'); codes.delete('unsupported_media_type'); }
  // A streamed body has no framework limit; a route whose handler enforces one lists payload_too_large itself.
  if (route.bodyKind === 'stream' && !route.errors.includes('payload_too_large')) codes.delete('payload_too_large');
  const byStatus = new Map<number, ErrorCode[]>();
  for (const c of codes) {
    const s = ERROR_CODES[c];
    if (route.responses[s]) continue;
    byStatus.set(s, [...(byStatus.get(s) ?? []), c]);
  }
  const out: Json = {};
  for (const s of [...byStatus.keys()].sort((a, b) => a - b)) {
    const list = byStatus.get(s)!.sort();
    const r: Json = {
      description: `Error: ${list.join(', ')}.`,
      content: { 'application/json': { schema: { $ref: REF(apiRegistry.get(ErrorBody)!.id!) } } },
    };
    if (s === 429 || s === 503) {
      r.headers = { 'Retry-After': { description: 'Seconds to wait before retrying.', schema: { type: 'integer' } } };
    }
    out[String(s)] = r;
  }
  return out;
}

function operation(route: RouteSpec, method: string = route.method): Json {
  const op: Json = {
    operationId: route.method === 'ANY' ? route.operationId + method[0] + method.slice(1).toLowerCase() : route.operationId,
    summary: route.summary,
    tags: [route.tag],
  };
  if (route.description) op.description = route.description;
  const params = parameters(route);
  if (params.length) op.parameters = params;
  if (route.bodyKind === 'json' && route.body) {
    op.requestBody = { required: !route.bodyOptional, content: { 'application/json': { schema: schemaOf(route.body) } } };
  } else if (route.bodyKind === 'raw') {
    op.requestBody = { required: true, content: { '*/*': { schema: { type: 'string', format: 'binary' } } } };
  } else if (route.bodyKind === 'stream') {
    op.requestBody = { required: false, description: 'Any bytes, streamed on as they arrive (chunked transfer encoding works).', content: { '*/*': { schema: { type: 'string', format: 'binary' } } } };
  } else if (route.method === 'ANY' && !['GET', 'HEAD', 'OPTIONS'].includes(method)) {
    op.requestBody = { required: false, description: 'Streamed to the sandbox as is.', content: { '*/*': { schema: { type: 'string', format: 'binary' } } } };
  }
  const responses: Json = {};
  for (const [status, spec] of Object.entries(route.responses)) {
    const r: Json = { description: spec.description };
    if (spec.schema) {
      r.content = { 'application/json': { schema: schemaOf(spec.schema) } };
      if (route.sse && status === '200') {
        // The body is a stream of events; the schema is that of each event's `data` (JSON).
        r.content['text/event-stream'] = {
          schema: {
            description: 'SSE: events stdout, stderr (ExecChunkEvent), then result (ExecResult) or error (Error); this is the JSON of each event\'s data.',
            oneOf: ['ExecChunkEvent', 'ExecResult', 'Error'].map((id) => ({ $ref: REF(id) })),
          },
        };
      }
    } else if (spec.contentType && spec.events) {
      const events = spec.events.map((e) => schemaOf(e));
      r.content = { [spec.contentType]: { schema: { description: 'SSE: the JSON of each event\'s data.', ...(events.length === 1 ? { allOf: events } : { oneOf: events }) } } };
    } else if (spec.contentType) {
      const binary = spec.contentType.startsWith('application/octet') || spec.contentType === '*/*';
      r.content = { [spec.contentType]: { schema: { type: 'string', ...(binary ? { format: 'binary' } : {}) } } };
    }
    responses[status] = r;
  }
  Object.assign(responses, errorResponses(route));
  op.responses = responses;
  op.security = route.auth ? [{ bearer: [] }] : [];
  return op;
}

export function buildOpenApi(): Json {
  const paths: Json = {};
  for (const route of ROUTES) {
    const p = openApiPath(route.path);
    paths[p] ??= {};
    for (const method of route.method === 'ANY' ? PROXY_METHODS : [route.method]) paths[p][method.toLowerCase()] = operation(route, method);
  }
  const tiers = Object.values(TIERS)
    .map((t) => `${t.name}: ${t.maxRunning === null ? 'no concurrency cap' : `${t.maxRunning} running sandboxes`}, ${t.ownImages ? 'own images' : 'catalog only'}, sessions up to ${t.maxSessionSecs} s`)
    .join('; ');
  return {
    openapi: '3.1.0',
    info: {
      title: 'Collimate API',
      version: '1.0.0',
      license: LICENSE,
      description:
        'Self-hosted sandbox cloud: microVM sandboxes forked copy-on-write from warm templates, live fork, suspend/resume. ' +
        'Every error is `{"error": {"code", "message"}}` with a stable code. Tiers — ' + tiers + '.',
    },
    servers: [{ url: 'http://127.0.0.1:7070' }],
    tags: [
      { name: 'sandboxes', description: 'Create, exec, fork, suspend, resume, delete.' },
      { name: 'ports', description: 'Servers inside a sandbox: the ports proxy (HTTP and WebSocket, with your key) and signed URLs that need none.' },
      { name: 'templates', description: 'Catalog images and your environments (/v1/templates is the alias for both).' },
      { name: 'images', description: 'Catalog images, and your own OCI images (Pro): OCI layout, docker save / OCI archive, or a registry.' },
      { name: 'environments', description: 'Your named configurations of an image: ready command and probe, secrets, VM size. A ready environment is a template.' },
      { name: 'usage', description: 'Metering.' },
      { name: 'account', description: "The tenant's own API keys and its tier's limits." },
      { name: 'operations', description: 'Health, metrics, this document.' },
    ],
    paths,
    components: {
      schemas: components(),
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'An API key: `collimate keys create --tenant T --tier demo`.' } },
    },
  };
}

/** The committed form: two-space JSON with a trailing newline. */
export function renderOpenApi(): string {
  return JSON.stringify(buildOpenApi(), null, 2) + '\n';
}
