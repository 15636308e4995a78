/**
 * Talks to one guest agent over a connected stream (the QEMU virtio-serial chardev
 * socket, or a test-mode agent's unix socket).
 *
 * Execs and file transfers are serialized: one of them is in flight at a time (the
 * agent runs a single exec anyway, and strict ordering keeps a file's chunks in
 * order). Other requests (`concurrentRequest`: process control, directory
 * operations) go out at once beside them; every reply carries its request's id.
 * Frames with id 0 that are not ERROR are events (process output, process exit,
 * watch events): they are emitted as 'event'. Receive-side memory is bounded by
 * the frame decoder (one frame), the exec output caps and the readFile limit.
 */
import { EventEmitter } from 'node:events';
import { randomInt } from 'node:crypto';
import type { Duplex } from 'node:stream';
import {
  DEFAULT_MAX_OUTPUT,
  ErrorCode,
  FILE_CHUNK_MAX,
  FrameDecoder,
  MessageType,
  ProtocolError,
  decodeError,
  decodeExecResult,
  decodeFileData,
  decodeFsEntries,
  decodeFsEntry,
  decodeFsEvent,
  decodeFsRemoved,
  decodeFsUsage,
  decodeFsWatching,
  decodePong,
  decodeProcStarted,
  decodeProcTable,
  encodeExec,
  encodeProcInput,
  encodeProcPid,
  encodeProcResize,
  encodeProcSignal,
  encodeProcStart,
  encodeFileRead,
  encodeFileWrite,
  encodeFrame,
  encodeFsList,
  encodeFsMkdir,
  encodeFsRemove,
  encodeFsRename,
  encodeFsStat,
  encodeFsUnwatch,
  encodeFsWatch,
  encodePing,
  encodeRestored,
  encodeSetTime,
  type ExecRequest,
  type ExecResult,
  type FileData,
  type Frame,
  type FsEntry,
  type FsEvent,
  type FsListing,
  type FsRemoved,
  type FsUsage,
  type Pong,
  type ProcEntry,
  type ProcStartRequest,
  type ProcStarted,
  type RestoredRequest,
} from './protocol.js';

/** Codes raised by the client itself, next to the guest's ErrorCode values. */
export const ClientErrorCode = {
  Disconnected: 'agent_disconnected',
  Timeout: 'timeout',
  FileTooLarge: 'file_too_large',
  /** The request cannot be encoded (invalid field, or larger than one frame). */
  InvalidRequest: 'invalid_request',
  UnexpectedReply: 'unexpected_reply',
  /** A streamed read found the file shorter than it was when the read began. */
  FileChanged: 'file_changed',
} as const;

export class AgentError extends Error {
  override name = 'AgentError';
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export interface AgentClientOptions {
  /** readFile refuses files larger than this (default 64 MiB). */
  maxReadFileBytes?: number;
}

export interface ExecHandlers {
  onStdout?(chunk: Buffer): void;
  onStderr?(chunk: Buffer): void;
  /** Client-side limit on waiting for the result; the guest's own timeout is req.timeoutMs. */
  timeoutMs?: number;
}

export interface ExecOutcome {
  result: ExecResult;
  stdout: Buffer;
  stderr: Buffer;
}

export interface ReadFileOptions {
  maxBytes?: number;
}

/** Where a streamed download's bytes go; awaiting `chunk` paces the reads (memory stays one chunk). */
export interface FileSink {
  /** Called once, before any chunk, with the size the file has when the read begins (-1: unknown, a /proc or /sys file). */
  start?(info: { size: number; mode: number }): void | Promise<void>;
  chunk(data: Buffer): void | Promise<void>;
}

export interface UploadOptions {
  /** Written there first, then renamed over the target once complete. */
  tempPath: string;
  /** Permission bits of the new file (default 0644). */
  mode?: number;
  /** Refused with file_too_large past this many bytes (the temporary file is removed). */
  maxBytes?: number;
  /** Written, renamed and (on failure) removed as this account of the image; relative paths are under its home. */
  user?: string;
  /** user.* extended attributes the new file gets (names without `user.`). */
  xattrs?: Record<string, string>;
}

/** Directory operations answer within this long (the agent bounds the work of each request). */
const FS_REQUEST_TIMEOUT_MS = 30_000;

const DEFAULT_MAX_READ_FILE_BYTES = 64 * 1024 * 1024;
const MAX_REQUEST_ID = 0xffffffff;

interface PendingRequest {
  id: number;
  onFrame(frame: Frame): void;
  fail(error: AgentError): void;
}

/** Keeps at most `cap` bytes of a stream; the guest caps too, this guards against a misbehaving one. */
class CappedBuffer {
  private parts: Buffer[] = [];
  private length = 0;

