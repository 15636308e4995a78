import { dirname, join } from 'node:path';
import { CollimateError, invalidState, msg, sandboxEnded, sandboxNotFound, see } from '../errors.js';
import type { EngineConfig } from '../config.js';
import { homePaths } from '../host/paths.js';
import type { MachineShape } from '../vmm/machine.js';
import { netAvailability, type NetManager } from '../net/netns.js';
import { RestoreUnacknowledgedError } from './runtime.js';
import { toInfo, type SandboxRepo, type SandboxRow } from './repo.js';
import type { Running, SandboxRegistry } from './registry.js';
import type { TemplatePools } from './templatePools.js';
import type { PhaseReport } from './phases.js';
import type { ForkSeeds } from './forkSeeds.js';
import type { ForkReceivers } from './forkReceivers.js';
import type { HostCapacity } from './hostCapacity.js';
import type { ProcessRegistry } from './processes.js';
import type { ReapedEvent, SandboxInfo, SandboxTransition, Scope, SnapshotDeleted } from './types.js';

/**
 * What every lifecycle step (create.ts, execFiles.ts, fork.ts, suspendResume.ts, delete.ts,
 * reaper.ts, reconcile.ts) works with: the engine's configuration, rows, running sandboxes,
 * templates and network, and its events. The Engine makes one and passes it to each step.
 */
export interface EngineContext {
  readonly cfg: EngineConfig;
  readonly repo: SandboxRepo;
  readonly registry: SandboxRegistry;
  readonly templates: TemplatePools;
  /** Spare copies of backing files for the next fork point (forkSeeds.ts). */
  readonly seeds: ForkSeeds;
  /** VMMs spawned ahead of forks (forkReceivers.ts). */
  readonly receivers: ForkReceivers;
  /** Fork points of forks under way in this process: their RAM files stay (delete.ts gcForkPoints). */
  readonly forking: Set<string>;
  /** Removals of files no longer needed, made after the operation answered (a resumed sandbox's snapshot). */
  readonly removals: Set<Promise<void>>;
  /** RAM files and fork point directories being removed in the background (delete.ts removeInBackground). */
  readonly unlinking: Set<string>;
  /** Admission by what the host has: every create, fork and resume asks it first (hostCapacity.ts). */
  readonly capacity: HostCapacity;
  /** What the host knows of every sandbox's background processes (processes.ts). */
  readonly processes: ProcessRegistry;
  /** Networking (src/net): null when the server runs without (COLLIMATE_NET=off, not root). */
  readonly net: NetManager | null;
  /** Emits a persisted transition ('transition') or a reaper action ('reaped'). */
  emit(event: 'transition', t: SandboxTransition): void;
  emit(event: 'reaped', r: ReapedEvent): void;
  /** A snapshot's row removed (snapshots.ts deleteSnapshot). */
  emit(event: 'snapshotDeleted', s: SnapshotDeleted): void;
  /** A succeeded create, fork, suspend or resume, phase by phase (phases.ts). */
  emit(event: 'phases', r: PhaseReport): void;
  /** Test hook: called at named points inside multi-step operations (crash injection). */
  fault(name: string): Promise<void>;
  /** Throws shutting_down once the engine closes. */
  assertOpen(): void;
  isClosing(): boolean;
  progress?: (msg: string) => void;
}

/** Where a home keeps its sandboxes' directories, disk layers and fork points. */
export function dirs(cfg: EngineConfig): { sandboxes: string; disks: string; forkpoints: string } {
  const p = homePaths(cfg.home);
  return { sandboxes: p.sandboxes, disks: p.disks, forkpoints: join(cfg.home, 'forkpoints') };
}

/**
 * The directory of the VMM `rec` when it is one taken from a pool (a resume on a receiver runs in
 * the directory named after that VMM, not in the sandbox's own), else null. Suspend, delete and
 * reconcile treat it as the sandbox's.
 */
export function pooledVmmDir(cfg: EngineConfig, id: string, rec: { dir: string } | null | undefined): string | null {
  const { sandboxes } = dirs(cfg);
  return rec?.dir && rec.dir !== join(sandboxes, id) && dirname(rec.dir) === sandboxes ? rec.dir : null;
}

/** The row for `id` as `scope` may see it; other tenants' and deleted ids read as not found. */
export function rowFor(ctx: EngineContext, id: string, scope?: Scope): SandboxRow {
  const row = typeof id === 'string' ? ctx.repo.get(id) : undefined;
  if (!row || (scope && row.tenant !== scope.tenant)) throw sandboxNotFound(String(id));
  if (row.state === 'deleted') throw row.end_reason ? sandboxEnded(row.id, row.end_reason) : sandboxNotFound(row.id);
  return row;
}

