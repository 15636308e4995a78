/**
 * The tenant service's tables (keys, idempotency, usage, the exec and sandbox logs; migration versions 10–19). Registered on import so that any later openDb()
 * applies them; `applyApiMigrations` also applies them to a database that was opened before this
 * module was imported (the engine may open the db first).
 */
import { applyMigrations, registerMigrations, type Db, type Migration } from '../store/db.js';

export const API_MIGRATIONS: Migration[] = [
  {
    version: 10,
    name: 'api_tenants_keys',
    sql: `
      CREATE TABLE api_tenants (
        id          TEXT PRIMARY KEY,
        tier        TEXT NOT NULL CHECK (tier IN ('demo','pro','enterprise')),
        created_at  INTEGER NOT NULL
      );
      CREATE TABLE api_keys (
        id            TEXT PRIMARY KEY,
        tenant        TEXT NOT NULL REFERENCES api_tenants(id),
        hash          TEXT NOT NULL UNIQUE,
        prefix        TEXT NOT NULL,
        name          TEXT,
        created_at    INTEGER NOT NULL,
        last_used_at  INTEGER,
        revoked_at    INTEGER
      );
      CREATE INDEX api_keys_tenant ON api_keys (tenant);
    `,
  },
  {
    version: 11,
    name: 'api_idempotency',
    sql: `
      CREATE TABLE api_idempotency (
        tenant       TEXT NOT NULL,
        key          TEXT NOT NULL,
        fingerprint  TEXT NOT NULL,
        status       INTEGER NOT NULL,
        body         TEXT NOT NULL,
        created_at   INTEGER NOT NULL,
        PRIMARY KEY (tenant, key)
      );
      CREATE INDEX api_idempotency_created ON api_idempotency (created_at);
    `,
  },
  {
    version: 12,
    name: 'usage_intervals',
    sql: `
      CREATE TABLE usage_intervals (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant          TEXT NOT NULL,
        sandbox         TEXT NOT NULL,
        template        TEXT NOT NULL,
        state           TEXT NOT NULL CHECK (state IN ('running','suspended')),
        vcpus           REAL NOT NULL,
        memory_mib      REAL NOT NULL,
        disk_mib        REAL NOT NULL,
        snapshot_bytes  REAL NOT NULL DEFAULT 0,
        expires_ms      INTEGER,
        start_ms        INTEGER NOT NULL,
        end_ms          INTEGER
      );
      CREATE INDEX usage_intervals_tenant ON usage_intervals (tenant, start_ms);
      CREATE UNIQUE INDEX usage_intervals_open ON usage_intervals (sandbox) WHERE end_ms IS NULL;
    `,
  },
  {
    version: 16,
    name: 'api_execs',
    sql: `
      CREATE TABLE api_execs (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant       TEXT NOT NULL,
        sandbox      TEXT NOT NULL,
        command      TEXT NOT NULL,
        exit_code    INTEGER NOT NULL,
        timed_out    INTEGER NOT NULL,
        started_ms   INTEGER NOT NULL,
        duration_ms  INTEGER NOT NULL
      );
      CREATE INDEX api_execs_sandbox ON api_execs (sandbox, id);
    `,
  },
  {
    version: 18,
    name: 'api_sandbox_logs',
    sql: `
      CREATE TABLE api_sandbox_logs (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant   TEXT NOT NULL,
        sandbox  TEXT NOT NULL,
        at_ms    INTEGER NOT NULL,
        level    INTEGER NOT NULL CHECK (level BETWEEN 0 AND 3),
        message  TEXT NOT NULL,
        fields   TEXT NOT NULL
      );
      CREATE INDEX api_sandbox_logs_sandbox ON api_sandbox_logs (sandbox, id);
      CREATE INDEX api_sandbox_logs_time ON api_sandbox_logs (sandbox, at_ms);
    `,
  },
];

registerMigrations(API_MIGRATIONS);

export function applyApiMigrations(db: Db): void {
  applyMigrations(db, API_MIGRATIONS);
}
