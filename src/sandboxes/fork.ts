import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fsyncFile } from '../host/fsync.js';
import { performance } from 'node:perf_hooks';
import { CollimateError, invalidState } from '../errors.js';
import type { MachineShape } from '../vmm/machine.js';
import { copyPrivatePages, preallocPrivatePages, seedFromBacking } from '../vmm/memory.js';
import { spliceDeviceState } from '../vmm/deviceState.js';
import { sealShared } from '../vmm/jail.js';
import { processUsage } from '../vmm/vmm.js';
import {
  newSandboxId, newForkPointId, newDiskPath, spawnIncoming, restoreCheckpoint, claimWarm, restoreStream, createOverlay, prepareUpperDisk, snapshotUpperDisk,
  destroyPending, runAgain,
  type LiveVm, type PendingVm,
} from './runtime.js';
import { toInfo, type SandboxRow } from './repo.js';
import { Phases } from './phases.js';
import { attachDisk, attachMemory } from './forkReceivers.js';
import type { Running } from './registry.js';
import { endFork } from './delete.js';
import { gone, diskOnlySuspended, dirs, isUnacknowledgedRestore, rowFor, runningFor, shapeOf, trustedLayers, vmmFailure, type EngineContext } from './context.js';
import { forkCountProblem, type ForkOptions, type SandboxInfo, type Scope } from './types.js';

/**
 * Fork: a sandbox's memory and disk are frozen into a fork point (a RAM file, a device state and
 * the disk layer it had), and N children are restored copy-on-write from it. A running parent is
 * migrated into the fork point and runs on; a suspended one's snapshot is restored into it.
 */

/** A fork point: a frozen state children (and a sandbox resumed on a receiver) map and sit on. */
/** The name of a snapshot's RAM image in its fork point's directory. */
export const SNAPSHOT_RAM = 'ram.img';

export interface ForkPoint {
  id: string;
  dir: string;
  mem: string;
  disk: string;
}

/**
 * Records fork point `fp`, made of `owner`'s state, inside the caller's transaction: `owner` refers to
 * it (its disk sits on the fork point's layer), and it to everything `owner` referred to (the layers
 * under that one).
 */
export function recordForkPoint(ctx: EngineContext, fp: ForkPoint, owner: string): void {
  const ups = ctx.repo.refsOf(owner);
  ctx.repo.addForkPoint(fp.id, fp.dir, fp.mem, fp.disk);
  ctx.repo.addRef(fp.id, owner);
  for (const up of ups) ctx.repo.addRef(up, fp.id);
}

/** What a fork has made that nobody owns yet: destroyed when the fork fails. */
interface Unowned {
  /** The VMM the fork point's RAM is filled through. */
  recv?: PendingVm;
  children: PendingVm[];
  /** The parent's next top layer, made before it stopped, until it is put on. */
  disk?: string;
}

export async function forkSandbox(ctx: EngineContext, id: string, opts: ForkOptions, scope?: Scope): Promise<SandboxInfo[]> {
  ctx.assertOpen();
  const count = opts.count;
  const countProblem = forkCountProblem(count);
  if (countProblem) throw new CollimateError('validation_error', countProblem);
  const row = rowFor(ctx, id, scope);
  if (row.state !== 'suspended') runningFor(ctx, id, scope, 'fork');
  // The fork point's RAM file is at most the guest's memory.
  return ctx.capacity.within('fork', { vmms: count, memoryMib: row.memory_mib, tmpfsMib: row.memory_mib }, async () => {
    if (rowFor(ctx, id, scope).state === 'suspended') {
      const children = await forkSuspended(ctx, id, opts, scope);
      if (children) return children;
      // Resumed while this fork waited its turn: it is running now, so it forks live.
    }
    const r = runningFor(ctx, id, scope, 'fork');
    return r.queue.run(async () => {
      if (r.deleting) throw gone(r);
      ctx.registry.flushActivity();
      // Its children inherit what the host holds of its processes now, before it stops and runs on.
      ctx.processes.beginFork(r.id);
      try {
        return await (ctx.cfg.forkCapture === 'pages' ? forkRunningByPages(ctx, r, opts) : forkRunning(ctx, r, opts));
      } finally {
        ctx.processes.endFork(r.id);
      }
    });
  });
}

