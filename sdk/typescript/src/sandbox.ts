/**
 * A sandbox handle: one microVM on the server. Methods mirror the REST operations; state-changing
 * calls refresh `info` from the server's answer.
 */
import { randomUUID } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { rename, rm, stat } from 'node:fs/promises';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { ConnectionError, errorFromBody, NotFoundError } from './errors.js';
import { parseSse as parseSseStream, type Transport } from './transport.js';
import { SandboxProcesses } from './processes.js';
import { codeContextId, Execution } from './code.js';
import type {
  CodeContext, CodeResult, CreateCodeContextParams, EgressPolicy, ExecEvent, ExecHandlers, ExecRequest, ExecResult, FileEntry, ForkParams, FsListing, OpenPort, PortUrl, PortUrlParams, SandboxInfo, SandboxLogEntry,
  RunCodeOptions, SandboxLogsParams, SandboxState, Snapshot, SnapshotParams, SuspendParams, WatchEvent,
} from './types.js';

/** Client-side slack over the exec's own timeout before the SDK gives up waiting. */
const EXEC_TIMEOUT_SLACK_MS = 30_000;
const DEFAULT_EXEC_TIMEOUT_SECS = 60;
const DEFAULT_CODE_TIMEOUT_SECS = 300;
/**
 * Slack for code calls over their own time: where the template baked no interpreter the server
 * first installs and starts it (an exec of up to 330 s), and a new kernel may take up to 240 s.
 */
const CODE_SLACK_MS = 600_000;
/** Fork, resume, snapshots and rollbacks save or restore whole VMs: give them longer than a plain request. */
const LIFECYCLE_TIMEOUT_MS = 300_000;

export class Sandbox {
  /** The server's view of the sandbox as of the last call that returned it (see refresh()). */
  info: SandboxInfo;
  readonly files: SandboxFiles;
  /** Background processes: start one, list them, attach to their output, send input, signal. */
  readonly processes: SandboxProcesses;

  constructor(private readonly http: Transport, info: SandboxInfo) {
    this.info = info;
    this.files = new SandboxFiles(http, info.id);
    this.processes = new SandboxProcesses(http, info.id);
  }

  get id(): string {
    return this.info.id;
  }
  get state(): SandboxState {
    return this.info.state;
  }
  get labels(): Record<string, string> {
    return this.info.labels;
  }
  get template(): string {
    return this.info.template;
  }
  /** The sandbox this one was live-forked from (null for a template create). */
  get parent(): string | null {
    return this.info.parent;
  }
  /** The snapshot this sandbox was started from, or last rolled back to (null if neither). */
  get fromSnapshot(): string | null {
    return this.info.from_snapshot;
  }
  /** What the sandbox may reach: its template's egress policy, or the narrower one given at create. */
  get egress(): EgressPolicy {
    return this.info.egress;
  }
  /** Whether its ports answer anyone, without a key or token (set at create). */
  get publicPorts(): boolean {
    return this.info.public_ports;
  }
  /** The Host header template its servers see through the ports proxy; null: `localhost:<port>`. */
  get portHost(): string | null {
    return this.info.port_host;
  }

  private path(suffix = ''): string {
    return `/v1/sandboxes/${encodeURIComponent(this.info.id)}${suffix}`;
  }

  /** Re-reads the sandbox from the server. */
  async refresh(): Promise<this> {
    this.info = await this.http.json<SandboxInfo>({ method: 'GET', path: this.path(), retry: 'safe' });
    return this;
  }

  /**
   * Runs a command; the sandbox must be running (InvalidStateError otherwise). Execs in one sandbox
   * run one at a time, in order. With `onStdout`/`onStderr` the output is streamed to them as it is
   * produced (SSE); the result still carries the whole (capped) output. Never retried: a command
   * must not run twice behind your back.
   */
  async exec(req: ExecRequest, handlers?: ExecHandlers): Promise<ExecResult> {
    if (!handlers || (!handlers.onStdout && !handlers.onStderr)) {
      return this.http.json<ExecResult>({ method: 'POST', path: this.path('/exec'), json: req, retry: 'none', timeoutMs: execTimeoutMs(req) });
    }
    for await (const ev of this.execStream(req)) {
      if (ev.type === 'stdout') handlers.onStdout?.(ev.data);
      else if (ev.type === 'stderr') handlers.onStderr?.(ev.data);
      else return ev.result;
    }
    throw new Error('unreachable: execStream ends with its result');
  }

