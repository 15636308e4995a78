import { mkdirSync, rmSync, statSync, openSync, fsyncSync, closeSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { invalidState, sandboxNotFound } from '../errors.js';
import { vmmFiles } from '../vmm/machine.js';
import { spawnIncoming, restoreStream, finishRestore, type LiveVm, type PendingVm } from './runtime.js';
import type { Running } from './registry.js';
import { Phases } from './phases.js';
import { dirs, getInfo, isUnacknowledgedRestore, rowFor, runningFor, shapeOf, trustedLayers, vmmFailure, type EngineContext } from './context.js';
import type { SandboxInfo, Scope } from './types.js';

/**
 * Suspend writes a running sandbox's full state (RAM included) to `<sandbox dir>/suspend/state.mig`
 * and stops its VMM; resume streams it into a new VMM. A suspended sandbox holds no VMM, RAM file
 * or network namespace.
 */

export async function suspendSandbox(ctx: EngineContext, id: string, scope?: Scope): Promise<SandboxInfo> {
  ctx.assertOpen();
  const r = runningFor(ctx, id, scope, 'suspend');
  return r.queue.run(async () => {
    if (r.deleting) throw sandboxNotFound(id);
    ctx.registry.flushActivity();
    return ctx.registry.serialized(id, () => suspendRunning(ctx, r));
  });
}

async function suspendRunning(ctx: EngineContext, r: Running): Promise<SandboxInfo> {
  const snapDir = join(dirs(ctx.cfg).sandboxes, r.id, 'suspend');
  mkdirSync(snapDir, { recursive: true });
  const statePath = join(snapDir, 'state.mig');
  ctx.repo.update(r.id, { pending_op: { op: 'suspend', startedAt: Date.now() } });
  const vmm = r.live.vmm;
  const phases = new Phases('suspend');
  try {
    await ctx.fault('suspend:before-save');
    await phases.time('save', () => vmm.saveFullState(statePath, vmmFiles(r.live.record.dir).migrationSocket));
    const t0 = performance.now();
    const fd = openSync(statePath, 'r');
    fsyncSync(fd);
    closeSync(fd);
    phases.since('fsync', t0);
    writeFileSync(join(snapDir, 'complete'), '');
    await ctx.fault('suspend:after-save');
  } catch (e) {
    await vmm.cont().catch(() => {});
    rmSync(snapDir, { recursive: true, force: true });
    ctx.repo.update(r.id, { pending_op: null });
    throw vmmFailure('suspend', e);
  }
  const bytes = statSync(statePath).size;
  // Persisted before the VMM goes: a crash from here on finds a complete snapshot and a dead or
  // stopped VMM, and finishes the suspend.
  ctx.repo.update(r.id, { state: 'suspended', snapshot: { statePath, bytes, suspendedAt: Date.now() }, pending_op: null });
  ctx.registry.remove(r.id);
  r.live.agent.close();
  await phases.time('teardown', () => vmm.kill());
  if (r.live.record.memPath.startsWith(ctx.cfg.ramDir) && ownsMemFile(r.live.record.memPath, r.id)) rmSync(r.live.record.memPath, { force: true });
  ctx.emit('transition', { id: r.id, tenant: ctx.repo.get(r.id)!.tenant, state: 'suspended', op: 'suspend', snapshotBytes: bytes });
  ctx.emit('phases', phases.report(r.id));
  return getInfo(ctx, r.id);
}

export async function resumeSandbox(ctx: EngineContext, id: string, scope?: Scope): Promise<SandboxInfo> {
  ctx.assertOpen();
  const row = rowFor(ctx, id, scope);
  if (row.state !== 'suspended') throw invalidState(id, row.state === 'running' ? 'running' : row.state, 'resume', ['suspended']);
  return ctx.registry.serialized(id, async () => {
    const cur = ctx.repo.get(id)!;
    if (cur.state !== 'suspended') throw invalidState(id, cur.state, 'resume', ['suspended']);
    const snap = cur.snapshot!;
    const rec = cur.vmm!;
    const shape = shapeOf(ctx, cur);
    // A resumed sandbox owns its RAM outright (the stream carries every page). Mapped share=on:
    // share=off over an empty tmpfs file would cost each page twice (a zero page in the file,
    // then the private copy), and the VMM's memory limit counts both.
    const memPath = join(ctx.cfg.ramDir, `${id}.mem`);
    const phases = new Phases('resume');
    const restoreOnce = async (): Promise<LiveVm> => {
      let pending: PendingVm | undefined;
      try {
        rmSync(join(rec.dir, 'qmp.sock'), { force: true });
        pending = await phases.time('spawn', () => spawnIncoming(ctx.cfg, shape, {
          id, dir: rec.dir, memPath, memShared: true, backing: null, diskPath: ctx.repo.get(id)!.vmm!.diskPath, artifactKey: rec.artifactKey,
          trustedLayers: trustedLayers(ctx, id, rec.artifactKey), network: true,
        }));
        const net = pending.record.net;
        if (net) await phases.time('egress_apply', () => ctx.net!.apply(net, cur.egress));
        await restoreStream(pending, snap.statePath, phases);
        return await finishRestore(pending, id, phases);
      } catch (e) {
        if (pending) await pending.vmm.kill().catch(() => {});
        rmSync(memPath, { force: true });
        throw e;
      }
    };
    let live: LiveVm;
    try {
      // A guest that never acknowledges its restore gets one fresh VMM (counted in restoreCounts);
      // the snapshot on disk is untouched by a failed attempt.
      live = await restoreOnce().catch((e) => {
        if (!isUnacknowledgedRestore(e)) throw e;
        return restoreOnce();
      });
    } catch (e) {
      throw vmmFailure('resume', e);
    }
    const now = Date.now();
    ctx.repo.update(id, { state: 'running', vmm: live.record, snapshot: null, pending_op: null, session_started_at: now, last_active: now });
    ctx.registry.add(id, live);
    rmSync(join(rec.dir, 'suspend'), { recursive: true, force: true });
    ctx.emit('transition', { id, tenant: cur.tenant, state: 'running', op: 'resume' });
    ctx.emit('phases', phases.report(id));
    return getInfo(ctx, id);
  });
}

/** Whether `memPath` is the sandbox's own RAM file (a resumed one's), not a checkpoint or fork point it maps. */
function ownsMemFile(memPath: string, id: string): boolean {
  return memPath.endsWith(`/${id}.mem`);
}
