/**
 * Warm capacity for snapshots started often. A snapshot's pool holds VMMs already restored from
 * it — the RAM image mapped copy-on-write where it lies, a disk layer of their own over its frozen
 * one, one warm-up exec run, paused — so a start from it is `cont` and a fresh identity, as a create
 * from a template's pool is, instead of a restore on the start path. A snapshot started once costs
 * nothing more; its pool is made when it is started again within the pools' idle time, and sizes
 * itself by the starts it sees from then on (poolSizer.ts: the largest burst, back to none once
 * idle), within the host's budget for warm VMMs that the templates' pools share (TemplatePools).
 * Deleting the snapshot destroys its pool.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { policyKey } from '../net/policy.js';
import type { SnapshotRow } from './repo.js';
import type { ForkPoint } from './fork.js';
import { spawnPooled, type PendingVm } from './runtime.js';
import { trustedLayers, type EngineContext } from './context.js';

/** When each snapshot without a pool was last started, per engine. */
const lastStarts = new WeakMap<EngineContext, Map<string, number>>();

export function snapshotPoolKey(snapId: string): string {
  return `snapshot:${snapId}`;
}

/**
 * Up to `n` VMMs of snapshot `s`'s pool, restored and paused under the snapshot's egress policy;
 * the start counts as `n` asked of the pool, which grows to serve such starts from then on.
 * `served` once the start has made its sandboxes (or failed).
 */
export function takeWarm(ctx: EngineContext, s: SnapshotRow, fp: ForkPoint, n: number): { vms: PendingVm[]; served: () => void } {
  const key = snapshotPoolKey(s.id);
  if (!ctx.templates.hasPool(key)) {
    const seen = lastStarts.get(ctx) ?? new Map<string, number>();
    lastStarts.set(ctx, seen);
    const now = Date.now();
    const before = seen.get(s.id);
    seen.set(s.id, now);
    for (const [id, at] of seen) if (now - at > ctx.cfg.poolIdleSecs * 1000) seen.delete(id);
    if (before === undefined || now - before > ctx.cfg.poolIdleSecs * 1000) return { vms: [], served: () => {} };
    seen.delete(s.id);
    // Read once for the pool's life: every VMM it restores loads the same device state.
    const devState = readFileSync(join(fp.dir, 'device.state'));
    ctx.templates.addPool(key, () => spawnWarm(ctx, s, fp, devState), { initial: 0, min: 0 },
      (e) => ctx.progress?.(`warm pool of snapshot ${s.id}: spawn failed: ${(e as Error).message}`));
  }
  return ctx.templates.takeReady(key, n);
}

/** Destroys snapshot `snapId`'s pool, if it has one (its VMMs go in the background). */
export function dropSnapshotPool(ctx: EngineContext, snapId: string): void {
  const key = snapshotPoolKey(snapId);
  if (ctx.templates.hasPool(key)) void ctx.templates.removePool(key).catch(() => {});
}

/** A VMM of the snapshot's pool: always restored and paused (a start claims it, a rollback too). */
function spawnWarm(ctx: EngineContext, s: SnapshotRow, fp: ForkPoint, devState: Buffer): Promise<PendingVm> {
  const shape = { ...ctx.templates.artifactFor(s.artifact_key).shape, vcpus: s.vcpus, memoryMib: s.memory_mib };
  return spawnPooled(ctx.cfg, ctx.net, shape,
    { memPath: fp.mem, backing: { path: fp.disk, format: 'qcow2' }, artifactKey: s.artifact_key, trustedLayers: trustedLayers(ctx, fp.id, s.artifact_key) },
    s.egress, devState);
}

/** A pool VMM for a start under another policy than the snapshot's gets that one before it wakes. */
export async function applyEgress(ctx: EngineContext, vm: PendingVm, s: SnapshotRow, egress: SnapshotRow['egress']): Promise<void> {
  if (vm.record.net && policyKey(egress) !== policyKey(s.egress)) await ctx.net!.apply(vm.record.net, egress);
}
