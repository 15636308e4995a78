import { randomBytes } from 'node:crypto';
import { existsSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { seedFromBacking } from '../vmm/memory.js';

/**
 * Spare copies of the files sandboxes' RAM maps, made ahead of the next fork. A fork point's RAM
 * starts as a copy of its parent's backing file (vmm/memory.ts), which does not change, so the copy
 * can be made before anyone asks: a fork takes the spare (a rename on the same tmpfs) and, once it
 * is done, the next spare is made in the background. One spare per backing file a fork has used; it goes with the
 * backing file (a fork point's, at its GC) and at close. Files are `seed-*.mem` in the RAM
 * directory, which the engine's start sweeps.
 */
export class ForkSeeds {
  private readonly spares = new Map<string, Promise<string | null>>();
  private closed = false;

  constructor(private readonly dir: string) {}

  /** Puts a copy of `backing` (`size` bytes) at `dest`: the spare if one is ready, else made now. Whether a spare was used. */
  async take(backing: string, dest: string, size: number): Promise<boolean> {
    const spare = this.spares.get(backing);
    this.spares.delete(backing);
    const path = spare ? await spare : null;
    let used = false;
    if (path && existsSync(path)) {
      renameSync(path, dest);
      used = true;
    } else {
      await seedFromBacking(backing, dest, size);
    }
    return used;
  }

  /** Starts making the next spare of `backing` (after a fork, so it does not compete with the fork for CPU). */
  prepare(backing: string, size: number): void {
    if (this.closed || this.spares.has(backing) || !existsSync(backing)) return;
    const path = join(this.dir, `seed-${randomBytes(6).toString('hex')}.mem`);
    const made = seedFromBacking(backing, path, size).then(
      () => path,
      () => {
        rmSync(path, { force: true });
        return null;
      },
    );
    this.spares.set(backing, made);
  }

  /** Resolves once every spare being made is made (benches: nothing copies in the background). */
  async idle(): Promise<void> {
    await Promise.all([...this.spares.values()]);
  }

  /** Forgets (and removes) the spare of a backing file that is going away. */
  async drop(backing: string): Promise<void> {
    const spare = this.spares.get(backing);
    this.spares.delete(backing);
    const path = spare ? await spare : null;
    if (path) rmSync(path, { force: true });
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.spares.keys()].map((b) => this.drop(b)));
  }
}
