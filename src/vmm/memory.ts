/**
 * Capturing a stopped VMM's guest RAM into a file on the host, without QEMU's migration stream: a
 * guest whose RAM is a private (share=off) mapping of a file B sees B's pages except those it wrote
 * since it mapped B, which the kernel keeps as anonymous copies in the QEMU process. So its memory
 * is B plus those pages: `seedFromBacking` copies B's data into the new file (holes stay holes), and
 * `copyPrivatePages` finds the written pages through /proc/PID/pagemap (present and not file-backed,
 * or swapped) and copies them out of the process (collimate-copy-pages, copypages.c). Only pages
 * that exist are written: the file costs what the guest's memory holds, not its size. No byte of
 * guest RAM passes through JavaScript.
 */
import { readFileSync, statSync } from 'node:fs';
import { run } from '../host/run.js';
import { homePaths } from '../host/paths.js';
import { ensureCopyPages, ensureDigHoles } from './native.js';

const PAGE = 4096;

/** Where process `pid` maps `file`: the mapping's start address, length and file offset (matched by device and inode). */
export function mappingOf(pid: number, file: string): { start: number; length: number; offset: number } {
  const st = statSync(file);
  let best: { start: number; length: number; offset: number } | null = null;
  for (const line of readFileSync(`/proc/${pid}/maps`, 'utf8').split('\n')) {
    // start-end perms offset dev inode path
    const m = /^([0-9a-f]+)-([0-9a-f]+) \S+ ([0-9a-f]+) \S+ (\d+)\s/.exec(line);
    if (!m || Number(m[4]) !== st.ino) continue;
    const start = parseInt(m[1], 16);
    const length = parseInt(m[2], 16) - start;
    if (!best || length > best.length) best = { start, length, offset: parseInt(m[3], 16) };
  }
  if (!best) throw new Error(`process ${pid} does not map ${file}`);
  return best;
}

/** Creates `dest` as a sparse copy of `backing` (data copied, holes kept), `size` bytes long. */
export async function seedFromBacking(backing: string, dest: string, size: number): Promise<void> {
  await run('cp', ['--sparse=always', '--reflink=never', backing, dest]);
  await run('truncate', ['-s', String(size), dest]);
}

/** Where a process's RAM mapping is and what it names: the arguments of collimate-copy-pages. */
async function copyPages(mode: 'count' | 'prealloc' | 'copy', pid: number, memFile: string, cacheDir: string, dest?: string): Promise<number> {
  const map = mappingOf(pid, memFile);
  const p = homePaths(cacheDir);
  const tool = await ensureCopyPages(p.assets, p.tmp);
  const { stdout } = await run(tool, [mode, String(pid), String(map.start), String(map.length), String(map.offset), ...(dest ? [dest] : [])]);
  return Number(stdout.trim()) * PAGE;
}

/**
 * Copies every page process `pid` holds privately in its mapping of `memFile` into `dest` at the
 * same offset (collimate-copy-pages, copypages.c: process_vm_readv into one buffer, then pwrite;
 * only pages that were written). Precondition: the guest is stopped (its vCPUs write no more),
 * `dest` holds the mapped file's content. The bytes copied.
 */
export function copyPrivatePages(pid: number, memFile: string, dest: string, cacheDir: string): Promise<number> {
  return copyPages('copy', pid, memFile, cacheDir, dest);
}

/**
 * Allocates `dest`'s blocks under the pages process `pid` holds privately in its mapping of
 * `memFile` now, so a copy of them into `dest` later writes into pages that exist: filling a
 * tmpfs hole costs the page's allocation and zeroing, ~half of such a copy (measured). Made while
 * the guest still runs, ahead of the copy it stops for; a page it writes in between is still
 * copied, into a hole. A block allocated for a page that is not copied after all reads as zero, as
 * the hole it was (only a file's holes are allocated: a page the file holds is not rewritten).
 */
export function preallocPrivatePages(pid: number, memFile: string, dest: string, cacheDir: string): Promise<number> {
  return copyPages('prealloc', pid, memFile, cacheDir, dest);
}

/** Bytes of the pages process `pid` holds privately in its mapping of `memFile` (what copyPrivatePages would copy). */
export function privatePageBytes(pid: number, memFile: string, cacheDir: string): Promise<number> {
  return copyPages('count', pid, memFile, cacheDir);
}

/**
 * Copies a sparse RAM image's data into an existing RAM file of the same size at the same offsets
 * (collimate-copy-pages image: SEEK_DATA/SEEK_HOLE, sendfile), neither truncating the file (a VMM
 * may map it already) nor writing where the image has holes. ~1.5× faster than `dd conv=sparse`
 * (measured: 96 vs 139–197 ms for 211 MB of data in a 512 MiB image). The bytes copied.
 */
export async function fillFromImage(image: string, memPath: string, cacheDir: string): Promise<number> {
  const p = homePaths(cacheDir);
  const { stdout } = await run(await ensureCopyPages(p.assets, p.tmp), ['image', image, memPath]);
  return Number(stdout.trim());
}

/** Bytes a file occupies (its allocated blocks), for a sparse file less than its size. */
export function allocatedBytes(path: string): number {
  return statSync(path).blocks * 512;
}

/**
 * Makes the all-zero pages of a RAM file holes (collimate-dig-holes, digholes.c, built into
 * `cacheDir`'s assets). The guest's kernel writes zeros over much of its memory while it boots, so
 * a template's RAM file comes out nearly fully allocated (512 of 512 MiB for the 512 MiB catalog
 * guest; 88 MiB after this). Every copy of it a fork or suspend makes, and the tmpfs it holds,
 * shrink by as much. Safe while VMMs map the file copy-on-write (a page that was zero reads as zero
 * from a hole), not while anyone writes to it. The holes fill again as those VMMs run: tmpfs gives
 * a hole a page of the file on every fault of a private mapping, read or write
 * (src/sandboxes/ramSparse.ts digs them again).
 */
export async function digHoles(memPath: string, cacheDir: string): Promise<void> {
  const p = homePaths(cacheDir);
  await run(await ensureDigHoles(p.assets, p.tmp), [memPath]);
}
