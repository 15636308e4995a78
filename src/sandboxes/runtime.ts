import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import type { Phases } from './phases.js';
import { mkdirSync, rmSync, createReadStream, lstatSync, existsSync, readFileSync, readdirSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { Vmm, isAlive, procStartTicks, type VmmConfinement } from '../vmm/vmm.js';
import { jailerFor, releaseJail, sealShared } from '../vmm/jail.js';
import { isRunning } from '../host/claims.js';
import { launchVmm } from '../vmm/launch.js';
import { netFor } from '../net/netns.js';
import { warmCodeInterpreter } from '../guest/codeServer.js';
import { homePaths } from '../host/paths.js';
import { machineSpec, vmmFiles, type MachineShape } from '../vmm/machine.js';
import type { VmSpec } from '../vmm/argv.js';
import type { EngineConfig } from '../config.js';
import { connectAgent, connectRestoredAgent } from '../guest/connect.js';
import type { AgentClient } from '../guest/agentClient.js';
import { run } from '../host/run.js';
import type { VmmRecord } from './repo.js';
import type { NetManager } from '../net/netns.js';
import type { EgressPolicy } from '../net/policy.js';
import { execSeed } from './exec.js';

/** A sandbox's live VMM and its agent connection, held in memory while it runs. */
export interface LiveVm {
  vmm: Vmm;
  agent: AgentClient;
  record: VmmRecord;
}

/** A VMM spawned ahead of time, waiting in `-incoming defer` with its own disk overlay. */
export interface PendingVm {
  id: string;
  dir: string;
  vmm: Vmm;
  record: VmmRecord;
  /**
   * Set when the pool already restored this VMM from its checkpoint, ran one warm-up exec and
   * paused it: claiming it is `cont` plus a fresh identity (see claimWarm).
   */
  warm?: LiveVm;
  /** A VMM spawned for a fork not yet made (forkReceivers.ts): its remap directory. */
  remapDir?: string;
}

export function newSandboxId(): string {
  return `sbx_${randomBytes(6).toString('hex')}`;
}

/** Whether `path` is a plain file in the disks directory with a name newDiskPath could have made. */
export function isOwnDiskPath(disksDir: string, path: string): boolean {
  if (dirname(path) !== disksDir || !/^[a-z]{2,4}_[0-9a-f]{12}-[0-9a-f]{8}\.qcow2$/.test(basename(path))) return false;
  try {
    return lstatSync(path).isFile();
  } catch {
    return false;
  }
}

/** A fresh disk file name in the disks directory: disks are never renamed (QEMU keeps them open). */
export function newDiskPath(disksDir: string, owner: string): string {
  return join(disksDir, `${owner}-${randomBytes(4).toString('hex')}.qcow2`);
}

export function newForkPointId(): string {
  return `fp_${randomBytes(6).toString('hex')}`;
}

export async function createOverlay(path: string, backing: string, backingFormat: 'raw' | 'qcow2'): Promise<void> {
  await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', backingFormat, '-b', backing, path]);
}

/** The machine of a sandbox-side VMM; its NIC is on the namespace's tap when `tap`. */
function specFor(
  cfg: EngineConfig, shape: MachineShape, rec: Pick<VmmRecord, 'dir' | 'memPath' | 'memShared' | 'diskPath'>,
  opts: { incoming: boolean; tap: boolean; remappable?: boolean },
): VmSpec {
  return machineSpec({
    qemuBinary: cfg.qemuBinary, accel: cfg.accel.accel, seccomp: cfg.seccomp, shape, dir: rec.dir,
    memPath: rec.memPath, memShared: rec.memShared, upper: { path: rec.diskPath, format: 'qcow2' }, incoming: opts.incoming, tap: opts.tap,
    remappable: opts.remappable,
  });
}

/**
 * Spawns a VMM paused in `-incoming defer` in `dir`, with a fresh qcow2 overlay on `backing`.
 * Its RAM is `memPath`: share=off for a sandbox (copy-on-write over a checkpoint), share=on for a
 * fork point being filled by a live migration. With `boot`, the VMM boots the guest's kernel
 * instead, on the disk it is given (a suspend that kept only the files, resumed: finishBoot).
 */
export async function spawnIncoming(
  cfg: EngineConfig,
  shape: MachineShape,
  opts: {
    id: string; dir: string; memPath: string; memShared: boolean; backing: { path: string; format: 'raw' | 'qcow2' } | null; diskPath: string; artifactKey: string;
    /** Every read-only layer the disk may sit on, as the server knows them (see JailRequest.trustedLayers). */
    trustedLayers: string[];
    /**
     * A VMM that will run the guest as a sandbox: with networking on it gets a namespace and tap of
     * its own (fork-point receivers and the like get the NIC on a backend that goes nowhere).
     */
    network?: boolean;
    /** Spawned for a fork not yet made: its RAM and disk can be moved onto the fork point (forkReceivers.ts); needs confinement. */
    remapDir?: string;
    /**
     * Runs on the VMM's namespace as soon as it exists, while QEMU starts (an egress policy put in
     * place: 20–30 ms of `nft` off the critical path); the spawn waits for it and fails with it.
     */
    whileStarting?: (net: NonNullable<VmmRecord['net']>) => Promise<void>;
    /** Records the launch's steps (launchVmm). */
    phases?: { record(name: string, ms: number): void };
    /** Boot the kernel (on `diskPath` as it is) instead of waiting for a restore. */
    boot?: boolean;
  },
): Promise<PendingVm> {
  if (!opts.diskPath) throw new Error('spawnIncoming needs a diskPath (see newDiskPath)');
  const jailer = await jailerFor(cfg);
  if (opts.remapDir && !jailer) throw new Error('a remappable VMM needs confinement (its RAM shim does the remap)');
  // A resume spawns into the sandbox's own directory, which holds its snapshot: only what this
  // call made is removed when it fails.
  const madeDir = mkdirSync(opts.dir, { recursive: true }) !== undefined;
  const diskPath = opts.diskPath;
  const undo = () => {
    if (madeDir) rmSync(opts.dir, { recursive: true, force: true });
    if (opts.remapDir) rmSync(opts.remapDir, { recursive: true, force: true });
    if (opts.backing) rmSync(diskPath, { force: true });
  };
  if (opts.backing) await createOverlay(diskPath, opts.backing.path, opts.backing.format);
  const record: VmmRecord = { pid: 0, startTicks: '', dir: opts.dir, diskPath, memPath: opts.memPath, memShared: opts.memShared, artifactKey: opts.artifactKey };
  const netm = opts.network && shape.nic ? await netFor(cfg) : null;
  let vmm: Vmm;
  let alongside: Promise<void> | undefined;
  try {
    vmm = await launchVmm({
      spec: specFor(cfg, shape, record, { incoming: !opts.boot, tap: !!netm, remappable: !!opts.remapDir }),
      dir: opts.dir,
      jailer,
      jail: { name: opts.id, shape, diskPath, disksDir: homePaths(cfg.home).disks, trustedLayers: opts.trustedLayers, remapDir: opts.remapDir },
      net: netm,
      record,
      phases: opts.phases,
      // Kept in the record, so that a later server can adopt or remove the namespace.
      onNetwork: (net) => {
        record.net = net;
        alongside = opts.whileStarting?.(net);
        alongside?.catch(() => {});
      },
    });
  } catch (e) {
    // The namespace went with the failed launch; what ran on it is undone once it has settled
    // (an egress policy applied after that would hold a resolver for a namespace that is gone).
    if (alongside && netm && record.net) {
      await alongside.catch(() => {});
      await netm.release(record.net).catch(() => {});
    }
    // Nothing refers to what this call made yet: remove it, or a failed spawn leaks a disk layer.
    undo();
    throw e;
  }
  if (alongside) {
    try {
      await alongside;
    } catch (e) {
      await vmm.kill().catch(() => {});
      undo();
      throw e;
    }
  }
  return { id: opts.id, dir: opts.dir, vmm, record, ...(opts.remapDir ? { remapDir: opts.remapDir } : {}) };
}

/** Stops a pending VMM (a pool's, a fork point's receiver, an unborn child) and removes its directory and disk. */
export async function destroyPending(p: PendingVm): Promise<void> {
  p.warm?.agent.close();
  await p.vmm.kill();
  rmSync(p.dir, { recursive: true, force: true });
  if (p.remapDir) rmSync(p.remapDir, { recursive: true, force: true });
  rmSync(p.record.diskPath, { force: true });
}

/** A restored guest that never acknowledged RESTORED (announceRestore): worth one fresh VMM. */
export class RestoreUnacknowledgedError extends Error {
  /** The VMM's interrupt and virtio state when the wait ended (Vmm.interruptState), if it could be read. */
  diagnostics?: string;
  constructor(readonly timeoutMs: number) {
    super(`guest agent did not acknowledge the restore within ${timeoutMs} ms`);
    this.name = 'RestoreUnacknowledgedError';
  }
}

/** Restores since the process started: acknowledged, and the ones whose guest never answered. */
export const restoreCounts = { acknowledged: 0, unacknowledged: 0 };
/** Emits `unacknowledged` (RestoreUnacknowledgedError, diagnostics filled) for every restore whose guest never answered. */
export const restoreEvents = new EventEmitter();

/**
 * Entropy, clock and a new identity for a guest that just woke up as a clone. The acknowledgement
 * comes within ~150 ms even on a loaded host; about one fresh restore in a hundred under load never
 * acknowledges (the guest idles with the agent's data unread, reconnecting does not help — a
 * lost interrupt, under TCG at least), so callers that can start over with a fresh VMM do
 * (on a RestoreUnacknowledgedError) and the wait is short.
 */
export async function announceRestore(agent: AgentClient, sandboxId: string, opts: { vmm?: Vmm; timeoutMs?: number } = {}): Promise<void> {
  const { vmm, timeoutMs = 8_000 } = opts;
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new RestoreUnacknowledgedError(timeoutMs)), timeoutMs);
  });
  const acked = agent.restored({ entropy: randomBytes(64), timeNs: hostNowNs(), sandboxId, token: randomBytes(16).toString('hex') });
  try {
    await Promise.race([acked, timeout]);
    restoreCounts.acknowledged++;
  } catch (e) {
    if (e instanceof RestoreUnacknowledgedError) {
      restoreCounts.unacknowledged++;
      if (vmm) {
        e.diagnostics = await vmm.interruptState().catch((err) => `(unreadable: ${(err as Error).message})`);
      }
      restoreEvents.emit('unacknowledged', e);
    }
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

/** Brings a restored VMM to running and connects its agent. */
export async function finishRestore(pending: PendingVm, sandboxId: string, phases?: Phases): Promise<LiveVm> {
  const t0 = performance.now();
  // Connected before the VM runs again. The guest's port was open with a host attached when it
  // was saved; QEMU's post-load check (virtio-serial, on the first tick of the running VM) tells
  // the guest the host is gone if it finds no host then, and a moment later that it is back. The
  // guest processes those control messages late (a workqueue), after the host's RESTORED request
  // has already arrived on the data queue: the agent answered, its answer waited for the port to
  // be writable, the late 'closed' made it drop the answer, and the host waited for it in vain
  // (QEMU trace: PORT_OPEN 0, chardev opened, PORT_OPEN 1, 160 bytes read, no write). Attached
  // first, the post-load check finds the host there and the port never looks closed.
  const agent = await connectRestoredAgent(vmmFiles(pending.dir).agentSocket, 10_000);
  try {
    // Accepted by QEMU, not only queued by the kernel: else the post-load check may still run first.
    await pending.vmm.waitChardevConnected('agent');
    await pending.vmm.waitRunning();
  } catch (e) {
    agent.close();
    throw e;
  }
  phases?.since('agent_connect', t0);
  return announced(pending, agent, sandboxId, phases);
}

/** The guest connected as `agent` told who it is (announceRestore): the live VM, or the agent closed and the error. */
async function announced(pending: PendingVm, agent: AgentClient, sandboxId: string, phases?: Phases): Promise<LiveVm> {
  try {
    const t1 = performance.now();
    await announceRestore(agent, sandboxId, { vmm: pending.vmm });
    phases?.since('agent_ack', t1);
  } catch (e) {
    agent.close();
    throw e;
  }
  return { vmm: pending.vmm, agent, record: pending.record };
}

/**
 * Waits for a VMM spawned with `boot` to bring its guest up (the agent answers), then gives the
 * guest its sandbox's identity, entropy and clock as a restored one gets them (announceRestore).
 * Under TCG a boot takes seconds; `timeoutMs` leaves room for a loaded host.
 */
export async function finishBoot(pending: PendingVm, sandboxId: string, phases?: Phases, timeoutMs = 180_000): Promise<LiveVm> {
  const t0 = performance.now();
  const agent = await connectAgent(vmmFiles(pending.dir).agentSocket, timeoutMs);
  phases?.since('boot', t0);
  return announced(pending, agent, sandboxId, phases);
}

/**
 * Restores a pool VMM ahead of time and warms it: under TCG every guest code path that runs for
 * the first time in a new QEMU process is translated anew, so the first exec after a restore costs
 * tens of milliseconds. Doing that once here, then pausing the VM, keeps it off the create path.
 * The guest's identity is still the checkpoint's; claimWarm gives it a fresh one.
 */
export async function prewarm(pending: PendingVm, deviceState: Buffer): Promise<PendingVm> {
  const live = await restoreCheckpoint(pending, deviceState, pending.id);
  try {
    // Seeded, as every exec of a sandbox is: the seed library's preload is on the path too.
    await live.agent.exec({ commands: [['true']], timeoutMs: 30_000, seed: execSeed(undefined) }, { timeoutMs: 60_000 });
    // And the login shell E2B's door and a PTY start as `user` (`bash -l -c`, `bash -i -l`): its
    // first start in a VMM takes 0.3–0.6 s under TCG, later ones ~50 ms. Twice: as a seeded exec
    // runs it, and without the seed library's preload, which is where an unseeded process started
    // without ASLR (under TCG, config.ts unseededAslr) finds its libraries; the exec's
    // ADDR_NO_RANDOMIZE carries over. Images without bash or without a `user` account are skipped
    // (the agent refuses an unknown account: ignored).
    const login = 'bash -i -l -c true </dev/null >/dev/null 2>&1';
    await live.agent.exec(
      { commands: [['/bin/sh', '-c', `command -v bash >/dev/null || exit 0; ${login}; exec env -u LD_PRELOAD ${login}`]], user: 'user', timeoutMs: 30_000, seed: execSeed(undefined) },
      { timeoutMs: 60_000 },
    ).catch(() => {});
    // And the code interpreter's path, where the template baked one (docs/code.md).
    if (pending.record.net) await warmCodeInterpreter(pending.record.net.nsIp);
    await live.vmm.qmp.execute('stop');
  } catch (e) {
    live.agent.close();
    throw e;
  }
  return { ...pending, warm: live };
}

/**
 * A VMM for a warm pool (a template's, templatePools.ts; a snapshot's, snapshotPools.ts): spawned
 * waiting for its restore over `image` (the RAM file, mapped copy-on-write, and the disk layer its
 * own sits on), under `egress` before the guest first runs, then restored and paused by `prewarm`
 * when `deviceState` is given. Destroyed if any step fails.
 */
export async function spawnPooled(
  cfg: EngineConfig, net: NetManager | null, shape: MachineShape,
  image: { memPath: string; backing: { path: string; format: 'raw' | 'qcow2' }; artifactKey: string; trustedLayers: string[] },
  egress: EgressPolicy, deviceState: Buffer | null,
): Promise<PendingVm> {
  const id = newSandboxId();
  const { sandboxes, disks } = homePaths(cfg.home);
  const pending = await spawnIncoming(cfg, shape, {
    id, dir: join(sandboxes, id), memPath: image.memPath, memShared: false, backing: image.backing, diskPath: newDiskPath(disks, id),
    artifactKey: image.artifactKey, trustedLayers: image.trustedLayers, network: true,
  });
  try {
    if (pending.record.net) await net!.apply(pending.record.net, egress);
    return deviceState ? await prewarm(pending, deviceState) : pending;
  } catch (e) {
    await destroyPending(pending).catch(() => {});
    throw e;
  }
}

/** Resumes a prewarmed VMM and makes it a new sandbox: fresh entropy, clock, boot id, ids. */
export async function claimWarm(warm: LiveVm, sandboxId: string, phases?: Phases): Promise<LiveVm> {
  const t0 = performance.now();
  await warm.vmm.cont();
  phases?.since('claim', t0);
  const t1 = performance.now();
  await announceRestore(warm.agent, sandboxId, { vmm: warm.vmm });
  phases?.since('agent_ack', t1);
  return warm;
}

/** Restores a checkpoint's device state (RAM comes from the mapped file) into a pending VMM. */
export async function restoreCheckpoint(pending: PendingVm, deviceState: Buffer, sandboxId: string, phases?: Phases): Promise<LiveVm> {
  const t0 = performance.now();
  await pending.vmm.restoreDeviceState(deviceState);
  phases?.since('device_state_load', t0);
  return finishRestore(pending, sandboxId, phases);
}

/** Feeds a full migration stream (RAM included) from a file into a pending VMM. */
export async function restoreStream(pending: PendingVm, statePath: string, phases?: Phases, timeoutMs = 120_000): Promise<void> {
  const t0 = performance.now();
  try {
    await streamInto(pending, statePath, timeoutMs);
  } finally {
    phases?.since('memory_load', t0);
  }
}

/**
 * QEMU's MIGRATION event is the only word on whether the stream loaded. The socket is not: QEMU
 * closes its end as soon as it has read the stream's end marker, which can beat Node's own shutdown
 * of the socket after the last byte was written, and a pipeline then reports a "premature close"
 * for a load that completed (one resume in ~2,000 failed so). A load QEMU refuses fails the event
 * with QEMU's reason from its log; a state file we cannot read fails here.
 */
async function streamInto(pending: PendingVm, statePath: string, timeoutMs: number): Promise<void> {
  const done = pending.vmm.waitMigration(timeoutMs);
  done.catch(() => {});
  const sink = await pending.vmm.listenIncoming(false);
  const source = createReadStream(statePath);
  const unreadable = new Promise<never>((_, reject) => source.once('error', (e) => { sink.destroy(); reject(e); }));
  unreadable.catch(() => {});
  source.pipe(sink);
  try {
    await Promise.race([done, unreadable]);
  } finally {
    source.destroy();
  }
}

/**
 * Makes the qcow2 layer a live fork puts over a running VMM's disk, on its current top layer, and
 * shows it to the VMM (its uid, its disks view): done before the VM stops, as only the header of
 * the top layer is read. `snapshotUpperDisk` then puts it on top.
 */
export async function prepareUpperDisk(cfg: EngineConfig, live: LiveVm, newDisk: string): Promise<void> {
  await createOverlay(newDisk, live.record.diskPath, 'qcow2');
  try {
    const jailer = live.record.jail ? await jailerFor(cfg) : null;
    if (live.record.jail && jailer) jailer.exposeDisk(live.record.jail, live.record.dir, homePaths(cfg.home).disks, newDisk);
  } catch (e) {
    rmSync(newDisk, { force: true });
    throw e;
  }
}

/**
 * Puts the layer `prepareUpperDisk` made over a running VMM's disk (the first step of a live fork)
 * with `blockdev-snapshot-sync mode=existing`, so a confined QEMU never creates files itself; the
 * old top is frozen. Precondition: the VM is stopped. The layer is removed if this fails.
 */
export async function snapshotUpperDisk(cfg: EngineConfig, live: LiveVm, newDisk: string, nodeName: string): Promise<void> {
  const oldTop = live.record.diskPath;
  try {
    await live.vmm.qmp.execute('blockdev-snapshot-sync', { device: 'disk-upper', 'snapshot-file': newDisk, 'snapshot-node-name': nodeName, format: 'qcow2', mode: 'existing' });
    // QEMU reopened the old top read-only; from now on it is a shared, frozen layer.
    if (live.record.jail) sealShared(oldTop);
  } catch (e) {
    rmSync(newDisk, { force: true });
    throw e;
  }
}

/** How an adopted VMM is confined, from its record. */
function confinementOf(cfg: EngineConfig, rec: VmmRecord): VmmConfinement | undefined {
  if (!rec.jail && !rec.net) return undefined;
  return { uid: rec.jail?.uid, release: () => releaseRecorded(cfg, rec) };
}

/** Gives back the uid, cgroup and network namespace of a recorded VMM whose process is gone (or never to be adopted). */
export async function releaseRecorded(cfg: EngineConfig, rec: VmmRecord): Promise<void> {
  const owner = { pid: rec.pid, startTicks: rec.startTicks };
  try {
    if (rec.jail) await releaseJail(rec.jail, owner);
  } finally {
    if (rec.net) await (await netFor(cfg))?.release(rec.net, owner);
  }
}

/** Removes this home's VMM cgroups no process is in (run after reconcile has stopped every stray VMM). */
export async function sweepConfinement(cfg: EngineConfig): Promise<void> {
  await (await jailerFor(cfg))?.sweep();
}

/** The host's wall clock in ns, as the guest agent takes it (RESTORED, SET_TIME). */
export function hostNowNs(): bigint {
  return BigInt(Date.now()) * 1_000_000n;
}

/**
 * Runs a stopped VM again (a fork's parent, a sandbox paused for idling) and sets its wall clock,
 * which stood still meanwhile, with SET_TIME. Resolves once the VM runs; `clock` settles with the
 * SET_TIME (the guest's next request waits behind it on the agent link either way). An agent from
 * before SET_TIME refuses it: its clock stays behind, as before.
 */
export async function runAgain(live: LiveVm): Promise<{ clock: Promise<void> }> {
  await live.vmm.cont();
  const clock = live.agent.setTime(hostNowNs());
  clock.catch(() => {});
  return { clock };
}

/**
 * Re-attaches to a running sandbox's VMM after a server restart. Throws, naming the step that
 * failed, when it cannot; a VMM that answered but failed a later step is stopped first.
 */
export async function adoptVm(cfg: EngineConfig, shape: MachineShape, rec: VmmRecord): Promise<LiveVm> {
  const vmm = await Vmm.adopt(rec.pid, rec.startTicks, specFor(cfg, shape, rec, { incoming: false, tap: !!rec.net }), confinementOf(cfg, rec));
  let step = 'status';
  try {
    const status = await vmm.status();
    // A crash mid-fork or mid-suspend (or an idle pause) can leave the VM stopped; it resumes where it was.
    const stopped = status === 'paused' || status === 'postmigrate' || status === 'finish-migrate';
    step = `cont from ${status}`;
    if (stopped) await vmm.cont();
    step = 'query-block';
    const blocks = await vmm.qmp.execute<Array<{ device: string; inserted?: { file: string } }>>('query-block');
    const upper = blocks.find((b) => b.device === 'disk-upper');
    // QEMU's word is input from a process that may be compromised: the server later deletes and
    // chowns this path as root, so only a top layer of ours (a plain file in the disks directory,
    // named like the ones newDiskPath makes) is believed.
    const reported = upper?.inserted?.file;
    if (reported && isOwnDiskPath(homePaths(cfg.home).disks, reported)) rec.diskPath = reported;
    step = 'agent connection';
    // PING with retries: the guest may not yet have noticed that the previous server went away.
    const agent = await connectAgent(vmmFiles(rec.dir).agentSocket, 20_000);
    // Its clock stood still while it was stopped (see runAgain); its agent is only reachable now.
    if (stopped) await agent.setTime(hostNowNs()).catch(() => {});
    return { vmm, agent, record: rec };
  } catch (e) {
    await vmm.kill().catch(() => {});
    throw new Error(`its VMM (pid ${rec.pid}) failed at ${step}: ${(e as Error).message}`);
  }
}

/** Stops a VMM known only by its record (not in memory: suspended, or found at start) and gives back what it held. */
export async function killRecorded(cfg: EngineConfig, rec: VmmRecord): Promise<void> {
  if (rec.pid && isAlive(rec.pid) && procStartTicks(rec.pid) === rec.startTicks) await killPid(rec.pid);
  await releaseRecorded(cfg, rec);
}

/** Live QEMU processes whose command line mentions `needle` (a home's directory), by pid. */
export function qemuProcessesNaming(needle: string): number[] {
  const pids: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    let cmd = '';
    try { cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8'); } catch { continue; }
    if (cmd.startsWith('qemu-system') && cmd.includes(needle) && isRunning(Number(p))) pids.push(Number(p));
  }
  return pids;
}

/** SIGKILLs `pid` and waits (up to 5 s) until it is gone. */
export async function killPid(pid: number): Promise<void> {
  try { process.kill(pid, 'SIGKILL'); } catch { return; }
  const deadline = Date.now() + 5000;
  while (isAlive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
}

/** Stops the VMM whose record is in `dir` (vmm.json), if there is one. */
export async function killFromDir(cfg: EngineConfig, dir: string): Promise<void> {
  const f = vmmFiles(dir).vmmJson;
  if (!existsSync(f)) return;
  try {
    await killRecorded(cfg, JSON.parse(readFileSync(f, 'utf8')) as VmmRecord);
  } catch {
    // unreadable record: nothing we can safely kill
  }
}
