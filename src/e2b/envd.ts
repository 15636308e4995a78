/**
 * E2B's in-sandbox daemon, envd, served by the Collimate server at /e2b/envd for every sandbox
 * (E2B_SANDBOX_URL): each request names its sandbox in `E2b-Sandbox-Id` and proves access with the
 * `X-Access-Token` the control plane handed out (a MAC of the sandbox id, PortUrlSigner). It
 * translates envd's Connect services (`process.Process`, `filesystem.Filesystem`) and its plain
 * `/files` and `/health` onto the tenant service's native processes and files (EnvdBackend), acting
 * as the sandbox's tenant.
 *
 * As E2B's envd, a request runs as the user it names (`Authorization: Basic <user:>` on RPCs,
 * `username` on /files), by default `user` (E2B's default account, which the `debian` image has):
 * its commands run as that account, its relative paths are under that account's home, and what it
 * writes is that account's. In an image without a `user` account (the busybox `base`, `python`,
 * `node`) the default is root, in /root. What else differs (docs/e2b.md): `/bin/bash -l -c` becomes
 * `/bin/sh -c` in a template without bash.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createHash, timingSafeEqual } from 'node:crypto';
import { posix } from 'node:path';
import { Readable, type Writable } from 'node:stream';
import { createGunzip, createGzip } from 'node:zlib';
import Busboy from 'busboy';
import { CollimateError } from '../errors.js';
import type { TenantService } from '../service/tenantService.js';
import type { Scope } from '../service/types.js';
import { toClientError } from '../wire/errors.js';
import { ConnectError, ServerStream, connectErrorOf, decodeEnvelopes, decodeUnary, sendUnary, sendUnaryError, MAX_ENVELOPE_BYTES, CONNECT_STREAM_TYPE } from './connectRpc.js';
import type { SandboxEnvs } from './sandboxEnv.js';
import { e2bNames } from './names.js';
import { bodyChunks, discardRest } from '../wire/streamedBody.js';

export const E2B_ENVD_PREFIX = '/e2b/envd';

// ---- what envd needs from the native API ----------------------------------------------------------

export type EntryType = 'file' | 'dir' | 'symlink' | 'other';

export interface FsEntry {
  name: string;
  path: string;
  type: EntryType;
  size: number;
  /** Permission bits (and file type bits, as Go's os.FileMode would not have them: envd sends the low 9 + special bits). */
  mode: number;
  owner: string;
  group: string;
  mtimeMs: number;
  symlinkTarget?: string;
  /** E2B's file metadata: the file's `user.e2b.*` extended attributes, by the name after `user.e2b.`. */
  metadata?: Record<string, string>;
}

export interface ProcessSpec {
  argv: string[];
  env: Record<string, string>;
  cwd?: string;
  pty?: { cols: number; rows: number };
  stdin: boolean;
  tag?: string;
  /** The account it runs as (absent: root). */
  user?: string;
}

export interface WriteOptions {
  user?: string;
  metadata?: Record<string, string>;
}

/** Who a request runs as: an account of the sandbox's image (`user` undefined: root) and its home. */
export interface Account {
  user?: string;
  home: string;
}

export interface ProcessSummary {
  pid: number;
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  tag?: string;
}

export interface ProcessExit {
  exitCode: number;
  /** Set when a signal ended it. */
  signal?: number;
  error?: string;
}

export interface ProcessWatcher {
  onOutput(stream: 'stdout' | 'stderr' | 'pty', data: Buffer): void;
  onExit(exit: ProcessExit): void;
}

export interface FsEvent {
  name: string;
  type: 'create' | 'write' | 'remove' | 'rename' | 'chmod';
}

/** The native processes and files of one sandbox, as the tenant service offers them. */
export interface EnvdBackend {
  startProcess(scope: Scope, id: string, spec: ProcessSpec): Promise<{ pid: number }>;
  /** Output from the process's start (as far as it is kept) or from now, then its exit; returns a detach. Throws process_not_found. */
  attachProcess(scope: Scope, id: string, pid: number, fromStart: boolean, watcher: ProcessWatcher): Promise<() => void>;
  /** Running processes only. */
  listProcesses(scope: Scope, id: string): Promise<ProcessSummary[]>;
  sendInput(scope: Scope, id: string, pid: number, data: Buffer): Promise<void>;
  closeStdin(scope: Scope, id: string, pid: number): Promise<void>;
  signalProcess(scope: Scope, id: string, pid: number, signal: 'SIGTERM' | 'SIGKILL'): Promise<void>;
  resizeProcess(scope: Scope, id: string, pid: number, cols: number, rows: number): Promise<void>;
  stat(scope: Scope, id: string, path: string): Promise<FsEntry>;
  listDir(scope: Scope, id: string, path: string, depth: number): Promise<FsEntry[]>;
  /** mkdir -p, as `user` (absent: root); `created` false when it already existed. */
  makeDir(scope: Scope, id: string, path: string, user?: string): Promise<{ created: boolean; entry: FsEntry }>;
  move(scope: Scope, id: string, from: string, to: string): Promise<FsEntry>;
  remove(scope: Scope, id: string, path: string): Promise<void>;
  /** Events until the returned stop is called or `onEnd` is (the sandbox stopped, the watch broke). */
  watchDir(scope: Scope, id: string, path: string, recursive: boolean, onEvent: (e: FsEvent) => void, onEnd: (err?: CollimateError) => void): Promise<() => void>;
  /** Streams the file to `sink` (start once, then chunks; awaiting a chunk paces it); file_not_found before start. */
  readFile(scope: Scope, id: string, path: string, sink: { start?(info: { size: number }): void | Promise<void>; chunk(data: Buffer): void | Promise<void> }): Promise<unknown>;
  /**
   * Writes the whole stream to `path` atomically (nothing there if it fails), as `opts.user` (absent:
   * root), with `opts.metadata` as its only metadata, and stats it.
   */
  writeFile(scope: Scope, id: string, path: string, data: AsyncIterable<Buffer>, opts?: WriteOptions): Promise<FsEntry>;
}

