/**
 * The host that runs a sandbox, as the tenant service reaches it. On one host that is this host's
 * engine (localHost below); in a cluster it may be another host, reached through a client of that
 * host (src/cluster/remoteHost.ts) that speaks the same interface. The tenant service decides the
 * rules and asks a Placement (placement.ts) which host to call; it never knows which kind it holds.
 *
 * What runs beside the engine on the host that runs the sandbox — the exec log, the sandbox log
 * and metering — is here too, so a sandbox's execs, log and usage are kept where it runs, whichever
 * host the request entered by.
 */
import type {
  CreateOptions, DirListing, DirWatch, ExecRequest, ExecResult, ExecStreamHandlers, FileEntry, FileSink, ForkOptions, MkdirOptions, OpenPort, PortTarget,
  ProcessEvent, ProcessInfo, ProcessStartRequest, SandboxInfo, Scope, ServiceEngine, UploadOptions, WatchHandlers,
  SnapshotInfo, SnapshotListFilter, SnapshotOptions, StartFromSnapshotOptions, SuspendOptions,
} from '../sandboxes/types.js';
import type { Duplex } from 'node:stream';
import { execSummary, type ExecLog, type ExecLogEntry } from './execLog.js';
import {
  execLine, failureLine, forkedLine, processExitLine, processStartLine, processSummary, sessionEndLine, snapshotTakenLine, startedFromSnapshotLine,
  type SandboxLog, type SandboxLogEntry, type SandboxLogLine, type SandboxLogQuery,
} from './sandboxLog.js';
import type { Meter, MeteredSandboxInfo } from './metering.js';
import type { EgressPolicy } from '../net/policy.js';
import type { MetricSample, SandboxMetrics } from './sandboxMetrics.js';

type Maybe<T> = T | Promise<T>;

/** Where a port of a sandbox is reached: an address to connect to, or (another host's sandbox) a tunnel through its host. */
export interface PortRoute extends PortTarget {
  /** Opens the connection when it is not a plain TCP connect to host:port (a tunnel through the owning host). */
  connect?(): Promise<Duplex>;
}

/**
 * Every operation on a sandbox the tenant service asks of the host that runs it. Scopes here are the
 * engine's (the tenant); tier rules were applied before.
 */
export interface SandboxHost {
  create(opts: CreateOptions, scope: Scope): Promise<SandboxInfo>;
  get(id: string, scope: Scope): Maybe<SandboxInfo>;
  fork(id: string, opts: ForkOptions, scope: Scope): Promise<SandboxInfo[]>;
  suspend(id: string, scope: Scope, opts?: SuspendOptions): Promise<SandboxInfo>;
  resume(id: string, scope: Scope): Promise<SandboxInfo>;
  delete(id: string, scope: Scope): Promise<void>;
  createSnapshot(id: string, opts: SnapshotOptions, scope: Scope): Promise<SnapshotInfo>;
  getSnapshot(id: string, scope: Scope): Maybe<SnapshotInfo>;
  listSnapshots(filter: SnapshotListFilter, scope: Scope): Maybe<{ snapshots: SnapshotInfo[]; next: string | null }>;
  deleteSnapshot(id: string, scope: Scope): Maybe<void>;
  promoteSnapshot(id: string, environment: string | null, scope: Scope): Maybe<SnapshotInfo>;
  startFromSnapshot(id: string, opts: StartFromSnapshotOptions, scope: Scope): Promise<SandboxInfo[]>;
  restore(id: string, snapshotId: string, scope: Scope): Promise<SandboxInfo>;
  setSessionEnd(id: string, endsAtMs: number, scope: Scope): Maybe<SandboxInfo>;
  setEgress(id: string, egress: EgressPolicy, scope: Scope): Promise<SandboxInfo>;
  exec(id: string, req: ExecRequest, scope: Scope, stream?: ExecStreamHandlers): Promise<ExecResult>;
  /** The sandbox's recent execs, newest first. */
  recentExecs(id: string, limit: number | undefined, scope: Scope): Maybe<ExecLogEntry[]>;
  /** Its log entries matching `query` (sandboxLog.ts), in the query's direction. */
  logs(id: string, query: SandboxLogQuery, scope: Scope): Maybe<SandboxLogEntry[]>;
  /** Its resource use sampled within [fromMs, toMs], oldest first. */
  metrics(id: string, fromMs: number | undefined, toMs: number | undefined, scope: Scope): Maybe<MetricSample[]>;
  readFile(id: string, path: string, scope: Scope): Promise<Buffer>;
  writeFile(id: string, path: string, data: Buffer, scope: Scope, mode?: number): Promise<void>;
  fsStat(id: string, path: string, scope: Scope): Promise<FileEntry>;
  fsList(id: string, path: string, depth: number | undefined, scope: Scope): Promise<DirListing>;
  fsMkdir(id: string, path: string, opts: MkdirOptions | undefined, scope: Scope): Promise<{ created: boolean; entry: FileEntry }>;
  fsRemove(id: string, path: string, scope: Scope): Promise<{ removed: number }>;
  fsRename(id: string, from: string, to: string, scope: Scope): Promise<FileEntry>;
  fsWatch(id: string, path: string, recursive: boolean, handlers: WatchHandlers, scope: Scope): Promise<DirWatch>;
  downloadFile(id: string, path: string, sink: FileSink, scope: Scope): Promise<{ size: number }>;
  uploadFile(id: string, path: string, source: AsyncIterable<Buffer | Uint8Array | string>, opts: UploadOptions | undefined, scope: Scope): Promise<FileEntry & { bytes: number }>;
  openPorts(id: string, scope: Scope): Promise<OpenPort[]>;
  portTarget(id: string, port: number, scope: Scope): Maybe<PortRoute>;
  startProcess(id: string, req: ProcessStartRequest, scope: Scope): Promise<ProcessInfo>;
  listProcesses(id: string, scope: Scope): Promise<ProcessInfo[]>;
  getProcess(id: string, pid: number, scope: Scope): Promise<ProcessInfo>;
  watchProcessOutput(id: string, pid: number, from: 'start' | 'now' | number, listener: (e: ProcessEvent) => void, scope: Scope): Promise<() => void>;
  writeProcessStdin(id: string, pid: number, data: AsyncIterable<Buffer> | Buffer, scope: Scope): Promise<number>;
  closeProcessStdin(id: string, pid: number, scope: Scope): Promise<void>;
  signalProcess(id: string, pid: number, signal: string | number, scope: Scope): Promise<void>;
  resizeProcess(id: string, pid: number, cols: number, rows: number, scope: Scope): Promise<void>;
  waitProcess(id: string, pid: number, timeoutSecs: number, scope: Scope): Promise<ProcessInfo>;
}

