import { mkdirSync, rmSync, renameSync, statSync, openSync, closeSync, writeFileSync, readFileSync, existsSync, truncateSync, linkSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fsyncFile } from '../host/fsync.js';
import { performance } from 'node:perf_hooks';
import { invalidState } from '../errors.js';
import { allocatedBytes, copyPrivatePages, fillFromImage, seedFromBacking } from '../vmm/memory.js';
import { spliceDeviceState } from '../vmm/deviceState.js';
import { spawnIncoming, restoreStream, restoreCheckpoint, finishRestore, finishBoot, destroyPending, newForkPointId, type LiveVm, type PendingVm } from './runtime.js';
import type { SandboxRow, SnapshotRecord } from './repo.js';
import { attachDisk, attachMemory } from './forkReceivers.js';
import { backingChain, sealShared } from '../vmm/jail.js';
import type { Running } from './registry.js';
import type { AgentClient } from '../guest/agentClient.js';
import { gcForkPoints } from './delete.js';
import { Phases } from './phases.js';
import { recordForkPoint, type ForkPoint } from './fork.js';
import { gone, dirs, getInfo, isUnacknowledgedRestore, pooledVmmDir, rowFor, runningFor, shapeOf, trustedLayers, vmmFailure, type EngineContext } from './context.js';
import type { SandboxInfo, Scope, SuspendOptions } from './types.js';

/**
 * Suspend writes a running sandbox's state to `<sandbox dir>/suspend/`: its RAM as a sparse image
 * (`ram.img`: the file its RAM maps, copied with its holes, and the pages it wrote since, copied
 * over — vm/memory.ts, as a fork point is made) and its devices without RAM (`device.state`), and
 * stops its VMM. Resume restores the devices into a VMM spawned ahead for the template when there is
 * one (resumeOnReceiver: the image, where it lies, becomes a fork point of the sandbox's own, mapped
 * copy-on-write like a fork child's RAM), else copies the image into a RAM file of the sandbox's own
 * on tmpfs while a new VMM starts on it, mapped shared. No migration stream: the cost follows the memory the
 * guest holds, and no byte of it passes through QEMU's single migration thread or through Node. A
 * suspended sandbox holds no VMM, RAM file or network namespace. (Snapshots made before RAM images,
 * one migration stream `state.mig`, still resume and fork.)
 */

/**
 * Where a suspend writes, and what it wrote once `complete` exists. `diskOnly` marks a suspend that
 * kept only the files (`keep_memory: false`): nothing else is written; the disk is the sandbox's own.
 */
export function snapshotFiles(snapDir: string): { statePath: string; ramPath: string; complete: string; legacyStream: string; diskOnly: string } {
  return {
    statePath: join(snapDir, 'device.state'), ramPath: join(snapDir, 'ram.img'), complete: join(snapDir, 'complete'), legacyStream: join(snapDir, 'state.mig'),
    diskOnly: join(snapDir, 'disk-only'),
  };
}

/** The record of a complete snapshot in `snapDir` (any format); its bytes are what it occupies on disk. */
export function snapshotRecord(snapDir: string, suspendedAt = Date.now()): SnapshotRecord {
  const f = snapshotFiles(snapDir);
  if (existsSync(f.diskOnly)) return { statePath: f.statePath, diskOnly: true, bytes: 0, suspendedAt };
  if (existsSync(f.ramPath)) return { statePath: f.statePath, ramPath: f.ramPath, bytes: allocatedBytes(f.ramPath) + statSync(f.statePath).size, suspendedAt };
  return { statePath: f.legacyStream, bytes: statSync(f.legacyStream).size, suspendedAt };
}

export async function suspendSandbox(ctx: EngineContext, id: string, scope?: Scope, opts: SuspendOptions = {}): Promise<SandboxInfo> {
  ctx.assertOpen();
  const r = runningFor(ctx, id, scope, 'suspend');
  const row = ctx.repo.get(id)!;
  const keepMemory = opts.keepMemory ?? row.keep_memory !== 0;
  // Its RAM image goes to disk: at most the guest's memory (nothing, keeping only the files).
  return ctx.capacity.within('suspend', { vmms: 0, memoryMib: 0, diskMib: keepMemory ? row.memory_mib : 0 }, () => r.queue.run(async () => {
    if (r.deleting) throw gone(r);
    ctx.registry.flushActivity();
    return ctx.registry.serialized(id, () => keepMemory ? suspendRunning(ctx, r) : suspendDiskOnly(ctx, r));
  }));
}