  /**
   * Runs a command and yields its output as it is produced: `{type: 'stdout'|'stderr', data}` chunks
   * (raw bytes), then one `{type: 'result', result}`. Breaking out of the loop stops receiving; the
   * command itself runs to completion in the sandbox.
   */
  async *execStream(req: ExecRequest): AsyncGenerator<ExecEvent, void, undefined> {
    for await (const ev of this.http.sse({ method: 'POST', path: this.path('/exec'), json: req, retry: 'none', timeoutMs: execTimeoutMs(req) })) {
      const payload = JSON.parse(ev.data);
      if (ev.event === 'stdout' || ev.event === 'stderr') {
        yield { type: ev.event, data: Buffer.from(payload.data, 'base64') };
      } else if (ev.event === 'result') {
        yield { type: 'result', result: payload as ExecResult };
        return;
      } else if (ev.event === 'error') {
        throw errorFromBody(undefined, payload);
      }
    }
    throw errorFromBody(undefined, { error: { code: 'stream_ended', message: 'The exec stream ended without a result.' } });
  }

  /**
   * Runs a cell of `code` in a kernel that keeps its state between cells (variables, imports,
   * loaded data): the language's default context, or `opts.context` (createCodeContext). The python
   * and node templates have their kernel warm; another image gets one started by its first cell
   * (CodeUnavailableError where it cannot: no python3). An exception in the cell is the result's
   * `error`, not a throw. With any of `onStdout`, `onStderr`, `onResult`, `onError` or `signal` the
   * cell streams (SSE) and they see its output as it comes; aborting `signal`, or a callback that
   * throws, closes the stream, which interrupts the cell. The sandbox must be running. Never retried.
   */
  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    const spec = {
      method: 'POST' as const,
      path: this.path('/code'),
      json: { code, language: opts.language, context: opts.context === undefined ? undefined : codeContextId(opts.context), env: opts.env, timeout_secs: opts.timeoutSecs, seed: opts.seed },
      retry: 'none' as const,
      timeoutMs: (opts.timeoutSecs ?? DEFAULT_CODE_TIMEOUT_SECS) * 1000 + CODE_SLACK_MS,
    };
    if (!opts.onStdout && !opts.onStderr && !opts.onResult && !opts.onError && !opts.signal) {
      return new Execution(await this.http.json<CodeResult>(spec));
    }
    for await (const ev of this.http.sse({ ...spec, signal: opts.signal })) {
      const payload = JSON.parse(ev.data);
      if (ev.event === 'stdout') opts.onStdout?.(payload.text);
      else if (ev.event === 'stderr') opts.onStderr?.(payload.text);
      else if (ev.event === 'display') opts.onResult?.(payload);
      else if (ev.event === 'exception') opts.onError?.(payload);
      else if (ev.event === 'result') return new Execution(payload as CodeResult);
      else if (ev.event === 'error') throw errorFromBody(undefined, payload);
    }
    throw errorFromBody(undefined, { error: { code: 'stream_ended', message: 'The code stream ended without a result.' } });
  }

  /** The code interpreter's contexts: the default ones (one per language, made by a first cell in it) and those created. */
  async listCodeContexts(): Promise<CodeContext[]> {
    return (await this.http.json<{ contexts: CodeContext[] }>({ method: 'GET', path: this.path('/code/contexts'), retry: 'safe', timeoutMs: CODE_SLACK_MS })).contexts;
  }

  /** Starts a context: a kernel of its own (`language`, default python where the image has it), with its own state and working directory `cwd`. Never retried. */
  createCodeContext(params: CreateCodeContextParams = {}): Promise<CodeContext> {
    return this.http.json<CodeContext>({ method: 'POST', path: this.path('/code/contexts'), json: { language: params.language, cwd: params.cwd }, timeoutMs: CODE_SLACK_MS });
  }

  /** Gives the context a fresh kernel: its variables are gone; same id and working directory. NotFoundError (context_not_found) if there is none. */
  restartCodeContext(context: string | CodeContext): Promise<CodeContext> {
    return this.http.json<CodeContext>({ method: 'POST', path: this.path(`/code/contexts/${encodeURIComponent(codeContextId(context))}/restart`), timeoutMs: CODE_SLACK_MS });
  }

  /** Interrupts the cell the context is running (Python raises KeyboardInterrupt in it); nothing when it is idle. */
  interruptCodeContext(context: string | CodeContext): Promise<CodeContext> {
    return this.http.json<CodeContext>({ method: 'POST', path: this.path(`/code/contexts/${encodeURIComponent(codeContextId(context))}/interrupt`), timeoutMs: CODE_SLACK_MS });
  }

  /** Stops the context's kernel and forgets it. */
  async removeCodeContext(context: string | CodeContext): Promise<void> {
    await this.http.json<void>({ method: 'DELETE', path: this.path(`/code/contexts/${encodeURIComponent(codeContextId(context))}`), timeoutMs: CODE_SLACK_MS });
  }

  /**
   * What happened to the sandbox, as the server wrote it down: lifecycle changes, every exec (its
   * command on one line, exit code, duration), background processes' starts and exits, the reaper,
   * snapshots and failures of the guest — its last 1000 entries, never stdin, env values or files.
   * Oldest first from `cursor`, or newest first with `direction: 'backward'`; to read on, pass the
   * last entry's time + 1 ms (− 1 backward).
   */
  async logs(params: SandboxLogsParams = {}): Promise<SandboxLogEntry[]> {
    const cursor = params.cursor instanceof Date ? params.cursor.getTime() : params.cursor;
    const query = { cursor, direction: params.direction, level: params.level, search: params.search, limit: params.limit };
    return (await this.http.json<{ logs: SandboxLogEntry[] }>({ method: 'GET', path: this.path('/logs'), query, retry: 'safe' })).logs;
  }

  /**
   * Forks this sandbox into `n` running children that keep its memory and processes. A running
   * parent keeps running (live fork); a suspended one stays suspended. Each child counts against the
   * tier's cap. Safe to retry (idempotency key).
   */
  async fork(n = 1, params: ForkParams = {}): Promise<Sandbox[]> {
    const body: Record<string, unknown> = { count: n };
    if (params.labels) body.labels = params.labels;
    const r = await this.http.json<{ sandboxes: SandboxInfo[] }>({
      method: 'POST',
      path: this.path('/fork'),
      json: body,
      headers: { 'idempotency-key': randomUUID() },
      retry: 'idempotent',
      timeoutMs: LIFECYCLE_TIMEOUT_MS,
    });
    return r.sandboxes.map((info) => new Sandbox(this.http, info));
  }

  /**
   * Keeps this moment of the running or suspended sandbox — its memory, processes and files — as a
   * snapshot, kept until deleted (`client.snapshots.delete`). A running sandbox pauses as briefly as
   * for a fork and runs on. Start sandboxes from it (`client.sandboxes.fromSnapshot`) or roll this
   * sandbox back to it (`restore`). Counts against the quotas `snapshots` and `snapshot_mib`
   * (QuotaExceededError). Never retried: a repeat would keep a second snapshot.
   */
  async snapshot(params: SnapshotParams = {}): Promise<Snapshot> {
    const body: Record<string, unknown> = {};
    if (params.name !== undefined) body.name = params.name;
    if (params.labels) body.labels = params.labels;
    return this.http.json<Snapshot>({ method: 'POST', path: this.path('/snapshots'), json: body, timeoutMs: LIFECYCLE_TIMEOUT_MS });
  }

  /**
   * Rolls this sandbox back to one of its own snapshots, in place (same id): its memory, processes
   * and files become the snapshot's. A running sandbox runs on from that moment; a suspended one
   * stays suspended at it. Requests queued on it behind the rollback fail with SandboxRestoredError;
   * a snapshot of another sandbox is a SnapshotMismatchError (start a new sandbox from it instead).
   * Refreshes `info`. Never retried.
   */
  async restore(snapshot: string | Snapshot): Promise<this> {
    this.info = await this.http.json<SandboxInfo>({ method: 'POST', path: this.path('/restore'), json: { snapshot: snapshotId(snapshot) }, timeoutMs: LIFECYCLE_TIMEOUT_MS });
    return this;
  }

  /**
   * The TCP ports servers listen on inside the sandbox right now (re-reads the sandbox), each with
   * the absolute `url` of the ports proxy (which needs this client's key; see portUrl for one that
   * does not).
   */
  async ports(): Promise<OpenPort[]> {
    await this.refresh();
    return this.info.ports.map((p) => ({ ...p, url: this.http.absolute(p.url) }));
  }

  /**
   * A signed, absolute URL of `port` that needs no key: anyone holding it reaches the port (HTTP and
   * WebSocket) until it expires (default 1 h, at most 7 days) or the sandbox is deleted. The port
   * need not be open yet. Retried like a GET: signing twice does nothing twice.
   */
  async portUrl(port: number, params: PortUrlParams = {}): Promise<string> {
    const body: Record<string, unknown> = { port };
    if (params.expiresInSecs !== undefined) body.expires_in_secs = params.expiresInSecs;
    const r = await this.http.json<PortUrl>({ method: 'POST', path: this.path('/port-urls'), json: body, retry: 'safe' });
    return this.http.absolute(r.url);
  }

  /**
   * An HTTP request to the server on `port` inside this running sandbox, through the ports proxy:
   * `sb.fetch(8000, '/api/items?x=1', { method: 'POST', body })`. Resolves with that server's own
   * Response, whatever its status; errors of the proxy itself throw (PortUnreachableError when
   * nothing listens, InvalidStateError when the sandbox is not running, NetworkUnavailableError).
   * Never retried.
   */
  fetch(port: number, path = '/', init: RequestInit = {}): Promise<Response> {
    const rest = path.startsWith('/') ? path : `/${path}`;
    return this.http.proxy(this.path(`/ports/${port}${rest}`), init);
  }

  /**
   * Suspends this running sandbox to disk: it stops counting against the cap until resumed. Its
   * memory and processes are kept, unless `keepMemory: false` (or the sandbox's `keep_memory`)
   * says to keep only its files; `info.memory_kept` then says which.
   */
  async suspend(params: SuspendParams = {}): Promise<this> {
    const body = params.keepMemory === undefined ? undefined : { keep_memory: params.keepMemory };
    this.info = await this.http.json<SandboxInfo>({ method: 'POST', path: this.path('/suspend'), ...(body ? { json: body } : {}), timeoutMs: LIFECYCLE_TIMEOUT_MS });
    return this;
  }

  /** Resumes this suspended sandbox with its memory and processes (one suspended with only its files boots afresh on them); takes a slot of the cap. */
  async resume(): Promise<this> {
    this.info = await this.http.json<SandboxInfo>({ method: 'POST', path: this.path('/resume'), timeoutMs: LIFECYCLE_TIMEOUT_MS });
    return this;
  }

  /**
   * Ends this running sandbox's session `timeoutSecs` seconds from now, sooner or later than before
   * (a lease); `info.expires_at` and `info.remaining_secs` show the new end, when the server deletes
   * it (or suspends it, as it is configured). The tier's maximum session counts from the session's
   * start (`info.session_started_at`): a lease past it is a TierForbiddenError whose
   * `details.max_timeout_secs` is the most still allowed. InvalidStateError unless running: a resume
   * starts a new session of `info.timeout_secs`. Retried like a GET: setting it twice is setting it.
   */
  async setTimeout(timeoutSecs: number): Promise<this> {
    this.info = await this.http.json<SandboxInfo>({ method: 'POST', path: this.path('/timeout'), json: { timeout_secs: timeoutSecs }, retry: 'safe' });
    return this;
  }

  /** Deletes the sandbox (running or suspended). */
  async delete(): Promise<void> {
    await this.http.json<void>({ method: 'DELETE', path: this.path() });
    this.info = { ...this.info, state: 'deleted' };
  }

  /** `await using sb = await client.sandboxes.create(...)` deletes it on scope exit. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.info.state === 'deleted') return;
    try {
      await this.delete();
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }
}

/** Uploads and downloads are bounded by the server's limits, not by this timeout: it covers the wait for an answer. */
const TRANSFER_TIMEOUT_MS = 600_000;

