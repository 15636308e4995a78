import Database from 'better-sqlite3';
import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';

export type Db = Database.Database;

/**
 * Schema migrations, applied in order, each once, inside a transaction. Append only: never edit a
 * migration that has shipped, add a new one. (The one exception, in 1: the state CHECK lost three
 * states nothing ever wrote; a database made before keeps its wider CHECK, which is harmless.)
 * Each subsystem owns its tables:
 *   1 — sandboxes (engine / lifecycle)
 *   2+ — API: tenants, keys, idempotency, usage (src/api)
 */
export interface Migration {
  version: number;
  name: string;
  sql: string;
}

const migrations: Migration[] = [
  {
    version: 1,
    name: 'sandboxes',
    sql: `
      CREATE TABLE sandboxes (
        id            TEXT PRIMARY KEY,
        tenant        TEXT NOT NULL,
        template      TEXT NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('running','suspended','deleting','deleted')),
        labels        TEXT NOT NULL DEFAULT '{}',
        created_at    INTEGER NOT NULL,
        last_active   INTEGER NOT NULL,
        exec_count    INTEGER NOT NULL DEFAULT 0,
        parent        TEXT,
        forked_at     INTEGER,
        timeout_secs  INTEGER NOT NULL,
        session_started_at INTEGER NOT NULL,
        vcpus         INTEGER NOT NULL,
        memory_mib    INTEGER NOT NULL,
        disk_mib      INTEGER NOT NULL,
        vmm           TEXT,
        snapshot      TEXT,
        pending_op    TEXT,
        deleted_at    INTEGER
      );
      CREATE INDEX sandboxes_tenant_state ON sandboxes (tenant, state);
      CREATE INDEX sandboxes_parent ON sandboxes (parent);
      -- Fork points (RAM file + device state + frozen disk) shared within a fork tree.
      CREATE TABLE fork_points (
        id          TEXT PRIMARY KEY,
        dir         TEXT NOT NULL,
        mem_path    TEXT NOT NULL,
        -- The frozen disk layer (the parent's former top overlay, never renamed: QEMU holds it open).
        disk_path   TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        ready       INTEGER NOT NULL DEFAULT 0
      );
      -- Who depends on a fork point: a sandbox (RAM mapping or disk backing chain) or another fork
      -- point (its disk is backed by this one's). A fork point goes with its last reference.
      CREATE TABLE fork_point_refs (
        fork_point  TEXT NOT NULL,
        owner       TEXT NOT NULL,
        PRIMARY KEY (fork_point, owner)
      );
    `,
  },
  {
    version: 2,
    name: 'sandbox egress policy',
    // JSON of the sandbox's effective egress policy (src/net/policy.ts); rows from before networking read as "none".
    sql: `ALTER TABLE sandboxes ADD COLUMN egress TEXT NOT NULL DEFAULT '"none"';`,
  },
  {
    version: 3,
    name: 'why a sandbox ended',
    // Set when a sandbox ended other than by a delete (its VM died, the server found it gone at a
    // restart): requests on it say why instead of only "not found".
    sql: 'ALTER TABLE sandboxes ADD COLUMN end_reason TEXT;',
  },
  {
    version: 4,
    name: 'when a session ends',
    // The reaper's deadline (ms): session_started_at + timeout_secs at each start, moved by a lease
    // (POST /v1/sandboxes/{id}/timeout). Rows from before get the deadline they had.
    sql: `
      ALTER TABLE sandboxes ADD COLUMN session_ends_at INTEGER NOT NULL DEFAULT 0;
      UPDATE sandboxes SET session_ends_at = session_started_at + timeout_secs * 1000;
    `,
  },
  {
    version: 5,
    name: 'what a session end does',
    // The reaper's action when the session ends ('delete' or 'suspend'), chosen at create and kept
    // by forks; rows from before get the server's COLLIMATE_REAP_ACTION when the engine opens.
    // auto_resume: a request that needs the sandbox running resumes it (E2B's autoResume).
    sql: `
      ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT CHECK (on_timeout IN ('delete', 'suspend'));
      ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
    `,
  },
  {
    version: 6,
    name: 'snapshots',
    // A snapshot keeps a moment of a sandbox (src/sandboxes/snapshots.ts): a fork point it refers
    // to (fork_point_refs, owner = the snapshot's id) whose RAM image lies on disk in the fork
    // point's directory, and what a sandbox started from it gets (shape, policy, session rules).
    // state: 'creating' until its files are on disk and synced; a crash before that removes it.
    // from_snapshot: the snapshot a sandbox was started from or last rolled back to.
    sql: `
      CREATE TABLE snapshots (
        id            TEXT PRIMARY KEY,
        tenant        TEXT NOT NULL,
        name          TEXT,
        labels        TEXT NOT NULL DEFAULT '{}',
        source        TEXT NOT NULL,
        template      TEXT NOT NULL,
        fork_point    TEXT NOT NULL,
        artifact_key  TEXT NOT NULL,
        vcpus         INTEGER NOT NULL,
        memory_mib    INTEGER NOT NULL,
        disk_mib      INTEGER NOT NULL,
        egress        TEXT NOT NULL,
        on_timeout    TEXT,
        auto_resume   INTEGER NOT NULL DEFAULT 0,
        timeout_secs  INTEGER NOT NULL,
        bytes         INTEGER NOT NULL DEFAULT 0,
        created_at    INTEGER NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('creating', 'ready'))
      );
      CREATE INDEX snapshots_tenant ON snapshots (tenant, id);
      ALTER TABLE sandboxes ADD COLUMN from_snapshot TEXT;
    `,
  },
  {
    version: 7,
    name: 'snapshot environments',
    // environment: the name a snapshot is promoted under: a template id its tenant creates from
    // (each create a sandbox started from the snapshot). One snapshot per name and tenant.
    sql: `
      ALTER TABLE snapshots ADD COLUMN environment TEXT;
      CREATE UNIQUE INDEX snapshots_environment ON snapshots (tenant, environment) WHERE environment IS NOT NULL;
    `,
  },
  {
    version: 8,
    name: 'public ports and port host',
    // public_ports: the sandbox's ports answer without a key or token (E2B's allowPublicTraffic).
    // port_host: the Host header its servers see through the ports proxy, `${PORT}` replaced
    // (E2B's maskRequestHost); null is `localhost:<port>`. Kept by forks and snapshots.
    sql: `
      ALTER TABLE sandboxes ADD COLUMN public_ports INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE sandboxes ADD COLUMN port_host TEXT;
      ALTER TABLE snapshots ADD COLUMN public_ports INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE snapshots ADD COLUMN port_host TEXT;
    `,
  },
  {
    version: 9,
    name: 'snapshot copies',
    // origin: null for a snapshot taken here; for a copy pulled from another cluster host to start
    // sandboxes from (snapshotCopies.ts), that host's id. A copy is never listed nor rolled back to:
    // the snapshot is its origin's, and the copy goes when the origin no longer has it.
    sql: `
      ALTER TABLE snapshots ADD COLUMN origin TEXT;
    `,
  },
  {
    version: 21,
    name: 'suspends that keep only the files',
    // keep_memory 0: a suspend that does not say (the reaper's at the session's end among them)
    // keeps only the sandbox's disk, and its resume boots the guest afresh (suspendResume.ts).
    // Kept by forks and snapshots, for what starts from them.
    sql: `
      ALTER TABLE sandboxes ADD COLUMN keep_memory INTEGER NOT NULL DEFAULT 1;
      ALTER TABLE snapshots ADD COLUMN keep_memory INTEGER NOT NULL DEFAULT 1;
    `,
  },
];

