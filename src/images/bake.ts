import { existsSync, mkdirSync, readFileSync, rmSync, readdirSync, renameSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { Vmm, isAlive, procStartTicks } from '../vmm/vmm.js';
import { machineSpec, vmmFiles, type MachineShape } from '../vmm/machine.js';
import type { Accel } from '../vmm/argv.js';
import { releaseJail, sealShared, type JailRecord, type Jailer } from '../vmm/jail.js';
import { launchVmm } from '../vmm/launch.js';
import type { NetManager } from '../net/netns.js';
import { policyKey, type EgressPolicy } from '../net/policy.js';
import { processMatches, type ClaimOwner } from '../host/claims.js';
import { connectAgent } from '../guest/connect.js';
import { homePaths } from '../host/paths.js';
import { run } from '../host/run.js';
import { digHoles } from '../vmm/memory.js';
import { claimArtifact } from './artifactGc.js';
import { sha256Hex } from '../host/hash.js';
import { ARTIFACT_FILES, readArtifactManifest, writeArtifactManifest, type Artifact } from './artifactManifest.js';

/** Ready parameters: what runs once at bake, after boot and before the checkpoint. */
export interface ReadyParams {
  /** A shell command (e.g. `pip install -r /app/requirements.txt`); must exit 0. */
  command?: string;
  /** A shell command that must exit 0 once the guest is ready (checked after `command`). */
  probe?: string;
  env?: Record<string, string>;
  cwd?: string;
  timeoutSecs?: number;
}

export interface BakeContext {
  home: string;
  ramDir: string;
  qemuBinary: string;
  accel: Accel;
  seccomp: boolean;
  /** Confines the template's VMM like a sandbox's (it runs the image's ready command). */
  jail?: Jailer | null;
  progress?: (m: string) => void;
  /** Receives the guest's output of the ready steps (the bake log). */
  log?: (chunk: string) => void;
  /**
   * With networking on, ready steps run on a network under the environment's egress policy (a
   * `pip install` needs one). Without, or with no ready steps, the NIC goes nowhere.
   */
  net?: { manager: NetManager; egress: EgressPolicy } | null;
}

/**
 * Bumped when the machine a checkpoint is made on changes (v2: no PIT), so old checkpoints are not
 * loaded into it, or when the key is computed differently (v3: over the contents of the shape's
 * files, not their paths).
 */
const ARTIFACT_RECIPE = 'artifact-v3';

/**
 * What a bake writes into its build directory (`vmm.json`) the moment its VMM exists, like a
 * sandbox's VMM record: a bake whose process dies (a server killed mid-bake) leaves a VMM running,
 * detached, and the next start stops it by this record (stopOrphanedBakes).
 */
export interface BakeVmmRecord {
  pid: number;
  startTicks: string;
  /** The process running the bake: while it lives the bake is its own, whoever else starts. */
  owner: ClaimOwner;
  memPath: string;
  jail?: JailRecord;
}

/** Whether a bake's ready steps run on a network. */
function bakeNet(ctx: BakeContext, shape: MachineShape, ready?: ReadyParams): boolean {
  return !!(ctx.net && shape.nic && ready && (ready.command || ready.probe));
}

/**
 * The content digests of the files a shape names, one for each, in the shape's order. Each layer by
 * the sha256 of its bytes: a restored guest reads its layers afresh, so a checkpoint must never
 * meet other bytes than it was made on. The kernel (by its package's digest) and the initramfs (by
 * its build recipe's, over the agent, modules and files it holds) are read only at boot, into guest
 * RAM that a restore replaces, so what they are built from is what counts.
 */
export interface ShapeDigests {
  kernel: string;
  initrd: string;
  layers: string[];
}

/**
 * The key of the artifact baked for `shape`: a digest of what it is made of, never of where its
 * files are, so every host computes the same key for the same recipe and contents whatever its
 * cache and layer store are called (an artifact can then move between hosts). Each path of the
 * shape is replaced by its file's digest; `extra` are the ready steps and what they could reach.
 */
export function artifactKey(shape: MachineShape, diskMib: number, digests: ShapeDigests, extra: string[] = []): string {
  if (digests.layers.length !== shape.layers.length) {
    throw new Error(`artifactKey: ${shape.layers.length} layers but ${digests.layers.length} layer digests`);
  }
  const contents: Record<string, unknown> = { ...shape, kernel: digests.kernel, initrd: digests.initrd, layers: digests.layers };
  const canonical = Object.fromEntries(Object.keys(contents).sort().map((k) => [k, contents[k]]));
  return sha256Hex(ARTIFACT_RECIPE, JSON.stringify(canonical), String(diskMib), ...extra);
}

/** The key ensureArtifact bakes under: artifactKey with the ready steps and, if they run on a network, its egress policy. */
export function bakeKey(shape: MachineShape, diskMib: number, digests: ShapeDigests, ready?: ReadyParams, egress?: EgressPolicy): string {
  // What the ready steps could reach is part of what they made.
  const readyInputs = ready ? [`ready:${JSON.stringify(ready)}`, ...(egress !== undefined ? [`egress:${policyKey(egress)}`] : [])] : [];
  return artifactKey(shape, diskMib, digests, readyInputs);
}

/**
 * Returns the artifact for `shape`, baking it if there is none whose RAM file survives (tmpfs is
 * lost on reboot; the checkpoint is then re-made, which is a boot of a few seconds).
 * `digests` are the content digests of the shape's files (kernel, initramfs, layers). A build
 * found, whichever host made it, is returned with `shape` as given: this host's paths of the same
 * contents.
 */
export async function ensureArtifact(ctx: BakeContext, shape: MachineShape, diskMib: number, digests: ShapeDigests, ready?: ReadyParams): Promise<Artifact> {
  const key = bakeKey(shape, diskMib, digests, ready, bakeNet(ctx, shape, ready) ? ctx.net!.egress : undefined);
  const root = join(homePaths(ctx.home).artifacts, key.slice(0, 24));
  mkdirSync(root, { recursive: true });
  // Claimed before its RAM file is looked for: a collector (artifactGc.ts) leaves it alone from now on.
  claimArtifact(root);
  const built = builtArtifact(root, key, ctx.ramDir);
  if (built) {
    const a = { ...built, shape };
    // The zero pages sandboxes faulted back in since it was dug (src/sandboxes/ramSparse.ts), or
    // all of them for a build from before RAM files were dug: holes again, while sandboxes may map it.
    // Only memory is at stake: a file that cannot be dug (another server's, read-only here) still serves.
    await digHoles(a.memPath, ctx.home).catch((e) => ctx.progress?.(`artifact ${key.slice(0, 12)}: its RAM file was not dug: ${(e as Error).message}`));
    return a;
  }
  return bake(ctx, shape, diskMib, key, root, ready);
}

/**
 * The newest complete build of artifact `key` under its directory `root` whose RAM file is in
 * `ramDir` (tmpfs is lost on reboot), with the paths its manifest gives; undefined when there is none.
 */
export function builtArtifact(root: string, key: string, ramDir: string): Artifact | undefined {
  const builds = readdirSync(root).filter((d) => !d.startsWith('tmp-')).sort().reverse();
  for (const b of builds) {
    if (!existsSync(join(root, b, ARTIFACT_FILES.manifest))) continue;
    let a: Artifact;
    try { a = readArtifactManifest(join(root, b), ramDir); } catch { continue; } // not one this version reads: baked anew
    if (a.key !== key) continue; // a copy put under another key's directory
    if (existsSync(a.memPath) && existsSync(a.devStatePath) && existsSync(a.diskPath)) return a;
  }
  return undefined;
}

async function bake(ctx: BakeContext, shape: MachineShape, diskMib: number, key: string, root: string, ready?: ReadyParams): Promise<Artifact> {
  const progress = ctx.progress ?? (() => {});
  const buildId = `${Date.now().toString(36)}-${process.pid}`;
  const tmpDir = join(root, `tmp-${buildId}`);
  const finalDir = join(root, buildId);
  mkdirSync(tmpDir, { recursive: true });
  mkdirSync(ctx.ramDir, { recursive: true });
  const memPath = join(ctx.ramDir, `artifact-${key.slice(0, 24)}-${buildId}.mem`);
  const diskTmp = join(tmpDir, ARTIFACT_FILES.disk);
  let vmm: Vmm | undefined;
  try {
    progress(`baking artifact ${key.slice(0, 12)}: formatting ${diskMib} MiB writable layer`);
    await run('truncate', ['-s', `${diskMib}M`, diskTmp]);
    // No lazy init left for the guest to do in the background after the checkpoint.
    await run('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=0,lazy_journal_init=0', '-O', '^has_journal', diskTmp]);
    const netm = bakeNet(ctx, shape, ready) ? ctx.net!.manager : null;
    const spec = machineSpec({
      qemuBinary: ctx.qemuBinary, accel: ctx.accel, seccomp: ctx.seccomp, shape, dir: tmpDir,
      memPath, memShared: true, upper: { path: diskTmp, format: 'raw' }, incoming: false, tap: !!netm,
    });
    progress(`baking artifact ${key.slice(0, 12)}: booting the guest`);
    const t0 = Date.now();
    const record: BakeVmmRecord = { pid: 0, startTicks: '', owner: { pid: process.pid, startTicks: procStartTicks(process.pid) ?? '' }, memPath };
    // The namespace is bound to the bake's VMM: if this process dies, the next start's sweep takes it.
    vmm = await launchVmm({
      spec, dir: tmpDir, jailer: ctx.jail ?? null,
      jail: { name: `bake-${key.slice(0, 12)}-${buildId}`, shape, diskPath: diskTmp, disksDir: join(ctx.home, 'disks'), trustedLayers: [] },
      net: netm, record,
      // The ready steps run under the environment's policy from their first packet.
      onNetwork: (net) => netm!.apply(net, ctx.net!.egress),
    });
    const agent = await connectAgent(spec.agentSocket, 120_000).catch((e) => {
      throw new Error(`${(e as Error).message}\nconsole:\n${tailFile(spec.consoleLog)}`);
    });
    for (const [step, command] of [['ready command', ready?.command], ['readiness probe', ready?.probe]] as const) {
      if (!command) continue;
      progress(`baking artifact ${key.slice(0, 12)}: running the ${step}`);
      ctx.log?.(`$ ${command}\n`);
      const out = await agent.exec(
        { commands: [['/bin/sh', '-c', command]], env: ready?.env, cwd: ready?.cwd, timeoutMs: (ready?.timeoutSecs ?? 1800) * 1000 },
        { onStdout: (c) => ctx.log?.(c.toString()), onStderr: (c) => ctx.log?.(c.toString()), timeoutMs: (ready?.timeoutSecs ?? 1800) * 1000 + 30_000 },
      );
      if (out.result.exitCode !== 0) {
        const tail = Buffer.concat([out.stdout, out.stderr]).toString().trim().split('\n').slice(-20).join('\n');
        throw new BakeError(`the ${step} exited with ${out.result.timedOut ? 'a timeout' : out.result.exitCode}`, tail);
      }
    }
    // Make sure the guest has flushed everything to the writable layer before it is frozen.
    const sync = await agent.exec({ commands: [['/bin/sh', '-c', 'sync']], timeoutMs: 60_000 });
    if (sync.result.exitCode !== 0) throw new Error(`sync in guest failed: ${sync.stderr.toString()}`);
    const pong = await agent.ping(5000);
    progress(`baking artifact ${key.slice(0, 12)}: guest ready after ${Date.now() - t0} ms; checkpointing`);
    const devStateTmp = join(tmpDir, ARTIFACT_FILES.devState);
    await vmm.checkpointDeviceState(devStateTmp, vmmFiles(tmpDir).migrationSocket);
    agent.close();
    await vmm.kill();
    vmm = undefined;
    for (const f of readdirSync(tmpDir)) {
      if (f.endsWith('.sock') || f === 'vmm.json') rmSync(join(tmpDir, f), { force: true });
    }
    await digHoles(memPath, ctx.home);
    // From now on every sandbox of this template maps the RAM and reads the disk: read-only, root's.
    sealShared(memPath);
    sealShared(diskTmp);
    renameSync(tmpDir, finalDir);
    const artifact: Artifact = {
      key, dir: finalDir, shape, diskMib, memPath,
      devStatePath: join(finalDir, ARTIFACT_FILES.devState),
      diskPath: join(finalDir, ARTIFACT_FILES.disk),
      uptimeAtCheckpointMs: Number(pong.uptimeMs),
      bakedAt: new Date().toISOString(),
    };
    writeArtifactManifest(artifact);
    return artifact;
  } catch (e) {
    if (vmm) await vmm.kill().catch(() => {});
    rmSync(tmpDir, { recursive: true, force: true });
    rmSync(memPath, { force: true });
    throw e;
  }
}