/**
 * A sandbox's files and directories. Paths are guest paths: absolute, or relative to /root (read and
 * write take absolute paths only, as they always have). Directory operations are answered while an
 * exec runs.
 */
export class SandboxFiles {
  constructor(private readonly http: Transport, private readonly id: string) {}

  private path(rest: string): string {
    return `/v1/sandboxes/${encodeURIComponent(this.id)}${rest}`;
  }

  /** Reads a whole file (absolute path) into memory. For large files use download()/downloadTo(). */
  read(path: string): Promise<Buffer> {
    return this.http.bytes({ method: 'GET', path: this.path('/files'), query: { path }, retry: 'safe' });
  }

  /**
   * Writes a file (absolute path; parent directories are created), replacing it whole; `mode` is octal, e.g. 0o755.
   * `user`: an account of the image it is written as (its permissions; the new file is its). Default root.
   */
  async write(path: string, data: string | Uint8Array, opts: { mode?: number; user?: string } = {}): Promise<{ path: string; size: number }> {
    return this.http.json({
      method: 'PUT',
      path: this.path('/files'),
      query: { path, mode: octal(opts.mode), user: opts.user },
      raw: typeof data === 'string' ? Buffer.from(data, 'utf8') : data,
    });
  }

  /**
   * Uploads from a stream (or bytes) without holding it in memory: the server writes it beside
   * `path` and renames it over `path` once complete, so an interrupted upload leaves nothing.
   * Over the server's limit: PayloadTooLargeError.
   */
  async upload(path: string, source: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array> | Uint8Array, opts: { mode?: number; signal?: AbortSignal } = {}): Promise<{ path: string; size: number }> {
    const body = source instanceof Uint8Array || source instanceof ReadableStream ? source : (Readable.toWeb(Readable.from(source)) as ReadableStream<Uint8Array>);
    const res = await this.http.open({ method: 'PUT', path: this.path('/files'), query: { path, mode: octal(opts.mode) }, body, signal: opts.signal, timeoutMs: TRANSFER_TIMEOUT_MS });
    return (await res.json()) as { path: string; size: number };
  }

