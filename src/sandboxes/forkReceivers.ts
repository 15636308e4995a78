import { existsSync, linkSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { EngineConfig } from '../config.js';
import type { NetManager } from '../net/netns.js';
import type { EgressPolicy } from '../net/policy.js';
import { homePaths } from '../host/paths.js';
import type { Artifact } from '../images/artifactManifest.js';
import { backingChain, diskRemapDir, exposeLayers, jailerFor, sealShared, untrustedLayer } from '../vmm/jail.js';
import { rebaseEmptyOverlay, qcow2Size } from '../vmm/qcow2.js';
import { WarmPool } from './warmPool.js';
import { destroyPending, newDiskPath, newSandboxId, spawnIncoming, type PendingVm } from './runtime.js';

interface Slot {
  pool: WarmPool<PendingVm>;
  /** When a sandbox on this artifact last forked. */
  lastFork: number;
  /** The egress policy of that fork's parent: receivers are made ready with it. */
  egress?: EgressPolicy;
}

/**
 * VMMs spawned ahead of the forks that will need them ("receivers"), per artifact. Spawning a QEMU
 * is the largest step of a live fork under TCG (the process, its jail and namespace, QEMU's own
 * start: ~100–200 ms, and ×16 for fork(16) on two cores), and a child's VMM cannot be started
 * before its fork point exists, because the RAM file and disk layer it runs on are made by the
 * fork. A receiver is started on its template's RAM file and disk like a create-pool VMM, but
 * remappable (VmSpec.remappable): a fork that takes it points its upper disk at the fork point's
 * layer (`attachDisk`: the header rewritten in place (qcow2.ts), the layer added and set as
 * backing over QMP) and,
 * once the fork point's RAM is whole, has the RAM shim inside QEMU map that file over the guest
 * RAM in place (`attachMemory`). Then it restores the fork point's device state like any child.
 * The guest has never run in it, so nothing it holds comes from the template.
 *
 * Sizing follows demand: a template gets receivers only once its sandboxes fork, as many as the
 * largest fork since (at most COLLIMATE_FORK_POOL_MAX), refilled one at a time after each fork,
 * and none again after COLLIMATE_FORK_POOL_IDLE_SECS without a fork. A receiver costs its QEMU's
 * own memory (no guest page is touched before it is taken) and no CPU while it waits. Needs
 * confinement (the RAM shim does the remap); without it every child is spawned at fork time.
 */
export class ForkReceivers {
  private readonly pools = new Map<string, Slot>();
  /** Forks whose pool size is not set yet (`forked` until its `setTarget`). */
  private readonly growing = new Set<Promise<void>>();
  private sweeper?: NodeJS.Timeout;
  private closed = false;

  private readonly spawn: (a: Artifact) => Promise<PendingVm>;
  private readonly destroy: (p: PendingVm) => Promise<void>;

  constructor(
    private readonly cfg: EngineConfig,
    private readonly artifactFor: (key: string) => Artifact,
    private readonly opts: {
      onError?: (msg: string) => void;
      /** Receivers get the egress policy of the last fork's parent ahead of time (a claim then has nothing to apply). */
      net?: NetManager | null;
      /** Tests: how a receiver is made and destroyed, and whether receivers can be used at all. */
      spawn?: (a: Artifact) => Promise<PendingVm>;
      destroy?: (p: PendingVm) => Promise<void>;
      available?: () => Promise<boolean>;
    } = {},
  ) {
    this.spawn = opts.spawn ?? ((a) => this.spawnFor(a));
    this.destroy = opts.destroy ?? destroyPending;
  }

  /** Whether forks here can use receivers: a pool allowed and confinement on (the RAM shim does the remap). */
  async available(): Promise<boolean> {
    if (this.opts.available) return this.opts.available();
    return this.cfg.forkPoolMax > 0 && !!(await jailerFor(this.cfg));
  }

  /** Up to `n` ready receivers for a fork of a sandbox on `artifactKey` (fewer, or none, when the pool has fewer). */
  take(artifactKey: string, n: number): PendingVm[] {
    if (this.cfg.forkPoolMax <= 0) return [];
    const slot = this.pools.get(artifactKey);
    const out: PendingVm[] = [];
    while (slot && out.length < n) {
      const p = slot.pool.takeReady();
      if (!p) break;
      out.push(p);
    }
    return out;
  }

  /**
   * After a fork of `count` children of a sandbox on `artifactKey`: the pool keeps as many as the
   * largest fork (capped), refilled in the background once the children have settled. Until the
   * new size is set, `settled` waits for it.
   */
  forked(artifactKey: string, count: number, egress?: EgressPolicy): Promise<void> {
    const growth = this.grow(artifactKey, count, egress);
    this.growing.add(growth);
    return growth.finally(() => this.growing.delete(growth));
  }

  /**
   * Resolves once every fork's new pool size is set and the pools hold that many ready receivers
   * (or at `deadline`): a descriptor or process count taken then does not change under a fill.
   */
  async settled(deadline: number): Promise<void> {
    await Promise.allSettled([...this.growing]);
    while (Object.values(this.sizes()).some((s) => s.ready < s.target) && Date.now() < deadline) await sleep(50);
  }

  private async grow(artifactKey: string, count: number, egress?: EgressPolicy): Promise<void> {
    if (this.closed || !(await this.available())) return;
    let artifact: Artifact;
    try {
      artifact = this.artifactFor(artifactKey);
    } catch {
      return;
    }
    if (!this.opts.spawn && !existsSync(artifact.memPath)) return;
    let slot = this.pools.get(artifactKey);
    if (!slot) {
      const fresh = { lastFork: 0 } as Slot;
      fresh.pool = new WarmPool<PendingVm>(
        `fork receivers ${artifactKey.slice(0, 12)}`, 0, () => this.spawnReady(artifact, fresh), this.destroy,
        (e) => this.opts.onError?.(`fork receiver for ${artifactKey.slice(0, 12)}: spawn failed: ${(e as Error).message}`),
        // One at a time: the children just forked are taking their first steps on the same cores.
        1,
      );
      slot = fresh;
      this.pools.set(artifactKey, slot);
    }
    slot.lastFork = Date.now();
    slot.egress = egress;
    this.sweeper ??= setInterval(() => void this.sweepIdle(), 30_000);
    this.sweeper.unref();
    const target = Math.min(this.cfg.forkPoolMax, Math.max(slot.pool.targetSize, count));
    // The children's first steps go before the refill.
    await sleep(500);
    if (!this.closed && this.pools.get(artifactKey) === slot) slot.pool.setTarget(target);
  }

  /** Ready receivers and the target, per artifact (metrics, /healthz). */
  sizes(): Record<string, { ready: number; target: number }> {
    return Object.fromEntries([...this.pools].map(([k, s]) => [k, { ready: s.pool.size, target: s.pool.targetSize }]));
  }

  /**
   * Drops the receivers of artifact `key` at once (its environment is gone and its last sandbox
   * too): nothing will fork on it, and its VMMs hold its layers open (images' layer collection).
   */
  async drop(key: string): Promise<void> {
    const slot = this.pools.get(key);
    if (!slot) return;
    this.pools.delete(key);
    await slot.pool.close();
  }

  /** Drops the receivers of templates whose sandboxes have not forked for a while. */
  async sweepIdle(now = Date.now()): Promise<void> {
    for (const [key, slot] of [...this.pools]) {
      if (now - slot.lastFork < this.cfg.forkPoolIdleSecs * 1000) continue;
      this.pools.delete(key);
      await slot.pool.close();
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.sweeper);
    const slots = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(slots.map((s) => s.pool.close()));
  }

  /** A receiver with the slot's egress policy in place. */
  private async spawnReady(a: Artifact, slot: Slot): Promise<PendingVm> {
    const p = await this.spawn(a);
    const net = this.opts.net;
    try {
      if (net && p.record?.net && slot.egress !== undefined) await net.apply(p.record.net, slot.egress);
    } catch (e) {
      await this.destroy(p).catch(() => {});
      throw e;
    }
    return p;
  }

  private async spawnFor(a: Artifact): Promise<PendingVm> {
    const id = newSandboxId();
    const paths = homePaths(this.cfg.home);
    return spawnIncoming(this.cfg, a.shape, {
      id, dir: join(paths.sandboxes, id), memPath: a.memPath, memShared: false,
      backing: { path: a.diskPath, format: 'raw' }, diskPath: newDiskPath(paths.disks, id), artifactKey: a.key,
      trustedLayers: [a.diskPath], network: true, remapDir: join(this.cfg.ramDir, `remap-${id}`),
    });
  }
}

/**
 * Puts a receiver's disk on a fork point's frozen layer: its empty top layer is recreated naming
 * that layer (same file, which QEMU holds open but has not used: it re-reads the header when the
 * restore activates the disk), the layer's chain must be one the server knows (`trusted`) and is
 * shown in the VMM's view, and QEMU opens the layer and makes it the top layer's backing.
 */
export async function attachDisk(cfg: EngineConfig, p: PendingVm, fp: { id: string; disk: string }, trusted: string[]): Promise<void> {
  await rebaseEmptyOverlay(p.record.diskPath, fp.disk, 'qcow2', qcow2Size(fp.disk));
  const chain = backingChain(p.record.diskPath);
  const bad = untrustedLayer(chain, trusted);
  if (bad) throw new Error(`the disk chain of ${p.record.diskPath} names ${bad}, which is not one of its layers`);
  exposeLayers(p.dir, homePaths(cfg.home).disks, chain.slice(1));
  await p.vmm.rebaseUpper(fp.disk, `fp-${fp.id}`);
}

/**
 * Maps a whole fork point's RAM file over a receiver's guest RAM (ramro.c does it inside QEMU):
 * the file is linked into the receiver's remap directory on its file system (the RAM files' tmpfs,
 * or the home's disk for a suspended sandbox's RAM image) for the moment it takes QEMU to open it.
 * From here on the receiver is a child of that fork point like any other.
 */
export async function attachMemory(p: PendingVm, forkPointMem: string): Promise<void> {
  if (!p.remapDir) throw new Error('not a fork receiver');
  // Shared from now on: root's, 0644 (a receiver filled by migration owned it until now).
  sealShared(forkPointMem);
  const dir = statSync(forkPointMem).dev === statSync(p.remapDir).dev ? p.remapDir : diskRemapDir(p.dir);
  const link = join(dir, 'ram');
  // The shim opens the first directory's `ram` it finds: nothing else by that name may be there.
  for (const d of [p.remapDir, diskRemapDir(p.dir)]) rmSync(join(d, 'ram'), { force: true });
  linkSync(forkPointMem, link);
  try {
    await p.vmm.remapRam('ram');
  } finally {
    rmSync(link, { force: true });
  }
  // Used once: the directories go (QEMU's view keeps empty, deleted ones).
  rmSync(p.remapDir, { recursive: true, force: true });
  rmSync(diskRemapDir(p.dir), { recursive: true, force: true });
  p.remapDir = undefined;
  p.record.memPath = forkPointMem;
}
