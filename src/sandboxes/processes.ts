import type { ProcEntry, ProcExit, ProcExitStatus, ProcOutput, ProcStartRequest, ProcStarted, ProcStreamName, Frame } from '../guest/protocol.js';
import { MessageType, decodeProcExit, decodeProcOutput } from '../guest/protocol.js';

/**
 * What the host keeps of each sandbox's background processes (the guest agent's PROC_* messages,
 * docs/agent-protocol.md): their metadata and exit, the last PROCESS_OUTPUT_KEPT bytes of output of
 * each, with byte offsets, and the subscribers to their live output.
 *
 * Offsets count everything a process wrote, all streams together, as the guest counts it: a chunk
 * the host never saw (the host was away: a suspend, a server restart, the first moments of a fork
 * child) or no longer keeps shows as a gap, never as silently missing bytes.
 *
 * The table is learned again from the agent (PROC_LIST) every time an agent connection is made
 * (attach): a resume, a fork child, a server that adopts a running VMM. It is kept per sandbox id,
 * so a suspended sandbox keeps its buffered output for when it resumes; a fork child starts with a
 * copy of its parent's (inherit). Nothing here survives a server restart: an adopted sandbox's
 * processes come back from the agent with their counters, without output from before.
 */

/** Output kept per process (the oldest bytes go first). */
export const PROCESS_OUTPUT_KEPT = 1024 * 1024;
/** Exited processes kept per sandbox, like the agent's table. */
export const EXITED_PROCESSES_KEPT = 64;
/** Output of exited processes kept per sandbox, in all (the oldest exits lose theirs first). */
export const EXITED_OUTPUT_BUDGET = 8 * 1024 * 1024;

/** What the registry needs of an agent connection (AgentClient; a fake in unit tests). */
export interface ProcessAgent {
  startProcess(req: ProcStartRequest, timeoutMs?: number): Promise<ProcStarted>;
  processInput(pid: number, data: Buffer, timeoutMs?: number): Promise<void>;
  closeProcessStdin(pid: number, timeoutMs?: number): Promise<void>;
  signalProcess(pid: number, signal: number, timeoutMs?: number): Promise<void>;
  resizeProcess(pid: number, cols: number, rows: number, timeoutMs?: number): Promise<void>;
  listProcesses(timeoutMs?: number): Promise<ProcEntry[]>;
  on(event: 'event', listener: (frame: Frame) => void): unknown;
  off(event: 'event', listener: (frame: Frame) => void): unknown;
}

export type ProcessStatus = 'running' | 'exited' | 'lost';

/** A background process as clients see it. */
export interface ProcessInfo {
  pid: number;
  argv: string[];
  cwd: string;
  tag: string | null;
  pty: boolean;
  /** Whether input can be sent now (started with stdin, not closed, running; a pty's always is). */
  stdin_open: boolean;
  /** `lost`: it was running when the host last knew, and the guest no longer lists it. */
  status: ProcessStatus;
  started_at: string;
  finished_at: string | null;
  exit_code: number | null;
  signal: number | null;
  /** Present (true) when its cgroup hit the process limit and the guest killed it. */
  pids_limited?: true;
  stdout_bytes: number;
  stderr_bytes: number;
  /** Everything it wrote, all streams; the offset its next output starts at. */
  output_bytes: number;
  /** The output the host holds: offsets [from, to). Bytes before `from` are not available. */
  buffered: { from: number; to: number };
}

export type ProcessEvent =
  | { type: 'output'; stream: ProcStreamName; offset: number; data: Buffer }
  /** Output [from, to) is not available: it was dropped (written while the host was away, or evicted). */
  | { type: 'gap'; from: number; to: number }
  /** The last event: the process exited (or was lost). */
  | { type: 'exit'; process: ProcessInfo };

interface Chunk {
  stream: ProcStreamName;
  offset: number;
  data: Buffer;
}

interface Subscriber {
  /** The next offset it expects. */
  pos: number;
  listener: (e: ProcessEvent) => void;
}

