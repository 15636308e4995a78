import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { basename, isAbsolute, join, relative, resolve } from 'node:path';
import type { MachineShape } from '../vmm/machine.js';

/**
 * An artifact: a booted, checkpointed guest that sandboxes are restored from. RAM in a file on
 * tmpfs (mapped share=off by every child), device state saved with x-ignore-shared, and the writable
 * disk frozen at the checkpoint (every child's qcow2 overlay is backed by it).
 */
export interface Artifact {
  key: string;
  dir: string;
  shape: MachineShape;
  diskMib: number;
  memPath: string;
  devStatePath: string;
  /** The frozen upper disk (raw ext4) children's overlays are backed by. */
  diskPath: string;
  /** Guest uptime (ms) when the checkpoint was taken; a restored child continues from it. */
  uptimeAtCheckpointMs: number;
  bakedAt: string;
}

/**
 * `artifact.json`, the manifest of one built artifact (`<cacheDir>/artifacts/<key>/<build>/`), in a
 * form that does not depend on where the host that baked it keeps things: a copy of the build
 * directory, with its RAM file put in the RAM directory of the host that loads it, loads there
 * whatever its cache, layer store and RAM directory are called.
 *
 * - The device state and the disk are files of the build directory, named, not located.
 * - The RAM file (on tmpfs, outside the cache) is named; each host looks for it in its own RAM dir.
 * - The shape's kernel, initramfs and layers are stored relative to the build directory: they
 *   resolve to the same files on the host that baked it, and on another host whose cache has the
 *   usual layout (assets and layers inside the cache dir). ensureArtifact does not rely on them: it
 *   returns the artifact with the shape it was asked for (its own paths for the same content, which
 *   the key proves); they serve when an artifact is loaded by key alone (TemplatePools.artifactFor).
 *
 * Manifests written before format 2 hold absolute paths (and no `format`): they are read as they
 * are, so sandboxes restored from such an artifact still find it.
 */
interface ManifestV2 {
  format: 2;
  key: string;
  /** Paths relative to the build directory. */
  shape: MachineShape;
  diskMib: number;
  /** The RAM file's name, in the loading host's RAM directory. */
  ramFile: string;
  uptimeAtCheckpointMs: number;
  bakedAt: string;
}

/** The files a build directory holds, by name. */
export const ARTIFACT_FILES = { manifest: 'artifact.json', devState: 'device.state', disk: 'disk.raw' } as const;

/** Writes `a`'s manifest into its build directory (`a.dir`), atomically. */
export function writeArtifactManifest(a: Artifact): void {
  const rel = (p: string) => relative(a.dir, p);
  const m: ManifestV2 = {
    format: 2,
    key: a.key,
    shape: { ...a.shape, kernel: rel(a.shape.kernel), initrd: rel(a.shape.initrd), layers: a.shape.layers.map(rel) },
    diskMib: a.diskMib,
    ramFile: basename(a.memPath),
    uptimeAtCheckpointMs: a.uptimeAtCheckpointMs,
    bakedAt: a.bakedAt,
  };
  const path = join(a.dir, ARTIFACT_FILES.manifest);
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, JSON.stringify(m, null, 2));
  renameSync(tmp, path);
}

/**
 * The artifact whose manifest is in `buildDir`, with this host's paths: its files in `buildDir`,
 * its RAM file in `ramDir`. Throws if there is no readable manifest.
 */
export function readArtifactManifest(buildDir: string, ramDir: string): Artifact {
  const raw = JSON.parse(readFileSync(join(buildDir, ARTIFACT_FILES.manifest), 'utf8')) as ManifestV2 | Artifact;
  if (!('format' in raw)) return raw; // written before format 2: absolute paths of this host
  if (raw.format !== 2 || typeof raw.ramFile !== 'string' || isAbsolute(raw.ramFile) || raw.ramFile.includes('/')) {
    throw new Error(`${join(buildDir, ARTIFACT_FILES.manifest)} is not an artifact manifest this version reads`);
  }
  const at = (p: string) => resolve(buildDir, p);
  return {
    key: raw.key,
    dir: buildDir,
    shape: { ...raw.shape, kernel: at(raw.shape.kernel), initrd: at(raw.shape.initrd), layers: raw.shape.layers.map(at) },
    diskMib: raw.diskMib,
    memPath: join(ramDir, raw.ramFile),
    devStatePath: join(buildDir, ARTIFACT_FILES.devState),
    diskPath: join(buildDir, ARTIFACT_FILES.disk),
    uptimeAtCheckpointMs: raw.uptimeAtCheckpointMs,
    bakedAt: raw.bakedAt,
  };
}
