import { createHash } from 'node:crypto';
import { createReadStream, existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, statSync, utimesSync, writeFileSync, chmodSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { spawn } from 'node:child_process';
import { CollimateError } from '../errors.js';
import { invalid, type Descriptor } from './oci.js';
import { buildErofs } from './erofs.js';
import { readTar, TarError } from './tar.js';
import { LayerRejected, unpackLayer, type LayerFacts, type UnpackBudget } from './unpack.js';

/**
 * The layer store: every image layer once, keyed by its diff id (the sha256 of the uncompressed tar),
 * as a read-only erofs image at `<cacheDir>/layers/sha256/<hex>.erofs` beside `<hex>.json` (its size
 * and the facts the image service reads without mounting it). Images that share a base share its
 * files; a variant adds only its own layers. `<cacheDir>/layers/by-blob/<hex>` remembers which diff
 * id a compressed blob was verified to unpack to, so a pull can skip blobs whose layer is held.
 *
 * Layers are built in a staging directory and committed by rename, so a failed pull leaves no layer
 * file behind, and concurrent builders of one layer cannot leave a torn one.
 *
 * Layers nobody uses are collected (layerGc.ts): each home records the layers it needs in
 * `<cacheDir>/layers/homes/`, and a layer written or reused is marked (its json's mtime) so that a
 * collector leaves it alone until the image that uses it is recorded.
 */

/**
 * lz4hc erofs, like the Debian layers: lz4 decompression is cheap even under TCG. --preserve-mtime
 * keeps Python's .pyc checks valid; xattrs (opaque markers, capabilities) are kept by default.
 */

export interface StoredLayer {
  diffId: string;
  path: string;
  /** Bytes of the erofs image. */
  size: number;
  unpackedBytes: number;
  facts: LayerFacts;
  /**
   * sha256 of the erofs image's bytes: what a template's checkpoint is keyed by (never the diff id
   * alone: a checkpoint must not be restored over other bytes of its layers, which another mkfs or
   * an earlier build of ours would make). Layers stored before it was recorded get it on first use.
   */
  erofsDigest?: string;
}

export interface StagedLayer {
  diffId: string;
  blobDigest: string;
  erofs: string;
  json: string;
  meta: Omit<StoredLayer, 'path'>;
}

const hex = (digest: string) => digest.slice('sha256:'.length);

type Compression = 'gzip' | 'zstd' | 'none';

function sniff(head: Buffer): Compression {
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if (head.length >= 4 && head.readUInt32LE(0) === 0xfd2fb528) return 'zstd';
  return 'none';
}

export class LayerStore {
  readonly dir: string;
  readonly byBlobDir: string;
  /** One record per home of the layers it needs (layerGc.ts). */
  readonly homesDir: string;

  constructor(readonly cacheDir: string) {
    this.dir = join(cacheDir, 'layers', 'sha256');
    this.byBlobDir = join(cacheDir, 'layers', 'by-blob');
    this.homesDir = join(cacheDir, 'layers', 'homes');
  }

  get(diffId: string): StoredLayer | undefined {
    const erofs = join(this.dir, `${hex(diffId)}.erofs`);
    const json = join(this.dir, `${hex(diffId)}.json`);
    if (!existsSync(erofs) || !existsSync(json)) return undefined;
    try {
      return { ...(JSON.parse(readFileSync(json, 'utf8')) as Omit<StoredLayer, 'path'>), path: erofs };
    } catch {
      return undefined;
    }
  }

  /** The sha256 of a held layer's erofs bytes (see StoredLayer.erofsDigest), hashed and recorded now if it never was. */
  async erofsDigestOf(diffId: string): Promise<string> {
    const l = this.get(diffId);
    if (!l) throw new Error(`layer ${diffId} is not in the store`);
    if (l.erofsDigest) return l.erofsDigest;
    const erofsDigest = await fileDigest(l.path);
    const json = join(this.dir, `${hex(diffId)}.json`);
    const { path: _, ...meta } = l;
    const tmp = `${json}.tmp-${process.pid}`;
    writeFileSync(tmp, JSON.stringify({ ...meta, erofsDigest }));
    renameSync(tmp, json);
    return erofsDigest;
  }

  /**
   * Marks a held layer as just used (its json's mtime), so that a collector leaves it alone for its
   * grace period; false if the layer is not (or no longer) held.
   */
  touch(diffId: string): boolean {
    const now = new Date();
    try {
      utimesSync(join(this.dir, `${hex(diffId)}.json`), now, now);
    } catch {
      return false;
    }
    return existsSync(join(this.dir, `${hex(diffId)}.erofs`));
  }

  /** The diff id of a layer file of this store (as an artifact's shape names it), else undefined. */
  diffIdOf(path: string): string | undefined {
    const m = /^([a-f0-9]{64})\.erofs$/.exec(path.slice(this.dir.length + 1));
    return dirname(path) === this.dir && m ? `sha256:${m[1]}` : undefined;
  }

  /** The diff id a blob was verified to unpack to, if this store ever unpacked it. */
  diffOfBlob(blobDigest: string): string | undefined {
    try {
      const v = readFileSync(join(this.byBlobDir, hex(blobDigest)), 'utf8').trim();
      return /^sha256:[a-f0-9]{64}$/.test(v) ? v : undefined;
    } catch {
      return undefined;
    }
  }

  /** Total bytes and count of the stored erofs layers. */
  usage(): { layers: number; bytes: number } {
    let layers = 0;
    let bytes = 0;
    for (const f of existsSync(this.dir) ? readdirSync(this.dir) : []) {
      if (!f.endsWith('.erofs')) continue;
      layers++;
      bytes += statSync(join(this.dir, f)).size;
    }
    return { layers, bytes };
  }

  /**
   * Unpacks a layer blob into `stageDir` and packs it as erofs. Verifies the blob's size and digest
   * and the diff id of its uncompressed tar; gzip and zstd are recognized by their magic bytes.
   * Throws validation_error (saying what was wrong) and leaves only files under `stageDir`.
   */
  async build(blob: AsyncIterable<Buffer>, desc: Descriptor & { diffId: string }, budget: UnpackBudget & { tarBytes?: number }, stageDir: string): Promise<StagedLayer> {
    const name = `layer ${desc.digest.slice(0, 19)}`;
    const tree = join(stageDir, `${hex(desc.diffId)}.tree`);
    mkdirSync(tree, { recursive: true });
    chmodSync(tree, 0o755);
    const rawHash = createHash('sha256');
    const diffHash = createHash('sha256');
    let raw = 0;
    const rawChunks = (async function* () {
      for await (const c of blob) {
        raw += c.length;
        if (raw > desc.size) throw invalid(`${name} is larger than the ${desc.size} bytes its descriptor says`);
        rawHash.update(c);
        yield c;
      }
    })();
    // Peek at the first bytes to pick the decompressor.
    const first: Buffer[] = [];
    let have = 0;
    let ended = false;
    while (have < 4) {
      const r = await rawChunks.next();
      if (r.done) { ended = true; break; }
      first.push(r.value);
      have += r.value.length;
    }
    const head = Buffer.concat(first);
    const replay = async function* () {
      if (head.length) yield head;
      if (ended) return;
      for (;;) {
        const r = await rawChunks.next();
        if (r.done) return;
        yield r.value;
      }
    };
    const kind = sniff(head);
    let tarSource: AsyncIterable<Buffer>;
    let cleanup = () => {};
    let zstdExit: Promise<{ code: number; err: string }> | undefined;
    if (kind === 'gzip') {
      const gun = createGunzip();
      pipeline(Readable.from(replay()), gun).catch((e) => gun.destroy(e));
      tarSource = gun;
      cleanup = () => gun.destroy();
    } else if (kind === 'zstd') {
      const child = spawn('zstd', ['-d', '-c', '-q'], { stdio: ['pipe', 'pipe', 'pipe'] });
      let err = '';
      child.stderr.on('data', (d) => (err += d));
      zstdExit = new Promise((r) => child.on('close', (code) => r({ code: code ?? 1, err })));
      pipeline(Readable.from(replay()), child.stdin).catch((e) => child.stdout.destroy(e));
      tarSource = child.stdout;
      cleanup = () => { if (child.exitCode === null) child.kill('SIGKILL'); };
    } else {
      tarSource = replay();
    }
    const maxTar = () => budget.maxBytes + 1024 * (budget.entries + 1) + (1 << 20);
    const diffChunks = (async function* () {
      for await (const c of tarSource) {
        budget.tarBytes = (budget.tarBytes ?? 0) + c.length;
        if (budget.tarBytes > maxTar()) throw new LayerRejected(`the image unpacks to more than the limit of ${budget.maxBytes} bytes`);
        diffHash.update(c as Buffer);
        yield c as Buffer;
      }
    })();
    let facts: LayerFacts;
    try {
      facts = await unpackLayer(readTar(diffChunks), tree, budget);
      if (zstdExit) {
        const z = await zstdExit;
        if (z.code !== 0) throw invalid(`${name} is not valid zstd: ${z.err.trim().slice(0, 200)}`);
      }
    } catch (e) {
      if (e instanceof CollimateError) throw e;
      if (e instanceof LayerRejected) throw invalid(`${name} was refused: ${e.message}`);
      if (e instanceof TarError) throw invalid(`${name} is not a valid tar archive: ${e.message}`);
      const code = (e as NodeJS.ErrnoException).code ?? '';
      if (code.startsWith('Z_')) throw invalid(`${name} is not valid gzip: ${(e as Error).message}`);
      throw e;
    } finally {
      cleanup();
    }
    // Anything the decompressor did not ask for still counts toward the blob's digest.
    for (;;) {
      const r = await rawChunks.next();
      if (r.done) break;
    }
    if (raw !== desc.size) throw invalid(`${name} is ${raw} bytes, but its descriptor says ${desc.size}`);
    const rawDigest = `sha256:${rawHash.digest('hex')}`;
    if (rawDigest !== desc.digest) throw invalid(`${name} does not match its digest: got ${rawDigest}, expected ${desc.digest}`);
    const diffId = `sha256:${diffHash.digest('hex')}`;
    if (diffId !== desc.diffId) throw invalid(`${name} unpacks to diff id ${diffId}, but the image config says ${desc.diffId}`);
    const erofs = join(stageDir, `${hex(diffId)}.erofs`);
    await buildErofs(erofs, tree, diffId);
    rmSync(tree, { recursive: true, force: true });
    const meta = { diffId, size: statSync(erofs).size, unpackedBytes: facts.unpackedBytes, facts, erofsDigest: await fileDigest(erofs) };
    const json = join(stageDir, `${hex(diffId)}.json`);
    writeFileSync(json, JSON.stringify(meta));
    return { diffId, blobDigest: desc.digest, erofs, json, meta };
  }

  /** Moves a staged layer into the store (keeping an identical one already there). */
  commit(s: StagedLayer): StoredLayer {
    mkdirSync(this.dir, { recursive: true });
    const erofs = join(this.dir, `${hex(s.diffId)}.erofs`);
    if (!existsSync(erofs)) {
      renameSync(s.json, join(this.dir, `${hex(s.diffId)}.json`));
      renameSync(s.erofs, erofs);
    } else {
      this.touch(s.diffId);
    }
    this.recordBlob(s.blobDigest, s.diffId);
    return this.get(s.diffId)!;
  }

  recordBlob(blobDigest: string, diffId: string): void {
    mkdirSync(this.byBlobDir, { recursive: true });
    const f = join(this.byBlobDir, hex(blobDigest));
    if (existsSync(f)) return;
    const tmp = `${f}.tmp-${process.pid}`;
    writeFileSync(tmp, diffId + '\n');
    renameSync(tmp, f);
  }
}

/** sha256 of a file's bytes, streamed. */
async function fileDigest(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const c of createReadStream(path)) h.update(c as Buffer);
  return `sha256:${h.digest('hex')}`;
}