/** One process's bounded output: chunks at offsets, the oldest dropped beyond the cap. */
export class OutputBuffer {
  private chunks: Chunk[] = [];
  private held = 0;
  /** Offset after the last byte known (held or not). */
  end = 0;

  constructor(private cap = PROCESS_OUTPUT_KEPT) {}

  get bytes(): number {
    return this.held;
  }

  /** Offset of the first byte held (= end when nothing is). */
  get start(): number {
    return this.chunks.length ? this.chunks[0].offset : this.end;
  }

  /** Adds a chunk; the part before `end` (a duplicate) is ignored. Returns what was new, if anything. */
  append(c: Chunk): Chunk | undefined {
    const skip = Math.max(0, this.end - c.offset);
    if (skip >= c.data.length) return undefined;
    const fresh = skip ? { stream: c.stream, offset: c.offset + skip, data: c.data.subarray(skip) } : c;
    this.chunks.push(fresh);
    this.held += fresh.data.length;
    this.end = fresh.offset + fresh.data.length;
    this.trim(this.cap);
    return fresh;
  }

  /** Output up to `offset` is known to exist (the guest's counter) though the host never saw it. */
  advanceTo(offset: number): void {
    if (offset > this.end) this.end = offset;
  }

  /** Keeps at most `cap` bytes (0: drops everything held). */
  trim(cap: number): void {
    while (this.held > cap && this.chunks.length) {
      const first = this.chunks[0];
      const over = this.held - cap;
      if (first.data.length <= over) {
        this.chunks.shift();
        this.held -= first.data.length;
      } else {
        this.chunks[0] = { stream: first.stream, offset: first.offset + over, data: first.data.subarray(over) };
        this.held -= over;
      }
    }
  }

  /** Chunks from `from` on (the first one cut at `from`). */
  since(from: number): Chunk[] {
    const out: Chunk[] = [];
    for (const c of this.chunks) {
      if (c.offset + c.data.length <= from) continue;
      const skip = Math.max(0, from - c.offset);
      out.push(skip ? { stream: c.stream, offset: c.offset + skip, data: c.data.subarray(skip) } : c);
    }
    return out;
  }

  copy(): OutputBuffer {
    const b = new OutputBuffer(this.cap);
    b.chunks = [...this.chunks];
    b.held = this.held;
    b.end = this.end;
    return b;
  }
}

interface ProcessRecord {
  pid: number;
  argv: string[];
  cwd: string;
  tag: string | null;
  pty: boolean;
  stdinOpen: boolean;
  startedNs: bigint;
  status: ProcessStatus;
  exit?: ProcExitStatus;
  stdoutBytes: number;
  stderrBytes: number;
  output: OutputBuffer;
  subscribers: Set<Subscriber>;
  waiters: Set<() => void>;
  /** When the host first knew of it (SandboxProcesses.known): a table asked for earlier cannot list it. */
  knownSince: number;
}

function nsToIso(ns: bigint): string {
  return new Date(Number(ns / 1_000_000n)).toISOString();
}

function infoOf(p: ProcessRecord): ProcessInfo {
  return {
    pid: p.pid,
    argv: [...p.argv],
    cwd: p.cwd,
    tag: p.tag,
    pty: p.pty,
    stdin_open: p.status === 'running' && p.stdinOpen,
    status: p.status,
    started_at: nsToIso(p.startedNs),
    finished_at: p.exit ? nsToIso(p.exit.finishedNs) : null,
    exit_code: p.exit ? p.exit.exitCode : null,
    signal: p.exit?.signal ?? null,
    ...(p.exit?.pidsLimited ? { pids_limited: true as const } : {}),
    stdout_bytes: p.stdoutBytes,
    stderr_bytes: p.stderrBytes,
    output_bytes: p.output.end,
    buffered: { from: p.output.start, to: p.output.end },
  };
}

