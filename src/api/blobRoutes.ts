import { createReadStream } from 'node:fs';
import { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { CollimateError } from '../errors.js';
import { DIGEST_RE, LocalBlobs, type LocalBlob } from '../images/localBlobs.js';
import type { LayerStore } from '../images/layerStore.js';
import { homePaths } from '../host/paths.js';
import { BlobLocations, BlobPublisher } from '../cluster/blobLocations.js';
import type { ClusterNode } from '../cluster/node.js';
import { PEER_HEADER } from '../cluster/peerHeader.js';
import { BLOB_KIND_HEADER, BLOB_PATH, BLOB_SIZE_HEADER, SPARSE_MEDIA_TYPE, sparseFrames } from '../images/sparseBlob.js';
import { sendError } from './binder.js';

/**
 * The blob API between cluster hosts, shaped like OCI distribution's blob endpoint: `GET` and
 * `HEAD /cluster/blobs/sha256:<hex>` serve one blob this host holds (localBlobs.ts) by the sha256
 * of its bytes. Only peers reach it — the request must carry the cluster's peer secret
 * (PEER_HEADER, src/cluster/node.ts); a tenant's key is not enough, and the path is outside /v1.
 *
 * - `Range: bytes=A-B` (one range) answers 206 with Content-Range; a range that starts past the
 *   end answers 416 with a Content-Range giving the size (RFC 9110); a malformed Range header is ignored (the
 *   whole blob, 200), as RFC 9110 says.
 * - `Accept: application/vnd.collimate.sparse-blob.v1` on a blob that is mostly holes (RAM files,
 *   disks) answers its data runs only (sparseBlob.ts), its size in `x-collimate-blob-size`.
 * - `Docker-Content-Digest` names the digest, as a registry does; the puller verifies it anyway.
 */

export interface BlobRoutesOptions {
  blobs: LocalBlobs;
  /** Whether a request's peer header carries the cluster's peer secret (ClusterNode.isPeer). */
  isPeer(header: string | string[] | undefined): boolean;
  peerHeader: string;
}

export function registerBlobRoutes(app: FastifyInstance, opts: BlobRoutesOptions): void {
  app.route({
    method: ['GET', 'HEAD'],
    url: `${BLOB_PATH}/:digest`,
    exposeHeadRoute: false,
    handler: async (req: FastifyRequest, reply: FastifyReply) => {
      if (!opts.isPeer(req.headers[opts.peerHeader])) {
        sendError(reply, new CollimateError('unauthorized', 'The blob API serves cluster hosts only: a request must carry the cluster peer secret. Tenants pull images with POST /v1/images.'));
        return reply;
      }
      const { digest } = req.params as { digest: string };
      if (!DIGEST_RE.test(digest)) {
        sendError(reply, new CollimateError('validation_error', `"${digest.slice(0, 80)}" is not a blob digest: use sha256: followed by 64 lowercase hex digits.`));
        return reply;
      }
      const blob = await opts.blobs.find(digest);
      if (!blob) {
        sendError(reply, new CollimateError('not_found', `This host holds no blob ${digest}; ask another host that holds it.`));
        return reply;
      }
      return serve(req, reply, blob);
    },
  });
}

function serve(req: FastifyRequest, reply: FastifyReply, blob: LocalBlob): FastifyReply {
  const head = req.method === 'HEAD';
  reply.header('docker-content-digest', blob.digest).header(BLOB_KIND_HEADER, blob.kind).header(BLOB_SIZE_HEADER, String(blob.size)).header('accept-ranges', 'bytes');
  const range = parseRange(req.headers.range, blob.size);
  if (range === 'unsatisfiable') {
    reply.code(416).header('content-range', `bytes */${blob.size}`);
    return reply.type('application/json; charset=utf-8').send({
      error: { code: 'range_not_satisfiable', message: `The range ${String(req.headers.range).slice(0, 80)} starts past the end of this ${blob.size}-byte blob.` },
    });
  }
  if (range) {
    reply.code(206).header('content-range', `bytes ${range.start}-${range.end}/${blob.size}`).header('content-length', String(range.end - range.start + 1)).type('application/octet-stream');
    return head ? reply.send() : reply.send(createReadStream(blob.path, { start: range.start, end: range.end, highWaterMark: 1 << 20 }));
  }
  if (blob.sparse && accepts(req.headers.accept, SPARSE_MEDIA_TYPE)) {
    reply.code(200).type(SPARSE_MEDIA_TYPE);
    return head ? reply.send() : reply.send(Readable.from(sparseFrames(blob.path)));
  }
  reply.code(200).type('application/octet-stream').header('content-length', String(blob.size));
  return head ? reply.send() : reply.send(createReadStream(blob.path, { highWaterMark: 1 << 20 }));
}

function accepts(accept: string | undefined, type: string): boolean {
  return (accept ?? '').split(',').some((t) => t.split(';')[0].trim() === type);
}

/**
 * One byte range of a `size`-byte blob from a Range header: null for none or one this API does
 * not take (several ranges, other units: the whole blob is served), 'unsatisfiable' for one that
 * starts at or past the end (or a suffix of 0 bytes).
 */
export function parseRange(header: string | undefined, size: number): { start: number; end: number } | null | 'unsatisfiable' {
  if (!header) return null;
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === '' && m[2] === '')) return null;
  if (m[1] === '') {
    const n = Number(m[2]);
    if (n === 0 || size === 0) return 'unsatisfiable';
    return { start: Math.max(0, size - n), end: size - 1 };
  }
  const start = Number(m[1]);
  const end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  if (m[2] !== '' && Number(m[2]) < start) return null;
  if (start >= size) return 'unsatisfiable';
  return { start, end };
}

/**
 * A cluster host's blobs: its layer store and artifacts served to peers (registerBlobRoutes) and
 * published to blob_locations (BlobPublisher), from now until `stop`. The first publication hashes
 * artifact files never published before, so it runs in the background rather than delaying start.
 */
export function serveClusterBlobs(node: ClusterNode, src: { layers?: LayerStore; cacheDir?: string; ramDir?: string; snapshots?: () => LocalBlob[] }): { blobs: LocalBlobs; register(app: FastifyInstance): void; publishNow(): Promise<void>; stop(): void } {
  const blobs = new LocalBlobs({ layers: src.layers, artifacts: src.cacheDir && src.ramDir ? { dir: homePaths(src.cacheDir).artifacts, ramDir: src.ramDir } : undefined, snapshots: src.snapshots });
  const publisher = new BlobPublisher(new BlobLocations(node.pool), node.hostId, blobs, node.opts.log);
  void publisher.start();
  return {
    blobs,
    register: (app) => registerBlobRoutes(app, { blobs, isPeer: (h) => node.isPeer(h), peerHeader: PEER_HEADER }),
    publishNow: () => publisher.publishNow(),
    stop: () => publisher.stop(),
  };
}