export interface EnvdOptions {
  tenants: TenantService;
  backend: EnvdBackend;
  env: SandboxEnvs;
}

// ---- proto3 JSON of envd's messages --------------------------------------------------------------

const FILE_TYPE: Record<EntryType, string> = { file: 'FILE_TYPE_FILE', dir: 'FILE_TYPE_DIRECTORY', symlink: 'FILE_TYPE_SYMLINK', other: 'FILE_TYPE_UNSPECIFIED' };
const EVENT_TYPE: Record<FsEvent['type'], string> = { create: 'EVENT_TYPE_CREATE', write: 'EVENT_TYPE_WRITE', remove: 'EVENT_TYPE_REMOVE', rename: 'EVENT_TYPE_RENAME', chmod: 'EVENT_TYPE_CHMOD' };

/** `-rwxr-xr-x` as Go's FileMode.String() writes it (envd's `permissions`). */
export function permissionsString(type: EntryType, mode: number): string {
  const kind = type === 'dir' ? 'd' : type === 'symlink' ? 'L' : '-';
  const rwx = 'rwxrwxrwx';
  let out = '';
  for (let i = 0; i < 9; i++) out += mode & (1 << (8 - i)) ? rwx[i] : '-';
  return kind + out;
}

/** EntryInfo in proto3 JSON (int64 as a string, Timestamp as RFC 3339). */
export function entryJson(e: FsEntry): Record<string, unknown> {
  return {
    name: e.name,
    type: FILE_TYPE[e.type],
    path: e.path,
    size: String(e.size),
    mode: e.mode & 0o7777,
    permissions: permissionsString(e.type, e.mode),
    owner: e.owner,
    group: e.group,
    modifiedTime: new Date(e.mtimeMs).toISOString(),
    // As envd: the target as an absolute path (a relative link resolved against its directory).
    ...(e.symlinkTarget !== undefined ? { symlinkTarget: posix.resolve(posix.dirname(e.path), e.symlinkTarget) } : {}),
    ...(e.metadata ? { metadata: e.metadata } : {}),
  };
}

/** The `X-Metadata-<key>: <value>` headers of an upload (E2B's file metadata), checked as envd does. */
export function uploadMetadata(headers: IncomingMessage['headers']): Record<string, string> | undefined {
  let metadata: Record<string, string> | undefined;
  for (const [name, value] of Object.entries(headers)) {
    if (!name.startsWith('x-metadata-') || value === undefined) continue;
    const key = name.slice('x-metadata-'.length);
    const text = Array.isArray(value) ? value.join(', ') : value;
    if (!/^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/.test(key)) throw new CollimateError('validation_error', `Invalid metadata key ${JSON.stringify(key)}: use HTTP token characters.`);
    if (!/^[\x20-\x7e]*$/.test(text)) throw new CollimateError('validation_error', `Invalid metadata value for key ${JSON.stringify(key)}: values must be printable US-ASCII.`);
    (metadata ??= {})[key] = text;
  }
  return metadata;
}

/** EntryInfo as the plain /files answer writes it (envd's OpenAPI: snake_case, lowercase type). */
function writtenEntryJson(e: FsEntry): Record<string, unknown> {
  return { name: e.name, type: e.type === 'dir' ? 'directory' : e.type, path: e.path, ...(e.metadata ? { metadata: e.metadata } : {}) };
}

/** envd's EndEvent: like Go's os.ProcessState (exit code -1 and `exited` false when a signal ended it). */
export function endEventJson(exit: ProcessExit): Record<string, unknown> {
  const signalled = exit.signal !== undefined;
  const names: Record<number, string> = { 1: 'hangup', 2: 'interrupt', 9: 'killed', 13: 'broken pipe', 15: 'terminated' };
  const status = signalled ? `signal: ${names[exit.signal!] ?? `signal ${exit.signal}`}` : `exit status ${exit.exitCode}`;
  return {
    exitCode: signalled ? -1 : exit.exitCode,
    exited: !signalled,
    status,
    // envd's error is Go's cmd.Wait() error ("exit status 127"): the SDK's CommandExitError message.
    ...(exit.error ? { error: exit.error } : signalled || exit.exitCode !== 0 ? { error: status } : {}),
  };
}

function str(v: unknown, field: string, required = true): string | undefined {
  if (v === undefined || v === null || v === '') {
    if (required) throw new ConnectError('invalid_argument', `${field} is required`);
    return undefined;
  }
  if (typeof v !== 'string') throw new ConnectError('invalid_argument', `${field} must be a string`);
  return v;
}

