/**
 * A create placed on a host that lacks the environment: the host pulls what it lacks from a host
 * that holds it (blob_locations, by digest, BlobFetcher verifying each) and registers the
 * environment's template with its engine, then the create runs as on the host that made it.
 *
 * - **Only what is missing moves.** A layer already in this host's layer store with the same erofs
 *   digest (an image sharing its base, pulled here before) is reused; so is a build of the artifact
 *   already in this host's cache whose RAM file is here.
 * - **All or nothing.** Layers and the artifact's files are staged first (a staging directory on the
 *   cache's file system; the RAM file under a temporary name in the RAM directory), committed by
 *   rename only once every blob arrived with its digest, and only then is the template registered.
 *   A failed pull removes what it staged and registers nothing.
 * - **Once per host.** Concurrent creates of one environment on a host wait for one pull.
 *
 * The environment stays its first host's: this host writes nothing to its own tables for it, and
 * drops the copy once the cluster no longer has that generation of it (reconcile, every 30 s).
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CollimateError, environmentNotReady, msg, see } from '../errors.js';
import { claimArtifact } from '../images/artifactGc.js';
import { ARTIFACT_FILES } from '../images/artifactManifest.js';
import { builtArtifact } from '../images/bake.js';
import type { ImageRuntime } from '../images/imageRepo.js';
import type { LayerStore, StagedLayer } from '../images/layerStore.js';
import type { EnvironmentConfig } from '../images/service.js';
import { homePaths } from '../host/paths.js';
import { sealShared } from '../vmm/jail.js';
import type { BlobFetcher } from './blobFetcher.js';
import type { ClusterEnvironments } from './environments.js';

/** How often copies of environments the cluster no longer has are dropped. */
export const COPY_RECONCILE_MS = 30_000;

/** What a pull moved: the layers fetched and those this host already held, and the bytes that crossed the network. */
export interface PullReport {
  environment: string;
  artifactKey: string;
  layersPulled: string[];
  layersHeld: string[];
  /** Whether the artifact's files were fetched (false: a build was in this host's cache). */
  artifactPulled: boolean;
  layerBytes: number;
  artifactBytes: number;
}

/** What the puller needs of this host. */
export interface PullTarget {
  layers: LayerStore;
  cacheDir: string;
  ramDir: string;
  /** The artifact an environment's template is registered on here, if it is (Engine.environmentArtifact). */
  artifactOf(tenant: string, name: string): { key: string } | undefined;
  /** Whether this host made the environment itself (its own tables hold it). */
  madeHere(tenant: string, name: string): boolean;
  /** Registers the template from layers now in the store (ImageService.registerCopy). */
  registerCopy(config: EnvironmentConfig, runtime: ImageRuntime, diffIds: string[]): Promise<unknown>;
  removeTemplate(tenant: string, name: string): Promise<void>;
}