/**
 * A suspend that keeps only the files (`keep_memory: false`): the guest's processes are stopped
 * (SIGSTOP to all but the agent) so that nothing writes after the guest writes out what it has
 * cached (`sync`); then the VMM stops (QEMU drains and flushes the disk as it does) and goes. The
 * writable layer's ext4 has no journal: a write cut off halfway could leave it inconsistent, and
 * stopped writers make none. Nothing but a marker is written: the sandbox's own disk is what a
 * resume boots from (resumeSandbox). Its processes end, as lost, here: the guest that ran them is gone.
 */
async function suspendDiskOnly(ctx: EngineContext, r: Running): Promise<SandboxInfo> {
  const snapDir = join(dirs(ctx.cfg).sandboxes, r.id, 'suspend');
  mkdirSync(snapDir, { recursive: true });
  const files = snapshotFiles(snapDir);
  ctx.repo.update(r.id, { pending_op: { op: 'suspend', diskOnly: true, startedAt: Date.now() } });
  const vmm = r.live.vmm;
  const phases = new Phases('suspend');
  let frozen = false;
  let stopped = false;
  try {
    await ctx.fault('suspend:before-save');
    await phases.time('guest_sync', async () => {
      frozen = true;
      // `kill -1` spares the caller and init (the agent); this shell then writes out the page cache.
      const out = await guestShell(r.live.agent, 'kill -s STOP -1 2>/dev/null; sync');
      if (out.result.exitCode !== 0) throw new Error(`sync in the guest exited with ${out.result.exitCode}: ${out.stderr.toString().trim()}`);
    });
    await phases.time('stop', () => vmm.qmp.execute('stop'));
    stopped = true;
    writeFileSync(files.diskOnly, '');
    writeFileSync(files.complete, '');
    await ctx.fault('suspend:after-save');
  } catch (e) {
    if (stopped) await vmm.cont().catch(() => {});
    // It runs on: its processes too.
    if (frozen) await continueGuestProcesses(r.live.agent);
    rmSync(snapDir, { recursive: true, force: true });
    ctx.repo.update(r.id, { pending_op: null });
    throw vmmFailure('suspend', e, r);
  }
  return recordSuspended(ctx, r, snapDir, phases);
}

/** Undoes the SIGSTOP of a suspend that kept only the files and did not happen (here, or cut off by a crash: reconcile.ts). */
export async function continueGuestProcesses(agent: Pick<AgentClient, 'exec'>): Promise<void> {
  await guestShell(agent, 'kill -s CONT -1 2>/dev/null; true').catch(() => {});
}

/** One shell command in the guest, as root, for the suspend's own use (a minute, and half more for the answer). */
function guestShell(agent: Pick<AgentClient, 'exec'>, script: string) {
  return agent.exec({ commands: [['/bin/sh', '-c', script]], timeoutMs: 60_000 }, { timeoutMs: 90_000 });
}

async function suspendRunning(ctx: EngineContext, r: Running): Promise<SandboxInfo> {
  const snapDir = join(dirs(ctx.cfg).sandboxes, r.id, 'suspend');
  mkdirSync(snapDir, { recursive: true });
  const files = snapshotFiles(snapDir);
  ctx.repo.update(r.id, { pending_op: { op: 'suspend', startedAt: Date.now() } });
  const vmm = r.live.vmm;
  const rec = r.live.record;
  const memBytes = shapeOf(ctx, ctx.repo.get(r.id)!).memoryMib * 1024 * 1024;
  const phases = new Phases('suspend');
  let stopped = false;
  try {
    await ctx.fault('suspend:before-save');
    await phases.time('stop', () => vmm.qmp.execute('stop'));
    stopped = true;
    const devices = await phases.time('device_state_save', () => vmm.saveDevicesOnly());
    writeFileSync(files.statePath, spliceDeviceState(readFileSync(ctx.templates.artifactFor(rec.artifactKey).devStatePath), devices));
    // The RAM: the file it maps (its own, or the checkpoint / fork point it is copy-on-write over)
    // and, over the latter, the pages it wrote.
    const t0 = performance.now();
    await seedFromBacking(rec.memPath, files.ramPath, memBytes);
    if (!rec.memShared) await copyPrivatePages(vmm.pid, rec.memPath, files.ramPath, ctx.cfg.cacheDir);
    phases.since('memory_save', t0);
    await phases.time('fsync', () => Promise.all([fsyncFile(files.ramPath), fsyncFile(files.statePath)]));
    writeFileSync(files.complete, '');
    await ctx.fault('suspend:after-save');
  } catch (e) {
    if (stopped) await vmm.cont().catch(() => {});
    rmSync(snapDir, { recursive: true, force: true });
    ctx.repo.update(r.id, { pending_op: null });
    throw vmmFailure('suspend', e, r);
  }
  return recordSuspended(ctx, r, snapDir, phases);
}

