import { closeSync, linkSync, lchownSync, chmodSync, lstatSync, lutimesSync, mkdirSync, openSync, rmSync, symlinkSync, writeFileSync, writeSync, utimesSync } from 'node:fs';
import { join, posix } from 'node:path';
import { run } from '../host/run.js';
import { type TarEntry, TarError } from './tar.js';

/**
 * Applies one OCI layer (a tar changeset) to an empty directory, in the form the guest's overlayfs
 * reads when the layers are stacked as lowerdirs: OCI whiteouts `.wh.NAME` become 0:0 character
 * devices, `.wh..wh..opq` becomes the `trusted.overlay.opaque=y` xattr on its directory. Ownership,
 * modes, mtimes, hard links, symlinks and file capabilities are kept.
 *
 * The layer is untrusted: absolute paths, `..` components, paths that pass through a symlink, hard
 * links or relative symlinks that climb out of the root, and device nodes other than whiteouts are
 * refused; so is anything past the unpacked-size and entry budgets (tar bombs). Nothing is ever
 * written through a symlink: parents are checked with lstat, ownership and times set with l* calls.
 */

export class LayerRejected extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'LayerRejected';
  }
}

/** Shared by every layer of one image, so the cap is on the whole image. */
export interface UnpackBudget {
  maxBytes: number;
  maxEntries: number;
  bytes: number;
  entries: number;
}

export function newBudget(maxBytes: number, maxEntries = 2_000_000): UnpackBudget {
  return { maxBytes, maxEntries, bytes: 0, entries: 0 };
}

/** What the image service needs to know about a layer without mounting it (see lookupMerged). */
export interface LayerFacts {
  /** Kinds of the top-level names this layer sets: dir, file, whiteout, or `link:TARGET`. */
  top: Record<string, string>;
  /** Paths of interest this layer holds, with the content of the small text ones (etc/passwd, etc/group), or LINK_MARK + target for symlinks. */
  present: Record<string, string | null>;
  /** Whiteouts and opaque directories up to depth 3. */
  whiteouts: string[];
  opaque: string[];
  unpackedBytes: number;
  entries: number;
}

const SETPRIV_DIRS = ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'usr/local/bin', 'usr/local/sbin'];
export const INTERESTING = new Set(['etc/passwd', 'etc/group', 'bin/sh', 'usr/bin/sh', ...SETPRIV_DIRS.map((d) => `${d}/setpriv`)]);
const CONTENT_PATHS = new Set(['etc/passwd', 'etc/group']);
/** How `present` marks a symlink (its target follows), e.g. busybox applets. */
export const LINK_MARK = '\0link:';
/** Xattrs an image may set: file capabilities and user.*. trusted.* (overlay's own metadata) never. */
const XATTR_ALLOWED = /^(security\.capability|user\..+)$/;

/** A tar member name as a root-relative path (`''` for the root), or a rejection. */
export function normalizeMember(name: string): string {
  if (name.includes('\0')) throw new LayerRejected(`member name ${JSON.stringify(name)} contains a NUL byte`);
  if (name.startsWith('/')) throw new LayerRejected(`member ${JSON.stringify(name)} has an absolute path`);
  const parts = name.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw new LayerRejected(`member ${JSON.stringify(name)} escapes the root with ".."`);
  return parts.join('/');
}

function depth(p: string): number {
  return p === '' ? 0 : p.split('/').length;
}

function lstatOrNull(p: string) {
  try { return lstatSync(p); } catch { return null; }
}

/** Shell single-quoting for the whiteout script. */
const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/** getfattr's dump format escapes: backslash and non-printables as \ooo. */
function dumpPath(p: string): string {
  return Buffer.from(p).reduce((s, b) => s + (b < 0x21 || b > 0x7e || b === 0x5c || b === 0x3d || b === 0x22 ? `\\${b.toString(8).padStart(3, '0')}` : String.fromCharCode(b)), '');
}

