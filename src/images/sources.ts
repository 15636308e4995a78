import { createReadStream, existsSync, readFileSync, realpathSync, statSync, openSync, readSync, closeSync, createWriteStream, rmSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join, relative, isAbsolute } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { spawn } from 'node:child_process';
import { CollimateError } from '../errors.js';
import { indexTarFile, TarError, type TarFileMember } from './tar.js';
import {
  MEDIA, MAX_MANIFEST_BYTES, checkDigest, digestOf, invalid, parseConfig, parseManifestOrIndex, pickPlatform,
  type Descriptor, type ImageConfig, type ImageManifest,
} from './oci.js';
import { RegistryClient, formatReference, parseReference, type RegistryCredentials } from './registry.js';

/**
 * Where an image comes from: an OCI image layout directory, a `docker save` / OCI archive tarball, or
 * a registry. Each source answers the same few questions (the root manifest or index, blobs by
 * descriptor, whether it holds a blob), so resolving and pulling are one code path.
 */

export type SourceSpec =
  | { kind: 'oci-layout'; path: string; tag?: string }
  | { kind: 'archive'; path: string; tag?: string }
  | ({ kind: 'registry'; ref: string } & RegistryCredentials);

export interface ImageSource {
  /** Human-readable reference recorded with the image. */
  readonly ref: string;
  /** The manifest or index to start from (tag resolution happens here). */
  root(): Promise<{ bytes: Buffer; mediaType?: string }>;
  /** A manifest (or nested index) by descriptor, verified against its digest. */
  manifest(desc: Descriptor): Promise<Buffer>;
  /** A small blob read whole (the config), verified against its digest. */
  blobBytes(desc: Descriptor): Promise<Buffer>;
  /** A layer blob's bytes; digest and size are verified by the consumer. */
  blobStream(desc: Descriptor): Promise<AsyncIterable<Buffer>>;
  /** Whether the source really holds this blob (proof of access before a held layer is reused). */
  holds(desc: Descriptor): Promise<boolean>;
  /** Layer bytes fetched so far (what a pull moved). */
  transferredBytes(): number;
  close(): void;
}

export interface ResolvedImage {
  /** sha256 of the image manifest (the platform manifest, not the index). */
  id: string;
  ref: string;
  manifestBytes: Buffer;
  manifest: ImageManifest;
  config: ImageConfig;
  configDigest: string;
  layers: (Descriptor & { diffId: string })[];
}

const sha256Of = async (src: AsyncIterable<Buffer>): Promise<string> => {
  const h = createHash('sha256');
  for await (const c of src) h.update(c);
  return `sha256:${h.digest('hex')}`;
};

/** Resolves a source to one linux/amd64 image manifest, its config, and its layers with their diff ids. */
export async function resolveImage(src: ImageSource): Promise<ResolvedImage> {
  let { bytes, mediaType } = await src.root();
  let what = `manifest of ${src.ref}`;
  for (let depth = 0; ; depth++) {
    const parsed = parseManifestOrIndex(bytes, mediaType, what);
    if (parsed.kind === 'manifest') {
      const m = parsed.manifest;
      const configBytes = await src.blobBytes(m.config);
      const config = parseConfig(configBytes, m.layers.length);
      return {
        id: digestOf(bytes), ref: src.ref, manifestBytes: bytes, manifest: m, config, configDigest: m.config.digest,
        layers: m.layers.map((l, i) => ({ ...l, diffId: config.diffIds[i] })),
      };
    }
    if (depth >= 2) throw invalid(`${what}: image indexes nested more than two deep`);
    const pick = pickPlatform(parsed.index, what);
    bytes = await src.manifest(pick);
    mediaType = pick.mediaType;
    what = `manifest ${pick.digest} of ${src.ref}`;
  }
}

// ---- OCI image layout ----------------------------------------------------------------------------

function notFound(message: string): CollimateError {
  return new CollimateError('image_not_found', message);
}

/** `path` must exist and lie inside `importDir` once symlinks are resolved (paths are server-side). */
export function confinedPath(path: string, importDir: string): string {
  if (!isAbsolute(path)) throw new CollimateError('validation_error', `source path must be absolute (inside ${importDir})`);
  let real: string;
  let root: string;
  try { root = realpathSync(importDir); } catch { throw notFound(`the import directory ${importDir} does not exist; local sources must be placed there`); }
  try { real = realpathSync(path); } catch { throw notFound(`no file or directory at ${path}`); }
  const rel = relative(root, real);
  if (rel.startsWith('..') || isAbsolute(rel)) throw new CollimateError('validation_error', `source path ${path} is outside the import directory ${importDir}; local sources must be placed there (COLLIMATE_IMPORT_DIR)`);
  return real;
}