/** Records a suspend whose snapshot is complete in `snapDir`, then stops the VMM and frees what it held. */
async function recordSuspended(ctx: EngineContext, r: Running, snapDir: string, phases: Phases): Promise<SandboxInfo> {
  const { vmm, record: rec } = r.live;
  const snapshot = snapshotRecord(snapDir);
  // Persisted before the VMM goes: a crash from here on finds a complete snapshot and a dead or
  // stopped VMM, and finishes the suspend.
  ctx.repo.update(r.id, { state: 'suspended', snapshot, pending_op: null });
  await ctx.fault('suspend:recorded');
  ctx.registry.remove(r.id);
  // Its processes' records and output stay (by sandbox id) for the resume, which learns them again;
  // a suspend that kept only the files ends them (lost): the guest that ran them is gone.
  if (snapshot.diskOnly) ctx.processes.of(r.id).close();
  else ctx.processes.of(r.id).detach();
  r.live.agent.close();
  await phases.time('teardown', () => vmm.kill());
  if (rec.memPath.startsWith(ctx.cfg.ramDir) && ownsMemFile(rec.memPath, r.id)) rmSync(rec.memPath, { force: true });
  // A VMM taken from a pool (a resume on a receiver) ran in a directory of its own: it goes with it.
  const pooled = pooledVmmDir(ctx.cfg, r.id, rec);
  if (pooled) rmSync(pooled, { recursive: true, force: true });
  // The fork point whose RAM it mapped may be mapped by nobody now.
  gcForkPoints(ctx);
  ctx.emit('transition', { id: r.id, tenant: ctx.repo.get(r.id)!.tenant, state: 'suspended', op: 'suspend', snapshotBytes: snapshot.bytes });
  ctx.emit('phases', phases.report(r.id));
  return getInfo(ctx, r.id);
}