/** Sends `sub` what it has not seen of `c`: a gap first if `c` starts past where it is. */
function deliver(sub: Subscriber, c: Chunk): void {
  if (c.offset > sub.pos) {
    sub.listener({ type: 'gap', from: sub.pos, to: c.offset });
    sub.pos = c.offset;
  }
  const skip = sub.pos - c.offset;
  if (skip >= c.data.length) return;
  const data = skip > 0 ? c.data.subarray(skip) : c.data;
  sub.listener({ type: 'output', stream: c.stream, offset: sub.pos, data });
  sub.pos += data.length;
}

/** The background processes of one sandbox, as the host knows them. */
export class SandboxProcesses {
  private readonly records = new Map<number, ProcessRecord>();
  private agent: ProcessAgent | undefined;
  private readonly onFrame = (frame: Frame) => this.event(frame);
  /** Counts records made: tells a table answered before a record existed from one that lost it. */
  private known = 0;
  /** Settles once the table learned at the last attach is in (tests; reads wait for it). */
  synced: Promise<void> = Promise.resolve();

  /** Listens to `agent` from now on and learns the guest's table (PROC_LIST). */
  attach(agent: ProcessAgent): Promise<void> {
    this.agent?.off('event', this.onFrame);
    this.agent = agent;
    agent.on('event', this.onFrame);
    // A process started while the table is on its way is not in it, and is not lost.
    const asOf = this.known;
    this.synced = agent.listProcesses().then(
      (entries) => { if (this.agent === agent) this.reconcile(entries, asOf); },
      () => { /* An agent without background processes, or one gone already: nothing to learn. */ },
    );
    return this.synced;
  }

  /** The sandbox is gone: running processes end as lost (their streams and waiters are answered). */
  close(): void {
    this.detach();
    for (const p of [...this.records.values()]) if (p.status === 'running') this.finish(p, 'lost');
  }

  /** Stops listening (suspend, delete); the records stay for a later attach. */
  detach(): void {
    this.agent?.off('event', this.onFrame);
    this.agent = undefined;
  }

  /** A copy of every record with its buffered output, for a fork child (it has the same processes). */
  copy(): SandboxProcesses {
    const c = new SandboxProcesses();
    c.known = this.known;
    for (const [pid, p] of this.records) {
      c.records.set(pid, { ...p, argv: [...p.argv], output: p.output.copy(), subscribers: new Set(), waiters: new Set() });
    }
    return c;
  }

  /** Records a process the host just started (its output may have arrived first). */
  started(req: ProcStartRequest, started: ProcStarted): ProcessInfo {
    // Output (even the exit) may have come first, making a record not started yet (startedNs 0).
    const known = this.records.get(started.pid);
    const p = known && known.startedNs === 0n ? known : this.fresh(started.pid, started.startedNs);
    p.startedNs = started.startedNs;
    p.argv = req.argv.map((a) => a.toString());
    p.cwd = req.cwd ?? '';
    p.tag = req.tag ?? null;
    p.pty = !!req.pty;
    p.stdinOpen = !!req.stdinOpen || !!req.pty;
    return infoOf(p);
  }

  list(): ProcessInfo[] {
    return [...this.records.values()].sort((a, b) => (a.startedNs < b.startedNs ? -1 : a.startedNs > b.startedNs ? 1 : a.pid - b.pid)).map(infoOf);
  }

  get(pid: number): ProcessInfo | undefined {
    const p = this.records.get(pid);
    return p && infoOf(p);
  }

  has(pid: number): boolean {
    return this.records.has(pid);
  }

  /**
   * Replays the output held from `from` ('start': the oldest byte held, with a gap before it if
   * earlier output is gone; 'now': nothing; a number: that offset), then sends live output as it
   * comes, then the exit. Returns the unsubscribe. Precondition: the pid is known (has).
   */
  subscribe(pid: number, from: 'start' | 'now' | number, listener: (e: ProcessEvent) => void): () => void {
    const p = this.records.get(pid);
    if (!p) throw new Error(`unknown process ${pid}`);
    const pos = from === 'start' ? 0 : from === 'now' ? p.output.end : Math.max(0, Math.min(from, p.output.end));
    const sub: Subscriber = { pos, listener };
    for (const c of p.output.since(pos)) deliver(sub, c);
    if (p.status !== 'running') {
      if (sub.pos < p.output.end) listener({ type: 'gap', from: sub.pos, to: p.output.end });
      listener({ type: 'exit', process: infoOf(p) });
      return () => {};
    }
    p.subscribers.add(sub);
    return () => { p.subscribers.delete(sub); };
  }

