/**
 * The engine's contract: what the tenant service (src/service/tenantService.ts) calls, and what the
 * unit tests' fake implements (test/support/sandboxServiceContract.ts holds both to it). Scopes here
 * only isolate tenants; tier rules live in the tenant service. Nothing below it knows HTTP or MCP.
 */

import type { EgressPolicy } from '../net/policy.js';
import type { OpenPort } from '../net/ports.js';
import type { TemplateInfo } from '../images/templates.js';
import type { ProcessEvent, ProcessInfo } from './processes.js';
import type { CapacityStatus } from './hostCapacity.js';
import type { PhaseReport } from './phases.js';

export type { EgressInput, EgressPolicy } from '../net/policy.js';
export type { OpenPort } from '../net/ports.js';
export type { TemplateInfo } from '../images/templates.js';
export type { ProcessEvent, ProcessInfo } from './processes.js';

export type SandboxState = 'running' | 'suspended' | 'deleted';

/** Scope of a call: which tenant is acting. Ids of other tenants read as not found. */
export interface Scope {
  tenant: string;
}

export interface SandboxInfo {
  id: string;
  template: string;
  state: SandboxState;
  tenant: string;
  labels: Record<string, string>;
  created_at: string; // ISO 8601
  age_secs: number;
  idle_secs: number;
  exec_count: number;
  /** Lineage: the sandbox this one was live-forked from (null for a template create) and when. */
  parent: string | null;
  forked_at: string | null;
  children: string[];
  /** The session length each start (create, fork, resume) gives, in seconds. */
  timeout_secs: number;
  /** When the current (or, suspended, the last) session started: create, fork or resume. ISO 8601. */
  session_started_at: string;
  /** When the session ends and the reaper acts: session_started_at + timeout_secs, or as a lease set it. */
  expires_at: string;
  /** Seconds until expires_at (0 once past it); null unless running. */
  remaining_secs: number | null;
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  /** What the sandbox may reach (src/net/policy.ts): its environment's policy, or narrower if given at create. */
  egress: EgressPolicy;
  /**
   * TCP ports a server listens on inside the sandbox, reachable through the ports proxy
   * (`/v1/sandboxes/{id}/ports/{port}/…`). Read live by GET of one sandbox when it is idle; other
   * views show the last reading.
   */
  ports: OpenPort[];
  /** What happens when the session ends: deleted, or suspended (and resumed later). */
  on_timeout: OnTimeout;
  /** Whether a suspend that does not say (the reaper's among them) keeps its memory and processes, or only its files. */
  keep_memory: boolean;
  /** While suspended: whether its memory was kept (a resume continues its processes) or only its files (a resume boots it afresh); null otherwise. */
  memory_kept: boolean | null;
  /** While suspended, a request that needs it running (an exec, a file, a port) resumes it first. */
  auto_resume: boolean;
  /** Its ports answer anyone, without a key or its traffic token (E2B's allowPublicTraffic); inherited by forks and snapshots. */
  public_ports: boolean;
  /** The Host header its servers see through the ports proxy, `${PORT}` replaced (E2B's maskRequestHost); null: `localhost:<port>`. */
  port_host: string | null;
  /** The snapshot it was started from, or last rolled back to; null otherwise. */
  from_snapshot: string | null;
}

/** A kept moment of a sandbox: its memory, processes and files (src/sandboxes/snapshots.ts). */
export interface SnapshotInfo {
  id: string;
  name: string | null;
  tenant: string;
  labels: Record<string, string>;
  /** The sandbox it was taken of: the one sandbox that may roll back to it. */
  sandbox_id: string;
  /** The template (or environment) that sandbox descends from. */
  template: string;
  created_at: string; // ISO 8601
  /** What it occupies on the host's disk: its RAM image, device state and disk layer. */
  size_bytes: number;
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  egress: EgressPolicy;
  /** The name it is promoted under: a template id its tenant creates sandboxes from (each one started from it); null if none. */
  environment: string | null;
}

export interface SnapshotOptions {
  name?: string;
  labels?: Record<string, string>;
}