function uint(v: unknown, field: string): number | undefined {
  if (v === undefined || v === null) return undefined;
  const n = typeof v === 'string' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) throw new ConnectError('invalid_argument', `${field} must be a non-negative integer`);
  return n;
}

function bytes(v: unknown, field: string): Buffer {
  if (typeof v !== 'string') throw new ConnectError('invalid_argument', `${field} must be base64 bytes`);
  return Buffer.from(v, 'base64');
}

/** The pid a ProcessSelector names; a tag is looked up among the running processes. */
async function selectPid(backend: EnvdBackend, scope: Scope, id: string, selector: unknown): Promise<number> {
  const sel = (selector ?? {}) as { pid?: unknown; tag?: unknown };
  const pid = uint(sel.pid, 'process.pid');
  if (pid !== undefined) return pid;
  const tag = str(sel.tag, 'process.pid or process.tag');
  const found = (await backend.listProcesses(scope, id)).find((p) => p.tag === tag);
  if (!found) throw new ConnectError('not_found', `no running process has the tag ${JSON.stringify(tag)}`);
  return found.pid;
}

function inputOf(v: unknown): Buffer {
  const input = (v ?? {}) as { stdin?: unknown; pty?: unknown };
  if (input.stdin !== undefined) return bytes(input.stdin, 'input.stdin');
  if (input.pty !== undefined) return bytes(input.pty, 'input.pty');
  throw new ConnectError('invalid_argument', 'input.stdin or input.pty is required');
}

const asConnectError = (err: unknown, log?: FastifyRequest['log']): ConnectError =>
  err instanceof ConnectError ? err : connectErrorOf(toClientError(err, log));

// ---- the front door ------------------------------------------------------------------------------

type Unary = (scope: Scope, id: string, msg: Record<string, unknown>, who: Account) => Promise<unknown>;
type Streaming = (scope: Scope, id: string, msg: Record<string, unknown>, stream: ServerStream, req: IncomingMessage, who: Account) => Promise<void>;

/** Watch events waiting for their entry's stat (includeEntry) before the client is cut off. */
const ENTRY_STATS_PENDING_MAX = 1000;

/** E2B's default account: commands and files are its unless a request names another. */
export const E2B_DEFAULT_USER = 'user';

/** The user an RPC names: `Authorization: Basic base64("<user>:")`, as the SDK sends it; undefined without one. */
export function basicUser(headers: IncomingMessage['headers']): string | undefined {
  const m = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(String(headers.authorization ?? ''));
  if (!m) return undefined;
  const decoded = Buffer.from(m[1], 'base64').toString('utf8');
  const user = decoded.slice(0, decoded.includes(':') ? decoded.indexOf(':') : undefined);
  return user === '' ? undefined : user;
}

/** `path` as the account sees it: a relative path is under its home. */
export function pathFor(who: Account, path: string): string {
  return path.startsWith('/') ? path : posix.join(who.home, path);
}

/** The accounts of an /etc/passwd: name → home. */
export function passwdHomes(text: string): Map<string, string> {
  const homes = new Map<string, string>();
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length >= 7 && f[0] && f[5]?.startsWith('/')) homes.set(f[0], f[5]);
  }
  return homes;
}

/**
 * A signed file URL's check (`sandbox.uploadUrl` / `downloadUrl`): `signature` is
 * "v1_" + base64(sha256("path:operation:user:token[:expiration]")) without padding, and names no
 * sandbox, so the caller tries the sandboxes it may be for (the header's, if it has one) with the
 * returned predicate. Null when the request is not a signed URL (it has an access token, or no
 * signature); url_expired once it has expired.
 */
export function signedFileUrl(req: FastifyRequest, operation: 'read' | 'write'): ((id: string, token: string) => boolean) | null {
  const q = req.query as { path?: string; username?: string; signature?: string; signature_expiration?: string };
  if (req.headers['x-access-token'] !== undefined || typeof q.signature !== 'string') return null;
  const expiration = q.signature_expiration;
  if (expiration !== undefined && !(Number(expiration) * 1000 > Date.now())) {
    // E2B's envd's words, which E2B's own tests check; the SDK signs a new URL with downloadUrl/uploadUrl.
    throw new CollimateError('url_expired', 'signature is already expired');
  }
  const header = req.headers['e2b-sandbox-id'];
  const want = Buffer.from(q.signature);
  return (id, token) => {
    if (typeof header === 'string' && header !== id) return false;
    const raw = `${q.path ?? ''}:${operation}:${q.username ?? ''}:${token}${expiration !== undefined ? `:${expiration}` : ''}`;
    const got = Buffer.from('v1_' + createHash('sha256').update(raw).digest('base64').replace(/=+$/, ''));
    return got.length === want.length && timingSafeEqual(got, want);
  };
}

export class Envd {
  /** Whether a sandbox's image has bash (the SDK runs every command with /bin/bash -l -c). */
  private readonly hasBash = new Map<string, boolean>();
  /** Pollable watchers of CreateWatcher (the Python sync SDK), by id: events wait here until fetched. */
  private readonly watchers = new Map<string, { sandbox: string; tenant: string; events: unknown[]; dropped: number; stop: () => void; error?: ConnectError }>();
  private nextWatcher = 1;
  /** Each sandbox's accounts (its /etc/passwd: name → home), read once; read again for a name not in it. */
  private readonly accounts = new Map<string, Map<string, string>>();