/**
 * Live fork by page copy: the fork point's RAM file starts as a copy of the file the parent's RAM
 * maps (made while the parent still runs: it never changes), the parent is stopped, its disk
 * frozen, its devices saved without RAM, the pages it wrote copied over the copy, and it runs on.
 * Children are spawned as soon as the disk is frozen and restored from the fork point once it is
 * whole. Its cost follows what the parent wrote, not its size; no receiving VMM, no migration stream.
 */
export async function forkRunningByPages(ctx: EngineContext, r: Running, opts: ForkOptions, keep?: KeepAs): Promise<SandboxInfo[]> {
  const parentRow = ctx.repo.get(r.id)!;
  const shape = shapeOf(ctx, parentRow);
  const rec = r.live.record;
  const artifact = ctx.templates.artifactFor(rec.artifactKey);
  const fp = beginForkPoint(ctx, r.id, rec.diskPath, (fpId) => {
    ctx.repo.update(r.id, { pending_op: { op: 'fork', forkPoint: fpId, startedAt: Date.now() } });
    keep?.record(fpId);
  }, keep ? 'disk' : 'tmpfs');
  const vmm = r.live.vmm;
  const unowned: Unowned = { children: [] };
  const phases = new Phases('fork');
  const memBytes = shape.memoryMib * 1024 * 1024;
  let parentStopped = false;
  let stoppedAt = 0;
  let children: Promise<SandboxInfo[]> | undefined;
  try {
    // A share=off parent's RAM is its backing file plus what it wrote: the file is copied now.
    await ctx.fault('fork:before-seed');
    if (!rec.memShared) {
      const t0 = performance.now();
      // The spare seeds lie on tmpfs: a snapshot's image, on disk, is copied from the file itself.
      const spare = !keep && await ctx.seeds.take(rec.memPath, fp.mem, memBytes);
      if (keep) await seedFromBacking(rec.memPath, fp.mem, memBytes);
      phases.since(spare ? 'memory_seed_spare' : 'memory_seed', t0);
    }
    unowned.disk = newDiskPath(dirs(ctx.cfg).disks, r.id);
    // allSettled, not all: when one fails, the undo must not run before the other has made its file.
    const prepared = await Promise.allSettled([
      phases.time('disk_prepare', () => prepareUpperDisk(ctx.cfg, r.live, unowned.disk!)),
      // While the parent still runs, the fork point gets its blocks under the pages the parent
      // wrote: the copy it is stopped for then writes into pages that exist (half its cost).
      rec.memShared ? null : phases.time('memory_prealloc', () => preallocPrivatePages(vmm.pid, rec.memPath, fp.mem, ctx.cfg.cacheDir)),
    ]);
    for (const p of prepared) if (p.status === 'rejected') throw p.reason;
    await ctx.fault('fork:before-stop');
    stoppedAt = performance.now();
    await phases.time('stop', () => vmm.qmp.execute('stop'));
    parentStopped = true;
    await freezeParentDisk(ctx, r, fp, phases, unowned);
    // The children's VMMs start now (their disks lie on the frozen layer); they wait for the device state.
    const devState = deferred<Buffer>();
    // A share=on parent's RAM file is copied whole below: a child's VMM may only open it once it has its size.
    if (opts.count > 0) {
      children = spawnChildren(ctx, parentRow, shape, fp, rec.artifactKey, devState.promise, opts, unowned.children, phases, { fileReady: !rec.memShared });
      children.catch(() => {});
    }
    try {
      const devices = await phases.time('device_state_save', () => vmm.saveDevicesOnly());
      const t0 = performance.now();
      if (rec.memShared) await seedFromBacking(rec.memPath, fp.mem, memBytes);
      else await copyPrivatePages(vmm.pid, rec.memPath, fp.mem, ctx.cfg.cacheDir);
      phases.since('memory_capture', t0);
      await ctx.fault('fork:after-migrate');
      // The parent runs on as soon as its memory is copied, its clock set again: left alone, each
      // fork would leave it as far behind as it was stopped (a tree search forking one parent a
      // hundred times: seconds).
      await runAgain(r.live);
      parentStopped = false;
      phases.since('parent_paused', stoppedAt);
      const state = spliceDeviceState(readFileSync(artifact.devStatePath), devices);
      writeFileSync(join(fp.dir, 'device.state'), state);
      sealShared(fp.mem);
      // A snapshot is whole once its files are on the disk, whatever happens to the host after.
      if (keep) await phases.time('fsync', () => Promise.all([fsyncFile(fp.mem), fsyncFile(join(fp.dir, 'device.state'))]));
      ctx.repo.markForkPointReady(fp.id);
      devState.resolve(state);
    } catch (e) {
      devState.reject(e);
      throw e;
    }
    const out = children ? await children : [];
    // Children clear it as they commit; a snapshot has none.
    if (!children) ctx.repo.update(r.id, { pending_op: null });
    ctx.emit('phases', phases.report(r.id));
    return out;
  } catch (e) {
    await undoLiveFork(ctx, r, unowned, parentStopped, children);
    throw vmmFailure('fork', e, r);
  } finally {
    endFork(ctx, fp);
    if (!rec.memShared && !keep) ctx.seeds.prepare(rec.memPath, memBytes);
  }
}

