/**
 * Tenants and API keys. A key is `clm_` + 40 random base62 characters (~238 bits), so a plain sha256
 * of it is a safe verifier: only the hash is stored, the key itself is shown once at creation.
 * The tier belongs to the tenant (caps are per tenant); every key of a tenant acts with its tier.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { CollimateError } from '../errors.js';
import type { Db } from '../store/db.js';
import { applyApiMigrations } from './migrations.js';
import { isTierName, TIERS, type Tier, type TierName } from './tiers.js';

export const KEY_PREFIX = 'clm_';
const KEY_BODY_LEN = 40;
const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
export const KEY_RE = /^clm_[0-9A-Za-z]{40}$/;
/**
 * The same key in E2B's shape (`e2b_` + lowercase hex), for the E2B SDK, which checks a key's shape
 * before it sends it: `e2b_` + the hex of the 40 base62 characters. Either form authenticates.
 */
export const E2B_KEY_PREFIX = 'e2b_';
const E2B_KEY_RE = /^e2b_[0-9a-f]{80}$/;

export function e2bKeyOf(key: string): string {
  if (!KEY_RE.test(key)) throw new Error('not a Collimate key');
  return E2B_KEY_PREFIX + Buffer.from(key.slice(KEY_PREFIX.length), 'latin1').toString('hex');
}

/** The Collimate key an E2B-shaped key stands for; the key itself if it is not E2B-shaped. */
export function fromE2bKey(key: string): string {
  if (!E2B_KEY_RE.test(key)) return key;
  return KEY_PREFIX + Buffer.from(key.slice(E2B_KEY_PREFIX.length), 'hex').toString('latin1');
}
export const TENANT_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export interface Principal {
  tenant: string;
  tier: Tier;
  keyId: string;
}

export interface KeyRecord {
  id: string;
  tenant: string;
  tier: TierName;
  prefix: string;
  name: string | null;
  created_at: string;
  last_used_at: string | null;
  revoked_at: string | null;
}

function randomBase62(n: number): string {
  let out = '';
  while (out.length < n) {
    for (const b of randomBytes(n * 2)) {
      // 248 = 4 × 62: rejection sampling keeps the distribution uniform.
      if (b < 248 && out.length < n) out += BASE62[b % 62];
    }
  }
  return out;
}

/** A new API key (shown once; only its hash is kept). */
/** The API key of an `Authorization: Bearer <key>` header, if it is one (every door reads keys so). */
export function bearerKey(authorization: string | string[] | undefined): string | undefined {
  const m = typeof authorization === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(authorization) : null;
  return m?.[1];
}

export function newApiKey(): string {
  return KEY_PREFIX + randomBase62(KEY_BODY_LEN);
}

