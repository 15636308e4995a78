import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, readlinkSync, renameSync, rmSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ownStartTicks, processMatches, type ClaimOwner } from '../host/claims.js';
import type { LayerStore } from './layerStore.js';

/**
 * Garbage collection of image layers nobody uses. The layer store is shared by every server on the
 * host (one cache, several data directories), so no server can tell from its own rows alone who
 * needs a layer, and a server that is stopped still needs its layers when it starts again: its
 * images, and its suspended sandboxes, which resume on them. So each home keeps a record in the
 * store, `layers/homes/<tag>.json`: the diff ids its database references (its images' layers, and
 * the layers of the artifacts its templates and sandboxes sit on), rewritten whenever those change
 * and at start. A record holds while its home's database file exists, or while the process that
 * wrote it lives (a database in memory); the others are stale and removed.
 *
 * A layer goes only when all of these hold:
 * - no record holds it;
 * - it was not written or reused (its json's mtime, see LayerStore.touch) within `graceMs`: a pull
 *   that is about to record it, or a server whose record is not written yet, is not raced;
 * - no process has it open or maps it (a running VMM opens its disk layers; compared by inode, so a
 *   hard link or a view in another mount namespace counts too).
 * It is renamed aside first and the checks repeated before it is unlinked, so a record, a reuse or
 * a VMM that lands in between puts it back. Aside files of a collector that died are looked at
 * again by the next one: put back if wanted, else removed. `by-blob` entries of layers that are
 * gone are removed with them.
 */

export interface HomeRecord {
  home: string;
  /** The home's database file (null for one in memory): the record holds while it exists. */
  db: string | null;
  /** The process that wrote it: the record holds while it lives, too. */
  writer: ClaimOwner;
  /** Diff ids (`sha256:…`) of the layers the home needs. */
  layers: string[];
  writtenAt: number;
}

export interface RemovedLayer {
  diffId: string;
  /** Bytes of the erofs image. */
  bytes: number;
}

const homeTag = (home: string) => createHash('sha256').update(resolve(home)).digest('hex').slice(0, 24);

/** Replaces the record of `home` in `store`: the layers it needs are `diffIds`. */
export function writeHomeLayers(store: LayerStore, home: string, db: string | null, diffIds: Iterable<string>): void {
  mkdirSync(store.homesDir, { recursive: true });
  const path = join(store.homesDir, `${homeTag(home)}.json`);
  const record: HomeRecord = {
    home: resolve(home), db: db === null ? null : resolve(db), writer: { pid: process.pid, startTicks: ownStartTicks() },
    layers: [...new Set(diffIds)].sort(), writtenAt: Date.now(),
  };
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, JSON.stringify(record));
  renameSync(tmp, path);
}

/**
 * The diff ids some home's record holds. Stale records are removed. A record that cannot be read
 * stops the collection (it could hold anything): the error names it.
 */
export function recordedLayers(store: LayerStore): Set<string> {
  const out = new Set<string>();
  for (const f of list(store.homesDir)) {
    const path = join(store.homesDir, f);
    const tmp = /\.tmp-(\d+)$/.exec(f);
    if (tmp) {
      if (!existsSync(`/proc/${tmp[1]}`)) rmSync(path, { force: true });
      continue;
    }
    if (!f.endsWith('.json')) continue;
    let text: string;
    let rec: HomeRecord;
    try {
      text = readFileSync(path, 'utf8');
      rec = JSON.parse(text) as HomeRecord;
      if (!Array.isArray(rec.layers)) throw new Error('no layers list');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') continue;
      throw new Error(`the layer record ${path} cannot be read (${(e as Error).message}); no layer is collected until it is removed`);
    }
    if ((rec.db !== null && existsSync(rec.db)) || (rec.writer && processMatches(rec.writer))) {
      for (const l of rec.layers) out.add(l);
    } else if (readFileSync(path, 'utf8') === text) {
      // Its home is gone (a server that reopened that home since wrote a new record: kept).
      rmSync(path, { force: true });
    }
  }
  return out;
}

/** Makes a device number as stat returns it from the major:minor that /proc/PID/maps shows (hex). */
function makedev(major: number, minor: number): number {
  return (major & 0xfff) * 0x100 + (minor & 0xff) + Math.floor(minor / 0x100) * 0x100000 + Math.floor(major / 0x1000) * 0x100000000000;
}

/**
 * Files some process has open or maps, as `dev:ino` (a rename, a hard link or a path in another
 * mount namespace keeps both) and as paths. Processes whose /proc entries cannot be read are
 * skipped (the collector runs as root, which reads them all).
 */
export function filesInUse(): { inodes: Set<string>; paths: Set<string> } {
  const inodes = new Set<string>();
  const paths = new Set<string>();
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    for (const fd of list(`/proc/${p}/fd`)) {
      try {
        const target = readlinkSync(`/proc/${p}/fd/${fd}`);
        if (!target.startsWith('/')) continue; // sockets, pipes, anonymous inodes
        paths.add(target.replace(/ \(deleted\)$/, ''));
        const s = statSync(`/proc/${p}/fd/${fd}`);
        if (s.isFile()) inodes.add(`${s.dev}:${s.ino}`);
      } catch { /* closed meanwhile */ }
    }
    let maps: string;
    try { maps = readFileSync(`/proc/${p}/maps`, 'utf8'); } catch { continue; }
    for (const line of maps.split('\n')) {
      // address perms offset major:minor inode path
      const m = /^\S+ \S+ \S+ ([0-9a-f]+):([0-9a-f]+) (\d+)\s+(\/.*)?$/.exec(line);
      if (!m || m[3] === '0') continue;
      inodes.add(`${makedev(parseInt(m[1], 16), parseInt(m[2], 16))}:${m[3]}`);
      if (m[4]) paths.add(m[4].replace(/ \(deleted\)$/, ''));
    }
  }
  return { inodes, paths };
}