/**
 * Stops the VMMs of bakes whose process died (recorded in their build directory's vmm.json; see
 * BakeVmmRecord) and removes those build directories and RAM files. A bake whose process still runs
 * — another server or test sharing the cache — is left alone, and so is a build directory without a
 * record whose pid (in its name) is alive. Run at start, before anything of this process bakes.
 */
export async function stopOrphanedBakes(cacheDir: string, ramDir: string, progress?: (m: string) => void): Promise<void> {
  const artifacts = homePaths(cacheDir).artifacts;
  if (!existsSync(artifacts)) return;
  for (const key of readdirSync(artifacts)) {
    const root = join(artifacts, key);
    let builds: string[];
    try { builds = readdirSync(root).filter((d) => d.startsWith('tmp-')); } catch { continue; }
    let removed = 0;
    for (const b of builds) {
      const dir = join(root, b);
      const buildId = b.slice('tmp-'.length);
      const rec = readBakeRecord(vmmFiles(dir).vmmJson);
      if (rec ? processMatches(rec.owner) : isAlive(Number(buildId.split('-').pop()))) continue;
      if (rec?.pid) {
        if (isAlive(rec.pid) && procStartTicks(rec.pid) === rec.startTicks) {
          progress?.(`stopping the VMM of an interrupted bake (${dir}, pid ${rec.pid})`);
          try { process.kill(rec.pid, 'SIGKILL'); } catch { /* gone */ }
          const deadline = Date.now() + 5000;
          while (isAlive(rec.pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
        }
        if (rec.jail) await releaseJail(rec.jail, { pid: rec.pid, startTicks: rec.startTicks });
      }
      rmSync(rec?.memPath ?? join(ramDir, `artifact-${key}-${buildId}.mem`), { force: true });
      rmSync(dir, { recursive: true, force: true });
      removed++;
    }
    // A root left empty held only such bakes (nothing was ever built for its key).
    if (removed) try { rmdirSync(root); } catch { /* not empty */ }
  }
}

function readBakeRecord(path: string): BakeVmmRecord | null {
  try {
    const r = JSON.parse(readFileSync(path, 'utf8'));
    return typeof r?.owner?.pid === 'number' && typeof r.owner.startTicks === 'string' && typeof r.pid === 'number' ? r : null;
  } catch {
    return null;
  }
}

/** A bake that failed because of what the image or its ready parameters did, with the log tail. */
export class BakeError extends Error {
  constructor(message: string, readonly logTail: string) {
    super(`${message}\n${logTail}`);
    this.name = 'BakeError';
  }
}

function tailFile(path: string): string {
  try {
    return readFileSync(path, 'utf8').trim().split('\n').slice(-20).join('\n');
  } catch {
    return '(none)';
  }
}
