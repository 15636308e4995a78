/**
 * Host side of the guest agent wire protocol (docs/agent-protocol.md).
 *
 * Pure encoding/decoding, no I/O: AgentClient puts it on a socket, and tests drive
 * it directly. Constants must stay identical to src/guest/agent/agent.h.
 */

export const MAGIC = 0x314d4c43;
/** The magic as it appears on the wire (little-endian "CLM1"); what resync scans for. */
export const MAGIC_BYTES = Buffer.from([0x43, 0x4c, 0x4d, 0x31]);
export const FRAME_HEADER_SIZE = 16;
export const MAX_FRAME_PAYLOAD = 1024 * 1024;
export const OUTPUT_CHUNK_MAX = 64 * 1024;
export const FILE_CHUNK_MAX = 512 * 1024;
export const DEFAULT_MAX_OUTPUT = 1024 * 1024;
export const ENTROPY_MIN_BYTES = 32;
export const ENTROPY_MAX_BYTES = 512;
const TLV_HEADER_SIZE = 6;

export const MessageType = {
  Ping: 0x01,
  Exec: 0x02,
  Restored: 0x03,
  FileRead: 0x04,
  FileWrite: 0x05,
  SetTime: 0x06,
  ProcStart: 0x0a,
  ProcInput: 0x0b,
  ProcCloseStdin: 0x0c,
  ProcSignal: 0x0d,
  ProcResize: 0x0e,
  ProcList: 0x0f,
  FsStat: 20,
  FsList: 21,
  FsMkdir: 22,
  FsRemove: 23,
  FsRename: 24,
  FsWatch: 25,
  FsUnwatch: 26,
  FsUsage: 27,
  Pong: 0x81,
  Stdout: 0x82,
  Stderr: 0x83,
  ExecResult: 0x84,
  Ok: 0x85,
  FileData: 0x86,
  FsEntry: 0xa0,
  FsEntries: 0xa1,
  FsRemoved: 0xa2,
  FsWatching: 0xa3,
  FsEvent: 0xa4,
  FsUsageResult: 0xa5,
  Error: 0x8f,
  ProcStarted: 0x90,
  ProcOutput: 0x91,
  ProcExit: 0x92,
  ProcTable: 0x93,
} as const;
export type MessageType = (typeof MessageType)[keyof typeof MessageType];

/** TLV tags. Tag numbers are only unique per message (MODE and FILE_MODE share 16). */
export const Tag = {
  ArgvBegin: 10,
  Arg: 11,
  Env: 12,
  Cwd: 13,
  Stdin: 14,
  FilePath: 15,
  FileMode: 16,
  FileData: 17,
  TimeoutMs: 18,
  MaxOutput: 19,
  Seed: 20,
  User: 21,

  ExitCode: 30,
  Signal: 31,
  TimedOut: 32,
  StdoutTruncated: 35,
  StderrTruncated: 36,
  StdoutBytes: 37,
  StderrBytes: 38,
  FailedIndex: 39,
  StartedNs: 40,
  FinishedNs: 41,
  ErrorText: 42,
  PidsLimited: 43,

  Entropy: 50,
  TimeNs: 51,
  SandboxId: 52,
  Token: 53,

  Path: 60,
  Data: 61,
  Offset: 62,
  Length: 63,
  Size: 64,
  Truncate: 65,
  Mode: 16,

  Code: 70,
  Message: 71,

  AgentVersion: 80,
  UptimeMs: 81,

  // Background processes: 100-129.
  Pid: 100,
  Stream: 101,
  Pty: 102,
  Cols: 103,
  Rows: 104,
  StdinOpen: 105,
  ProcTag: 106,
  OutputOffset: 107,
  ProcEntry: 108,
  Exited: 109,
  OutputTotal: 110,
  ArgvTruncated: 111,
  NoAslr: 112,

  FsPath: 130,
  FsDepth: 131,
  FsMode: 132,
  FsTruncated: 133,
  FsFrom: 134,
  FsTo: 135,
  FsRecursive: 136,
  FsWatchId: 137,
  FsOp: 138,
  FsCreated: 139,
  FsRemovedCount: 140,
  FsDone: 141,
  FsEntryBegin: 142,
  FsName: 143,
  FsEntryPath: 144,
  FsType: 145,
  FsSize: 146,
  FsPerm: 147,
  FsUid: 148,
  FsGid: 149,
  FsOwner: 150,
  FsGroup: 151,
  FsMtimeNs: 152,
  FsTarget: 153,
  FsMaxEntries: 154,
  FsXattrName: 155,
  FsXattrValue: 156,
  FsTotalBytes: 157,
  FsFreeBytes: 158,
  FsAvailableBytes: 159,
} as const;

/** The user.* extended attributes an entry carries and FILE_WRITE sets: names and values together at most (FS_XATTR_BYTES_MAX). */
export const XATTR_BYTES_MAX = 4096;
export const XATTR_COUNT_MAX = 64;

export const ErrorCode = {
  BadFrame: 'bad_frame',
  BadRequest: 'bad_request',
  Busy: 'busy',
  FileWriteFailed: 'file_write_failed',
  FileNotFound: 'file_not_found',
  FileReadFailed: 'file_read_failed',
  NotAFile: 'not_a_file',
  RestoreFailed: 'restore_failed',
  TooManyProcesses: 'too_many_processes',
  ProcessNotFound: 'process_not_found',
  ProcessExited: 'process_exited',
  StdinClosed: 'stdin_closed',
  NotATerminal: 'not_a_terminal',
  SpawnFailed: 'spawn_failed',
  CommandNotFound: 'command_not_found',
  UserNotFound: 'user_not_found',
  // Directory operations (FS_*): the errno behind a failure, as a stable code.
  InvalidPath: 'invalid_path',
  NotADirectory: 'not_a_directory',
  IsADirectory: 'is_a_directory',
  FileExists: 'file_exists',
  DirectoryNotEmpty: 'directory_not_empty',
  PermissionDenied: 'permission_denied',
  CrossDevice: 'cross_device',
  ReadOnly: 'read_only',
  NoSpace: 'no_space',
  FsFailed: 'fs_failed',
  TooManyWatches: 'too_many_watches',
  WatchNotFound: 'watch_not_found',
} as const;

