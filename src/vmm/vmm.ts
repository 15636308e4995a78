import { spawn, type StdioOptions } from 'node:child_process';
import { createServer, type Server, type Socket } from 'node:net';
import { openSync, closeSync, readFileSync, rmSync, createWriteStream, chmodSync, lchownSync, renameSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { QmpClient } from './qmp.js';
import { qemuArgv, REMAP_FD, type VmSpec } from './argv.js';
import type { JailLaunch } from './jail.js';

/** Descriptors every VMM inherits: the QMP and agent listening sockets, the incoming migration stream. */
const QMP_FD = 3;
const AGENT_FD = 4;
const INCOMING_FD = 5;

/** How a VMM is confined, as far as the Vmm object needs to know: whom to hand sockets to, what to release. */
export interface VmmConfinement {
  /** The VMM's own uid when it runs confined (sockets it must connect to are chowned to it). */
  uid?: number;
  /** Gives back the uid, removes the cgroup and the network namespace; called once the process is gone. */
  release(): Promise<void>;
}

/**
 * One QEMU process. Spawned detached so that it outlives a crash of the server (the next start
 * re-adopts it by pid and QMP socket). Knows the recipes of DESIGN.md: checkpoint with
 * x-ignore-shared, restore with `-incoming defer` + migrate-incoming, live migration into a
 * fork point. The migration stream goes over unix sockets we own (no `exec:` URIs, which the
 * seccomp `spawn=deny` policy forbids).
 */
export class Vmm {
  private exited = false;
  private exitWaiters: Array<() => void> = [];
  /** Our end of the socketpair QEMU reads an incoming migration from (`migrate-incoming fd:5`). */
  private incoming?: Socket;
  /** Our end of a remappable VMM's socket to its RAM shim (ramro.c): one `remap` request. */
  private remap?: Socket;
  private released?: Promise<void>;

  private constructor(
    readonly pid: number,
    readonly spec: VmSpec,
    public qmp: QmpClient,
    /** process start time (clock ticks since boot, /proc/<pid>/stat field 22): a pid is only ours if it matches */
    readonly startTicks: string,
    readonly confinement?: VmmConfinement,
  ) {}

  /** The VMM's directory (its sockets and logs live there). */
  get dir(): string {
    return dirname(this.spec.qmpSocket);
  }

  /**
   * Starts QEMU (confined by `jail` when given). The QMP and agent sockets are created here, by the
   * server, mode 0600, and passed to QEMU as listening descriptors: QEMU never creates a socket
   * the server trusts, and a confined QEMU needs no write access to any directory.
   */
  static async spawn(
    spec: VmSpec,
    opts: {
      logPath: string; startPaused?: boolean; qmpTimeoutMs?: number; jail?: JailLaunch;
      /** Called as soon as the process exists (before QMP is up), to record it: a crash from here on must find it. */
      onSpawned?: (pid: number, startTicks: string) => void;
      /** Run QEMU in this network namespace (a path under /run/netns); its tap is there. */
      netns?: string;
      /** Also run once the process is gone (after the jail's release): gives back the namespace. */
      release?: () => Promise<void>;
    },
  ): Promise<Vmm> {
    const listeners = [await listenPrivate(spec.qmpSocket), await listenPrivate(spec.agentSocket)];
    const full: VmSpec = { ...spec, socketFds: { qmp: QMP_FD, agent: AGENT_FD } };
    const argv = qemuArgv(full);
    if (opts.startPaused) argv.push('-S');
    // Debugging aid: QEMU trace events to the VMM's log, e.g. COLLIMATE_QEMU_TRACE='virtio_serial_*'.
    for (const t of (process.env.COLLIMATE_QEMU_TRACE ?? '').split(',').filter(Boolean)) argv.push('-trace', `enable=${t}`);
    // The network namespace first: the jail's mount namespace and uid switch happen inside it.
    const plain = { file: argv[0], args: argv.slice(1), env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' } };
    const launch = opts.jail
      ? opts.jail.command(argv, opts.netns)
      : opts.netns ? { ...plain, file: '/usr/bin/nsenter', args: [`--net=${opts.netns}`, '--', plain.file, ...plain.args] } : plain;
    const logFd = openSync(opts.logPath, 'a');
    const stdio: StdioOptions = ['ignore', logFd, logFd, serverFd(listeners[0]), serverFd(listeners[1]), spec.incoming ? 'pipe' : 'ignore'];
    if (spec.remappable) stdio[REMAP_FD] = 'pipe';
    let child;
    try {
      child = spawn(launch.file, launch.args, { detached: true, stdio, env: launch.env });
    } finally {
      closeSync(logFd);
      // QEMU holds its own copies now; ours must not accept its clients.
      for (const l of listeners) l.close();
    }
    child.unref();
    const incoming = spec.incoming ? ((child.stdio as unknown as Array<Socket | null>)[INCOMING_FD] ?? undefined) : undefined;
    incoming?.on('error', () => { /* QEMU went away; the migration wait reports it */ });
    incoming?.unref();
    const remap = spec.remappable ? ((child.stdio as unknown as Array<Socket | null>)[REMAP_FD] ?? undefined) : undefined;
    remap?.on('error', () => { /* QEMU went away; remapRam reports it */ });
    remap?.unref();
    const pid = child.pid;
    if (pid === undefined) throw new Error('QEMU failed to spawn');
    const startTicks = procStartTicks(pid) ?? '';
    opts.jail?.bind({ pid, startTicks });
    opts.onSpawned?.(pid, startTicks);
    let exitInfo: string | undefined;
    child.once('exit', (code, sig) => { exitInfo = `exited with ${code ?? sig}`; });
    const deadline = Date.now() + (opts.qmpTimeoutMs ?? 10_000);
    let qmp: QmpClient | undefined;
    while (!qmp) {
      if (exitInfo) { incoming?.destroy(); remap?.destroy(); throw new Error(`QEMU ${exitInfo}: ${tail(opts.logPath)}`); }
      if (Date.now() > deadline) {
        incoming?.destroy();
        remap?.destroy();
        try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
        throw new Error(`QEMU QMP socket did not come up: ${tail(opts.logPath)}`);
      }
      try { qmp = await QmpClient.connect(spec.qmpSocket, 5000); } catch { await sleep(2); }
    }
    const release = async () => {
      try { await opts.jail?.release(); } finally { await opts.release?.(); }
    };
    const vmm = new Vmm(pid, full, qmp, startTicks, opts.jail || opts.release ? { uid: opts.jail?.uid, release } : undefined);
    vmm.incoming = incoming;
    vmm.remap = remap;
    child.once('exit', () => vmm.markExited());
    qmp.once('closed', () => { if (!isAlive(pid)) vmm.markExited(); });
    return vmm;
  }

  /** Re-attaches to a QEMU left running by an earlier server process. Null if it is not ours any more. */
  /** Attaches to a VMM a previous server started; throws, saying why, when it cannot be the recorded one or does not answer. */
  static async adopt(pid: number, startTicks: string, spec: VmSpec, confinement?: VmmConfinement): Promise<Vmm> {
    if (!isAlive(pid)) throw new Error(`its VMM (pid ${pid}) is gone`);
    if (procStartTicks(pid) !== startTicks) throw new Error(`its VMM is gone (pid ${pid} is another process now)`);
    let qmp: QmpClient;
    try { qmp = await QmpClient.connect(spec.qmpSocket, 3000); } catch (e) { throw new Error(`its VMM (pid ${pid}) does not answer on ${spec.qmpSocket}: ${(e as Error).message}`); }
    const vmm = new Vmm(pid, spec, qmp, startTicks, confinement);
    // Not our child any more: poll for its exit instead of a process 'exit' event.
    const poll = setInterval(() => { if (!isAlive(pid)) { clearInterval(poll); vmm.markExited(); } }, 500);
    poll.unref();
    qmp.once('closed', () => { if (!isAlive(pid)) vmm.markExited(); });
    return vmm;
  }

  get alive(): boolean {
    return !this.exited && isAlive(this.pid);
  }

  async status(): Promise<string> {
    const r = await this.qmp.execute<{ status: string }>('query-status');
    return r.status;
  }

  /**
   * Saves device state only (RAM lives in the share=on backing file) to `path`.
   * The VM is left stopped; the caller decides whether to resume or quit it.
   */
  async checkpointDeviceState(path: string, sockPath: string): Promise<void> {
    await this.qmp.execute('stop');
    await this.qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: true }, { capability: 'events', state: true }] });
    await this.migrateToFile(path, sockPath);
  }

  /**
   * Saves the whole VM — RAM and device state — as one migration stream in `path` (suspend).
   * The VM is left stopped.
   */
  async saveFullState(path: string, sockPath: string): Promise<void> {
    await this.qmp.execute('stop');
    await this.qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: false }, { capability: 'events', state: true }] });
    await this.qmp.execute('migrate-set-parameters', { 'max-bandwidth': 64 * 1024 * 1024 * 1024 });
    await this.migrateToFile(path, sockPath);
  }

  /**
   * Live-migrates the whole VM (RAM included) into a VMM listening on `destSock` — the receiving side
   * of a live fork. The source is stopped first so the copy is a consistent point in time.
   */
  async migrateTo(dest: Vmm, timeoutMs = 120_000): Promise<void> {
    // The two VMMs see different mount views (and run as different uids), so neither can reach a
    // socket of the other: the server relays, from a socket in this VMM's directory to the
    // destination's incoming stream.
    const sink = await dest.listenIncoming(false);
    const received = dest.waitMigration(timeoutMs);
    received.catch(() => {});
    await this.qmp.execute('stop');
    await this.qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: false }, { capability: 'events', state: true }] });
    // The default bandwidth cap (~32 MiB/s) would make a fork take seconds; this is a local copy.
    await this.qmp.execute('migrate-set-parameters', { 'max-bandwidth': 64 * 1024 * 1024 * 1024 });
    const sockPath = join(this.dir, 'migrate-out.sock');
    const server = await this.listenForQemu(sockPath, (sock) => { sock.pipe(sink); });
    try {
      const sent = this.waitMigration(timeoutMs);
      sent.catch(() => {});
      await this.qmp.execute('migrate', { uri: `unix:${sockPath}` });
      await sent;
      await received;
    } catch (e) {
      sink.destroy();
      throw e;
    } finally {
      server.close();
      rmSync(sockPath, { force: true });
    }
  }

  /**
   * The state of every device, without RAM (QEMU's `xen-save-devices-state`, a few KB): for a VM
   * whose memory is captured another way (memory.ts). Precondition: the VM is stopped. The file is
   * made in the VMM's directory, owned by its uid, for the confined QEMU to write.
   */
  async saveDevicesOnly(): Promise<Buffer> {
    const path = join(this.dir, 'devices.state');
    closeSync(openSync(path, 'w', 0o600));
    const uid = this.confinement?.uid;
    if (uid !== undefined) lchownSync(path, uid, uid);
    try {
      await this.qmp.execute('xen-save-devices-state', { filename: path, live: false });
      return readFileSync(path);
    } finally {
      rmSync(path, { force: true });
    }
  }

  /** Restores device state into a VMM started with `-incoming defer` whose RAM file already holds the memory. */
  async restoreDeviceState(state: Buffer, timeoutMs = 30_000): Promise<void> {
    const done = this.waitMigration(timeoutMs);
    done.catch(() => {});
    const sink = await this.listenIncoming(true);
    sink.end(state);
    await done;
  }

  /**
   * Starts the incoming migration of a VMM spawned with `-incoming defer` and returns the stream
   * to write it to: QEMU reads it from an inherited socketpair (`migrate-incoming fd:5`), so no
   * listening socket exists anywhere for anyone else to connect to. Once per VMM.
   */
  async listenIncoming(ignoreShared: boolean): Promise<Socket> {
    const sink = this.incoming;
    if (!sink || sink.destroyed) throw new Error('this VMM cannot receive a migration (not spawned -incoming, or already received one)');
    this.incoming = undefined;
    await this.qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: ignoreShared }, { capability: 'events', state: true }] });
    await this.qmp.execute('migrate-incoming', { uri: `fd:${INCOMING_FD}` });
    sink.ref();
    sink.once('close', () => sink.unref());
    return sink;
  }

  /**
   * Maps the file `name` (linked by the server into the VMM's remap directory) over the guest RAM
   * in place of the file it was started on (ramro.c does it inside QEMU). Once, before the VMM
   * restores anything. Rejects with the shim's reason.
   */
  async remapRam(name: string, timeoutMs = 10_000): Promise<void> {
    const sock = this.remap;
    if (!sock || sock.destroyed) throw new Error('this VMM cannot remap its RAM (not spawned remappable, or already remapped)');
    this.remap = undefined;
    sock.ref();
    try {
      const answer = await new Promise<string>((resolve, reject) => {
        let buf = '';
        const timer = setTimeout(() => reject(new Error(`the VMM did not answer the RAM remap within ${timeoutMs} ms`)), timeoutMs);
        sock.on('data', (d) => {
          buf += d.toString('utf8');
          if (buf.includes('\n') || buf.length > 256) { clearTimeout(timer); resolve(buf.split('\n')[0]); }
        });
        sock.once('close', () => { clearTimeout(timer); reject(new Error(`the VMM closed its remap socket: ${tail(join(this.dir, 'qemu.log'))}`)); });
        sock.write(`remap ${name}\n`);
      });
      if (answer !== 'ok') throw new Error(`the VMM could not remap its RAM onto ${name}: ${answer.slice(0, 200)}`);
    } finally {
      sock.destroy();
    }
  }

  /**
   * Puts the read-only qcow2 layer `backing` (its own chain read from its header) under the VMM's
   * upper disk, in place of what the upper disk was opened on: a remappable VMM waiting for a fork
   * gets the fork point's disk. The upper disk's header must already name `backing` (the server
   * rewrote it; QEMU re-reads it when the incoming migration activates the disk). Before restore.
   */
  async rebaseUpper(backing: string, nodeName: string): Promise<void> {
    if (!this.spec.remappable) throw new Error('this VMM\'s upper disk cannot be rebased (not spawned remappable)');
    const cache = { direct: true, 'no-flush': false };
    await this.qmp.execute('blockdev-add', {
      driver: 'qcow2', 'node-name': nodeName, 'read-only': true, cache,
      file: { driver: 'file', filename: backing, aio: 'threads', cache },
    });
    await this.qmp.execute('blockdev-reopen', {
      options: [{ driver: 'qcow2', 'node-name': 'upper', file: 'upper-file', backing: nodeName, discard: 'unmap', cache, 'read-only': false }],
    });
  }

  waitMigration(timeoutMs: number): Promise<void> {
    return this.qmp.waitEvent('MIGRATION', timeoutMs, (e) => ['completed', 'failed', 'cancelled'].includes(String(e.data?.status))).then((e) => {
      if (e.data?.status !== 'completed') {
        // QEMU says why in its log (the receiving side's, for a failed load).
        const why = tail(join(this.dir, 'qemu.log')).trim();
        throw new Error(`migration ${e.data?.status}${why ? `: ${why}` : ''}`);
      }
    });
  }

  /** Stops the vCPUs (QMP `stop`); `cont` runs them again. */
  async stop(): Promise<void> {
    await this.qmp.execute('stop');
  }

  async cont(): Promise<void> {
    await this.qmp.execute('cont');
  }

  /**
   * Waits until QEMU has accepted a client on the chardev `id` (`query-chardev` stops calling it
   * disconnected). A connect() returns once the kernel queued the connection; QEMU accepts it on a
   * later turn of its main loop.
   */
  async waitChardevConnected(id: string, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    // Backing off (1, 2, 4 … 16 ms): a fork of 16 polls 16 VMMs at once on a busy host.
    for (let wait = 1; ; wait = Math.min(16, wait * 2)) {
      const list = await this.qmp.execute<Array<{ label: string; filename: string }>>('query-chardev');
      const dev = list.find((c) => c.label === id);
      if (!dev) throw new Error(`no chardev ${id}`);
      if (!dev.filename.startsWith('disconnected')) return;
      if (Date.now() > deadline) throw new Error(`chardev ${id} still disconnected after ${timeoutMs} ms (${dev.filename})`);
      await sleep(wait);
    }
  }

  /** One HMP command's text (for diagnostics: interrupt controllers, virtio queues). */
  async monitor(command: string): Promise<string> {
    return this.qmp.execute<string>('human-monitor-command', { 'command-line': command });
  }

  /**
   * The guest's interrupt and virtio state as QEMU sees it, for a guest that stopped answering:
   * local APIC, IOAPIC/PIC, IRQ counts, and the status and queues of every virtio device.
   */
  async interruptState(): Promise<string> {
    const out: string[] = [];
    const hmp = async (cmd: string) => {
      try {
        out.push(`## ${cmd}\n${(await this.monitor(cmd)).trimEnd()}`);
      } catch (e) {
        out.push(`## ${cmd}\n(failed: ${(e as Error).message})`);
      }
    };
    for (const cmd of ['info status', 'info lapic', 'info pic', 'info irq', 'info virtio']) await hmp(cmd);
    const virtio = out.find((l) => l.startsWith('## info virtio')) ?? '';
    for (const m of virtio.matchAll(/^(\/machine\/\S+)\s/gm)) {
      await hmp(`info virtio-status ${m[1]}`);
      const queues = Number(/num_vqs:\s+(\d+)/.exec(out[out.length - 1])?.[1] ?? 0);
      for (let q = 0; q < queues; q++) await hmp(`info virtio-queue-status ${m[1]} ${q}`);
    }
    try {
      const log = readFileSync(join(this.dir, 'qemu.log'), 'utf8').trimEnd().split('\n').slice(-60).join('\n');
      out.push(`## qemu.log (last 60 lines)\n${log}`);
    } catch {
      // no log
    }
    try {
      const console = readFileSync(this.spec.consoleLog, 'utf8').trimEnd().split('\n').slice(-40).join('\n');
      out.push(`## console (last 40 lines)\n${console}`);
    } catch {
      // no console log
    }
    return out.join('\n');
  }

  /**
   * Brings a restored VM to `running`. An incoming migration of a source that was stopped (all of
   * ours: we stop before saving) ends `paused`, so this issues the `cont`.
   */
  async waitRunning(timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (let wait = 1; ; wait = Math.min(16, wait * 2)) {
      const s = await this.status();
      if (s === 'running') return;
      if (s === 'paused' || s === 'postmigrate') { await this.cont(); continue; }
      if (s !== 'inmigrate' && s !== 'paused' && s !== 'prelaunch') throw new Error(`VM status ${s}`);
      if (Date.now() > deadline) throw new Error(`VM did not start running (status ${s})`);
      await sleep(wait);
    }
  }

  /** Stops the VMM: QMP quit, then SIGKILL if it lingers. Idempotent. */
  async kill(graceMs = 2000): Promise<void> {
    this.incoming?.destroy();
    if (this.alive) {
      try { await this.qmp.execute('quit', undefined, 1000); } catch { /* already going */ }
      const exited = await this.waitExit(graceMs);
      if (!exited) {
        try { process.kill(this.pid, 'SIGKILL'); } catch { /* gone */ }
        await this.waitExit(5000);
      }
    }
    this.qmp.close();
    if (!isAlive(this.pid)) await this.release();
  }

  /** Gives back the uid and cgroup of a VMM whose process is gone. Idempotent. */
  private release(): Promise<void> {
    if (!this.confinement) return Promise.resolve();
    this.released ??= this.confinement.release().catch(() => {});
    return this.released;
  }

  waitExit(timeoutMs: number): Promise<boolean> {
    if (!this.alive) return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => resolve(!this.alive), timeoutMs);
      this.exitWaiters.push(() => { clearTimeout(t); resolve(true); });
      // Detached children are reaped by Node; a re-adopted one by its real parent (init).
      const poll = setInterval(() => { if (!isAlive(this.pid)) { clearInterval(poll); this.markExited(); } }, 20);
      this.exitWaiters.push(() => clearInterval(poll));
      setTimeout(() => clearInterval(poll), timeoutMs + 10).unref();
    });
  }

  private markExited(): void {
    if (this.exited) return;
    this.exited = true;
    this.incoming?.destroy();
    for (const w of this.exitWaiters.splice(0)) w();
    void this.release();
  }

  /**
   * A socket for this QEMU to connect to (outgoing migrations): created by the server in the VMM's
   * root-owned directory, mode 0600, owned by the VMM's uid so that it alone may connect.
   */
  private async listenForQemu(sockPath: string, onConnection: (s: Socket) => void): Promise<Server> {
    rmSync(sockPath, { force: true });
    const server: Server = createServer(onConnection);
    await new Promise<void>((resolve, reject) => { server.once('error', reject); server.listen(sockPath, () => resolve()); });
    chmodSync(sockPath, 0o600);
    const uid = this.confinement?.uid;
    if (uid !== undefined) lchownSync(sockPath, uid, uid);
    return server;
  }

  private async migrateToFile(path: string, sockPath: string): Promise<void> {
    const out = createWriteStream(path);
    const server = await this.listenForQemu(sockPath, (sock: Socket) => { sock.pipe(out); });
    try {
      const done = this.waitMigration(60_000);
      const written = new Promise<void>((resolve, reject) => { out.once('finish', () => resolve()); out.once('error', reject); });
      await this.qmp.execute('migrate', { uri: `unix:${sockPath}` });
      await done;
      await written;
    } finally {
      server.close();
      rmSync(sockPath, { force: true });
    }
  }
}