  constructor(private readonly opts: EnvdOptions) {}

  private async passwd(scope: Scope, id: string, fresh: boolean): Promise<Map<string, string>> {
    let homes = fresh ? undefined : this.accounts.get(id);
    if (!homes) {
      const chunks: Buffer[] = [];
      await this.backend.readFile(scope, id, '/etc/passwd', { chunk: (c) => void chunks.push(c) }).catch((err) => {
        if (!(err instanceof CollimateError && err.code === 'file_not_found')) throw err;
      });
      homes = passwdHomes(Buffer.concat(chunks).toString('utf8'));
      if (this.accounts.size > 10_000) this.accounts.clear();
      this.accounts.set(id, homes);
    }
    return homes;
  }

  /**
   * Who a request runs as: the account it names, or E2B's default `user` where the image has one
   * (else root). An account the image does not have is passed on by name: the guest refuses it
   * (user_not_found) for what runs or writes as it.
   */
  async accountFor(scope: Scope, id: string, named: string | undefined): Promise<Account> {
    if (named === 'root') return { home: '/root' };
    if (named === undefined) {
      const home = (await this.passwd(scope, id, false)).get(E2B_DEFAULT_USER);
      return home ? { user: E2B_DEFAULT_USER, home } : { home: '/root' };
    }
    const home = (await this.passwd(scope, id, false)).get(named) ?? (await this.passwd(scope, id, true)).get(named);
    return { user: named, home: home ?? posix.join('/home', named) };
  }

  private get backend(): EnvdBackend {
    return this.opts.backend;
  }

  /** The sandbox a request is for, and the tenant's scope, from its headers (401 without a valid token). */
  async authorize(headers: IncomingMessage['headers']): Promise<{ scope: Scope; id: string }> {
    const id = String(headers['e2b-sandbox-id'] ?? '');
    const token = String(headers['x-access-token'] ?? '');
    if (!id) throw new CollimateError('validation_error', 'E2b-Sandbox-Id is required: envd serves every sandbox at one URL.');
    const scope = await this.opts.tenants.accounts.sandboxScope(id, token);
    return { scope, id };
  }

  /** Like authorize, or by a signed URL (signedFileUrl): the running sandbox it was made for is looked for. */
  async authorizeFile(req: FastifyRequest, operation: 'read' | 'write'): Promise<{ scope: Scope; id: string }> {
    const matches = signedFileUrl(req, operation);
    if (!matches) return this.authorize(req.headers);
    const found = await this.opts.tenants.accounts.sandboxByToken(matches);
    if (!found) throw new CollimateError('unauthorized', 'This signed file URL is not valid for any running sandbox (altered, for another path or operation, or its sandbox is gone).');
    return found;
  }

  private async argvFor(scope: Scope, id: string, cmd: string, args: string[]): Promise<string[]> {
    if (cmd !== '/bin/bash') return [cmd, ...args];
    let has = this.hasBash.get(id);
    if (has === undefined) {
      has = await this.backend.stat(scope, id, '/bin/bash').then(() => true, (err) => {
        if (err instanceof CollimateError && err.code === 'file_not_found') return false;
        throw err;
      });
      if (this.hasBash.size > 10_000) this.hasBash.clear();
      this.hasBash.set(id, has);
    }
    if (has) return [cmd, ...args];
    return ['/bin/sh', ...args.filter((a) => a !== '-l')];
  }

  /**
   * Streams a process's events: start, output, end; detaches when the client goes away. The process
   * is attached before the start event goes out, so a pid that is not there is an error the SDK's
   * connect rejects with (E2B's envd answers not_found), not a start followed by one.
   */
  private async follow(scope: Scope, id: string, pid: number, fromStart: boolean, stream: ServerStream, req: IncomingMessage): Promise<void> {
    const early: Record<string, unknown>[] = [];
    let send = (m: Record<string, unknown>) => void early.push(m);
    let exited = false;
    let wake: (() => void) | undefined;
    const detach = await this.backend.attachProcess(scope, id, pid, fromStart, {
      onOutput: (kind, data) => send({ event: { data: { [kind]: data.toString('base64') } } }),
      onExit: (exit) => {
        // A process ended by its sandbox going away (killed, timed out, paused) gets no end event:
        // E2B's envd goes with its sandbox, so the SDK sees the connection drop, asks /health (502)
        // and says the sandbox was killed or reached its end of life, not that the command failed.
        void this.running(scope, id).then((running) => {
          if (running) send({ event: { end: endEventJson(exit) } });
          else req.socket.destroy();
          exited = true;
          wake?.();
        });
      },
    });
    const gone = () => wake?.();
    req.socket.once('close', gone);
    try {
      await stream.send({ event: { start: { pid } } });
      for (const m of early) void stream.send(m);
      send = (m) => void stream.send(m);
      if (!exited && !req.socket.destroyed) await new Promise<void>((resolve) => (wake = resolve));
    } finally {
      req.socket.off('close', gone);
      detach();
    }
  }

  /** Whether the sandbox runs now (false once deleted, suspended or gone). */
  private async running(scope: Scope, id: string): Promise<boolean> {
    return this.opts.tenants.sandboxes.get(scope, id).then((info) => info.state === 'running', () => false);
  }

