/**
 * Idempotency-Key support for create and fork. The first request with a key runs; its successful
 * response (status + body) is stored in SQLite for 24 h, per tenant, so a retry — also after a server
 * restart — gets the original response instead of a second sandbox. The request fingerprint
 * (method, path, canonical JSON body) must match, else 422 idempotency_key_reused.
 *
 * A duplicate that arrives while the original is still in flight waits for it and gets its outcome
 * (its response, or the same error). Errors are not stored: a request that failed may be retried with
 * the same key and runs again. If the process dies mid-request nothing is stored and a retry runs again.
 */
import { createHash } from 'node:crypto';
import { CollimateError } from '../errors.js';
import type { Db } from '../store/db.js';
import { applyApiMigrations } from './migrations.js';

export const IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000;
const KEY_RE = /^[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?$/;

export interface StoredResponse {
  status: number;
  body: unknown;
}

export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) return '[' + v.map(canonicalJson).join(',') + ']';
  const o = v as Record<string, unknown>;
  return '{' + Object.keys(o).sort().filter((k) => o[k] !== undefined).map((k) => JSON.stringify(k) + ':' + canonicalJson(o[k])).join(',') + '}';
}

export function fingerprint(method: string, path: string, body: unknown): string {
  return createHash('sha256').update(`${method} ${path}\n${canonicalJson(body ?? {})}`).digest('hex');
}

export class IdempotencyStore {
  private readonly inflight = new Map<string, { fingerprint: string; done: Promise<StoredResponse> }>();

  constructor(private readonly db: Db, private readonly ttlMs = IDEMPOTENCY_TTL_MS) {
    applyApiMigrations(db);
    this.prune();
  }

  static validateKey(key: string): void {
    if (!KEY_RE.test(key)) {
      throw new CollimateError('validation_error', 'Idempotency-Key must be 1-255 printable ASCII characters (a UUID is ideal).');
    }
  }

  /**
   * Runs `exec` once per (tenant, key). Returns the response and whether it was replayed.
   * `exec` resolves with the response to store when it succeeded; it throws on failure.
   */
  async run(tenant: string, key: string, fp: string, exec: () => Promise<StoredResponse>): Promise<StoredResponse & { replayed: boolean }> {
    IdempotencyStore.validateKey(key);
    const stored = this.lookup(tenant, key);
    if (stored) {
      if (stored.fingerprint !== fp) throw reused(key);
      return { status: stored.status, body: stored.body, replayed: true };
    }
    const mapKey = `${tenant}\0${key}`;
    const pending = this.inflight.get(mapKey);
    if (pending) {
      if (pending.fingerprint !== fp) throw reused(key);
      const r = await pending.done;
      return { ...r, replayed: true };
    }
    const done = (async () => {
      const r = await exec();
      if (r.status >= 200 && r.status < 300) {
        this.db
          .prepare('INSERT OR REPLACE INTO api_idempotency (tenant, key, fingerprint, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)')
          .run(tenant, key, fp, r.status, JSON.stringify(r.body ?? null), Date.now());
      }
      return r;
    })();
    this.inflight.set(mapKey, { fingerprint: fp, done });
    try {
      return { ...(await done), replayed: false };
    } finally {
      this.inflight.delete(mapKey);
    }
  }

  prune(now = Date.now()): number {
    return this.db.prepare('DELETE FROM api_idempotency WHERE created_at < ?').run(now - this.ttlMs).changes;
  }

  private lookup(tenant: string, key: string): { fingerprint: string; status: number; body: unknown } | null {
    const row = this.db
      .prepare('SELECT fingerprint, status, body, created_at FROM api_idempotency WHERE tenant = ? AND key = ?')
      .get(tenant, key) as { fingerprint: string; status: number; body: string; created_at: number } | undefined;
    if (!row || row.created_at < Date.now() - this.ttlMs) return null;
    return { fingerprint: row.fingerprint, status: row.status, body: JSON.parse(row.body) };
  }
}

function reused(key: string): CollimateError {
  return new CollimateError(
    'idempotency_key_reused',
    `Idempotency-Key ${JSON.stringify(key)} was already used with a different request. Use a new key for a new request.`,
  );
}
