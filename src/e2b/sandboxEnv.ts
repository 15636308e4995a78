/**
 * What an E2B sandbox carries that Collimate's own sandboxes do not: the environment variables given
 * at create (`envVars`), which envd applies to every command it starts. Kept in the server's
 * database (migration 13) so they survive a restart; a fork through the E2B front door copies them
 * to the children. Rows of deleted sandboxes are removed with them (`forget`). A snapshot taken
 * through the door keeps its sandbox's under the snapshot's id, for the sandboxes started from it;
 * that row goes with the snapshot, whichever door deletes it (the engine's `snapshotDeleted`).
 */
import type { Db } from '../store/db.js';
import { applyMigrations, registerMigrations, type Migration } from '../store/db.js';

export const E2B_MIGRATIONS: Migration[] = [
  {
    version: 13,
    name: 'e2b_sandbox_env',
    sql: `
      CREATE TABLE e2b_sandbox_env (
        sandbox  TEXT PRIMARY KEY,
        env      TEXT NOT NULL
      );
    `,
  },
];

registerMigrations(E2B_MIGRATIONS);

/** At most this many variables, each name and value bounded, so a create cannot store megabytes. */
export const MAX_ENV_VARS = 256;
const NAME_RE = /^[A-Za-z_][A-Za-z0-9_]{0,255}$/;
const MAX_VALUE = 32 * 1024;

/** Null when valid, else a message saying what to fix. */
export function envVarsProblem(env: unknown): string | null {
  if (env === undefined || env === null) return null;
  if (typeof env !== 'object' || Array.isArray(env)) return 'envVars must be an object of name → value strings.';
  const entries = Object.entries(env as Record<string, unknown>);
  if (entries.length > MAX_ENV_VARS) return `envVars has ${entries.length} variables; at most ${MAX_ENV_VARS}.`;
  for (const [k, v] of entries) {
    if (!NAME_RE.test(k)) return `envVars name ${JSON.stringify(k.slice(0, 64))} is not a valid variable name (${NAME_RE.source}).`;
    if (typeof v !== 'string') return `envVars.${k} must be a string.`;
    if (v.length > MAX_VALUE || v.includes('\0')) return `envVars.${k} must be at most ${MAX_VALUE} characters, without NUL.`;
  }
  return null;
}

/**
 * Where E2B sandboxes' envVars are kept: this server's database (SandboxEnvStore), or on a cluster
 * host the cluster's (src/cluster/sandboxEnvs.ts), since any host may start a command in a sandbox.
 */
export interface SandboxEnvs {
  get(sandbox: string): Record<string, string> | Promise<Record<string, string>>;
  set(sandbox: string, env: Record<string, string>): void | Promise<void>;
  forget(sandbox: string): void | Promise<void>;
}

export class SandboxEnvStore implements SandboxEnvs {
  constructor(private readonly db: Db) {
    applyMigrations(db, E2B_MIGRATIONS);
  }

  get(sandbox: string): Record<string, string> {
    const row = this.db.prepare('SELECT env FROM e2b_sandbox_env WHERE sandbox = ?').get(sandbox) as { env: string } | undefined;
    return row ? (JSON.parse(row.env) as Record<string, string>) : {};
  }

  set(sandbox: string, env: Record<string, string>): void {
    if (Object.keys(env).length === 0) return this.forget(sandbox);
    this.db.prepare('INSERT INTO e2b_sandbox_env (sandbox, env) VALUES (?, ?) ON CONFLICT (sandbox) DO UPDATE SET env = excluded.env').run(sandbox, JSON.stringify(env));
  }

  forget(sandbox: string): void {
    this.db.prepare('DELETE FROM e2b_sandbox_env WHERE sandbox = ?').run(sandbox);
  }
}