  readonly unary: Partial<Record<string, Unary>> = {
    'process.Process/List': async (scope, id) => ({
      processes: (await this.backend.listProcesses(scope, id)).map((p) => ({
        config: { cmd: p.argv[0] ?? '', args: p.argv.slice(1), envs: p.env ?? {}, ...(p.cwd ? { cwd: p.cwd } : {}) },
        pid: p.pid,
        ...(p.tag ? { tag: p.tag } : {}),
      })),
    }),
    'process.Process/SendInput': async (scope, id, msg) => {
      const pid = await selectPid(this.backend, scope, id, msg.process);
      await this.backend.sendInput(scope, id, pid, inputOf(msg.input));
      return {};
    },
    'process.Process/SendSignal': async (scope, id, msg) => {
      const pid = await selectPid(this.backend, scope, id, msg.process);
      const sig = msg.signal;
      const signal = sig === 'SIGNAL_SIGKILL' || sig === 9 ? 'SIGKILL' : sig === 'SIGNAL_SIGTERM' || sig === 15 ? 'SIGTERM' : null;
      if (!signal) throw new ConnectError('invalid_argument', 'signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL');
      await this.backend.signalProcess(scope, id, pid, signal);
      return {};
    },
    'process.Process/CloseStdin': async (scope, id, msg) => {
      await this.backend.closeStdin(scope, id, await selectPid(this.backend, scope, id, msg.process));
      return {};
    },
    'process.Process/Update': async (scope, id, msg) => {
      const pid = await selectPid(this.backend, scope, id, msg.process);
      const size = ((msg.pty as { size?: { cols?: unknown; rows?: unknown } } | undefined)?.size ?? {}) as { cols?: unknown; rows?: unknown };
      const cols = uint(size.cols, 'pty.size.cols');
      const rows = uint(size.rows, 'pty.size.rows');
      if (cols !== undefined && rows !== undefined) await this.backend.resizeProcess(scope, id, pid, cols, rows);
      return {};
    },
    'filesystem.Filesystem/Stat': async (scope, id, msg, who) => ({ entry: entryJson(await this.backend.stat(scope, id, pathFor(who, str(msg.path, 'path')!))) }),
    'filesystem.Filesystem/MakeDir': async (scope, id, msg, who) => {
      const made = await this.backend.makeDir(scope, id, pathFor(who, str(msg.path, 'path')!), who.user);
      if (!made.created) throw new ConnectError('already_exists', `${msg.path} already exists`);
      return { entry: entryJson(made.entry) };
    },
    'filesystem.Filesystem/Move': async (scope, id, msg, who) => ({ entry: entryJson(await this.backend.move(scope, id, pathFor(who, str(msg.source, 'source')!), pathFor(who, str(msg.destination, 'destination')!))) }),
    'filesystem.Filesystem/ListDir': async (scope, id, msg, who) => {
      const depth = uint(msg.depth, 'depth') ?? 1;
      return { entries: (await this.backend.listDir(scope, id, pathFor(who, str(msg.path, 'path')!), Math.max(1, depth))).map(entryJson) };
    },
    'filesystem.Filesystem/Remove': async (scope, id, msg, who) => {
      // E2B's remove is idempotent: a path that is not there is already removed.
      await this.backend.remove(scope, id, pathFor(who, str(msg.path, 'path')!)).catch((err) => {
        if (!(err instanceof CollimateError && err.code === 'file_not_found')) throw err;
      });
      return {};
    },
    'filesystem.Filesystem/CreateWatcher': async (scope, id, msg, who) => {
      const watcherId = `w${this.nextWatcher++}`;
      const entry = { sandbox: id, tenant: scope.tenant, events: [] as unknown[], dropped: 0, stop: () => {}, error: undefined as ConnectError | undefined };
      this.watchers.set(watcherId, entry);
      try {
        entry.stop = await this.backend.watchDir(scope, id, pathFor(who, str(msg.path, 'path')!), msg.recursive === true, (e) => {
          if (entry.events.length >= 10_000) entry.dropped++;
          else entry.events.push({ name: e.name, type: EVENT_TYPE[e.type] });
        }, (err) => {
          if (err) entry.error = connectErrorOf(err);
        });
      } catch (err) {
        this.watchers.delete(watcherId);
        throw err;
      }
      return { watcherId };
    },
    'filesystem.Filesystem/GetWatcherEvents': async (scope, id, msg) => {
      const w = this.watcherOf(scope, id, msg.watcherId);
      if (w.dropped > 0) {
        const dropped = w.dropped;
        w.dropped = 0;
        throw new ConnectError('resource_exhausted', `${dropped} events were dropped: fetch events more often (at most 10000 wait)`);
      }
      if (w.error && w.events.length === 0) throw w.error;
      return { events: w.events.splice(0) };
    },
    'filesystem.Filesystem/RemoveWatcher': async (scope, id, msg) => {
      const w = this.watcherOf(scope, id, msg.watcherId);
      w.stop();
      this.watchers.delete(String(msg.watcherId));
      return {};
    },
  };

