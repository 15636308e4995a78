import { constants as fsConstants, mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { copyFile } from 'node:fs/promises';
import { join } from 'node:path';
import { CollimateError, msg, see } from '../errors.js';
import { sha256File } from '../host/hash.js';
import { run } from '../host/run.js';
import { newDiskPath } from './runtime.js';
import type { SandboxRow } from './repo.js';
import { removeSandboxFiles, gcForkPoints } from './delete.js';
import { snapshotFiles, snapshotRecord } from './suspendResume.js';
import { dirs, rowFor, type EngineContext } from './context.js';

/**
 * Moving a suspended sandbox between cluster hosts, the engine's side of it (the cluster's side,
 * which hosts and in what order, is src/cluster/moves.ts and src/api/moveRoutes.ts).
 *
 * What moves is self-contained: the snapshot's device state and RAM image as they lie, and the
 * disk **flattened** into one qcow2 overlay over the template artifact's frozen disk — a copy of the
 * top layer rebased (safe mode: every cluster where its chain differs from the artifact's disk is
 * written into it) onto that disk. Fork points below the disk stay where they are: the receiver
 * needs only the artifact, which it holds under the same key (artifact keys are portable), and the
 * overlay is pointed at its own copy of it (`qemu-img rebase -u`, the bytes being the same).
 *
 * The source keeps owning the sandbox until the cluster directory's row flips to the receiver
 * (moves.ts); until then the receiver's copy is a row with `pending_op: move`, which no request
 * reaches (the directory names the source) and which the receiver removes when the move fails or,
 * after a crash, when the directory does not name it as owner. After the flip the source removes
 * its copy (its fork point references with it, so fork points nothing else holds go too).
 */

/** One file of a moving sandbox, by the sha256 of its bytes. */
export interface MoveFile {
  name: 'device.state' | 'ram.img' | 'disk.qcow2';
  digest: string;
  size: number;
  /** Offered and pulled in the sparse representation (RAM image, disk). */
  sparse: boolean;
}

/** What the receiver needs: the row's fields that travel, the snapshot's identity and the files. */
export interface MoveManifest {
  id: string;
  artifactKey: string;
  /** The snapshot's time: the source commits the move only if the sandbox still has this snapshot. */
  suspendedAt: number;
  row: Pick<SandboxRow, 'tenant' | 'template' | 'labels' | 'created_at' | 'last_active' | 'exec_count' | 'parent' | 'forked_at'
    | 'timeout_secs' | 'session_started_at' | 'session_ends_at' | 'vcpus' | 'memory_mib' | 'disk_mib' | 'egress'>
    // Absent from a host of an older version: the receiver's default.
    & Partial<Pick<SandboxRow, 'on_timeout' | 'auto_resume' | 'public_ports' | 'port_host' | 'keep_memory'>>;
  /** Suspended with only its files (keep_memory false): the disk is the one file, and the resume boots it. */
  diskOnly?: boolean;
  files: MoveFile[];
}

/** A prepared move on the source: its manifest and where each file lies there. */
export interface PreparedMove {
  manifest: MoveManifest;
  paths: Partial<Record<MoveFile['name'], string>>;
  /** Removes what the preparation made (the flattened disk); the snapshot is the sandbox's. */
  discard(): void;
}

/** The engine's move operations as cluster mode sees them (Engine.moves). */
export interface MoveEngine {
  prepareOut(id: string): Promise<PreparedMove>;
  commitOut(id: string, suspendedAt: number, to: string, flip: () => Promise<boolean>): Promise<{ deletedMeanwhile: boolean }>;
  /** Drops a suspended sandbox the directory places elsewhere; false when it is not here suspended. */
  dropOut(id: string, to: string): boolean;
  importIn(m: MoveManifest, pull: (f: MoveFile, dest: string) => Promise<void>): Promise<void>;
  commitIn(id: string): boolean;
  abortIn(id: string): boolean;
  pendingIn(): string[];
}

/** Sandboxes each engine is moving out now: a second move of one is refused, not interleaved. */
const movingOut = new WeakMap<EngineContext, Set<string>>();

/** Whether sandbox `id` is being moved away from this host (prepared, not yet committed or discarded). */
export function isMovingOut(ctx: EngineContext, id: string): boolean {
  return movingOut.get(ctx)?.has(id) ?? false;
}

/** The directory a move's flattened disk is made in, inside the sandbox's own directory. */
function moveOutDir(ctx: EngineContext, id: string): string {
  return join(dirs(ctx.cfg).sandboxes, id, 'move-out');
}

/**
 * Prepares suspended sandbox `id` to move: flattens its disk and hashes its files. Serialized with
 * its resume and fork, so the disk copied is the suspended one's. The sandbox stays as it is.
 * invalid_state (409) unless it is suspended; conflict when a snapshot of the old one-stream
 * format or an operation in flight stands in the way.
 */
export async function prepareMoveOut(ctx: EngineContext, id: string): Promise<PreparedMove> {
  ctx.assertOpen();
  rowFor(ctx, id);
  return ctx.registry.serialized(id, async () => {
    const row = rowFor(ctx, id);
    if (row.state !== 'suspended') {
      throw new CollimateError('invalid_state', msg`Sandbox ${id} is ${row.state === 'deleting' ? 'being deleted' : row.state}; only a suspended sandbox moves to another host. Suspend it first${see('suspendSandbox', { id })}.`, { details: { state: row.state } });
    }
    if (row.pending_op) throw new CollimateError('conflict', `Sandbox ${id} is being ${row.pending_op.op === 'move' ? 'moved' : row.pending_op.op === 'fork' ? 'forked' : 'suspended'} already; retry once that is done.`);
    const snap = row.snapshot;
    if (!(snap?.ramPath || snap?.diskOnly) || !row.vmm) throw new CollimateError('conflict', `Sandbox ${id} was suspended in the old one-stream snapshot format, which does not move; resume it and suspend it again, then move it.`);
    const moving = movingOut.get(ctx) ?? new Set<string>();
    movingOut.set(ctx, moving);
    if (moving.has(id)) throw new CollimateError('conflict', `Sandbox ${id} is being moved already; wait for that move's answer.`);
    const artifact = ctx.templates.artifactFor(row.vmm.artifactKey);
    const out = moveOutDir(ctx, id);
    moving.add(id);
    rmSync(out, { recursive: true, force: true });
    mkdirSync(out, { recursive: true });
    const disk = join(out, 'disk.qcow2');
    try {
      // A copy of the top layer (a qcow2 file holds only its allocated clusters; a reflink where
      // the file system has them)...
      await copyFile(row.vmm.diskPath, disk, fsConstants.COPYFILE_FICLONE);
      // ...holding, after a safe rebase, everything its chain has that the artifact's disk has not.
      await run('qemu-img', ['rebase', '-q', '-f', 'qcow2', '-F', 'raw', '-b', artifact.diskPath, disk]);
      const files: MoveFile[] = [];
      // A suspend that kept only the files has no device state or RAM image: the disk is all of it.
      const paths: PreparedMove['paths'] = snap.diskOnly ? { 'disk.qcow2': disk } : { 'device.state': snap.statePath, 'ram.img': snap.ramPath, 'disk.qcow2': disk };
      for (const [name, path] of Object.entries(paths) as Array<[MoveFile['name'], string]>) {
        files.push({ name, digest: `sha256:${await sha256File(path)}`, size: statSync(path).size, sparse: name !== 'device.state' });
      }
      const { tenant, template, labels, created_at, last_active, exec_count, parent, forked_at, timeout_secs, session_started_at, session_ends_at, vcpus, memory_mib, disk_mib, egress, on_timeout, auto_resume, public_ports, port_host, keep_memory } = row;
      return {
        manifest: {
          id, artifactKey: row.vmm.artifactKey, suspendedAt: snap.suspendedAt, files, ...(snap.diskOnly ? { diskOnly: true } : {}),
          row: { tenant, template, labels, created_at, last_active, exec_count, parent, forked_at, timeout_secs, session_started_at, session_ends_at, vcpus, memory_mib, disk_mib, egress, on_timeout, auto_resume, public_ports, port_host, keep_memory: keep_memory ?? 1 },
        },
        paths: { ...paths },
        discard: () => {
          rmSync(out, { recursive: true, force: true });
          moving.delete(id);
        },
      };
    } catch (e) {
      rmSync(out, { recursive: true, force: true });
      moving.delete(id);
      throw new CollimateError('vmm_failed', `Preparing sandbox ${id}'s disk to move failed: ${(e as Error).message}. Nothing was changed; retry.`, { cause: e });
    }
  });
}

/**
 * Commits a move on the source: while no resume or fork of it can run, checks that the sandbox
 * still has the snapshot the manifest was made of, runs `flip` (the directory's owner changing in
 * one PostgreSQL transaction, which fails when the directory no longer says this host owns it
 * suspended) and, when it flipped, removes the sandbox here. Throws conflict (nothing changed)
 * when the sandbox was resumed, suspended again, deleted or the flip was refused.
 * Returns whether a delete of it overtook the commit (the tenant's delete reached this host while
 * the directory flipped): the caller then deletes it on the receiver, which owns it now.
 */
export async function commitMoveOut(ctx: EngineContext, id: string, suspendedAt: number, to: string, flip: () => Promise<boolean>): Promise<{ deletedMeanwhile: boolean }> {
  return ctx.registry.serialized(id, async () => {
    const changed = () => new CollimateError('conflict', `Sandbox ${id} was resumed, deleted or suspended again while it was being moved; it stays where it is. Move it again once it is suspended.`);
    const before = ctx.repo.get(id);
    if (!before || before.state !== 'suspended' || before.pending_op || before.snapshot?.suspendedAt !== suspendedAt) throw changed();
    if (!await flip()) throw changed();
    // A delete is not serialized with resumes: one that began during the flip has marked the row.
    const after = ctx.repo.get(id);
    const deletedMeanwhile = !after || after.state !== 'suspended';
    dropMovedOut(ctx, before, to);
    return { deletedMeanwhile };
  });
}

/**
 * Removes the source's copy of a sandbox the directory now places on host `to`: its files, its fork
 * point references (fork points only it held go too) and its row (kept as deleted, saying where it
 * went, so a request that reaches this host with a stale directory reading is told). Also what a
 * source that crashed after the flip does when it rejoins (src/cluster/moves.ts).
 */
export function dropMovedOut(ctx: EngineContext, row: SandboxRow, to: string): void {
  rmSync(moveOutDir(ctx, row.id), { recursive: true, force: true });
  removeSandboxFiles(ctx, row);
  const existed = ctx.repo.get(row.id)?.state !== 'deleted';
  ctx.repo.markDeleted(row.id, Date.now(), `it was moved to cluster host ${to}; ask any host of the cluster`);
  ctx.registry.forget(row.id);
  ctx.processes.forget(row.id);
  gcForkPoints(ctx);
  if (existed) ctx.emit('transition', { id: row.id, tenant: row.tenant, state: 'deleted', op: 'move' });
}

/**
 * Receives a moving sandbox: records it as a pending move (`pending_op: move`, suspended), pulls
 * its files with `pull` (which verifies each digest) into its snapshot directory and a disk of its
 * own, points the disk at this host's copy of the artifact's disk, and marks the snapshot complete.
 * The sandbox is not this host's until commitMoveIn. Any failure removes everything it made.
 * conflict (details.reason artifact_missing) when this host does not hold the template's artifact.
 */
export async function importMoveIn(ctx: EngineContext, m: MoveManifest, pull: (f: MoveFile, dest: string) => Promise<void>): Promise<void> {
  ctx.assertOpen();
  const existing = ctx.repo.get(m.id);
  if (existing && existing.state !== 'deleted') throw new CollimateError('conflict', `Sandbox ${m.id} is on this host already (${existing.pending_op?.op === 'move' ? 'a move of it is under way' : existing.state}).`, { details: { reason: 'already_here' } });
  let artifactDisk: string;
  try {
    artifactDisk = ctx.templates.artifactFor(m.artifactKey).diskPath;
  } catch {
    throw new CollimateError('conflict', `This host does not hold the template artifact ${m.artifactKey} that sandbox ${m.id} was made from (template ${m.row.template}); move it to a host that holds it, or create a sandbox of that template there first.`, { details: { reason: 'artifact_missing' } });
  }
  // A row a move of the same sandbox away from here left.
  if (existing) ctx.repo.remove(m.id);
  const dir = join(dirs(ctx.cfg).sandboxes, m.id);
  const snapDir = join(dir, 'suspend');
  const f = snapshotFiles(snapDir);
  const diskPath = newDiskPath(dirs(ctx.cfg).disks, m.id);
  const row: SandboxRow = {
    id: m.id, ...m.row, on_timeout: m.row.on_timeout ?? ctx.cfg.reapAction, auto_resume: m.row.auto_resume ?? 0,
    public_ports: m.row.public_ports ?? 0, port_host: m.row.port_host ?? null, state: 'suspended',
    vmm: { pid: 0, startTicks: '', dir, diskPath, memPath: join(ctx.cfg.ramDir, `${m.id}.mem`), memShared: true, artifactKey: m.artifactKey },
    snapshot: m.diskOnly ? { statePath: f.statePath, diskOnly: true, bytes: 0, suspendedAt: m.suspendedAt } : { statePath: f.statePath, ramPath: f.ramPath, bytes: 0, suspendedAt: m.suspendedAt },
    pending_op: { op: 'move', startedAt: Date.now() },
  };
  // Recorded before any file exists: a crash from here on leaves a row reconcile can find.
  ctx.repo.insert(row);
  try {
    mkdirSync(snapDir, { recursive: true });
    const at: Partial<Record<MoveFile['name'], string>> = m.diskOnly ? { 'disk.qcow2': diskPath } : { 'device.state': f.statePath, 'ram.img': f.ramPath, 'disk.qcow2': diskPath };
    for (const file of m.files) {
      const dest = at[file.name];
      if (!dest) throw new Error(`unknown file ${file.name}`);
      await pull(file, dest);
    }
    for (const dest of Object.values(at)) statSync(dest);
    await run('qemu-img', ['rebase', '-q', '-u', '-f', 'qcow2', '-F', 'raw', '-b', artifactDisk, diskPath]);
    if (m.diskOnly) writeFileSync(f.diskOnly, '');
    writeFileSync(f.complete, '');
    ctx.repo.update(m.id, { snapshot: snapshotRecord(snapDir, m.suspendedAt) });
  } catch (e) {
    abortMoveIn(ctx, m.id);
    throw e;
  }
}

/** Makes a received sandbox this host's (after the directory flipped to it); false if no move of it was pending. */
export function commitMoveIn(ctx: EngineContext, id: string): boolean {
  const row = ctx.repo.get(id);
  if (row?.pending_op?.op !== 'move') return false;
  ctx.repo.update(id, { pending_op: null });
  ctx.emit('transition', { id, tenant: row.tenant, state: 'suspended', op: 'move' });
  return true;
}

/** Removes a received sandbox whose move did not complete (nothing if no move of it is pending). */
export function abortMoveIn(ctx: EngineContext, id: string): boolean {
  const row = ctx.repo.get(id);
  if (row?.pending_op?.op !== 'move') return false;
  removeSandboxFiles(ctx, row);
  ctx.repo.remove(id);
  return true;
}

/** Ids of sandboxes being moved onto this host (pending_op move), for the cluster's reconcile. */
export function pendingMovesIn(ctx: EngineContext): string[] {
  return ctx.repo.live().filter((r) => r.pending_op?.op === 'move').map((r) => r.id);
}
