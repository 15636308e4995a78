import { copyFileSync, existsSync, linkSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { CollimateError, invalidState, msg, see, snapshotNotFound } from '../errors.js';
import { allocatedBytes } from '../vmm/memory.js';
import { performance } from 'node:perf_hooks';
import { claimWarm, createOverlay, destroyPending, newDiskPath, newForkPointId, type PendingVm } from './runtime.js';
import { applyEgress, dropSnapshotPool, takeWarm } from './snapshotPools.js';
import type { SandboxRow, SnapshotRow } from './repo.js';
import { Phases } from './phases.js';
import { forkRunningByPages, recordForkPoint, spawnChildren, SNAPSHOT_RAM, type ForkPoint } from './fork.js';
import { gcForkPoints, removeOwnLayers } from './delete.js';
import { removeAfterwards, resumeSandbox, snapshotFiles, snapshotRecord } from './suspendResume.js';
import { dirs, getInfo, gone, pooledVmmDir, rowFor, runningFor, vmmFailure, type EngineContext } from './context.js';
import type { SandboxInfo, Scope, SnapshotInfo, SnapshotListFilter, SnapshotOptions, StartFromSnapshotOptions } from './types.js';
import { forkCountProblem } from './types.js';

/**
 * Snapshots: a moment of a sandbox kept after it moves on. A snapshot is a fork point (fork.ts) held
 * by a snapshot row instead of by children: its RAM image lies on disk in the fork point's
 * directory (`ram.img`, sparse), beside the device state, over the disk layer frozen at that
 * moment. Taking one is a live fork without children (the sandbox pauses as long as a fork pauses
 * it); starting sandboxes from one restores children from it, their RAM mapped copy-on-write from
 * the image where it lies; rolling a sandbox back makes it a suspended sandbox whose snapshot is
 * that moment, and resumes it. Rows and files survive a restart; a snapshot a crash caught before
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

/** The tenant's ready snapshot `id`; snapshot_not_found for another tenant's, or one still being taken. */
function snapshotFor(ctx: EngineContext, id: string, scope?: Scope): SnapshotRow {
  const s = typeof id === 'string' ? ctx.repo.snapshot(id) : undefined;
  if (!s || s.state !== 'ready' || (scope && s.tenant !== scope.tenant)) throw snapshotNotFound(String(id));
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
    egress: row.egress, on_timeout: row.on_timeout, auto_resume: row.auto_resume, public_ports: row.public_ports, port_host: row.port_host, timeout_secs: row.timeout_secs,
    bytes: 0, created_at: Date.now(), state: 'creating', environment: null,
  };
}