/** Raised for bytes that do not follow the protocol (and for requests we refuse to encode). */
export class ProtocolError extends Error {
  override name = 'ProtocolError';
}

// ---------------------------------------------------------------- frames

export interface Frame {
  type: number;
  flags: number;
  id: number;
  payload: Buffer;
}

export function encodeFrame(type: number, id: number, payload: Buffer): Buffer {
  if (payload.length > MAX_FRAME_PAYLOAD) {
    throw new ProtocolError(`frame payload of ${payload.length} bytes exceeds ${MAX_FRAME_PAYLOAD}`);
  }
  const frame = Buffer.allocUnsafe(FRAME_HEADER_SIZE + payload.length);
  frame.writeUInt32LE(MAGIC, 0);
  frame.writeUInt16LE(type, 4);
  frame.writeUInt16LE(0, 6);
  frame.writeUInt32LE(id >>> 0, 8);
  frame.writeUInt32LE(payload.length, 12);
  payload.copy(frame, FRAME_HEADER_SIZE);
  return frame;
}

export type DecoderEvent =
  | { kind: 'frame'; frame: Frame }
  /** The stream was out of sync; skippedBytes were dropped before the next valid header. */
  | { kind: 'resync'; skippedBytes: number };

/**
 * Splits a byte stream into frames. A header with the wrong magic or an oversized
 * length costs one byte, then we scan for the next magic; the episode is reported
 * once, when a valid header is found. Holds at most one frame plus one pushed chunk.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private resyncing = false;
  private skipped = 0;

  constructor(private readonly maxPayload: number = MAX_FRAME_PAYLOAD) {}

  get bufferedBytes(): number {
    return this.buffered;
  }

  reset(): void {
    this.chunks = [];
    this.buffered = 0;
    this.resyncing = false;
    this.skipped = 0;
  }

  push(chunk: Buffer): DecoderEvent[] {
    if (chunk.length > 0) {
      this.chunks.push(chunk);
      this.buffered += chunk.length;
    }
    const events: DecoderEvent[] = [];
    for (;;) {
      if (this.buffered < FRAME_HEADER_SIZE) {
        if (this.resyncing) this.dropGarbage();
        break;
      }
      const header = this.peek(FRAME_HEADER_SIZE);
      const payloadLength = header.readUInt32LE(12);
      if (header.readUInt32LE(0) !== MAGIC || payloadLength > this.maxPayload) {
        if (!this.resyncing) {
          this.resyncing = true;
          this.skipped = 0;
        }
        this.consume(1);
        this.skipped += 1;
        this.dropGarbage();
        continue;
      }
      if (this.resyncing) {
        this.resyncing = false;
        events.push({ kind: 'resync', skippedBytes: this.skipped });
      }
      if (this.buffered < FRAME_HEADER_SIZE + payloadLength) break;
      const bytes = this.consume(FRAME_HEADER_SIZE + payloadLength);
      events.push({
        kind: 'frame',
        frame: {
          type: bytes.readUInt16LE(4),
          flags: bytes.readUInt16LE(6),
          id: bytes.readUInt32LE(8),
          payload: Buffer.from(bytes.subarray(FRAME_HEADER_SIZE)),
        },
      });
    }
    return events;
  }

  /** Drops everything before the next magic; keeps a trailing partial magic. */
  private dropGarbage(): void {
    if (this.buffered === 0) return;
    const all = this.peek(this.buffered);
    let keepFrom = all.indexOf(MAGIC_BYTES);
    if (keepFrom < 0) {
      keepFrom = all.length;
      for (let tail = Math.min(MAGIC_BYTES.length - 1, all.length); tail > 0; tail--) {
        if (all.subarray(all.length - tail).equals(MAGIC_BYTES.subarray(0, tail))) {
          keepFrom = all.length - tail;
          break;
        }
      }
    }
    if (keepFrom > 0) {
      this.consume(keepFrom);
      this.skipped += keepFrom;
    }
  }

  /** The first n buffered bytes as one buffer, merging chunks only as far as needed. */
  private peek(n: number): Buffer {
    if (this.chunks[0].length < n) {
      let merged = 0;
      let count = 0;
      while (merged < n) merged += this.chunks[count++].length;
      this.chunks.splice(0, count, Buffer.concat(this.chunks.slice(0, count), merged));
    }
    return this.chunks[0].subarray(0, n);
  }

  private consume(n: number): Buffer {
    const taken = this.peek(n);
    const first = this.chunks[0];
    if (first.length === n) this.chunks.shift();
    else this.chunks[0] = first.subarray(n);
    this.buffered -= n;
    return taken;
  }
}

// ------------------------------------------------------------------ TLV

export interface TlvField {
  tag: number;
  value: Buffer;
}

export class TlvWriter {
  private parts: Buffer[] = [];
  private length = 0;

  get byteLength(): number {
    return this.length;
  }