/** A live fork without children that keeps its fork point as a snapshot (snapshots.ts). */
export interface KeepAs {
  /** Records what holds the fork point, in the transaction that records it. */
  record(forkPoint: string): void;
}

/**
 * Live fork by migration (COLLIMATE_FORK_CAPTURE=migrate): freeze the parent's disk into a fork
 * point, migrate its RAM into the fork point's share=on file, let the parent run on, and restore N
 * children copy-on-write from that file.
 */
async function forkRunning(ctx: EngineContext, r: Running, opts: ForkOptions): Promise<SandboxInfo[]> {
  const parentRow = ctx.repo.get(r.id)!;
  const shape = shapeOf(ctx, parentRow);
  // The parent's current top layer becomes the fork point's frozen disk, in place.
  const fp = beginForkPoint(ctx, r.id, r.live.record.diskPath, (fpId) => {
    ctx.repo.update(r.id, { pending_op: { op: 'fork', forkPoint: fpId, startedAt: Date.now() } });
  });
  const vmm = r.live.vmm;
  const unowned: Unowned = { children: [] };
  const phases = new Phases('fork');
  let parentStopped = false;
  let stoppedAt = 0;
  try {
    unowned.disk = newDiskPath(dirs(ctx.cfg).disks, r.id);
    await phases.time('disk_prepare', () => prepareUpperDisk(ctx.cfg, r.live, unowned.disk!));
    await ctx.fault('fork:before-stop');
    stoppedAt = performance.now();
    await phases.time('stop', () => vmm.qmp.execute('stop'));
    parentStopped = true;
    await freezeParentDisk(ctx, r, fp, phases, unowned);
    return await finishForkPoint(ctx, parentRow, shape, fp, r.live.record.artifactKey, opts, unowned, phases, async (recv) => {
      await ctx.fault('fork:recv-spawned');
      await phases.time('memory_capture', () => vmm.migrateTo(recv.vmm, 300_000));
      await ctx.fault('fork:after-migrate');
      // The parent runs on as soon as its memory is copied.
      await runAgain(r.live);
      parentStopped = false;
      phases.since('parent_paused', stoppedAt);
    });
  } catch (e) {
    await undoLiveFork(ctx, r, unowned, parentStopped);
    throw vmmFailure('fork', e, r);
  } finally {
    endFork(ctx, fp);
  }
}

/**
 * A live fork that failed: the parent runs again if it was stopped, what the fork made and nobody
 * owns goes (once `settling`, the children still being spawned, has settled). The fork point
 * goes at the fork's end (endFork) unless something refers to it.
 */
async function undoLiveFork(ctx: EngineContext, r: Running, unowned: Unowned, parentStopped: boolean, settling?: Promise<unknown>): Promise<void> {
  if (parentStopped) await runAgain(r.live).catch(() => {});
  await settling?.catch(() => {});
  await destroyUnowned(unowned);
  ctx.repo.update(r.id, { pending_op: null });
}

/**
 * Fork of a suspended sandbox: its snapshot becomes a fork point (its RAM image copied to tmpfs;
 * a snapshot from before RAM images is restored into one through a receiving VMM), children come
 * from that.
 * The row is read in turn, inside the sandbox's queue: a resume or another fork queued ahead changes
 * it (a fork moves the sandbox onto a new top layer). Null when it is no longer suspended by then.
 */