/** `op`: what the transition it emits says (a rollback resumes the sandbox from its snapshot: restore). */
export async function resumeSandbox(ctx: EngineContext, id: string, scope?: Scope, op: 'resume' | 'restore' = 'resume'): Promise<SandboxInfo> {
  ctx.assertOpen();
  const row = rowFor(ctx, id, scope);
  if (row.state !== 'suspended') throw invalidState(id, row.state === 'running' ? 'running' : row.state, 'resume', ['suspended']);
  return ctx.capacity.within('resume', { vmms: 1, memoryMib: row.memory_mib, tmpfsMib: row.memory_mib }, () => ctx.registry.serialized(id, async () => {
    // Deleted while this waited: not found, as for any later call.
    const cur = rowFor(ctx, id, scope);
    if (cur.state !== 'suspended') throw invalidState(id, cur.state, 'resume', ['suspended']);
    const snap = cur.snapshot!;
    const rec = cur.vmm!;
    const shape = shapeOf(ctx, cur);
    // A resumed sandbox owns its RAM outright: a file of its own, mapped share=on (share=off over
    // it would cost each page it writes twice, and the VMM's memory limit counts both).
    const memPath = join(ctx.cfg.ramDir, `${id}.mem`);
    const memBytes = shape.memoryMib * 1024 * 1024;
    const phases = new Phases('resume');
    const restoreOnce = async (): Promise<LiveVm> => {
      let pending: PendingVm | undefined;
      try {
        // In the sandbox's own directory (where a VMM last taken from a pool did not run).
        const dir = join(dirs(ctx.cfg).sandboxes, id);
        rmSync(join(dir, 'qmp.sock'), { force: true });
        // The VMM, with its egress policy in place (kept in `pending` for the cleanup below).
        const start = async (): Promise<PendingVm> => {
          pending = await phases.time('spawn', () => spawnIncoming(ctx.cfg, shape, {
            id, dir, memPath, memShared: true, backing: null, diskPath: ctx.repo.get(id)!.vmm!.diskPath, artifactKey: rec.artifactKey,
            trustedLayers: trustedLayers(ctx, id, rec.artifactKey), network: true, phases, boot: snap.diskOnly,
            whileStarting: async (net) => {
              await ctx.fault('resume:vmm-starting');
              await phases.time('egress_apply', () => ctx.net!.apply(net, cur.egress));
            },
          }));
          return pending;
        };
        /** A RAM file of its own, empty, with the guest's size before its VMM maps it. */
        const freshRamFile = () => {
          rmSync(memPath, { force: true });
          closeSync(openSync(memPath, 'w', 0o600));
          truncateSync(memPath, memBytes);
        };
        if (snap.diskOnly) {
          // Only the files were kept: the guest boots afresh on its disk, in RAM of its own.
          freshRamFile();
          return await finishBoot(await start(), id, phases);
        }
        if (snap.ramPath) {
          // The VMM starts while its RAM file fills: QEMU maps the file at start but reads no page
          // of it before the devices are restored. The file has its size before either begins.
          freshRamFile();
          // Both settle before either's failure counts: a VMM still starting when the fill failed
          // would otherwise be left running, with nothing that would stop it.
          const [vm, fill] = await Promise.allSettled([start(), phases.time('memory_load', () => fillFromImage(snap.ramPath!, memPath, ctx.cfg.cacheDir))]);
          if (vm.status === 'rejected') throw vm.reason;
          if (fill.status === 'rejected') throw fill.reason;
          return await restoreCheckpoint(vm.value, readFileSync(snap.statePath), id, phases);
        }
        const vm = await start();
        await restoreStream(vm, snap.statePath, phases);
        return await finishRestore(vm, id, phases);
      } catch (e) {
        if (pending) await pending.vmm.kill().catch(() => {});
        rmSync(memPath, { force: true });
        throw e;
      }
    };
    let live: LiveVm;
    let onReceiver: ForkPoint | null = null;
    try {
      // A guest that never acknowledges its restore gets one fresh VMM (counted in restoreCounts);
      // the snapshot on disk is untouched by a failed attempt.
      const first = await resumeOnReceiver(ctx, cur, snap, phases).catch((e) => {
        if (!isUnacknowledgedRestore(e)) throw e;
        return null;
      });
      if (first) [live, onReceiver] = [first.live, first.fp];
      else {
        live = await restoreOnce().catch((e) => {
          if (!isUnacknowledgedRestore(e)) throw e;
          return restoreOnce();
        });
      }
    } catch (e) {
      throw vmmFailure('resume', e);
    }
    await ctx.fault('resume:vmm-started');
    const t0 = performance.now();
    const now = Date.now();
    ctx.repo.tx(() => {
      // On a receiver the sandbox became a child of its own snapshot: the fork point holds the RAM
      // it maps and the disk layer under its new top layer, and the sandbox's ancestors.
      if (onReceiver) {
        recordForkPoint(ctx, onReceiver, id);
        ctx.repo.markForkPointReady(onReceiver.id);
      }
      // A new session of the sandbox's timeout_secs: a lease set before the suspend ended with it.
      ctx.repo.update(id, { state: 'running', vmm: live.record, snapshot: null, pending_op: null, session_started_at: now, session_ends_at: now + cur.timeout_secs * 1000, last_active: now });
    });
    ctx.registry.add(id, live);
    phases.since('commit', t0);
    // Where its image lay: `suspend`, or the directory a rollback (snapshots.ts) made.
    removeAfterwards(ctx, dirname(snap.statePath));
    // Resumes, like forks, keep VMMs spawned ahead for the template (forkReceivers.ts).
    if (ctx.cfg.resumeOnReceivers) void ctx.receivers.forked(rec.artifactKey, 1, cur.egress);
    ctx.emit('transition', { id, tenant: cur.tenant, state: 'running', op });
    ctx.emit('phases', phases.report(id));
    return getInfo(ctx, id);
  }));
}

/**
 * A resume on a receiver opens the sandbox's disk chain on its path (QEMU adds the layers as the
 * receiver's backing, and activates them at the restore); a VMM spawned for the resume opens it
 * while the image is copied beside it. A chain grows by a layer at each fork (and each resume on a
 * receiver): measured on a parent forked ~50 times, a resume on a receiver took 275 ms p50 (148 of
 * them adding the chain), where the spawn took ~210 ms; on a chain of a few layers 117 ms against
 * ~210. Past this many layers a resume spawns its VMM.
 */
