/**
 * An in-memory SandboxService for API tests. It honours the contract of src/sandboxes/types.ts and the
 * lifecycle of spec/sandbox-lifecycle.txt: exec/suspend need running, fork running or suspended, resume suspended,
 * unknown, deleted and other tenants' ids are sandbox_not_found. Execs are serialized per sandbox.
 *
 * Exec understands a tiny shell: `echo WORDS`, `printf-bytes HEX` (raw bytes), `exit N`, `sleep SECS`,
 * `cat` (echoes stdin), `stderr WORDS`, `cat FILE`; `code` is echoed back; `commands` run in order.
 *
 * Networking: templates have an egress policy (`templateEgress`, default "allow"), a create takes
 * the policy its caller decided (the tenant service narrows it), forks inherit it. `listen(id, ports)` sets what openPorts reports, and
 * portTarget points at 127.0.0.1 — at `portMap.get(port)` when mapped, else the same port number —
 * so a test reaches real servers it started itself through the proxy.
 */
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { CollimateError, invalidState, sandboxNotFound } from '../../src/errors.js';
import { execSeed } from '../../src/sandboxes/exec.js';
import type { EgressPolicy } from '../../src/net/policy.js';
import { ProcessRegistry } from '../../src/sandboxes/processes.js';
import { buildProcStart, checkPid, checkSize, checkWaitSecs, processError, processNotFound, signalNumber, STDIN_CHUNK_BYTES } from '../../src/sandboxes/processOps.js';
import { FakeProcessAgent } from './fakeProcessAgent.js';
import { requestHostOf } from '../../src/sandboxes/portHost.js';
import type {
  CreateOptions,
  ExecRequest,
  ExecResult,
  ExecStreamHandlers,
  ForkOptions,
  SnapshotInfo,
  SnapshotListFilter,
  SnapshotOptions,
  StartFromSnapshotOptions,
  ListFilter,
  OnTimeout,
  SuspendOptions,
  OpenPort,
  PortTarget,
  ProcessEvent,
  ProcessInfo,
  ProcessStartRequest,
  SandboxInfo,
  SandboxService,
  SandboxState,
  Scope,
  TemplateInfo,
  DirListing,
  DirWatch,
  FileChangeOp,
  FileEntry,
  MkdirOptions,
  FileSink,
  GuestDiskUsage,
  UploadOptions,
  WatchEndReason,
  WatchHandlers,
} from '../../src/sandboxes/types.js';
import { forkCountProblem } from '../../src/sandboxes/types.js';
import { absoluteGuestPath, checkFsPath } from '../../src/sandboxes/files.js';

/** What a fake sandbox's root file system holds before anything is written to it. */
export const FAKE_SYSTEM_DISK_BYTES = 300 * 1024 * 1024;

interface Box {
  id: string;
  tenant: string;
  template: string;
  state: SandboxState;
  labels: Record<string, string>;
  createdMs: number;
  lastActiveMs: number;
  execCount: number;
  parent: string | null;
  forkedMs: number | null;
  children: string[];
  timeoutSecs: number;
  /** The current session: from create, fork or resume to its end (timeoutSecs later, or a lease's). */
  sessionStartMs: number;
  sessionEndMs: number;
  vcpus: number;
  memoryMib: number;
  diskMib: number;
  files: Map<string, Buffer>;
  /** Directories made by fsMkdir (parents of files exist implicitly), with their modes; file modes. */
  dirs: Map<string, number>;
  modes: Map<string, number>;
  watchers: Set<FakeWatch>;
  queue: Promise<unknown>;
  egress: EgressPolicy;
  fromSnapshot?: string;
  onTimeout: OnTimeout;
  autoResume: boolean;
  keepMemory: boolean;
  /** While suspended: whether that suspend kept the memory. */
  memoryKept: boolean | null;
  publicPorts: boolean;
  portHost: string | null;
  ports: number[];
  /** Its guest's background processes (fakeProcessAgent.ts). */
  agent: FakeProcessAgent;
}

type TemplateBase = Omit<TemplateInfo, 'egress' | 'network'>;

interface FakeWatch {
  root: string;
  recursive: boolean;
  handlers: WatchHandlers;
}

export const CATALOG: TemplateBase[] = [
  { id: 'base', kind: 'catalog', description: 'Debian base', interpreter: ['/bin/sh', '-c'], ready: true, vcpus: 1, memory_mib: 256 },
  { id: 'python', kind: 'catalog', description: 'Python 3', interpreter: ['python3', '-c'], ready: true, vcpus: 1, memory_mib: 512 },
  { id: 'node', kind: 'catalog', description: 'Node.js', interpreter: ['node', '-e'], ready: true, vcpus: 2, memory_mib: 512 },
];

