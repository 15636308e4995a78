import { randomBytes } from 'node:crypto';
import { posix } from 'node:path';
import { CollimateError } from '../errors.js';
import { AgentError } from '../guest/agentClient.js';
import type { FsEntry, FsEvent } from '../guest/protocol.js';
import { FS_PATH_MAX } from '../guest/protocol.js';
import { agentFailure } from './execFiles.js';
import { settledLink, type Running } from './registry.js';
import { gone, runningFor, type EngineContext } from './context.js';
import type { DirListing, DirWatch, FileEntry, FileSink, MkdirOptions, Scope, UploadOptions, WatchEndReason, WatchHandlers } from './types.js';
import { checkUser } from './exec.js';

/**
 * Files and directories of a running sandbox, through its agent's FS_* messages and chunked
 * FILE_READ / FILE_WRITE (docs/agent-protocol.md, "Files and directories").
 *
 * Directory operations and watches go beside the sandbox's queue (AgentClient.concurrentRequest):
 * they are answered while an exec runs. Only a sandbox the idle pause stopped, or is stopping, makes
 * them wait a turn of the queue, whose gate wakes it (quiesce.ts); while one is under way the idle
 * pause leaves the sandbox alone. Downloads and uploads take their turn on the queue like the
 * whole-file reads and writes, one chunk in memory at a time.
 */

/** Where relative guest paths are (the agent resolves them the same way). */
export const GUEST_HOME = '/root';

/** A guest path as given (absolute, or relative to /root): refused unless non-empty, NUL-free and short enough. */
export function checkFsPath(path: unknown, field = 'path'): string {
  if (typeof path !== 'string' || path.length === 0 || path.includes('\0') || Buffer.byteLength(path) > FS_PATH_MAX) {
    throw new CollimateError('validation_error', `${field} must be a guest path, absolute or relative to ${GUEST_HOME}, without NUL, at most ${FS_PATH_MAX} bytes (e.g. /root/data.txt or data.txt).`);
  }
  return path;
}

/** The absolute guest path of `path` (FILE_READ / FILE_WRITE take absolute paths only). */
export function absoluteGuestPath(path: string): string {
  return path.startsWith('/') ? path : posix.join(GUEST_HOME, path);
}

export function toFileEntry(e: FsEntry): FileEntry {
  const entry: FileEntry = {
    name: e.name, path: e.path, type: e.type, size: e.size, mode: e.mode, uid: e.uid, gid: e.gid, owner: e.owner, group: e.group, mtimeNs: e.mtimeNs,
  };
  if (e.symlinkTarget !== undefined) entry.symlinkTarget = e.symlinkTarget;
  if (e.xattrs !== undefined) entry.xattrs = e.xattrs;
  return entry;
}

/**
 * Runs `fn` on a running sandbox beside its queue. A paused sandbox (or one being paused) is woken
 * first by a turn of the queue; the check and the request's send happen in one tick, so the idle
 * pause cannot stop the VMM between them.
 */
async function beside<T>(ctx: EngineContext, id: string, scope: Scope | undefined, operation: string, fn: (r: Running) => Promise<T>, path?: string): Promise<T> {
  ctx.assertOpen();
  const r = runningFor(ctx, id, scope, operation);
  while (r.paused || r.pausing) {
    await r.queue.run(async () => {
      if (r.deleting) throw gone(r);
    });
  }
  if (r.deleting) throw gone(r);
  ctx.registry.touch(id, false);
  r.besides = (r.besides ?? 0) + 1;
  try {
    return await fn(r);
  } catch (e) {
    await settledLink(r);
    throw agentFailure(r, e, path);
  } finally {
    r.besides -= 1;
    ctx.registry.touch(id, false);
  }
}

export async function fsStat(ctx: EngineContext, id: string, path: string, scope?: Scope): Promise<FileEntry> {
  checkFsPath(path);
  return beside(ctx, id, scope, 'reading a path', async (r) => toFileEntry(await r.live.agent.stat(path)), path);
}

