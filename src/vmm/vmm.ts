import { spawn } from 'node:child_process';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { existsSync, openSync, closeSync, readFileSync, rmSync, createWriteStream } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { QmpClient } from './qmp.js';
import { qemuArgv, type VmSpec } from './argv.js';

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

  private constructor(
    readonly pid: number,
    readonly spec: VmSpec,
    public qmp: QmpClient,
    /** process start time (clock ticks since boot, /proc/<pid>/stat field 22): a pid is only ours if it matches */
    readonly startTicks: string,
  ) {}

  static async spawn(spec: VmSpec, opts: { logPath: string; startPaused?: boolean; qmpTimeoutMs?: number }): Promise<Vmm> {
    const argv = qemuArgv(spec);
    if (opts.startPaused) argv.push('-S');
    for (const s of [spec.qmpSocket, spec.agentSocket]) rmSync(s, { force: true });
    const logFd = openSync(opts.logPath, 'a');
    const child = spawn(argv[0], argv.slice(1), { detached: true, stdio: ['ignore', logFd, logFd] });
    closeSync(logFd);
    child.unref();
    const pid = child.pid;
    if (pid === undefined) throw new Error('QEMU failed to spawn');
    let exitInfo: string | undefined;
    child.once('exit', (code, sig) => { exitInfo = `exited with ${code ?? sig}`; });
    const deadline = Date.now() + (opts.qmpTimeoutMs ?? 10_000);
    let qmp: QmpClient | undefined;
    while (!qmp) {
      if (exitInfo) throw new Error(`QEMU ${exitInfo}: ${tail(opts.logPath)}`);
      if (Date.now() > deadline) {
        try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
        throw new Error(`QEMU QMP socket did not come up: ${tail(opts.logPath)}`);
      }
      if (existsSync(spec.qmpSocket)) {
        try { qmp = await QmpClient.connect(spec.qmpSocket, 5000); } catch { await sleep(2); }
      } else await sleep(2);
    }
    const vmm = new Vmm(pid, spec, qmp, procStartTicks(pid) ?? '');
    child.once('exit', () => vmm.markExited());
    qmp.once('closed', () => { if (!isAlive(pid)) vmm.markExited(); });
    return vmm;
  }

  /** Re-attaches to a QEMU left running by an earlier server process. Null if it is not ours any more. */
  static async adopt(pid: number, startTicks: string, spec: VmSpec): Promise<Vmm | null> {
    if (!isAlive(pid) || procStartTicks(pid) !== startTicks) return null;
    let qmp: QmpClient;
    try { qmp = await QmpClient.connect(spec.qmpSocket, 3000); } catch { return null; }
    const vmm = new Vmm(pid, spec, qmp, startTicks);
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
  async migrateTo(destUri: string, timeoutMs = 120_000): Promise<void> {
    await this.qmp.execute('stop');
    await this.qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: false }, { capability: 'events', state: true }] });
    // The default bandwidth cap (~32 MiB/s) would make a fork take seconds; this is a local copy.
    await this.qmp.execute('migrate-set-parameters', { 'max-bandwidth': 64 * 1024 * 1024 * 1024 });
    const done = this.waitMigration(timeoutMs);
    await this.qmp.execute('migrate', { uri: destUri });
    await done;
  }

  /** Restores device state into a VMM started with `-incoming defer` whose RAM file already holds the memory. */
  async restoreDeviceState(state: Buffer, sockPath: string, timeoutMs = 30_000): Promise<void> {
    await this.qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: true }, { capability: 'events', state: true }] });
    rmSync(sockPath, { force: true });
    const done = this.waitMigration(timeoutMs);
    await this.qmp.execute('migrate-incoming', { uri: `unix:${sockPath}` });
    await writeToUnix(sockPath, state);
    await done;
  }

  /** Prepares this VMM (started with -incoming defer) to receive a full live migration on `sockPath`. */
  async listenIncoming(sockPath: string, ignoreShared: boolean): Promise<void> {
    await this.qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: ignoreShared }, { capability: 'events', state: true }] });
    rmSync(sockPath, { force: true });
    await this.qmp.execute('migrate-incoming', { uri: `unix:${sockPath}` });
    const deadline = Date.now() + 5000;
    while (!existsSync(sockPath)) {
      if (Date.now() > deadline) throw new Error('incoming migration socket did not appear');
      await sleep(1);
    }
  }

  waitMigration(timeoutMs: number): Promise<void> {
    return this.qmp.waitEvent('MIGRATION', timeoutMs, (e) => ['completed', 'failed', 'cancelled'].includes(String(e.data?.status))).then((e) => {
      if (e.data?.status !== 'completed') throw new Error(`migration ${e.data?.status}`);
    });
  }

  async cont(): Promise<void> {
    await this.qmp.execute('cont');
  }

  /**
   * Brings a restored VM to `running`. An incoming migration of a source that was stopped (all of
   * ours: we stop before saving) ends `paused`, so this issues the `cont`.
   */
  async waitRunning(timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const s = await this.status();
      if (s === 'running') return;
      if (s === 'paused' || s === 'postmigrate') { await this.cont(); continue; }
      if (s !== 'inmigrate' && s !== 'paused' && s !== 'prelaunch') throw new Error(`VM status ${s}`);
      if (Date.now() > deadline) throw new Error(`VM did not start running (status ${s})`);
      await sleep(1);
    }
  }

  /** Stops the VMM: QMP quit, then SIGKILL if it lingers. Idempotent. */
  async kill(graceMs = 2000): Promise<void> {
    if (!this.alive) { this.qmp.close(); return; }
    try { await this.qmp.execute('quit', undefined, 1000); } catch { /* already going */ }
    const exited = await this.waitExit(graceMs);
    if (!exited) {
      try { process.kill(this.pid, 'SIGKILL'); } catch { /* gone */ }
      await this.waitExit(5000);
    }
    this.qmp.close();
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
    for (const w of this.exitWaiters.splice(0)) w();
  }

  private async migrateToFile(path: string, sockPath: string): Promise<void> {
    rmSync(sockPath, { force: true });
    const out = createWriteStream(path);
    const server: Server = createServer((sock: Socket) => { sock.pipe(out); });
    await new Promise<void>((resolve, reject) => { server.once('error', reject); server.listen(sockPath, () => resolve()); });
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

function writeToUnix(path: string, data: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    const attempt = (left: number) => {
      const s = connect(path);
      s.once('error', (e) => {
        s.destroy();
        if (left > 0) setTimeout(() => attempt(left - 1), 1);
        else reject(e);
      });
      s.once('connect', () => { s.end(data, () => resolve()); });
    };
    attempt(2000);
  });
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