async function forkSuspended(ctx: EngineContext, id: string, opts: ForkOptions, scope?: Scope): Promise<SandboxInfo[] | null> {
  return ctx.registry.serialized(id, async () => {
    const row = rowFor(ctx, id, scope);
    if (row.state !== 'suspended') return null;
    const snap = row.snapshot;
    if (!snap || !row.vmm) throw invalidState(row.id, row.state, 'fork', ['running', 'suspended']);
    if (snap.diskOnly) throw diskOnlySuspended(row.id, 'fork');
    const rec = row.vmm;
    const shape = shapeOf(ctx, row);
    // The suspended sandbox's top layer freezes into the fork point; the sandbox gets a fresh overlay on it.
    const fpDisk = rec.diskPath;
    const newDisk = newDiskPath(dirs(ctx.cfg).disks, row.id);
    const phases = new Phases('fork');
    await phases.time('disk_freeze', () => createOverlay(newDisk, fpDisk, 'qcow2'));
    const fp = beginForkPoint(ctx, row.id, fpDisk, () => {
      ctx.repo.update(row.id, { vmm: { ...rec, diskPath: newDisk } });
    });
    const unowned: Unowned = { children: [] };
    try {
      if (!snap.ramPath) {
        return await finishForkPoint(ctx, row, shape, fp, rec.artifactKey, opts, unowned, phases, (recv) => restoreStream(recv, snap.statePath, phases));
      }
      // A RAM image and a device state are what a fork point is made of: the image is copied to
      // tmpfs (holes kept) while the children's VMMs start, and the device state is taken as is.
      const state = readFileSync(snap.statePath);
      const devState = deferred<Buffer>();
      const children = spawnChildren(ctx, row, shape, fp, rec.artifactKey, devState.promise, opts, unowned.children, phases, { fileReady: false });
      children.catch(() => {});
      try {
        await phases.time('memory_seed', () => seedFromBacking(snap.ramPath!, fp.mem, shape.memoryMib * 1024 * 1024));
        sealShared(fp.mem);
        writeFileSync(join(fp.dir, 'device.state'), state);
        ctx.repo.markForkPointReady(fp.id);
        devState.resolve(state);
      } catch (e) {
        devState.reject(e);
        await children.catch(() => {});
        throw e;
      }
      const out = await children;
      ctx.emit('phases', phases.report(row.id));
      return out;
    } catch (e) {
      await destroyUnowned(unowned);
      throw vmmFailure('fork', e);
    } finally {
      endFork(ctx, fp);
    }
  });
}

/**
 * Freezes a stopped parent's top disk layer in place as the fork point's disk: the parent goes on
 * on the new overlay made for it (`unowned.disk`), recorded before anything else moves.
 */
async function freezeParentDisk(ctx: EngineContext, r: Running, fp: ForkPoint, phases: Phases, unowned: Unowned): Promise<void> {
  const newDisk = unowned.disk!;
  await phases.time('disk_freeze', () => snapshotUpperDisk(ctx.cfg, r.live, newDisk, `upper-${fp.id}`));
  unowned.disk = undefined;
  r.live.record.diskPath = newDisk;
  ctx.repo.update(r.id, { vmm: r.live.record });
  await ctx.fault('fork:after-disk');
}

/**
 * Records a new fork point on `disk` before anything moves, in one transaction with `alsoInTx`:
 * the owner references it from the moment its disk freezes, and the fork point inherits the
 * owner's references (its disk chain and RAM lie on those).
 */
function beginForkPoint(ctx: EngineContext, owner: string, disk: string, alsoInTx: (fpId: string) => void, memOn: 'tmpfs' | 'disk' = 'tmpfs'): ForkPoint {
  const id = newForkPointId();
  const dir = join(dirs(ctx.cfg).forkpoints, id);
  // A snapshot's RAM image lies on disk in the fork point's directory (snapshots.ts); a fork's on tmpfs.
  const mem = memOn === 'disk' ? join(dir, SNAPSHOT_RAM) : join(ctx.cfg.ramDir, `${id}.mem`);
  const fp: ForkPoint = { id, dir, mem, disk };
  mkdirSync(fp.dir, { recursive: true });
  // Until the fork ends, its RAM file is kept though no running sandbox maps it yet (gcForkPoints).
  ctx.forking.add(id);
  ctx.repo.tx(() => {
    recordForkPoint(ctx, fp, owner);
    alsoInTx(fp.id);
  });
  return fp;
}

/**
 * The part of a fork by a receiving VMM (a running parent by migration, a suspended parent from its
 * snapshot): a receiving VMM on the fork point's RAM file (share=on) is filled by `fill`, its device state is checkpointed beside the RAM, the receiver
 * goes, and the children are restored from the now ready fork point. What it makes is recorded in
 * `unowned` until the children's rows own it.
 */
