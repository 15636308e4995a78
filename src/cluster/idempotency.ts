/**
 * Idempotency-Key across nodes: one key, one execution, whichever nodes the retries hit. The first
 * request claims the key with INSERT … ON CONFLICT DO NOTHING (a `pending` row with a lease); a
 * duplicate on any node waits for that row to become `done` and replays its answer. A failure drops
 * the claim, so a retry runs again (as on a single host). A claim whose lease ran out (its node died
 * mid-request) is taken over by the next duplicate.
 *
 * Same rules as the single-host store (src/service/idempotency.ts): 24 h, per tenant, the request's
 * fingerprint must match (else idempotency_key_reused), only 2xx answers are stored.
 */
import type pg from 'pg';
import { CollimateError } from '../errors.js';
import { IDEMPOTENCY_TTL_MS, IdempotencyStore, type StoredResponse } from '../service/idempotency.js';

/** How long a claim holds before a duplicate may take it over. */
export const CLAIM_LEASE_MS = 120_000;
const POLL_MS = 100;

export class ClusterIdempotency {
  constructor(private readonly pool: pg.Pool, private readonly ttlMs = IDEMPOTENCY_TTL_MS, private readonly leaseMs = CLAIM_LEASE_MS) {}

  async run(tenant: string, key: string, fp: string, exec: () => Promise<StoredResponse>): Promise<StoredResponse & { replayed: boolean }> {
    IdempotencyStore.validateKey(key);
    for (;;) {
      // Drops an answer older than the TTL, so the key can be claimed afresh.
      await this.pool.query(`DELETE FROM idempotency WHERE tenant = $1 AND key = $2 AND state = 'done' AND created_at < now() - $3 * interval '1 millisecond'`, [tenant, key, this.ttlMs]);
      const claimed = await this.pool.query(
        `INSERT INTO idempotency (tenant, key, fingerprint, state, lease_until) VALUES ($1, $2, $3, 'pending', now() + $4 * interval '1 millisecond')
         ON CONFLICT (tenant, key) DO NOTHING`,
        [tenant, key, fp, this.leaseMs],
      );
      if (claimed.rowCount === 1) return { ...(await this.execute(tenant, key, exec)), replayed: false };
      const row = (await this.pool.query<{ fingerprint: string; state: string; status: number | null; body: unknown; expired: boolean }>(
        `SELECT fingerprint, state, status, body, lease_until < now() AS expired FROM idempotency WHERE tenant = $1 AND key = $2`,
        [tenant, key],
      )).rows[0];
      if (!row) continue; // dropped (a failure) between our insert and select: claim again
      if (row.fingerprint !== fp) throw reused(key);
      if (row.state === 'done') return { status: row.status!, body: row.body, replayed: true };
      if (row.expired) {
        const taken = await this.pool.query(
          `UPDATE idempotency SET lease_until = now() + $3 * interval '1 millisecond' WHERE tenant = $1 AND key = $2 AND state = 'pending' AND lease_until < now()`,
          [tenant, key, this.leaseMs],
        );
        if (taken.rowCount === 1) return { ...(await this.execute(tenant, key, exec)), replayed: false };
        continue;
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  private async execute(tenant: string, key: string, exec: () => Promise<StoredResponse>): Promise<StoredResponse> {
    let r: StoredResponse;
    try {
      r = await exec();
    } catch (err) {
      await this.pool.query(`DELETE FROM idempotency WHERE tenant = $1 AND key = $2 AND state = 'pending'`, [tenant, key]).catch(() => {});
      throw err;
    }
    if (r.status >= 200 && r.status < 300) {
      await this.pool.query(`UPDATE idempotency SET state = 'done', status = $3, body = $4, created_at = now() WHERE tenant = $1 AND key = $2`, [tenant, key, r.status, JSON.stringify(r.body ?? null)]);
    } else {
      await this.pool.query(`DELETE FROM idempotency WHERE tenant = $1 AND key = $2 AND state = 'pending'`, [tenant, key]);
    }
    return r;
  }
}

function reused(key: string): CollimateError {
  return new CollimateError(
    'idempotency_key_reused',
    `Idempotency-Key ${JSON.stringify(key)} was already used with a different request. Use a new key for a new request.`,
  );
}