  constructor(private readonly cap: number) {}

  append(chunk: Buffer): void {
    const room = this.cap - this.length;
    if (room <= 0) return;
    const kept = chunk.length <= room ? chunk : chunk.subarray(0, room);
    this.parts.push(kept);
    this.length += kept.length;
  }

  toBuffer(): Buffer {
    return Buffer.concat(this.parts, this.length);
  }
}

function errorFromFrame(frame: Frame): AgentError {
  try {
    const { code, message } = decodeError(frame.payload);
    return new AgentError(code, message);
  } catch (e) {
    return new AgentError(ClientErrorCode.UnexpectedReply, `undecodable ERROR frame: ${(e as Error).message}`);
  }
}

/**
 * Events: 'event' (Frame) for the agent's event frames (id 0); 'guestError'
 * (AgentError) for ERROR frames not tied to a request, such as the agent's
 * bad_frame resync report; 'resync' (skippedBytes) when the guest's byte
 * stream had to be resynchronised here; 'close' once the stream is gone.
 */
export class AgentClient extends EventEmitter {
  private readonly decoder = new FrameDecoder();
  private readonly maxReadFileBytes: number;
  private readonly pending = new Map<number, PendingRequest>();
  private queue: Promise<unknown> = Promise.resolve();
  /** Random start so a reconnecting host cannot mistake stale replies for answers to new ids. */
  private nextId = randomInt(1, 0x7fffffff);
  private closedReason: string | undefined;
  /** Listeners of the directory watches this client started, by watch id. */
  private readonly watchers = new Map<number, (event: FsEvent) => void>();

  constructor(
    private readonly stream: Duplex,
    options: AgentClientOptions = {},
  ) {
    super();
    this.maxReadFileBytes = options.maxReadFileBytes ?? DEFAULT_MAX_READ_FILE_BYTES;
    stream.on('data', (chunk: Buffer) => this.receive(chunk));
    stream.on('error', (err) => this.shutdown(`stream error: ${err.message}`));
    stream.on('end', () => this.shutdown('stream ended'));
    stream.on('close', () => this.shutdown('stream closed'));
    this.on('event', (frame: Frame) => this.routeWatchEvent(frame));
  }

  get closed(): boolean {
    return this.closedReason !== undefined;
  }

  async ping(timeoutMs = 5000): Promise<Pong> {
    return this.serialized(() =>
      this.request(MessageType.Ping, encodePing(), timeoutMs, (frame, done) => {
        if (frame.type !== MessageType.Pong) return false;
        done(decodePong(frame.payload));
        return true;
      }),
    );
  }

  async exec(req: ExecRequest, handlers: ExecHandlers = {}): Promise<ExecOutcome> {
    const payload = encodeOrThrow(() => encodeExec(req));
    const cap = req.maxOutput ?? DEFAULT_MAX_OUTPUT;
    return this.serialized(() => {
      const stdout = new CappedBuffer(cap);
      const stderr = new CappedBuffer(cap);
      return this.request<ExecOutcome>(MessageType.Exec, payload, handlers.timeoutMs, (frame, done) => {
        switch (frame.type) {
          case MessageType.Stdout:
            stdout.append(frame.payload);
            handlers.onStdout?.(frame.payload);
            return true;
          case MessageType.Stderr:
            stderr.append(frame.payload);
            handlers.onStderr?.(frame.payload);
            return true;
          case MessageType.ExecResult:
            done({ result: decodeExecResult(frame.payload), stdout: stdout.toBuffer(), stderr: stderr.toBuffer() });
            return true;
          default:
            return false;
        }
      });
    });
  }

