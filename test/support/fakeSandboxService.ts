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
import type {
  CreateOptions,
  ExecRequest,
  ExecResult,
  ExecStreamHandlers,
  ForkOptions,
  ListFilter,
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
} from '../../src/sandboxes/types.js';

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
  queue: Promise<unknown>;
  egress: EgressPolicy;
  ports: number[];
  /** Its guest's background processes (fakeProcessAgent.ts). */
  agent: FakeProcessAgent;
}

type TemplateBase = Omit<TemplateInfo, 'egress' | 'network'>;

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
  /** Emit `transition` events like the engine ({id, tenant, state, op, snapshotBytes?}). */
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
    if (!Number.isInteger(opts.count) || opts.count < 1 || opts.count > 64) throw new CollimateError('validation_error', 'count must be an integer from 1 to 64.');
    await sleep(this.opDelayMs);
    const tpl = CATALOG.find((t) => t.id === parent.template) ?? this.template(parent.template, { tenant: parent.tenant });
    const children: SandboxInfo[] = [];
    for (let i = 0; i < opts.count; i++) {
      const child = this.newBox(parent.tenant, tpl, { ...parent.labels, ...(opts.labels ?? {}) }, parent.timeoutSecs, parent.id);
      child.files = new Map(parent.files);
      child.egress = parent.egress;
      parent.children.push(child.id);
      this.transition(child, 'fork');
      children.push(this.info(child));
    }
    return children;
  }

  async suspend(id: string, scope?: Scope): Promise<SandboxInfo> {
    this.calls.push('suspend');
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, 'suspend', ['running']);
    await sleep(this.opDelayMs);
    box.state = 'suspended';
    this.transition(box, 'suspend', box.memoryMib * 1024 * 1024);
    return this.info(box);
  }

  async resume(id: string, scope?: Scope): Promise<SandboxInfo> {
    this.calls.push('resume');
    const box = this.find(id, scope);
    if (box.state !== 'suspended') throw invalidState(id, box.state, 'resume', ['suspended']);
    await sleep(this.opDelayMs);
    box.state = 'running';
    box.sessionStartMs = this.now();
    box.sessionEndMs = box.sessionStartMs + box.timeoutSecs * 1000;
    this.transition(box, 'resume');
    return this.info(box);
  }

  async delete(id: string, scope?: Scope): Promise<void> {
    this.calls.push('delete');
    const box = this.find(id, scope);
    box.state = 'deleted';
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
  }

  async openPorts(id: string, scope?: Scope): Promise<OpenPort[]> {
    const box = this.find(id, scope);
    return box.ports.map((port) => ({ port, protocol: 'tcp' as const }));
  }

  portTarget(id: string, port: number, scope?: Scope): PortTarget {
    this.portCalls.push({ id, port, tenant: scope?.tenant });
    const box = this.find(id, scope);
    if (box.state !== 'running') throw invalidState(id, box.state, 'reaching a port', ['running']);
    if (this.networkUnavailable) throw new CollimateError('network_unavailable', 'This server runs without networking, so sandbox ports cannot be reached.');
    return { host: '127.0.0.1', port: this.portMap.get(port) ?? port };
  }

  /** Networking as /healthz shows it (Engine.networkStatus; `collimate serve` reports it). */
  networkStatus(): { enabled: boolean; reason?: string } {
    return this.networkUnavailable ? { enabled: false, reason: 'the fake service has networking switched off' } : { enabled: true };
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
      queue: Promise.resolve(),
      egress: 'allow',
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
    };
  }
}