  /** Uploads a local file, streamed. */
  uploadFrom(localPath: string, path: string, opts: { mode?: number; signal?: AbortSignal } = {}): Promise<{ path: string; size: number }> {
    return this.upload(path, Readable.toWeb(createReadStream(localPath)) as ReadableStream<Uint8Array>, opts);
  }

  /** Downloads a file as a stream of chunks (any size); `size` is its Content-Length. */
  async download(path: string, opts: { signal?: AbortSignal } = {}): Promise<{ size: number; mode: number; stream: ReadableStream<Uint8Array> }> {
    const res = await this.http.open({ method: 'GET', path: this.path('/files'), query: { path }, signal: opts.signal, timeoutMs: TRANSFER_TIMEOUT_MS });
    if (!res.body) throw new ConnectionError('The server sent no body.', { code: 'stream_ended', status: res.status });
    return { size: Number(res.headers.get('content-length') ?? -1), mode: parseInt(res.headers.get('x-file-mode') ?? '644', 8), stream: res.body };
  }

  /**
   * Downloads a file to `localPath`, streamed, through a temporary file renamed into place once the
   * whole file arrived (a broken download leaves no partial file). Resolves with its size.
   */
  async downloadTo(path: string, localPath: string, opts: { signal?: AbortSignal } = {}): Promise<{ size: number }> {
    const { size, stream } = await this.download(path, opts);
    const partial = `${localPath}.partial-${randomUUID().slice(0, 8)}`;
    try {
      await pipeline(Readable.fromWeb(stream as import('node:stream/web').ReadableStream<Uint8Array>), createWriteStream(partial) as Writable);
      const got = (await stat(partial)).size;
      if (size >= 0 && got !== size) throw new ConnectionError(`The download of ${path} broke off at ${got} of ${size} bytes.`, { code: 'connection_failed', status: 0 });
      await rename(partial, localPath);
      return { size: got };
    } catch (e) {
      await rm(partial, { force: true });
      if (e instanceof Error && e.name === 'AbortError') throw e;
      if (e instanceof ConnectionError) throw e;
      throw new ConnectionError(`The download of ${path} broke off (${(e as Error).message}).`, { code: 'connection_failed', status: 0, cause: e });
    }
  }

