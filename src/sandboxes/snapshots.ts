import { copyFileSync, existsSync, linkSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { CollimateError, invalidState, msg, see, snapshotNotFound } from '../errors.js';
import { allocatedBytes } from '../vmm/memory.js';
import { performance } from 'node:perf_hooks';
import { claimWarm, createOverlay, destroyPending, newDiskPath, newForkPointId, type LiveVm, type PendingVm } from './runtime.js';
import { applyEgress, dropSnapshotPool, takeWarm } from './snapshotPools.js';
import type { SandboxRow, SnapshotRow, VmmRecord } from './repo.js';
import type { Running } from './registry.js';
import type { Vmm } from '../vmm/vmm.js';
import { Phases } from './phases.js';
import { forkRunningByPages, recordForkPoint, spawnChildren, SNAPSHOT_RAM, type ForkPoint } from './fork.js';
import { gcForkPoints, removeOwnLayers } from './delete.js';
import { removeAfterwards, resumeSandbox, snapshotFiles, snapshotRecord } from './suspendResume.js';
import { dirs, diskOnlySuspended, getInfo, gone, pooledVmmDir, rowFor, runningFor, vmmFailure, type EngineContext } from './context.js';
import type { SandboxInfo, Scope, SnapshotInfo, SnapshotListFilter, SnapshotOptions, StartFromSnapshotOptions } from './types.js';
import { forkCountProblem } from './types.js';

/**
 * Snapshots: a moment of a sandbox kept after it moves on. A snapshot is a fork point (fork.ts) held
 * by a snapshot row instead of by children: its RAM image lies on disk in the fork point's
 * directory (`ram.img`, sparse), beside the device state, over the disk layer frozen at that
 * moment. Taking one is a live fork without children (the sandbox pauses as long as a fork pauses
 * it); starting sandboxes from one restores children from it, their RAM mapped copy-on-write from
 * the image where it lies; rolling a sandbox back switches it onto that moment: onto a VMM the
 * snapshot's pool restored ahead, or else as a suspended sandbox whose snapshot is that moment,
 * resumed. Rows and files survive a restart; a snapshot a crash caught before
 * its files were synced is removed by reconcile (reconcileSnapshots), so one is whole or absent.
 */

export function newSnapshotId(): string {
  return `snap_${randomBytes(8).toString('hex')}`;
}

export function snapshotInfo(s: SnapshotRow): SnapshotInfo {
  return {
    id: s.id, name: s.name, tenant: s.tenant, labels: s.labels, sandbox_id: s.source, template: s.template,
    created_at: new Date(s.created_at).toISOString(), size_bytes: s.bytes,
    vcpus: s.vcpus, memory_mib: s.memory_mib, disk_mib: s.disk_mib, egress: s.egress, environment: s.environment ?? null,
  };
}

/**
 * The tenant's ready snapshot `id`; snapshot_not_found for another tenant's, or one still being
 * taken. A copy of another cluster host's snapshot (snapshotCopies.ts) only with `copies`: sandboxes
 * start from it, but it is not the tenant's to see, roll back to or delete here.
 */
export function snapshotFor(ctx: EngineContext, id: string, scope?: Scope, opts: { copies?: boolean } = {}): SnapshotRow {
  const s = typeof id === 'string' ? ctx.repo.snapshot(id) : undefined;
  if (!s || s.state !== 'ready' || (scope && s.tenant !== scope.tenant) || (s.origin && !opts.copies)) throw snapshotNotFound(String(id));
  return s;
}

export function getSnapshot(ctx: EngineContext, id: string, scope?: Scope): SnapshotInfo {
  return snapshotInfo(snapshotFor(ctx, id, scope));
}

export function listSnapshots(ctx: EngineContext, filter: SnapshotListFilter, scope?: Scope): { snapshots: SnapshotInfo[]; next: string | null } {
  const limit = Math.min(Math.max(filter.limit ?? 100, 1), 1000);
  const rows = ctx.repo.snapshots(scope?.tenant, { labels: filter.labels, source: filter.sandboxId, environment: filter.environment, after: filter.after, limit });
  const page = rows.slice(0, limit);
  return { snapshots: page.map(snapshotInfo), next: rows.length > limit ? page[page.length - 1].id : null };
}

/** The row a snapshot starts from: the sandbox's shape, policy and session rules at that moment. */
function snapshotRowOf(row: SandboxRow, id: string, fpId: string, opts: SnapshotOptions): SnapshotRow {
  return {
    id, tenant: row.tenant, name: opts.name ?? null, labels: opts.labels ?? {}, source: row.id, template: row.template,
    fork_point: fpId, artifact_key: row.vmm!.artifactKey, vcpus: row.vcpus, memory_mib: row.memory_mib, disk_mib: row.disk_mib,
    egress: row.egress, on_timeout: row.on_timeout, auto_resume: row.auto_resume, keep_memory: row.keep_memory ?? 1, public_ports: row.public_ports, port_host: row.port_host, timeout_secs: row.timeout_secs,
    bytes: 0, created_at: Date.now(), state: 'creating', environment: null,
  };
}

/** What a snapshot's own files occupy: its RAM image, device state and the disk layer frozen for it. */
export function bytesOf(fp: { dir: string; disk: string }): number {
  let n = 0;
  for (const f of readdirSync(fp.dir)) n += allocatedBytes(join(fp.dir, f));
  return n + (existsSync(fp.disk) ? allocatedBytes(fp.disk) : 0);
}

/**
 * Takes a snapshot of a running or suspended sandbox. A running one is captured as a live fork
 * captures it (fork.ts forkRunningByPages) and runs on; a suspended one's image is linked into the
 * snapshot and its disk layer frozen under a new one, as a fork of it does.
 */
export async function createSnapshot(ctx: EngineContext, id: string, opts: SnapshotOptions, scope?: Scope): Promise<SnapshotInfo> {
  ctx.assertOpen();
  const row = rowFor(ctx, id, scope);
  if (row.state !== 'suspended') runningFor(ctx, id, scope, 'snapshot');
  const snapId = newSnapshotId();
  // Its RAM image goes to disk: at most the guest's memory.
  return ctx.capacity.within('snapshot', { vmms: 0, memoryMib: 0, diskMib: row.memory_mib }, async () => {
    let fp: ForkPoint | undefined;
    try {
      if (rowFor(ctx, id, scope).state === 'suspended') fp = await snapshotSuspended(ctx, id, snapId, opts, scope);
      if (!fp) {
        const r = runningFor(ctx, id, scope, 'snapshot');
        await r.queue.run(async () => {
          if (r.deleting) throw invalidState(id, 'busy', 'snapshot', ['running', 'suspended']);
          ctx.registry.flushActivity();
          ctx.processes.beginFork(r.id);
          try {
            await forkRunningByPages(ctx, r, { count: 0 }, {
              record: (fpId) => {
                ctx.repo.insertSnapshot(snapshotRowOf(ctx.repo.get(r.id)!, snapId, fpId, opts));
                ctx.repo.addRef(fpId, snapId);
              },
            });
            ctx.processes.remember(snapId, r.id);
          } finally {
            ctx.processes.endFork(r.id);
          }
        });
        const s = ctx.repo.snapshot(snapId)!;
        const f = ctx.repo.forkPoint(s.fork_point)!;
        fp = { id: f.id, dir: f.dir, mem: f.mem_path, disk: f.disk_path };
      }
      await ctx.fault('snapshot:before-ready');
      ctx.repo.markSnapshotReady(snapId, bytesOf(fp));
    } catch (e) {
      // Nothing of it is left: its row goes, and the fork point with it unless the sandbox sits on its layer.
      ctx.repo.removeSnapshot(snapId);
      ctx.processes.endFork(snapId);
      gcForkPoints(ctx);
      if (e instanceof CollimateError) throw e;
      throw vmmFailure('snapshot', e, ctx.registry.get(id));
    }
    return snapshotInfo(ctx.repo.snapshot(snapId)!);
  });
}

/**
 * A suspended sandbox's snapshot: its RAM image and device state are linked into a new fork point
 * (they are never written again; a resume removes only its own links), and the disk layer it has
 * becomes the fork point's, the sandbox going on on a new layer over it. Null when it is no longer
 * suspended by its turn (a resume queued ahead): the caller takes it running.
 */
async function snapshotSuspended(ctx: EngineContext, id: string, snapId: string, opts: SnapshotOptions, scope?: Scope): Promise<ForkPoint | undefined> {
  return ctx.registry.serialized(id, async () => {
    const row = rowFor(ctx, id, scope);
    if (row.state !== 'suspended') return undefined;
    const snap = row.snapshot;
    const rec = row.vmm;
    if (!snap || !rec) throw invalidState(id, row.state, 'snapshot', ['running', 'suspended']);
    if (snap.diskOnly) throw diskOnlySuspended(id, 'snapshot');
    if (!snap.ramPath) {
      throw new CollimateError('invalid_state', msg`Sandbox ${id} was suspended by an older version, whose snapshot format cannot be kept; resume it${see('resumeSandbox', { id })} and take the snapshot then.`, { details: { state: row.state } });
    }
    const fpId = newForkPointId();
    const fp: ForkPoint = { id: fpId, dir: join(dirs(ctx.cfg).forkpoints, fpId), mem: join(dirs(ctx.cfg).forkpoints, fpId, SNAPSHOT_RAM), disk: rec.diskPath };
    const newDisk = newDiskPath(dirs(ctx.cfg).disks, id);
    mkdirSync(fp.dir, { recursive: true });
    try {
      linkOrCopy(snap.ramPath, fp.mem);
      copyFileSync(snap.statePath, join(fp.dir, 'device.state'));
      await createOverlay(newDisk, fp.disk, 'qcow2');
    } catch (e) {
      rmSync(fp.dir, { recursive: true, force: true });
      rmSync(newDisk, { force: true });
      throw e;
    }
    ctx.repo.tx(() => {
      recordForkPoint(ctx, fp, id);
      ctx.repo.markForkPointReady(fp.id);
      ctx.repo.update(id, { vmm: { ...rec, diskPath: newDisk } });
      ctx.repo.insertSnapshot(snapshotRowOf(row, snapId, fp.id, opts));
      ctx.repo.addRef(fp.id, snapId);
    });
    ctx.processes.remember(snapId, id);
    return fp;
  });
}

/** A hard link where the file system allows one (the image is never written again), else a sparse copy. */
function linkOrCopy(from: string, to: string): void {
  try {
    linkSync(from, to);
  } catch {
    copyFileSync(from, to);
  }
}

/**
 * Promotes snapshot `id` under `name`, a template id its tenant then creates from (each create a
 * sandbox started from it); null takes the name away. The tenant service checks the name against
 * the tenant's other templates; here, only against its other snapshots (409 conflict).
 */
export function promoteSnapshot(ctx: EngineContext, id: string, name: string | null, scope?: Scope): SnapshotInfo {
  const s = snapshotFor(ctx, id, scope);
  if (!ctx.repo.setSnapshotEnvironment(s.id, name)) {
    throw new CollimateError('conflict', msg`Another snapshot is promoted as ${name}; take its name away first (promote it with "environment": null) or choose another.`);
  }
  return snapshotInfo(snapshotFor(ctx, id, scope));
}

/**
 * Deletes a snapshot: it can no longer be started from or rolled back to. Its files go once nothing
 * depends on them (sandboxes started from it map its RAM image and sit on its disk layer).
 */
export function deleteSnapshot(ctx: EngineContext, id: string, scope?: Scope): void {
  const s = snapshotFor(ctx, id, scope);
  ctx.repo.removeSnapshot(s.id);
  dropSnapshotPool(ctx, s.id);
  ctx.processes.endFork(s.id);
  gcForkPoints(ctx);
  ctx.emit('snapshotDeleted', { id: s.id, tenant: s.tenant });
}

/** How many operations hold each snapshot's fork point now, per engine (starts and rollbacks run concurrently). */
const holds = new WeakMap<EngineContext, Map<string, number>>();

/**
 * Runs `fn` with snapshot `s`'s fork point held (in `ctx.forking`): its files stay whatever a
 * delete of the snapshot does meanwhile, until the last operation holding it is done.
 */
export async function holding<T>(ctx: EngineContext, s: SnapshotRow, fn: () => Promise<T>): Promise<T> {
  const counts = holds.get(ctx) ?? new Map<string, number>();
  holds.set(ctx, counts);
  counts.set(s.fork_point, (counts.get(s.fork_point) ?? 0) + 1);
  ctx.forking.add(s.fork_point);
  try {
    return await fn();
  } finally {
    const left = (counts.get(s.fork_point) ?? 1) - 1;
    if (left > 0) counts.set(s.fork_point, left);
    else {
      counts.delete(s.fork_point);
      ctx.forking.delete(s.fork_point);
      gcForkPoints(ctx);
    }
  }
}

/** The fork point of a snapshot, as fork.ts takes it. */
export function forkPointOf(ctx: EngineContext, s: SnapshotRow): ForkPoint {
  const f = ctx.repo.forkPoint(s.fork_point);
  if (!f || !existsSync(f.mem_path)) throw new CollimateError('internal_error', `Snapshot ${s.id} lost its files (fork point ${s.fork_point}); delete it.`);
  return { id: f.id, dir: f.dir, mem: f.mem_path, disk: f.disk_path };
}

/**
 * Starts `count` sandboxes from a snapshot: each restored from it as a fork child is from its fork
 * point (a fresh identity, the snapshot's memory, processes and files), its RAM mapped copy-on-write
 * from the image on disk. VMMs spawned ahead for the template (forkReceivers.ts) are used first.
 * On a cluster host that is not the snapshot's, from this host's copy of it (snapshotCopies.ts).
 */
export async function startFromSnapshot(ctx: EngineContext, snapId: string, opts: StartFromSnapshotOptions, scope: Scope): Promise<SandboxInfo[]> {
  ctx.assertOpen();
  const problem = forkCountProblem(opts.count);
  if (problem) throw new CollimateError('validation_error', problem);
  const s = snapshotFor(ctx, snapId, scope, { copies: true });
  if (opts.forkOf !== undefined && opts.forkOf !== s.source) throw new CollimateError('validation_error', msg`Snapshot ${snapId} was taken of sandbox ${s.source}, not ${opts.forkOf}: its sandboxes can only be that one's children.`);
  return ctx.capacity.within('start from a snapshot', { vmms: opts.count, memoryMib: s.memory_mib }, () => holding(ctx, s, async () => {
    const fp = forkPointOf(ctx, s);
    const now = Date.now();
    const timeoutSecs = opts.timeoutSecs ?? s.timeout_secs;
    // What the children get of a parent: made of the snapshot and the request.
    const origin: SandboxRow = {
      id: s.source, tenant: s.tenant, template: s.template, state: 'running', labels: {},
      created_at: now, last_active: now, exec_count: 0, parent: null, forked_at: null,
      timeout_secs: timeoutSecs, session_started_at: now, session_ends_at: now + timeoutSecs * 1000,
      vcpus: s.vcpus, memory_mib: s.memory_mib, disk_mib: s.disk_mib, egress: opts.egress ?? s.egress,
      on_timeout: opts.onTimeout ?? s.on_timeout, auto_resume: opts.autoResume === undefined ? s.auto_resume : opts.autoResume ? 1 : 0,
      keep_memory: opts.keepMemory === undefined ? s.keep_memory ?? 1 : opts.keepMemory ? 1 : 0,
      public_ports: opts.publicPorts === undefined ? s.public_ports : opts.publicPorts ? 1 : 0, port_host: opts.portHost === undefined ? s.port_host : opts.portHost,
      vmm: null, snapshot: null, pending_op: null,
    };
    const shape = { vcpus: s.vcpus, memoryMib: s.memory_mib };
    const phases = new Phases('start_from_snapshot');
    const devState = readFileSync(join(fp.dir, 'device.state'));
    // VMMs the snapshot's pool restored ahead (none until it has been started from): claimed, the rest restored now.
    const warm = takeWarm(ctx, s, fp, opts.count);
    // Every VMM the start holds: when it fails, none of them becomes a sandbox, and each is destroyed.
    const vmms: PendingVm[] = [];
    try {
      await phases.time('egress_apply', () => Promise.all(warm.vms.map((vm) => applyEgress(ctx, vm, s, origin.egress))));
      const children = await spawnChildren(ctx, origin, { ...ctx.templates.artifactFor(s.artifact_key).shape, ...shape }, fp, s.artifact_key, devState,
        { count: opts.count, labels: opts.labels, ...(opts.forkOf ? { forkOf: opts.forkOf } : {}) }, vmms, phases, { fileReady: true }, s.id, warm.vms);
      ctx.emit('phases', phases.report(s.id));
      return children;
    } catch (e) {
      await Promise.all([...new Set([...warm.vms, ...vmms])].map((vm) => destroyPending(vm).catch(() => {})));
      throw vmmFailure('start from a snapshot', e);
    } finally {
      warm.served();
    }
  }));
}

/**
 * Rolls sandbox `id` back to snapshot `snapId` of its own, in place (same id): its memory,
 * processes and files become the snapshot's. Operations queued behind the rollback fail with
 * sandbox_restored.
 *
 * A running sandbox is stopped, then switched in one transaction (switchTo) onto one of two things:
 * a VMM of the snapshot's pool (snapshotPools.ts), restored from it ahead and claimed before the
 * switch, when the pool has one ready; else a suspend image of the snapshot (links to its files, a
 * new top layer on its disk layer), made while it still ran, and resumed after the switch as any
 * suspended sandbox (as it is too when the pool's VMM fails its claim). Its old VMM goes after the
 * switch, off the rollback's path. A suspended sandbox is switched onto a suspend image and stays
 * suspended at that moment.
 *
 * A crash before the switch leaves the sandbox as it was (a stopped VMM runs on once reconcile
 * adopts it; a claimed pool VMM no row names is stopped). After it, the sandbox is the snapshot's:
 * suspended at it (reconcile keeps it so, the old VMM stopped), or running on the pool's VMM, which
 * reconcile adopts like any running sandbox's (and stops the old one, which no row names).
 */
export async function restoreSnapshot(ctx: EngineContext, id: string, snapId: string, scope?: Scope): Promise<SandboxInfo> {
  ctx.assertOpen();
  const row = rowFor(ctx, id, scope);
  const s = snapshotFor(ctx, snapId, scope);
  if (s.source !== id) {
    throw new CollimateError('snapshot_mismatch', msg`Snapshot ${snapId} was taken of sandbox ${s.source}, not ${id}; a sandbox rolls back only to its own snapshots. Start a new sandbox from it instead${see('createSandbox')}.`, { details: { snapshot_sandbox_id: s.source } });
  }
  if (row.state !== 'suspended') runningFor(ctx, id, scope, 'restore');
  return holding(ctx, s, async () => {
    if (rowFor(ctx, id, scope).state === 'suspended') {
      const done = await ctx.registry.serialized(id, async () => {
        const cur = rowFor(ctx, id, scope);
        if (cur.state !== 'suspended') return false;
        const p = await prepareSwitch(ctx, id, s);
        switchTo(ctx, cur, s, { suspended: p });
        removeAfterwards(ctx, dirname(cur.snapshot!.statePath));
        removeOwnLayers(ctx, id, cur.vmm!.diskPath, p.disk);
        ctx.processes.replace(id, s.id);
        return true;
      });
      if (done) {
        gcForkPoints(ctx, { filesAfterwards: true });
        ctx.emit('transition', { id, tenant: row.tenant, state: 'suspended', op: 'restore' });
        return getInfo(ctx, id);
      }
    }
    const r = runningFor(ctx, id, scope, 'restore');
    const phases = new Phases('restore');
    const state = await r.queue.run(() => ctx.registry.serialized(id, async () => {
      if (r.deleting) throw r.rolledBack ? gone(r) : invalidState(id, 'busy', 'restore', ['running', 'suspended']);
      ctx.registry.flushActivity();
      // Counted as a use of the snapshot, as a start is: a snapshot rolled back to often gets a pool.
      const warm = takeWarm(ctx, s, forkPointOf(ctx, s), 1);
      try {
        return await rollBackRunning(ctx, r, s, warm.vms[0], phases);
      } finally {
        warm.served();
      }
    }));
    const t0 = performance.now();
    // What the sandbox held before and nothing holds now: its files go after the answer.
    gcForkPoints(ctx, { filesAfterwards: true });
    phases.since('gc', t0);
    if (state === 'running') {
      ctx.emit('transition', { id, tenant: row.tenant, state: 'running', op: 'restore' });
      ctx.emit('phases', phases.report(id));
      return getInfo(ctx, id);
    }
    ctx.emit('phases', phases.report(id));
    return await resumeSandbox(ctx, id, scope, 'restore').catch((e) => {
      // Resumed meanwhile by another request: it runs, from the snapshot.
      if (e instanceof CollimateError && e.code === 'invalid_state' && e.details?.state === 'running') return getInfo(ctx, id);
      throw e;
    });
  });
}

/**
 * The rollback of running sandbox `r` in its turn (its queue's, and serialized): onto `vm`, a
 * VMM of the snapshot's pool, when there is one and its claim succeeds ('running'); else onto a
 * suspend image, for the caller to resume ('suspended'). Until the switch, a failure leaves the
 * sandbox as it was, running.
 */
async function rollBackRunning(ctx: EngineContext, r: Running, s: SnapshotRow, vm: PendingVm | undefined, phases: Phases): Promise<'running' | 'suspended'> {
  const id = r.id;
  const vmm = r.live.vmm;
  const rec = r.live.record;
  // A pool VMM that was not restored ahead (a snapshot's always is) is of no use here.
  if (vm && !vm.warm) {
    await destroyPending(vm).catch(() => {});
    vm = undefined;
  }
  // Without a pool VMM the image and layer are made first, while the sandbox still runs.
  let p = vm ? undefined : await phases.time('prepare', () => prepareSwitch(ctx, id, s));
  try {
    await phases.time('stop', () => vmm.qmp.execute('stop'));
  } catch (e) {
    if (p) discardSwitch(p);
    if (vm) await destroyPending(vm).catch(() => {});
    throw vmmFailure('restore', e, r);
  }
  // The pool's VMM runs as the sandbox before the row says so; the stopped one is still there to go back to.
  const live = vm ? await claimForRollback(ctx, id, s, vm, phases) : null;
  if (!live) {
    try {
      p ??= await phases.time('prepare', () => prepareSwitch(ctx, id, s));
    } catch (e) {
      await vmm.cont().catch(() => {});
      throw vmmFailure('restore', e, r);
    }
  }
  // Operations queued behind fail from here on, saying why.
  r.deleting = true;
  r.rolledBack = s.id;
  const t0 = performance.now();
  switchTo(ctx, ctx.repo.get(id)!, s, live ? { running: live } : { suspended: p! });
  phases.since('switch', t0);
  await ctx.fault('restore:switched');
  ctx.registry.remove(id);
  r.live.agent.close();
  // Its processes are the snapshot's, as the host knew them then; the guest tells the rest.
  ctx.processes.replace(id, s.id);
  if (live) ctx.registry.add(id, live);
  const t1 = performance.now();
  // Its old layers go now, while no later layer of the sandbox's can be taken for one of them; its
  // RAM file loses its name (the stopped VMM maps it until it goes).
  removeOwnLayers(ctx, id, rec.diskPath, live ? live.record.diskPath : p!.disk);
  if (rec.memPath === join(ctx.cfg.ramDir, `${id}.mem`)) rmSync(rec.memPath, { force: true });
  killAfterwards(ctx, id, vmm, rec);
  phases.since('cleanup', t1);
  return live ? 'running' : 'suspended';
}

/**
 * Claims pool VMM `vm` for sandbox `id`, rolled back to `s`: resumed with the sandbox's id, fresh
 * entropy and clock, as a resume gives, under the sandbox's egress policy. Null when the claim fails
 * (the VMM destroyed): the caller rolls back the usual way.
 */
async function claimForRollback(ctx: EngineContext, id: string, s: SnapshotRow, vm: PendingVm, phases: Phases): Promise<LiveVm | null> {
  try {
    return await ctx.capacity.within('rollback', { vmms: 1, memoryMib: s.memory_mib }, async () => {
      await ctx.fault('restore:pool-claim');
      await phases.time('egress_apply', () => applyEgress(ctx, vm, s, ctx.repo.get(id)!.egress));
      return claimWarm(vm.warm!, id, phases);
    });
  } catch (e) {
    ctx.progress?.(`rollback of ${id}: a VMM of snapshot ${s.id}'s pool failed its claim (${(e as Error).message}); resuming the sandbox from the snapshot instead`);
    await destroyPending(vm).catch(() => {});
    return null;
  }
}

/**
 * Kills a rolled-back sandbox's old VMM (stopped, no longer registered) and removes the directory of
 * a pool VMM it ran in, after the rollback has answered: the kill (QEMU's exit, its namespace and
 * cgroup given back) took ~90 ms. In the sandbox's serialized turn, so a resume or suspend that
 * follows never meets it; engine close and settled() wait for it; a crash leaves it to reconcile.
 */
function killAfterwards(ctx: EngineContext, id: string, vmm: Vmm, rec: VmmRecord): void {
  const removal: Promise<void> = ctx.registry.serialized(id, async () => {
    await vmm.kill();
    const pooled = pooledVmmDir(ctx.cfg, id, rec);
    if (pooled) rmSync(pooled, { recursive: true, force: true });
  }).catch((e) => ctx.progress?.(`rollback of ${id}: stopping its old VMM (pid ${rec.pid}): ${(e as Error).message}`))
    .finally(() => { ctx.removals.delete(removal); });
  ctx.removals.add(removal);
}

interface PreparedSwitch {
  /** The sandbox's new suspend directory: links to the snapshot's image and device state. */
  snapDir: string;
  /** Its new top disk layer, empty, over the snapshot's layer. */
  disk: string;
}

/**
 * The suspend directory and top layer a rollback switches the sandbox onto when no pool VMM takes
 * it, made beside what it has (a directory of its own name: a suspended sandbox's `suspend` stays
 * until the switch).
 */
async function prepareSwitch(ctx: EngineContext, id: string, s: SnapshotRow): Promise<PreparedSwitch> {
  const fp = forkPointOf(ctx, s);
  const snapDir = join(dirs(ctx.cfg).sandboxes, id, `suspend-${s.id}-${Date.now()}`);
  const disk = newDiskPath(dirs(ctx.cfg).disks, id);
  try {
    mkdirSync(snapDir, { recursive: true });
    const files = snapshotFiles(snapDir);
    linkOrCopy(fp.mem, files.ramPath);
    copyFileSync(join(fp.dir, 'device.state'), files.statePath);
    writeFileSync(files.complete, '');
    await createOverlay(disk, fp.disk, 'qcow2');
  } catch (e) {
    discardSwitch({ snapDir, disk });
    throw e;
  }
  return { snapDir, disk };
}

/** Removes what prepareSwitch made, for a rollback that did not switch. */
function discardSwitch(p: PreparedSwitch): void {
  rmSync(p.snapDir, { recursive: true, force: true });
  rmSync(p.disk, { force: true });
}

/**
 * Makes the row say the sandbox is at the snapshot's moment, in one transaction: it holds the
 * snapshot's fork point and what that holds instead of its old chain, and is either suspended (its
 * suspend image the snapshot's, its disk a new layer over the snapshot's) or running on a VMM of the
 * snapshot's pool (its RAM mapped from the snapshot's image, its disk that VMM's layer over the
 * snapshot's), in a new session of its timeout as a resume starts.
 */
function switchTo(ctx: EngineContext, row: SandboxRow, s: SnapshotRow, onto: { suspended: PreparedSwitch } | { running: LiveVm }): void {
  const now = Date.now();
  ctx.repo.tx(() => {
    ctx.repo.dropRefs(row.id);
    ctx.repo.addRef(s.fork_point, row.id);
    for (const up of ctx.repo.refsOf(s.fork_point)) ctx.repo.addRef(up, row.id);
    if ('suspended' in onto) {
      ctx.repo.update(row.id, {
        state: 'suspended', snapshot: snapshotRecord(onto.suspended.snapDir), vmm: { ...row.vmm!, diskPath: onto.suspended.disk }, pending_op: null, from_snapshot: s.id,
      });
    } else {
      ctx.repo.update(row.id, {
        state: 'running', vmm: onto.running.record, snapshot: null, pending_op: null, from_snapshot: s.id,
        session_started_at: now, session_ends_at: now + row.timeout_secs * 1000, last_active: now,
      });
    }
  });
}

/** A snapshot a crash caught before it was whole is removed (its fork point goes unless a sandbox sits on it). */
export function reconcileSnapshots(ctx: EngineContext): void {
  for (const s of ctx.repo.unfinishedSnapshots()) {
    ctx.progress?.(`snapshot ${s.id}: cut off by a restart before its files were whole; removing it`);
    ctx.repo.removeSnapshot(s.id);
  }
}