/**
 * How each operation travels to another host (src/cluster/remoteHost.ts, src/api/peerRoutes.ts): `call` is
 * JSON arguments in, a JSON result out; the others carry a stream or a callback, at the argument
 * named. Listed once, here, so the client and the serving side cannot disagree on an operation, and
 * the architecture test checks that every SandboxHost operation is in it.
 */
export const HOST_OPERATIONS = {
  create: { kind: 'call', changes: true },
  get: { kind: 'call' },
  fork: { kind: 'call', changes: true },
  suspend: { kind: 'call', changes: true },
  resume: { kind: 'call', changes: true },
  delete: { kind: 'call', changes: true },
  createSnapshot: { kind: 'call', changes: true },
  getSnapshot: { kind: 'call' },
  listSnapshots: { kind: 'call' },
  deleteSnapshot: { kind: 'call' },
  promoteSnapshot: { kind: 'call' },
  startFromSnapshot: { kind: 'call', changes: true },
  restore: { kind: 'call', changes: true },
  setSessionEnd: { kind: 'call', changes: true },
  setEgress: { kind: 'call', changes: true },
  exec: { kind: 'exec', arg: 3 },
  recentExecs: { kind: 'call' },
  logs: { kind: 'call' },
  metrics: { kind: 'call' },
  readFile: { kind: 'call' },
  writeFile: { kind: 'call' },
  fsStat: { kind: 'call' },
  fsList: { kind: 'call' },
  fsMkdir: { kind: 'call' },
  fsRemove: { kind: 'call' },
  fsRename: { kind: 'call' },
  fsWatch: { kind: 'watch', arg: 3 },
  downloadFile: { kind: 'download', arg: 2 },
  uploadFile: { kind: 'upload', arg: 2 },
  openPorts: { kind: 'call' },
  portTarget: { kind: 'tunnel' },
  startProcess: { kind: 'call' },
  listProcesses: { kind: 'call' },
  getProcess: { kind: 'call' },
  watchProcessOutput: { kind: 'listen', arg: 3 },
  writeProcessStdin: { kind: 'upload', arg: 2 },
  closeProcessStdin: { kind: 'call' },
  signalProcess: { kind: 'call' },
  resizeProcess: { kind: 'call' },
  waitProcess: { kind: 'call' },
} as const satisfies Record<keyof SandboxHost, { kind: 'call' | 'exec' | 'watch' | 'listen' | 'download' | 'upload' | 'tunnel'; arg?: number; changes?: boolean }>;