  /** Resolves with the process once it exited, or as it is when `timeoutMs` passes. */
  wait(pid: number, timeoutMs: number): Promise<ProcessInfo> {
    const p = this.records.get(pid);
    if (!p) return Promise.reject(new Error(`unknown process ${pid}`));
    if (p.status !== 'running') return Promise.resolve(infoOf(p));
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        p.waiters.delete(done);
        resolve(infoOf(p));
      };
      const timer = setTimeout(done, timeoutMs);
      p.waiters.add(done);
    });
  }

  /** Marks stdin closed (after PROC_CLOSE_STDIN, or when the guest said it is). */
  stdinClosed(pid: number): void {
    const p = this.records.get(pid);
    if (p && !p.pty) p.stdinOpen = false;
  }

  // ---- from the agent ---------------------------------------------------------------------------

  private fresh(pid: number, startedNs: bigint): ProcessRecord {
    const old = this.records.get(pid);
    if (old && old.status === 'running') this.finish(old, 'lost');
    const p: ProcessRecord = {
      pid, argv: [], cwd: '', tag: null, pty: false, stdinOpen: false, startedNs, status: 'running',
      stdoutBytes: 0, stderrBytes: 0, output: new OutputBuffer(), subscribers: new Set(), waiters: new Set(), knownSince: this.known++,
    };
    this.records.set(pid, p);
    return p;
  }

  private event(frame: Frame): void {
    try {
      if (frame.type === MessageType.ProcOutput) this.output(decodeProcOutput(frame.payload));
      else if (frame.type === MessageType.ProcExit) this.exited(decodeProcExit(frame.payload));
    } catch {
      // An undecodable event is the guest's bug; the next PROC_LIST corrects the counters.
    }
  }

  /** Output of a pid whose record exited belongs to a new process with that pid. */
  private live(pid: number): ProcessRecord {
    const p = this.records.get(pid);
    return p && p.status === 'running' ? p : this.fresh(pid, 0n);
  }

  private output(o: ProcOutput): void {
    const p = this.live(o.pid);
    if (o.stream === 'stderr') p.stderrBytes += o.data.length;
    else p.stdoutBytes += o.data.length;
    const fresh = p.output.append({ stream: o.stream, offset: o.offset, data: o.data });
    if (fresh) for (const sub of p.subscribers) deliver(sub, fresh);
  }

  private exited(e: ProcExit): void {
    const p = this.live(e.pid);
    p.stdoutBytes = e.stdoutBytes;
    p.stderrBytes = e.stderrBytes;
    p.output.advanceTo(e.outputTotal);
    p.exit = { exitCode: e.exitCode, finishedNs: e.finishedNs, ...(e.signal !== undefined ? { signal: e.signal } : {}), ...(e.pidsLimited ? { pidsLimited: true as const } : {}) };
    this.finish(p, 'exited');
  }

  private finish(p: ProcessRecord, status: 'exited' | 'lost'): void {
    p.status = status;
    p.stdinOpen = false;
    const info = infoOf(p);
    for (const sub of p.subscribers) {
      if (sub.pos < p.output.end) sub.listener({ type: 'gap', from: sub.pos, to: p.output.end });
      sub.listener({ type: 'exit', process: info });
    }
    p.subscribers.clear();
    for (const w of [...p.waiters]) w();
    this.trimExited();
  }

  /**
   * Learns the guest's table: new processes, exits missed, output written while the host was away.
   * `asOf`: how many records the host had made when it asked; only those can be lost by the table.
   */
  reconcile(entries: ProcEntry[], asOf = this.known): void {
    const listed = new Set<number>();
    for (const e of entries) {
      listed.add(e.pid);
      let p = this.records.get(e.pid);
      // Started by this host since the table was asked for: its record is the newer word (a pid
      // used again). A record only output events made (startedNs 0: the host never saw its start,
      // as after a restart) learns its argv, tag and the rest from the table.
      if (p && p.knownSince >= asOf && p.startedNs !== 0n) continue;
      if (p && p.startedNs !== 0n && p.startedNs !== e.startedNs) p = undefined;
      if (!p && e.exit) {
        // An exit the host never knew a start of: kept for the listing, nobody waits on it.
        p = this.fresh(e.pid, e.startedNs);
      }
      p ??= this.fresh(e.pid, e.startedNs);
      p.startedNs = e.startedNs;
      p.argv = e.argv;
      p.cwd = e.cwd;
      p.tag = e.tag ?? null;
      p.pty = e.pty;
      p.stdinOpen = e.stdinOpen;
      p.stdoutBytes = Math.max(p.stdoutBytes, e.stdoutBytes);
      p.stderrBytes = Math.max(p.stderrBytes, e.stderrBytes);
      p.output.advanceTo(e.outputTotal);
      if (e.exit && p.status === 'running') {
        p.exit = e.exit;
        this.finish(p, 'exited');
      }
    }
    for (const p of [...this.records.values()]) if (p.status === 'running' && !listed.has(p.pid) && p.knownSince < asOf) this.finish(p, 'lost');
  }

  private trimExited(): void {
    const exited = [...this.records.values()].filter((p) => p.status !== 'running').sort((a, b) => Number((b.exit?.finishedNs ?? 0n) - (a.exit?.finishedNs ?? 0n)));
    let budget = EXITED_OUTPUT_BUDGET;
    exited.forEach((p, i) => {
      if (i >= EXITED_PROCESSES_KEPT) { this.records.delete(p.pid); return; }
      p.output.trim(Math.min(budget, p.output.bytes));
      budget -= p.output.bytes;
    });
  }
}