  async restored(req: RestoredRequest): Promise<void> {
    const payload = encodeOrThrow(() => encodeRestored(req));
    await this.serialized(() => this.request<void>(MessageType.Restored, payload, undefined, expectOk));
  }

  /** Sets the guest's CLOCK_REALTIME (after the host paused it: the clock stood still meanwhile). */
  async setTime(timeNs: bigint): Promise<void> {
    const payload = encodeSetTime(timeNs);
    await this.serialized(() => this.request<void>(MessageType.SetTime, payload, undefined, expectOk));
  }

  async readFile(path: string, options: ReadFileOptions = {}): Promise<Buffer> {
    const maxBytes = options.maxBytes ?? this.maxReadFileBytes;
    return this.serialized(async () => {
      const parts: Buffer[] = [];
      let offset = 0;
      for (;;) {
        const payload = encodeOrThrow(() => encodeFileRead({ path, offset, length: FILE_CHUNK_MAX }));
        const chunk = await this.request<FileData>(MessageType.FileRead, payload, undefined, (frame, done) => {
          if (frame.type !== MessageType.FileData) return false;
          done(decodeFileData(frame.payload));
          return true;
        });
        // Checked on every chunk: the file may grow while we read it.
        if (chunk.size > maxBytes || offset + chunk.data.length > maxBytes) {
          throw new AgentError(ClientErrorCode.FileTooLarge, `${path} is ${chunk.size} bytes, over the ${maxBytes}-byte limit`);
        }
        if (chunk.data.length > 0) parts.push(chunk.data);
        offset += chunk.data.length;
        if (chunk.data.length === 0 || offset >= chunk.size) return Buffer.concat(parts, offset);
      }
    });
  }

  async writeFile(path: string, data: Buffer, mode?: number): Promise<void> {
    await this.serialized(async () => {
      let offset = 0;
      do {
        const piece = data.subarray(offset, offset + FILE_CHUNK_MAX);
        const first = offset === 0;
        const payload = encodeOrThrow(() =>
          encodeFileWrite(first ? { path, data: piece, truncate: true, mode } : { path, data: piece, offset }),
        );
        await this.request<void>(MessageType.FileWrite, payload, undefined, expectOk);
        offset += piece.length;
      } while (offset < data.length);
    });
  }

  // ------------------------------------------------- background processes
  // Sent beside a running exec (concurrentRequest); their output and exits arrive as 'event' frames.

  /** Starts a background process; resolves once it runs (its pid), or rejects with the guest's reason. */
  async startProcess(req: ProcStartRequest, timeoutMs = 30_000): Promise<ProcStarted> {
    const payload = encodeOrThrow(() => encodeProcStart(req));
    return this.concurrentRequest(MessageType.ProcStart, payload, timeoutMs, (frame, done) => {
      if (frame.type !== MessageType.ProcStarted) return false;
      done(decodeProcStarted(frame.payload));
      return true;
    });
  }

  /**
   * Writes `data` to a background process's stdin. Resolves once the guest wrote it into the pipe
   * (or terminal): a process that does not read holds the caller here, which is the flow control.
   */
  async processInput(pid: number, data: Buffer, timeoutMs?: number): Promise<void> {
    const payload = encodeOrThrow(() => encodeProcInput(pid, data));
    await this.concurrentRequest<void>(MessageType.ProcInput, payload, timeoutMs, expectOk);
  }