  private field(tag: number, value: Buffer): this {
    const header = Buffer.allocUnsafe(TLV_HEADER_SIZE);
    header.writeUInt16LE(tag, 0);
    header.writeUInt32LE(value.length, 2);
    this.parts.push(header, value);
    this.length += TLV_HEADER_SIZE + value.length;
    return this;
  }

  empty(tag: number): this {
    return this.field(tag, Buffer.alloc(0));
  }

  u8(tag: number, value: number): this {
    const b = Buffer.allocUnsafe(1);
    b.writeUInt8(value, 0);
    return this.field(tag, b);
  }

  u32(tag: number, value: number): this {
    const b = Buffer.allocUnsafe(4);
    b.writeUInt32LE(value, 0);
    return this.field(tag, b);
  }

  i32(tag: number, value: number): this {
    const b = Buffer.allocUnsafe(4);
    b.writeInt32LE(value, 0);
    return this.field(tag, b);
  }

  u64(tag: number, value: bigint | number): this {
    const b = Buffer.allocUnsafe(8);
    b.writeBigUInt64LE(BigInt(value), 0);
    return this.field(tag, b);
  }

  bytes(tag: number, value: Buffer | Uint8Array): this {
    return this.field(tag, Buffer.isBuffer(value) ? value : Buffer.from(value));
  }

  str(tag: number, value: string): this {
    return this.field(tag, Buffer.from(value, 'utf8'));
  }

  finish(): Buffer {
    return Buffer.concat(this.parts, this.length);
  }
}

/** Splits a TLV payload; throws ProtocolError if a field runs past the end. */
export function parseTlv(payload: Buffer): TlvField[] {
  const fields: TlvField[] = [];
  let offset = 0;
  while (offset < payload.length) {
    if (payload.length - offset < TLV_HEADER_SIZE) {
      throw new ProtocolError(`truncated TLV header at offset ${offset}`);
    }
    const tag = payload.readUInt16LE(offset);
    const length = payload.readUInt32LE(offset + 2);
    const start = offset + TLV_HEADER_SIZE;
    if (length > payload.length - start) {
      throw new ProtocolError(`TLV field ${tag} at offset ${offset} claims ${length} bytes, ${payload.length - start} remain`);
    }
    fields.push({ tag, value: payload.subarray(start, start + length) });
    offset = start + length;
  }
  return fields;
}

/** Typed access to a parsed payload; the last occurrence of a tag wins. */
class TlvReader {
  private readonly byTag = new Map<number, Buffer>();
  /** Every field, in order (for tags that repeat). */
  readonly fields: TlvField[] = [];

  constructor(
    payload: Buffer | TlvField[] | null,
    private readonly message: string,
  ) {
    if (payload) for (const field of Buffer.isBuffer(payload) ? parseTlv(payload) : payload) this.add(field);
  }

  /** A reader over fields already split (one entry group of FS_ENTRIES). */
  static of(fields: readonly TlvField[], message: string): TlvReader {
    const r = new TlvReader(null, message);
    for (const field of fields) r.add(field);
    return r;
  }

  private add(field: TlvField): void {
    this.byTag.set(field.tag, field.value);
    this.fields.push(field);
  }

  has(tag: number): boolean {
    return this.byTag.has(tag);
  }

  private sized(tag: number, width: number, required: boolean): Buffer | undefined {
    const value = this.byTag.get(tag);
    if (value === undefined) {
      if (required) throw new ProtocolError(`${this.message}: missing field ${tag}`);
      return undefined;
    }
    if (width >= 0 && value.length !== width) {
      throw new ProtocolError(`${this.message}: field ${tag} is ${value.length} bytes, expected ${width}`);
    }
    return value;
  }

  u8(tag: number, fallback?: number): number {
    const v = this.sized(tag, 1, fallback === undefined);
    return v ? v.readUInt8(0) : (fallback as number);
  }

  u32(tag: number, fallback?: number): number {
    const v = this.sized(tag, 4, fallback === undefined);
    return v ? v.readUInt32LE(0) : (fallback as number);
  }

  i32(tag: number, fallback?: number): number {
    const v = this.sized(tag, 4, fallback === undefined);
    return v ? v.readInt32LE(0) : (fallback as number);
  }

  u64(tag: number, fallback?: bigint): bigint {
    const v = this.sized(tag, 8, fallback === undefined);
    return v ? v.readBigUInt64LE(0) : (fallback as bigint);
  }

  /** A u64 that is a byte count or a duration: fine as a JS number. */
  u64Number(tag: number, fallback?: number): number {
    const v = this.u64(tag, fallback === undefined ? undefined : BigInt(fallback));
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new ProtocolError(`${this.message}: field ${tag} out of range`);
    return Number(v);
  }

  bytes(tag: number, required = true): Buffer | undefined {
    return this.sized(tag, -1, required);
  }

  str(tag: number, fallback?: string): string {
    const v = this.sized(tag, -1, fallback === undefined);
    return v ? v.toString('utf8') : (fallback as string);
  }

  optionalStr(tag: number): string | undefined {
    const v = this.sized(tag, -1, false);
    return v?.toString('utf8');
  }
}

// ------------------------------------------------------ host → guest

export interface ExecFile {
  path: string;
  mode?: number;
  data: Buffer;
}

export interface ExecRequest {
  /** argv lists, run in order like `a && b && c`; argv[0] is looked up on PATH. */
  commands: ReadonlyArray<ReadonlyArray<string | Buffer>>;
  env?: Record<string, string>;
  cwd?: string;
  stdin?: Buffer;
  /** Written before anything runs; parents are created. */
  files?: ReadonlyArray<ExecFile>;
  timeoutMs?: number;
  /** Per-stream cap in bytes (guest default 1 MiB). */
  maxOutput?: number;
  /** u64 seed of the commands' user-space randomness (docs/determinism.md); absent = unseeded. */
  seed?: bigint;
  /** The image's account the commands run as (and `files` are written as); absent = root. */
  user?: string;
}