export interface FakeOptions {
  /** Milliseconds each create/fork/resume/suspend takes (default 1; uses timers, so calls interleave). */
  opDelayMs?: number;
  /** Environments (non-catalog templates) per tenant. */
  environments?: Record<string, TemplateBase[]>;
  now?: () => number;
  /** Emit `transition` events like the engine ({id, tenant, state, op, snapshotBytes?}), and `snapshotDeleted` ({id, tenant}). */
  events?: boolean;
  /** Egress policy per template id (default "allow"). */
  templateEgress?: Record<string, EgressPolicy>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const iso = (ms: number) => new Date(ms).toISOString();

export class FakeSandboxService extends EventEmitter implements SandboxService {
  readonly accel = 'tcg' as const;
  ready = true;
  private readonly boxes = new Map<string, Box>();
  /** The host's view of every box's background processes, as the engine keeps it. */
  readonly processes = new ProcessRegistry();
  private readonly opDelayMs: number;
  private readonly environments: Record<string, TemplateBase[]>;
  private readonly now: () => number;
  /** Make the next N creates fail with vmm_failed (to test slot release). */
  failCreates = 0;
  /** Calls seen, for assertions. */
  readonly calls: string[] = [];
  closed = false;

  private readonly events: boolean;
  private readonly templateEgress: Record<string, EgressPolicy>;
  /** Sandbox port → the local port portTarget answers (unmapped ports answer themselves). */
  readonly portMap = new Map<number, number>();
  /** Make portTarget throw network_unavailable, like an engine without networking. */
  networkUnavailable = false;
  /** Blocked ranges the operator opened to tenants' policies (COLLIMATE_EGRESS_OPEN_CIDRS). */
  openCidrs: string[] = [];
  /** Sandbox ids and ports portTarget was asked for, for assertions. */
  readonly portCalls: Array<{ id: string; port: number; tenant?: string }> = [];

  constructor(opts: FakeOptions = {}) {
    super();
    this.events = opts.events ?? false;
    this.templateEgress = opts.templateEgress ?? {};
    this.opDelayMs = opts.opDelayMs ?? 1;
    this.environments = opts.environments ?? {};
    this.now = opts.now ?? Date.now;
  }

  isReady(): boolean {
    return this.ready;
  }

  async close(): Promise<void> {
    this.closed = true;
  }

  poolSizes(): Record<string, number> {
    return Object.fromEntries(CATALOG.map((t) => [t.id, 2]));
  }

  templates(scope?: Scope): TemplateInfo[] {
    const envs = scope ? this.environments[scope.tenant] ?? [] : Object.values(this.environments).flat();
    return [...CATALOG, ...envs].map((t) => ({ ...t, interpreter: [...t.interpreter], egress: this.templateEgress[t.id] ?? 'allow', network: true }));
  }

  template(id: string, scope?: Scope): TemplateInfo {
    const t = this.templates(scope).find((x) => x.id === id);
    if (!t) throw new CollimateError('template_not_found', `No template ${id}. List them with GET /v1/templates.`);
    return t;
  }

  async create(opts: CreateOptions, scope: Scope): Promise<SandboxInfo> {
    this.calls.push('create');
    const tpl = this.template(opts.template, scope);
    await sleep(this.opDelayMs);
    if (this.failCreates > 0) {
      this.failCreates--;
      throw new CollimateError('vmm_failed', 'The VMM failed to start; retry.');
    }
    const box = this.newBox(scope.tenant, tpl, opts.labels ?? {}, opts.timeoutSecs ?? 3600, null);
    // The egress was decided by the caller (the tenant service narrows it); absent: the template's.
    box.egress = opts.egress ?? tpl.egress;
    box.onTimeout = opts.onTimeout ?? 'delete';
    box.autoResume = opts.autoResume === true;
    box.keepMemory = opts.keepMemory !== false;
    box.publicPorts = opts.publicPorts === true;
    box.portHost = opts.portHost ?? null;
    this.transition(box, 'create');
    return this.info(box);
  }

  get(id: string, scope?: Scope): SandboxInfo {
    return this.info(this.find(id, scope));
  }

  list(filter: ListFilter, scope?: Scope): { sandboxes: SandboxInfo[]; next: string | null } {
    const limit = filter.limit ?? 100;
    const all = [...this.boxes.values()]
      .filter((b) => (!scope || b.tenant === scope.tenant) && b.state !== 'deleted')
      .filter((b) => !filter.state || b.state === filter.state)
      .filter((b) => Object.entries(filter.labels ?? {}).every(([k, v]) => b.labels[k] === v))
      .filter((b) => !filter.after || b.id > filter.after)
      .sort((a, b) => (a.id < b.id ? -1 : 1));
    const page = all.slice(0, limit);
    return { sandboxes: page.map((b) => this.info(b)), next: all.length > limit ? page[page.length - 1].id : null };
  }

