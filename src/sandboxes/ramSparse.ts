import { statSync } from 'node:fs';
import { allocatedBytes } from '../vmm/memory.js';

/** A file is dug again once it has grown by this much since it was last dug (or first seen). */
export function regrowthLimit(size: number): number {
  return Math.max(16 * 2 ** 20, size / 32);
}

/**
 * Keeps the RAM files VMMs map copy-on-write — templates' and fork points' — sparse while they are
 * in use. A RAM file is written once with its zero pages as holes (bake, fork copy), but tmpfs gives
 * a hole a zeroed page of the file on every fault of a private mapping, read or write (Linux's
 * shmem fault path), so each page any sandbox touches stays allocated in the file: a 256 MiB
 * template dug to 90 MiB is back at 130 MiB after a few sandboxes ran. Those pages are zero, so
 * digging them out again is safe while VMMs map the file (they fault the page back in, as zero).
 *
 * `files()` names the files to watch, without any that someone may still be writing (a fork point
 * whose fork is under way). One pass at a time; each digs only files that grew by regrowthLimit.
 */
export class RamSparsifier {
  /** Allocated bytes of each watched file after it was last dug, or when first seen. */
  private readonly base = new Map<string, number>();
  private pass?: Promise<number>;

  /** `dig` makes one file's zero pages holes (memory.ts digHoles). */
  constructor(private readonly files: () => string[], private readonly dig: (path: string) => Promise<void>) {}

  /** Digs every watched file that grew enough (`all`: every watched file); resolves to how many were dug. */
  sweep(opts: { all?: boolean } = {}): Promise<number> {
    const run = async (): Promise<number> => {
      await this.pass?.catch(() => 0);
      return this.digGrown(opts.all ?? false);
    };
    const p = run().finally(() => { if (this.pass === p) this.pass = undefined; });
    this.pass = p;
    return p;
  }

  /** Resolves once no pass runs (close). */
  async idle(): Promise<void> {
    await this.pass?.catch(() => 0);
  }

  private async digGrown(all: boolean): Promise<number> {
    const watched = new Set(this.files());
    for (const f of this.base.keys()) if (!watched.has(f)) this.base.delete(f);
    let dug = 0;
    for (const f of watched) {
      let size: number, now: number;
      try { size = statSync(f).size; now = allocatedBytes(f); } catch { this.base.delete(f); continue; }
      const base = this.base.get(f);
      if (base === undefined && !all) { this.base.set(f, now); continue; }
      if (!all && now - base! < regrowthLimit(size)) continue;
      // A file removed between the stat and the dig (its fork point collected) is simply gone.
      try { await this.dig(f); } catch { if (statSafe(f)) throw new Error(`could not make the zero pages of ${f} holes again`); continue; }
      this.base.set(f, allocatedBytes(f));
      dug++;
    }
    return dug;
  }
}

function statSafe(f: string): boolean {
  try { statSync(f); return true; } catch { return false; }
}
