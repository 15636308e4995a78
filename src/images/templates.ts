import { readFileSync } from 'node:fs';
import type { EngineConfig } from '../config.js';
import { kernelCmdline } from '../vmm/argv.js';
import { ensureKernel, ensureInitramfs, ensureBaseRootfs, type LayerAsset } from './guestAssets.js';
import { ensureArtifact, type Artifact } from './bake.js';
import { buildAgent } from '../guest/agentBuild.js';
import { agentBinary } from './agentAsset.js';
import { CATALOG_DEFAULTS, type CatalogEntry } from './catalog.js';
import { DEBIAN_CATALOG } from './debianRootfs.js';

/** A template whose artifact is baked and whose device state is loaded: creates restore from it. */
export interface ReadyTemplate {
  id: string;
  description: string;
  interpreter: string[];
  artifact: Artifact;
  deviceState: Buffer;
}

export const CATALOG: CatalogEntry[] = [
  {
    id: 'base',
    description: 'Minimal Linux userland (busybox): /bin/sh and the usual tools. `code` runs as a shell script.',
    interpreter: ['/bin/sh', '-c'],
    ...CATALOG_DEFAULTS,
    layers: async (home, progress) => [await ensureBaseRootfs(home, progress)],
  },
  ...DEBIAN_CATALOG,
];

/** Builds (or finds cached) every guest asset and catalog artifact. Idempotent; the slow path runs once. */
export async function loadCatalog(cfg: EngineConfig, progress: (m: string) => void, only?: string[]): Promise<ReadyTemplate[]> {
  const kernel = await ensureKernel(cfg.cacheDir, progress);
  const agent = await agentBinary(cfg.cacheDir, progress, buildAgent);
  const initramfs = await ensureInitramfs(cfg.cacheDir, kernel, agent, progress);
  const out: ReadyTemplate[] = [];
  for (const entry of CATALOG) {
    if (only && !only.includes(entry.id)) continue;
    const layers: LayerAsset[] = await entry.layers(cfg.cacheDir, progress);
    const shape = {
      vcpus: entry.vcpus,
      memoryMib: cfg.catalogMemoryMib ?? entry.memoryMib,
      kernel: kernel.vmlinuz,
      initrd: initramfs.path,
      cmdline: kernelCmdline({ debug: cfg.debugGuest }),
      layers: layers.map((l) => l.path),
    };
    const artifact = await ensureArtifact(
      { home: cfg.cacheDir, ramDir: cfg.artifactRamDir, qemuBinary: cfg.qemuBinary, accel: cfg.accel.accel, seccomp: cfg.seccomp, progress },
      shape, entry.diskMib, [kernel.debSha256, initramfs.digest, ...layers.map((l) => l.digest)],
    );
    out.push({ id: entry.id, description: entry.description, interpreter: entry.interpreter, artifact, deviceState: readFileSync(artifact.devStatePath) });
  }
  return out;
}
