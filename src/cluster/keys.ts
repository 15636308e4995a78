/**
 * Tenants and API keys in the cluster database, so a key made once (`collimate keys create
 * --cluster …`) is valid on every host. The same key format, hashing and records as the single-host
 * KeyStore (src/service/keys.ts); only the store differs.
 *
 * Requests authenticate through a short cache (KeyCache): a key is looked up in PostgreSQL at most
 * every refreshMs, so a revocation reaches every host within that time, and while the database is
 * unreachable the last answer is kept (running sandboxes keep serving their tenants).
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import type pg from 'pg';
import { CollimateError, msg, see } from '../errors.js';
import { fromE2bKey, hashKey, KEY_RE, KeyStore, newApiKey, TENANT_RE, toRecord, type KeyRecord, type Principal } from '../service/keys.js';
import { isTierName, TIERS, type Tier, type TierName } from '../service/tiers.js';
import type { Db } from '../store/db.js';
import { clusterDatabaseUnavailable, inTransaction } from './db.js';

/** Keys a host remembers at most (oldest answer dropped first). */
const MAX_CACHED_KEYS = 10_000;

const SELECT_KEY = `SELECT k.id, k.tenant, t.tier, k.prefix, k.name, k.created_at, k.last_used_at, k.revoked_at
  FROM api_keys k JOIN tenants t ON t.id = k.tenant`;

export class ClusterKeys {
  constructor(private readonly pool: pg.Pool) {}

  /** Creates the tenant if needed (tier default demo); with `tier`, sets the tenant's tier. */
  async create(opts: { tenant: string; tier?: TierName; name?: string }): Promise<{ key: string; record: KeyRecord; tierChanged: boolean }> {
    if (!TENANT_RE.test(opts.tenant)) throw new CollimateError('validation_error', `Tenant must match ${TENANT_RE.source}.`);
    if (opts.tier !== undefined && !isTierName(opts.tier)) throw new CollimateError('validation_error', `Tier must be one of ${Object.keys(TIERS).join(', ')}.`);
    const key = newApiKey();
    const id = 'key_' + randomBytes(6).toString('hex');
    const now = Date.now();
    const tierChanged = await inTransaction(this.pool, async (tx) => {
      const ins = await tx.query(`INSERT INTO tenants (id, tier, created_at) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING`, [opts.tenant, opts.tier ?? 'demo', now]);
      let changed = false;
      if (ins.rowCount === 0 && opts.tier !== undefined) {
        const u = await tx.query(`UPDATE tenants SET tier = $2 WHERE id = $1 AND tier <> $2`, [opts.tenant, opts.tier]);
        changed = u.rowCount === 1;
      }
      await tx.query(`INSERT INTO api_keys (id, tenant, hash, prefix, name, created_at) VALUES ($1, $2, $3, $4, $5, $6)`, [id, opts.tenant, hashKey(key), key.slice(0, 12), opts.name ?? null, now]);
      return changed;
    });
    return { key, record: (await this.get(id))!, tierChanged };
  }

  async get(id: string): Promise<KeyRecord | null> {
    const r = await this.pool.query(`${SELECT_KEY} WHERE k.id = $1`, [id]);
    return r.rows[0] ? toRecord(r.rows[0]) : null;
  }

  async list(filter: { tenant?: string; includeRevoked?: boolean } = {}): Promise<KeyRecord[]> {
    const r = await this.pool.query(
      `${SELECT_KEY} WHERE ($1::text IS NULL OR k.tenant = $1) AND ($2 OR k.revoked_at IS NULL) ORDER BY k.created_at, k.id`,
      [filter.tenant ?? null, filter.includeRevoked === true],
    );
    return r.rows.map(toRecord);
  }

  /** Revokes by key id (key_…) or by the key itself; null if none matched. */
  async revoke(idOrKeyPresented: string): Promise<KeyRecord | null> {
    const idOrKey = fromE2bKey(idOrKeyPresented);
    const r = KEY_RE.test(idOrKey)
      ? await this.pool.query<{ id: string }>('UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE hash = $1 RETURNING id', [hashKey(idOrKey), Date.now()])
      : await this.pool.query<{ id: string }>('UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1 RETURNING id', [idOrKey, Date.now()]);
    return r.rows[0] ? this.get(r.rows[0].id) : null;
  }