/** What a snapshot's own files occupy: its RAM image, device state and the disk layer frozen for it. */
function bytesOf(fp: { dir: string; disk: string }): number {
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
async function holding<T>(ctx: EngineContext, s: SnapshotRow, fn: () => Promise<T>): Promise<T> {
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
function forkPointOf(ctx: EngineContext, s: SnapshotRow): ForkPoint {
  const f = ctx.repo.forkPoint(s.fork_point);
  if (!f || !existsSync(f.mem_path)) throw new CollimateError('internal_error', `Snapshot ${s.id} lost its files (fork point ${s.fork_point}); delete it.`);
  return { id: f.id, dir: f.dir, mem: f.mem_path, disk: f.disk_path };
}

/**
 * Starts `count` sandboxes from a snapshot: each restored from it as a fork child is from its fork
 * point (a fresh identity, the snapshot's memory, processes and files), its RAM mapped copy-on-write
 * from the image on disk. VMMs spawned ahead for the template (forkReceivers.ts) are used first.
 */
export async function startFromSnapshot(ctx: EngineContext, snapId: string, opts: StartFromSnapshotOptions, scope: Scope): Promise<SandboxInfo[]> {
  ctx.assertOpen();
  const problem = forkCountProblem(opts.count);
  if (problem) throw new CollimateError('validation_error', problem);
  const s = snapshotFor(ctx, snapId, scope);
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
        { count: opts.count, labels: opts.labels }, vmms, phases, { fileReady: true }, s.id, warm.vms);
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
 * processes and files become the snapshot's. A running sandbox is stopped and becomes a suspended
 * sandbox whose suspend image is the snapshot (links to its files, a new top layer on its disk
 * layer), then resumed; a suspended one stays suspended at that moment. Operations queued behind
 * the rollback fail with sandbox_restored. A crash before the row is switched leaves the sandbox
 * as it was; after, it is the snapshot's, suspended.
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
        switchTo(ctx, cur, s, p);
        removeAfterwards(ctx, dirname(cur.snapshot!.statePath));
        removeOwnLayers(ctx, id, cur.vmm!.diskPath, p.disk);
        ctx.processes.replace(id, s.id);
        return true;
      });
      if (done) {
        gcForkPoints(ctx);
        ctx.emit('transition', { id, tenant: row.tenant, state: 'suspended', op: 'restore' });
        return getInfo(ctx, id);
      }
    }
    const r = runningFor(ctx, id, scope, 'restore');
    const phases = new Phases('restore');
    await r.queue.run(() => ctx.registry.serialized(id, async () => {
      if (r.deleting) throw r.rolledBack ? gone(r) : invalidState(id, 'busy', 'restore', ['running', 'suspended']);
      ctx.registry.flushActivity();
      const vmm = r.live.vmm;
      const rec = r.live.record;
      const p = await phases.time('prepare', () => prepareSwitch(ctx, id, s));
      try {
        await phases.time('stop', () => vmm.qmp.execute('stop'));
      } catch (e) {
        rmSync(p.snapDir, { recursive: true, force: true });
        rmSync(p.disk, { force: true });
        throw vmmFailure('restore', e, r);
      }
      // Operations queued behind fail from here on, saying why; the VMM goes once the row says the
      // snapshot is the sandbox (a crash before finds it stopped, and reconcile runs it on).
      r.deleting = true;
      r.rolledBack = s.id;
      const t0 = performance.now();
      switchTo(ctx, ctx.repo.get(id)!, s, p);
      phases.since('switch', t0);
      await ctx.fault('restore:switched');
      ctx.registry.remove(id);
      r.live.agent.close();
      await phases.time('teardown', () => vmm.kill());
      const t1 = performance.now();
      if (rec.memPath === join(ctx.cfg.ramDir, `${id}.mem`)) rmSync(rec.memPath, { force: true });
      const pooled = pooledVmmDir(ctx.cfg, id, rec);
      if (pooled) rmSync(pooled, { recursive: true, force: true });
      removeOwnLayers(ctx, id, rec.diskPath, p.disk);
      phases.since('cleanup', t1);
      // Its processes are the snapshot's, as the host knew them then; the resume learns them from the guest.
      ctx.processes.replace(id, s.id);
    }));
    const t2 = performance.now();
    gcForkPoints(ctx);
    phases.since('gc', t2);
    // Onto a VMM the snapshot's pool restored ahead, when it has one; else resumed as any suspended sandbox.
    const pooled = await resumeFromPool(ctx, id, s, phases);
    if (pooled) return pooled;
    ctx.emit('phases', phases.report(id));
    return await resumeSandbox(ctx, id, scope, 'restore').catch((e) => {
      // Resumed meanwhile by another request: it runs, from the snapshot.
      if (e instanceof CollimateError && e.code === 'invalid_state' && e.details?.state === 'running') return getInfo(ctx, id);
      throw e;
    });
  });
}

/**
 * Resumes sandbox `id`, just switched to snapshot `s` (suspended at its moment), on a VMM of the
 * snapshot's pool (snapshotPools.ts): restored from the snapshot ahead and paused, it is claimed as
 * the sandbox — resumed with its id, fresh entropy and clock, as a resume gives — and the row says
 * so once it runs. Null when the pool has none ready (or the claim failed; the row is untouched, and
 * the caller resumes it the usual way). A crash before the row is written leaves it suspended at
 * the snapshot, as a rollback cut off there always did.
 */
