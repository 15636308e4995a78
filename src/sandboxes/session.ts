import { invalidState } from '../errors.js';
import { getInfo, rowFor, type EngineContext } from './context.js';
import type { SandboxInfo, Scope } from './types.js';

/**
 * A sandbox's session: from a start (create, fork, resume) to `session_ends_at`, when the reaper
 * (reaper.ts) suspends or deletes it. Each start sets the end `timeout_secs` ahead; a lease moves it.
 */

/**
 * Sets when a running sandbox's session ends (a lease: earlier or later than before), persisted at
 * once so a restarted server's reaper keeps it. Not while suspended (its session ended; a resume
 * starts a new one) or being deleted.
 */
export function setSessionEnd(ctx: EngineContext, id: string, endsAtMs: number, scope?: Scope): SandboxInfo {
  ctx.assertOpen();
  const row = rowFor(ctx, id, scope);
  if (row.state !== 'running' || ctx.registry.get(id)?.deleting) {
    throw invalidState(id, row.state === 'running' ? 'being deleted' : row.state, 'setting its timeout', ['running']);
  }
  ctx.repo.update(id, { session_ends_at: endsAtMs });
  return getInfo(ctx, id);
}