function hasNul(value: string | Buffer): boolean {
  return typeof value === 'string' ? value.includes('\0') : value.includes(0);
}

function assertU32(name: string, value: number): void {
  if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) {
    throw new ProtocolError(`${name} must be an integer in [0, 2^32), got ${value}`);
  }
}

/** One command's argv, as EXEC and PROC_START carry it: ARGV_BEGIN, then an ARG per argument. */
function writeCommand(w: TlvWriter, argv: ReadonlyArray<string | Buffer>): void {
  w.empty(Tag.ArgvBegin);
  for (const arg of argv) {
    if (hasNul(arg)) throw new ProtocolError('arguments cannot contain NUL');
    w.bytes(Tag.Arg, typeof arg === 'string' ? Buffer.from(arg, 'utf8') : arg);
  }
}

/** ENV (KEY=VALUE each) and CWD, as EXEC and PROC_START carry them. */
function writeEnvAndCwd(w: TlvWriter, env: Record<string, string> | undefined, cwd: string | undefined): void {
  for (const [key, value] of Object.entries(env ?? {})) {
    if (key.length === 0 || key.includes('=') || hasNul(key) || hasNul(value)) {
      throw new ProtocolError(`invalid environment variable ${JSON.stringify(key)}`);
    }
    w.str(Tag.Env, `${key}=${value}`);
  }
  if (cwd !== undefined) {
    if (cwd.length === 0 || hasNul(cwd)) throw new ProtocolError('invalid cwd');
    w.str(Tag.Cwd, cwd);
  }
}

/** Longest account name USER carries (the agent's RUN_AS_NAME_MAX). */
export const USER_NAME_MAX = 64;

/** USER: the account of the sandbox's image a request runs as (its name; absent = root). */
function writeUser(w: TlvWriter, user: string | undefined): void {
  if (user === undefined) return;
  if (user.length === 0 || Buffer.byteLength(user) > USER_NAME_MAX || /[\0:\n]/.test(user)) {
    throw new ProtocolError(`user must be an account name of 1 to ${USER_NAME_MAX} bytes without NUL, ':' or newline`);
  }
  w.str(Tag.User, user);
}

function writeXattrs(w: TlvWriter, xattrs: Record<string, string> | undefined): void {
  const entries = Object.entries(xattrs ?? {});
  if (entries.length > XATTR_COUNT_MAX) throw new ProtocolError(`at most ${XATTR_COUNT_MAX} extended attributes`);
  let bytes = 0;
  for (const [name, value] of entries) {
    if (name.length === 0 || Buffer.byteLength(name) > 250 || hasNul(name)) throw new ProtocolError('an extended attribute name must be 1 to 250 bytes without NUL');
    bytes += Buffer.byteLength(value);
    w.str(Tag.FsXattrName, name).str(Tag.FsXattrValue, value);
  }
  if (bytes > XATTR_BYTES_MAX) throw new ProtocolError(`extended attribute values over ${XATTR_BYTES_MAX} bytes`);
}

/** EXEC payload. Throws ProtocolError for requests the guest would reject or that exceed one frame. */
export function encodeExec(req: ExecRequest): Buffer {
  if (req.commands.length === 0) throw new ProtocolError('exec needs at least one command');
  const w = new TlvWriter();
  for (const file of req.files ?? []) {
    if (file.path.length === 0 || hasNul(file.path)) throw new ProtocolError(`invalid file path ${JSON.stringify(file.path)}`);
    w.str(Tag.FilePath, file.path);
    if (file.mode !== undefined) {
      assertU32('file mode', file.mode);
      w.u32(Tag.FileMode, file.mode);
    }
    w.bytes(Tag.FileData, file.data);
  }
  for (const argv of req.commands) {
    if (argv.length === 0) throw new ProtocolError('a command needs at least the program name');
    writeCommand(w, argv);
  }
  writeEnvAndCwd(w, req.env, req.cwd);
  if (req.stdin !== undefined) w.bytes(Tag.Stdin, req.stdin);
  if (req.timeoutMs !== undefined) {
    assertU32('timeoutMs', req.timeoutMs);
    w.u32(Tag.TimeoutMs, req.timeoutMs);
  }
  if (req.maxOutput !== undefined) {
    assertU32('maxOutput', req.maxOutput);
    w.u32(Tag.MaxOutput, req.maxOutput);
  }
  if (req.seed !== undefined) {
    if (typeof req.seed !== 'bigint' || req.seed < 0n || req.seed > 0xffffffffffffffffn) {
      throw new ProtocolError(`seed must be a bigint in [0, 2^64), got ${String(req.seed)}`);
    }
    w.u64(Tag.Seed, req.seed);
  }
  writeUser(w, req.user);
  if (w.byteLength > MAX_FRAME_PAYLOAD) {
    throw new ProtocolError(
      `exec request is ${w.byteLength} bytes, over the ${MAX_FRAME_PAYLOAD}-byte frame limit; send large files with FILE_WRITE`,
    );
  }
  return w.finish();
}

export interface RestoredRequest {
  entropy: Buffer;
  /** CLOCK_REALTIME in nanoseconds. */
  timeNs: bigint;
  sandboxId: string;
  token: string;
}

