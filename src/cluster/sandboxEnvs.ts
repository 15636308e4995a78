/**
 * E2B sandboxes' envVars in the cluster database (src/e2b/sandboxEnv.ts SandboxEnvs): any host may
 * start a command in any sandbox, so every host reads them from here. A row goes with its sandbox's
 * deletion (the host that ran it forgets it on the transition).
 */
import type pg from 'pg';
import type { SandboxEnvs } from '../e2b/sandboxEnv.js';
import { clusterQuery } from './db.js';

export class ClusterSandboxEnvs implements SandboxEnvs {
  constructor(private readonly pool: pg.Pool) {}

  async get(sandbox: string): Promise<Record<string, string>> {
    const r = await clusterQuery<{ env: string }>(this.pool, 'SELECT env FROM e2b_sandbox_env WHERE sandbox = $1', [sandbox]);
    return r.rows[0] ? (JSON.parse(r.rows[0].env) as Record<string, string>) : {};
  }

  async set(sandbox: string, env: Record<string, string>): Promise<void> {
    if (Object.keys(env).length === 0) return this.forget(sandbox);
    await clusterQuery(this.pool, 'INSERT INTO e2b_sandbox_env (sandbox, env) VALUES ($1, $2) ON CONFLICT (sandbox) DO UPDATE SET env = EXCLUDED.env', [sandbox, JSON.stringify(env)]);
  }

  async forget(sandbox: string): Promise<void> {
    await clusterQuery(this.pool, 'DELETE FROM e2b_sandbox_env WHERE sandbox = $1', [sandbox]);
  }
}