export async function unpackLayer(entries: AsyncIterable<TarEntry>, root: string, budget: UnpackBudget): Promise<LayerFacts> {
  const facts: LayerFacts = { top: {}, present: {}, whiteouts: [], opaque: [], unpackedBytes: 0, entries: 0 };
  const whiteouts = new Set<string>();
  const opaque = new Set<string>();
  const fifos: { rel: string; mode: number; uid: number; gid: number }[] = [];
  const xattrs = new Map<string, Record<string, Buffer>>();
  const dirTimes = new Map<string, number>();
  /** Directories made for members whose parents the tar does not list: they get a fixed mtime (epoch), not the time of the unpack. */
  const madeDirs = new Set<string>(['']);
  const abs = (rel: string) => (rel === '' ? root : join(root, rel));

  /** Makes every parent of `rel` a real directory of this layer; refuses symlinks and files on the way. */
  const ensureParents = (rel: string) => {
    const parts = rel.split('/');
    let cur = '';
    for (let i = 0; i < parts.length - 1; i++) {
      cur = cur ? `${cur}/${parts[i]}` : parts[i];
      const st = lstatOrNull(abs(cur));
      if (!st) { mkdirSync(abs(cur), { mode: 0o755 }); madeDirs.add(cur); continue; }
      if (!st.isDirectory()) throw new LayerRejected(`member ${JSON.stringify(rel)} passes through ${st.isSymbolicLink() ? 'a symlink' : 'a non-directory'} (${cur})`);
    }
  };

  const recordTop = (rel: string, kind: string) => {
    if (depth(rel) === 1) facts.top[rel] = kind;
  };

  for await (const entry of entries) {
    const h = entry.header;
    if (++budget.entries > budget.maxEntries) throw new LayerRejected(`the image has more than ${budget.maxEntries} files`);
    facts.entries++;
    const rel = normalizeMember(h.name);
    const base = posix.basename(rel);
    const parent = rel.includes('/') ? posix.dirname(rel) : '';

    // OCI whiteouts.
    if (base.startsWith('.wh.')) {
      if (base === '.wh..wh..opq') {
        if (parent !== '') {
          ensureParents(`${parent}/x`);
          if (!lstatOrNull(abs(parent))) { mkdirSync(abs(parent), { mode: 0o755 }); madeDirs.add(parent); }
        }
        opaque.add(parent);
        if (depth(parent) <= 3) facts.opaque.push(parent);
      } else if (!base.startsWith('.wh..wh.')) {
        const target = parent ? `${parent}/${base.slice(4)}` : base.slice(4);
        normalizeMember(target);
        ensureParents(target);
        whiteouts.add(target);
        if (depth(target) <= 3) facts.whiteouts.push(target);
        recordTop(target, 'whiteout');
        if (INTERESTING.has(target)) delete facts.present[target];
      }
      continue;
    }
    if (rel === '') {
      // The root itself: only its metadata could apply, and the layer root is ours.
      continue;
    }
    if ((h.type === 'char' || h.type === 'block') && !(h.type === 'char' && h.devmajor === 0 && h.devminor === 0)) {
      throw new LayerRejected(`member ${JSON.stringify(rel)} is a device node (${h.type} ${h.devmajor}:${h.devminor}); images may not carry devices`);
    }
    ensureParents(rel);
    const path = abs(rel);
    const existing = lstatOrNull(path);
    if (existing && !(existing.isDirectory() && h.type === 'dir')) {
      rmSync(path, { recursive: true, force: true });
      dirTimes.delete(rel);
    }
    whiteouts.delete(rel);

    switch (h.type) {
      case 'dir': {
        if (!existing || !existing.isDirectory()) mkdirSync(path, { mode: 0o700 });
        lchownSync(path, h.uid, h.gid);
        chmodSync(path, h.mode);
        dirTimes.set(rel, h.mtime);
        recordTop(rel, 'dir');
        break;
      }
      case 'file': {
        if (budget.bytes + h.size > budget.maxBytes) {
          throw new LayerRejected(`the image unpacks to more than the limit of ${budget.maxBytes} bytes (member ${JSON.stringify(rel)} declares ${h.size})`);
        }
        budget.bytes += h.size;
        facts.unpackedBytes += h.size;
        const keep = CONTENT_PATHS.has(rel) && h.size <= 1024 * 1024;
        const kept: Buffer[] = [];
        const fd = openSync(path, 'wx', 0o600);
        try {
          await entry.read((c) => {
            if (keep) kept.push(Buffer.from(c));
            let off = 0;
            while (off < c.length) off += writeSync(fd, c, off);
          });
        } finally {
          closeSync(fd);
        }
        lchownSync(path, h.uid, h.gid);
        chmodSync(path, h.mode); // after chown, which clears setuid bits
        utimesSync(path, h.mtime, h.mtime);
        if (INTERESTING.has(rel)) facts.present[rel] = keep ? Buffer.concat(kept).toString('utf8') : null;
        recordTop(rel, 'file');
        break;
      }
      case 'hardlink': {
        const target = normalizeMember(h.linkname);
        if (target === '') throw new LayerRejected(`hard link ${JSON.stringify(rel)} points at the root`);
        ensureParents(target);
        const st = lstatOrNull(abs(target));
        if (!st) throw new LayerRejected(`hard link ${JSON.stringify(rel)} points at ${JSON.stringify(h.linkname)}, which is not earlier in the same layer`);
        if (st.isDirectory()) throw new LayerRejected(`hard link ${JSON.stringify(rel)} points at a directory`);
        linkSync(abs(target), path);
        if (INTERESTING.has(rel)) facts.present[rel] = null;
        recordTop(rel, 'file');
        break;
      }
      case 'symlink': {
        const t = h.linkname;
        if (t === '' || t.includes('\0')) throw new LayerRejected(`symlink ${JSON.stringify(rel)} has an empty or invalid target`);
        // Absolute targets resolve inside the guest's root; relative ones must not climb above it.
        if (!t.startsWith('/')) {
          let d = depth(parent);
          for (const part of t.split('/')) {
            if (part === '..') { if (--d < 0) throw new LayerRejected(`symlink ${JSON.stringify(rel)} -> ${JSON.stringify(t)} escapes the root`); }
            else if (part !== '' && part !== '.') d++;
          }
        }
        symlinkSync(t, path);
        lchownSync(path, h.uid, h.gid);
        lutimesSync(path, h.mtime, h.mtime);
        if (INTERESTING.has(rel)) facts.present[rel] = `${LINK_MARK}${t}`;
        recordTop(rel, `link:${t}`);
        break;
      }
      case 'char': {
        // A 0:0 character device is already an overlay whiteout.
        whiteouts.add(rel);
        recordTop(rel, 'whiteout');
        break;
      }
      case 'fifo': {
        fifos.push({ rel, mode: h.mode, uid: h.uid, gid: h.gid });
        recordTop(rel, 'file');
        break;
      }
      default:
        throw new LayerRejected(`member ${JSON.stringify(rel)} has unsupported type ${h.type}`);
    }
    const allowed = Object.entries(h.xattrs).filter(([k]) => XATTR_ALLOWED.test(k));
    if (allowed.length) xattrs.set(rel, Object.fromEntries(allowed));
    else xattrs.delete(rel);
  }

  // Whiteouts, opaque markers, fifos and xattrs are applied last, in two helper processes, after the
  // parents are checked again (a later member may have replaced a directory with a symlink).
  const recheck = (rel: string) => {
    const parts = rel.split('/');
    let cur = '';
    for (let i = 0; i < parts.length - 1; i++) {
      cur = cur ? `${cur}/${parts[i]}` : parts[i];
      const st = lstatOrNull(abs(cur));
      if (!st || !st.isDirectory()) throw new LayerRejected(`${JSON.stringify(rel)}: ${cur} is no longer a directory`);
    }
  };
  const script: string[] = [];
  for (const w of whiteouts) {
    recheck(w);
    if (lstatOrNull(abs(w))) continue; // a file of this same layer stays: whiteouts only hide lower layers
    script.push(`mknod -- ${q(w)} c 0 0`);
  }
  for (const f of fifos) {
    recheck(f.rel);
    script.push(`mkfifo -m ${(f.mode & 0o7777).toString(8)} -- ${q(f.rel)} && chown -h ${f.uid}:${f.gid} -- ${q(f.rel)}`);
  }
  if (script.length) {
    const file = `${root}.sh`;
    writeFileSync(file, `set -e\ncd ${q(root)}\n${script.join('\n')}\n`);
    try { await run('sh', [file]); } finally { rmSync(file, { force: true }); }
  }
  const dump: string[] = [];
  for (const d of opaque) {
    recheck(d === '' ? 'x' : `${d}/x`);
    dump.push(`# file: ${dumpPath(d === '' ? '.' : d)}`, 'trusted.overlay.opaque="y"', '');
  }
  for (const [rel, xs] of xattrs) {
    if (!lstatOrNull(abs(rel))) continue;
    recheck(rel);
    dump.push(`# file: ${dumpPath(rel)}`, ...Object.entries(xs).map(([k, v]) => `${k}=0x${v.toString('hex')}`), '');
  }
  if (dump.length) {
    const file = `${root}.xattrs`;
    writeFileSync(file, dump.join('\n') + '\n');
    try { await run('setfattr', ['-h', `--restore=${file}`], { cwd: root }); } finally { rmSync(file, { force: true }); }
  }
  // Directory mtimes last, deepest first: creating their children changed them. The layer's root
  // and directories no member listed get the epoch, so the same layer always unpacks to the same
  // tree (layerStore.ts builds the same erofs bytes from it).
  for (const rel of madeDirs) if (!dirTimes.has(rel)) dirTimes.set(rel, 0);
  for (const [rel, t] of [...dirTimes].sort((a, b) => depth(b[0]) - depth(a[0]))) {
    try { lutimesSync(abs(rel), t, t); } catch { /* removed by a later member */ }
  }
  return facts;
}

/**
 * Looks a path up in the merged view of stacked layers (top first), from their facts: follows
 * top-level symlinks (Debian's /bin -> usr/bin), honours whiteouts and opaque directories. Answers only
 * for paths in INTERESTING; `undefined` means absent, `null` present (content not kept).
 */
export function lookupMerged(topFirst: LayerFacts[], path: string, hops = 0): string | null | undefined {
  const [first, ...rest] = path.split('/');
  if (rest.length && hops < 8) {
    for (const l of topFirst) {
      const k = l.top[first];
      if (k === undefined) continue;
      if (k.startsWith('link:')) {
        const target = k.slice(5).replace(/^\/+/, '');
        return lookupMerged(topFirst, posix.normalize(`${target}/${rest.join('/')}`), hops + 1);
      }
      break;
    }
  }
  for (const l of topFirst) {
    if (path in l.present) return l.present[path];
    if (l.whiteouts.includes(path)) return undefined;
    const parts = path.split('/');
    for (let i = 1; i < parts.length; i++) {
      const anc = parts.slice(0, i).join('/');
      if (l.whiteouts.includes(anc) || l.opaque.includes(anc)) return undefined;
    }
    if (l.opaque.includes('')) return undefined;
  }
  return undefined;
}

export { TarError };