export type HostOperation = keyof typeof HOST_OPERATIONS;

/** Any operation of the table, untyped: what a forwarder (a peer, a wrapper) passes on as it came. */
type AnyOperation = (...args: unknown[]) => unknown;

/**
 * Calls one operation of `host` by name with arguments that came over the wire or through a
 * wrapper. The arguments were typed where they were made (the caller's SandboxHost); this and
 * `hostOf` are the two places the table meets the interface without the type checker's help.
 */
export function invoke(host: SandboxHost, op: HostOperation, args: unknown[]): unknown {
  return (host[op] as AnyOperation).apply(host, args);
}

/**
 * A SandboxHost whose every operation is `each(op, how, args)` (a client of another host, a
 * wrapper that refuses or follows some of them). The table names every operation of the
 * interface (`satisfies` above), so the object made has all of them.
 */
export function hostOf(each: <K extends HostOperation>(op: K, how: (typeof HOST_OPERATIONS)[K], args: unknown[]) => unknown): SandboxHost {
  const host: Partial<Record<HostOperation, AnyOperation>> = {};
  for (const op of Object.keys(HOST_OPERATIONS) as HostOperation[]) host[op] = (...args) => each(op, HOST_OPERATIONS[op], args);
  return host as unknown as SandboxHost;
}

/** What the host keeps beside its engine: the exec log, the sandbox log and the meter. */
export interface HostBooks {
  execLog: ExecLog;
  /** What happened to each sandbox (its lifecycle entries come from the tenant service's transitions). */
  sandboxLog: SandboxLog;
  meter: Meter;
  /** Each sandbox's resource use over time, sampled here. */
  metrics: SandboxMetrics;
  now(): number;
  /** Where a failure of bookkeeping goes (it never fails the operation). */
  log(err: unknown, msg: string): void;
}

