/**
 * Compiles libcollimate-seed.so (src/guest/seed/seedrandom.c), the LD_PRELOAD
 * library that makes an exec's user-space randomness a function of its seed.
 *
 * Unlike the agent (static musl) this is a glibc shared object: it is loaded
 * into the guest image's own Debian programs, so it must be built against glibc.
 * Caching by content is the caller's job: hash seedSourceFiles() with the
 * compiler identity.
 */
import { execFile } from 'node:child_process';
import { mkdir, rename, rm } from 'node:fs/promises';
import { readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const SEED_LIBRARY_NAME = 'libcollimate-seed.so';
export const SEED_SOURCE_DIR = dirname(fileURLToPath(import.meta.url));

export const SEED_CFLAGS: readonly string[] = [
  '-shared', '-fPIC', '-O2', '-Wall', '-Wextra', '-Werror', '-std=gnu11', '-s',
];
export const SEED_LDLIBS: readonly string[] = ['-ldl', '-pthread'];

export interface BuildSeedOptions {
  /** Compiler driver; defaults to $COLLIMATE_SEED_CC or gcc (glibc). */
  cc?: string;
}

/** Absolute paths of every C source and header in src/guest/seed, sorted. */
export function seedSourceFiles(): string[] {
  return readdirSync(SEED_SOURCE_DIR)
    .filter((name) => name.endsWith('.c') || name.endsWith('.h'))
    .sort()
    .map((name) => join(SEED_SOURCE_DIR, name));
}

export async function buildSeedLibrary(outDir: string, options: BuildSeedOptions = {}): Promise<string> {
  const cc = options.cc ?? process.env.COLLIMATE_SEED_CC ?? 'gcc';
  const sources = seedSourceFiles().filter((path) => path.endsWith('.c'));
  await mkdir(outDir, { recursive: true });
  const output = resolve(outDir, SEED_LIBRARY_NAME);
  // Compile beside the target and rename, so a concurrent loader never maps half a library.
  const partial = `${output}.${process.pid}.${Date.now()}.partial`;
  try {
    await run(cc, [...SEED_CFLAGS, '-o', partial, ...sources, ...SEED_LDLIBS], { maxBuffer: 16 * 1024 * 1024 });
    await rename(partial, output);
  } catch (e) {
    await rm(partial, { force: true });
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === 'ENOENT') {
      throw new Error(`cannot build ${SEED_LIBRARY_NAME}: compiler ${cc} not found (install gcc)`);
    }
    throw new Error(`building ${SEED_LIBRARY_NAME} with ${cc} failed:\n${err.stderr ?? err.message}`);
  }
  return output;
}