async function finishForkPoint(
  ctx: EngineContext, parent: SandboxRow, shape: MachineShape, fp: ForkPoint, artifactKey: string, opts: ForkOptions, unowned: Unowned,
  phases: Phases, fill: (recv: PendingVm) => Promise<void>,
): Promise<SandboxInfo[]> {
  const recv = await phases.time('recv_spawn', () => spawnIncoming(ctx.cfg, shape, {
    id: fp.id, dir: join(fp.dir, 'recv'), memPath: fp.mem, memShared: true,
    backing: { path: fp.disk, format: 'qcow2' }, diskPath: join(fp.dir, 'recv.qcow2'), artifactKey,
    trustedLayers: trustedLayers(ctx, fp.id, artifactKey),
  }));
  unowned.recv = recv;
  await fill(recv);
  const devState = join(fp.dir, 'device.state');
  await phases.time('device_state_save', () => recv.vmm.checkpointDeviceState(devState, join(recv.dir, 'save.sock')));
  await phases.time('recv_teardown', () => destroyPending(recv));
  unowned.recv = undefined;
  ctx.repo.markForkPointReady(fp.id);
  const children = await spawnChildren(ctx, parent, shape, fp, artifactKey, readFileSync(devState), opts, unowned.children, phases);
  ctx.emit('phases', phases.report(parent.id));
  return children;
}

/**
 * Restores `opts.count` children from a ready fork point and commits their rows in one transaction.
 * `parentRow` gives them their tenant, template, shape, policy and session rules; a start from a
 * snapshot (`fromSnapshot`) passes one made of the snapshot, and the children's processes are the
 * ones the host held when it was taken.
 */