const MAX_RESUME_LAYERS = 32;

/**
 * A resume on a VMM spawned ahead for the sandbox's template (a fork receiver, forkReceivers.ts),
 * when one is ready: the sandbox becomes a child of its own snapshot, as a fork child of a fork
 * point. Its RAM image becomes that fork point's RAM file where it lies, on disk (a second link
 * to it: the snapshot directory still goes after the resume) and is mapped over the receiver's
 * guest RAM copy-on-write, as every fork child's; the receiver's disk is put on the sandbox's disk,
 * frozen as the fork point's layer under an empty top layer; the devices are restored. Neither
 * QEMU's start (~140 ms under TCG) nor a copy of the image (~100 ms) is on the resume's path, and the
 * guest's pages are read from the image as it touches them. Null when no receiver is ready (or the
 * disk has many layers already): the caller spawns a VMM.
 *
 * Nothing is recorded until the caller commits: a failure or a crash before that leaves the
 * snapshot and the sandbox's disk as they were (the disk is only read), and reconcile removes the
 * receiver and the unrecorded fork point's directory.
 */
async function resumeOnReceiver(ctx: EngineContext, row: SandboxRow, snap: SnapshotRecord, phases: Phases): Promise<{ live: LiveVm; fp: ForkPoint } | null> {
  const rec = row.vmm!;
  if (!ctx.cfg.resumeOnReceivers || !snap.ramPath) return null;
  if (backingChain(rec.diskPath).length > MAX_RESUME_LAYERS) return null;
  const fpId = newForkPointId();
  const fp: ForkPoint = { id: fpId, dir: join(dirs(ctx.cfg).forkpoints, fpId), mem: join(dirs(ctx.cfg).forkpoints, fpId, 'ram.img'), disk: rec.diskPath };
  mkdirSync(fp.dir, { recursive: true });
  try {
    linkSync(snap.ramPath, fp.mem);
  } catch {
    // Snapshots on another file system than the fork points: the VMM is spawned.
    rmSync(fp.dir, { recursive: true, force: true });
    return null;
  }
  const [p] = ctx.receivers.take(rec.artifactKey, 1);
  if (!p) {
    rmSync(fp.dir, { recursive: true, force: true });
    return null;
  }
  try {
    // The disk the sandbox had is a read-only layer from now on, shared like a fork point's.
    sealShared(fp.disk);
    await phases.time('claim', () => Promise.all([
      attachDisk(ctx.cfg, p, fp, [...trustedLayers(ctx, row.id, rec.artifactKey), fp.disk]),
      p.record.net ? ctx.net!.apply(p.record.net, row.egress) : null,
    ]));
    await phases.time('memory_remap', () => attachMemory(p, fp.mem));
    return { live: await restoreCheckpoint(p, readFileSync(snap.statePath), row.id, phases), fp };
  } catch (e) {
    await destroyPending(p).catch(() => {});
    rmSync(p.record.diskPath, { force: true });
    rmSync(fp.dir, { recursive: true, force: true });
    throw e;
  }
}

/**
 * Removes a resumed sandbox's snapshot once the resume has answered: unlinking an image of hundreds
 * of megabytes on disk took 75–175 ms, a third of a resume. Renamed aside at once (a later suspend
 * makes a new `suspend`); one left by a crash is removed by reconcile (`SNAPSHOT_REMOVED`).
 */
export function removeAfterwards(ctx: EngineContext, snapDir: string): void {
  const aside = `${snapDir}${SNAPSHOT_REMOVED}${Date.now()}`;
  try {
    renameSync(snapDir, aside);
  } catch {
    rmSync(snapDir, { recursive: true, force: true });
    return;
  }
  const removal: Promise<void> = rm(aside, { recursive: true, force: true })
    .catch((e) => ctx.progress?.(`removing ${aside}: ${(e as Error).message}`))
    .finally(() => { ctx.removals.delete(removal); });
  ctx.removals.add(removal);
}

/** Suffix of a resumed sandbox's snapshot directory being removed (`suspend.removed-<ms>`). */
export const SNAPSHOT_REMOVED = '.removed-';

/** Whether `memPath` is the sandbox's own RAM file (a resumed one's), not a checkpoint or fork point it maps. */
function ownsMemFile(memPath: string, id: string): boolean {
  return memPath.endsWith(`/${id}.mem`);
}