/** A start of `count` sandboxes from a snapshot: each a fresh identity, the snapshot's memory, processes and files. */
export interface StartFromSnapshotOptions {
  count: number;
  labels?: Record<string, string>;
  /** Default: the session length of the sandbox the snapshot was taken of. */
  timeoutSecs?: number;
  /** Default: the snapshot's (the tenant service allows only it or a narrower one). */
  egress?: EgressPolicy;
  onTimeout?: OnTimeout;
  autoResume?: boolean;
  /** Default: the snapshot's. */
  keepMemory?: boolean;
  /** Default: the snapshot's. */
  publicPorts?: boolean;
  /** Default: the snapshot's. */
  portHost?: string | null;
  /**
   * The sandboxes are children of this sandbox, the one the snapshot was taken of for them: a fork
   * too wide for its host spilling onto others (their parent is it, as a fork's children's is).
   */
  forkOf?: string;
}

export interface SnapshotListFilter {
  labels?: Record<string, string>;
  /** Only snapshots of this sandbox. */
  sandboxId?: string;
  /** Only the snapshot promoted under this name; `true`: every promoted one. */
  environment?: string | true;
  after?: string;
  limit?: number;
}

/** What the reaper does with a sandbox whose session ended. */
export type OnTimeout = 'delete' | 'suspend';

export interface SuspendOptions {
  /** false: keep only the files (no RAM image; the resume boots the guest from its disk). Default: the sandbox's keep_memory. */
  keepMemory?: boolean;
}

/** Where the host reaches a port of a sandbox (the proxy connects here). */
export interface PortTarget {
  host: string;
  port: number;
  /** The sandbox's ports answer without a key or token (SandboxInfo.public_ports). */
  publicPorts?: boolean;
  /** The Host header its server gets (SandboxInfo.port_host with the port in it); absent: `localhost:<port>`. */
  requestHost?: string;
}

export interface ExecFile {
  path: string;
  content: string;
  /** How `content` is encoded; default utf8. */
  encoding?: 'utf8' | 'base64';
  /** Octal permission bits as a number (e.g. 0o755 = 493); default 0o644. */
  mode?: number;
}

/** Exactly one of command, code, commands. */
export interface ExecRequest {
  /** A shell string, run by /bin/sh -c. */
  command?: string;
  /** Source code run by the template's interpreter (sh for base, python3 for python, node for node). */
  code?: string;
  /** argv lists run in order; the first failure (non-zero exit or signal) stops the rest. */
  commands?: string[][];
  files?: ExecFile[];
  env?: Record<string, string>;
  cwd?: string;
  stdin?: string;
  /** Seconds; default 60, max 3600. */
  timeout?: number;
  /**
   * The CRNG seed for user-space randomness, an unsigned 64-bit integer as a decimal string
   * ("0".."18446744073709551615", no leading zeros). Absent: the host draws one. The same seed in
   * the same sandbox state replays the exec's randomness (docs/determinism.md says what is covered).
   */
  seed?: string;
  /** An account of the sandbox's image the commands run as (uid, groups, HOME; its home is the default cwd). Absent: root. */
  user?: string;
}

export interface ExecTiming {
  queued_at: string;
  started_at: string;
  finished_at: string;
  queued_ms: number;
  run_ms: number;
}

export interface ExecResult {
  stdout: string;
  stderr: string;
  /** `utf8` when the bytes were valid UTF-8, else `base64` (the string is the base64 of the bytes). */
  stdout_encoding: 'utf8' | 'base64';
  stderr_encoding: 'utf8' | 'base64';
  exit_code: number;
  timed_out: boolean;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  /** With `commands`: the index of the last command that ran (the failing one, on failure). */
  failed_index?: number;
  signal?: number;
  /** Present (true) when the exec was SIGKILLed and the guest kernel logged an OOM kill while it ran. */
  oom_killed?: true;
  /** Present (true) when the exec's processes hit the guest's per-exec process limit and the agent killed them all. */
  pids_limited?: true;
  error?: string;
  /** The CRNG seed the exec ran with (decimal u64), given or drawn; pass it back to replay. */
  seed: string;
  timing: ExecTiming;
}

export interface ExecStreamHandlers {
  onStdout?(chunk: Buffer): void;
  onStderr?(chunk: Buffer): void;
}