  async exec(id: string, req: ExecRequest, scope?: Scope, stream?: ExecStreamHandlers): Promise<ExecResult> {
    this.calls.push('exec');
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, 'exec', ['running']);
    const queuedMs = this.now();
    const run = box.queue.then(async () => {
      const startedMs = this.now();
      for (const f of req.files ?? []) box.files.set(f.path, Buffer.from(f.content, f.encoding === 'base64' ? 'base64' : 'utf8'));
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      const emitOut = (b: Buffer) => (out.push(b), stream?.onStdout?.(b));
      const emitErr = (b: Buffer) => (err.push(b), stream?.onStderr?.(b));
      let exit = 0;
      let failedIndex: number | undefined;
      let timedOut = false;
      const argvs = req.commands ?? (req.command !== undefined ? [['sh', '-c', req.command]] : [['code', req.code ?? '']]);
      for (let i = 0; i < argvs.length; i++) {
        const argv = argvs[i];
        if (argv[0] === 'code') {
          emitOut(Buffer.from(argv[1]));
        } else {
          const line = argv[0] === 'sh' && argv[1] === '-c' ? argv[2] : argv.join(' ');
          const [cmd, ...rest] = line.trim().split(/\s+/);
          const arg = rest.join(' ');
          if (cmd === 'echo') emitOut(Buffer.from(arg + '\n'));
          else if (cmd === 'stderr') emitErr(Buffer.from(arg + '\n'));
          else if (cmd === 'printf-bytes') emitOut(Buffer.from(arg, 'hex'));
          else if (cmd === 'exit') exit = Number(arg) || 0;
          else if (cmd === 'cat' && arg) {
            const f = box.files.get(arg);
            if (f) emitOut(f);
            else (emitErr(Buffer.from(`cat: ${arg}: No such file or directory\n`)), (exit = 1));
          } else if (cmd === 'cat') emitOut(Buffer.from(req.stdin ?? ''));
          else if (cmd === 'sleep') {
            const ms = Number(arg) * 1000;
            const limit = (req.timeout ?? 60) * 1000;
            await sleep(Math.min(ms, limit));
            if (ms > limit) (timedOut = true), (exit = 124);
          } else if (cmd === 'true' || cmd === '') exit = 0;
          else (emitErr(Buffer.from(`sh: ${cmd}: not found\n`)), (exit = 127));
        }
        if (req.commands) failedIndex = i;
        if (exit !== 0 || timedOut) break;
      }
      box.execCount++;
      const finishedMs = this.now();
      box.lastActiveMs = finishedMs;
      const enc = (bufs: Buffer[]) => {
        const b = Buffer.concat(bufs);
        const s = b.toString('utf8');
        return Buffer.from(s, 'utf8').equals(b) ? { text: s, encoding: 'utf8' as const } : { text: b.toString('base64'), encoding: 'base64' as const };
      };
      const o = enc(out);
      const e = enc(err);
      const r: ExecResult = {
        stdout: o.text,
        stderr: e.text,
        stdout_encoding: o.encoding,
        stderr_encoding: e.encoding,
        exit_code: exit,
        timed_out: timedOut,
        stdout_truncated: false,
        stderr_truncated: false,
        // Like the engine: the caller's seed echoed, or a fresh one.
        seed: execSeed(req.seed).toString(),
        timing: {
          queued_at: iso(queuedMs),
          started_at: iso(startedMs),
          finished_at: iso(finishedMs),
          queued_ms: startedMs - queuedMs,
          run_ms: finishedMs - startedMs,
        },
      };
      if (req.commands) r.failed_index = failedIndex;
      return r;
    });
    box.queue = run.catch(() => undefined);
    return run;
  }

  async fork(id: string, opts: ForkOptions, scope?: Scope): Promise<SandboxInfo[]> {
    this.calls.push('fork');
    const parent = this.find(id, scope);
    // A running parent keeps running, a suspended one stays suspended: its children run either way.
    if (parent.state !== 'running' && parent.state !== 'suspended') throw invalidState(id, parent.state, 'fork', ['running', 'suspended']);
    const countProblem = forkCountProblem(opts.count);
    if (countProblem) throw new CollimateError('validation_error', countProblem);
    await sleep(this.opDelayMs);
    const tpl = CATALOG.find((t) => t.id === parent.template) ?? this.template(parent.template, { tenant: parent.tenant });
    const children: SandboxInfo[] = [];
    for (let i = 0; i < opts.count; i++) {
      const child = this.newBox(parent.tenant, tpl, { ...parent.labels, ...(opts.labels ?? {}) }, parent.timeoutSecs, parent.id);
      child.files = new Map(parent.files);
      child.dirs = new Map(parent.dirs);
      child.modes = new Map(parent.modes);
      child.egress = parent.egress;
      child.onTimeout = parent.onTimeout;
      child.autoResume = parent.autoResume;
      child.keepMemory = parent.keepMemory;
      child.publicPorts = parent.publicPorts;
      child.portHost = parent.portHost;
      parent.children.push(child.id);
      this.transition(child, 'fork');
      children.push(this.info(child));
    }
    return children;
  }

  /** Snapshots: a copy of the box's files and shape at that moment. */
  private readonly snaps = new Map<string, { info: SnapshotInfo; box: Box }>();

  async createSnapshot(id: string, opts: SnapshotOptions, scope?: Scope): Promise<SnapshotInfo> {
    this.calls.push('createSnapshot');
    const box = this.find(id, scope);
    if (box.state !== 'running' && box.state !== 'suspended') throw invalidState(id, box.state, 'snapshot', ['running', 'suspended']);
    await sleep(this.opDelayMs);
    const snapId = 'snap_' + randomBytes(8).toString('hex');
    const info: SnapshotInfo = {
      id: snapId, name: opts.name ?? null, tenant: box.tenant, labels: { ...(opts.labels ?? {}) }, sandbox_id: box.id, template: box.template,
      created_at: iso(this.now()), size_bytes: box.memoryMib * 1024 * 1024, vcpus: box.vcpus, memory_mib: box.memoryMib, disk_mib: box.diskMib, egress: box.egress,
      environment: null,
    };
    this.snaps.set(snapId, { info, box: { ...box, files: new Map(box.files), dirs: new Map(box.dirs), modes: new Map(box.modes) } });
    return info;
  }

