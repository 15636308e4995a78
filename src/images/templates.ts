import { readFileSync } from 'node:fs';
import type { EngineConfig } from '../config.js';
import { kernelCmdline } from '../vmm/argv.js';
import { guestClockArgs } from '../vmm/accel.js';
import { jailerFor } from '../vmm/jail.js';
import { builtFileSha256 } from '../host/hash.js';
import { ensureKernel, ensureInitramfs, ensureBaseRootfs, SEED_LIBRARY_INITRAMFS_PATH, type LayerAsset } from './guestAssets.js';
import { ensureArtifact, type ReadyParams } from './bake.js';
import type { Artifact } from './artifactManifest.js';
import { buildAgent } from '../guest/agentBuild.js';
import { agentBinary } from './agentAsset.js';
import { seedLibrary } from './seedAsset.js';
import { CATALOG_DEFAULTS, type CatalogEntry } from './catalog.js';
import { DEBIAN_CATALOG } from './debianRootfs.js';
import type { EgressPolicy } from '../net/policy.js';
import { guestNetArg, netFor, networkingOn } from '../net/netns.js';

/** A template as the service lists it (GET /v1/templates). */
export interface TemplateInfo {
  id: string;
  /** `snapshot`: a snapshot promoted to an environment (snapshot_id), each sandbox started from it. */
  kind: 'catalog' | 'environment' | 'snapshot';
  snapshot_id?: string;
  description: string;
  interpreter: string[];
  /** Language runtimes and their versions, as the catalog states them (none for environments). */
  runtimes?: Record<string, string>;
  ready: boolean;
  vcpus: number;
  memory_mib: number;
  /** The egress policy of its sandboxes unless a create narrows it (src/net/policy.ts). */
  egress: EgressPolicy;
  /** Whether its sandboxes get a NIC: the server runs with networking and the template was baked with one. */
  network: boolean;
}

/** A template whose artifact is baked and whose device state is loaded: creates restore from it. */
export interface ReadyTemplate {
  id: string;
  kind: 'catalog' | 'environment';
  /** Owner of an environment template; catalog templates belong to everyone. */
  tenant?: string;
  description: string;
  interpreter: string[];
  /** Language runtimes and their versions, as the catalog entry states them. */
  runtimes?: Record<string, string>;
  artifact: Artifact;
  deviceState: Buffer;
  /** Applied to every exec of the template's sandboxes (request fields win over env and cwd). */
  execDefaults?: ExecDefaults;
  /** The egress policy of its sandboxes unless a create narrows it (src/net/policy.ts). */
  egress: EgressPolicy;
}

export interface ExecDefaults {
  env?: Record<string, string>;
  cwd?: string;
  /** argv prefix every command runs under, e.g. to switch to the image's User. */
  prefix?: string[];
}

/** Everything that defines a non-catalog template: the image's layers and the environment's configuration. */
export interface TemplateRecipe {
  id: string;
  tenant: string;
  description: string;
  interpreter: string[];
  layers: LayerAsset[];
  vcpus: number;
  memoryMib: number;
  diskMib: number;
  ready?: ReadyParams;
  execDefaults?: ExecDefaults;
  /** The environment's egress policy (default: "allow"). */
  egress?: EgressPolicy;
}

/** The guest assets every template shares: kernel, agent, seed library, initramfs. */
export async function guestBase(cfg: EngineConfig, progress: (m: string) => void) {
  const kernel = await ensureKernel(cfg.cacheDir, progress);
  const agent = await agentBinary(cfg.cacheDir, progress, buildAgent);
  // The agent copies it to /run/collimate at boot and preloads it into seeded execs (docs/determinism.md).
  const seedLib = await seedLibrary(cfg.cacheDir, progress);
  const initramfs = await ensureInitramfs(cfg.cacheDir, kernel, agent, progress, [{ path: SEED_LIBRARY_INITRAMFS_PATH, source: seedLib, mode: 0o755 }]);
  return { kernel, initramfs };
}

export type GuestBase = Awaited<ReturnType<typeof guestBase>>;

/** The guest kernel's command line: clock set-up under TCG, the NIC's address when networking is on. */
function guestCmdline(cfg: EngineConfig): string {
  const extra = [...guestClockArgs(cfg.accel.accel), ...(networkingOn(cfg.net) ? [guestNetArg()] : []), ...cfg.guestKernelArgs];
  return kernelCmdline({ debug: cfg.debugGuest, extra });
}

/** With networking on every template has a NIC (a restore must have the checkpoint's devices). */
function nicOf(cfg: EngineConfig): { nic?: true } {
  return networkingOn(cfg.net) ? { nic: true } : {};
}