export function encodeRestored(req: RestoredRequest): Buffer {
  if (req.entropy.length < ENTROPY_MIN_BYTES || req.entropy.length > ENTROPY_MAX_BYTES) {
    throw new ProtocolError(`entropy must be ${ENTROPY_MIN_BYTES}-${ENTROPY_MAX_BYTES} bytes`);
  }
  if (hasNul(req.sandboxId) || hasNul(req.token)) throw new ProtocolError('sandboxId/token cannot contain NUL');
  return new TlvWriter()
    .bytes(Tag.Entropy, req.entropy)
    .u64(Tag.TimeNs, req.timeNs)
    .str(Tag.SandboxId, req.sandboxId)
    .str(Tag.Token, req.token)
    .finish();
}

/** SET_TIME: CLOCK_REALTIME to `timeNs` (after the host paused the guest); nothing else changes. */
export function encodeSetTime(timeNs: bigint): Buffer {
  return new TlvWriter().u64(Tag.TimeNs, timeNs).finish();
}

export interface FileReadRequest {
  path: string;
  offset?: number;
  length?: number;
}

export function encodeFileRead(req: FileReadRequest): Buffer {
  const w = new TlvWriter().str(Tag.Path, req.path);
  if (req.offset !== undefined) w.u64(Tag.Offset, req.offset);
  if (req.length !== undefined) {
    assertU32('length', req.length);
    w.u32(Tag.Length, req.length);
  }
  return w.finish();
}

export interface FileWriteRequest {
  path: string;
  data: Buffer;
  offset?: number;
  /** Create or truncate the file before writing (the first chunk of a whole-file write). */
  truncate?: boolean;
  mode?: number;
  /** Written with this account's permissions, and a new file is its (absent = root). */
  user?: string;
  /** user.* extended attributes (names without "user.") set on a new or truncated file. */
  xattrs?: Record<string, string>;
}

export function encodeFileWrite(req: FileWriteRequest): Buffer {
  const w = new TlvWriter().str(Tag.Path, req.path).bytes(Tag.Data, req.data);
  if (req.offset !== undefined) w.u64(Tag.Offset, req.offset);
  if (req.truncate) w.u8(Tag.Truncate, 1);
  if (req.mode !== undefined) {
    assertU32('mode', req.mode);
    w.u32(Tag.Mode, req.mode);
  }
  writeUser(w, req.user);
  writeXattrs(w, req.xattrs);
  if (w.byteLength > MAX_FRAME_PAYLOAD) throw new ProtocolError('file write chunk exceeds the frame limit');
  return w.finish();
}

export function encodePing(): Buffer {
  return Buffer.alloc(0);
}

// ------------------------------------------------------ guest → host

export interface ExecResult {
  exitCode: number;
  signal?: number;
  timedOut: boolean;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  /** Everything the commands wrote, including bytes dropped past the cap. */
  stdoutBytes: number;
  stderrBytes: number;
  /** Index of the last command that ran. */
  failedIndex: number;
  startedNs: bigint;
  finishedNs: bigint;
  errorText?: string;
  /** The exec's processes hit the guest's per-exec process limit (pids.max); the agent killed them all. */
  pidsLimited?: true;
}

export function decodeExecResult(payload: Buffer): ExecResult {
  const r = new TlvReader(payload, 'EXEC_RESULT');
  const result: ExecResult = {
    exitCode: r.i32(Tag.ExitCode),
    timedOut: r.u8(Tag.TimedOut, 0) === 1,
    stdoutTruncated: r.u8(Tag.StdoutTruncated, 0) === 1,
    stderrTruncated: r.u8(Tag.StderrTruncated, 0) === 1,
    stdoutBytes: r.u64Number(Tag.StdoutBytes, 0),
    stderrBytes: r.u64Number(Tag.StderrBytes, 0),
    failedIndex: r.u32(Tag.FailedIndex, 0),
    startedNs: r.u64(Tag.StartedNs, 0n),
    finishedNs: r.u64(Tag.FinishedNs, 0n),
  };
  if (r.has(Tag.Signal)) result.signal = r.u32(Tag.Signal);
  const errorText = r.optionalStr(Tag.ErrorText);
  if (errorText !== undefined) result.errorText = errorText;
  if (r.u8(Tag.PidsLimited, 0) === 1) result.pidsLimited = true;
  return result;
}

export interface FileData {
  data: Buffer;
  /** Size of the whole file when the chunk was read. */
  size: number;
  mode: number;
}

export function decodeFileData(payload: Buffer): FileData {
  const r = new TlvReader(payload, 'FILE_DATA');
  // A size beyond 2^53 (the guest's /proc/kcore states one) is over any read limit: clamped, the read is refused as too large.
  const size = r.u64(Tag.Size);
  return {
    data: r.bytes(Tag.Data) as Buffer,
    size: clampedSize(size),
    mode: r.u32(Tag.Mode, 0o644),
  };
}

export interface GuestError {
  code: string;
  message: string;
}

export function decodeError(payload: Buffer): GuestError {
  const r = new TlvReader(payload, 'ERROR');
  return { code: r.str(Tag.Code), message: r.str(Tag.Message, '') };
}

export interface Pong {
  agentVersion: string;
  /** CLOCK_BOOTTIME in the guest; keeps counting across suspend/restore. */
  uptimeMs: number;
  /** Last id set by RESTORED; empty before the first one. */
  sandboxId: string;
}

export function decodePong(payload: Buffer): Pong {
  const r = new TlvReader(payload, 'PONG');
  return {
    agentVersion: r.str(Tag.AgentVersion),
    uptimeMs: r.u64Number(Tag.UptimeMs),
    sandboxId: r.str(Tag.SandboxId, ''),
  };
}