/** Lets another subsystem append its migrations before the database is opened. */
export function registerMigrations(extra: Migration[]): void {
  for (const m of extra) {
    if (migrations.some((x) => x.version === m.version)) {
      if (migrations.find((x) => x.version === m.version)!.name !== m.name) {
        throw new Error(`migration version ${m.version} registered twice (${m.name})`);
      }
      continue;
    }
    migrations.push(m);
  }
  migrations.sort((a, b) => a.version - b.version);
}

export function openDb(path: string): Db {
  mkdirSync(dirname(path), { recursive: true });
  const db = new Database(path);
  db.pragma('journal_mode = WAL');
  // FULL: a transition acknowledged to a client must survive power loss, not just a process kill.
  db.pragma('synchronous = FULL');
  db.pragma('foreign_keys = ON');
  db.pragma('busy_timeout = 5000');
  migrate(db);
  return db;
}

function migrate(db: Db): void {
  applyMigrations(db, migrations);
}

/**
 * Applies those of `list` the database has not seen, each once, in its own transaction. Also for a
 * subsystem whose module is loaded after the database was opened.
 */
export function applyMigrations(db: Db, list: readonly Migration[]): void {
  db.exec(`CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`);
  const applied = new Set(db.prepare('SELECT version FROM schema_migrations').all().map((r: any) => r.version as number));
  for (const m of [...list].sort((a, b) => a.version - b.version)) {
    if (applied.has(m.version)) continue;
    db.transaction(() => {
      db.exec(m.sql);
      db.prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)').run(m.version, m.name, Date.now());
    })();
  }
}
