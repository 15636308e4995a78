import type pg from 'pg';
import { migrateCluster, openClusterDb } from './db.js';

/**
 * The cluster's secrets key: environment secrets on a cluster host are sealed with one key that
 * every host of the cluster holds, so any host can open an environment's secrets wherever it was
 * made (a single host keeps its own `<home>/secrets.key`; src/images/secrets.ts). It is made once,
 * by migration 4, and lives in cluster_settings: whoever can read the cluster database can open the
 * sealed secrets in a host's SQLite, so that database is guarded like the keys' hashes it holds.
 */
export async function readClusterSecretsKey(pool: pg.Pool): Promise<Buffer> {
  const r = await pool.query<{ value: string }>(`SELECT value FROM cluster_settings WHERE name = 'secrets_key'`);
  const hex = r.rows[0]?.value ?? '';
  if (!/^[0-9a-f]{64}$/.test(hex)) throw new Error('the cluster database has no valid secrets_key in cluster_settings (its schema migration 4 makes one)');
  return Buffer.from(hex, 'hex');
}

/** Connects to the cluster database at `url`, migrates its schema and reads the secrets key (for a host starting). */
export async function fetchClusterSecretsKey(url: string): Promise<Buffer> {
  const pool = openClusterDb({ url, max: 1 });
  try {
    await migrateCluster(pool);
    return await readClusterSecretsKey(pool);
  } finally {
    await pool.end();
  }
}
