/** Handlers of usage, the OpenAPI document, health and metrics. */
import { createHash, timingSafeEqual } from 'node:crypto';
import { CollimateError } from '../../errors.js';
import { bearerKey } from '../../service/keys.js';
import type { TenantService } from '../../service/tenantService.js';
import type { MetricsRegistry } from '../../service/metrics.js';
import type { Handlers } from '../binder.js';
import { renderOpenApi } from '../openapi.js';
import type { CapacityStatus, StorageStatus } from '../../sandboxes/hostCapacity.js';
import type { CatalogStatus } from '../../sandboxes/types.js';

type Ops = 'getUsage' | 'getOpenApi' | 'health' | 'metrics';

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
  /** Warm pools (catalog templates by id, environments summed): ready, size held and why. */
  pools?: Record<string, { ready: number; target: number; reason: string }>;
  /** The host's budgets for admission and what is used of them (hostCapacity.ts). */
  capacity?: CapacityStatus;
  /** Catalog templates a first start still builds after it began serving, and those whose build failed. */
  catalog?: CatalogStatus;
  /** Cluster mode: this host's identity and whether it holds its lease (src/cluster/hosts.ts). */
  cluster?: { host_id: string; address: string; capacity: number; lease: boolean };
}

/** ISO 8601 or epoch seconds. */
export function parseTime(s: string, name: string): number {
  const t = /^\d+(\.\d+)?$/.test(s) ? Number(s) * 1000 : Date.parse(s);
  // 8.64e15 ms is the range of a JS Date (year 275760); beyond it there is no ISO form to answer with.
  if (!Number.isFinite(t) || Math.abs(t) > 8.64e15) throw new CollimateError('validation_error', `${name} must be ISO 8601 or epoch seconds.`);
  return t;
}

export function operationHandlers(deps: {
  tenants: TenantService;
  metrics: MetricsRegistry;
  health: () => HealthInfo;
  draining: () => boolean;
  now: () => number;
  /** The operator's token for a /metrics scrape that names tenants' environments (COLLIMATE_METRICS_TOKEN); none: never named. */
  metricsToken?: string;
}): Pick<Handlers, Ops> {
  const openApiText = renderOpenApi();
  return {
    async getUsage({ scope, query }) {
      const t = deps.now();
      const d = new Date(t);
      const to = query.to === undefined ? t : parseTime(query.to, 'to');
      const from = query.from === undefined ? Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) : parseTime(query.from, 'from');
      return { status: 200, body: await deps.tenants.usage.report(scope, from, to, { perDay: query.per === 'day' }) };
    },

    getOpenApi({ reply }) {
      reply.code(200).type('application/json; charset=utf-8').send(openApiText);
      return null;
    },

    health() {
      const h = deps.health();
      const status = deps.draining() ? 'shutting_down' : h.ready ? 'ok' : 'starting';
      const extra = {
        ...(h.mode ? { mode: h.mode } : {}),
        ...(h.isolation ? { isolation: h.isolation } : {}),
        ...(h.confinement ? { confinement: h.confinement } : {}),
        ...(h.network ? { network: h.network } : {}),
        ...(h.pools ? { pools: h.pools } : {}),
        ...(h.capacity ? { capacity: capacityBody(h.capacity) } : {}),
        ...(h.catalog ? { catalog: h.catalog } : {}),
        ...(h.cluster ? { cluster: h.cluster } : {}),
      };
      return { status: status === 'ok' ? 200 : 503, body: { status, accel: h.accel, templates_ready: h.ready, ...extra } };
    },

    metrics({ req, reply }) {
      const names = deps.metricsToken !== undefined && sameSecret(bearerKey(req.headers.authorization), deps.metricsToken);
      reply.code(200).type('text/plain; version=0.0.4; charset=utf-8').send(deps.metrics.render({ names }));
      return null;
    },
  };
}

function capacityBody(c: CapacityStatus) {
  const m = c.memory;
  return {
    memory: { available_mib: m.availableMib, reserve_mib: m.reserveMib, committed_mib: m.committedMib, limit_mib: m.limitMib, starting_mib: m.startingMib },
    cpu: c.cpu,
    tmpfs: storageBody(c.tmpfs),
    disk: storageBody(c.disk),
    claims: c.claims,
    refusals: c.refusals,
  };
}

function storageBody(s: StorageStatus) {
  return { path: s.path, free_mib: s.freeMib, reserve_mib: s.reserveMib, starting_mib: s.startingMib };
}

/** Whether `given` is `secret`, compared in constant time. */
function sameSecret(given: string | undefined, secret: string): boolean {
  const a = createHash('sha256').update(given ?? '').digest();
  const b = createHash('sha256').update(secret).digest();
  return given !== undefined && timingSafeEqual(a, b);
}
