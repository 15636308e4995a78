import { existsSync, readdirSync, rmSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { stopOrphanedBakes } from '../images/bake.js';
import { adoptVm, killFromDir, killPid, killRecorded, qemuProcessesNaming, sweepConfinement } from './runtime.js';
import type { SandboxRow } from './repo.js';
import { gcForkPoints, markLost, removeSandboxFiles } from './delete.js';
import { dirs, pooledVmmDir, type EngineContext } from './context.js';
import { SNAPSHOT_REMOVED, continueGuestProcesses, snapshotRecord } from './suspendResume.js';
import { reconcileSnapshots } from './snapshots.js';

/**
 * Brings the database and the host back into agreement after a start: re-adopts VMMs of running
 * sandboxes, finishes or rolls back half-done suspends and forks, and stops every VMM and removes
 * every file that no row accounts for. Runs before the warm pools spawn anything: every VMM
 * directory found now belongs to the past.
 */
export async function reconcile(ctx: EngineContext): Promise<void> {
  const { sandboxes, disks, forkpoints } = dirs(ctx.cfg);
  const known = new Set<string>();
  for (const row of ctx.repo.live()) {
    known.add(row.id);
    // A VMM taken from a pool (a resume on a receiver) runs in a directory named after that VMM.
    const pooled = pooledVmmDir(ctx.cfg, row.id, row.vmm);
    if (pooled) known.add(basename(pooled));
    await reconcileRow(ctx, row).catch(async (e) => {
      ctx.progress?.(`reconcile ${row.id}: ${(e as Error).message}; marking it deleted`);
      if (row.vmm) await killRecorded(ctx.cfg, row.vmm);
      markLost(ctx, row, `the server found it broken at a restart (${(e as Error).message})`);
    });
  }
  // Warm-pool VMMs of the previous process and children of a fork that never committed.
  for (const d of readdirSync(sandboxes)) {
    if (known.has(d) && ctx.repo.get(d)?.state !== 'deleted') continue;
    await killFromDir(ctx.cfg, join(sandboxes, d));
    rmSync(join(sandboxes, d), { recursive: true, force: true });
  }
  // Fork points whose recv VMM survived a crash mid-fork.
  const fps = new Set(ctx.repo.allForkPoints().map((f) => f.id));
  for (const d of readdirSync(forkpoints)) {
    await killFromDir(ctx.cfg, join(forkpoints, d, 'recv'));
    rmSync(join(forkpoints, d, 'recv'), { recursive: true, force: true });
    if (!fps.has(d)) rmSync(join(forkpoints, d), { recursive: true, force: true });
  }
  // A half-made fork point stays while its parent's disk chain refers to it; otherwise it goes
  // (with a snapshot the crash caught before its files were whole).
  reconcileSnapshots(ctx);
  gcForkPoints(ctx);
  // Disk layers no row accounts for: warm-pool disks of the previous process, children of a fork
  // that never committed.
  const inUse = new Set<string>([
    ...ctx.repo.live().map((r) => r.vmm?.diskPath).filter((p): p is string => !!p),
    ...ctx.repo.allForkPoints().map((f) => f.disk_path),
  ]);
  for (const f of readdirSync(disks)) {
    const p = join(disks, f);
    if (!inUse.has(p)) rmSync(p, { force: true });
  }
  for (const f of readdirSync(ctx.cfg.ramDir)) {
    const p = join(ctx.cfg.ramDir, f);
    if (f.startsWith('artifact-')) continue;
    const owner = f.replace(/\.mem$/, '');
    if (owner.startsWith('fp_') && fps.has(owner)) continue;
    // A sandbox's own RAM file while its VMM maps it: not one a rollback onto a pool VMM left
    // behind when the crash came after the switch (the sandbox runs on the snapshot's image then).
    if (owner.startsWith('sbx_') && ctx.registry.get(owner)?.live.record.memPath === p) continue;
    // Spare seeds, fork receivers' remap directories (remap-*): the previous process's.
    rmSync(p, { recursive: true, force: true });
  }
  // Last, any VMM of this home no running sandbox accounts for: one a crash caught before its
  // record was whole, or one whose record a later VMM in the same directory replaced (a resume
  // that failed and was retried). Nothing of this home may run that no row knows.
  const adopted = new Set(ctx.registry.all().map((r) => r.live.vmm.pid));
  for (const pid of qemuProcessesNaming(`${ctx.cfg.home}/`)) {
    if (adopted.has(pid)) continue;
    ctx.progress?.(`stopping QEMU ${pid}: it names this home and no running sandbox accounts for it`);
    await killPid(pid);
  }
  // Template bakes cut off by a crash: their VMMs run on, recorded in their build directories.
  await stopOrphanedBakes(ctx.cfg.cacheDir, ctx.cfg.artifactRamDir, ctx.progress);
  // Cgroups of VMMs that never started (a crash between preparing a VMM and spawning it).
  await sweepConfinement(ctx.cfg);
  // Namespaces of VMMs that are gone (or never started).
  await ctx.net?.sweep(new Set(ctx.registry.all().map((r) => r.live.record.net?.ns).filter((n): n is string => !!n)));
}

async function reconcileRow(ctx: EngineContext, row: SandboxRow): Promise<void> {
  if (row.state === 'deleting') {
    if (row.vmm) await killRecorded(ctx.cfg, row.vmm);
    if (row.vmm) await killFromDir(ctx.cfg, row.vmm.dir);
    removeSandboxFiles(ctx, row);
    // A delete the previous server had begun: finished, as the tenant asked.
    ctx.repo.markDeleted(row.id, Date.now());
    return;
  }
  const dir = join(dirs(ctx.cfg).sandboxes, row.id);
  // The snapshot of a resume that answered, if the crash came before it was removed; and suspend
  // images a rollback (snapshots.ts) made and never switched to, or switched away from.
  const current = row.state === 'suspended' && row.snapshot ? dirname(row.snapshot.statePath) : null;
  for (const f of existsSync(dir) ? readdirSync(dir) : []) {
    const p = join(dir, f);
    const stale = f.startsWith('suspend-') || (f === 'suspend' && current !== null);
    if (f.includes(SNAPSHOT_REMOVED) || (stale && p !== current)) rmSync(p, { recursive: true, force: true });
  }
  const snapDir = join(dir, 'suspend');
  if (row.state === 'suspended' || (row.pending_op?.op === 'suspend' && existsSync(join(snapDir, 'complete')))) {
    // Finish a suspend whose snapshot was complete: the VMM must not run on beside the snapshot.
    if (row.vmm) await killRecorded(ctx.cfg, row.vmm);
    // A resume cut off by the crash had started a new VMM, recorded only in its directory (the row
    // is written once it runs): the sandbox's own, or a receiver's the previous life ran in. The
    // snapshot is still the sandbox.
    if (row.vmm) await killFromDir(ctx.cfg, row.vmm.dir);
    const pooled = pooledVmmDir(ctx.cfg, row.id, row.vmm);
    if (pooled) {
      await killFromDir(ctx.cfg, dir);
      // A suspend cut off after it was recorded but before the directory of the pool VMM its
      // sandbox ran in was removed: nothing runs there any more.
      rmSync(pooled, { recursive: true, force: true });
    }
    if (row.state !== 'suspended') ctx.repo.update(row.id, { state: 'suspended', snapshot: snapshotRecord(snapDir), pending_op: null });
    if (!row.snapshot && row.state === 'suspended') throw new Error('suspended without a snapshot');
    return;
  }
  if (!row.vmm) throw new Error('no VMM recorded');
  const artifact = ctx.templates.artifactFor(row.vmm.artifactKey);
  const live = await adoptVm(ctx.cfg, artifact.shape, row.vmm);
  // The namespace kept its rules, but its resolver went with the previous server: point DNS at a new one.
  if (live.record.net) {
    if (!ctx.net) { await live.vmm.kill(); throw new Error('it has a network namespace but networking is off now'); }
    await ctx.net.apply(live.record.net, row.egress);
  }
  // A half-done suspend or fork is rolled back: adoptVm resumed a stopped VMM, and a suspend that
  // was to keep only the files may have stopped the guest's processes.
  if (row.pending_op?.op === 'suspend' && row.pending_op.diskOnly) await continueGuestProcesses(live.agent);
  rmSync(snapDir, { recursive: true, force: true });
  ctx.repo.update(row.id, { state: 'running', vmm: live.record, pending_op: null });
  ctx.registry.add(row.id, live);
}