  readonly streaming: Partial<Record<string, Streaming>> = {
    'process.Process/Start': async (scope, id, msg, stream, req, who) => {
      const proc = (msg.process ?? {}) as { cmd?: unknown; args?: unknown; envs?: unknown; cwd?: unknown };
      const cmd = str(proc.cmd, 'process.cmd')!;
      const args = Array.isArray(proc.args) ? proc.args.map((a, i) => str(a, `process.args[${i}]`)!) : [];
      const envs = (proc.envs ?? {}) as Record<string, unknown>;
      for (const [k, v] of Object.entries(envs)) if (typeof v !== 'string') throw new ConnectError('invalid_argument', `process.envs.${k} must be a string`);
      const size = ((msg.pty as { size?: { cols?: unknown; rows?: unknown } } | undefined)?.size ?? undefined) as { cols?: unknown; rows?: unknown } | undefined;
      const pty = msg.pty ? { cols: uint(size?.cols, 'pty.size.cols') ?? 80, rows: uint(size?.rows, 'pty.size.rows') ?? 24 } : undefined;
      const spec: ProcessSpec = {
        argv: await this.argvFor(scope, id, cmd, args),
        env: { ...(await this.opts.env.get(id)), ...(envs as Record<string, string>) },
        ...(typeof proc.cwd === 'string' && proc.cwd !== '' ? { cwd: pathFor(who, proc.cwd) } : {}),
        ...(pty ? { pty } : {}),
        stdin: msg.stdin === true || pty !== undefined,
        ...(typeof msg.tag === 'string' && msg.tag !== '' ? { tag: msg.tag } : {}),
        ...(who.user ? { user: who.user } : {}),
      };
      const { pid } = await this.backend.startProcess(scope, id, spec);
      await this.follow(scope, id, pid, true, stream, req);
    },
    'process.Process/Connect': async (scope, id, msg, stream, req) => {
      const pid = await selectPid(this.backend, scope, id, msg.process);
      await this.follow(scope, id, pid, false, stream, req);
    },
    'filesystem.Filesystem/WatchDir': async (scope, id, msg, stream, req, who) => {
      const path = pathFor(who, str(msg.path, 'path')!);
      await new Promise<void>((resolve, reject) => {
        let stop: (() => void) | undefined;
        let done = false;
        const finish = (err?: CollimateError) => {
          if (done) return;
          done = true;
          stop?.();
          req.socket.off('close', onClose);
          if (err) reject(err);
          else resolve();
        };
        const onClose = () => finish();
        req.socket.once('close', onClose);
        this.backend
          .watchDir(scope, id, path, msg.recursive === true, msg.includeEntry === true ? this.withEntries(scope, id, path, stream) : (e) => void stream.send({ filesystem: { name: e.name, type: EVENT_TYPE[e.type] } }), finish)
          .then(async (s) => {
            stop = s;
            if (done) return s();
            await stream.send({ start: {} });
          }, (err) => finish(toClientError(err)));
      });
    },
  };

  /**
   * includeEntry (envd 0.6.3): each event is sent with the entry as it is now (none once it is
   * gone), in order. The stats wait in line; a client so far behind that more than
   * ENTRY_STATS_PENDING_MAX wait is cut off, as ServerStream cuts off one whose sends are behind.
   */
  private withEntries(scope: Scope, id: string, path: string, stream: ServerStream): (e: FsEvent) => void {
    let line = Promise.resolve();
    let waiting = 0;
    return (e) => {
      if (stream.closed) return;
      if (++waiting > ENTRY_STATS_PENDING_MAX) return stream.cutOff();
      line = line.then(async () => {
        const entry = e.type === 'remove' ? undefined : await this.backend.stat(scope, id, posix.join(path, e.name)).catch(() => undefined);
        waiting--;
        void stream.send({ filesystem: { name: e.name, type: EVENT_TYPE[e.type], ...(entry ? { entry: entryJson(entry) } : {}) } });
      });
    };
  }

  private watcherOf(scope: Scope, id: string, watcherId: unknown) {
    const w = this.watchers.get(String(watcherId ?? ''));
    if (!w || w.sandbox !== id || w.tenant !== scope.tenant) throw new ConnectError('not_found', `no watcher ${String(watcherId).slice(0, 40)} on this sandbox`);
    return w;
  }

  /** Stops every pollable watcher (server shutdown). */
  close(): void {
    for (const w of this.watchers.values()) w.stop();
    this.watchers.clear();
  }
}

/** Reads a whole request body, refusing more than `limit` bytes. */
function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        reject(new ConnectError('resource_exhausted', `request body over ${limit} bytes`));
        req.destroy();
        return;
      }
      parts.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(parts)));
    req.on('error', reject);
  });
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent) return void res.destroy();
  const text = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': text.length });
  res.end(text);
}

/** envd's plain-HTTP error: `{code, message}` with the HTTP status (the SDK maps 404 to its not-found errors). */
function sendHttpError(res: ServerResponse, err: CollimateError): void {
  const status = err.code === 'invalid_state' ? 502 : err.status;
  sendJson(res, status, { code: status, message: err.text(e2bNames) });
}