// ------------------------------------------------ background processes

/** Output streams of a background process (PROC_OUTPUT STREAM). */
export const ProcStream = { Stdout: 1, Stderr: 2, Pty: 3 } as const;
export type ProcStreamName = 'stdout' | 'stderr' | 'pty';
const STREAM_NAMES: Record<number, ProcStreamName> = { 1: 'stdout', 2: 'stderr', 3: 'pty' };

export interface ProcStartRequest {
  /** One argv list; argv[0] is looked up on PATH. */
  argv: ReadonlyArray<string | Buffer>;
  env?: Record<string, string>;
  cwd?: string;
  seed?: bigint;
  /** Start it without address randomization (ADDR_NO_RANDOMIZE) though unseeded; a seeded one always is. */
  noAslr?: boolean;
  /** Run on a pseudo-terminal of this size (stdout and stderr are then one stream, 'pty'). */
  pty?: { cols: number; rows: number };
  /** Keep a stdin pipe open for PROC_INPUT (else stdin is /dev/null). A pty's input is always open. */
  stdinOpen?: boolean;
  /** The caller's label, listed with the process (at most 256 bytes). */
  tag?: string;
  /** The image's account it runs as: its uid, groups, HOME and, without `cwd`, its home (absent = root). */
  user?: string;
}

export function encodeProcStart(req: ProcStartRequest): Buffer {
  if (req.argv.length === 0) throw new ProtocolError('a process needs at least the program name');
  const w = new TlvWriter();
  writeCommand(w, req.argv);
  writeEnvAndCwd(w, req.env, req.cwd);
  if (req.seed !== undefined) w.u64(Tag.Seed, req.seed);
  if (req.noAslr) w.u8(Tag.NoAslr, 1);
  if (req.pty) {
    for (const [name, v] of [['cols', req.pty.cols], ['rows', req.pty.rows]] as const) {
      if (!Number.isInteger(v) || v < 1 || v > 0xffff) throw new ProtocolError(`pty ${name} must be an integer from 1 to 65535`);
    }
    w.u8(Tag.Pty, 1).u32(Tag.Cols, req.pty.cols).u32(Tag.Rows, req.pty.rows);
  }
  if (req.stdinOpen) w.u8(Tag.StdinOpen, 1);
  if (req.tag !== undefined) {
    if (Buffer.byteLength(req.tag) > 256 || hasNul(req.tag)) throw new ProtocolError('tag must be at most 256 bytes without NUL');
    w.str(Tag.ProcTag, req.tag);
  }
  writeUser(w, req.user);
  if (w.byteLength > MAX_FRAME_PAYLOAD) throw new ProtocolError('process start request exceeds the frame limit');
  return w.finish();
}

function assertPid(pid: number): void {
  if (!Number.isInteger(pid) || pid < 1 || pid > 0x7fffffff) throw new ProtocolError(`pid must be a positive integer, got ${pid}`);
}

/** PROC_CLOSE_STDIN and other requests that only name a process. */
export function encodeProcPid(pid: number): Buffer {
  assertPid(pid);
  return new TlvWriter().u32(Tag.Pid, pid).finish();
}

export function encodeProcInput(pid: number, data: Buffer): Buffer {
  assertPid(pid);
  if (data.length === 0) throw new ProtocolError('input must not be empty');
  return new TlvWriter().u32(Tag.Pid, pid).bytes(Tag.Data, data).finish();
}

export function encodeProcSignal(pid: number, signal: number): Buffer {
  assertPid(pid);
  if (!Number.isInteger(signal) || signal < 1 || signal > 64) throw new ProtocolError(`signal must be 1-64, got ${signal}`);
  return new TlvWriter().u32(Tag.Pid, pid).u32(Tag.Signal, signal).finish();
}

export function encodeProcResize(pid: number, cols: number, rows: number): Buffer {
  assertPid(pid);
  for (const v of [cols, rows]) if (!Number.isInteger(v) || v < 1 || v > 0xffff) throw new ProtocolError('cols and rows must be 1-65535');
  return new TlvWriter().u32(Tag.Pid, pid).u32(Tag.Cols, cols).u32(Tag.Rows, rows).finish();
}

export interface ProcStarted {
  pid: number;
  startedNs: bigint;
}

export function decodeProcStarted(payload: Buffer): ProcStarted {
  const r = new TlvReader(payload, 'PROC_STARTED');
  return { pid: r.u32(Tag.Pid), startedNs: r.u64(Tag.StartedNs, 0n) };
}

export interface ProcOutput {
  pid: number;
  stream: ProcStreamName;
  /** Position of the chunk's first byte in the process's output (all streams, dropped bytes included). */
  offset: number;
  data: Buffer;
}

export function decodeProcOutput(payload: Buffer): ProcOutput {
  const r = new TlvReader(payload, 'PROC_OUTPUT');
  const stream = STREAM_NAMES[r.u8(Tag.Stream)];
  if (!stream) throw new ProtocolError('PROC_OUTPUT: unknown stream');
  return { pid: r.u32(Tag.Pid), stream, offset: r.u64Number(Tag.OutputOffset), data: r.bytes(Tag.Data) as Buffer };
}

export interface ProcCounters {
  stdoutBytes: number;
  stderrBytes: number;
  /** Everything it wrote, all streams (stdout carries a pty's output). */
  outputTotal: number;
}

export interface ProcExitStatus {
  exitCode: number;
  signal?: number;
  finishedNs: bigint;
  pidsLimited?: true;
}

export interface ProcExit extends ProcExitStatus, ProcCounters {
  pid: number;
}