export class EnvironmentPuller {
  private readonly inflight = new Map<string, Promise<PullReport | null>>();
  /** Copies registered here: generation and artifact key of each, by tenant/name. */
  private readonly copies = new Map<string, { tenant: string; name: string; generation: number; artifactKey: string }>();
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly envs: ClusterEnvironments,
    private readonly fetcher: BlobFetcher,
    private readonly target: PullTarget,
    private readonly log: (err: unknown, msg: string) => void = () => {},
    /** After a pull: tell the cluster what this host holds now (BlobPublisher.publishNow). */
    private readonly onPulled: () => void = () => {},
  ) {}

  /**
   * Makes the tenant's environment `name` creatable here: nothing when its template is here already,
   * else a pull and registration (one at a time per environment). Null when nothing had to move.
   * Throws template_not_found, template_not_ready, or image_pull_failed (no holder could serve a blob).
   */
  ensure(tenant: string, name: string): Promise<PullReport | null> {
    const k = `${tenant}/${name}`;
    let p = this.inflight.get(k);
    if (!p) {
      p = this.pull(tenant, name).finally(() => this.inflight.delete(k));
      this.inflight.set(k, p);
    }
    return p;
  }

  /** Drops the copies of environments whose generation the cluster no longer has (deleted, or made again). */
  async reconcile(): Promise<void> {
    for (const [k, c] of this.copies) {
      if (this.inflight.has(k)) continue;
      const row = await this.envs.get(c.tenant, c.name);
      if (row && row.generation === c.generation && row.copy?.artifact.key === c.artifactKey) continue;
      this.copies.delete(k);
      await this.target.removeTemplate(c.tenant, c.name);
      this.log(null, `dropped this host's copy of environment ${k}: ${row ? 'it was made again' : 'it was deleted'}`);
    }
  }

  start(everyMs = COPY_RECONCILE_MS): void {
    this.timer = setInterval(() => void this.reconcile().catch((err) => this.log(err, 'dropping copies of deleted environments failed')), everyMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  private async pull(tenant: string, name: string): Promise<PullReport | null> {
    const row = await this.envs.get(tenant, name);
    if (!row) throw new CollimateError('template_not_found', msg`No template ${JSON.stringify(name)}. List them${see('listTemplates')}.`);
    if (this.target.madeHere(tenant, name)) return null; // this host's own: its image service registers it
    const copy = row.copy;
    if (row.state !== 'ready' || !copy) {
      throw environmentNotReady(name, row.state);
    }
    const k = `${tenant}/${name}`;
    const have = this.copies.get(k);
    if (have && have.generation === row.generation && this.target.artifactOf(tenant, name)?.key === copy.artifact.key) return null;

    const report: PullReport = { environment: k, artifactKey: copy.artifact.key, layersPulled: [], layersHeld: [], artifactPulled: false, layerBytes: 0, artifactBytes: 0 };
    const { layers } = this.target;
    const tmp = homePaths(this.target.cacheDir).tmp;
    mkdirSync(tmp, { recursive: true });
    const stage = mkdtempSync(join(tmp, 'env-pull-'));
    const artifactRoot = join(homePaths(this.target.cacheDir).artifacts, copy.artifact.key.slice(0, 24));
    // A build directory staged under tmp-…-<pid>: a start after this process died removes it (stopOrphanedBakes).
    const buildTmp = join(artifactRoot, `tmp-pull${randomBytes(4).toString('hex')}-${process.pid}`);
    const memTmp = join(this.target.ramDir, `${copy.artifact.ramFile}.pull-${process.pid}-${randomBytes(4).toString('hex')}`);
    try {
      const staged: StagedLayer[] = [];
      for (const l of copy.layers) {
        if (layers.get(l.diffId) && (await layers.erofsDigestOf(l.diffId)) === l.erofsDigest && layers.touch(l.diffId)) {
          report.layersHeld.push(l.diffId);
          continue;
        }
        const hex = l.diffId.slice('sha256:'.length);
        const erofs = join(stage, `${hex}.erofs`);
        const got = await this.fetcher.fetch(l.erofsDigest, erofs);
        const json = join(stage, `${hex}.json`);
        const meta = { diffId: l.diffId, size: l.size, unpackedBytes: l.unpackedBytes, facts: l.facts, erofsDigest: l.erofsDigest };
        writeFileSync(json, JSON.stringify(meta));
        staged.push({ diffId: l.diffId, blobDigest: l.blobDigest, erofs, json, meta });
        report.layersPulled.push(l.diffId);
        report.layerBytes += got.transferred;
      }
      // Claimed before it is looked for, as a bake does: a collector leaves it alone from now on.
      mkdirSync(artifactRoot, { recursive: true });
      claimArtifact(artifactRoot);
      const memPath = join(this.target.ramDir, copy.artifact.ramFile);
      if (!builtArtifact(artifactRoot, copy.artifact.key, this.target.ramDir)) {
        mkdirSync(buildTmp, { recursive: true });
        mkdirSync(this.target.ramDir, { recursive: true });
        for (const f of copy.artifact.files) {
          const dest = f.kind === 'artifact-mem' ? memTmp : join(buildTmp, f.kind === 'artifact-state' ? ARTIFACT_FILES.devState : ARTIFACT_FILES.disk);
          const got = await this.fetcher.fetch(f.digest, dest, { sparse: f.kind !== 'artifact-state' });
          report.artifactBytes += got.transferred;
        }
        writeFileSync(join(buildTmp, ARTIFACT_FILES.manifest), JSON.stringify(copy.artifact.manifest, null, 2));
        // Every sandbox of the template maps the RAM file and reads the disk: read-only, root's (as a bake leaves them).
        sealShared(memTmp);
        sealShared(join(buildTmp, ARTIFACT_FILES.disk));
        report.artifactPulled = true;
      }
      // Every blob is here with its digest: commit (layers, the RAM file, then the build directory that names it).
      for (const s of staged) layers.commit(s);
      if (report.artifactPulled) {
        renameSync(memTmp, memPath);
        // A build of that name without its RAM file may be here (tmpfs lost on reboot): it stays, the
        // pulled one goes beside it and, being named later, is the one found.
        const final = join(artifactRoot, copy.artifact.build);
        renameSync(buildTmp, existsSync(final) ? `${final}-pulled-${Date.now().toString(36)}` : final);
      }
      await this.target.registerCopy(copy.config, copy.image.runtime, copy.layers.map((l) => l.diffId));
      const registered = this.target.artifactOf(tenant, name)?.key;
      if (registered !== undefined && registered !== copy.artifact.key) {
        // This host computed another key for the same environment (another collimate build or kernel): it baked its own.
        this.log(null, `environment ${k}: this host's artifact key ${registered.slice(0, 12)} differs from its first host's ${copy.artifact.key.slice(0, 12)}; it was baked here`);
      }
      this.copies.set(k, { tenant, name, generation: row.generation, artifactKey: registered ?? copy.artifact.key });
      this.log(null, `pulled environment ${k} from peers: ${JSON.stringify(report)}`);
      this.onPulled();
      return report;
    } finally {
      rmSync(stage, { recursive: true, force: true });
      rmSync(buildTmp, { recursive: true, force: true });
      rmSync(memTmp, { force: true });
    }
  }
}