/** This host's engine as a SandboxHost: each operation the engine's, with the exec log, the sandbox log and metering kept here. */
export function localHost(engine: ServiceEngine, books: HostBooks): SandboxHost {
  const observe = <T extends SandboxInfo | SandboxInfo[]>(r: T): T => {
    try {
      for (const info of Array.isArray(r) ? r : [r]) books.meter.observe(info as MeteredSandboxInfo);
    } catch (err) {
      books.log(err, 'metering failed'); // metering must never fail a request
    }
    return r;
  };
  // Nor must the sandbox log.
  const note = (scope: Scope, id: string, line: SandboxLogLine | undefined) => {
    if (!line) return;
    try {
      books.sandboxLog.add(scope.tenant, id, line);
    } catch (err) {
      books.log(err, `writing sandbox ${id}'s log failed`);
    }
  };
  /** Runs `op`; a failure of the server or the guest (not a refusal) is written to the sandbox's log before it is thrown. */
  const noting = async <T>(scope: Scope, id: string, what: 'Exec' | 'Process start', command: () => string, op: () => Promise<T>): Promise<T> => {
    try {
      return await op();
    } catch (err) {
      // Never for another tenant's id: that is sandbox_not_found, a refusal, answered before anything ran.
      note(scope, id, failureLine(what, command(), err));
      throw err;
    }
  };
  /**
   * Writes a background process's end when it comes (its exit, or lost). Only for processes started
   * through this host: a fork child's inherited ones, or those a restart adopted, end unwritten.
   */
  const noteExit = (scope: Scope, id: string, pid: number, command: string) => {
    let stop: (() => void) | undefined;
    let ended = false;
    engine
      .watchProcessOutput(id, pid, 'now', (e) => {
        if (e.type !== 'exit' || ended) return;
        ended = true;
        stop?.();
        note(scope, id, processExitLine(command, e.process));
      }, scope)
      .then((unsubscribe) => (ended ? unsubscribe() : (stop = unsubscribe)), (err) => books.log(err, `watching process ${pid} of ${id} for its exit failed`));
  };
  return {
    create: async (opts, scope) => observe(await engine.create(opts, scope)),
    get: (id, scope) => engine.get(id, scope),
    async fork(id, opts, scope) {
      const children = observe(await engine.fork(id, opts, scope));
      note(scope, id, forkedLine(children.map((c) => c.id)));
      return children;
    },
    suspend: async (id, scope, opts) => observe(await engine.suspend(id, scope, opts)),
    resume: async (id, scope) => observe(await engine.resume(id, scope)),
    async delete(id, scope) {
      await engine.delete(id, scope);
      try {
        books.meter.deleted(id);
      } catch (err) {
        books.log(err, 'metering failed');
      }
    },
    async createSnapshot(id, opts, scope) {
      const snap = await engine.createSnapshot(id, opts, scope);
      note(scope, id, snapshotTakenLine(snap.id, snap.name));
      return snap;
    },
    getSnapshot: (id, scope) => engine.getSnapshot(id, scope),
    listSnapshots: (filter, scope) => engine.listSnapshots(filter, scope),
    deleteSnapshot: (id, scope) => engine.deleteSnapshot(id, scope),
    promoteSnapshot: (id, environment, scope) => engine.promoteSnapshot(id, environment, scope),
    async startFromSnapshot(id, opts, scope) {
      const started = observe(await engine.startFromSnapshot(id, opts, scope));
      for (const s of started) note(scope, s.id, startedFromSnapshotLine(id));
      return started;
    },
    restore: async (id, snapshotId, scope) => observe(await engine.restore(id, snapshotId, scope)),
    setSessionEnd(id, endsAtMs, scope) {
      const info = observe(engine.setSessionEnd(id, endsAtMs, scope));
      note(scope, id, sessionEndLine(endsAtMs));
      return info;
    },
    setEgress: async (id, egress, scope) => observe(await engine.setEgress(id, egress, scope)),
    async exec(id, req, scope, stream) {
      const started = books.now();
      const t0 = performance.now();
      const r = await noting(scope, id, 'Exec', () => execSummary(req), () => engine.exec(id, req, scope, stream));
      const ms = performance.now() - t0;
      books.execLog.record(scope.tenant, id, req, started, ms, r);
      note(scope, id, execLine(req, ms, r));
      return r;
    },
    recentExecs: (id, limit, scope) => books.execLog.recent(scope.tenant, id, limit),
    async logs(id, query, scope) {
      await engine.get(id, scope); // sandbox_not_found for another tenant's, or one gone
      return books.sandboxLog.read(scope.tenant, id, query);
    },
    metrics(id, fromMs, toMs, scope) {
      const info = engine.get(id, scope) as SandboxInfo; // sandbox_not_found for another tenant's
      return books.metrics.of(id, fromMs ?? undefined, toMs ?? undefined, info.state === 'running');
    },
    readFile: (id, path, scope) => engine.readFile(id, path, scope),
    writeFile: (id, path, data, scope, mode) => engine.writeFile(id, path, data, scope, mode),
    fsStat: (id, path, scope) => engine.fsStat(id, path, scope),
    fsList: (id, path, depth, scope) => engine.fsList(id, path, depth, scope),
    fsMkdir: (id, path, opts, scope) => engine.fsMkdir(id, path, opts, scope),
    fsRemove: (id, path, scope) => engine.fsRemove(id, path, scope),
    fsRename: (id, from, to, scope) => engine.fsRename(id, from, to, scope),
    fsWatch: (id, path, recursive, handlers, scope) => engine.fsWatch(id, path, recursive, handlers, scope),
    downloadFile: (id, path, sink, scope) => engine.downloadFile(id, path, sink, scope),
    uploadFile: (id, path, source, opts, scope) => engine.uploadFile(id, path, source, opts, scope),
    openPorts: (id, scope) => engine.openPorts(id, scope),
    portTarget: (id, port, scope) => engine.portTarget(id, port, scope),
    async startProcess(id, req, scope) {
      const p = await noting(scope, id, 'Process start', () => processSummary(req), () => engine.startProcess(id, req, scope));
      note(scope, id, processStartLine(req, p));
      noteExit(scope, id, p.pid, processSummary(req));
      return p;
    },
    listProcesses: (id, scope) => engine.listProcesses(id, scope),
    getProcess: (id, pid, scope) => engine.getProcess(id, pid, scope),
    watchProcessOutput: (id, pid, from, listener, scope) => engine.watchProcessOutput(id, pid, from, listener, scope),
    writeProcessStdin: (id, pid, data, scope) => engine.writeProcessStdin(id, pid, data, scope),
    closeProcessStdin: (id, pid, scope) => engine.closeProcessStdin(id, pid, scope),
    signalProcess: (id, pid, signal, scope) => engine.signalProcess(id, pid, signal, scope),
    resizeProcess: (id, pid, cols, rows, scope) => engine.resizeProcess(id, pid, cols, rows, scope),
    waitProcess: (id, pid, timeoutSecs, scope) => engine.waitProcess(id, pid, timeoutSecs, scope),
  };
}
