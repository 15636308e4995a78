/**
 * Sandboxes' token grants in the cluster database (src/service/sandboxGrants.ts): a token issued
 * through one host is checked by whichever host a request reaches. A row goes with its sandbox's
 * deletion (the host that ran it forgets it on the transition).
 */
import type pg from 'pg';
import { nextGeneration, type SandboxGrant, type SandboxGrants } from '../service/sandboxGrants.js';
import { clusterQuery } from './db.js';

export class ClusterSandboxGrants implements SandboxGrants {
  constructor(private readonly pool: pg.Pool) {}

  async get(ids: readonly string[]): Promise<Map<string, SandboxGrant>> {
    const out = new Map<string, SandboxGrant>();
    if (ids.length === 0) return out;
    const r = await clusterQuery<{ sandbox: string; key_id: string | null; generation: number }>(
      this.pool, 'SELECT sandbox, key_id, generation FROM sandbox_grants WHERE sandbox = ANY($1)', [ids]);
    for (const row of r.rows) out.set(row.sandbox, { keyId: row.key_id, generation: Number(row.generation) });
    return out;
  }

  async replace(id: string, from: SandboxGrant | null, keyId: string | null): Promise<SandboxGrant> {
    const generation = nextGeneration(from);
    if (from === null) {
      await clusterQuery(this.pool, 'INSERT INTO sandbox_grants (sandbox, key_id, generation) VALUES ($1, $2, $3) ON CONFLICT (sandbox) DO NOTHING', [id, keyId, generation]);
    } else {
      await clusterQuery(this.pool, 'UPDATE sandbox_grants SET key_id = $1, generation = $2 WHERE sandbox = $3 AND generation = $4', [keyId, generation, id, from.generation]);
    }
    return (await this.get([id])).get(id)!;
  }

  async forget(id: string): Promise<void> {
    await clusterQuery(this.pool, 'DELETE FROM sandbox_grants WHERE sandbox = $1', [id]);
  }
}