/** Blob access over some byte store keyed by digest: a layout directory, or members of a tar file. */
abstract class LocalSource implements ImageSource {
  protected moved = 0;
  constructor(readonly ref: string) {}
  protected abstract blobRange(digest: string): { file: string; start: number; size: number } | undefined;
  abstract root(): Promise<{ bytes: Buffer; mediaType?: string }>;

  protected readRange(r: { file: string; start: number; size: number }): Buffer {
    const fd = openSync(r.file, 'r');
    try {
      const b = Buffer.alloc(r.size);
      let off = 0;
      while (off < r.size) {
        const n = readSync(fd, b, off, r.size - off, r.start + off);
        if (n === 0) break;
        off += n;
      }
      return b.subarray(0, off);
    } finally {
      closeSync(fd);
    }
  }

  private range(desc: Descriptor) {
    checkDigest(desc.digest, 'descriptor');
    const r = this.blobRange(desc.digest);
    if (!r) throw invalid(`blob ${desc.digest} is missing from ${this.ref}`);
    return r;
  }

  async manifest(desc: Descriptor): Promise<Buffer> {
    return this.blobBytes(desc);
  }

  async blobBytes(desc: Descriptor): Promise<Buffer> {
    const r = this.range(desc);
    if (r.size > MAX_MANIFEST_BYTES) throw invalid(`blob ${desc.digest} is ${r.size} bytes; at most ${MAX_MANIFEST_BYTES} are accepted here`);
    const b = this.readRange(r);
    if (digestOf(b) !== desc.digest) throw invalid(`blob ${desc.digest} in ${this.ref} does not match its digest (got ${digestOf(b)})`);
    return b;
  }

  async blobStream(desc: Descriptor): Promise<AsyncIterable<Buffer>> {
    const r = this.range(desc);
    const self = this;
    const stream = r.size === 0 ? [] : createReadStream(r.file, { start: r.start, end: r.start + r.size - 1, highWaterMark: 1 << 20 });
    return (async function* () {
      for await (const c of stream) { self.moved += (c as Buffer).length; yield c as Buffer; }
    })();
  }

  async holds(desc: Descriptor): Promise<boolean> {
    const r = this.blobRange(desc.digest);
    if (!r || r.size !== desc.size) return false;
    const s = r.size === 0 ? [] : createReadStream(r.file, { start: r.start, end: r.start + r.size - 1, highWaterMark: 1 << 20 });
    return (await sha256Of(s as AsyncIterable<Buffer>)) === desc.digest;
  }

  transferredBytes(): number {
    return this.moved;
  }

  close(): void {}
}

/** Picks the index entry named by `tag` (org.opencontainers.image.ref.name), or the only one. */
function selectFromLayoutIndex(bytes: Buffer, tag: string | undefined, where: string): Buffer {
  if (!tag) return bytes;
  const doc = JSON.parse(bytes.toString('utf8'));
  const manifests = Array.isArray(doc.manifests) ? doc.manifests : [];
  const hit = manifests.filter((m: any) => m?.annotations?.['org.opencontainers.image.ref.name'] === tag || m?.annotations?.['io.containerd.image.name']?.endsWith(`:${tag}`));
  if (hit.length === 0) throw notFound(`no image tagged ${tag} in ${where}`);
  return Buffer.from(JSON.stringify({ ...doc, manifests: hit }));
}

export class OciLayoutSource extends LocalSource {
  constructor(private readonly dir: string, private readonly tag?: string) {
    super(`oci-layout:${dir}${tag ? `:${tag}` : ''}`);
    const layout = join(dir, 'oci-layout');
    if (!existsSync(join(dir, 'index.json'))) throw invalid(`${dir} is not an OCI image layout (no index.json)`);
    if (existsSync(layout)) {
      let v: unknown;
      try { v = JSON.parse(readFileSync(layout, 'utf8')).imageLayoutVersion; } catch { throw invalid(`${layout} is not valid JSON`); }
      if (typeof v !== 'string' || !v.startsWith('1.')) throw invalid(`${dir} has image layout version ${JSON.stringify(v)}; 1.x is supported`);
    }
  }

  protected blobRange(digest: string) {
    const file = join(this.dir, 'blobs', 'sha256', digest.slice('sha256:'.length));
    try {
      const st = statSync(file);
      return st.isFile() ? { file, start: 0, size: st.size } : undefined;
    } catch {
      return undefined;
    }
  }

  async root() {
    const file = join(this.dir, 'index.json');
    if (statSync(file).size > MAX_MANIFEST_BYTES) throw invalid(`${file} is too large`);
    return { bytes: selectFromLayoutIndex(readFileSync(file), this.tag, this.dir), mediaType: MEDIA.ociIndex };
  }
}

