/**
 * Whose a sandbox's access tokens are (PortUrlSigner.sandboxToken): the API key they were issued
 * under and a generation. A token is a MAC over both, so it dies when that key is revoked
 * (Accounts.sandboxScope checks) and when the generation moves on (a rotation, or tokens issued
 * again after the key died). Nothing else is stored per token. Kept in the server's database
 * (migration 17); a cluster host keeps them in the cluster's (src/cluster/sandboxGrants.ts), since
 * any host may be asked to check a token.
 */
import { applyMigrations, registerMigrations, type Db, type Migration } from '../store/db.js';

export const GRANT_MIGRATIONS: Migration[] = [
  {
    version: 17,
    name: 'api_sandbox_grants',
    sql: `
      CREATE TABLE api_sandbox_grants (
        sandbox     TEXT PRIMARY KEY,
        key_id      TEXT,
        generation  INTEGER NOT NULL
      );
    `,
  },
];

registerMigrations(GRANT_MIGRATIONS);

export interface SandboxGrant {
  /** The key the tokens were issued under; null for a caller without one (the engine's own fleet). */
  keyId: string | null;
  generation: number;
}

export interface SandboxGrants {
  /** The grants of those of `ids` that have one. */
  get(ids: readonly string[]): Promise<Map<string, SandboxGrant>>;
  /**
   * Replaces `id`'s grant, if it is still `from` (null: it has none), by one under `keyId` of the
   * next generation (0 for the first). Returns the grant stored afterwards: the new one, or the
   * one a concurrent caller stored first.
   */
  replace(id: string, from: SandboxGrant | null, keyId: string | null): Promise<SandboxGrant>;
  /** Drops a deleted sandbox's grant. */
  forget(id: string): Promise<void>;
}

export function nextGeneration(from: SandboxGrant | null): number {
  return from === null ? 0 : from.generation + 1;
}

/** SandboxGrants in this server's SQLite database. */
export class SandboxGrantStore implements SandboxGrants {
  constructor(private readonly db: Db) {
    applyMigrations(db, GRANT_MIGRATIONS);
  }

  async get(ids: readonly string[]): Promise<Map<string, SandboxGrant>> {
    const out = new Map<string, SandboxGrant>();
    const read = this.db.prepare('SELECT key_id, generation FROM api_sandbox_grants WHERE sandbox = ?');
    for (const id of ids) {
      const row = read.get(id) as { key_id: string | null; generation: number } | undefined;
      if (row) out.set(id, { keyId: row.key_id, generation: row.generation });
    }
    return out;
  }

  async replace(id: string, from: SandboxGrant | null, keyId: string | null): Promise<SandboxGrant> {
    const generation = nextGeneration(from);
    if (from === null) {
      this.db.prepare('INSERT OR IGNORE INTO api_sandbox_grants (sandbox, key_id, generation) VALUES (?, ?, ?)').run(id, keyId, generation);
    } else {
      this.db.prepare('UPDATE api_sandbox_grants SET key_id = ?, generation = ? WHERE sandbox = ? AND generation = ?').run(keyId, generation, id, from.generation);
    }
    return (await this.get([id])).get(id)!;
  }

  async forget(id: string): Promise<void> {
    this.db.prepare('DELETE FROM api_sandbox_grants WHERE sandbox = ?').run(id);
  }
}
