/**
 * Wire types of the SDK. They are the REST API's own schemas (src/wire/schemas.ts of the server),
 * rendered into wire.generated.ts when the package is built; a unit test fails when the two differ,
 * so the SDK cannot drift from the contract. Type-only: the SDK has no runtime dependency.
 */
import type * as Wire from './wire.generated.js';

export type SandboxInfo = Wire.Sandbox;
export type SandboxState = Wire.SandboxState;
export type Template = Wire.Template;
/**
 * A kept moment of a sandbox (its memory, processes and files): start sandboxes from it
 * (`client.sandboxes.fromSnapshot`) or roll the sandbox it was taken of back to it (`sb.restore`).
 */
export type Snapshot = Wire.Snapshot;
export type ExecFile = Wire.ExecFile;
/** `"none"`, `"allow"` or `{ domains?, cidrs?, ports? }`; the server answers with the normalised form. */
export type EgressPolicy = Wire.EgressPolicy;
/** A TCP port a server listens on inside the sandbox; `url` is where the ports proxy serves it (needs the key). */
export type OpenPort = Wire.OpenPort;
export type FileEntry = Wire.FileEntry;
export type FsListing = Wire.FsListing;
export type FsChangeEvent = Wire.FsChangeEvent;
export type FsWatchEndEvent = Wire.FsWatchEndEvent;
/** What `files.watch()` yields: changes, then (if the watch ends on its own) one `end` with the reason. */
export type WatchEvent = ({ type: 'change' } & Wire.FsChangeEvent) | ({ type: 'end' } & Wire.FsWatchEndEvent);
export type PortUrl = Wire.PortUrl;
/**
 * Exactly one of `command` (a /bin/sh -c string), `code` (run by the template's interpreter) or
 * `commands` (argv lists run in order, stopping at the first failure). `seed` replays an exec's
 * randomness (see ExecResult.seed).
 */
export type ExecRequest = Wire.ExecRequest;
export type ExecResult = Wire.ExecResult;

/** One event of a streamed exec: output chunks (raw bytes, possibly splitting UTF-8), then the result. */
export type ExecEvent =
  | { type: 'stdout'; data: Buffer }
  | { type: 'stderr'; data: Buffer }
  | { type: 'result'; result: ExecResult };

/** One entry of a sandbox's log (`sb.logs()`): `fields` say it for programs (`event`, `command`, `exit_code`, `pid`…). */
export type SandboxLogEntry = Wire.SandboxLogEntry;
/** `debug`, `info`, `warn`, `error`, least severe first. */
export type LogLevel = Wire.LogLevel;

/** A background process (sb.processes). */
export type ProcessInfo = Wire.Process;
/** Exactly one of `command` (a /bin/sh -c string) or `argv`; `stdin`, `pty`, `env`, `cwd`, `tag` optional. */
export type ProcessStartRequest = Wire.ProcessStartRequest;
/** One event of a process's output stream; `offset` places a chunk in everything it wrote. */
export type ProcessOutputEvent =
  | { type: 'stdout' | 'stderr' | 'pty'; data: Buffer; offset: number }
  | { type: 'gap'; from: number; to: number }
  | { type: 'exit'; process: ProcessInfo };

/** A cell's outcome as the API sends it; `sb.runCode` returns it as an Execution (with `text`). */
export type CodeResult = Wire.CodeResult;
/** One output of a cell, a MIME bundle (`text/plain` always): the last expression's value (`is_main_result`) or a display. */
export type CodeOutput = Wire.CodeOutput;
/** An exception a cell raised: its class (`name`), message (`value`) and plain-text traceback. */
export type CodeError = Wire.CodeError;
/** A kernel with its own state and working directory (`sb.createCodeContext`). */
export type CodeContext = Wire.CodeContext;
/** `python` (IPython, in the python template) or `javascript` (Node.js, in the node template). */
export type CodeLanguage = NonNullable<Wire.RunCodeRequest['language']>;

export interface RunCodeOptions {
  /** That language's default context (made on first use). Absent, with no `context`: python where the image has it. */
  language?: CodeLanguage;
  /** A context from createCodeContext (its id or itself); not with `language`. */
  context?: string | CodeContext;
  /** Environment variables for this cell only. */
  env?: Record<string, string>;
  /** Seconds the cell may run before it is interrupted (`timed_out`); default 300, at most 3600. */
  timeoutSecs?: number;
  /**
   * Reseeds the language's own generators before the cell (Python's random and numpy.random,
   * JavaScript's Math.random), a decimal u64 string: the same seed in the same kernel state replays
   * the cell. Absent: they go on as they are.
   */
  seed?: string;
  /** Printed text as it comes. */
  onStdout?(text: string): void;
  onStderr?(text: string): void;
  /** Each display (a shown figure, display()) and the main value, as they come. */
  onResult?(output: CodeOutput): void;
  /** The exception the cell raised, as it is raised. */
  onError?(error: CodeError): void;
  /** Aborting it interrupts the cell and rejects with its AbortError. */
  signal?: AbortSignal;
}