  private snap(id: string, scope?: Scope): { info: SnapshotInfo; box: Box } {
    const s = this.snaps.get(id);
    if (!s || (scope && s.info.tenant !== scope.tenant)) throw new CollimateError('snapshot_not_found', `No snapshot with id ${id}.`);
    return s;
  }

  getSnapshot(id: string, scope?: Scope): SnapshotInfo {
    return this.snap(id, scope).info;
  }

  listSnapshots(filter: SnapshotListFilter, scope?: Scope): { snapshots: SnapshotInfo[]; next: string | null } {
    const limit = filter.limit ?? 100;
    const all = [...this.snaps.values()].map((s) => s.info)
      .filter((s) => (!scope || s.tenant === scope.tenant) && (!filter.sandboxId || s.sandbox_id === filter.sandboxId) && (!filter.after || s.id > filter.after)
        && (filter.environment === undefined || (filter.environment === true ? s.environment !== null : s.environment === filter.environment))
        && Object.entries(filter.labels ?? {}).every(([k, v]) => s.labels[k] === v))
      .sort((a, b) => (a.id < b.id ? -1 : 1));
    const page = all.slice(0, limit);
    return { snapshots: page, next: all.length > limit ? page[page.length - 1].id : null };
  }

  promoteSnapshot(id: string, environment: string | null, scope?: Scope): SnapshotInfo {
    this.calls.push('promoteSnapshot');
    const s = this.snap(id, scope);
    if (environment !== null && [...this.snaps.values()].some((o) => o !== s && o.info.tenant === s.info.tenant && o.info.environment === environment)) {
      throw new CollimateError('conflict', `Another snapshot is promoted as ${environment}.`);
    }
    s.info = { ...s.info, environment };
    return s.info;
  }

  deleteSnapshot(id: string, scope?: Scope): void {
    this.calls.push('deleteSnapshot');
    const s = this.snap(id, scope);
    this.snaps.delete(id);
    if (this.events) this.emit('snapshotDeleted', { id, tenant: s.info.tenant });
  }

  async startFromSnapshot(id: string, opts: StartFromSnapshotOptions, scope: Scope): Promise<SandboxInfo[]> {
    this.calls.push('startFromSnapshot');
    const s = this.snap(id, scope);
    const countProblem = forkCountProblem(opts.count);
    if (countProblem) throw new CollimateError('validation_error', countProblem);
    await sleep(this.opDelayMs);
    const tpl = CATALOG.find((t) => t.id === s.box.template) ?? this.template(s.box.template, { tenant: s.box.tenant });
    const out: SandboxInfo[] = [];
    for (let i = 0; i < opts.count; i++) {
      const b = this.newBox(s.box.tenant, tpl, { ...(opts.labels ?? {}) }, opts.timeoutSecs ?? s.box.timeoutSecs, null);
      b.files = new Map(s.box.files);
      b.dirs = new Map(s.box.dirs);
      b.modes = new Map(s.box.modes);
      b.egress = opts.egress ?? s.box.egress;
      b.onTimeout = opts.onTimeout ?? s.box.onTimeout;
      b.autoResume = opts.autoResume ?? s.box.autoResume;
      b.keepMemory = opts.keepMemory ?? s.box.keepMemory;
      b.publicPorts = opts.publicPorts ?? s.box.publicPorts;
      b.portHost = opts.portHost === undefined ? s.box.portHost : opts.portHost;
      b.fromSnapshot = id;
      this.transition(b, 'fork');
      out.push(this.info(b));
    }
    return out;
  }

  async restore(id: string, snapshotId: string, scope?: Scope): Promise<SandboxInfo> {
    this.calls.push('restore');
    const box = this.find(id, scope);
    const s = this.snap(snapshotId, scope);
    if (s.info.sandbox_id !== id) throw new CollimateError('snapshot_mismatch', `Snapshot ${snapshotId} was taken of sandbox ${s.info.sandbox_id}, not ${id}.`);
    if (box.state !== 'running' && box.state !== 'suspended') throw invalidState(id, box.state, 'restore', ['running', 'suspended']);
    await sleep(this.opDelayMs);
    box.files = new Map(s.box.files);
    box.dirs = new Map(s.box.dirs);
    box.modes = new Map(s.box.modes);
    box.fromSnapshot = snapshotId;
    this.transition(box, 'restore');
    return this.info(box);
  }

