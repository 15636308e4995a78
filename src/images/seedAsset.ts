import { existsSync, mkdirSync, readFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { homePaths } from '../host/paths.js';
import { sha256Hex } from '../host/hash.js';
import { buildOnce } from '../host/buildOnce.js';
import { run } from '../host/run.js';
import { SEED_LIBRARY_NAME, seedSourceFiles, buildSeedLibrary } from '../guest/seed/build.js';

/**
 * libcollimate-seed.so (docs/determinism.md), compiled once per input digest and cached under the
 * data directory. It is a glibc shared object loaded into the guest images' own programs, so the
 * digest covers the compiler and the host glibc it is built against as well as the sources (the
 * Debian guest userlands have the host's glibc; a newer host glibc could stamp symbol versions
 * the guests lack).
 */
export async function seedLibrary(home: string, progress: (m: string) => void, build: (outDir: string) => Promise<string> = buildSeedLibrary): Promise<string> {
  const cc = process.env.COLLIMATE_SEED_CC ?? 'gcc';
  const [compiler, glibc] = await Promise.all([
    run(cc, ['-dumpfullversion', '-dumpmachine']).then((r) => r.stdout.trim(), () => `${cc}: unknown`),
    run('getconf', ['GNU_LIBC_VERSION']).then((r) => r.stdout.trim(), () => 'glibc: unknown'),
  ]);
  const digest = sha256Hex('seed-lib-v1', compiler, glibc, ...seedSourceFiles().map((f) => readFileSync(f)));
  const dir = join(homePaths(home).assets, `seedlib-${digest.slice(0, 16)}`);
  const lib = join(dir, SEED_LIBRARY_NAME);
  if (existsSync(lib)) return lib;
  mkdirSync(homePaths(home).tmp, { recursive: true });
  await buildOnce(dir, homePaths(home).tmp, async (tmp) => {
    progress(`compiling ${SEED_LIBRARY_NAME}`);
    const out = await build(tmp);
    if (out !== join(tmp, SEED_LIBRARY_NAME)) renameSync(out, join(tmp, SEED_LIBRARY_NAME));
  });
  return lib;
}