export async function fsList(ctx: EngineContext, id: string, path: string, depth = 1, scope?: Scope): Promise<DirListing> {
  checkFsPath(path);
  if (!Number.isInteger(depth) || depth < 1 || depth > 32) throw new CollimateError('validation_error', `depth must be a whole number from 1 to 32 (1: the directory's own entries), not ${depth}.`);
  return beside(ctx, id, scope, 'listing a directory', async (r) => {
    const listing = await r.live.agent.list(path, depth);
    return { entries: listing.entries.map(toFileEntry), truncated: listing.truncated };
  }, path);
}

export async function fsMkdir(ctx: EngineContext, id: string, path: string, opts: MkdirOptions = {}, scope?: Scope): Promise<{ created: boolean; entry: FileEntry }> {
  checkFsPath(path);
  checkMode(opts.mode);
  checkUser(opts.user);
  return beside(ctx, id, scope, 'making a directory', async (r) => {
    const made = await r.live.agent.mkdir(path, opts.mode, opts.user);
    return { created: made.created, entry: toFileEntry(made.entry) };
  }, path);
}

export async function fsRemove(ctx: EngineContext, id: string, path: string, scope?: Scope): Promise<{ removed: number }> {
  checkFsPath(path);
  return beside(ctx, id, scope, 'removing a path', (r) => r.live.agent.remove(path), path);
}

export async function fsRename(ctx: EngineContext, id: string, from: string, to: string, scope?: Scope): Promise<FileEntry> {
  checkFsPath(from, 'from');
  checkFsPath(to, 'to');
  return beside(ctx, id, scope, 'renaming a path', async (r) => toFileEntry(await r.live.agent.rename(from, to)), from);
}

/** An upload's temporary name (uploadFile) as a watch reports it: the directory part, then the target's name. */
const UPLOAD_TEMP = /(^|\/)\.([^/]+)\.upload-[0-9a-f]{12}$/;

/**
 * Watches a directory. The watch lives as long as the sandbox's agent link: a suspend, a delete, the
 * VM's death or the server closing ends it with the reason (onEnd), as does the directory's removal.
 */
export async function fsWatch(ctx: EngineContext, id: string, path: string, recursive: boolean, handlers: WatchHandlers, scope?: Scope): Promise<DirWatch> {
  checkFsPath(path);
  let ended = false;
  let watchId = 0;
  let running: Running | undefined;
  const end = (reason: WatchEndReason) => {
    if (ended) return;
    ended = true;
    running?.live.agent.off('close', onClose);
    handlers.onEnd(reason);
  };
  // Whoever closed the link says why: suspend marks the row first, delete the Running (suspendResume.ts, delete.ts).
  const onClose = () => {
    const r = running!;
    const row = ctx.repo.get(id);
    if (ctx.isClosing()) end('shutting_down');
    else if (r.lost) end('sandbox_lost');
    else if (r.deleting || !row || row.state === 'deleted') end('sandbox_deleted');
    else if (row.state === 'suspended') end('sandbox_suspended');
    else end('agent_disconnected');
  };
  const placed = new Set<string>();
  const onEvent = (e: FsEvent) => {
    if (ended) return;
    if (e.op === 'end') return end(e.name === 'moved' ? 'directory_moved' : 'directory_removed');
    // An upload (uploadFile) is a write of its path, as a program writing the file in place is (and
    // as E2B's envd reports one): its temporary file's own events are left out, and the rename that
    // puts it in place is reported as a write of the target, not a create.
    const temp = UPLOAD_TEMP.exec(e.name);
    if (temp) {
      if (e.op === 'rename') {
        if (placed.size >= 1024) placed.clear();
        placed.add(e.name.slice(0, temp.index + temp[1].length) + temp[2]);
      }
      return;
    }
    if (e.op === 'create' && placed.delete(e.name)) return handlers.onChange({ op: 'write', name: e.name });
    handlers.onChange({ op: e.op, name: e.name });
  };
  await beside(ctx, id, scope, 'watching a directory', async (r) => {
    running = r;
    watchId = await r.live.agent.watch(path, recursive, onEvent);
    // One listener per watch (the agent allows 32), beside the engine's own.
    if (r.live.agent.getMaxListeners() < 64) r.live.agent.setMaxListeners(64);
    r.live.agent.on('close', onClose);
  }, path);
  return {
    close: async () => {
      if (ended) return;
      ended = true;
      const r = running!;
      r.live.agent.off('close', onClose);
      if (r.live.agent.closed) return;
      await r.live.agent.unwatch(watchId).catch(() => undefined); // the agent drops it anyway when the link goes
    },
  };
}