  /** The principal of a presented key, or null when it is unknown or revoked. */
  async authenticate(presented: string): Promise<Principal | null> {
    const key = fromE2bKey(presented);
    if (!KEY_RE.test(key)) return null;
    const hash = hashKey(key);
    const r = await this.pool.query<{ id: string; hash: string; tenant: string; tier: TierName; revoked_at: string | null }>(
      `SELECT k.id, k.hash, k.tenant, t.tier, k.revoked_at FROM api_keys k JOIN tenants t ON t.id = k.tenant WHERE k.hash = $1`,
      [hash],
    );
    const row = r.rows[0];
    if (!row || row.revoked_at !== null || !timingSafeEqual(Buffer.from(row.hash), Buffer.from(hash))) return null;
    return { tenant: row.tenant, tier: TIERS[row.tier], keyId: row.id };
  }

  async tierOf(tenant: string): Promise<Tier | null> {
    const r = await this.pool.query<{ tier: TierName }>('SELECT tier FROM tenants WHERE id = $1', [tenant]);
    return r.rows[0] ? TIERS[r.rows[0].tier] : null;
  }

  /** Tenants holding a key that can still authenticate (for serve's TCG policy). */
  async countTenants(): Promise<number> {
    const r = await this.pool.query<{ n: string }>('SELECT count(DISTINCT tenant) AS n FROM api_keys WHERE revoked_at IS NULL');
    return Number(r.rows[0].n);
  }
}

/**
 * The tenant service's key store on a cluster host: answers the service's synchronous
 * authenticate() and tierOf() from a cache that the server fills (load()) before each request is
 * handled. A key not loaded yet is unknown (401), never a database round trip on the request path.
 */
export class KeyCache extends KeyStore {
  private readonly principals = new Map<string, { principal: Principal | null; at: number }>();
  private readonly tiers = new Map<string, Tier>();
  /** Lookups of keys this host has no answer for, allowed now (a bucket refilled at `missesPerSec`). */
  private missTokens: number;
  private missAt = Date.now();

  /**
   * `refreshMs`: how long a known key's answer holds before it is asked again (a revocation reaches
   * this host within it). `negativeMs`: how long "no such key" holds — a key unknown now never
   * becomes known (keys are random and their holders learn them only once they exist; a revoked one
   * stays revoked). `missesPerSec`: lookups of keys with no answer here, at most; beyond it such a
   * key is unknown without asking, so a flood of made-up keys costs a hash each, not a query each.
   */
  constructor(db: Db, private readonly cluster: ClusterKeys, private readonly refreshMs = 2000, private readonly negativeMs = 600_000, private readonly missesPerSec = 100) {
    super(db);
    this.missTokens = missesPerSec;
  }

  /** Looks the key up in the cluster unless a fresh answer is cached; keeps the last answer when the database fails. */
  async load(presented: string | undefined): Promise<void> {
    if (!presented) return;
    const key = fromE2bKey(presented);
    if (!KEY_RE.test(key)) return;
    const hash = hashKey(key);
    const cached = this.principals.get(hash);
    const now = Date.now();
    if (cached && now - cached.at < (cached.principal ? this.refreshMs : this.negativeMs)) return;
    if (!cached) {
      this.missTokens = Math.min(this.missesPerSec, this.missTokens + ((now - this.missAt) / 1000) * this.missesPerSec);
      this.missAt = now;
      if (this.missTokens < 1) return;
      this.missTokens -= 1;
    }
    try {
      const principal = await this.cluster.authenticate(key);
      // Bounded: well-formed unknown keys are cached too (as null), and anyone can send those.
      if (this.principals.size >= MAX_CACHED_KEYS) this.principals.delete(this.principals.keys().next().value!);
      this.principals.delete(hash);
      this.principals.set(hash, { principal, at: Date.now() });
      if (principal) this.tiers.set(principal.tenant, principal.tier);
    } catch (err) {
      if (!cached) throw clusterDatabaseUnavailable(err);
    }
  }

  override authenticate(presented: string): Principal | null {
    const key = fromE2bKey(presented);
    if (!KEY_RE.test(key)) return null;
    return this.principals.get(hashKey(key))?.principal ?? null;
  }

  override tierOf(tenant: string): Tier | null {
    return this.tiers.get(tenant) ?? null;
  }

  /** The tenant's tier from the cache, else from the cluster database (a sandbox token names no key to load). */
  override async findTier(tenant: string): Promise<Tier | null> {
    const cached = this.tiers.get(tenant);
    if (cached) return cached;
    let tier: Tier | null;
    try {
      tier = await this.cluster.tierOf(tenant);
    } catch (err) {
      throw clusterDatabaseUnavailable(err);
    }
    if (tier) this.tiers.set(tenant, tier);
    return tier;
  }

  override create(): never {
    throw new CollimateError('not_found', msg`On a cluster host keys are made in the cluster database: collimate keys create --cluster postgres://… (or make one${see('createKey')}).`);
  }
}
