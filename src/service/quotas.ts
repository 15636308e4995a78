/**
 * Per-tenant quotas on what a tenant keeps and holds (issue 31 item 6), a part of the tenant
 * service: suspended sandboxes and the sizes their snapshots may take, own images and
 * environments, open streams and tunnels, and API keys. Each tier has defaults (QUOTA_DEFAULTS);
 * the operator overrides them per tier or per tenant (COLLIMATE_QUOTAS, parseQuotaOverrides).
 * Going past one is `429 quota_exceeded` naming it; GET /v1/limits shows each with its current use.
 *
 * Concurrent requests cannot pass a quota together: what an operation will add is reserved while
 * it runs (Quotas.reserve), and counted with what exists.
 */
import { CollimateError, msg, see } from '../errors.js';
import type { TierName } from './tiers.js';
import type { Scope } from './types.js';

import { QUOTA_NAMES, type QuotaName } from '../wire/schemas.js';

export { QUOTA_NAMES, type QuotaName };

/** A limit per quota; null: none. */
export type QuotaLimits = Record<QuotaName, number | null>;
export type QuotaOverrides = Record<string, Partial<QuotaLimits>>;

const GiB = 1024;

/**
 * The tiers' defaults. `suspended_mib` counts each suspended sandbox at its memory (unless the
 * suspend kept only its files) plus its disk size, the most its snapshot can take on the host's disk: a tenant holding that much cannot take
 * the disk reserve other tenants' suspends and creates need.
 */
export const QUOTA_DEFAULTS: Record<TierName, QuotaLimits> = {
  demo: { suspended_sandboxes: 2, suspended_mib: 4 * GiB, snapshots: 5, snapshot_mib: 4 * GiB, images: 0, environments: 0, open_streams: 32, keys: 5 },
  pro: { suspended_sandboxes: 100, suspended_mib: 256 * GiB, snapshots: 500, snapshot_mib: 256 * GiB, images: 100, environments: 50, open_streams: 512, keys: 50 },
  enterprise: { suspended_sandboxes: 1000, suspended_mib: 4096 * GiB, snapshots: 5000, snapshot_mib: 4096 * GiB, images: 1000, environments: 500, open_streams: 4096, keys: 500 },
};

const NONE: QuotaLimits = { suspended_sandboxes: null, suspended_mib: null, snapshots: null, snapshot_mib: null, images: null, environments: null, open_streams: null, keys: null };

/** What each quota counts, for messages and docs. */
export const QUOTA_MEANING: Record<QuotaName, string> = {
  suspended_sandboxes: 'suspended sandboxes',
  suspended_mib: 'MiB of suspended sandboxes (each counted at its memory plus disk size)',
  snapshots: 'snapshots',
  snapshot_mib: 'MiB of snapshots (each counted at what its files take on disk, at least its memory size while it is taken)',
  images: 'own images',
  environments: 'environments',
  open_streams: 'open streams and tunnels (event streams, watches, process and terminal streams, E2B streams, port connections) on this host',
  keys: 'API keys that are not revoked',
};

/** How to get back under each quota. */
const QUOTA_FIX: Record<QuotaName, ReturnType<typeof msg>> = {
  suspended_sandboxes: msg`delete suspended sandboxes you no longer need${see('deleteSandbox')}, or resume one`,
  suspended_mib: msg`delete suspended sandboxes you no longer need${see('deleteSandbox')}, or resume one`,
  snapshots: msg`delete snapshots you no longer need${see('deleteSnapshot')}`,
  snapshot_mib: msg`delete snapshots you no longer need${see('deleteSnapshot')}`,
  images: msg`delete images you no longer need${see('deleteImage')}`,
  environments: msg`delete environments you no longer need${see('deleteEnvironment')}`,
  open_streams: msg`close streams, watches, terminals or port connections you no longer read`,
  keys: msg`revoke keys you no longer use${see('revokeKey')}`,
};

/**
 * COLLIMATE_QUOTAS: a JSON object whose keys are a tier name (`demo`, `pro`, `enterprise`) or
 * `tenant:<id>`, each an object of quota name → a whole number or null (no limit). A tenant's entry
 * wins over its tier's, which wins over the default. Throws a message saying what to fix.
 */