export interface CreateOptions {
  template: string;
  labels?: Record<string, string>;
  /** Maximum session duration in seconds (the tenant service caps it by the tier); default COLLIMATE_SESSION_SECS. */
  timeoutSecs?: number;
  /**
   * The sandbox's egress policy, already decided by the caller (the tenant service allows only the
   * template's, TemplateInfo.egress, or a narrower one). Default: the template's. A sandbox without
   * a network (TemplateInfo.network false) gets "none" whatever is given.
   */
  egress?: EgressPolicy;
  /** What the reaper does when the session ends; default the server's COLLIMATE_REAP_ACTION. Forks keep their parent's. */
  onTimeout?: OnTimeout;
  /** Resume on a request that needs it running while suspended (needs onTimeout 'suspend' to matter after a timeout). */
  autoResume?: boolean;
  /** Whether a suspend that does not say keeps the memory (default) or only the files. Forks keep their parent's. */
  keepMemory?: boolean;
  /** Its ports answer without a key or token; default false. Forks keep their parent's. */
  publicPorts?: boolean;
  /** The Host header template its servers see through the ports proxy (portHost.ts checks it); default `localhost:${PORT}`. */
  portHost?: string;
}

export interface ForkOptions {
  count: number;
  labels?: Record<string, string>;
  /** Started from a snapshot taken for a fork's spill (StartFromSnapshotOptions.forkOf): the children's parent. */
  forkOf?: string;
}

export interface ListFilter {
  state?: SandboxState;
  labels?: Record<string, string>;
  /** Opaque cursor from a previous page (the last id seen). */
  after?: string;
  limit?: number;
}

/** What the engine emits as 'transition' once a change of state is persisted (metering listens). */
export interface SandboxTransition {
  id: string;
  tenant: string;
  state: SandboxState;
  /**
   * `lost`: deleted because its VM died (`reason` says how), not by a request. `move`: a suspended
   * sandbox moved between cluster hosts: `deleted` on the host it left, `suspended` on the one it reached.
   * `restore`: rolled back to one of its snapshots (running again, or still suspended).
   */
  op: 'create' | 'fork' | 'suspend' | 'resume' | 'delete' | 'lost' | 'move' | 'restore';
  /** With op suspend: the size of the snapshot written. */
  snapshotBytes?: number;
  /** With op lost: what happened. */
  reason?: string;
}

/** A snapshot deleted (through any door, or with everything at shutdown), on the host that held it. */
export interface SnapshotDeleted {
  id: string;
  tenant: string;
}

// ---- files and directories (src/sandboxes/files.ts) ---------------------------------------------

export type FileEntryType = 'file' | 'dir' | 'symlink' | 'other';

/** One entry of a sandbox's file system, as the guest's lstat saw it (a symlink is itself). */
export interface FileEntry {
  name: string;
  /** Absolute guest path. */
  path: string;
  type: FileEntryType;
  size: number;
  /** Permission bits (mode & 07777). */
  mode: number;
  uid: number;
  gid: number;
  /** From the guest's /etc/passwd and /etc/group; empty when the id has no name there. */
  owner: string;
  group: string;
  /** Modification time, ns since the epoch. */
  mtimeNs: bigint;
  symlinkTarget?: string;
  /** Its user.* extended attributes, by name without `user.`; absent when it has none. */
  xattrs?: Record<string, string>;
}

export interface DirListing {
  entries: FileEntry[];
  /** More entries exist than one listing holds (5000, or 1 MiB of them). */
  truncated: boolean;
}

export type FileChangeOp = 'create' | 'write' | 'remove' | 'rename' | 'chmod' | 'overflow';

export interface FileChange {
  op: FileChangeOp;
  /** Relative to the watched directory (`sub/file`); empty for the directory itself. */
  name: string;
}

/** Why a watch ended other than by its own close(). */
export type WatchEndReason =
  | 'directory_removed' | 'directory_moved' | 'sandbox_suspended' | 'sandbox_deleted' | 'sandbox_lost' | 'agent_disconnected' | 'shutting_down';

export interface WatchHandlers {
  onChange(change: FileChange): void;
  /** Called at most once, and never after close(). */
  onEnd(reason: WatchEndReason): void;
}

export interface DirWatch {
  /** Stops the watch (its handlers get nothing more). */
  close(): Promise<void>;
}

