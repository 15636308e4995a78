import { existsSync, readFileSync, readdirSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { readArtifactManifest } from './artifactManifest.js';
import type { LayerStore } from './layerStore.js';
import { sha256File } from '../host/hash.js';

/**
 * The blobs this host holds, by the sha256 of their bytes, for peers to pull (cluster mode's blob
 * API, src/api/blobRoutes.ts): image layers by the digest of their erofs bytes (LayerStore's
 * erofsDigest, which an environment's artifact key is computed over, so a pulled layer is exactly
 * the bytes a checkpoint was made on), and the files of template artifacts — RAM file, device state,
 * frozen disk. An artifact's file digests are hashed once, when it is first published, and kept
 * beside its manifest (`blobs.json`): the files are sealed read-only once baked, so they never
 * change under their digest.
 */
export type BlobKind = 'layer' | 'artifact-mem' | 'artifact-state' | 'artifact-disk' | 'sandbox-move' | 'snapshot';

export interface LocalBlob {
  digest: string;
  kind: BlobKind;
  path: string;
  size: number;
  /** Mostly holes (RAM files, disks): offered in the sparse representation (sparseBlob.ts). */
  sparse: boolean;
  /** The layer's diff id, the artifact's key, or the snapshot's id. */
  of: string;
}

export const DIGEST_RE = /^sha256:[a-f0-9]{64}$/;

interface ArtifactBlobs {
  files: Array<{ kind: BlobKind; name: string; size: number; digest: string }>;
}

export class LocalBlobs {
  private byDigest = new Map<string, LocalBlob>();
  private scanning?: Promise<LocalBlob[]>;
  /** Blobs served for a while without being published: a moving sandbox's files (src/api/moveRoutes.ts). */
  private offered = new Map<string, LocalBlob>();

  /**
   * `artifacts.dir`: `<cacheDir>/artifacts` (homePaths); `artifacts.ramDir`: where this host keeps
   * their RAM files (EngineConfig.artifactRamDir). Either source may be absent (an API-only node).
   */
  constructor(private readonly src: { layers?: LayerStore; artifacts?: { dir: string; ramDir: string }; snapshots?: () => LocalBlob[] }) {}

  /** Every blob held now (hashing what never was); replaces the index `find` answers from. */
  scan(): Promise<LocalBlob[]> {
    this.scanning ??= this.scanNow().finally(() => (this.scanning = undefined));
    return this.scanning;
  }

  /**
   * Serves `blobs` until the returned function is called, without publishing them: the files of a
   * sandbox moving to another host, which pulls them from this host by digest.
   */
  offer(blobs: LocalBlob[]): () => void {
    for (const b of blobs) this.offered.set(b.digest, b);
    return () => {
      for (const b of blobs) if (this.offered.get(b.digest) === b) this.offered.delete(b.digest);
    };
  }

  /** The blob with this digest if it is held (and its file still exists); rescans once on a miss. */
  async find(digest: string): Promise<LocalBlob | undefined> {
    const offered = this.offered.get(digest);
    if (offered && existsSync(offered.path)) return offered;
    const hit = this.byDigest.get(digest);
    if (hit && existsSync(hit.path)) return hit;
    // A snapshot's blob first, from the engine's record: the full scan may hash every artifact built
    // since the last one (a new template's RAM file and disk), which on a loaded host took longer than
    // a pulling host waits for an answer (BlobFetcher's 30 s).
    const snapshot = (this.src.snapshots?.() ?? []).find((b) => b.digest === digest && existsSync(b.path));
    if (snapshot) return snapshot;
    await this.scan();
    const again = this.byDigest.get(digest);
    return again && existsSync(again.path) ? again : undefined;
  }

  private async scanNow(): Promise<LocalBlob[]> {
    const out: LocalBlob[] = [];
    const layers = this.src.layers;
    if (layers && existsSync(layers.dir)) {
      for (const f of readdirSync(layers.dir)) {
        const m = /^([a-f0-9]{64})\.erofs$/.exec(f);
        if (!m) continue;
        const diffId = `sha256:${m[1]}`;
        const l = layers.get(diffId);
        if (!l) continue;
        try {
          out.push({ digest: await layers.erofsDigestOf(diffId), kind: 'layer', path: l.path, size: statSync(l.path).size, sparse: false, of: diffId });
        } catch {
          // collected meanwhile
        }
      }
    }
    const root = this.src.artifacts?.dir;
    for (const key of root && existsSync(root) ? readdirSync(root) : []) {
      for (const build of list(join(root!, key))) {
        if (build.startsWith('tmp-') || build === 'users' || build === 'claimed-at') continue;
        try {
          out.push(...(await artifactBlobs(join(root!, key, build), this.src.artifacts!.ramDir)));
        } catch {
          // not a finished build, or its RAM file was collected
        }
      }
    }
    // Snapshots' exports and copies (src/sandboxes/snapshotCopies.ts), their digests recorded when made.
    out.push(...(this.src.snapshots?.() ?? []).filter((b) => existsSync(b.path)));
    this.byDigest = new Map(out.map((b) => [b.digest, b]));
    return out;
  }
}

/**
 * The blobs of one built artifact (`<artifacts>/<key>/<build>`, its RAM file in `ramDir`), their digests from its
 * `blobs.json`, hashed and written now if missing or if a file's size differs from the record.
 */
export async function artifactBlobs(buildDir: string, ramDir: string): Promise<LocalBlob[]> {
  const a = readArtifactManifest(buildDir, ramDir);
  const files: Array<{ kind: BlobKind; path: string; sparse: boolean }> = [
    { kind: 'artifact-mem', path: a.memPath, sparse: true },
    { kind: 'artifact-state', path: a.devStatePath, sparse: false },
    { kind: 'artifact-disk', path: a.diskPath, sparse: true },
  ];
  const recordPath = join(buildDir, 'blobs.json');
  let record: ArtifactBlobs | undefined;
  try { record = JSON.parse(readFileSync(recordPath, 'utf8')) as ArtifactBlobs; } catch { /* first publish */ }
  const out: LocalBlob[] = [];
  let changed = !record;
  for (const f of files) {
    const size = statSync(f.path).size;
    const name = f.path.split('/').pop()!;
    let rec = record?.files.find((r) => r.kind === f.kind && r.name === name && r.size === size);
    if (!rec) {
      rec = { kind: f.kind, name, size, digest: `sha256:${await sha256File(f.path)}` };
      changed = true;
    }
    out.push({ digest: rec.digest, kind: f.kind, path: f.path, size, sparse: f.sparse, of: a.key });
  }
  if (changed) {
    const tmp = `${recordPath}.tmp-${process.pid}`;
    writeFileSync(tmp, JSON.stringify({ files: out.map((b) => ({ kind: b.kind, name: b.path.split('/').pop()!, size: b.size, digest: b.digest })) } satisfies ArtifactBlobs));
    renameSync(tmp, recordPath);
  }
  return out;
}

function list(dir: string): string[] {
  try { return readdirSync(dir); } catch { return []; }
}