export function registerEnvd(app: FastifyInstance, opts: EnvdOptions): Envd {
  const envd = new Envd(opts);
  app.addHook('onClose', async () => envd.close());

  void app.register(async (scope) => {
    // Bodies stay unread here: RPCs read theirs bounded, uploads stream theirs to the guest.
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', (_req, _payload, done) => done(null));

    scope.get(`${E2B_ENVD_PREFIX}/health`, async (req, reply) => {
      reply.hijack();
      try {
        const { scope: s, id } = await envd.authorize(req.headers);
        const info = await opts.tenants.sandboxes.get(s, id);
        if (info.state !== 'running') return sendJson(reply.raw, 502, { code: 502, message: `sandbox ${id} is ${info.state}` });
        // Past its end the reaper acts within a second or so; until then it is already over for the SDK.
        if (Date.parse(info.expires_at) <= Date.now()) return sendJson(reply.raw, 502, { code: 502, message: `sandbox ${id}'s session ended at ${info.expires_at}` });
        reply.raw.writeHead(204).end();
      } catch (err) {
        const e = toClientError(err, req.log);
        // As E2B's: no running sandbox answers this token (killed, or its tokens gone with it) is 502,
        // the SDK's sign that the sandbox ended. Decided without a lookup, so it costs a MAC at most.
        if (e.code === 'unauthorized' || e.code === 'sandbox_not_found') {
          return sendJson(reply.raw, 502, { code: 502, message: 'No running sandbox answers to this id and access token.' });
        }
        sendHttpError(reply.raw, e);
      }
    });

    // Also at /files: the SDK's uploadUrl/downloadUrl resolve "/files" against E2B_SANDBOX_URL's origin.
    for (const filesPath of [`${E2B_ENVD_PREFIX}/files`, '/files']) {
      scope.get(filesPath, async (req, reply) => {
        reply.hijack();
        const res = reply.raw;
        try {
          const { scope: s, id } = await envd.authorizeFile(req, 'read');
          const query = req.query as { path?: string; username?: string };
          if (!query.path) throw new CollimateError('validation_error', 'path is required.');
          const path = pathFor(await envd.accountFor(s, id, query.username || undefined), query.path);
          // As envd: `Accept-Encoding: gzip` (the SDK's read({gzip: true})) gets the file gzip-compressed.
          const gzip = /\bgzip\b/i.test(String(req.headers['accept-encoding'] ?? '')) ? createGzip() : undefined;
          const out: Writable = gzip ?? res;
          if (gzip) {
            gzip.pipe(res);
            gzip.on('error', () => res.destroy());
          }
          await opts.backend.readFile(s, id, path, {
            // A pseudo-file (/proc, /sys) states no size (-1), and a compressed one a size of its own: chunked, to its end.
            start: ({ size }) => void res.writeHead(200, { 'content-type': 'application/octet-stream', ...(gzip ? { 'content-encoding': 'gzip' } : size >= 0 ? { 'content-length': size } : {}) }),
            chunk: (data) => (out.write(data) ? undefined : new Promise<void>((resolve) => {
              out.once('drain', resolve);
              res.once('close', resolve);
            })),
          });
          if (!res.headersSent) res.writeHead(200, { 'content-type': 'application/octet-stream', ...(gzip ? { 'content-encoding': 'gzip' } : { 'content-length': 0 }) });
          if (gzip) gzip.end();
          else res.end();
        } catch (err) {
          // Past the headers the status is sent: the client learns of the failure by the short body.
          if (res.headersSent) res.destroy();
          else sendHttpError(res, toClientError(err, req.log));
        }
      });

      scope.post(filesPath, async (req, reply) => {
        reply.hijack();
        const res = reply.raw;
        try {
          const { scope: s, id } = await envd.authorizeFile(req, 'write');
          const query = req.query as { path?: string; username?: string };
          const who = await envd.accountFor(s, id, query.username || undefined);
          const write = { ...(who.user ? { user: who.user } : {}), ...((m) => (m ? { metadata: m } : {}))(uploadMetadata(req.headers)) };
          const queryPath = query.path === undefined || query.path === '' ? undefined : pathFor(who, query.path);
          const type = String(req.headers['content-type'] ?? '');
          if (/^multipart\/form-data/i.test(type)) {
            const written = await uploadMultipart(req.raw, queryPath, (path, stream) => opts.backend.writeFile(s, id, pathFor(who, path), stream, write));
            return sendJson(res, 200, written.map(writtenEntryJson));
          }
          if (!queryPath) throw new CollimateError('validation_error', 'path is required for an application/octet-stream upload.');
          const entry = await opts.backend.writeFile(s, id, queryPath, uploadBody(req.raw), write);
          sendJson(res, 200, [writtenEntryJson(entry)]);
        } catch (err) {
          // The rest of the body is read first, so a client still sending reads this answer.
          if (!(await discardRest(req.raw))) res.setHeader('connection', 'close');
          sendHttpError(res, toClientError(err, req.log));
        }
      });
    }

    const rpc = async (req: FastifyRequest, res: ServerResponse, method: string) => {
      const streaming: Streaming | undefined = envd.streaming[method];
      const unary: Unary | undefined = envd.unary[method];
      let stream: ServerStream | undefined;
      try {
        const body = await readBody(req.raw, MAX_ENVELOPE_BYTES + 5);
        const { scope: s, id } = await envd.authorize(req.headers);
        const who = await envd.accountFor(s, id, basicUser(req.headers));
        if (streaming) {
          const messages = String(req.headers['content-type'] ?? '').startsWith(CONNECT_STREAM_TYPE) ? decodeEnvelopes(body) : [decodeUnary(body)];
          const msg = (messages[0] ?? {}) as Record<string, unknown>;
          opts.tenants.quotas.holdStream(s, res);
          stream = new ServerStream(res);
          const interval = Number(req.headers['keepalive-ping-interval']);
          stream.keepAlive(interval, () => (method.startsWith('filesystem') ? { keepalive: {} } : { event: { keepalive: {} } }));
          await streaming(s, id, msg, stream, req.raw, who);
          stream.end();
        } else if (unary) {
          sendUnary(res, await unary(s, id, decodeUnary(body), who));
        } else if (method === 'process.Process/StreamInput') {
          // Client streaming, whole body: a start naming the process, then data messages.
          const messages = decodeEnvelopes(body) as Array<{ start?: { process?: unknown }; data?: { input?: unknown } }>;
          const pid = await selectPid(opts.backend, s, id, messages.find((m) => m.start)?.start?.process);
          for (const m of messages) if (m.data) await opts.backend.sendInput(s, id, pid, inputOf(m.data.input));
          stream = new ServerStream(res);
          await stream.send({});
          stream.end();
        } else {
          throw new ConnectError('unimplemented', `${method} is not served by Collimate's envd`);
        }
      } catch (err) {
        const e = asConnectError(err, req.log);
        if (stream) stream.end(e);
        else if (streaming && String(req.headers['content-type'] ?? '').startsWith(CONNECT_STREAM_TYPE)) new ServerStream(res).end(e);
        else sendUnaryError(res, e);
      }
    };
    for (const method of [...Object.keys(envd.unary), ...Object.keys(envd.streaming), 'process.Process/StreamInput']) {
      scope.post(`${E2B_ENVD_PREFIX}/${method}`, async (req, reply) => {
        reply.hijack();
        await rpc(req, reply.raw, method);
      });
    }
  });
  return envd;
}