// ---- archives ------------------------------------------------------------------------------------

/**
 * A tarball: `docker save` (manifest.json, configs and layer.tar members; newer Docker also writes an
 * OCI layout inside) or an OCI archive (a tarred OCI layout). Read in place by member offsets; a
 * gzip- or zstd-compressed archive is first decompressed to a temporary file.
 */
export class ArchiveSource extends LocalSource {
  private members!: Map<string, TarFileMember>;
  private file: string;
  private tmpFile?: string;
  private docker?: { manifest: Buffer; layerFiles: Map<string, string> };

  private constructor(file: string, ref: string, private readonly tag?: string) {
    super(ref);
    this.file = file;
  }

  static async open(path: string, tmpDir: string, maxBytes: number, tag?: string): Promise<ArchiveSource> {
    const s = new ArchiveSource(path, `archive:${path}${tag ? `:${tag}` : ''}`, tag);
    const head = Buffer.alloc(4);
    const fd = openSync(path, 'r');
    try { readSync(fd, head, 0, 4, 0); } finally { closeSync(fd); }
    const gz = head[0] === 0x1f && head[1] === 0x8b;
    const zst = head.readUInt32LE(0) === 0xfd2fb528;
    if (gz || zst) {
      s.tmpFile = join(tmpDir, `archive-${process.pid}-${Date.now()}-${Math.random().toString(16).slice(2)}.tar`);
      s.file = s.tmpFile;
      try {
        await decompressFile(path, s.tmpFile, zst ? 'zstd' : 'gzip', maxBytes);
      } catch (e) {
        s.close();
        throw e;
      }
    }
    try {
      s.members = indexTarFile(s.file);
      s.prepare();
    } catch (e) {
      s.close();
      if (e instanceof TarError) throw invalid(`${path} is not a valid tar archive: ${e.message}`);
      throw e;
    }
    return s;
  }

  private readMember(name: string): Buffer | undefined {
    const m = this.members.get(name);
    if (!m || m.type !== 'file') return undefined;
    if (m.size > MAX_MANIFEST_BYTES) throw invalid(`${name} in ${this.ref} is too large`);
    return this.readRange({ file: this.file, start: m.offset, size: m.size });
  }