/** Where a streamed download goes; awaiting `chunk` paces it (memory stays about one chunk). */
export interface FileSink {
  /** Once, before any chunk, with the size the file had when the read began (-1: unknown, a /proc or /sys file read to its end). */
  start?(info: { size: number; mode: number }): void | Promise<void>;
  chunk(data: Buffer): void | Promise<void>;
}

export interface UploadOptions {
  /** Permission bits of the file written (default 0644). */
  mode?: number;
  /** payload_too_large past this many bytes (nothing is left behind). */
  maxBytes?: number;
  /** Written with this account's permissions; a new file (and any parent made) is its. Absent: root. */
  user?: string;
  /** Extended attributes of the user.* namespace the new file gets (names without `user.`); it has no others. */
  xattrs?: Record<string, string>;
}

export interface MkdirOptions {
  /** Permission bits of the directories made (default 0755). */
  mode?: number;
  /** Made with this account's permissions, and its. Absent: root. */
  user?: string;
}

/** A background process to start (exactly one of command, argv). */
export interface ProcessStartRequest {
  /** A shell string, run by /bin/sh -c. */
  command?: string;
  /** The program and its arguments; the program is looked up on PATH. */
  argv?: string[];
  env?: Record<string, string>;
  cwd?: string;
  /** Run on a pseudo-terminal of this size (default 80x24): stdout and stderr are then one stream, `pty`. */
  pty?: { cols?: number; rows?: number };
  /** Keep stdin open for input (else it reads /dev/null). A pty's input is always open. */
  stdin?: boolean;
  /** A label of yours, listed with the process (at most 256 bytes). */
  tag?: string;
  /** The CRNG seed, as for an exec (decimal u64 string). */
  seed?: string;
  /** An account of the sandbox's image it runs as, as for an exec. Absent: root. */
  user?: string;
}

/**
 * Background processes (src/sandboxes/processOps.ts). A start is queued in the sandbox's FIFO like an
 * exec and returns once the process runs; the rest never waits behind an exec.
 */
export interface ProcessService {
  startProcess(id: string, req: ProcessStartRequest, scope?: Scope): Promise<ProcessInfo>;
  listProcesses(id: string, scope?: Scope): Promise<ProcessInfo[]>;
  getProcess(id: string, pid: number, scope?: Scope): Promise<ProcessInfo>;
  /** Output held from `from` on, then live output, then the exit; resolves to the unsubscribe. */
  watchProcessOutput(id: string, pid: number, from: 'start' | 'now' | number, listener: (e: ProcessEvent) => void, scope?: Scope): Promise<() => void>;
  /** Streams `data` to the process's stdin as it comes; resolves to the bytes written. */
  writeProcessStdin(id: string, pid: number, data: AsyncIterable<Buffer> | Buffer, scope?: Scope): Promise<number>;
  closeProcessStdin(id: string, pid: number, scope?: Scope): Promise<void>;
  /** `signal`: a name ("SIGTERM", "TERM") or a number; sent to the process's group. */
  signalProcess(id: string, pid: number, signal: string | number, scope?: Scope): Promise<void>;
  resizeProcess(id: string, pid: number, cols: number, rows: number, scope?: Scope): Promise<void>;
  /** Until it exits, or `timeoutSecs` (then it is returned still running). */
  waitProcess(id: string, pid: number, timeoutSecs: number, scope?: Scope): Promise<ProcessInfo>;
}

