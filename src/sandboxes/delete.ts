import { existsSync, readdirSync, rmSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { killRecorded } from './runtime.js';
import type { SandboxRow } from './repo.js';
import { dirs, pooledVmmDir, rowFor, type EngineContext } from './context.js';
import { isMovingOut } from './move.js';
import type { Scope } from './types.js';

/**
 * Deletes from any state: at once when it runs, queued operations on it failing with not found;
 * after the operation under way when it is suspended (below). `reason`:
 * why, when it is not the tenant's delete (its VM died); later requests on it say so.
 */
export async function deleteSandbox(ctx: EngineContext, id: string, scope?: Scope, reason?: string): Promise<void> {
  rowFor(ctx, id, scope);
  // A sandbox that is not running has no VMM to stop under an operation: what is done to it (a
  // resume, a fork or snapshot of it) runs one at a time (registry.serialized), and the delete
  // waits for the one under way. Else it would remove the files a resume is starting a VMM on (the
  // resume failing with ENOENT), or a resume would commit after it and run a sandbox its row calls
  // deleted. A running one is deleted at once (its operations see `deleting`), and so is one being
  // moved away: the move's commit sees the delete and has the receiver delete it (move.ts).
  if (!ctx.registry.get(id) && !isMovingOut(ctx, id)) return ctx.registry.serialized(id, () => deleteNow(ctx, id, scope, reason));
  return deleteNow(ctx, id, scope, reason);
}

async function deleteNow(ctx: EngineContext, id: string, scope?: Scope, reason?: string): Promise<void> {
  const row = rowFor(ctx, id, scope);
  const r = ctx.registry.get(id);
  if (r) r.deleting = true;
  ctx.repo.update(id, { state: 'deleting' });
  if (r) {
    r.live.agent.close();
    await r.live.vmm.kill();
    ctx.registry.remove(id);
  } else if (row.vmm) {
    await killRecorded(ctx.cfg, row.vmm);
  }
  removeSandboxFiles(ctx, row);
  ctx.repo.markDeleted(id, Date.now(), reason);
  ctx.registry.forget(id);
  ctx.processes.forget(id);
  gcForkPoints(ctx);
  // The last sandbox on an artifact no template offers any more (its environment was deleted, or
  // replaced): the VMMs spawned ahead for its forks go, and with them their hold on its layers.
  const key = row.vmm?.artifactKey;
  if (key && !ctx.templates.offers(key) && !ctx.repo.artifactKeys().includes(key) && !ctx.repo.snapshotArtifactKeys().has(key)) await ctx.receivers.drop(key);
  ctx.emit('transition', { id, tenant: row.tenant, state: 'deleted', op: reason ? 'lost' : 'delete', ...(reason ? { reason } : {}) });
}

/** Marks a sandbox whose VMM is gone (or was stopped) deleted and removes its files (reconcile). */
export function markLost(ctx: EngineContext, row: SandboxRow, reason: string): void {
  ctx.repo.markDeleted(row.id, Date.now(), reason);
  removeSandboxFiles(ctx, row);
}

/** Removes a sandbox's directory, its own disk layers and its RAM file. */
export function removeSandboxFiles(ctx: EngineContext, row: SandboxRow): void {
  const { sandboxes } = dirs(ctx.cfg);
  rmSync(join(sandboxes, row.id), { recursive: true, force: true });
  const pooled = pooledVmmDir(ctx.cfg, row.id, row.vmm);
  if (pooled) rmSync(pooled, { recursive: true, force: true });
  removeOwnLayers(ctx, row.id, row.vmm?.diskPath);
  rmSync(join(ctx.cfg.ramDir, `${row.id}.mem`), { force: true });
}

/**
 * Removes sandbox `id`'s top layer `top` and every disk layer named after it, except those fork
 * points hold (removed with the fork point) and `keep` (a rollback's new top layer). By name
 * rather than by the row's top-disk path alone: a delete that overtakes a fork may read the row
 * before the fork recorded the parent's new top layer.
 */
export function removeOwnLayers(ctx: EngineContext, id: string, top: string | undefined, keep?: string): void {
  const held = new Set(ctx.repo.allForkPoints().map((f) => f.disk_path));
  if (keep !== undefined) held.add(keep);
  if (top && !held.has(top)) rmSync(top, { force: true });
  const { disks } = dirs(ctx.cfg);
  for (const f of readdirSync(disks)) {
    const p = join(disks, f);
    if (f.startsWith(`${id}-`) && !held.has(p)) rmSync(p, { force: true });
  }
}

/**
 * Ends a fork's hold on its fork point (`forking`), whether the fork succeeded or not. When the
 * fork point was removed under the fork (its owner deleted meanwhile, so gcForkPoints found it
 * unreferenced), the fork may still have given it files after that: the RAM seed renamed into
 * place, pages copied by path. Those go now. Then what the fork kept and nothing maps goes too
 * (a failed fork's RAM file, which the undo's collection had to keep while the fork held it).
 */
export function endFork(ctx: EngineContext, fp: { id: string; dir: string; mem: string }): void {
  ctx.forking.delete(fp.id);
  if (!ctx.repo.forkPoint(fp.id)) {
    rmSync(fp.dir, { recursive: true, force: true });
    void ctx.seeds.drop(fp.mem);
    rmSync(fp.mem, { force: true });
  }
  gcForkPoints(ctx);
}

/**
 * Removes fork points nothing depends on, repeatedly (removing one can free its ancestors), and the
 * RAM files of fork points no running sandbox maps. A fork point lives as long as its disk layer
 * is under someone's disk — its parent's, for as long as the parent lives — but its RAM is read only
 * by VMMs that map it: its running children (a suspended one's snapshot holds its own RAM image, a
 * fork of one seeds from its parent's mapped file). Kept, else, across a fork that is making it.
 */
export function gcForkPoints(ctx: EngineContext, opts: { filesAfterwards?: boolean } = {}): void {
  for (;;) {
    // Not one a fork is still making: its children, restored from it, are about to be committed
    // with references to it (a parent deleted once its memory was captured leaves complete children).
    const dead = ctx.repo.unreferencedForkPoints().filter((fp) => !ctx.forking.has(fp.id));
    if (dead.length === 0) break;
    for (const fp of dead) {
      void ctx.seeds.drop(fp.mem_path);
      if (opts.filesAfterwards) {
        // Nothing names them once the row goes: a snapshot's RAM image took ~280 ms to unlink.
        removeInBackground(ctx, fp.dir);
        if (dirname(fp.mem_path) !== fp.dir) removeInBackground(ctx, fp.mem_path);
      } else {
        rmSync(fp.dir, { recursive: true, force: true });
        rmSync(fp.mem_path, { force: true });
      }
      rmSync(fp.disk_path, { force: true });
      ctx.repo.removeForkPoint(fp.id);
    }
  }
  const mapped = new Set(ctx.repo.live().filter((r) => r.state === 'running' && r.vmm).map((r) => r.vmm!.memPath));
  // A snapshot's RAM image, on disk, is the snapshot: it stays while the snapshot does.
  const kept = ctx.repo.snapshotForkPoints();
  for (const fp of ctx.repo.allForkPoints()) {
    if (mapped.has(fp.mem_path) || kept.has(fp.id) || ctx.forking.has(fp.id) || !existsSync(fp.mem_path) || ctx.unlinking.has(fp.mem_path)) continue;
    void ctx.seeds.drop(fp.mem_path);
    removeInBackground(ctx, fp.mem_path);
  }
}

/**
 * Unlinks a RAM file no VMM maps (or a dead fork point's directory) after the caller has answered:
 * freeing hundreds of megabytes (a resumed sandbox's image on disk, a fork point's file on tmpfs)
 * took 75–175 ms, a third of a suspend. Nothing opens it meanwhile (no running sandbox maps it, no
 * fork makes it); one a crash leaves is removed by the next collection (reconcile runs it, and
 * removes fork point directories no row names).
 */
function removeInBackground(ctx: EngineContext, path: string): void {
  ctx.unlinking.add(path);
  const removal: Promise<void> = rm(path, { recursive: true, force: true })
    .catch((e) => ctx.progress?.(`removing ${path}: ${(e as Error).message}`))
    .finally(() => {
      ctx.unlinking.delete(path);
      ctx.removals.delete(removal);
    });
  ctx.removals.add(removal);
}