async function resumeFromPool(ctx: EngineContext, id: string, s: SnapshotRow, phases: Phases): Promise<SandboxInfo | null> {
  const fp = forkPointOf(ctx, s);
  const warm = takeWarm(ctx, s, fp, 1);
  const vm = warm.vms[0];
  let committed = false;
  try {
    if (!vm?.warm) return null;
    const info = await ctx.capacity.within('resume', { vmms: 1, memoryMib: s.memory_mib }, () => ctx.registry.serialized(id, async () => {
      const cur = ctx.repo.get(id);
      if (!cur || cur.state !== 'suspended' || cur.from_snapshot !== s.id) return null;
      await phases.time('egress_apply', () => applyEgress(ctx, vm, s, cur.egress));
      const live = await claimWarm(vm.warm!, id, phases);
      const t0 = performance.now();
      const now = Date.now();
      ctx.repo.update(id, { state: 'running', vmm: live.record, snapshot: null, pending_op: null, session_started_at: now, session_ends_at: now + cur.timeout_secs * 1000, last_active: now });
      committed = true;
      ctx.registry.add(id, live);
      phases.since('commit', t0);
      // The suspend directory and empty top layer the switch made are not used: the pool's VMM has its own.
      removeAfterwards(ctx, dirname(cur.snapshot!.statePath));
      removeOwnLayers(ctx, id, cur.vmm!.diskPath, live.record.diskPath);
      ctx.emit('transition', { id, tenant: cur.tenant, state: 'running', op: 'restore' });
      ctx.emit('phases', phases.report(id));
      return getInfo(ctx, id);
    }));
    if (!info) await destroyPending(vm);
    return info;
  } catch (e) {
    if (committed) throw e;
    if (vm) await destroyPending(vm).catch(() => {});
    // Claimed or not, the row still says suspended at the snapshot: the usual resume takes it from there.
    if (ctx.repo.get(id)?.state === 'suspended') return null;
    throw e;
  } finally {
    warm.served();
  }
}

interface PreparedSwitch {
  /** The sandbox's new suspend directory: links to the snapshot's image and device state. */
  snapDir: string;
  /** Its new top disk layer, empty, over the snapshot's layer. */
  disk: string;
}

/**
 * The suspend directory and top layer a rollback switches the sandbox onto, made beside what it
 * has (a directory of its own name: a suspended sandbox's `suspend` stays until the switch).
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
    rmSync(snapDir, { recursive: true, force: true });
    rmSync(disk, { force: true });
    throw e;
  }
  return { snapDir, disk };
}

/**
 * Makes the row say the sandbox is suspended at the snapshot's moment, in one transaction: its
 * suspend image is the snapshot's, its disk a new layer over the snapshot's, and it holds the
 * snapshot's fork point and what that holds instead of its old chain.
 */
function switchTo(ctx: EngineContext, row: SandboxRow, s: SnapshotRow, p: PreparedSwitch): void {
  ctx.repo.tx(() => {
    ctx.repo.dropRefs(row.id);
    ctx.repo.addRef(s.fork_point, row.id);
    for (const up of ctx.repo.refsOf(s.fork_point)) ctx.repo.addRef(up, row.id);
    ctx.repo.update(row.id, {
      state: 'suspended', snapshot: snapshotRecord(p.snapDir), vmm: { ...row.vmm!, diskPath: p.disk }, pending_op: null, from_snapshot: s.id,
    });
  });
}

/** A snapshot a crash caught before it was whole is removed (its fork point goes unless a sandbox sits on it). */
export function reconcileSnapshots(ctx: EngineContext): void {
  for (const s of ctx.repo.unfinishedSnapshots()) {
    ctx.progress?.(`snapshot ${s.id}: cut off by a restart before its files were whole; removing it`);
    ctx.repo.removeSnapshot(s.id);
  }
}