  /** Closes its stdin once what was written is delivered (on a terminal: sends the EOF character). */
  async closeProcessStdin(pid: number, timeoutMs?: number): Promise<void> {
    const payload = encodeOrThrow(() => encodeProcPid(pid));
    await this.concurrentRequest<void>(MessageType.ProcCloseStdin, payload, timeoutMs, expectOk);
  }

  /** Sends `signal` to the process's group. */
  async signalProcess(pid: number, signal: number, timeoutMs = 10_000): Promise<void> {
    const payload = encodeOrThrow(() => encodeProcSignal(pid, signal));
    await this.concurrentRequest<void>(MessageType.ProcSignal, payload, timeoutMs, expectOk);
  }

  async resizeProcess(pid: number, cols: number, rows: number, timeoutMs = 10_000): Promise<void> {
    const payload = encodeOrThrow(() => encodeProcResize(pid, cols, rows));
    await this.concurrentRequest<void>(MessageType.ProcResize, payload, timeoutMs, expectOk);
  }

  /** The guest's table: live background processes and the last ones that exited. */
  async listProcesses(timeoutMs = 10_000): Promise<ProcEntry[]> {
    return this.concurrentRequest(MessageType.ProcList, Buffer.alloc(0), timeoutMs, (frame, done) => {
      if (frame.type !== MessageType.ProcTable) return false;
      done(decodeProcTable(frame.payload));
      return true;
    });
  }

  /**
   * Streams `path` to `sink` chunk by chunk, in one turn of the queue: exactly the size the file had
   * when the read began (a file that grows meanwhile is cut there; one that shrinks fails with
   * file_changed). Files over `maxBytes` are refused before `start`. A file that reports size 0 but
   * has content (/proc, /sys) is read to its end: `start` gets size -1.
   */
  async downloadFile(path: string, sink: FileSink, options: ReadFileOptions = {}): Promise<{ size: number }> {
    const maxBytes = options.maxBytes ?? Number.MAX_SAFE_INTEGER;
    return this.serialized(async () => {
      let offset = 0;
      let size = -2; // not known yet; -1: unknown (a pseudo-file), read to its end
      for (;;) {
        const payload = encodeOrThrow(() => encodeFileRead({ path, offset, length: FILE_CHUNK_MAX }));
        const chunk = await this.request<FileData>(MessageType.FileRead, payload, undefined, (frame, done) => {
          if (frame.type !== MessageType.FileData) return false;
          done(decodeFileData(frame.payload));
          return true;
        });
        if (size === -2) {
          size = chunk.size === 0 && chunk.data.length > 0 ? -1 : chunk.size;
          if (size > maxBytes) throw new AgentError(ClientErrorCode.FileTooLarge, `${path} is ${size} bytes, over the ${maxBytes}-byte limit`);
          await sink.start?.({ size, mode: chunk.mode });
        }
        if (size === -1) {
          if (chunk.data.length === 0) return { size: offset };
          if (offset + chunk.data.length > maxBytes) throw new AgentError(ClientErrorCode.FileTooLarge, `${path} is over the ${maxBytes}-byte limit`);
          await sink.chunk(chunk.data);
          offset += chunk.data.length;
          continue;
        }
        const data = chunk.data.length > size - offset ? chunk.data.subarray(0, size - offset) : chunk.data;
        if (data.length > 0) await sink.chunk(data);
        offset += data.length;
        if (offset >= size) return { size };
        if (chunk.data.length === 0) {
          throw new AgentError(ClientErrorCode.FileChanged, `${path} shrank to ${offset} bytes while it was read (it had ${size})`);
        }
      }
    });
  }