export function hashKey(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

/** Epoch ms (a number from SQLite, a bigint's string from PostgreSQL) as ISO 8601. */
const iso = (ms: string | number | null) => (ms === null ? null : new Date(Number(ms)).toISOString());

/** Minimum interval between last_used_at writes for one key (keeps auth off the write path). */
const TOUCH_EVERY_MS = 60_000;

export class KeyStore {
  private readonly lastTouch = new Map<string, number>();

  constructor(private readonly db: Db) {
    applyApiMigrations(db);
  }

  /** Creates the tenant if needed (tier default demo); with `tier`, sets the tenant's tier. */
  create(opts: { tenant: string; tier?: TierName; name?: string }): { key: string; record: KeyRecord; tierChanged: boolean } {
    if (!TENANT_RE.test(opts.tenant)) {
      throw new CollimateError('validation_error', `Tenant must match ${TENANT_RE.source}.`);
    }
    if (opts.tier !== undefined && !isTierName(opts.tier)) {
      throw new CollimateError('validation_error', `Tier must be one of ${Object.keys(TIERS).join(', ')}.`);
    }
    const key = newApiKey();
    const id = 'key_' + randomBytes(6).toString('hex');
    const now = Date.now();
    let tierChanged = false;
    this.db.transaction(() => {
      const existing = this.db.prepare('SELECT tier FROM api_tenants WHERE id = ?').get(opts.tenant) as { tier: TierName } | undefined;
      if (!existing) {
        this.db.prepare('INSERT INTO api_tenants (id, tier, created_at) VALUES (?, ?, ?)').run(opts.tenant, opts.tier ?? 'demo', now);
      } else if (opts.tier !== undefined && existing.tier !== opts.tier) {
        this.db.prepare('UPDATE api_tenants SET tier = ? WHERE id = ?').run(opts.tier, opts.tenant);
        tierChanged = true;
      }
      this.db
        .prepare('INSERT INTO api_keys (id, tenant, hash, prefix, name, created_at) VALUES (?, ?, ?, ?, ?, ?)')
        .run(id, opts.tenant, hashKey(key), key.slice(0, 12), opts.name ?? null, now);
    })();
    return { key, record: this.get(id)!, tierChanged };
  }

  get(id: string): KeyRecord | null {
    const row = this.db
      .prepare(
        `SELECT k.id, k.tenant, t.tier, k.prefix, k.name, k.created_at, k.last_used_at, k.revoked_at
         FROM api_keys k JOIN api_tenants t ON t.id = k.tenant WHERE k.id = ?`,
      )
      .get(id) as any;
    return row ? toRecord(row) : null;
  }

  list(filter: { tenant?: string; includeRevoked?: boolean } = {}): KeyRecord[] {
    const rows = this.db
      .prepare(
        `SELECT k.id, k.tenant, t.tier, k.prefix, k.name, k.created_at, k.last_used_at, k.revoked_at
         FROM api_keys k JOIN api_tenants t ON t.id = k.tenant
         WHERE (@tenant IS NULL OR k.tenant = @tenant) AND (@all = 1 OR k.revoked_at IS NULL)
         ORDER BY k.created_at, k.id`,
      )
      .all({ tenant: filter.tenant ?? null, all: filter.includeRevoked ? 1 : 0 }) as any[];
    return rows.map(toRecord);
  }

  /** Revokes by key id (key_…) or by the key itself. Returns the revoked record, or null if none matched. */
  revoke(idOrKeyPresented: string): KeyRecord | null {
    const idOrKey = fromE2bKey(idOrKeyPresented);
    const row = (KEY_RE.test(idOrKey)
      ? this.db.prepare('SELECT id FROM api_keys WHERE hash = ?').get(hashKey(idOrKey))
      : this.db.prepare('SELECT id FROM api_keys WHERE id = ?').get(idOrKey)) as { id: string } | undefined;
    if (!row) return null;
    this.db.prepare('UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?').run(Date.now(), row.id);
    return this.get(row.id);
  }

  /** The tenant's tier, or null for a tenant this server does not know. */
  tierOf(tenant: string): Tier | null {
    const row = this.db.prepare('SELECT tier FROM api_tenants WHERE id = ?').get(tenant) as { tier: TierName } | undefined;
    return row ? TIERS[row.tier] : null;
  }

  /** tierOf, for a store that may have to ask elsewhere (the cluster's, src/cluster/keys.ts). */
  async findTier(tenant: string): Promise<Tier | null> {
    return this.tierOf(tenant);
  }

  /** Makes `presented` known to authenticate(); this store reads its own database, so it has nothing to fetch. */
  async load(_presented: string | undefined): Promise<void> {}

  setTier(tenant: string, tier: TierName): void {
    const r = this.db.prepare('UPDATE api_tenants SET tier = ? WHERE id = ?').run(tier, tenant);
    if (r.changes === 0) throw new CollimateError('not_found', `No tenant ${tenant}.`);
  }

  /** Resolves a bearer key to its principal, or null when unknown or revoked. */
  authenticate(presented: string): Principal | null {
    const key = fromE2bKey(presented);
    if (!KEY_RE.test(key)) return null;
    const hash = hashKey(key);
    const row = this.db
      .prepare(
        `SELECT k.id, k.hash, k.tenant, t.tier, k.revoked_at FROM api_keys k JOIN api_tenants t ON t.id = k.tenant WHERE k.hash = ?`,
      )
      .get(hash) as { id: string; hash: string; tenant: string; tier: TierName; revoked_at: number | null } | undefined;
    // The lookup is by hash, so timing reveals nothing about the key; the compare is belt and braces.
    if (!row || row.revoked_at !== null || !timingSafeEqual(Buffer.from(row.hash), Buffer.from(hash))) return null;
    const now = Date.now();
    if (now - (this.lastTouch.get(row.id) ?? 0) > TOUCH_EVERY_MS) {
      this.lastTouch.set(row.id, now);
      this.db.prepare('UPDATE api_keys SET last_used_at = ? WHERE id = ?').run(now, row.id);
    }
    return { tenant: row.tenant, tier: TIERS[row.tier], keyId: row.id };
  }
}

/** A key's row (this store's or the cluster's, src/cluster/keys.ts) as the API shows it. */
export function toRecord(row: any): KeyRecord {
  return {
    id: row.id,
    tenant: row.tenant,
    tier: row.tier,
    prefix: row.prefix,
    name: row.name ?? null,
    created_at: iso(row.created_at)!,
    last_used_at: iso(row.last_used_at),
    revoked_at: iso(row.revoked_at),
  };
}
