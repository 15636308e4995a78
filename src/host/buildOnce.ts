import { mkdirSync, renameSync, existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Builds `finalPath` at most once: `build` writes into a fresh temporary directory, which is then
 * renamed into place, so a crash mid-build never leaves a half-made cache entry that looks done.
 */
export async function buildOnce(finalPath: string, tmpRoot: string, build: (tmpDir: string) => Promise<void>): Promise<string> {
  if (existsSync(finalPath)) return finalPath;
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