export interface SandboxService extends ProcessService {
  templates(scope?: Scope): TemplateInfo[];
  template(id: string, scope?: Scope): TemplateInfo;
  create(opts: CreateOptions, scope: Scope): Promise<SandboxInfo>;
  get(id: string, scope?: Scope): SandboxInfo;
  list(filter: ListFilter, scope?: Scope): { sandboxes: SandboxInfo[]; next: string | null };
  exec(id: string, req: ExecRequest, scope?: Scope, stream?: ExecStreamHandlers): Promise<ExecResult>;
  fork(id: string, opts: ForkOptions, scope?: Scope): Promise<SandboxInfo[]>;
  /** `keepMemory` false keeps only its files (the resume boots it afresh); default the sandbox's keep_memory. */
  suspend(id: string, scope?: Scope, opts?: SuspendOptions): Promise<SandboxInfo>;
  resume(id: string, scope?: Scope): Promise<SandboxInfo>;
  delete(id: string, scope?: Scope): Promise<void>;
  /** Keeps this moment of a running or suspended sandbox: its memory, processes and files. It runs on. */
  createSnapshot(id: string, opts: SnapshotOptions, scope?: Scope): Promise<SnapshotInfo>;
  getSnapshot(id: string, scope?: Scope): SnapshotInfo;
  listSnapshots(filter: SnapshotListFilter, scope?: Scope): { snapshots: SnapshotInfo[]; next: string | null };
  /** No new sandbox starts from it; its files go once no sandbox started from it depends on them. */
  deleteSnapshot(id: string, scope?: Scope): void;
  /** Names it as a template of its tenant's (null: no longer); 409 conflict if another snapshot has that name. */
  promoteSnapshot(id: string, environment: string | null, scope?: Scope): SnapshotInfo;
  /** `opts.count` sandboxes from a snapshot, each a fresh identity (as a fork child is). */
  startFromSnapshot(id: string, opts: StartFromSnapshotOptions, scope: Scope): Promise<SandboxInfo[]>;
  /** Rolls sandbox `id` back to its own snapshot `snapshotId`, in place; requests queued behind fail with sandbox_restored. */
  restore(id: string, snapshotId: string, scope?: Scope): Promise<SandboxInfo>;
  readFile(id: string, path: string, scope?: Scope): Promise<Buffer>;
  writeFile(id: string, path: string, data: Buffer, scope?: Scope, mode?: number): Promise<void>;
  /**
   * Files and directories of a running sandbox (a paused one is woken). Paths are guest paths,
   * absolute or relative to /root. Directory operations and watches are answered beside a running
   * exec; downloads and uploads take their turn on the sandbox's queue.
   */
  fsStat(id: string, path: string, scope?: Scope): Promise<FileEntry>;
  fsList(id: string, path: string, depth?: number, scope?: Scope): Promise<DirListing>;
  /** mkdir -p; `created` false when it already existed (a non-directory there is file_exists). */
  fsMkdir(id: string, path: string, opts?: MkdirOptions, scope?: Scope): Promise<{ created: boolean; entry: FileEntry }>;
  /** Recursive for a directory; symlinks are removed, never followed. */
  fsRemove(id: string, path: string, scope?: Scope): Promise<{ removed: number }>;
  /** rename(2): replaces a destination file. Answers the destination's entry. */
  fsRename(id: string, from: string, to: string, scope?: Scope): Promise<FileEntry>;
  fsWatch(id: string, path: string, recursive: boolean, handlers: WatchHandlers, scope?: Scope): Promise<DirWatch>;
  /** Streams a file of any size to `sink`; errors before the first byte throw before `start`. */
  downloadFile(id: string, path: string, sink: FileSink, scope?: Scope): Promise<{ size: number }>;
  /** Writes `source` beside `path` and renames it over `path` once complete: all or nothing. */
  uploadFile(id: string, path: string, source: AsyncIterable<Buffer | Uint8Array | string>, opts?: UploadOptions, scope?: Scope): Promise<FileEntry & { bytes: number }>;
  /** Reads the listening TCP ports inside a running sandbox (the last reading if an exec is running). */
  openPorts(id: string, scope?: Scope): Promise<OpenPort[]>;
  /**
   * Where to connect to reach `port` inside the sandbox. Throws network_unavailable when the server
   * runs without networking, invalid_state unless running.
   */
  portTarget(id: string, port: number, scope?: Scope): PortTarget;
  /** Number of running sandboxes the tenant holds (for tier caps). */
  countRunning(tenant: string): number;
  /**
   * Moves the end of a running sandbox's session (expires_at) to `endsAtMs`, earlier or later;
   * the reaper acts then. Only while it is running (invalid_state otherwise): a resume starts a new
   * session of timeout_secs. Tier limits are the caller's (the tenant service).
   */
  setSessionEnd(id: string, endsAtMs: number, scope?: Scope): SandboxInfo;
  /** Replaces its egress policy (the caller checked it against the template's): at once while running, at the resume while suspended. */
  setEgress(id: string, egress: EgressPolicy, scope?: Scope): Promise<SandboxInfo>;
}

/**
 * The most children one fork makes, for every door (REST, MCP, E2B, the SDKs): one fork point
 * feeds them all, and each is a VMM started at once.
 */
