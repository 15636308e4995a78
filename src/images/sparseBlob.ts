import { createHash } from 'node:crypto';
import { open } from 'node:fs/promises';

/**
 * The sparse representation of a blob, for files that are mostly zeros: template RAM files (a
 * 512 MiB guest's RAM file holds ~90 MiB of data, the rest holes) and frozen disks (an ext4 image
 * whose free blocks were never written). Sent as-is they would cost their whole size in transfer,
 * and written as-is at the receiver they would fill its tmpfs with zero pages.
 *
 * The body is a sequence of frames, each a 12-byte head — the offset (u64, big-endian) and length
 * (u32) of a run of pages holding data — then those bytes. Runs of zero pages are not sent; the
 * receiver sizes its file first (truncate: all hole) and writes only the frames, so its copy keeps
 * the holes. Holes are still read at the sender (Node has no SEEK_DATA), but reading a hole costs no
 * disk I/O: the kernel returns zeros.
 */
export const SPARSE_MEDIA_TYPE = 'application/vnd.collimate.sparse-blob.v1';

/** Where hosts serve their blobs to peers (src/api/blobRoutes.ts), and the headers both sides read. */
export const BLOB_PATH = '/cluster/blobs';
/** The blob's whole size, sent with every representation (a sparse body's length is not its size). */
export const BLOB_SIZE_HEADER = 'x-collimate-blob-size';
export const BLOB_KIND_HEADER = 'x-collimate-blob-kind';

const PAGE = 4096;
const CHUNK = 1 << 20;
const HEAD = 12;
/** A run sent in one frame at most (frames stay small enough to buffer). */
const MAX_RUN = 4 << 20;
const ZERO = Buffer.alloc(PAGE);

function isZero(b: Buffer): boolean {
  return b.length === PAGE ? b.equals(ZERO) : b.equals(ZERO.subarray(0, b.length));
}

/** The frames of `path`'s data runs, streamed (a file of `size` bytes). */
export async function* sparseFrames(path: string): AsyncGenerator<Buffer> {
  const fh = await open(path, 'r');
  try {
    const buf = Buffer.alloc(CHUNK);
    let pos = 0;
    let run: Buffer[] = [];
    let runAt = 0;
    let runLen = 0;
    const flush = function* () {
      if (runLen === 0) return;
      const head = Buffer.alloc(HEAD);
      head.writeBigUInt64BE(BigInt(runAt), 0);
      head.writeUInt32BE(runLen, 8);
      yield Buffer.concat([head, ...run]);
      run = [];
      runLen = 0;
    };
    for (;;) {
      const { bytesRead } = await fh.read(buf, 0, CHUNK, pos);
      if (bytesRead === 0) break;
      for (let o = 0; o < bytesRead; o += PAGE) {
        const page = buf.subarray(o, Math.min(o + PAGE, bytesRead));
        if (isZero(page)) {
          yield* flush();
          continue;
        }
        if (runLen === 0) runAt = pos + o;
        run.push(Buffer.from(page));
        runLen += page.length;
        if (runLen >= MAX_RUN) yield* flush();
      }
      pos += bytesRead;
    }
    yield* flush();
  } finally {
    await fh.close();
  }
}

export class SparseFormatError extends Error {}

/**
 * Writes the frames read from `body` into `path` (created, sized to `size`, holes where no frame
 * lands) and returns the sha256 of the whole file's bytes, zeros included: what the blob's digest
 * is over. Throws SparseFormatError on frames that overlap, go backwards or past `size`, or a
 * truncated body.
 */
export async function writeSparse(body: AsyncIterable<Buffer>, path: string, size: number): Promise<{ digest: string; dataBytes: number }> {
  const fh = await open(path, 'wx', 0o600);
  const hash = createHash('sha256');
  let hashed = 0;
  let dataBytes = 0;
  const zerosTo = (end: number) => {
    while (hashed < end) {
      const n = Math.min(CHUNK, end - hashed);
      hash.update(n === CHUNK ? ZERO_CHUNK : Buffer.alloc(n));
      hashed += n;
    }
  };
  try {
    await fh.truncate(size);
    let pending: Buffer = Buffer.alloc(0);
    let frame: { at: number; len: number } | null = null;
    for await (const c of body) {
      pending = pending.length ? Buffer.concat([pending, c]) : c;
      for (;;) {
        if (!frame) {
          if (pending.length < HEAD) break;
          const at = Number(pending.readBigUInt64BE(0));
          const len = pending.readUInt32BE(8);
          if (len === 0 || len > MAX_RUN || at < hashed || at + len > size) throw new SparseFormatError(`a frame [${at}, +${len}) does not fit a ${size}-byte blob after byte ${hashed}`);
          frame = { at, len };
          pending = pending.subarray(HEAD);
        }
        if (pending.length < frame.len) break;
        const data = pending.subarray(0, frame.len);
        zerosTo(frame.at);
        hash.update(data);
        await fh.write(data, 0, data.length, frame.at);
        hashed += data.length;
        dataBytes += data.length;
        pending = pending.subarray(frame.len);
        frame = null;
      }
    }
    if (frame || pending.length) throw new SparseFormatError('the sparse body ended inside a frame');
    zerosTo(size);
    await fh.sync();
  } finally {
    await fh.close();
  }
  return { digest: `sha256:${hash.digest('hex')}`, dataBytes };
}

const ZERO_CHUNK = Buffer.alloc(CHUNK);
