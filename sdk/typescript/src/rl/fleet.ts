/**
 * The RL SDK's common interface. A Fleet creates sandboxes for one training run and tags every
 * sandbox it creates or forks with the run label `{collimate_run: <runId>}`, so a crashed trainer's
 * sandboxes can always be found and swept. Two implementations share it: connect() (over HTTP,
 * through the TypeScript SDK) and, inside a process that runs the Collimate server, its
 * createLocalFleet() (calling the tenant service directly, with no HTTP hop; it stays in the server's
 * repository, src/sdk/rl/local.ts). The helpers (bestOfN, treeSearch, map, sweep) are written once
 * against it.
 *
 * Stored states (snapshots) carry the run label too: a snapshot is kept until deleted
 * (fleet.deleteSnapshot) or until sweep, which deletes a run's snapshots with its sandboxes.
 */
import { randomBytes } from 'node:crypto';
import type { Execution } from '../code.js';
import type { ExecHandlers, ExecRequest, ExecResult, RunCodeOptions, SandboxInfo, SandboxState } from '../types.js';

/** The label key every sandbox of a run carries. */
export const RUN_LABEL = 'collimate_run';

export function newRunId(): string {
  const stamp = new Date().toISOString().slice(0, 19).replace(/[-:T]/g, '');
  return `run-${stamp}-${randomBytes(4).toString('hex')}`;
}

/** A fresh u64 seed as the API writes one (a decimal string), drawn as the server draws exec seeds. */
export function newSeed(): string {
  return randomBytes(8).readBigUInt64LE(0).toString();
}

/**
 * A stored state: a snapshot of a sandbox (memory, processes and files at one moment), kept until
 * deleted, independent of the sandbox it was taken of. The SDK's `Snapshot` has these fields too.
 */
export interface StoredState {
  readonly id: string;
  readonly name: string | null;
  readonly labels: Record<string, string>;
  /** The sandbox it was taken of: the only one that may `restore` it. */
  readonly sandbox_id: string;
}

/** A stored state by id, or as a fleet (or the SDK) returned it. */
export type StoredStateRef = string | { readonly id: string };

export function storedStateId(ref: StoredStateRef): string {
  return typeof ref === 'string' ? ref : ref.id;
}

export interface SnapshotOptions {
  name?: string;
  /** The run label is always added. */
  labels?: Record<string, string>;
}

/** One sandbox of a fleet. */
export interface Sandbox {
  readonly id: string;
  /** The fleet that made it (or got a handle on it). */
  readonly fleet: Fleet;
  /** As of creation (or the last call that returned it). */
  readonly info: SandboxInfo;
  /** Runs a command (the sandbox must be running); output streams to `handlers` when given. */
  exec(req: ExecRequest, handlers?: ExecHandlers): Promise<ExecResult>;
  /**
   * Runs a code cell in the sandbox's stateful kernel (the SDK's `runCode`: the python or node
   * template), always seeded: without `opts.seed` a fresh one is drawn (newSeed), as the server draws
   * one for every exec, so the result records it (`seed`) and `runCode(code, { seed: result.seed })`
   * replays the cell in the same kernel state (e.g. another fork of the same node). Aborting
   * `opts.signal`, or a callback that throws, interrupts the cell.
   */
  runCode(code: string, opts?: RunCodeOptions): Promise<Execution>;
  /** Forks into `n` children that keep this sandbox's memory and processes (running or suspended: it stays as it is); they carry the run label. */
  fork(n: number, opts?: { labels?: Record<string, string> }): Promise<Sandbox[]>;
  /** Stores this moment (running or suspended: it stays as it is); counts against the snapshot quotas until fleet.deleteSnapshot. */
  snapshot(opts?: SnapshotOptions): Promise<StoredState>;
  /** Rolls this sandbox back, in place, to one of its own stored states (another sandbox's: SnapshotMismatchError; start new sandboxes from it with fleet.fromSnapshot). */
  restore(state: StoredStateRef): Promise<void>;
  suspend(): Promise<void>;
  resume(): Promise<void>;
  delete(): Promise<void>;
  readFile(path: string): Promise<Buffer>;
  writeFile(path: string, data: string | Uint8Array, mode?: number): Promise<void>;
  /** `await using sb = await fleet.create('base')` deletes it on scope exit. */
  [Symbol.asyncDispose](): Promise<void>;
}

export interface CreateOptions {
  labels?: Record<string, string>;
  timeoutSecs?: number;
}

export interface Fleet {
  readonly runId: string;
  /** `{collimate_run: runId}`: merged into the labels of everything this fleet creates or forks. */
  readonly runLabel: Record<string, string>;
  create(template: string, opts?: CreateOptions): Promise<Sandbox>;
  /** Starts `n` running sandboxes from a stored state (fresh identities, the state's memory, processes and files); they carry the run label, so sweep deletes them. */
  fromSnapshot(state: StoredStateRef, n: number, opts?: CreateOptions): Promise<Sandbox[]>;
  /** Deletes a stored state; sandboxes started from it run on. NotFoundError when it is already gone. */
  deleteSnapshot(state: StoredStateRef): Promise<void>;
  /** Ids of the tenant's sandboxes matching every label (all pages). */
  listIds(filter: { labels?: Record<string, string>; state?: SandboxState }): Promise<string[]>;
  /** Ids of the tenant's stored states (snapshots) matching every label (all pages). */
  listSnapshotIds(filter: { labels?: Record<string, string> }): Promise<string[]>;
  /** Deletes by id; NotFoundError when it is already gone. */
  deleteById(id: string): Promise<void>;
  /** Deletes every sandbox and stored state carrying the run label of `runId` (default: this fleet's run). Returns how many of both. */
  sweep(runId?: string, opts?: SweepOptions): Promise<number>;
}

export interface SweepOptions {
  /** After the list comes back empty, wait this long and look once more (creates in flight when a trainer died land late). Default 2000 ms: a live fork on a loaded TCG host can take a second or more to land. */
  quietMs?: number;
  /** Give up after this many rounds (default 30). */
  maxRounds?: number;
}