  /** The entry at `path` (a symlink is described, not followed). */
  stat(path: string): Promise<FileEntry> {
    return this.http.json({ method: 'GET', path: this.path('/fs/stat'), query: { path }, retry: 'safe' });
  }

  /** Whether anything is at `path`. */
  async exists(path: string): Promise<boolean> {
    return (await this.http.json<{ exists: boolean }>({ method: 'GET', path: this.path('/fs/exists'), query: { path }, retry: 'safe' })).exists;
  }

  /** Entries of directory `path`, `depth` levels down (1: its own; at most 5000, see `truncated`). */
  list(path: string, opts: { depth?: number } = {}): Promise<FsListing> {
    return this.http.json({ method: 'GET', path: this.path('/fs/list'), query: { path, depth: opts.depth }, retry: 'safe' });
  }

  /**
   * mkdir -p with `mode` (octal, e.g. 0o750; default 0o755); `created` is false if it existed. Retried: making it twice is making it.
   * `user`: an account of the image it is made as (the directories made are its). Default root.
   */
  mkdir(path: string, opts: { mode?: number; user?: string } = {}): Promise<{ created: boolean; entry: FileEntry }> {
    return this.http.json({ method: 'POST', path: this.path('/fs/mkdir'), json: { path, ...(opts.mode === undefined ? {} : { mode: octal(opts.mode) }), ...(opts.user === undefined ? {} : { user: opts.user }) }, retry: 'safe' });
  }