  /**
   * Writes `source` to `options.tempPath` in chunks, in one turn of the queue, then renames it over
   * `path`: the target is replaced whole or not at all. On any failure (the source's included) the
   * temporary file is removed. Memory stays about one chunk whatever the size.
   */
  async uploadFile(path: string, source: AsyncIterable<Buffer | Uint8Array | string>, options: UploadOptions): Promise<FsEntry & { bytes: number }> {
    const { tempPath, mode, user, xattrs } = options;
    const maxBytes = options.maxBytes ?? Number.MAX_SAFE_INTEGER;
    encodeOrThrow(() => encodeFsRename(tempPath, path, user));
    return this.serialized(async () => {
      let offset = 0;
      let started = false;
      const write = async (piece: Buffer) => {
        const payload = encodeOrThrow(() =>
          encodeFileWrite(started ? { path: tempPath, data: piece, offset, user } : { path: tempPath, data: piece, truncate: true, mode, user, xattrs }),
        );
        started = true;
        await this.request<void>(MessageType.FileWrite, payload, undefined, expectOk);
        offset += piece.length;
      };
      try {
        let pending: Buffer[] = [];
        let pendingBytes = 0;
        for await (const part of source) {
          const buf = typeof part === 'string' ? Buffer.from(part) : Buffer.isBuffer(part) ? part : Buffer.from(part);
          if (offset + pendingBytes + buf.length > maxBytes) {
            throw new AgentError(ClientErrorCode.FileTooLarge, `the upload to ${path} is over the ${maxBytes}-byte limit`);
          }
          pending.push(buf);
          pendingBytes += buf.length;
          while (pendingBytes >= FILE_CHUNK_MAX) {
            const all = Buffer.concat(pending, pendingBytes);
            await write(all.subarray(0, FILE_CHUNK_MAX));
            const rest = all.subarray(FILE_CHUNK_MAX);
            pending = rest.length ? [Buffer.from(rest)] : [];
            pendingBytes = rest.length;
          }
        }
        if (pendingBytes > 0 || !started) await write(Buffer.concat(pending, pendingBytes));
        const entry = await this.request(MessageType.FsRename, encodeFsRename(tempPath, path, user), FS_REQUEST_TIMEOUT_MS, fsEntryReply);
        return { ...entry, bytes: offset };
      } catch (e) {
        if (started && !this.closed) {
          await this.request(MessageType.FsRemove, encodeFsRemove(tempPath, user), FS_REQUEST_TIMEOUT_MS, (frame, done) => {
            if (frame.type !== MessageType.FsRemoved) return false;
            done(undefined);
            return true;
          }).catch(() => undefined);
        }
        throw e;
      }
    });
  }

  // ---------------------------------------------- directory operations
  // Sent beside a running exec (concurrentRequest): the agent answers each at once, bounded.

  /** The entry at `path` (a final symlink is not followed). */
  async stat(path: string): Promise<FsEntry> {
    const payload = encodeOrThrow(() => encodeFsStat(path));
    return this.concurrentRequest(MessageType.FsStat, payload, FS_REQUEST_TIMEOUT_MS, fsEntryReply);
  }

  /** The entries under directory `path`, `depth` levels down (1: its children), sorted per directory. */
  async list(path: string, depth = 1, maxEntries?: number): Promise<FsListing> {
    const payload = encodeOrThrow(() => encodeFsList(path, depth, maxEntries));
    return this.concurrentRequest(MessageType.FsList, payload, FS_REQUEST_TIMEOUT_MS, (frame, done) => {
      if (frame.type !== MessageType.FsEntries) return false;
      done(decodeFsEntries(frame.payload));
      return true;
    });
  }

  /** mkdir -p (as `user`, an account of the image: the directories made are its); `created` says whether the directory was made now or existed already. */
  async mkdir(path: string, mode?: number, user?: string): Promise<{ created: boolean; entry: FsEntry }> {
    const payload = encodeOrThrow(() => encodeFsMkdir(path, mode, user));
    const entry = await this.concurrentRequest(MessageType.FsMkdir, payload, FS_REQUEST_TIMEOUT_MS, fsEntryReply);
    const { created, ...rest } = entry;
    return { created: created === true, entry: rest };
  }