/**
 * Why an operation that waited on a sandbox's queue finds it going: deleted (not found), or rolled
 * back to a snapshot meanwhile (sandbox_restored: what the request asked was not done).
 */
export function gone(r: Running): CollimateError {
  if (r.rolledBack) {
    return new CollimateError('sandbox_restored', `Sandbox ${r.id} was rolled back to snapshot ${r.rolledBack} while this request waited; what it asked was not done. Send it again if it still applies.`, { details: { snapshot_id: r.rolledBack } });
  }
  return sandboxNotFound(r.id);
}

/**
 * A fork or snapshot of a sandbox suspended with only its files: they are made of its memory,
 * which that suspend did not keep.
 */
export function diskOnlySuspended(id: string, operation: 'fork' | 'snapshot'): CollimateError {
  return new CollimateError(
    'invalid_state',
    msg`Sandbox ${id} was suspended with only its files (keep_memory false), and a ${operation} is made of a sandbox's memory and processes. Resume it${see('resumeSandbox', { id })} (it boots afresh from its disk), then ${operation} it.`,
    { details: { state: 'suspended' } },
  );
}

/** The running sandbox `id`, for an operation that needs its VMM; invalid_state otherwise (busy while being deleted). */
export function runningFor(ctx: EngineContext, id: string, scope: Scope | undefined, operation: string): Running {
  const row = rowFor(ctx, id, scope);
  const r = ctx.registry.get(id);
  if (row.state !== 'running' || !r || r.deleting) throw invalidState(id, row.state === 'running' ? 'busy' : row.state, operation, ['running']);
  return r;
}

/** A row as clients see it: with its activity not yet flushed, its children and its last port reading. */
export function infoOf(ctx: EngineContext, row: SandboxRow, now = Date.now()): SandboxInfo {
  return toInfo(ctx.registry.withActivity(row), ctx.repo.children(row.id), now, ctx.registry.portsOf(row.id));
}

/** `id` as `scope` may see it, now. */
export function getInfo(ctx: EngineContext, id: string, scope?: Scope): SandboxInfo {
  return infoOf(ctx, rowFor(ctx, id, scope));
}

/** The machine a sandbox runs (from its artifact). Precondition: the row has a VMM record. */
export function shapeOf(ctx: EngineContext, row: SandboxRow): MachineShape {
  return ctx.templates.artifactFor(row.vmm!.artifactKey).shape;
}

/**
 * The read-only layers below `owner`'s disk as the server knows them (its fork points' disks and
 * a fork point's own, and the artifact's). The backing chain a VMM is started on is read from
 * qcow2 headers, which the previous VMM could write; a confined VMM only starts if every layer
 * it names is one of these.
 */
export function trustedLayers(ctx: EngineContext, owner: string, artifactKey: string): string[] {
  const fps = [owner, ...ctx.repo.refsOf(owner)].map((id) => ctx.repo.forkPoint(id)?.disk_path).filter((p): p is string => !!p);
  let artifactDisk: string[] = [];
  try { artifactDisk = [ctx.templates.artifactFor(artifactKey).diskPath]; } catch { /* no artifact: no layer of it is trusted */ }
  return [...fps, ...artifactDisk];
}

/** Why the server runs without networking (for messages that say how to fix it). */
export function networkReason(cfg: EngineConfig): string {
  return netAvailability(cfg.net).reason;
}

/** A failure of a VMM operation as clients see it (502): nothing was changed. */
export function vmmFailure(op: string, e: unknown, r?: Running): CollimateError {
  if (e instanceof CollimateError) return e;
  // A delete (the tenant's, the reaper's, a VM that died) overtook it and took its files: that is
  // what the caller must hear, not the missing file it tripped over.
  if (r?.deleting) return r.lost ? sandboxEnded(r.id, r.lost) : gone(r);
  return new CollimateError('vmm_failed', `The ${op} failed inside the VMM: ${(e as Error).message}. Nothing was changed; retry, or delete the sandbox.`, { cause: e });
}

/** Whether `e` is, or (wrapped by vmmFailure) was caused by, a restore the guest never acknowledged. */
export function isUnacknowledgedRestore(e: unknown): boolean {
  return e instanceof RestoreUnacknowledgedError || (e instanceof Error && e.cause instanceof RestoreUnacknowledgedError);
}