export async function spawnChildren(
  ctx: EngineContext, parentRow: SandboxRow, shape: MachineShape, fp: ForkPoint, artifactKey: string, devStateReady: Buffer | Promise<Buffer>,
  opts: ForkOptions, children: PendingVm[], phases: Phases,
  /**
   * Whether the fork point's RAM file has its full size already (its content may still be coming):
   * QEMU refuses a memory file shorter than the guest's RAM, so otherwise the children's VMMs are
   * spawned once the fork point is whole. Receivers open it only then anyway.
   */
  file: { fileReady: boolean } = { fileReady: true },
  fromSnapshot?: string,
  /** VMMs already restored from the fork point and paused (a snapshot's pool, snapshotPools.ts): claimed, not restored. */
  prewarmed: PendingVm[] = [],
): Promise<SandboxInfo[]> {
  const lives: LiveVm[] = [];
  // Each child VMM's CPU time when this fork took it (a spawned one starts at none).
  const cpuAtClaim = new Map<number, number>();
  const vmmCpuMs = (pid: number) => (processUsage(pid)?.cpuSecs ?? 0) * 1000;
  try {
    // allSettled, not all: when one child fails the others are still landing, and every one
    // that lands must be in `children` for the caller to stop it.
    const spawnChild = async () => {
      if (!file.fileReady) await devStateReady;
      const t0 = performance.now();
      const id = newSandboxId();
      const p = await spawnIncoming(ctx.cfg, shape, {
        id, dir: join(dirs(ctx.cfg).sandboxes, id), memPath: fp.mem, memShared: false,
        backing: { path: fp.disk, format: 'qcow2' }, diskPath: newDiskPath(dirs(ctx.cfg).disks, id), artifactKey,
        trustedLayers: trustedLayers(ctx, fp.id, artifactKey), network: true,
        // Children inherit the parent's policy, in place before they wake.
        whileStarting: (net) => ctx.net!.apply(net, parentRow.egress),
      });
      children.push(p);
      phases.since('child_spawn', t0);
      return p;
    };
    // VMMs spawned ahead of this fork (forkReceivers.ts) are put on the fork point's disk now and
    // its RAM once whole; the rest are spawned.
    children.push(...prewarmed);
    for (const p of prewarmed) cpuAtClaim.set(p.vmm.pid, vmmCpuMs(p.vmm.pid));
    const taken = ctx.receivers.take(artifactKey, opts.count - prewarmed.length);
    children.push(...taken);
    const claim = async (p: PendingVm) => {
      const t0 = performance.now();
      cpuAtClaim.set(p.vmm.pid, vmmCpuMs(p.vmm.pid));
      await attachDisk(ctx.cfg, p, fp, trustedLayers(ctx, fp.id, artifactKey));
      if (p.record.net) await ctx.net!.apply(p.record.net, parentRow.egress);
      phases.since('child_claim', t0);
      return p;
    };
    const spawnedAll = await Promise.allSettled([...taken.map(claim), ...Array.from({ length: opts.count - prewarmed.length - taken.length }, spawnChild)]);
    const spawnFailure = spawnedAll.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (spawnFailure) throw spawnFailure.reason;
    const spawned = children.slice();
    await ctx.fault('fork:children-spawned');
    // The fork point may still be filling while the children start: they restore once it is whole.
    const devState = await devStateReady;
    // A restore whose guest never acknowledges (see finishRestore) gets one fresh VMM.
    const restoreChild = async (p: PendingVm): Promise<{ id: string; live: LiveVm }> => {
      const t0 = performance.now();
      try {
        if (p.remapDir) await phases.time('memory_remap', () => attachMemory(p, fp.mem));
        const live = p.warm ? await claimWarm(p.warm, p.id, phases) : await restoreCheckpoint(p, devState, p.id, phases);
        phases.addCpu('children_vmm', vmmCpuMs(p.vmm.pid) - (cpuAtClaim.get(p.vmm.pid) ?? 0));
        return { id: p.id, live };
      } catch (e) {
        if (!isUnacknowledgedRestore(e)) throw e;
        await destroyPending(p).catch(() => {});
        const q = await spawnChild();
        const live = await restoreCheckpoint(q, devState, q.id);
        phases.since('restore_retry', t0);
        return { id: q.id, live };
      }
    };
    const restored = await Promise.allSettled(spawned.map(restoreChild));
    const ids: string[] = [];
    for (const r of restored) if (r.status === 'fulfilled') { lives.push(r.value.live); ids.push(r.value.id); }
    const restoreFailure = restored.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (restoreFailure) throw restoreFailure.reason;
    await ctx.fault('fork:children-restored');
    const committing = performance.now();
    const now = Date.now();
    const rows: SandboxRow[] = ids.map((id, i) => ({
      id, tenant: parentRow.tenant, template: parentRow.template, state: 'running',
      labels: { ...parentRow.labels, ...(opts.labels ?? {}) },
      // Started from a snapshot: no parent (the sandbox it was taken of may have moved on, or gone); from_snapshot says where from.
      // A fork spilled over hosts (forkOf) is a fork: its children's parent is the sandbox.
      created_at: now, last_active: now, exec_count: 0, parent: fromSnapshot ? opts.forkOf ?? null : parentRow.id, forked_at: fromSnapshot && !opts.forkOf ? null : now,
      timeout_secs: parentRow.timeout_secs, session_started_at: now, session_ends_at: now + parentRow.timeout_secs * 1000,
      vcpus: parentRow.vcpus, memory_mib: parentRow.memory_mib, disk_mib: parentRow.disk_mib, egress: parentRow.egress,
      on_timeout: parentRow.on_timeout, auto_resume: parentRow.auto_resume, keep_memory: parentRow.keep_memory ?? 1, public_ports: parentRow.public_ports, port_host: parentRow.port_host,
      vmm: lives[i].record, snapshot: null, pending_op: null, from_snapshot: opts.forkOf ? null : fromSnapshot ?? null,
    }));
    ctx.repo.tx(() => {
      for (const row of rows) {
        ctx.repo.insert(row);
        ctx.repo.addRef(fp.id, row.id);
        for (const up of ctx.repo.refsOf(fp.id)) ctx.repo.addRef(up, row.id);
      }
      if (!fromSnapshot) ctx.repo.update(parentRow.id, { pending_op: null });
    });
    phases.since('commit', committing);
    rows.forEach((row, i) => {
      // A child has its parent's processes (they are in its memory): it starts with the output held of them.
      ctx.processes.inherit(fromSnapshot ?? parentRow.id, row.id);
      ctx.registry.add(row.id, lives[i]);
      ctx.emit('transition', { id: row.id, tenant: row.tenant, state: 'running', op: 'fork' });
    });
    void ctx.receivers.forked(artifactKey, opts.count, parentRow.egress);
    return rows.map((row) => toInfo(row, []));
  } catch (e) {
    for (const l of lives) l.agent.close();
    throw e;
  }
}

/** A promise settled from outside (a rejection nobody awaits yet is not reported as unhandled). */
function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => { resolve = res; reject = rej; });
  promise.catch(() => {});
  return { promise, resolve, reject };
}

async function destroyUnowned(unowned: Unowned): Promise<void> {
  if (unowned.disk) rmSync(unowned.disk, { force: true });
  if (unowned.recv) await destroyPending(unowned.recv).catch(() => {});
  for (const c of unowned.children) await destroyPending(c).catch(() => {});
}