/** Listens on `path` (root, 0600): created under a temporary name, then renamed into place. */
async function listenPrivate(path: string): Promise<Server> {
  // The temporary name also keeps libuv from unlinking `path` when our handle closes.
  const tmp = `${path}.${randomBytes(3).toString('hex')}`;
  const server = createServer((s) => s.destroy());
  await new Promise<void>((resolve, reject) => { server.once('error', reject); server.listen(tmp, () => resolve()); });
  chmodSync(tmp, 0o600);
  renameSync(tmp, path);
  return server;
}

/** The descriptor of a listening server (libuv exposes it on Unix). */
function serverFd(server: Server): number {
  const fd = (server as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) throw new Error('cannot get the descriptor of a listening socket');
  return fd;
}

export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A zombie is dead for our purposes.
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

/** Clock ticks per second of /proc's CPU times (USER_HZ: 100 on every Linux this runs on). */
const USER_HZ = 100;

/** A process's CPU time so far (user + system, seconds) and resident memory (bytes), from /proc; undefined once it is gone. */
export function processUsage(pid: number): { cpuSecs: number; rssBytes: number } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const rssKib = Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? 0);
    return { cpuSecs: (Number(fields[11]) + Number(fields[12])) / USER_HZ, rssBytes: rssKib * 1024 };
  } catch {
    return undefined;
  }
}

export function procStartTicks(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

function tail(path: string): string {
  try {
    return readFileSync(path, 'utf8').trim().split('\n').slice(-10).join('\n');
  } catch {
    return '(no log)';
  }
}
