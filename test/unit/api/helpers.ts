/**
 * Test fixture for the API: a server on the fake service, keys per tenant, and a request helper that
 * validates every response against the route table's response schemas (the OpenAPI contract).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { LightMyRequestResponse } from 'fastify';
import { ERROR_CODES } from '../../../src/errors.js';
import '../../../src/service/migrations.js';
import { routeById } from '../../../src/api/routes.js';
import { ErrorBody } from '../../../src/wire/schemas.js';
import type { ApiServer, BuildServerOptions } from '../../../src/api/server.js';
import type { TenantServiceOptions } from '../../../src/service/tenantService.js';
import { startServer } from '../../../src/server/assemble.js';
import { openDb, type Db } from '../../../src/store/db.js';
import type { TierName } from '../../../src/service/tiers.js';
import { FakeSandboxService, type FakeOptions } from '../../support/fakeSandboxService.js';

export interface Fixture {
  api: ApiServer;
  svc: FakeSandboxService;
  db: Db;
  dbPath: string;
  key(tenant: string, tier?: TierName): string;
  req(op: string, opts: ReqOpts): Promise<LightMyRequestResponse & { json(): any }>;
  close(): Promise<void>;
}

export interface ReqOpts {
  method?: string;
  url: string;
  key?: string;
  body?: unknown;
  rawBody?: string | Buffer;
  headers?: Record<string, string>;
  /** A service failure is expected (5xx allowed, still with the error shape). */
  allow5xx?: boolean;
}

/** Server options, and the tenant service's that tests set (images, clock, signing key, reconcile period). */
export type ServerOptions = Partial<Omit<BuildServerOptions, 'tenants'>> & Partial<Pick<TenantServiceOptions, 'images' | 'now' | 'portUrlKeyPath' | 'reconcileIntervalMs' | 'quotas'>>;

/** A tenant service and an API server over `engine` (the fake), assembled as `collimate serve` does (not listening). */
export async function serverOn(engine: TenantServiceOptions['engine'], db: Db, opts: ServerOptions = {}): Promise<ApiServer> {
  const { images, now, portUrlKeyPath, reconcileIntervalMs, quotas, ...server } = opts;
  const s = await startServer({ engine, db, images, listen: false, service: { now, portUrlKeyPath, reconcileIntervalMs: reconcileIntervalMs ?? 0, quotas }, server: { now, ...server } });
  return s.api;
}

export async function fixture(opts: { fake?: FakeOptions; server?: ServerOptions; dbPath?: string } = {}): Promise<Fixture> {
  const dir = opts.dbPath ? null : mkdtempSync(join(tmpdir(), 'collimate-api-'));
  const dbPath = opts.dbPath ?? join(dir!, 'collimate.db');
  const db = openDb(dbPath);
  const svc = new FakeSandboxService(opts.fake);
  const api = await serverOn(svc, db, opts.server);
  const keys = new Map<string, string>();
  return {
    api,
    svc,
    db,
    dbPath,
    key(tenant, tier = 'demo') {
      const k = `${tenant}/${tier}`;
      if (!keys.has(k)) keys.set(k, api.keys.create({ tenant, tier }).key);
      return keys.get(k)!;
    },
    async req(op, r) {
      const spec = routeById(op);
      const headers: Record<string, string> = { ...(r.headers ?? {}) };
      if (r.key) headers.authorization = `Bearer ${r.key}`;
      let payload: string | Buffer | undefined = r.rawBody;
      if (r.body !== undefined) {
        payload = JSON.stringify(r.body);
        headers['content-type'] ??= 'application/json';
      }
      const res = await api.app.inject({ method: (r.method ?? spec.method) as any, url: r.url, headers, payload });
      checkResponse(op, res, r.allow5xx);
      return res as any;
    },
    async close() {
      await api.shutdown(100);
      api.tenants.close();
      db.close();
      if (dir) rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Asserts the response matches its documented schema: success bodies by route, errors by Error. */
export function checkResponse(op: string | null, res: LightMyRequestResponse, allow5xx = false): void {
  assert.ok(allow5xx || res.statusCode < 500 || res.statusCode === 503, `unexpected ${res.statusCode}: ${res.body}`);
  const spec = op ? routeById(op) : null;
  const documented = spec?.responses[res.statusCode];
  if (documented) {
    if (documented.schema && !String(res.headers['content-type']).startsWith('text/event-stream')) {
      const r = documented.schema.safeParse(res.json());
      assert.ok(r.success, `${op} ${res.statusCode} body does not match its schema: ${r.success ? '' : r.error.message}\n${res.body}`);
    }
    return;
  }
  if (res.statusCode >= 400) assertErrorBody(res);
}

export function assertErrorBody(res: LightMyRequestResponse, code?: string): void {
  assert.match(String(res.headers['content-type']), /^application\/json/, `error without JSON content type: ${res.statusCode} ${res.body}`);
  const body = res.json();
  const r = ErrorBody.safeParse(body);
  assert.ok(r.success, `error body shape: ${res.body}`);
  const c = body.error.code as keyof typeof ERROR_CODES;
  assert.ok(c in ERROR_CODES, `unknown error code ${c}`);
  assert.equal(ERROR_CODES[c], res.statusCode, `code ${c} sent with status ${res.statusCode}`);
  if (code) assert.equal(c, code, res.body);
}