/** Every sandbox's processes, by sandbox id (the engine holds one). */
export class ProcessRegistry {
  private readonly bySandbox = new Map<string, SandboxProcesses>();
  /** What the host held of a parent's processes when its live fork began (beginFork). */
  private readonly forkCopies = new Map<string, SandboxProcesses>();

  of(id: string): SandboxProcesses {
    let s = this.bySandbox.get(id);
    if (!s) { s = new SandboxProcesses(); this.bySandbox.set(id, s); }
    return s;
  }

  /**
   * A live fork of `id` begins (before its VM stops). What the host holds of its processes now is a
   * prefix of what every child's guest has — the host only lags its guest — unlike what it holds
   * once the parent runs on after the snapshot: the children inherit this copy.
   */
  beginFork(id: string): void {
    const s = this.bySandbox.get(id);
    if (s) this.forkCopies.set(id, s.copy());
  }

  endFork(id: string): void {
    this.forkCopies.delete(id);
  }

  /**
   * Keeps, as `key` (a snapshot's id), what the host held of sandbox `id`'s processes when its live
   * fork began (or now): sandboxes started from the snapshot, or rolled back to it, inherit it.
   */
  remember(key: string, id: string): void {
    const s = this.forkCopies.get(id) ?? this.bySandbox.get(id);
    if (s) this.forkCopies.set(key, s.copy());
  }

  /** A sandbox rolled back: what the host held of its processes goes, and it starts from `key`'s copy. */
  replace(id: string, key: string): void {
    this.forget(id);
    this.inherit(key, id);
  }

  /**
   * A fork child has its parent's processes: it starts with a copy of what the host held of them
   * when the fork began (a suspended parent's, as they are). Output between that and the snapshot
   * shows in the child as a gap; its own continues at its guest's offsets.
   */
  inherit(parentId: string, childId: string): void {
    const parent = this.forkCopies.get(parentId) ?? this.bySandbox.get(parentId);
    if (parent) this.bySandbox.set(childId, parent.copy());
  }

  /** The sandbox is deleted: its processes with it. */
  forget(id: string): void {
    this.bySandbox.get(id)?.close();
    this.bySandbox.delete(id);
  }
}
