/**
 * Environments across hosts (`environments`, migration 5). An environment is made and baked on one
 * host, which keeps its rows in its own SQLite (src/images/imageRepo.ts) as on a single host and
 * holds its bake log; that host mirrors each one into the cluster database, so that:
 *
 * - GET /v1/environments and GET /v1/environments/{name} through any host show it (the view its
 *   host last wrote, which follows every change of state and progress);
 * - once it is ready, any host of its compatibility class can create from it: the row then carries
 *   what a host that lacks it needs (EnvironmentCopy) — its configuration with its secrets sealed
 *   under the cluster's key, its image's runtime, its layers by the digests of their erofs bytes,
 *   and its artifact's manifest and files by digest — and the host pulls those blobs from a holder
 *   (environmentPull.ts).
 *
 * Only the host that made an environment writes its row (an upsert from another host of the same
 * name changes nothing), the way only a sandbox's owner writes its directory row.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type pg from 'pg';
import { ARTIFACT_FILES } from '../images/artifactManifest.js';
import type { EnvironmentRow, ImageRepo, ImageRuntime } from '../images/imageRepo.js';
import type { LayerStore } from '../images/layerStore.js';
import { artifactBlobs, type BlobKind } from '../images/localBlobs.js';
import type { EnvironmentConfig } from '../images/service.js';
import type { LayerFacts } from '../images/unpack.js';
import { environmentView } from '../wire/views.js';

/** One layer of an environment's image as another host stores it (LayerStore's json, and the blob it came from). */
export interface EnvironmentLayer {
  diffId: string;
  /** The (compressed) blob digest it was unpacked from, for the puller's by-blob record. */
  blobDigest: string;
  /** The sha256 of its erofs bytes: what it is pulled by, and what the artifact key is computed over. */
  erofsDigest: string;
  size: number;
  unpackedBytes: number;
  facts: LayerFacts;
}

/** What a host that lacks a ready environment needs to create from it. */
export interface EnvironmentCopy {
  config: EnvironmentConfig;
  image: { id: string; runtime: ImageRuntime };
  /** The image's layers, bottom first. */
  layers: EnvironmentLayer[];
  artifact: {
    key: string;
    /** Its build directory's name under `<cache>/artifacts/<key>/`. */
    build: string;
    /** Its artifact.json as written (format 2: names, no host's paths). */
    manifest: Record<string, unknown>;
    /** Its RAM file's name in a host's RAM directory. */
    ramFile: string;
    files: Array<{ kind: BlobKind; name: string; size: number; digest: string }>;
  };
}

export interface ClusterEnvironment {
  tenant: string;
  name: string;
  hostId: string;
  hostAddress: string;
  hostAlive: boolean;
  generation: number;
  state: EnvironmentRow['state'];
  compat: string;
  view: Record<string, unknown>;
  copy: EnvironmentCopy | null;
}

export class ClusterEnvironments {
  constructor(private readonly pool: pg.Pool) {}

  /** A tenant's environment of that name, wherever it was made; null when there is none. */
  async get(tenant: string, name: string): Promise<ClusterEnvironment | null> {
    const r = await this.pool.query(
      `SELECT e.tenant, e.name, e.host_id, h.address, (h.state = 'alive') AS alive, e.generation, e.state, e.compat, e.view, e.copy
       FROM environments e JOIN hosts h ON h.id = e.host_id WHERE e.tenant = $1 AND e.name = $2`,
      [tenant, name],
    );
    const x = r.rows[0];
    return x
      ? {
        tenant: x.tenant, name: x.name, hostId: x.host_id, hostAddress: x.address, hostAlive: x.alive, generation: Number(x.generation), state: x.state, compat: x.compat,
        view: JSON.parse(x.view), copy: x.copy === null ? null : JSON.parse(x.copy),
      }
      : null;
  }

  /** The views of a tenant's environments on every host, in the order a single host lists them (created, then name). */
  async list(tenant: string): Promise<Record<string, unknown>[]> {
    const r = await this.pool.query<{ view: string }>('SELECT view FROM environments WHERE tenant = $1 ORDER BY generation, name', [tenant]);
    return r.rows.map((x) => JSON.parse(x.view) as Record<string, unknown>);
  }

  /** Writes `hostId`'s environment; a row of the same name another host made is left as it is. */
  async put(hostId: string, compat: string, row: EnvironmentRow, copy: EnvironmentCopy | null): Promise<void> {
    await this.pool.query(
      `INSERT INTO environments (tenant, name, host_id, generation, state, compat, view, copy) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
       ON CONFLICT (tenant, name) DO UPDATE SET generation = EXCLUDED.generation, state = EXCLUDED.state, compat = EXCLUDED.compat,
         view = EXCLUDED.view, copy = EXCLUDED.copy, updated_at = now()
       WHERE environments.host_id = EXCLUDED.host_id`,
      [row.tenant, row.name, hostId, row.created_at, row.state, compat, JSON.stringify(environmentView(row)), copy === null ? null : JSON.stringify(copy)],
    );
  }

