/**
 * Capturing a stopped VMM's guest RAM into a file on the host, without QEMU's migration stream: a
 * guest whose RAM is a private (share=off) mapping of a file B sees B's pages except those it wrote
 * since it mapped B, which the kernel keeps as anonymous copies in the QEMU process. So its memory
 * is B plus those pages: `seedFromBacking` copies B's data into the new file (holes stay holes), and
 * `copyPrivatePages` finds the written pages through /proc/PID/pagemap (present and not file-backed,
 * or swapped) and copies them from /proc/PID/mem. Only pages that exist are written: the file costs
 * what the guest's memory holds, not its size. No byte of guest RAM passes through JavaScript
 * objects beyond one reused buffer.
 */
import { closeSync, openSync, readFileSync, readSync, statSync, writeSync } from 'node:fs';
import { run } from '../host/run.js';
import { homePaths } from '../host/paths.js';
import { ensureDigHoles } from './native.js';

const PAGE = 4096;
/** Pagemap entries read at once (64 MiB of guest memory). */
const SCAN_PAGES = 16384;
/** Largest single copy from /proc/PID/mem. */
const MAX_RUN_BYTES = 4 * 1024 * 1024;
/** Unwritten pages between two written ones that are still copied as one run. */
const MAX_GAP_PAGES = 32;
/** Bytes copied between two turns of the event loop. */
const YIELD_BYTES = 16 * 1024 * 1024;

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

export interface PrivateCopy {
  /** Guest pages the process had written (and so copied). */
  pages: number;
  bytes: number;
}

/**
 * Copies every page process `pid` holds privately in its mapping of `memFile` into `dest` at the
 * same offset. Precondition: the guest is stopped (its vCPUs write no more), `dest` holds the
 * mapped file's content. Runs of written pages separated by a few unwritten ones are copied as one
 * (the unwritten ones read as the file's own content, which `dest` already holds): fewer, larger
 * copies. The copy is synchronous (several times faster than through libuv's threads here) and
 * yields to the event loop between chunks, so the children being spawned meanwhile progress.
 */
export async function copyPrivatePages(pid: number, memFile: string, dest: string): Promise<PrivateCopy> {
  const map = mappingOf(pid, memFile);
  const mem = openSync(`/proc/${pid}/mem`, 'r');
  const out = openSync(dest, 'r+');
  const data = Buffer.alloc(MAX_RUN_BYTES);
  let pages = 0;
  let sinceYield = 0;
  try {
    for (const run of privateRuns(pid, map, MAX_GAP_PAGES)) {
      for (let done = 0; done < run.count;) {
        const n = Math.min(run.count - done, MAX_RUN_BYTES / PAGE);
        const bytes = n * PAGE;
        const addr = map.start + (run.first + done) * PAGE;
        const got = readSync(mem, data, 0, bytes, addr);
        if (got !== bytes) throw new Error(`short read of guest memory at 0x${addr.toString(16)} (${got} of ${bytes} bytes)`);
        writeSync(out, data, 0, bytes, map.offset + (run.first + done) * PAGE);
        done += n;
        sinceYield += bytes;
        if (sinceYield >= YIELD_BYTES) {
          sinceYield = 0;
          await new Promise((r) => setImmediate(r));
        }
      }
      pages += run.written;
    }
  } finally {
    closeSync(mem);
    closeSync(out);
  }
  return { pages, bytes: pages * PAGE };
}

/** A run of pages of a mapping (indexes from its start) holding `written` private pages. */
interface PageRun {
  first: number;
  count: number;
  written: number;
}

/**
 * The runs of pages process `pid` holds privately in `map`, read from /proc/PID/pagemap a chunk at
 * a time: two private pages at most `maxGap` pages apart are in one run.
 */
function* privateRuns(pid: number, map: { start: number; length: number }, maxGap: number): Generator<PageRun> {
  const pagemap = openSync(`/proc/${pid}/pagemap`, 'r');
  try {
    const entries = Buffer.alloc(SCAN_PAGES * 8);
    const total = Math.floor(map.length / PAGE);
    let run: PageRun | null = null;
    let last = -1;
    for (let base = 0; base < total; base += SCAN_PAGES) {
      const n = Math.min(SCAN_PAGES, total - base);
      const want = n * 8;
      const got = readSync(pagemap, entries, 0, want, (map.start / PAGE + base) * 8);
      if (got !== want) throw new Error(`short read of /proc/${pid}/pagemap (${got} of ${want} bytes)`);
      for (let i = 0; i < n; i++) {
        if (!isPrivate(entries.readUInt32LE(i * 8 + 4))) continue;
        const page = base + i;
        if (run && page - last > maxGap) {
          yield run;
          run = null;
        }
        run ??= { first: page, count: 0, written: 0 };
        run.count = page - run.first + 1;
        run.written++;
        last = page;
      }
    }
    if (run) yield run;
  } finally {
    closeSync(pagemap);
  }
}

/**
 * From the high half of a pagemap entry: bit 63 present, bit 62 swapped, bit 61 file page or
 * shared anonymous. A present page that is not the file's is the process's own copy; a swapped
 * one is too.
 */
function isPrivate(hi: number): boolean {
  return ((hi & 0x80000000) !== 0 && (hi & 0x20000000) === 0) || (hi & 0x40000000) !== 0;
}

/** Bytes of the pages process `pid` holds privately in its mapping of `memFile` (what copyPrivatePages would copy). */
export function privatePageBytes(pid: number, memFile: string): number {
  let pages = 0;
  for (const run of privateRuns(pid, mappingOf(pid, memFile), 0)) pages += run.written;
  return pages * PAGE;
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