export function parseQuotaOverrides(text: string | undefined): QuotaOverrides {
  if (text === undefined || text.trim() === '') return {};
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new Error('COLLIMATE_QUOTAS is not JSON: give an object such as {"pro": {"open_streams": 1000}, "tenant:acme": {"suspended_mib": null}}');
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new Error('COLLIMATE_QUOTAS must be a JSON object of tier names or tenant:<id> to quota objects');
  const out: QuotaOverrides = Object.create(null);
  for (const [scopeName, quotas] of Object.entries(raw as Record<string, unknown>)) {
    if (!(scopeName in QUOTA_DEFAULTS) && !/^tenant:.+$/.test(scopeName)) {
      throw new Error(`COLLIMATE_QUOTAS: ${JSON.stringify(scopeName)} is neither a tier (${Object.keys(QUOTA_DEFAULTS).join(', ')}) nor tenant:<id>`);
    }
    if (quotas === null || typeof quotas !== 'object' || Array.isArray(quotas)) throw new Error(`COLLIMATE_QUOTAS: ${scopeName} must be an object of quota name to limit`);
    const entry: Partial<QuotaLimits> = {};
    for (const [name, limit] of Object.entries(quotas as Record<string, unknown>)) {
      if (!(QUOTA_NAMES as readonly string[]).includes(name)) throw new Error(`COLLIMATE_QUOTAS: ${scopeName}.${name} is not a quota; the quotas are ${QUOTA_NAMES.join(', ')}`);
      if (limit !== null && !(Number.isSafeInteger(limit) && (limit as number) >= 0)) throw new Error(`COLLIMATE_QUOTAS: ${scopeName}.${name} must be a whole number ≥ 0, or null for no limit`);
      entry[name as QuotaName] = limit as number | null;
    }
    out[scopeName] = entry;
  }
  return out;
}

export function quotaExceeded(name: QuotaName, limit: number, used: number, adding: number): CollimateError {
  return new CollimateError(
    'quota_exceeded',
    [
      ...msg`Quota ${name} is ${limit} ${QUOTA_MEANING[name]} and you have ${used}${adding === 1 && name !== 'suspended_mib' && name !== 'snapshot_mib' ? '' : `; this needs ${adding} more`}. To go on, `,
      ...QUOTA_FIX[name],
      '; or ask the operator for a larger quota.',
    ],
    { details: { quota: name, limit, used, adding } },
  );
}

/** What a reservation holds until released (release is idempotent). */
export interface QuotaHold {
  release(): void;
}

export class Quotas {
  /** Amounts reserved by operations under way, by tenant and quota (and open streams, which are only ever this). */
  private readonly held = new Map<string, Map<QuotaName, number>>();

  constructor(private readonly overrides: QuotaOverrides = {}) {}

  /** The scope's limits: its tenant's overrides, else its tier's, else the tier's defaults; none for the engine's own fleet. */
  limits(scope: Scope): QuotaLimits {
    const tier = scope.tier.name;
    if (tier === 'trusted') return NONE;
    return { ...QUOTA_DEFAULTS[tier], ...this.overrides[tier], ...this.overrides[`tenant:${scope.tenant}`] };
  }

  /** What operations under way hold of `name` for the tenant. */
  holding(tenant: string, name: QuotaName): number {
    return this.held.get(tenant)?.get(name) ?? 0;
  }

  /**
   * Reserves `adding` of each quota on top of `used` (what exists now, read by the caller) and what
   * other operations hold; 429 quota_exceeded naming the first quota it would pass.
   */
  reserve(scope: Scope, want: Partial<Record<QuotaName, { used: number; adding: number }>>): QuotaHold {
    const limits = this.limits(scope);
    for (const [name, w] of Object.entries(want) as [QuotaName, { used: number; adding: number }][]) {
      const limit = limits[name];
      const used = w.used + this.holding(scope.tenant, name);
      if (limit !== null && used + w.adding > limit) throw quotaExceeded(name, limit, used, w.adding);
    }
    const mine = this.held.get(scope.tenant) ?? new Map<QuotaName, number>();
    this.held.set(scope.tenant, mine);
    for (const [name, w] of Object.entries(want) as [QuotaName, { used: number; adding: number }][]) mine.set(name, (mine.get(name) ?? 0) + w.adding);
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        for (const [name, w] of Object.entries(want) as [QuotaName, { used: number; adding: number }][]) {
          const left = (mine.get(name) ?? 0) - w.adding;
          if (left > 0) mine.set(name, left); else mine.delete(name);
        }
        if (mine.size === 0 && this.held.get(scope.tenant) === mine) this.held.delete(scope.tenant);
      },
    };
  }

  /** Runs `op` holding the reservation, released when it settles. */
  async within<T>(scope: Scope, want: Partial<Record<QuotaName, { used: number; adding: number }>>, op: () => Promise<T>): Promise<T> {
    const hold = this.reserve(scope, want);
    try {
      return await op();
    } finally {
      hold.release();
    }
  }

  /**
   * Counts one open stream or tunnel of the scope's until `closes` emits 'close' (a response, a
   * socket); 429 quota_exceeded past open_streams. Counted on this host.
   */
  holdStream(scope: Scope, closes: { once(event: 'close', listener: () => void): unknown; destroyed?: boolean }): void {
    const hold = this.reserve(scope, { open_streams: { used: 0, adding: 1 } });
    if (closes.destroyed) return hold.release();
    closes.once('close', () => hold.release());
  }
}