  /** Removes `hostId`'s environment of that name (another host's is left). */
  async remove(hostId: string, tenant: string, name: string): Promise<void> {
    await this.pool.query('DELETE FROM environments WHERE host_id = $1 AND tenant = $2 AND name = $3', [hostId, tenant, name]);
  }

  /** (tenant, name) of every environment `hostId` made. */
  async ofHost(hostId: string): Promise<Array<{ tenant: string; name: string }>> {
    return (await this.pool.query('SELECT tenant, name FROM environments WHERE host_id = $1', [hostId])).rows;
  }
}

/** What the mirror reads on the host that made an environment. */
export interface EnvironmentSource {
  repo: ImageRepo;
  layers: LayerStore;
  /** This host's RAM directory for artifacts (EngineConfig.artifactRamDir). */
  ramDir: string;
  /** The artifact an environment's template is registered on here (Engine.environmentArtifact). */
  artifactOf(tenant: string, name: string): { key: string; dir: string } | undefined;
}

/**
 * Mirrors this host's environments into the cluster database: told of each change by the image
 * repo (ImageRepo.onEnvChange), it writes the environment's row, or removes it once deleted. Writes
 * run one at a time in order; a change queued while an earlier one of the same environment waits
 * is written once (a bake's log appends come twice a second).
 */
export class EnvironmentMirror {
  private tail: Promise<void> = Promise.resolve();
  private readonly queued = new Set<string>();

  constructor(
    private readonly envs: ClusterEnvironments,
    private readonly hostId: string,
    private readonly compat: string,
    private readonly src: EnvironmentSource,
    private readonly onError: (err: unknown, what: string) => void = () => {},
    /**
     * Publishes what this host holds to blob_locations now (BlobPublisher.publishNow): a ready
     * environment's row says what to pull only once its blobs can be found, not up to a
     * publication period later.
     */
    private readonly publish: () => Promise<void> = async () => {},
  ) {}

  /** Starts mirroring: every local environment is written, and rows of this host no longer here are removed. */
  async start(): Promise<void> {
    this.src.repo.onEnvChange = (tenant, name) => this.changed(tenant, name);
    const local = this.src.repo.allEnvs();
    for (const e of local) this.changed(e.tenant, e.name);
    const here = new Set(local.map((e) => `${e.tenant}\0${e.name}`));
    for (const r of await this.envs.ofHost(this.hostId)) if (!here.has(`${r.tenant}\0${r.name}`)) this.changed(r.tenant, r.name);
    await this.flushed();
  }

  stop(): void {
    this.src.repo.onEnvChange = undefined;
  }

  changed(tenant: string, name: string): void {
    const k = `${tenant}\0${name}`;
    if (this.queued.has(k)) return;
    this.queued.add(k);
    this.tail = this.tail.then(async () => {
      this.queued.delete(k);
      try {
        await this.write(tenant, name);
      } catch (err) {
        this.onError(err, `recording environment ${tenant}/${name} in the cluster database failed`);
      }
    });
  }

  /** Resolves once every write queued so far is done (a response waits for it, as for the sandbox directory). */
  flushed(): Promise<void> {
    return this.tail;
  }

  private async write(tenant: string, name: string): Promise<void> {
    const row = this.src.repo.getEnv(tenant, name);
    if (!row) return this.envs.remove(this.hostId, tenant, name);
    const copy = row.state === 'ready' ? await this.copyOf(row) : null;
    if (copy) await this.publish();
    await this.envs.put(this.hostId, this.compat, row, copy);
  }

  /** What another host needs to create from `row`, or null when its template or image is not here (yet). */
  private async copyOf(row: EnvironmentRow): Promise<EnvironmentCopy | null> {
    const art = this.src.artifactOf(row.tenant, row.name);
    const img = this.src.repo.getImage(row.tenant, row.image);
    if (!art || !img?.runtime) return null;
    const layers: EnvironmentLayer[] = [];
    for (const l of img.layers) {
      const held = this.src.layers.get(l.diffId);
      if (!held) return null;
      layers.push({ diffId: l.diffId, blobDigest: l.digest, erofsDigest: await this.src.layers.erofsDigestOf(l.diffId), size: held.size, unpackedBytes: held.unpackedBytes, facts: held.facts });
    }
    // Hashed once and kept beside the manifest (blobs.json), as the blob publisher does.
    const files = await artifactBlobs(art.dir, this.src.ramDir);
    const manifest = JSON.parse(readFileSync(join(art.dir, ARTIFACT_FILES.manifest), 'utf8')) as Record<string, unknown>;
    if (manifest.format !== 2 || typeof manifest.ramFile !== 'string') return null; // a manifest with this host's paths does not travel
    const { log: _log, state: _s, error: _e, progress: _p, image: _i, secret_names: _n, created_at: _c, updated_at: _u, ...config } = row;
    return {
      config,
      image: { id: img.id, runtime: img.runtime },
      layers,
      artifact: {
        key: art.key, build: art.dir.split('/').pop()!, manifest, ramFile: manifest.ramFile,
        files: files.map((f) => ({ kind: f.kind, name: f.path.split('/').pop()!, size: f.size, digest: f.digest })),
      },
    };
  }
}
