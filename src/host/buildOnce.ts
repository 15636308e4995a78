import { mkdirSync, renameSync, existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';

/** Builds under way in this process, by final path. */
const underWay = new Map<string, Promise<string>>();

/**
 * Builds `finalPath` at most once: `build` writes into a fresh temporary directory, which is then
 * renamed into place, so a crash mid-build never leaves a half-made cache entry that looks done.
 * A caller asking for a path this process is already building waits for that build instead of
 * starting its own (the catalog builds its layers side by side, and every Debian runtime layer
 * needs the base: both would otherwise run debootstrap). Across processes, the rename keeps one of
 * two identical results.
 */
export function buildOnce(finalPath: string, tmpRoot: string, build: (tmpDir: string) => Promise<void>): Promise<string> {
  if (existsSync(finalPath)) return Promise.resolve(finalPath);
  let p = underWay.get(finalPath);
  if (!p) {
    p = buildInto(finalPath, tmpRoot, build).finally(() => underWay.delete(finalPath));
    underWay.set(finalPath, p);
  }
  return p;
}

async function buildInto(finalPath: string, tmpRoot: string, build: (tmpDir: string) => Promise<void>): Promise<string> {
  mkdirSync(tmpRoot, { recursive: true });
  const tmp = join(tmpRoot, `build-${process.pid}-${Date.now()}-${Math.random().toString(16).slice(2)}`);
  mkdirSync(tmp, { recursive: true });
  try {
    await build(tmp);
    mkdirSync(join(finalPath, '..'), { recursive: true });
    try {
      renameSync(tmp, finalPath);
    } catch (e) {
      // Another builder won the race; theirs is identical by construction (content-addressed).
      if (!existsSync(finalPath)) throw e;
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return finalPath;
}
