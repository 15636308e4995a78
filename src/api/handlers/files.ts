/**
 * Handlers of a sandbox's files: streamed download and upload (/files) and the directory
 * operations and watches (/fs/...). Parse → one tenant-service call → render.
 */
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import { CollimateError } from '../../errors.js';
import type { TenantService } from '../../service/tenantService.js';
import { fileEntryView } from '../../wire/views.js';
import type { Handlers } from '../binder.js';
import type { SseStreams } from '../sse.js';
import { bodyChunks } from '../../wire/streamedBody.js';

type FileOps =
  | 'readFile' | 'writeFile' | 'statPath' | 'listDirectory' | 'pathExists' | 'makeDirectory' | 'removePath' | 'renamePath' | 'watchDirectory';

export interface FileHandlerOptions {
  /** Largest upload accepted (PUT /files), in bytes. */
  maxUploadBytes: number;
  /** A download whose client reads nothing for this long is cut (it holds the sandbox's queue). Default 60 s. */
  downloadStallMs?: number;
}

/** Writes one chunk, waiting while the client's socket is full; throws once the client is gone or stalls. */
async function writeChunk(res: ServerResponse, chunk: Buffer, stallMs: number): Promise<void> {
  if (res.destroyed) throw new Error('the client went away');
  if (res.write(chunk)) return;
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), stallMs);
  try {
    await Promise.race([once(res, 'drain', { signal: ac.signal }), once(res, 'close', { signal: ac.signal })]);
  } catch {
    throw new Error(`the client read nothing for ${stallMs / 1000} s`);
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
  if (res.destroyed) throw new Error('the client went away');
}

export function fileHandlers(tenants: TenantService, streams: SseStreams, opts: FileHandlerOptions): Pick<Handlers, FileOps> {
  const stallMs = opts.downloadStallMs ?? 60_000;
  return {
    async readFile({ scope, params, query, reply }) {
      const res = reply.raw;
      let started = false;
      try {
        await tenants.sandboxes.downloadFile(scope, params.id, query.path, {
          start: ({ size, mode }) => {
            reply.hijack();
            // A pseudo-file (/proc, /sys) states no size: it goes out chunked, to its end.
            res.writeHead(200, {
              'content-type': 'application/octet-stream',
              ...(size >= 0 ? { 'content-length': String(size) } : {}),
              'x-file-mode': mode.toString(8).padStart(3, '0'),
            });
            started = true;
          },
          chunk: (data) => writeChunk(res, data, stallMs),
        });
      } catch (e) {
        // Past the headers the status is sent: the client learns of the failure by the short body.
        if (started) {
          res.destroy();
          return null;
        }
        throw e;
      }
      res.end();
      return null;
    },

    async writeFile({ scope, params, query, body, req }) {
      const declared = Number(req.headers['content-length']);
      const tooLarge = () =>
        new CollimateError('payload_too_large', `The upload is larger than this server's limit of ${opts.maxUploadBytes} bytes (COLLIMATE_MAX_UPLOAD_MIB); nothing was written.`);
      if (Number.isFinite(declared) && declared > opts.maxUploadBytes) throw tooLarge();
      // What the upload leaves unread is discarded by the binder before it answers an error.
      const source: AsyncIterable<Buffer> = body ? bodyChunks(body) : Readable.from([]);
      try {
        const written = await tenants.sandboxes.uploadFile(scope, params.id, query.path, source, {
          mode: query.mode === undefined ? undefined : parseInt(query.mode, 8),
          maxBytes: opts.maxUploadBytes,
          ...(query.user !== undefined ? { user: query.user } : {}),
        });
        return { status: 200, body: { path: query.path, size: written.bytes } };
      } catch (e) {
        if (e instanceof CollimateError && e.code === 'payload_too_large') throw tooLarge();
        throw e;
      }
    },

    async statPath({ scope, params, query }) {
      return { status: 200, body: fileEntryView(await tenants.sandboxes.fsStat(scope, params.id, query.path)) };
    },

    async listDirectory({ scope, params, query }) {
      const listing = await tenants.sandboxes.fsList(scope, params.id, query.path, query.depth ?? 1);
      return { status: 200, body: { path: query.path, entries: listing.entries.map(fileEntryView), truncated: listing.truncated } };
    },

    async pathExists({ scope, params, query }) {
      return { status: 200, body: { path: query.path, exists: await tenants.sandboxes.fsExists(scope, params.id, query.path) } };
    },

    async makeDirectory({ scope, params, body }) {
      const made = await tenants.sandboxes.fsMkdir(scope, params.id, body.path, { mode: body.mode === undefined ? undefined : parseInt(body.mode, 8), user: body.user });
      return { status: 200, body: { created: made.created, entry: fileEntryView(made.entry) } };
    },

    async removePath({ scope, params, body }) {
      const { removed } = await tenants.sandboxes.fsRemove(scope, params.id, body.path);
      return { status: 200, body: { path: body.path, removed } };
    },

    async renamePath({ scope, params, body }) {
      return { status: 200, body: fileEntryView(await tenants.sandboxes.fsRename(scope, params.id, body.from, body.to)) };
    },

    async watchDirectory({ scope, params, query, reply }) {
      const recursive = query.recursive === 'true' || query.recursive === '1';
      tenants.quotas.holdStream(scope, reply.raw);
      await streams.streamWatch(reply, (handlers) => tenants.sandboxes.fsWatch(scope, params.id, query.path, recursive, handlers));
      return null;
    },
  };
}
