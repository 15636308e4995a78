/**
 * The cluster's PostgreSQL: one pool per process, transactions, and the schema migrations every
 * host runs at start. Migrations are serialized across hosts by a transaction-level advisory lock,
 * so hosts starting together apply each migration once, in order; a host started on an older binary
 * than the schema refuses to run rather than guess.
 */
import pg from 'pg';
import { CollimateError } from '../errors.js';
import { CLUSTER_MIGRATIONS } from './migrations.js';

export type Sql = pg.Pool | pg.PoolClient;

/** The advisory lock key of schema migrations ("collimate" in ASCII, truncated to 64 bits). */
const MIGRATION_LOCK = 0x636f6c6c696d61n;

export interface ClusterDbOptions {
  url: string;
  /** Pool size per process. Default 10. */
  max?: number;
  /** Name shown in pg_stat_activity. */
  applicationName?: string;
}

/** A pool on the cluster database. Connection errors of idle clients are reported, never thrown. */
export function openClusterDb(opts: ClusterDbOptions, onError: (err: Error) => void = () => {}): pg.Pool {
  const pool = new pg.Pool({
    connectionString: opts.url,
    max: opts.max ?? 10,
    application_name: opts.applicationName ?? 'collimate',
    connectionTimeoutMillis: 5000,
    // Bounds every statement: a stuck database must not hold a request (or a heartbeat) for ever.
    statement_timeout: 10_000,
    idle_in_transaction_session_timeout: 30_000,
  });
  pool.on('error', onError);
  return pool;
}

/** Runs `fn` in one transaction (READ COMMITTED), committing when it resolves and rolling back when it throws. */
export async function inTransaction<T>(pool: pg.Pool, fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    const r = await fn(c);
    await c.query('COMMIT');
    return r;
  } catch (err) {
    await c.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    c.release();
  }
}

/** Applies the migrations this binary knows and the database lacks; returns the versions applied. */
export async function migrateCluster(pool: pg.Pool): Promise<number[]> {
  return inTransaction(pool, async (c) => {
    await c.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK.toString()]);
    await c.query('CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())');
    const have = new Set((await c.query<{ version: number }>('SELECT version FROM schema_migrations')).rows.map((r) => r.version));
    const newest = Math.max(0, ...have);
    const known = CLUSTER_MIGRATIONS.length;
    if (newest > known) {
      throw new Error(`the cluster database is at schema version ${newest} but this collimate knows only ${known}: upgrade this host's collimate before it joins`);
    }
    const applied: number[] = [];
    for (let v = 1; v <= known; v++) {
      if (have.has(v)) continue;
      await c.query(CLUSTER_MIGRATIONS[v - 1]);
      await c.query('INSERT INTO schema_migrations (version) VALUES ($1)', [v]);
      applied.push(v);
    }
    return applied;
  });
}

/**
 * What a request gets when the cluster database cannot answer: 503 with Retry-After. (A code of its
 * own would need every SDK to learn it; host_at_capacity already means "this host cannot take the
 * request now, retry", and details.resource says why.)
 */
/** A query whose failure to reach the database is clusterDatabaseUnavailable (503, Retry-After) for the caller. */
export async function clusterQuery<R extends pg.QueryResultRow>(pool: pg.Pool, sql: string, args: unknown[]): Promise<pg.QueryResult<R>> {
  try {
    return await pool.query<R>(sql, args);
  } catch (err) {
    throw clusterDatabaseUnavailable(err);
  }
}

export function clusterDatabaseUnavailable(cause: unknown): CollimateError {
  return new CollimateError('host_at_capacity', 'The cluster database (PostgreSQL) is unreachable from this host; retry shortly.', {
    retryAfterSecs: 5,
    details: { resource: 'cluster_database' },
    cause,
  });
}
