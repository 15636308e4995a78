import { CollimateError, invalidState } from '../errors.js';
import type { EgressPolicy } from '../net/policy.js';
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

/**
 * Replaces a sandbox's egress policy (already decided by the caller: never wider than its
 * template's). A running sandbox's firewall changes at once; a suspended one's applies when it
 * resumes. A sandbox without a network can only be given "none".
 */
export async function setEgress(ctx: EngineContext, id: string, egress: EgressPolicy, scope?: Scope): Promise<SandboxInfo> {
  ctx.assertOpen();
  const row = rowFor(ctx, id, scope);
  const r = ctx.registry.get(id);
  if (r?.deleting || (row.state !== 'running' && row.state !== 'suspended')) {
    throw invalidState(id, r?.deleting ? 'being deleted' : row.state, 'changing its egress', ['running', 'suspended']);
  }
  if (row.state === 'running') {
    if (!r) throw invalidState(id, 'busy', 'changing its egress', ['running']);
    const net = r.live.record.net;
    if (!net || !ctx.net) {
      if (egress !== 'none') throw new CollimateError('network_unavailable', `Sandbox ${id} has no network, so its egress can only be "none".`);
    } else {
      await ctx.net.apply(net, egress);
    }
  }
  ctx.repo.update(id, { egress });
  return getInfo(ctx, id);
}
