import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { join } from 'node:path';
import { run } from '../host/run.js';

/** A package on the npm registry, pinned by version and by the registry's integrity (SRI, sha512). */
export interface RegistryTarball {
  name: string;
  version: string;
  /** `npm view <name>@<version> dist.integrity`, e.g. `sha512-…`. */
  integrity: string;
}

/** The SRI string (`sha512-<base64>`) of a file. */
export function sriSha512(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const h = createHash('sha512');
    createReadStream(path).on('error', reject).on('data', (c) => h.update(c)).on('end', () => resolve(`sha512-${h.digest('base64')}`));
  });
}

/**
 * Downloads a pinned tarball into `dir` through the host's own npm (its registry, proxy and cache
 * settings apply) and checks it against the pinned integrity, not only the registry's: a tarball
 * republished under the same version, or a registry mirror serving other bytes, fails here.
 * Returns the tarball's path.
 */
export async function fetchRegistryTarball(dir: string, t: RegistryTarball): Promise<string> {
  const spec = `${t.name}@${t.version}`;
  let out: string;
  try {
    out = (await run('npm', ['pack', '--json', '--pack-destination', dir, spec], { cwd: dir, timeoutMs: 900_000 })).stdout;
  } catch (err) {
    throw new Error(`npm pack ${spec} failed (the npm registry must be reachable to build this image): ${(err as Error).message}`);
  }
  const packed = JSON.parse(out) as { filename: string }[];
  const file = join(dir, packed[0].filename);
  const got = await sriSha512(file);
  if (got !== t.integrity) throw new Error(`${spec}: integrity ${got} is not the pinned ${t.integrity}`);
  return file;
}