/** Each multipart `file` part is written to its own path: the part's filename, or the query's path. */
/**
 * An octet-stream upload's bytes, decompressed when sent with `Content-Encoding: gzip` (the SDK's
 * write({gzip: true})). The decompressed bytes count against the upload limit where they are
 * written, so a small body that inflates to more is refused there; a body that is not gzip is a 400.
 */
function uploadBody(req: IncomingMessage): AsyncIterable<Buffer> {
  const encoding = String(req.headers['content-encoding'] ?? '').trim().toLowerCase();
  if (encoding === '' || encoding === 'identity') return bodyChunks(req);
  if (encoding !== 'gzip' && encoding !== 'x-gzip') throw new CollimateError('unsupported_media_type', `Content-Encoding ${encoding.slice(0, 40)} is not supported; send gzip or the bytes as they are.`);
  const gunzip = createGunzip();
  // Read through the iterator below, which takes its errors; this one is for a body never read (the
  // write was refused first), whose bad gzip would otherwise be an uncaught 'error' event.
  gunzip.on('error', () => {});
  req.pipe(gunzip);
  return (async function* () {
    try {
      for await (const chunk of gunzip) yield chunk as Buffer;
    } catch (err) {
      throw new CollimateError('validation_error', `The gzip-encoded upload could not be decompressed (${(err as Error).message}); nothing was written.`);
    } finally {
      req.unpipe(gunzip);
    }
  })();
}

/** The largest `file` part without a filename (a form field to the parser, held in memory whole). */
const FIELD_FILE_MAX = 1024 * 1024;

function uploadMultipart(req: IncomingMessage, queryPath: string | undefined, write: (path: string, data: AsyncIterable<Buffer>) => Promise<FsEntry>): Promise<FsEntry[]> {
  return new Promise((resolve, reject) => {
    const writes: Promise<FsEntry>[] = [];
    let failed = false;
    const fail = (err: unknown) => {
      if (failed) return;
      failed = true;
      req.unpipe();
      req.resume();
      reject(err);
    };
    let parser: Busboy.Busboy;
    try {
      parser = Busboy({ headers: req.headers, preservePath: true, limits: { files: 1000, fields: 100, fieldSize: FIELD_FILE_MAX } } as Busboy.BusboyConfig);
    } catch {
      return reject(new CollimateError('validation_error', 'The multipart body has no boundary.'));
    }
    parser.on('file', (_field, file, info) => {
      const path = queryPath ?? info.filename;
      if (!path) {
        file.resume();
        return fail(new CollimateError('validation_error', 'Every file part needs a path: the part\'s filename or ?path=.'));
      }
      // One part at a time reaches the guest: the next part's bytes wait in the parser meanwhile.
      const pass = Readable.from(file);
      writes.push(write(path, pass).catch((err) => {
        file.resume();
        throw err;
      }));
    });
    // A `file` part without a filename (FormData.append('file', 'text')) is a field to Busboy and a
    // file to envd: its value is written to ?path=.
    parser.on('field', (name, value, info) => {
      if (name !== 'file') return;
      if (!queryPath) return fail(new CollimateError('validation_error', 'A file part without a filename needs ?path= to say where it goes.'));
      if (info.valueTruncated) return fail(new CollimateError('payload_too_large', `A file part without a filename holds at most ${FIELD_FILE_MAX} bytes; send larger files as parts with a filename.`));
      writes.push(write(queryPath, Readable.from([Buffer.from(value)])));
    });
    // Busboy's own words for a body that is not multipart as declared (no closing boundary, a bad part header): the client's to fix.
    parser.on('error', (err) => fail(new CollimateError('validation_error', `The multipart body is malformed: ${String((err as Error)?.message ?? err).slice(0, 200)}.`)));
    parser.on('close', () => {
      Promise.all(writes).then(resolve, fail);
    });
    req.pipe(parser);
  });
}