  /** Removes `path`, recursively for a directory, without following symlinks. The agent removes a bounded number of entries per request; this asks until it is done. */
  async remove(path: string): Promise<{ removed: number }> {
    const payload = encodeOrThrow(() => encodeFsRemove(path));
    let removed = 0;
    for (;;) {
      const round = await this.concurrentRequest<FsRemoved>(MessageType.FsRemove, payload, FS_REQUEST_TIMEOUT_MS, (frame, done) => {
        if (frame.type !== MessageType.FsRemoved) return false;
        done(decodeFsRemoved(frame.payload));
        return true;
      });
      removed += round.removed;
      if (round.done) return { removed };
    }
  }

  /** rename(2): replaces a destination file (or empty directory). Answers the destination's entry. */
  async rename(from: string, to: string): Promise<FsEntry> {
    const payload = encodeOrThrow(() => encodeFsRename(from, to));
    return this.concurrentRequest(MessageType.FsRename, payload, FS_REQUEST_TIMEOUT_MS, fsEntryReply);
  }

  /**
   * Watches directory `path` (and, recursive, every directory under it). `onEvent` gets its events,
   * the last being op `end` if the agent ends it (the directory went). Returns the watch id.
   */
  async watch(path: string, recursive: boolean, onEvent: (event: FsEvent) => void): Promise<number> {
    const payload = encodeOrThrow(() => encodeFsWatch(path, recursive));
    return this.concurrentRequest(MessageType.FsWatch, payload, FS_REQUEST_TIMEOUT_MS, (frame, done) => {
      if (frame.type !== MessageType.FsWatching) return false;
      const watchId = decodeFsWatching(frame.payload);
      // Registered before the promise settles: the watch's first events may follow in the same chunk.
      this.watchers.set(watchId, onEvent);
      done(watchId);
      return true;
    });
  }

  /**
   * How full the guest's root file system is (statvfs("/"): `df /`). An agent from before FS_USAGE
   * answers bad_request (an unknown message type).
   */
  async fsUsage(timeoutMs = FS_REQUEST_TIMEOUT_MS): Promise<FsUsage> {
    return this.concurrentRequest(MessageType.FsUsage, Buffer.alloc(0), timeoutMs, (frame, done) => {
      if (frame.type !== MessageType.FsUsageResult) return false;
      done(decodeFsUsage(frame.payload));
      return true;
    });
  }

  /** Stops a watch; its listener gets nothing more. */
  async unwatch(watchId: number): Promise<void> {
    this.watchers.delete(watchId);
    const payload = encodeOrThrow(() => encodeFsUnwatch(watchId));
    await this.concurrentRequest<void>(MessageType.FsUnwatch, payload, FS_REQUEST_TIMEOUT_MS, expectOk);
  }

  close(): void {
    this.shutdown('closed by client');
    this.stream.destroy();
  }

  // ------------------------------------------------------------ internals

  /**
   * Sends a request at once, beside any serialized one in flight. For requests the
   * agent answers without waiting on an exec (process control, directory operations).
   */
  concurrentRequest<T>(
    type: number,
    payload: Buffer,
    timeoutMs: number | undefined,
    handle: (frame: Frame, done: (value: T) => void) => boolean,
  ): Promise<T> {
    return this.request(type, payload, timeoutMs, handle);
  }

  private routeWatchEvent(frame: Frame): void {
    if (frame.type !== MessageType.FsEvent) return;
    let event: FsEvent;
    try {
      event = decodeFsEvent(frame.payload);
    } catch {
      return; // an event we cannot read; the watch goes on
    }
    const listener = this.watchers.get(event.watchId);
    if (!listener) return;
    if (event.op === 'end') this.watchers.delete(event.watchId);
    listener(event);
  }

  private serialized<T>(task: () => Promise<T>): Promise<T> {
    const run = this.queue.then(task, task);
    this.queue = run.catch(() => undefined);
    return run;
  }