function exitStatusOf(r: TlvReader): ProcExitStatus {
  const status: ProcExitStatus = { exitCode: r.i32(Tag.ExitCode), finishedNs: r.u64(Tag.FinishedNs, 0n) };
  if (r.has(Tag.Signal)) status.signal = r.u32(Tag.Signal);
  if (r.u8(Tag.PidsLimited, 0) === 1) status.pidsLimited = true;
  return status;
}

function countersOf(r: TlvReader): ProcCounters {
  return { stdoutBytes: r.u64Number(Tag.StdoutBytes, 0), stderrBytes: r.u64Number(Tag.StderrBytes, 0), outputTotal: r.u64Number(Tag.OutputTotal, 0) };
}

export function decodeProcExit(payload: Buffer): ProcExit {
  const r = new TlvReader(payload, 'PROC_EXIT');
  return { pid: r.u32(Tag.Pid), ...exitStatusOf(r), ...countersOf(r) };
}

export interface ProcEntry extends ProcCounters {
  pid: number;
  argv: string[];
  argvTruncated: boolean;
  cwd: string;
  tag?: string;
  pty: boolean;
  stdinOpen: boolean;
  startedNs: bigint;
  /** Present once it exited. */
  exit?: ProcExitStatus;
}

export function decodeProcTable(payload: Buffer): ProcEntry[] {
  const groups: TlvField[][] = [];
  for (const field of parseTlv(payload)) {
    if (field.tag === Tag.ProcEntry) groups.push([]);
    else if (groups.length === 0) throw new ProtocolError('PROC_TABLE: field before the first entry');
    else groups[groups.length - 1].push(field);
  }
  return groups.map((fields) => {
    const r = new TlvReader(fields, 'PROC_TABLE entry');
    const entry: ProcEntry = {
      pid: r.u32(Tag.Pid),
      argv: fields.filter((f) => f.tag === Tag.Arg).map((f) => f.value.toString('utf8')),
      argvTruncated: r.u8(Tag.ArgvTruncated, 0) === 1,
      cwd: r.str(Tag.Cwd, ''),
      pty: r.u8(Tag.Pty, 0) === 1,
      stdinOpen: r.u8(Tag.StdinOpen, 0) === 1,
      startedNs: r.u64(Tag.StartedNs, 0n),
      ...countersOf(r),
    };
    const tag = r.optionalStr(Tag.ProcTag);
    if (tag !== undefined) entry.tag = tag;
    if (r.u8(Tag.Exited, 0) === 1) entry.exit = exitStatusOf(r);
    return entry;
  });
}

// ------------------------------------------------ files and directories

/** The longest path a FS_* request carries (the guest's PATH_MAX less its NUL). */
export const FS_PATH_MAX = 4095;
export const FS_LIST_ENTRIES_MAX = 5000;
export const FS_LIST_DEPTH_MAX = 32;
export const FS_WATCHES_MAX = 32;

export type FsEntryType = 'file' | 'dir' | 'symlink' | 'other';

/** One file system entry as the guest saw it (lstat: a symlink is itself, with its target). */
export interface FsEntry {
  name: string;
  /** Absolute guest path. */
  path: string;
  type: FsEntryType;
  size: number;
  /** Permission bits (mode & 07777). */
  mode: number;
  uid: number;
  gid: number;
  /** Names from the guest's /etc/passwd and /etc/group; empty when the id has none. */
  owner: string;
  group: string;
  mtimeNs: bigint;
  symlinkTarget?: string;
  /** Its user.* extended attributes, by name without "user." (values as UTF-8 text); absent when it has none. */
  xattrs?: Record<string, string>;
}

export interface FsListing {
  entries: FsEntry[];
  /** More entries exist than one reply holds (count or frame size). */
  truncated: boolean;
}

export type FsEventOp = 'create' | 'write' | 'remove' | 'rename' | 'chmod' | 'overflow' | 'end';

export interface FsEvent {
  watchId: number;
  /** Relative to the watched directory; for `end`, why the watch ended (`removed`, `moved`). */
  name: string;
  op: FsEventOp;
}

function fsPath(name: string, path: string): string {
  if (typeof path !== 'string' || path.length === 0 || path.includes('\0')) throw new ProtocolError(`${name} must be a non-empty path without NUL`);
  if (Buffer.byteLength(path) > FS_PATH_MAX) throw new ProtocolError(`${name} is longer than ${FS_PATH_MAX} bytes`);
  return path;
}

export function encodeFsStat(path: string): Buffer {
  return new TlvWriter().str(Tag.FsPath, fsPath('path', path)).finish();
}

export function encodeFsList(path: string, depth = 1, maxEntries?: number): Buffer {
  assertU32('depth', depth);
  const w = new TlvWriter().str(Tag.FsPath, fsPath('path', path)).u32(Tag.FsDepth, depth);
  if (maxEntries !== undefined) {
    assertU32('maxEntries', maxEntries);
    w.u32(Tag.FsMaxEntries, maxEntries);
  }
  return w.finish();
}

export function encodeFsMkdir(path: string, mode?: number, user?: string): Buffer {
  const w = new TlvWriter().str(Tag.FsPath, fsPath('path', path));
  if (mode !== undefined) {
    assertU32('mode', mode);
    w.u32(Tag.FsMode, mode);
  }
  writeUser(w, user);
  return w.finish();
}

export function encodeFsRemove(path: string, user?: string): Buffer {
  const w = new TlvWriter().str(Tag.FsPath, fsPath('path', path));
  writeUser(w, user);
  return w.finish();
}