/** Bakes (or finds cached) the artifact of a recipe; `log` gets the ready steps' output. */
export async function bakeRecipe(cfg: EngineConfig, recipe: TemplateRecipe, progress: (m: string) => void, log?: (c: string) => void): Promise<ReadyTemplate> {
  const { kernel, initramfs } = await guestBase(cfg, progress);
  const shape = {
    vcpus: recipe.vcpus,
    memoryMib: recipe.memoryMib,
    kernel: kernel.vmlinuz,
    initrd: initramfs.path,
    cmdline: guestCmdline(cfg),
    layers: recipe.layers.map((l) => l.path),
    ...nicOf(cfg),
  };
  const artifact = await ensureArtifact(
    {
      home: cfg.cacheDir, ramDir: cfg.artifactRamDir, qemuBinary: cfg.qemuBinary, accel: cfg.accel.accel, seccomp: cfg.seccomp, jail: await jailerFor(cfg), progress, log,
      // Ready steps (a `pip install`) run under the environment's own egress policy.
      net: recipe.ready && networkingOn(cfg.net) ? { manager: (await netFor(cfg))!, egress: recipe.egress ?? 'allow' } : null,
    },
    shape, recipe.diskMib, { kernel: kernel.debSha256, initrd: initramfs.digest, layers: recipe.layers.map((l) => l.digest) }, recipe.ready,
  );
  return {
    id: recipe.id, kind: 'environment', tenant: recipe.tenant, description: recipe.description, interpreter: recipe.interpreter,
    artifact, deviceState: readFileSync(artifact.devStatePath), execDefaults: recipe.execDefaults, egress: recipe.egress ?? 'allow',
  };
}

export const CATALOG: CatalogEntry[] = [
  {
    id: 'base',
    description: 'Minimal Linux userland (busybox): /bin/sh and the usual tools. `code` runs as a shell script.',
    interpreter: ['/bin/sh', '-c'],
    runtimes: {},
    ...CATALOG_DEFAULTS,
    layers: async (home, progress) => [await ensureBaseRootfs(home, progress)],
  },
  ...DEBIAN_CATALOG,
];

/** Builds (or finds cached) every guest asset and catalog artifact. Idempotent; the slow path runs once. */
export async function loadCatalog(cfg: EngineConfig, progress: (m: string) => void, only?: string[], entries: CatalogEntry[] = CATALOG): Promise<ReadyTemplate[]> {
  const base = await guestBase(cfg, progress);
  const chosen = entries.filter((e) => !only || only.includes(e.id));
  // Every entry's layers are built side by side (from an empty cache, downloads and apt in chroots of
  // their own, much of it waiting on the mirror) while the artifacts are baked one at a time in
  // catalog order, each once its layers are there. A failure is raised where the sequence reaches it.
  const layers = chosen.map((e) => e.layers(cfg.cacheDir, progress));
  for (const p of layers) p.catch(() => {});
  const out: ReadyTemplate[] = [];
  for (const [i, entry] of chosen.entries()) out.push(await catalogTemplate(cfg, entry, base, progress, await layers[i]));
  return out;
}

/** One catalog entry's template: its layers built (or found cached; `built` when the caller has them) and its artifact baked (or found). */
export async function catalogTemplate(cfg: EngineConfig, entry: CatalogEntry, base: GuestBase, progress: (m: string) => void, built?: LayerAsset[]): Promise<ReadyTemplate> {
  const { kernel, initramfs } = base;
  const layers: LayerAsset[] = built ?? await entry.layers(cfg.cacheDir, progress);
  const shape = {
    vcpus: entry.vcpus,
    memoryMib: cfg.catalogMemoryMib ?? entry.memoryMib,
    kernel: kernel.vmlinuz,
    initrd: initramfs.path,
    cmdline: guestCmdline(cfg),
    layers: layers.map((l) => l.path),
    ...nicOf(cfg),
  };
  const artifact = await ensureArtifact(
    { home: cfg.cacheDir, ramDir: cfg.artifactRamDir, qemuBinary: cfg.qemuBinary, accel: cfg.accel.accel, seccomp: cfg.seccomp, jail: await jailerFor(cfg), progress },
    // Catalog layers by their bytes: their recipe digests do not pin them (mkfs.erofs gives each build its own UUID).
    shape, entry.diskMib, { kernel: kernel.debSha256, initrd: initramfs.digest, layers: await Promise.all(layers.map((l) => builtFileSha256(l.path))) }, entry.ready,
  );
  return { id: entry.id, kind: 'catalog', description: entry.description, interpreter: entry.interpreter, runtimes: entry.runtimes, artifact, deviceState: readFileSync(artifact.devStatePath), egress: cfg.catalogEgress };
}
