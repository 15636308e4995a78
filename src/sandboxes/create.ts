import { policyKey, type EgressPolicy } from '../net/policy.js';
import type { ReadyTemplate } from '../images/templates.js';
import { claimWarm, destroyPending, restoreCheckpoint, type LiveVm } from './runtime.js';
import { toInfo, type SandboxRow } from './repo.js';
import { Phases } from './phases.js';
import { isUnacknowledgedRestore, vmmFailure, type EngineContext } from './context.js';
import type { CreateOptions, SandboxInfo, Scope } from './types.js';

/**
 * A new sandbox from a template: a VMM from the template's warm pool is restored from its
 * checkpoint (or, prewarmed, resumed) and given a fresh identity. The row is written once the
 * guest answers.
 */
export async function createSandbox(ctx: EngineContext, opts: CreateOptions, scope: Scope): Promise<SandboxInfo> {
  ctx.assertOpen();
  const t = ctx.templates.resolve(opts.template, scope.tenant);
  const egress = egressOf(ctx, t, opts.egress);
  return ctx.capacity.within('create', { vmms: 1, memoryMib: t.artifact.shape.memoryMib }, () =>
    // A guest that never acknowledges its restore (see announceRestore) gets one fresh VMM.
    createOnce(ctx, t, opts, egress, scope).catch((e) => {
      if (!isUnacknowledgedRestore(e)) throw e;
      return createOnce(ctx, t, opts, egress, scope);
    }));
}

/** The caller's policy (the tenant service checked it against the template's), else the template's; none without a network. */
function egressOf(ctx: EngineContext, t: ReadyTemplate, asked: EgressPolicy | undefined): EgressPolicy {
  if (!ctx.templates.hasNetwork(t)) return 'none';
  return asked ?? t.egress;
}

async function createOnce(ctx: EngineContext, t: ReadyTemplate, opts: CreateOptions, egress: EgressPolicy, scope: Scope): Promise<SandboxInfo> {
  const phases = new Phases('create');
  // A pool that is empty spawns on demand: its failure is the VMM's (502), never an internal error.
  const pending = await phases.time('pool_take', () => ctx.templates.take(t)).catch((e) => { throw vmmFailure('create', e); });
  let live: LiveVm | undefined;
  try {
    // The pool's VMM runs under the template's policy; another is applied before the guest wakes.
    if (pending.record.net && policyKey(egress) !== policyKey(t.egress)) await phases.time('egress_apply', () => ctx.net!.apply(pending.record.net!, egress));
    live = pending.warm ? await claimWarm(pending.warm, pending.id, phases) : await restoreCheckpoint(pending, t.deviceState, pending.id, phases);
    const now = Date.now();
    const timeoutSecs = opts.timeoutSecs ?? ctx.cfg.defaultSessionSecs;
    const row: SandboxRow = {
      id: pending.id, tenant: scope.tenant, template: t.id, state: 'running', labels: opts.labels ?? {},
      created_at: now, last_active: now, exec_count: 0, parent: null, forked_at: null,
      timeout_secs: timeoutSecs, session_started_at: now, session_ends_at: now + timeoutSecs * 1000,
      vcpus: t.artifact.shape.vcpus, memory_mib: t.artifact.shape.memoryMib, disk_mib: t.artifact.diskMib,
      egress, vmm: live.record, snapshot: null, pending_op: null,
      on_timeout: opts.onTimeout ?? ctx.cfg.reapAction, auto_resume: opts.autoResume ? 1 : 0, keep_memory: opts.keepMemory === false ? 0 : 1,
      public_ports: opts.publicPorts ? 1 : 0, port_host: opts.portHost ?? null,
    };
    ctx.repo.insert(row);
    ctx.registry.add(row.id, live);
    ctx.emit('transition', { id: row.id, tenant: row.tenant, state: 'running', op: 'create' });
    ctx.emit('phases', phases.report(row.id));
    return toInfo(row, []);
  } catch (e) {
    live?.agent.close();
    await destroyPending(pending).catch(() => {});
    throw vmmFailure('create', e);
  }
}
