import { chmodSync, chownSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildOnce } from '../host/buildOnce.js';
import { sha256Hex } from '../host/hash.js';
import { run } from '../host/run.js';

/** The host-side helpers written in C, built from this directory's sources on first use. */
const HERE = dirname(fileURLToPath(import.meta.url));

/** What buildC made in this process, by assets directory and tag: a fork asks twice, and more often than the source changes. */
const built = new Map<string, Promise<string>>();

/**
 * Compiles one C source of this directory once per source and compiler (COLLIMATE_SHIM_CC, gcc),
 * into a root-owned 0755 directory under `assetsDir`; the path of what it made. Looked up once per
 * process (the source is read and hashed then).
 */
export function buildC(assetsDir: string, tmpRoot: string, what: { tag: string; source: string; out: string; flags: string[]; libs?: string[] }): Promise<string> {
  const key = `${assetsDir}\0${what.tag}`;
  let p = built.get(key);
  if (!p) {
    p = buildCOnce(assetsDir, tmpRoot, what);
    built.set(key, p);
    p.catch(() => built.delete(key));
  }
  return p;
}

async function buildCOnce(assetsDir: string, tmpRoot: string, what: { tag: string; source: string; out: string; flags: string[]; libs?: string[] }): Promise<string> {
  const cc = process.env.COLLIMATE_SHIM_CC ?? 'gcc';
  const source = join(HERE, what.source);
  const key = sha256Hex(`${what.tag}-v1`, readFileSync(source), cc).slice(0, 16);
  const dir = await buildOnce(join(assetsDir, `${what.tag}-${key}`), tmpRoot, async (tmp) => {
    await run(cc, ['-O2', '-Wall', '-Wextra', '-Werror', '-std=gnu11', '-s', ...what.flags, '-o', join(tmp, what.out), source, ...(what.libs ?? [])]);
  });
  chownSync(dir, 0, 0);
  chmodSync(dir, 0o755);
  return join(dir, what.out);
}

export const DIG_HOLES_NAME = 'collimate-dig-holes';

/** Builds collimate-dig-holes (digholes.c), cached under `assetsDir`. */
export function ensureDigHoles(assetsDir: string, tmpRoot: string): Promise<string> {
  return buildC(assetsDir, tmpRoot, { tag: 'digholes', source: 'digholes.c', out: DIG_HOLES_NAME, flags: [] });
}

export const COPY_PAGES_NAME = 'collimate-copy-pages';

/** Builds collimate-copy-pages (copypages.c), cached under `assetsDir`. */
export function ensureCopyPages(assetsDir: string, tmpRoot: string): Promise<string> {
  return buildC(assetsDir, tmpRoot, { tag: 'copypages', source: 'copypages.c', out: COPY_PAGES_NAME, flags: [] });
}