  /** Removes a file, or a directory with everything in it (symlinks are not followed). */
  remove(path: string): Promise<{ path: string; removed: number }> {
    return this.http.json({ method: 'POST', path: this.path('/fs/remove'), json: { path } });
  }

  /** Renames (moves) `from` to `to`, replacing a file there; resolves with the entry at `to`. */
  rename(from: string, to: string): Promise<FileEntry> {
    return this.http.json({ method: 'POST', path: this.path('/fs/rename'), json: { from, to } });
  }

  /**
   * Watches directory `path` (with `recursive`, its subdirectories too). Yields `change` events;
   * if the watch ends on its own (the directory went, the sandbox was suspended or deleted) one
   * `end` event with the reason, and the iteration stops. Stopping the iteration (break, or
   * `signal`) stops the watch.
   */
  async *watch(path: string, opts: { recursive?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<WatchEvent> {
    const res = await this.http.open({ method: 'GET', path: this.path('/fs/watch'), query: { path, recursive: opts.recursive ? 'true' : undefined }, headers: { accept: 'text/event-stream' }, signal: opts.signal });
    if (!res.body) throw new ConnectionError('The server sent no stream.', { code: 'stream_ended', status: res.status });
    const reader = res.body;
    try {
      for await (const ev of parseSseStream(reader)) {
        const data = JSON.parse(ev.data);
        if (ev.event === 'change') yield { type: 'change', ...data };
        else if (ev.event === 'end') {
          yield { type: 'end', ...data };
          return;
        } else if (ev.event === 'error') throw errorFromBody(undefined, data);
      }
    } catch (e) {
      if (opts.signal?.aborted) return;
      throw e;
    } finally {
      await reader.cancel().catch(() => undefined);
    }
  }
}

/** @internal A snapshot argument: its id, or the snapshot as the API returned it. */
export function snapshotId(snapshot: string | Snapshot): string {
  return typeof snapshot === 'string' ? snapshot : snapshot.id;
}

function octal(mode: number | undefined): string | undefined {
  return mode === undefined ? undefined : mode.toString(8).padStart(3, '0');
}

function execTimeoutMs(req: ExecRequest): number {
  return (req.timeout ?? DEFAULT_EXEC_TIMEOUT_SECS) * 1000 + EXEC_TIMEOUT_SLACK_MS;
}