  private prepare(): void {
    if (this.members.has('index.json')) return; // an OCI layout, possibly inside a newer docker save
    const mj = this.readMember('manifest.json');
    if (!mj) throw invalid(`${this.ref} is neither an OCI archive (index.json) nor a docker save archive (manifest.json)`);
    let list: any;
    try { list = JSON.parse(mj.toString('utf8')); } catch { throw invalid(`manifest.json in ${this.ref} is not valid JSON`); }
    if (!Array.isArray(list) || list.length === 0) throw invalid(`manifest.json in ${this.ref} lists no images`);
    let entry = list[0];
    if (this.tag) {
      entry = list.find((e: any) => Array.isArray(e?.RepoTags) && e.RepoTags.some((t: string) => t === this.tag || t.endsWith(`:${this.tag}`) || t.startsWith(`${this.tag}:`)));
      if (!entry) throw notFound(`no image tagged ${this.tag} in ${this.ref}`);
    } else if (list.length > 1) {
      throw invalid(`${this.ref} holds ${list.length} images; say which with source.tag`);
    }
    if (typeof entry?.Config !== 'string' || !Array.isArray(entry.Layers)) throw invalid(`manifest.json in ${this.ref} has no Config and Layers`);
    const configBytes = this.readMember(entry.Config.replace(/^\.\//, ''));
    if (!configBytes) throw invalid(`config ${entry.Config} is missing from ${this.ref}`);
    const configDigest = digestOf(configBytes);
    const named = /([a-f0-9]{64})(?:\.json)?$/.exec(entry.Config)?.[1];
    if (named && `sha256:${named}` !== configDigest) throw invalid(`config ${entry.Config} in ${this.ref} does not match its digest (got ${configDigest})`);
    const cfg = parseConfig(configBytes, entry.Layers.length);
    // The layer tars are uncompressed, so each one's digest is its diff id; the synthesized manifest
    // names them so, and blobStream serves them by it (verified while unpacking).
    const layerFiles = new Map<string, string>();
    layerFiles.set(configDigest, entry.Config.replace(/^\.\//, ''));
    const layers = entry.Layers.map((f: unknown, i: number) => {
      if (typeof f !== 'string') throw invalid(`manifest.json in ${this.ref} has a non-string layer`);
      const m = this.members.get(f.replace(/^\.\//, ''));
      if (!m) throw invalid(`layer ${f} is missing from ${this.ref}`);
      layerFiles.set(cfg.diffIds[i], m.name);
      return { mediaType: 'application/vnd.docker.image.rootfs.diff.tar', size: m.size, digest: cfg.diffIds[i] };
    });
    const manifest = { schemaVersion: 2, mediaType: MEDIA.dockerManifest, config: { mediaType: MEDIA.dockerConfig, size: configBytes.length, digest: configDigest }, layers };
    this.docker = { manifest: Buffer.from(JSON.stringify(manifest)), layerFiles };
  }

  protected blobRange(digest: string) {
    const name = this.docker ? this.docker.layerFiles.get(digest) : `blobs/sha256/${digest.slice('sha256:'.length)}`;
    const m = name ? this.members.get(name) : undefined;
    if (!m || m.type !== 'file') return undefined;
    return { file: this.file, start: m.offset, size: m.size };
  }

  async root() {
    if (this.docker) return { bytes: this.docker.manifest, mediaType: MEDIA.dockerManifest };
    const idx = this.readMember('index.json')!;
    return { bytes: selectFromLayoutIndex(idx, this.tag, this.ref), mediaType: MEDIA.ociIndex };
  }

  close(): void {
    if (this.tmpFile) rmSync(this.tmpFile, { force: true });
  }
}

async function decompressFile(from: string, to: string, kind: 'gzip' | 'zstd', maxBytes: number): Promise<void> {
  let n = 0;
  const cap = async function* (src: AsyncIterable<Buffer>) {
    for await (const c of src) {
      n += c.length;
      if (n > maxBytes) throw invalid(`the archive decompresses to more than ${maxBytes} bytes`);
      yield c;
    }
  };
  try {
    if (kind === 'gzip') {
      await pipeline(createReadStream(from), createGunzip(), cap, createWriteStream(to));
    } else {
      const child = spawn('zstd', ['-d', '-c', '-q', from], { stdio: ['ignore', 'pipe', 'pipe'] });
      let err = '';
      child.stderr.on('data', (d) => (err += d));
      const exited = new Promise<number>((r) => child.on('close', (code) => r(code ?? 1)));
      try {
        await pipeline(child.stdout, cap, createWriteStream(to));
      } finally {
        if (child.exitCode === null) child.kill();
      }
      const code = await exited;
      if (code !== 0 && n <= maxBytes) throw invalid(`the archive is not valid zstd: ${err.trim().slice(0, 200)}`);
    }
  } catch (e) {
    rmSync(to, { force: true });
    if (e instanceof CollimateError) throw e;
    throw invalid(`the archive could not be decompressed: ${(e as Error).message}`);
  }
}

// ---- registries ----------------------------------------------------------------------------------

export class RegistrySource implements ImageSource {
  readonly ref: string;
  readonly client: RegistryClient;
  private readonly reference: string;

  constructor(ref: string, creds: RegistryCredentials = {}) {
    const parsed = parseReference(ref);
    this.ref = formatReference(parsed);
    this.reference = parsed.digest ?? parsed.tag!;
    this.client = new RegistryClient(parsed, creds);
  }

  async root() {
    const m = await this.client.getManifest(this.reference);
    return { bytes: m.bytes, mediaType: m.mediaType };
  }

  async manifest(desc: Descriptor) {
    const m = await this.client.getManifest(desc.digest);
    return m.bytes;
  }

  blobBytes(desc: Descriptor) {
    return this.client.getBlobBytes(desc);
  }

  blobStream(desc: Descriptor) {
    return this.client.getBlobStream(desc);
  }

  holds(desc: Descriptor) {
    return this.client.hasBlob(desc.digest);
  }

  transferredBytes(): number {
    return this.client.stats.layerBytes;
  }

  close(): void {}
}

export async function openSource(spec: SourceSpec, opts: { importDir: string; tmpDir: string; maxBytes: number }): Promise<ImageSource> {
  switch (spec.kind) {
    case 'oci-layout': {
      const dir = confinedPath(spec.path, opts.importDir);
      if (!statSync(dir).isDirectory()) throw invalid(`${spec.path} is not a directory (an OCI image layout is one)`);
      return new OciLayoutSource(dir, spec.tag);
    }
    case 'archive': {
      const file = confinedPath(spec.path, opts.importDir);
      if (!statSync(file).isFile()) throw invalid(`${spec.path} is not a file (an archive is one)`);
      return ArchiveSource.open(file, opts.tmpDir, opts.maxBytes, spec.tag);
    }
    case 'registry':
      return new RegistrySource(spec.ref, { username: spec.username, password: spec.password });
  }
}