export interface CreateCodeContextParams {
  /** Default: python where the image has it. */
  language?: CodeLanguage;
  /** Its working directory (must exist); default the home. */
  cwd?: string;
}

export interface ExecHandlers {
  onStdout?(chunk: Buffer): void;
  onStderr?(chunk: Buffer): void;
}

export interface CreateSandboxParams {
  /** Template or catalog image id (see `client.images()`), e.g. `base`. */
  template: string;
  labels?: Record<string, string>;
  /**
   * Session length in seconds: the sandbox is reaped this long after each start (create, resume),
   * unless `sandbox.setTimeout()` moves the end. Default and maximum depend on the tier.
   */
  timeoutSecs?: number;
  /** Narrows the template's egress policy (wider: EgressForbiddenError). Default: the template's. */
  egress?: EgressPolicy;
  /**
   * Its ports answer anyone through the ports proxy (by path and by `<port>-<id>.<domain>`) without
   * a key, traffic token or signed URL; nothing else of the sandbox opens. Forks keep it. Default false.
   */
  publicPorts?: boolean;
  /** The Host header its servers see through the ports proxy, `${PORT}` replaced (e.g. `localhost:${PORT}`). Default `localhost:<port>`. */
  portHost?: string;
  /**
   * false: a suspend that does not say (`sandbox.suspend()`, or the session's end with on_timeout
   * suspend) keeps only its files, and the resume boots it afresh. Default true (memory and processes kept).
   */
  keepMemory?: boolean;
}

export interface SuspendParams {
  /**
   * false: keep only the files (quick; the resume boots the guest afresh, so its processes and what
   * lay in /tmp are gone). Default: the sandbox's `keep_memory` (true unless created otherwise).
   */
  keepMemory?: boolean;
}

export interface PortUrlParams {
  /** Lifetime in seconds, 1..604800 (7 days); default 3600. */
  expiresInSecs?: number;
}

export interface ListSandboxesParams {
  state?: SandboxState;
  /** Every label must match. */
  labels?: Record<string, string>;
  /** Page size, 1..1000 (default 100). */
  limit?: number;
}

export interface SnapshotParams {
  /** A name to show, 1..128 characters; not unique. */
  name?: string;
  labels?: Record<string, string>;
}

export interface FromSnapshotParams {
  /** The started sandboxes' labels (the snapshot's sandbox's are not carried over). */
  labels?: Record<string, string>;
  /** Session length in seconds. Default: the tier's default session, else that of the sandbox the snapshot was taken of. */
  timeoutSecs?: number;
  /** Narrows the snapshot's egress policy (wider: EgressForbiddenError). Default: the snapshot's. */
  egress?: EgressPolicy;
  /** What happens when the session ends: `delete`, or `suspend`. */
  onTimeout?: 'delete' | 'suspend';
  /** While suspended, a request that needs it running resumes it first. */
  autoResume?: boolean;
  /** Its ports answer without a key or token. Default: the snapshot's. */
  publicPorts?: boolean;
  /** The Host header its servers see through the ports proxy, `${PORT}` replaced. Default: the snapshot's. */
  portHost?: string;
  /** false: a suspend that does not say keeps only its files. Default: the snapshot's. */
  keepMemory?: boolean;
}

export interface ListSnapshotsParams {
  /** Only snapshots of this sandbox. */
  sandboxId?: string;
  /** Every label must match. */
  labels?: Record<string, string>;
  /** Page size, 1..1000 (default 100). */
  limit?: number;
}

export interface ForkParams {
  /** Labels for the children (merged over the parent's). */
  labels?: Record<string, string>;
}

export interface SandboxLogsParams {
  /** Where to start (inclusive): forward, entries at or after it (default the oldest kept); backward, at or before it (default the newest). ms since the epoch, or a Date. */
  cursor?: number | Date;
  /** `forward` (default): oldest first; `backward`: newest first. */
  direction?: 'forward' | 'backward';
  /** The least severe level returned (default `debug`: every entry). */
  level?: LogLevel;
  /** Only entries whose message contains this, case-sensitive (at most 256 characters). */
  search?: string;
  /** At most this many, 1..1000 (default 1000). */
  limit?: number;
}