export function encodeFsRename(from: string, to: string, user?: string): Buffer {
  const w = new TlvWriter().str(Tag.FsFrom, fsPath('from', from)).str(Tag.FsTo, fsPath('to', to));
  writeUser(w, user);
  return w.finish();
}

export function encodeFsWatch(path: string, recursive: boolean): Buffer {
  return new TlvWriter().str(Tag.FsPath, fsPath('path', path)).u8(Tag.FsRecursive, recursive ? 1 : 0).finish();
}

export function encodeFsUnwatch(watchId: number): Buffer {
  assertU32('watchId', watchId);
  return new TlvWriter().u32(Tag.FsWatchId, watchId).finish();
}

const FS_ENTRY_TYPES: ReadonlySet<string> = new Set(['file', 'dir', 'symlink', 'other']);
const FS_EVENT_OPS: ReadonlySet<string> = new Set(['create', 'write', 'remove', 'rename', 'chmod', 'overflow', 'end']);

function clampedSize(v: bigint): number {
  return v > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(v);
}

function fsEntryFrom(r: TlvReader): FsEntry {
  const type = r.str(Tag.FsType);
  if (!FS_ENTRY_TYPES.has(type)) throw new ProtocolError(`FS entry: unknown type ${JSON.stringify(type)}`);
  const entry: FsEntry = {
    name: r.str(Tag.FsName),
    path: r.str(Tag.FsEntryPath),
    type: type as FsEntryType,
    // A size beyond 2^53 (the guest's /proc/kcore states one) is shown clamped, as FILE_DATA's is.
    size: clampedSize(r.u64(Tag.FsSize)),
    mode: r.u32(Tag.FsPerm),
    uid: r.u32(Tag.FsUid),
    gid: r.u32(Tag.FsGid),
    owner: r.str(Tag.FsOwner, ''),
    group: r.str(Tag.FsGroup, ''),
    mtimeNs: r.u64(Tag.FsMtimeNs),
  };
  const target = r.optionalStr(Tag.FsTarget);
  if (target !== undefined) entry.symlinkTarget = target;
  let name: string | undefined;
  for (const f of r.fields) {
    if (f.tag === Tag.FsXattrName) name = f.value.toString('utf8');
    else if (f.tag === Tag.FsXattrValue && name !== undefined) {
      (entry.xattrs ??= {})[name] = f.value.toString('utf8');
      name = undefined;
    }
  }
  return entry;
}

/** FS_ENTRY: one entry, and CREATED for an FS_MKDIR reply. */
export function decodeFsEntry(payload: Buffer): FsEntry & { created?: boolean } {
  const r = new TlvReader(payload, 'FS_ENTRY');
  const entry: FsEntry & { created?: boolean } = fsEntryFrom(r);
  if (r.has(Tag.FsCreated)) entry.created = r.u8(Tag.FsCreated) === 1;
  return entry;
}

/** FS_ENTRIES: entry groups, each started by ENTRY_BEGIN, then TRUNCATED. */
export function decodeFsEntries(payload: Buffer): FsListing {
  const entries: FsEntry[] = [];
  let truncated = false;
  let group: TlvField[] | undefined;
  const flush = () => {
    if (group) entries.push(fsEntryFrom(TlvReader.of(group, 'FS_ENTRIES entry')));
  };
  for (const field of parseTlv(payload)) {
    if (field.tag === Tag.FsEntryBegin) {
      flush();
      group = [];
    } else if (field.tag === Tag.FsTruncated) {
      if (field.value.length !== 1) throw new ProtocolError('FS_ENTRIES: TRUNCATED must be a u8');
      truncated = field.value[0] === 1;
    } else if (group) {
      group.push(field);
    }
  }
  flush();
  return { entries, truncated };
}

export interface FsRemoved {
  removed: number;
  /** False: the budget of one request ran out; send FS_REMOVE again. */
  done: boolean;
}

export function decodeFsRemoved(payload: Buffer): FsRemoved {
  const r = new TlvReader(payload, 'FS_REMOVED');
  return { removed: r.u64Number(Tag.FsRemovedCount), done: r.u8(Tag.FsDone) === 1 };
}

export function decodeFsWatching(payload: Buffer): number {
  return new TlvReader(payload, 'FS_WATCHING').u32(Tag.FsWatchId);
}

export function decodeFsEvent(payload: Buffer): FsEvent {
  const r = new TlvReader(payload, 'FS_EVENT');
  const op = r.str(Tag.FsOp);
  if (!FS_EVENT_OPS.has(op)) throw new ProtocolError(`FS_EVENT: unknown op ${JSON.stringify(op)}`);
  return { watchId: r.u32(Tag.FsWatchId), name: r.str(Tag.FsName, ''), op: op as FsEventOp };
}

/** How full the guest's root file system is (FS_USAGE_RESULT: statvfs("/"), what `df /` shows). */
export interface FsUsage {
  totalBytes: number;
  /** Free blocks, the reserved ones included: used is totalBytes - freeBytes, as df counts it. */
  freeBytes: number;
  /** Free to an unprivileged user (df's "Avail"). */
  availableBytes: number;
}

export function decodeFsUsage(payload: Buffer): FsUsage {
  const r = new TlvReader(payload, 'FS_USAGE_RESULT');
  const usage = { totalBytes: r.u64Number(Tag.FsTotalBytes), freeBytes: r.u64Number(Tag.FsFreeBytes), availableBytes: r.u64Number(Tag.FsAvailableBytes) };
  if (usage.freeBytes > usage.totalBytes || usage.availableBytes > usage.freeBytes) throw new ProtocolError('FS_USAGE_RESULT: free or available bytes exceed the total');
  return usage;
}