/** Streams a file of any size (a paused sandbox is woken by its turn of the queue). */
export async function downloadFile(ctx: EngineContext, id: string, path: string, sink: FileSink, scope?: Scope, maxBytes?: number): Promise<{ size: number }> {
  ctx.assertOpen();
  checkFsPath(path);
  const abs = absoluteGuestPath(path);
  const r = runningFor(ctx, id, scope, 'reading a file');
  return r.queue.run(async () => {
    if (r.deleting) throw gone(r);
    ctx.registry.touch(id, false);
    try {
      return await r.live.agent.downloadFile(abs, sink, { maxBytes });
    } catch (e) {
      await settledLink(r);
      throw agentFailure(r, e, abs);
    } finally {
      ctx.registry.touch(id, false);
    }
  });
}

/**
 * Writes `source` to a temporary name beside `path` (`.<name>.upload-<random>`) and renames it over
 * `path` once complete: a failed or aborted upload leaves no file behind and the old one untouched.
 */
export async function uploadFile(ctx: EngineContext, id: string, path: string, source: AsyncIterable<Buffer | Uint8Array | string>, opts: UploadOptions = {}, scope?: Scope): Promise<FileEntry & { bytes: number }> {
  ctx.assertOpen();
  checkFsPath(path);
  checkMode(opts.mode);
  checkUser(opts.user);
  // As another account, a relative path is under that account's home, which the agent knows.
  const abs = opts.user ? path : absoluteGuestPath(path);
  if (abs.endsWith('/')) throw new CollimateError('validation_error', `path ${path} names a directory; give the file's path.`);
  const r = runningFor(ctx, id, scope, 'writing a file');
  const tempPath = posix.join(posix.dirname(abs), `.${posix.basename(abs).slice(0, 200)}.upload-${randomBytes(6).toString('hex')}`);
  return r.queue.run(async () => {
    if (r.deleting) throw gone(r);
    ctx.registry.touch(id, false);
    try {
      const written = await r.live.agent.uploadFile(abs, source, { tempPath, mode: opts.mode, maxBytes: opts.maxBytes, user: opts.user, xattrs: opts.xattrs });
      const { bytes, ...entry } = written;
      return { ...toFileEntry(entry), bytes };
    } catch (e) {
      if (!(e instanceof AgentError) && !(e instanceof CollimateError) && !r.lost && !r.deleting) {
        // The source failed (the client went away mid-body): nothing was written; say so plainly.
        throw new CollimateError('validation_error', `The upload to ${abs} did not arrive whole (${(e as Error).message}); nothing was written.`, { cause: e });
      }
      await settledLink(r);
      throw agentFailure(r, e, abs);
    } finally {
      ctx.registry.touch(id, false);
    }
  });
}

function checkMode(mode: number | undefined): void {
  if (mode !== undefined && (!Number.isInteger(mode) || mode < 0 || mode > 0o7777)) {
    throw new CollimateError('validation_error', `mode must be permission bits from 0 to 0o7777 (e.g. 0o755), not ${mode}.`);
  }
}
