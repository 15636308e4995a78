import { createHash, randomBytes } from 'node:crypto';
import { open, rename, rm } from 'node:fs/promises';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { CollimateError } from '../errors.js';
import { DIGEST_RE } from '../images/localBlobs.js';
import { BLOB_PATH, BLOB_SIZE_HEADER, SPARSE_MEDIA_TYPE, writeSparse } from '../images/sparseBlob.js';
import type { BlobHolder, BlobLocations } from './blobLocations.js';

/**
 * Pulls a blob by digest from a host that holds it (blob_locations, blobLocations.ts) through the
 * peers' blob API (src/api/blobRoutes.ts). The bytes go to a temporary file beside the destination
 * and are hashed as they arrive; only a file whose sha256 is the digest asked for is renamed into
 * place. A holder that fails (unreachable, an error status, a cut-off body) or serves other bytes is
 * dropped and the next holder asked; every failure path removes the temporary file.
 */

/** How long a holder may stay silent (no response, no bytes) before it counts as failed. */
const IDLE_TIMEOUT_MS = 30_000;

export interface FetchedBlob {
  digest: string;
  /** The host that served it. */
  hostId: string;
  /** The blob's size. */
  size: number;
  /** Bytes that crossed the network for it (body only): less than size for a sparse transfer. */
  transferred: number;
  /** Holders tried before, and why each failed. */
  failures: Array<{ hostId: string; reason: string }>;
}

export interface FetchOptions {
  /** Ask for the sparse representation (RAM files, disks); the file written keeps the holes. */
  sparse?: boolean;
}

export class BlobFetcher {
  constructor(
    private readonly locations: BlobLocations,
    private readonly self: { hostId: string; secret: () => string; peerHeader: string },
  ) {}

  /**
   * Fetches `digest` into `dest` (replacing nothing but a file of the same bytes). Throws
   * image_pull_failed when no alive host holds it or every holder failed, saying why each did.
   */
  async fetch(digest: string, dest: string, opts: FetchOptions = {}): Promise<FetchedBlob> {
    if (!DIGEST_RE.test(digest)) throw new CollimateError('validation_error', `"${digest.slice(0, 80)}" is not a blob digest: use sha256: followed by 64 lowercase hex digits.`);
    return this.fetchFrom(await this.locations.holders(digest, this.self.hostId), digest, dest, opts);
  }

  /**
   * Fetches `digest` into `dest` from the given holders (in order), as `fetch` does: a blob that
   * is not published, e.g. a moving sandbox's file, which only its source holds.
   */
  async fetchFrom(holders: BlobHolder[], digest: string, dest: string, opts: FetchOptions = {}): Promise<FetchedBlob> {
    if (!DIGEST_RE.test(digest)) throw new CollimateError('validation_error', `"${digest.slice(0, 80)}" is not a blob digest: use sha256: followed by 64 lowercase hex digits.`);
    const failures: FetchedBlob['failures'] = [];
    for (const h of holders) {
      const tmp = `${dest}.part-${process.pid}-${randomBytes(4).toString('hex')}`;
      try {
        const got = await this.pullFrom(h, digest, tmp, opts);
        if (got.digest !== digest) throw new Error(`it served bytes whose sha256 is ${got.digest}`);
        await rename(tmp, dest);
        return { digest, hostId: h.hostId, size: got.size, transferred: got.transferred, failures };
      } catch (err) {
        failures.push({ hostId: h.hostId, reason: (err as Error).message });
      } finally {
        await rm(tmp, { force: true });
      }
    }
    const why = failures.length ? failures.map((f) => `${f.hostId}: ${f.reason}`).join('; ') : 'no alive host holds it';
    throw new CollimateError('image_pull_failed', `Could not pull blob ${digest} from another host (${why}); retry once a host that holds it is up.`);
  }

  private async pullFrom(h: BlobHolder, digest: string, tmp: string, opts: FetchOptions): Promise<{ digest: string; size: number; transferred: number }> {
    const res = await this.get(h.address, digest, opts.sparse ?? false);
    let transferred = 0;
    const counted = (async function* () {
      for await (const c of res) {
        transferred += (c as Buffer).length;
        yield c as Buffer;
      }
    })();
    try {
      if (res.statusCode !== 200) throw new Error(`it answered ${res.statusCode}`);
      const size = Number(res.headers[BLOB_SIZE_HEADER]);
      if (!Number.isSafeInteger(size) || size < 0) throw new Error(`it sent no valid ${BLOB_SIZE_HEADER}`);
      if (String(res.headers['content-type']).startsWith(SPARSE_MEDIA_TYPE)) {
        const { digest: got } = await writeSparse(counted, tmp, size);
        return { digest: got, size, transferred };
      }
      const hash = createHash('sha256');
      const fh = await open(tmp, 'wx', 0o600);
      try {
        for await (const c of counted) {
          hash.update(c);
          await fh.write(c);
        }
        await fh.sync();
      } finally {
        await fh.close();
      }
      if (transferred !== size) throw new Error(`it sent ${transferred} bytes of a ${size}-byte blob`);
      return { digest: `sha256:${hash.digest('hex')}`, size, transferred };
    } finally {
      res.destroy();
    }
  }

  private get(address: string, digest: string, sparse: boolean): Promise<IncomingMessage> {
    return new Promise((resolve, reject) => {
      const req = httpRequest(`${address}${BLOB_PATH}/${digest}`, {
        method: 'GET',
        headers: { [this.self.peerHeader]: this.self.secret(), accept: sparse ? `${SPARSE_MEDIA_TYPE}, application/octet-stream` : 'application/octet-stream' },
      });
      req.setTimeout(IDLE_TIMEOUT_MS, () => req.destroy(new Error(`it sent nothing for ${IDLE_TIMEOUT_MS / 1000} s`)));
      req.on('response', (res) => {
        res.on('aborted', () => res.destroy(new Error('it cut the body off')));
        resolve(res);
      });
      req.on('error', (err) => reject(new Error(`it could not be reached: ${err.message}`)));
      req.end();
    });
  }
}
