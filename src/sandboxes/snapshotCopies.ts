import { constants as fsConstants, existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { copyFile } from 'node:fs/promises';
import { join } from 'node:path';
import { CollimateError } from '../errors.js';
import { sha256File } from '../host/hash.js';
import { run } from '../host/run.js';
import type { LocalBlob } from '../images/localBlobs.js';
import { dirs, type EngineContext } from './context.js';
import { gcForkPoints } from './delete.js';
import { SNAPSHOT_RAM } from './fork.js';
import type { SnapshotRow } from './repo.js';
import { newDiskPath, newForkPointId } from './runtime.js';
import { dropSnapshotPool } from './snapshotPools.js';
import { bytesOf, forkPointOf, holding, snapshotFor } from './snapshots.js';
import type { Scope } from './types.js';

/**
 * Snapshots across cluster hosts, the engine's side (the cluster's: src/cluster/snapshotPull.ts).
 * A snapshot lies on the host that took it, its **origin**; another host of the same compatibility
 * class starts sandboxes from it once it holds a **copy**:
 *
 * - **Export** (on the origin, once per snapshot, kept in its fork point's `export/`): the device
 *   state and RAM image as they lie, and the disk flattened into one qcow2 overlay over the template
 *   artifact's disk (a copy of the snapshot's layer rebased, safe mode, onto that disk), each named
 *   by the sha256 of its bytes. The origin serves them by digest through its blob API (LocalBlobs
 *   asks `blobs()`), holes left out.
 * - **Import** (on the host that starts from it): a fork point of its own with the files pulled,
 *   the disk pointed at this host's copy of the artifact's disk (`qemu-img rebase -u`, the bytes
 *   being the same), and a snapshot row under the same id whose `origin` names the origin host.
 *   Rows first (`creating`), files, then ready: a crash leaves a row reconcile removes, so a copy is
 *   whole or absent. Starts from it are starts from a snapshot (snapshots.ts), pools included.
 * - A copy is not the tenant's snapshot: never listed, inspected, rolled back to or deleted as one
 *   (snapshotFor). It goes when its origin no longer has the snapshot (`drop`, which the cluster
 *   calls when the snapshot is deleted, and again from a sweep for hosts that missed that); its
 *   files then go with the last sandbox that sits on them, as a fork point's do.
 */

/** One file of a snapshot as it travels, by the sha256 of its bytes. */
export interface SnapshotFile {
  name: 'device.state' | 'ram.img' | 'disk.qcow2';
  digest: string;
  size: number;
  /** Pulled in the sparse representation (RAM image, disk). */
  sparse: boolean;
}

/** What a host needs to hold a copy: the row's fields that travel, and the files. */
export interface SnapshotManifest {
  snapshot: Omit<SnapshotRow, 'fork_point' | 'state' | 'origin' | 'environment'>;
  files: SnapshotFile[];
}

/** The snapshot operations cluster mode calls (Engine.snapshotCopies). */
export interface SnapshotCopyEngine {
  /** The origin's side: the manifest of its snapshot `id`, its files exported (once) and served by digest. */
  exportOut(id: string, scope?: Scope): Promise<SnapshotManifest>;
  /**
   * Makes a copy of another host's snapshot here, pulling each file with `pull` (which verifies
   * its digest). False when this host holds the snapshot already (its own, or a copy).
   */
  importIn(m: SnapshotManifest, origin: string, pull: (f: SnapshotFile, dest: string) => Promise<void>): Promise<boolean>;
  /** Whether a start of snapshot `id` finds it here (its own, or a copy). */
  holds(id: string): boolean;
  /** Drops this host's copy of snapshot `id`; false when it holds none. */
  drop(id: string): boolean;
  /** The copies held here, with their origins. */
  copies(): Array<{ id: string; tenant: string; origin: string }>;
  /** What this host serves of snapshots by digest: its own snapshots' exports, its copies' RAM images and device states. */
  blobs(): LocalBlob[];
}

const EXPORT_DIR = 'export';
const EXPORT_RECORD = 'files.json';
const COPY_RECORD = 'copy.json';

/** Exports (and imports) under way per engine: concurrent pulls of one snapshot share one. */
const inflight = new WeakMap<EngineContext, Map<string, Promise<unknown>>>();

function once<T>(ctx: EngineContext, key: string, f: () => Promise<T>): Promise<T> {
  const m = inflight.get(ctx) ?? new Map<string, Promise<unknown>>();
  inflight.set(ctx, m);
  let p = m.get(key) as Promise<T> | undefined;
  if (!p) {
    p = f().finally(() => m.delete(key));
    m.set(key, p);
  }
  return p;
}

function travelling(s: SnapshotRow): SnapshotManifest['snapshot'] {
  const { fork_point: _fp, state: _state, origin: _origin, environment: _env, ...rest } = s;
  return rest;
}

/**
 * The manifest of this host's snapshot `id`: its files exported into its fork point's `export/`
 * the first time (the flattened disk is made then; the image and device state are hashed where
 * they lie), read from the record after. The fork point is held meanwhile, so a delete of the
 * snapshot does not remove files being hashed.
 */
export function exportSnapshot(ctx: EngineContext, id: string, scope?: Scope): Promise<SnapshotManifest> {
  ctx.assertOpen();
  const s = snapshotFor(ctx, id, scope);
  return once(ctx, `export:${id}`, () => holding(ctx, s, async () => {
    const fp = forkPointOf(ctx, s);
    const out = join(fp.dir, EXPORT_DIR);
    const record = join(out, EXPORT_RECORD);
    if (existsSync(record)) return { snapshot: travelling(s), files: JSON.parse(readFileSync(record, 'utf8')) as SnapshotFile[] };
    const tmp = join(fp.dir, `${EXPORT_DIR}.tmp`);
    rmSync(tmp, { recursive: true, force: true });
    mkdirSync(tmp, { recursive: true });
    try {
      const disk = join(tmp, 'disk.qcow2');
      // A copy of the snapshot's layer (a reflink where the file system has them), holding after a
      // safe rebase everything its chain has that the artifact's disk has not.
      await copyFile(fp.disk, disk, fsConstants.COPYFILE_FICLONE);
      await run('qemu-img', ['rebase', '-q', '-f', 'qcow2', '-F', 'raw', '-b', ctx.templates.artifactFor(s.artifact_key).diskPath, disk]);
      const at = { 'device.state': join(fp.dir, 'device.state'), 'ram.img': fp.mem, 'disk.qcow2': disk } as const;
      const files: SnapshotFile[] = [];
      for (const name of ['device.state', 'ram.img', 'disk.qcow2'] as const) {
        const path = at[name];
        files.push({ name, digest: `sha256:${await sha256File(path)}`, size: statSync(path).size, sparse: name !== 'device.state' });
      }
      writeFileSync(join(tmp, EXPORT_RECORD), JSON.stringify(files));
      rmSync(out, { recursive: true, force: true });
      renameSync(tmp, out);
      return { snapshot: travelling(s), files };
    } catch (e) {
      rmSync(tmp, { recursive: true, force: true });
      throw new CollimateError('vmm_failed', `Exporting snapshot ${id} for another host failed: ${(e as Error).message}. Nothing was changed; retry.`, { cause: e });
    }
  }));
}

/** A copy of another host's snapshot, made here (see the module's comment). */
export function importSnapshot(ctx: EngineContext, m: SnapshotManifest, origin: string, pull: (f: SnapshotFile, dest: string) => Promise<void>): Promise<boolean> {
  ctx.assertOpen();
  const id = m.snapshot.id;
  return once(ctx, `import:${id}`, async () => {
    if (ctx.repo.snapshot(id)?.state === 'ready') return false;
    let artifactDisk: string;
    try {
      artifactDisk = ctx.templates.artifactFor(m.snapshot.artifact_key).diskPath;
    } catch {
      throw new CollimateError('conflict', `This host does not hold the template artifact ${m.snapshot.artifact_key} that snapshot ${id} was taken on (template ${m.snapshot.template}); start it on a host that does.`, { details: { reason: 'artifact_missing' } });
    }
    for (const f of m.files) if (!['device.state', 'ram.img', 'disk.qcow2'].includes(f.name)) throw new CollimateError('validation_error', `Snapshot ${id}'s manifest names an unknown file ${f.name}.`);
    const fpId = newForkPointId();
    const dir = join(dirs(ctx.cfg).forkpoints, fpId);
    const at = { 'device.state': join(dir, 'device.state'), 'ram.img': join(dir, SNAPSHOT_RAM), 'disk.qcow2': newDiskPath(dirs(ctx.cfg).disks, id) } as const;
    // Recorded before any file exists: a crash from here on leaves a row reconcile removes, with its fork point.
    ctx.repo.tx(() => {
      ctx.repo.removeSnapshot(id); // an earlier copy's row a failure left, if any
      ctx.repo.addForkPoint(fpId, dir, at['ram.img'], at['disk.qcow2']);
      ctx.repo.insertSnapshot({ ...m.snapshot, fork_point: fpId, state: 'creating', origin, environment: null });
      ctx.repo.addRef(fpId, id);
    });
    ctx.forking.add(fpId);
    try {
      mkdirSync(dir, { recursive: true });
      for (const f of m.files) await pull(f, at[f.name]);
      for (const name of Object.keys(at) as Array<keyof typeof at>) statSync(at[name]);
      await run('qemu-img', ['rebase', '-q', '-u', '-f', 'qcow2', '-F', 'raw', '-b', artifactDisk, at['disk.qcow2']]);
      // The image and device state are byte for byte the origin's: this host serves them too.
      writeFileSync(join(dir, COPY_RECORD), JSON.stringify(m.files.filter((f) => f.name !== 'disk.qcow2')));
      ctx.repo.tx(() => {
        ctx.repo.markForkPointReady(fpId);
        ctx.repo.markSnapshotReady(id, bytesOf({ dir, disk: at['disk.qcow2'] }));
      });
      return true;
    } catch (e) {
      ctx.repo.removeSnapshot(id);
      ctx.forking.delete(fpId);
      gcForkPoints(ctx);
      throw e;
    } finally {
      ctx.forking.delete(fpId);
    }
  });
}

/** Drops this host's copy of snapshot `id` (its files go once no sandbox sits on them). */
export function dropSnapshotCopy(ctx: EngineContext, id: string): boolean {
  const s = ctx.repo.snapshot(id);
  if (!s?.origin) return false;
  ctx.repo.removeSnapshot(id);
  dropSnapshotPool(ctx, id);
  gcForkPoints(ctx);
  return true;
}

/** What this host serves of snapshots by digest (SnapshotCopyEngine.blobs). */
export function snapshotBlobs(ctx: EngineContext): LocalBlob[] {
  const out: LocalBlob[] = [];
  for (const s of ctx.repo.readySnapshots()) {
    const fp = ctx.repo.forkPoint(s.fork_point);
    if (!fp) continue;
    const record = s.origin ? join(fp.dir, COPY_RECORD) : join(fp.dir, EXPORT_DIR, EXPORT_RECORD);
    let files: SnapshotFile[];
    try {
      files = JSON.parse(readFileSync(record, 'utf8')) as SnapshotFile[];
    } catch {
      continue; // not exported
    }
    const pathOf = (f: SnapshotFile) => f.name === 'ram.img' ? fp.mem_path : f.name === 'device.state' ? join(fp.dir, 'device.state') : join(fp.dir, EXPORT_DIR, 'disk.qcow2');
    for (const f of files) out.push({ digest: f.digest, kind: 'snapshot', path: pathOf(f), size: f.size, sparse: f.sparse, of: s.id });
  }
  return out;
}