  private allocateId(): number {
    const id = this.nextId;
    this.nextId = this.nextId >= MAX_REQUEST_ID ? 1 : this.nextId + 1;
    return id;
  }

  /**
   * Sends one request and feeds frames carrying its id to `handle`, which calls
   * `done` with the final value and returns false for frame types it does not expect.
   */
  private request<T>(
    type: number,
    payload: Buffer,
    timeoutMs: number | undefined,
    handle: (frame: Frame, done: (value: T) => void) => boolean,
  ): Promise<T> {
    if (this.closedReason !== undefined) {
      return Promise.reject(new AgentError(ClientErrorCode.Disconnected, `agent connection is closed (${this.closedReason})`));
    }
    let frame: Buffer;
    try {
      frame = encodeFrame(type, 0, payload);
    } catch (e) {
      return Promise.reject(new AgentError(ClientErrorCode.InvalidRequest, (e as Error).message));
    }
    const id = this.allocateId();
    frame.writeUInt32LE(id, 8);

    return new Promise<T>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const settle = () => {
        if (timer) clearTimeout(timer);
        if (this.pending.get(id) === entry) this.pending.delete(id);
      };
      const entry: PendingRequest = {
        id,
        onFrame: (reply) => {
          if (reply.type === MessageType.Error) {
            settle();
            reject(errorFromFrame(reply));
            return;
          }
          try {
            const understood = handle(reply, (value) => {
              settle();
              resolve(value);
            });
            if (!understood) {
              settle();
              reject(new AgentError(ClientErrorCode.UnexpectedReply, `unexpected reply type 0x${reply.type.toString(16)} to request ${id}`));
            }
          } catch (e) {
            settle();
            const message = e instanceof ProtocolError ? e.message : String(e);
            reject(new AgentError(ClientErrorCode.UnexpectedReply, `undecodable reply to request ${id}: ${message}`));
          }
        },
        fail: (error) => {
          settle();
          reject(error);
        },
      };
      this.pending.set(id, entry);
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => entry.fail(new AgentError(ClientErrorCode.Timeout, `no reply to request ${id} within ${timeoutMs} ms`)), timeoutMs);
      }
      this.stream.write(frame);
    });
  }

  private receive(chunk: Buffer): void {
    let events;
    try {
      events = this.decoder.push(chunk);
    } catch (e) {
      this.shutdown(`decoder failure: ${(e as Error).message}`);
      return;
    }
    for (const event of events) {
      if (event.kind === 'resync') {
        this.emit('resync', event.skippedBytes);
        continue;
      }
      const frame = event.frame;
      const pending = frame.id === 0 ? undefined : this.pending.get(frame.id);
      if (pending) {
        pending.onFrame(frame);
      } else if (frame.type === MessageType.Error) {
        this.emit('guestError', errorFromFrame(frame));
      } else if (frame.id === 0) {
        this.emit('event', frame);
      }
      // Anything else answers a request we gave up on (timed out); dropping it is correct.
    }
  }

  private shutdown(reason: string): void {
    if (this.closedReason !== undefined) return;
    this.closedReason = reason;
    this.decoder.reset();
    this.watchers.clear();
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const entry of pending) entry.fail(new AgentError(ClientErrorCode.Disconnected, `agent connection lost (${reason})`));
    this.emit('close', reason);
  }
}

function encodeOrThrow(encode: () => Buffer): Buffer {
  try {
    return encode();
  } catch (e) {
    throw new AgentError(ClientErrorCode.InvalidRequest, (e as Error).message);
  }
}

function fsEntryReply(frame: Frame, done: (value: FsEntry & { created?: boolean }) => void): boolean {
  if (frame.type !== MessageType.FsEntry) return false;
  done(decodeFsEntry(frame.payload));
  return true;
}

function expectOk(frame: Frame, done: (value: void) => void): boolean {
  if (frame.type !== MessageType.Ok) return false;
  done();
  return true;
}

export { ErrorCode };