const LAYER = /^([a-f0-9]{64})\.erofs$/;
const ASIDE = /^([a-f0-9]{64})\.(erofs|json)\.gc-(\d+)$/;

interface Layer {
  hex: string;
  erofs: string;
  json: string;
}

/**
 * Removes the layers of `store` nobody uses, and their `by-blob` entries, as described above.
 * Returns what it removed.
 */
export function collectLayers(store: LayerStore, graceMs: number, now = Date.now()): RemovedLayer[] {
  if (!existsSync(store.dir)) return [];
  const at = (hex: string): Layer => ({ hex, erofs: join(store.dir, `${hex}.erofs`), json: join(store.dir, `${hex}.json`) });
  const asideOf = (l: Layer, pid: number | string = process.pid): Layer => ({ hex: l.hex, erofs: `${l.erofs}.gc-${pid}`, json: `${l.json}.gc-${pid}` });
  const mtime = (f: string) => { try { return statSync(f).mtimeMs; } catch { return 0; } };
  const inode = (f: string) => { try { const s = statSync(f); return `${s.dev}:${s.ino}`; } catch { return undefined; } };
  /** Whether the layer whose files are now at `files` is still wanted. */
  const wanted = (files: Layer, recorded: Set<string>, inUse: () => ReturnType<typeof filesInUse>) => {
    if (recorded.has(`sha256:${files.hex}`)) return true;
    if (now - Math.max(mtime(files.json), mtime(files.erofs)) < graceMs) return true;
    const use = inUse();
    const ino = inode(files.erofs);
    return (ino !== undefined && use.inodes.has(ino)) || use.paths.has(files.erofs) || use.paths.has(at(files.hex).erofs);
  };
  /** Puts the layer back (its json first: `get` needs both), unless another copy was stored meanwhile. */
  const putBack = (from: Layer) => {
    const to = at(from.hex);
    if (existsSync(to.erofs)) { rmSync(from.erofs, { force: true }); rmSync(from.json, { force: true }); return; }
    if (existsSync(from.json)) renameSync(from.json, to.json);
    renameSync(from.erofs, to.erofs);
  };
  const remove = (from: Layer, removed: RemovedLayer[]) => {
    const bytes = (() => { try { return statSync(from.erofs).size; } catch { return 0; } })();
    unlinkSync(from.erofs);
    rmSync(from.json, { force: true });
    removed.push({ diffId: `sha256:${from.hex}`, bytes });
  };

  let recorded = recordedLayers(store);
  // Reading every process's descriptors and maps costs: only once a layer could go.
  let use: ReturnType<typeof filesInUse> | undefined;
  const inUse = () => (use ??= filesInUse());
  const removed: RemovedLayer[] = [];
  const files = readdirSync(store.dir);
  const dead = (pid: string) => !existsSync(`/proc/${pid}`);

  // A collector that died between its renames and its unlinks left files aside.
  for (const f of files) {
    const m = ASIDE.exec(f);
    if (!m || !dead(m[3])) continue;
    const left = asideOf(at(m[1]), m[3]);
    try {
      if (m[2] === 'json') { if (!existsSync(left.erofs)) rmSync(left.json, { force: true }); }
      else if (wanted(left, recorded, inUse)) putBack(left);
      else remove(left, removed);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e; // another collector got there first
    }
  }
  // A json without its layer (a collector died between putting the two back) once a commit cannot be under way.
  for (const f of files) {
    const m = /^([a-f0-9]{64})\.json$/.exec(f);
    if (!m) continue;
    const l = at(m[1]);
    if (!existsSync(l.erofs) && !files.some((g) => g.startsWith(`${m[1]}.erofs.gc-`)) && now - mtime(l.json) >= Math.max(graceMs, 60_000)) rmSync(l.json, { force: true });
  }

  // Aside first, all at once; then one more look at the records, marks and open files decides each.
  const aside = files.flatMap((f) => {
    const m = LAYER.exec(f);
    if (!m) return [];
    const l = at(m[1]);
    if (wanted(l, recorded, inUse)) return [];
    const to = asideOf(l);
    try { renameSync(l.erofs, to.erofs); } catch { return []; } // another collector took it
    try { renameSync(l.json, to.json); } catch { /* a layer without its json: get() never served it */ }
    return [to];
  });
  if (aside.length > 0) {
    recorded = recordedLayers(store);
    use = undefined;
    for (const l of aside) {
      if (wanted(l, recorded, inUse)) putBack(l);
      else remove(l, removed);
    }
  }

  // by-blob entries of layers that are gone (not even aside: a collector may still put one back).
  const asideNow = new Set(list(store.dir).flatMap((f) => { const m = ASIDE.exec(f); return m ? [m[1]] : []; }));
  for (const f of list(store.byBlobDir)) {
    const path = join(store.byBlobDir, f);
    const tmp = /\.tmp-(\d+)$/.exec(f);
    if (tmp) {
      if (dead(tmp[1])) rmSync(path, { force: true });
      continue;
    }
    let hex: string;
    try { hex = readFileSync(path, 'utf8').trim().slice('sha256:'.length); } catch { continue; }
    if (!existsSync(at(hex).erofs) && !asideNow.has(hex)) rmSync(path, { force: true });
  }
  return removed;
}

function list(dir: string): string[] {
  try { return readdirSync(dir); } catch { return []; }
}