  async suspend(id: string, scope?: Scope, opts: SuspendOptions = {}): Promise<SandboxInfo> {
    this.calls.push('suspend');
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, 'suspend', ['running']);
    await sleep(this.opDelayMs);
    box.state = 'suspended';
    box.memoryKept = opts.keepMemory ?? box.keepMemory;
    this.endWatches(box, 'sandbox_suspended');
    this.transition(box, 'suspend', box.memoryKept ? box.memoryMib * 1024 * 1024 : 0);
    return this.info(box);
  }

  async resume(id: string, scope?: Scope): Promise<SandboxInfo> {
    this.calls.push('resume');
    const box = this.find(id, scope);
    if (box.state !== 'suspended') throw invalidState(id, box.state, 'resume', ['suspended']);
    await sleep(this.opDelayMs);
    box.state = 'running';
    box.memoryKept = null;
    box.sessionStartMs = this.now();
    box.sessionEndMs = box.sessionStartMs + box.timeoutSecs * 1000;
    this.transition(box, 'resume');
    return this.info(box);
  }

  async delete(id: string, scope?: Scope): Promise<void> {
    this.calls.push('delete');
    const box = this.find(id, scope);
    box.state = 'deleted';
    this.endWatches(box, 'sandbox_deleted');
    this.boxes.delete(id);
    this.transition(box, 'delete');
  }

  async readFile(id: string, path: string, scope?: Scope): Promise<Buffer> {
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, 'read a file', ['running']);
    const f = box.files.get(path);
    if (!f) throw new CollimateError('file_not_found', `No file ${path} in sandbox ${id}.`);
    return f;
  }

  async writeFile(id: string, path: string, data: Buffer, scope?: Scope, _mode?: number): Promise<void> {
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, 'write a file', ['running']);
    box.files.set(path, Buffer.from(data));
    this.changed(box, path, 'create');
  }

  // ---- files and directories: a small tree over `files` and `dirs` ------------------------------
  // Paths resolve like the guest's (relative to /root). A directory exists if made, or if anything
  // lies under it; /, /root and /tmp always do.

  private fsBox(id: string, scope: Scope | undefined, what: string): Box {
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, what, ['running']);
    return box;
  }

  private isDir(box: Box, path: string): boolean {
    if (path === '/' || path === '/root' || path === '/tmp' || box.dirs.has(path)) return true;
    const prefix = `${path}/`;
    for (const k of box.files.keys()) if (k.startsWith(prefix)) return true;
    for (const k of box.dirs.keys()) if (k.startsWith(prefix)) return true;
    return false;
  }

  private entryOf(box: Box, path: string): FileEntry {
    const file = box.files.get(path);
    const isDir = file === undefined && this.isDir(box, path);
    if (file === undefined && !isDir) throw new CollimateError('file_not_found', `No file at ${path} in sandbox ${box.id}.`);
    const name = path === '/' ? '/' : path.slice(path.lastIndexOf('/') + 1);
    return {
      name, path, type: isDir ? 'dir' : 'file', size: file?.length ?? 4096,
      mode: isDir ? box.dirs.get(path) ?? 0o755 : box.modes.get(path) ?? 0o644,
      uid: 0, gid: 0, owner: 'root', group: 'root', mtimeNs: BigInt(this.now()) * 1_000_000n,
    };
  }

  /** A file somewhere above `path` makes it unreachable (the guest's ENOTDIR). */
  private fileAbove(box: Box, path: string): string | undefined {
    for (let p = path.slice(0, path.lastIndexOf('/')); p; p = p.slice(0, p.lastIndexOf('/'))) if (box.files.has(p)) return p;
    return undefined;
  }

  private resolve(box: Box, path: string, field = 'path'): string {
    const abs = absoluteGuestPath(checkFsPath(path, field)).replace(/\/+$/, '') || '/';
    const above = this.fileAbove(box, abs);
    if (above) throw new CollimateError('not_a_directory', `${above} is not a directory (sandbox ${box.id}).`);
    return abs;
  }

  private changed(box: Box, path: string, op: FileChangeOp): void {
    for (const w of box.watchers) {
      const prefix = w.root === '/' ? '/' : `${w.root}/`;
      if (!path.startsWith(prefix)) continue;
      const rel = path.slice(prefix.length);
      if (!w.recursive && rel.includes('/')) continue;
      w.handlers.onChange({ op, name: rel });
    }
  }

  private endWatches(box: Box, reason: WatchEndReason): void {
    const watchers = [...box.watchers];
    box.watchers.clear();
    for (const w of watchers) w.handlers.onEnd(reason);
  }

  async fsStat(id: string, path: string, scope?: Scope): Promise<FileEntry> {
    const box = this.fsBox(id, scope, 'reading a path');
    return this.entryOf(box, this.resolve(box, path));
  }

  async fsList(id: string, path: string, depth = 1, scope?: Scope): Promise<DirListing> {
    const box = this.fsBox(id, scope, 'listing a directory');
    const dir = this.resolve(box, path);
    if (box.files.has(dir)) throw new CollimateError('not_a_directory', `${dir} is not a directory (sandbox ${id}).`);
    if (!this.isDir(box, dir)) throw new CollimateError('file_not_found', `No file at ${dir} in sandbox ${id}.`);
    const entries: FileEntry[] = [];
    const walk = (d: string, left: number) => {
      const prefix = d === '/' ? '/' : `${d}/`;
      const names = new Set<string>();
      for (const k of [...box.files.keys(), ...box.dirs.keys()]) if (k.startsWith(prefix) && k.length > prefix.length) names.add(k.slice(prefix.length).split('/')[0]);
      for (const name of [...names].sort()) {
        const entry = this.entryOf(box, prefix + name);
        entries.push(entry);
        if (entry.type === 'dir' && left > 1) walk(entry.path, left - 1);
      }
    };
    walk(dir, depth);
    return { entries, truncated: false };
  }

  async fsMkdir(id: string, path: string, opts: MkdirOptions = {}, scope?: Scope): Promise<{ created: boolean; entry: FileEntry }> {
    const mode = opts.mode;
    const box = this.fsBox(id, scope, 'making a directory');
    const dir = this.resolve(box, path);
    if (box.files.has(dir)) throw new CollimateError('file_exists', `${dir} exists and is not a directory (sandbox ${id}).`);
    if (this.isDir(box, dir)) return { created: false, entry: this.entryOf(box, dir) };
    for (let p = dir; p && !this.isDir(box, p); p = p.slice(0, p.lastIndexOf('/'))) box.dirs.set(p, mode ?? 0o755);
    this.changed(box, dir, 'create');
    return { created: true, entry: this.entryOf(box, dir) };
  }

  async fsRemove(id: string, path: string, scope?: Scope): Promise<{ removed: number }> {
    const box = this.fsBox(id, scope, 'removing a path');
    const target = this.resolve(box, path);
    if (target === '/') throw new CollimateError('validation_error', 'Refusing to remove /.');
    if (box.files.delete(target)) {
      box.modes.delete(target);
      this.changed(box, target, 'remove');
      return { removed: 1 };
    }
    if (!this.isDir(box, target)) throw new CollimateError('file_not_found', `No file at ${target} in sandbox ${id}.`);
    let removed = 1;
    const prefix = `${target}/`;
    for (const k of [...box.files.keys()]) if (k.startsWith(prefix)) { box.files.delete(k); removed++; }
    for (const k of [...box.dirs.keys()]) if (k.startsWith(prefix)) { box.dirs.delete(k); removed++; }
    box.dirs.delete(target);
    this.changed(box, target, 'remove');
    return { removed };
  }

  async fsRename(id: string, from: string, to: string, scope?: Scope): Promise<FileEntry> {
    const box = this.fsBox(id, scope, 'renaming a path');
    const src = this.resolve(box, from, 'from');
    const dst = this.resolve(box, to, 'to');
    const parent = dst.slice(0, dst.lastIndexOf('/')) || '/';
    if (!box.files.has(src) && !this.isDir(box, src)) throw new CollimateError('file_not_found', `No file at ${src} in sandbox ${id}.`);
    if (!this.isDir(box, parent)) throw new CollimateError('file_not_found', `No file at ${dst} in sandbox ${id} (the destination's directory).`);
    const file = box.files.get(src);
    if (file !== undefined) {
      if (this.isDir(box, dst)) throw new CollimateError('is_a_directory', `${dst} is a directory (sandbox ${id}).`);
      box.files.delete(src);
      box.files.set(dst, file);
      box.modes.set(dst, box.modes.get(src) ?? 0o644);
      box.modes.delete(src);
    } else {
      const prefix = `${src}/`;
      for (const [k, v] of [...box.files]) if (k.startsWith(prefix)) { box.files.delete(k); box.files.set(dst + k.slice(src.length), v); }
      for (const [k, v] of [...box.dirs]) if (k === src || k.startsWith(prefix)) { box.dirs.delete(k); box.dirs.set(dst + k.slice(src.length), v); }
      if (!box.dirs.has(dst)) box.dirs.set(dst, 0o755);
    }
    this.changed(box, src, 'rename');
    this.changed(box, dst, 'create');
    return this.entryOf(box, dst);
  }

  async fsWatch(id: string, path: string, recursive: boolean, handlers: WatchHandlers, scope?: Scope): Promise<DirWatch> {
    const box = this.fsBox(id, scope, 'watching a directory');
    const root = this.resolve(box, path);
    if (box.files.has(root)) throw new CollimateError('not_a_directory', `${root} is not a directory (sandbox ${id}).`);
    if (!this.isDir(box, root)) throw new CollimateError('file_not_found', `No file at ${root} in sandbox ${id}.`);
    const watch: FakeWatch = { root, recursive, handlers };
    box.watchers.add(watch);
    return { close: async () => void box.watchers.delete(watch) };
  }

  async downloadFile(id: string, path: string, sink: FileSink, scope?: Scope): Promise<{ size: number }> {
    const box = this.fsBox(id, scope, 'reading a file');
    const abs = this.resolve(box, path);
    const data = box.files.get(abs);
    if (data === undefined) {
      if (this.isDir(box, abs)) throw new CollimateError('validation_error', `${abs} in sandbox ${id} is not a regular file.`);
      throw new CollimateError('file_not_found', `No file at ${abs} in sandbox ${id}.`);
    }
    await sink.start?.({ size: data.length, mode: box.modes.get(abs) ?? 0o644 });
    for (let off = 0; off < data.length; off += 64 * 1024) await sink.chunk(data.subarray(off, off + 64 * 1024));
    return { size: data.length };
  }

  async uploadFile(id: string, path: string, source: AsyncIterable<Buffer | Uint8Array | string>, opts: UploadOptions = {}, scope?: Scope): Promise<FileEntry & { bytes: number }> {
    const box = this.fsBox(id, scope, 'writing a file');
    const abs = this.resolve(box, path);
    const max = opts.maxBytes ?? Number.MAX_SAFE_INTEGER;
    const parts: Buffer[] = [];
    let bytes = 0;
    try {
      for await (const part of source) {
        const buf = Buffer.from(part as Uint8Array);
        bytes += buf.length;
        if (bytes > max) throw new CollimateError('payload_too_large', `the upload to ${abs} is over the ${max}-byte limit`);
        parts.push(buf);
      }
    } catch (e) {
      if (e instanceof CollimateError) throw e;
      throw new CollimateError('validation_error', `The upload to ${abs} did not arrive whole (${(e as Error).message}); nothing was written.`);
    }
    if (this.isDir(box, abs)) throw new CollimateError('is_a_directory', `${abs} is a directory (sandbox ${id}).`);
    const existed = box.files.has(abs);
    box.files.set(abs, Buffer.concat(parts, bytes));
    box.modes.set(abs, opts.mode ?? 0o644);
    this.changed(box, abs, existed ? 'write' : 'create');
    return { ...this.entryOf(box, abs), bytes };
  }

  async openPorts(id: string, scope?: Scope): Promise<OpenPort[]> {
    const box = this.find(id, scope);
    return box.ports.map((port) => ({ port, protocol: 'tcp' as const }));
  }

  /** Ids each guestDiskUsage call asked about, for assertions. */
  readonly diskAsked: string[][] = [];
  /** Sandboxes whose guest cannot tell its disk use (an agent from before the reading). */
  readonly diskUnreadable = new Set<string>();

  /**
   * Disk use as the engine reads it in the guest: the sandbox's disk size, and a base system of
   * FAKE_SYSTEM_DISK_BYTES plus the bytes of its files. Running sandboxes only.
   */
  async guestDiskUsage(ids: readonly string[]): Promise<Map<string, GuestDiskUsage>> {
    this.diskAsked.push([...ids]);
    const out = new Map<string, GuestDiskUsage>();
    for (const id of ids) {
      const box = this.boxes.get(id);
      if (!box || box.state !== 'running' || this.diskUnreadable.has(id)) continue;
      let used = FAKE_SYSTEM_DISK_BYTES;
      for (const data of box.files.values()) used += data.length;
      out.set(id, { totalBytes: box.diskMib * 1024 * 1024, usedBytes: used });
    }
    return out;
  }

  portTarget(id: string, port: number, scope?: Scope): PortTarget {
    this.portCalls.push({ id, port, tenant: scope?.tenant });
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, 'reaching a port', ['running']);
    if (this.networkUnavailable) throw new CollimateError('network_unavailable', 'This server runs without networking, so sandbox ports cannot be reached.');
    return { host: '127.0.0.1', port: this.portMap.get(port) ?? port, publicPorts: box.publicPorts, requestHost: requestHostOf(box.portHost, port) };
  }

  /** Networking as /healthz shows it (Engine.networkStatus; `collimate serve` reports it). */
  networkStatus(): { enabled: boolean; reason?: string } {
    return this.networkUnavailable ? { enabled: false, reason: 'the fake service has networking switched off' } : { enabled: true };
  }

  egressOpened(): readonly string[] {
    return this.openCidrs;
  }

  /** Test hook: the ports servers listen on inside the sandbox (what openPorts reads). */
  listen(id: string, ports: number[]): void {
    this.find(id).ports = [...ports];
  }

  countRunning(tenant: string): number {
    let n = 0;
    for (const b of this.boxes.values()) if (b.tenant === tenant && b.state === 'running') n++;
    return n;
  }

  setSessionEnd(id: string, endsAtMs: number, scope?: Scope): SandboxInfo {
    this.calls.push('setSessionEnd');
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, 'setting its timeout', ['running']);
    box.sessionEndMs = endsAtMs;
    return this.info(box);
  }

  async setEgress(id: string, egress: EgressPolicy, scope?: Scope): Promise<SandboxInfo> {
    this.calls.push('setEgress');
    const box = this.find(id, scope);
    if (box.state !== 'running' && box.state !== 'suspended') throw invalidState(id, box.state, 'changing its egress', ['running', 'suspended']);
    box.egress = egress;
    return this.info(box);
  }

  // ---- background processes: the engine's registry over a fake agent ------------------------------

  /** Test hook: the fake agent of a box (to make its processes write or exit). */
  agentOf(id: string): FakeProcessAgent {
    return this.find(id).agent;
  }

  private running(id: string, scope: Scope | undefined, operation: string): Box {
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, operation, ['running']);
    return box;
  }

  async startProcess(id: string, req: ProcessStartRequest, scope?: Scope): Promise<ProcessInfo> {
    this.calls.push('startProcess');
    const box = this.running(id, scope, 'starting a process');
    const agentReq = buildProcStart(req);
    const run = box.queue.then(async () => {
      try {
        return this.processes.of(id).started(agentReq, await box.agent.startProcess(agentReq));
      } catch (e) {
        throw processError(id, undefined, e);
      }
    });
    box.queue = run.catch(() => undefined);
    return run;
  }

  async listProcesses(id: string, scope?: Scope): Promise<ProcessInfo[]> {
    this.find(id, scope);
    return this.processes.of(id).list();
  }

  async getProcess(id: string, pid: number, scope?: Scope): Promise<ProcessInfo> {
    this.find(id, scope);
    const info = this.processes.of(id).get(checkPid(pid));
    if (!info) throw processNotFound(id, pid);
    return info;
  }

  async watchProcessOutput(id: string, pid: number, from: 'start' | 'now' | number, listener: (e: ProcessEvent) => void, scope?: Scope): Promise<() => void> {
    await this.getProcess(id, pid, scope);
    return this.processes.of(id).subscribe(pid, from, listener);
  }

  private async liveProcess(id: string, pid: number, scope: Scope | undefined, operation: string): Promise<Box> {
    const box = this.running(id, scope, operation);
    if (!this.processes.of(id).has(checkPid(pid))) throw processNotFound(id, pid);
    return box;
  }

  async writeProcessStdin(id: string, pid: number, data: AsyncIterable<Buffer> | Buffer, scope?: Scope): Promise<number> {
    const box = await this.liveProcess(id, pid, scope, 'writing to a process');
    let written = 0;
    try {
      for await (const chunk of Buffer.isBuffer(data) ? [data] : data) {
        for (let at = 0; at < chunk.length; at += STDIN_CHUNK_BYTES) {
          const piece = chunk.subarray(at, at + STDIN_CHUNK_BYTES);
          await box.agent.processInput(pid, piece);
          written += piece.length;
        }
      }
    } catch (e) {
      throw processError(id, pid, e);
    }
    return written;
  }

  async closeProcessStdin(id: string, pid: number, scope?: Scope): Promise<void> {
    const box = await this.liveProcess(id, pid, scope, 'closing a process\'s stdin');
    try {
      await box.agent.closeProcessStdin(pid);
      this.processes.of(id).stdinClosed(pid);
    } catch (e) {
      throw processError(id, pid, e);
    }
  }

  async signalProcess(id: string, pid: number, signal: string | number, scope?: Scope): Promise<void> {
    const n = signalNumber(signal);
    const box = await this.liveProcess(id, pid, scope, 'signalling a process');
    try {
      await box.agent.signalProcess(pid, n);
    } catch (e) {
      throw processError(id, pid, e);
    }
  }

  async resizeProcess(id: string, pid: number, cols: number, rows: number, scope?: Scope): Promise<void> {
    checkSize(cols, rows);
    const box = await this.liveProcess(id, pid, scope, 'resizing a terminal');
    try {
      await box.agent.resizeProcess(pid, cols, rows);
    } catch (e) {
      throw processError(id, pid, e);
    }
  }

  async waitProcess(id: string, pid: number, timeoutSecs: number, scope?: Scope): Promise<ProcessInfo> {
    checkWaitSecs(timeoutSecs);
    await this.getProcess(id, pid, scope);
    return this.processes.of(id).wait(pid, timeoutSecs * 1000);
  }

  /** Test hook: the reaper / another front door removed a sandbox behind the API's back. */
  reap(id: string): void {
    this.boxes.delete(id);
  }

  private transition(b: Box, op: string, snapshotBytes?: number): void {
    if (this.events) this.emit('transition', { id: b.id, tenant: b.tenant, state: b.state, op, ...(snapshotBytes === undefined ? {} : { snapshotBytes }) });
  }

  private find(id: string, scope?: Scope): Box {
    const b = this.boxes.get(id);
    if (!b || b.state === 'deleted' || (scope && b.tenant !== scope.tenant)) throw sandboxNotFound(id);
    return b;
  }

  private newBox(tenant: string, tpl: TemplateBase, labels: Record<string, string>, timeoutSecs: number, parent: string | null): Box {
    let id: string;
    do id = 'sbx_' + randomBytes(6).toString('hex');
    while (this.boxes.has(id));
    const t = this.now();
    const box: Box = {
      id,
      tenant,
      template: tpl.id,
      state: 'running',
      labels: { ...labels },
      createdMs: t,
      lastActiveMs: t,
      execCount: 0,
      parent,
      forkedMs: parent ? t : null,
      children: [],
      timeoutSecs,
      sessionStartMs: t,
      sessionEndMs: t + timeoutSecs * 1000,
      vcpus: tpl.vcpus,
      memoryMib: tpl.memory_mib,
      diskMib: 1024,
      files: new Map(),
      dirs: new Map(),
      modes: new Map(),
      watchers: new Set(),
      queue: Promise.resolve(),
      egress: 'allow',
      onTimeout: 'delete',
      autoResume: false,
      keepMemory: true,
      memoryKept: null,
      publicPorts: false,
      portHost: null,
      ports: [],
      agent: new FakeProcessAgent(),
    };
    this.boxes.set(id, box);
    void this.processes.of(id).attach(box.agent);
    return box;
  }

  private info(b: Box): SandboxInfo {
    const t = this.now();
    return {
      id: b.id,
      template: b.template,
      state: b.state,
      tenant: b.tenant,
      labels: { ...b.labels },
      created_at: iso(b.createdMs),
      age_secs: (t - b.createdMs) / 1000,
      idle_secs: (t - b.lastActiveMs) / 1000,
      exec_count: b.execCount,
      parent: b.parent,
      forked_at: b.forkedMs === null ? null : iso(b.forkedMs),
      children: [...b.children],
      timeout_secs: b.timeoutSecs,
      session_started_at: iso(b.sessionStartMs),
      expires_at: iso(b.sessionEndMs),
      remaining_secs: b.state === 'running' ? Math.max(0, (b.sessionEndMs - t) / 1000) : null,
      vcpus: b.vcpus,
      memory_mib: b.memoryMib,
      disk_mib: b.diskMib,
      egress: b.egress,
      // Like the engine: the last reading (openPorts reads anew).
      ports: b.ports.map((port) => ({ port, protocol: 'tcp' as const })),
      on_timeout: b.onTimeout,
      keep_memory: b.keepMemory,
      memory_kept: b.state === 'suspended' ? b.memoryKept : null,
      auto_resume: b.autoResume,
      public_ports: b.publicPorts,
      port_host: b.portHost,
      from_snapshot: b.fromSnapshot ?? null,
    };
  }
}