export const MAX_FORK_COUNT = 64;

/** Why `count` is not a fork count, in words for any door; undefined when it is one. */
export function forkCountProblem(count: unknown): string | undefined {
  return typeof count === 'number' && Number.isInteger(count) && count >= 1 && count <= MAX_FORK_COUNT
    ? undefined
    : `count must be a whole number from 1 to ${MAX_FORK_COUNT}, not ${JSON.stringify(count) ?? String(count)}.`;
}

/**
 * What a host's engine reports beside the sandbox operations (metrics, /healthz, live stats) and the
 * events it emits. Every member is optional: the real engine has them all, a fake or a client of a
 * remote host has those it can answer, and the tenant service reports what is there.
 */
export interface HostReadings {
  isReady?(): boolean;
  accel?: string;
  /** Guest restores in this process, by whether the guest acknowledged. */
  restoreCounts?(): { acknowledged: number; unacknowledged: number };
  /** Warm pool sizes by template. */
  poolSizes?(): Record<string, number>;
  /** Every pool: VMMs ready, the size it holds and why, creates served from it and not. */
  poolStatus?(): Record<string, { ready: number; target: number; reason: string; hits: number; misses: number }>;
  /** The host's budgets for admission and what is used of them. */
  capacity?(): CapacityStatus;
  /** Sandboxes paused for being quiescent: now, and pauses and wake-ups since start. */
  idlePauses?(): { pausedNow: number; paused: number; woken: number };
  /** VMMs spawned ahead of forks, ready and wanted, by artifact. */
  forkReceiverSizes?(): Record<string, { ready: number; target: number }>;
  /** CPU seconds so far and resident memory of these sandboxes' VMMs (those running in this process). */
  vmmUsage?(ids: readonly string[]): Map<string, { cpuSecs: number; rssBytes: number }>;
  /**
   * How full each of these sandboxes' root file system is (`df /` in the guest), asked of its agent.
   * Left out: sandboxes not running in this process, those paused for being idle (never woken for
   * this), and those whose agent cannot tell (one from before the request) or did not answer in time.
   */
  guestDiskUsage?(ids: readonly string[]): Promise<Map<string, GuestDiskUsage>>;
  /** Catalog templates still being built in the background, and those whose build failed. */
  catalogStatus?(): CatalogStatus;
  /** Whether sandboxes get a network, and why not. */
  networkStatus?(): { enabled: boolean; reason?: string };
  /** Blocked ranges the operator lets tenants' egress allowlists name; none when absent. */
  egressOpened?(): readonly string[];
  /** `transition` for every acknowledged state change, `phases` for each timed lifecycle operation. */
  on?(event: 'transition', listener: (t: SandboxTransition) => void): unknown;
  on?(event: 'phases', listener: (r: PhaseReport) => void): unknown;
  /** `reaped` when the reaper ends a session (suspends or deletes the sandbox). */
  on?(event: 'reaped', listener: (r: ReapedEvent) => void): unknown;
  /** `snapshotDeleted` once a snapshot's row is gone: what a door keeps beside it (E2B's envVars) can go too. */
  on?(event: 'snapshotDeleted', listener: (s: SnapshotDeleted) => void): unknown;
  off?(event: 'transition', listener: (t: SandboxTransition) => void): unknown;
  off?(event: 'phases', listener: (r: PhaseReport) => void): unknown;
  off?(event: 'reaped', listener: (r: ReapedEvent) => void): unknown;
  off?(event: 'snapshotDeleted', listener: (s: SnapshotDeleted) => void): unknown;
}

/** A guest's root file system: its size and what is used of it, bytes (df's Size and Used). */
export interface GuestDiskUsage {
  totalBytes: number;
  usedBytes: number;
}

/** What the reaper did to a sandbox whose session ended. */
export interface ReapedEvent {
  id: string;
  tenant: string;
  action: 'suspend' | 'delete';
}

/** Catalog templates still being built after the server began serving (step, seconds so far), and those whose build failed (why). */
export interface CatalogStatus {
  building: Record<string, { step: string; secs: number }>;
  failed: Record<string, string>;
}

/** The engine as the tenant service uses it: the sandbox operations and the readings it can give. */
export type ServiceEngine = SandboxService & HostReadings;
