import { chmodSync, writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { Vmm } from './vmm.js';
import { vmmFiles } from './machine.js';
import type { VmSpec } from './argv.js';
import type { JailLaunch, JailRecord, JailRequest, Jailer } from './jail.js';
import type { NetManager, NetRecord, VmmNet } from '../net/netns.js';

/**
 * What every VMM record holds. The launcher fills in the process and its jail and writes the record
 * to `vmm.json` in the VMM's directory the moment the process exists, so that a server that dies
 * while QEMU starts leaves a record the next start finds and stops it by.
 */
export interface LaunchRecord {
  pid: number;
  startTicks: string;
  jail?: JailRecord;
}

export interface LaunchRequest<R extends LaunchRecord> {
  /** The machine; its NIC is on the namespace's tap exactly when `net` is given. */
  spec: VmSpec;
  /** The VMM's directory: `qemu.log` and `vmm.json` are written there. */
  dir: string;
  /** Confines the VMM (null: QEMU runs as the server). */
  jailer: Pick<Jailer, 'prepare'> | null;
  /** What the jail needs beyond the spec. */
  jail: Pick<JailRequest, 'name' | 'shape' | 'diskPath' | 'disksDir' | 'trustedLayers' | 'remapDir'>;
  /** Runs the VMM in a pooled network namespace of its own, with a tap owned by its uid (null: no network). */
  net: Pick<NetManager, 'acquire' | 'forVmm' | 'attachTap'> | null;
  record: R;
  /** Called once the namespace and its tap are ready, before the VMM starts: record it, apply a policy. */
  onNetwork?: (net: NetRecord) => void | Promise<void>;
  /**
   * Records the launch's steps (ms): `spawn_netns` (a pooled namespace), `spawn_jail` (uid, cgroups,
   * the VMM's view), `spawn_tap`, `spawn_qemu` (QEMU's exec until its QMP greeting).
   */
  phases?: { record(name: string, ms: number): void };
}

export type SpawnVmm = typeof Vmm.spawn;

/**
 * Starts one VMM the way every VMM is started: takes a pooled network namespace, prepares the jail
 * (its uid owns the tap), spawns QEMU and writes its record (mode 0600) as soon as the process
 * exists; the namespace's claim passes to the process then. A launch that fails gives the jail and
 * the namespace back; the caller removes what it made before (directory, disk).
 */
export async function launchVmm<R extends LaunchRecord>(req: LaunchRequest<R>, spawn: SpawnVmm = Vmm.spawn.bind(Vmm)): Promise<Vmm> {
  const { spec, dir, record } = req;
  let jail: JailLaunch | undefined;
  let net: VmmNet | undefined;
  let t = performance.now();
  const step = (name: string) => {
    const now = performance.now();
    req.phases?.record(name, now - t);
    t = now;
  };
  try {
    if (req.net) net = req.net.forVmm(await req.net.acquire());
    step('spawn_netns');
    jail = req.jailer
      ? await req.jailer.prepare({
        ...req.jail, dir, accel: spec.accel, qemuBinary: spec.qemuBinary, memPath: spec.memPath, memShared: spec.memShared,
        consoleLog: spec.consoleLog, tun: !!net,
      })
      : undefined;
    if (jail) record.jail = jail.record;
    step('spawn_jail');
    if (req.net && net) {
      await req.net.attachTap(net.rec, jail?.uid);
      step('spawn_tap');
      await req.onNetwork?.(net.rec);
    }
    const vmmJson = vmmFiles(dir).vmmJson;
    t = performance.now();
    const vmm = await spawn(spec, {
      logPath: vmmFiles(dir).qemuLog,
      jail,
      netns: net?.netns,
      release: net?.release,
      onSpawned: (pid, startTicks) => {
        record.pid = pid;
        record.startTicks = startTicks;
        net?.bound({ pid, startTicks });
        writeFileSync(vmmJson, JSON.stringify(record), { mode: 0o600 });
        // The mode above applies to a new file only: a record left by an earlier VMM in this directory keeps its own.
        chmodSync(vmmJson, 0o600);
      },
    });
    step('spawn_qemu');
    return vmm;
  } catch (e) {
    await jail?.release();
    await net?.release().catch(() => {});
    throw e;
  }
}
