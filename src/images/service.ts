import { mkdirSync, mkdtempSync, rmSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { CollimateError, msg, see } from '../errors.js';
import { assertTenantEgress, parseEgress } from '../net/policy.js';
import type { Db } from '../store/db.js';
import { homePaths } from '../host/paths.js';
import { BakeError } from './bake.js';
import { CATALOG, type TemplateInfo, type TemplateRecipe } from './templates.js';
import type { LayerAsset } from './guestAssets.js';
import { CATALOG_DEFAULTS } from './catalog.js';
import { LayerStore, type StagedLayer } from './layerStore.js';
import { collectLayers, writeHomeLayers, type RemovedLayer } from './layerGc.js';
import { ImageRepo, type EnvironmentRow, type ImageLayerRecord, type ImageRow, type ImageRuntime } from './imageRepo.js';
import type { ImageConfig } from './oci.js';
import { SecretBox } from './secrets.js';
import { openSource, resolveImage, type ImageSource, type ResolvedImage, type SourceSpec } from './sources.js';
import { LINK_MARK, lookupMerged, newBudget, type LayerFacts } from './unpack.js';

/**
 * The image service: brings a tenant's own OCI images in (pull → verify → unpack → one erofs per
 * layer in the shared LayerStore) and turns environments — a tenant's named configuration of an
 * image — into templates the engine bakes and keeps warm (engine.addTemplate). It owns the images
 * and environments tables and the secrets key; the engine owns artifacts and VMs.
 *
 * Pulls and bakes run in the background, one at a time each (the machines have two cores); their
 * state is in the database, so GET answers while they run and a restart finds them.
 */

/** What the image service needs from the engine (Engine implements it). */
export interface TemplateHost {
  /** `layerGraceSecs`: see EngineConfig (default 3600). */
  readonly cfg: { home: string; cacheDir: string; layerGraceSecs?: number };
  addTemplate(recipe: TemplateRecipe, opts?: { progress?: (m: string) => void; log?: (c: string) => void; poolSize?: number }): Promise<TemplateInfo>;
  removeTemplate(tenant: string, id: string): Promise<void>;
  /**
   * The layer files of the artifacts this home's templates and sandboxes (running, suspended or
   * being deleted) sit on: a suspended sandbox resumes on them after its environment and image are gone.
   */
  artifactLayers(): string[];
  /** Blocked ranges the operator lets tenants' egress allowlists name; none when absent. */
  egressOpened?(): readonly string[];
}

export interface ImageServiceOptions {
  host: TemplateHost;
  db: Db;
  /** Local sources (oci-layout, archive) must lie under this directory. Default $COLLIMATE_IMPORT_DIR or <home>/imports. */
  importDir?: string;
  /** Cap on the unpacked size of one image (tar bombs). Default $COLLIMATE_MAX_IMAGE_BYTES or 16 GiB. */
  maxUnpackedBytes?: number;
  /** Root of the layer store (default: the engine's cacheDir, shared like the other built assets). */
  storeDir?: string;
  /** Warm VMMs per environment (default: the engine's COLLIMATE_ENV_POOL_SIZE). */
  poolSize?: number;
  /** Operational log lines (never secret values). */
  log?: (msg: string) => void;
  /** On a cluster host: the cluster's secrets key (src/cluster/secretsKey.ts), sealing instead of `<home>/secrets.key`. */
  clusterSecretsKey?: Buffer;
}

export interface EnvironmentSpec {
  name: string;
  /** An image id (sha256:…) or the ref it was pulled by. */
  image: string;
  description?: string;
  interpreter?: string[];
  readyCommand?: string;
  readyProbe?: string;
  readyTimeoutSecs?: number;
  secrets?: Record<string, string>;
  vcpus?: number;
  memoryMib?: number;
  diskMib?: number;
  /** The egress policy of its sandboxes, as JSON (validated with parseEgress); default "allow". */
  egress?: unknown;
}

export const ENVIRONMENT_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const GIB = 1024 * 1024 * 1024;
/** How often layers nobody uses are looked for (layerGc.ts), as often as template RAM files. */
const LAYER_GC_MS = 600_000;

function intEnv(name: string, dflt: number): number {
  const v = process.env[name];
  const n = v === undefined || v === '' ? dflt : Number(v);
  if (!Number.isSafeInteger(n) || n <= 0) throw new Error(`${name} must be a positive integer`);
  return n;
}

/** A queue that runs jobs one at a time, in order. */
class Serial {
  private tail: Promise<unknown> = Promise.resolve();
  private pending = 0;
  run<T>(job: () => Promise<T>): Promise<T> {
    this.pending++;
    const p = this.tail.then(job);
    this.tail = p.catch(() => {}).finally(() => this.pending--);
    return p;
  }
  get idle(): Promise<void> {
    return this.tail.then(() => (this.pending > 0 ? this.idle : undefined));
  }
}

/** Parses `user[:group]` against the image's passwd and group files. */
function resolveUser(user: string, passwd: string | null | undefined, group: string | null | undefined) {
  const [u, g] = user.split(':', 2);
  const pw = (passwd ?? '').split('\n').map((l) => l.split(':')).filter((f) => f.length >= 7);
  const gr = (group ?? '').split('\n').map((l) => l.split(':')).filter((f) => f.length >= 3);
  const entry = /^\d+$/.test(u) ? pw.find((f) => f[2] === u) : pw.find((f) => f[0] === u);
  if (!entry && !/^\d+$/.test(u)) return { error: `the image's User ${JSON.stringify(user)} is not in its /etc/passwd` };
  const uid = entry ? Number(entry[2]) : Number(u);
  let gid = entry ? Number(entry[3]) : 0;
  if (g !== undefined) {
    if (/^\d+$/.test(g)) gid = Number(g);
    else {
      const ge = gr.find((f) => f[0] === g);
      if (!ge) return { error: `the image's User group ${JSON.stringify(g)} is not in its /etc/group` };
      gid = Number(ge[2]);
    }
  }
  return { uid, gid, home: entry?.[5], inPasswd: !!entry };
}

/**
 * Exec defaults from the image config: Env (PATH defaulted like Docker's), WorkingDir, and User as a
 * `setpriv` prefix when the image has setpriv; Entrypoint and Cmd are recorded, not run.
 */
export function imageRuntime(config: ImageConfig, topFirst: LayerFacts[]): ImageRuntime {
  const env: Record<string, string> = {};
  for (const kv of config.env) {
    const i = kv.indexOf('=');
    if (i > 0 && /^[A-Za-z_][A-Za-z0-9_]*$/.test(kv.slice(0, i))) env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  env.PATH ??= DEFAULT_PATH;
  const warnings: string[] = [];
  if (lookupMerged(topFirst, 'bin/sh') === undefined) {
    warnings.push('the image has no /bin/sh: `command`, `code` with a shell interpreter, ready commands and probes need it (exec `commands` with argv lists still work)');
  }
  let prefix: string[] | undefined;
  let home = '/root';
  if (config.user) {
    const r = resolveUser(config.user, lookupMerged(topFirst, 'etc/passwd'), lookupMerged(topFirst, 'etc/group'));
    if ('error' in r) warnings.push(`${r.error}; commands run as root`);
    else if (r.uid !== 0 || r.gid !== 0) {
      home = r.home || '/';
      // util-linux setpriv; busybox's applet of that name cannot change ids.
      const setpriv = ['usr/bin/setpriv', 'bin/setpriv', 'usr/sbin/setpriv', 'sbin/setpriv', 'usr/local/bin/setpriv'].find((p) => {
        const v = lookupMerged(topFirst, p);
        return v !== undefined && !(typeof v === 'string' && v.startsWith(LINK_MARK) && /(^|\/)busybox$/.test(v.slice(LINK_MARK.length)));
      });
      if (setpriv) prefix = [`/${setpriv}`, `--reuid=${r.uid}`, `--regid=${r.gid}`, r.inPasswd ? '--init-groups' : '--clear-groups', '--'];
      else warnings.push(`the image's User ${config.user} needs util-linux setpriv in the image to be applied; commands run as root`);
    } else home = r.home || '/root';
  }
  env.HOME ??= home;
  return { env, cwd: config.workingDir, prefix, warnings };
}

export class ImageService {
  readonly repo: ImageRepo;
  readonly layers: LayerStore;
  readonly importDir: string;
  readonly maxUnpackedBytes: number;
  private readonly secrets: SecretBox;
  private readonly pulls = new Serial();
  private readonly bakes = new Serial();
  /** Pull jobs by tenant/image id, so a bake can wait for the image it needs. */
  private readonly pulling = new Map<string, Promise<void>>();
  private readonly baking = new Set<string>();
  private closing = false;
  private layerGcTimer?: NodeJS.Timeout;

  constructor(private readonly opts: ImageServiceOptions) {
    const { home } = opts.host.cfg;
    this.repo = new ImageRepo(opts.db);
    this.layers = new LayerStore(opts.storeDir ?? opts.host.cfg.cacheDir);
    this.importDir = opts.importDir ?? (process.env.COLLIMATE_IMPORT_DIR || join(home, 'imports'));
    this.maxUnpackedBytes = opts.maxUnpackedBytes ?? intEnv('COLLIMATE_MAX_IMAGE_BYTES', 16 * GIB);
    this.secrets = new SecretBox(join(home, 'secrets.key'), opts.clusterSecretsKey);
    mkdirSync(this.importDir, { recursive: true });
  }

  private log(m: string): void {
    this.opts.log?.(m);
  }

  private assertOpen(): void {
    if (this.closing) throw new CollimateError('shutting_down', 'The server is shutting down; retry against the restarted server.', { retryAfterSecs: 5 });
  }

  // ---- images ----------------------------------------------------------------------------------

  /**
   * Resolves the source to one manifest now (so a bad reference, credentials or manifest fail the
   * request itself) and pulls the layers in the background; the returned image is `pulling` (or
   * already `ready`, re-verified in the background without moving held layers).
   */
  async pull(tenant: string, spec: SourceSpec): Promise<ImageRow> {
    this.assertOpen();
    const tmp = homePaths(this.layers.cacheDir).tmp;
    mkdirSync(tmp, { recursive: true });
    const src = await openSource(spec, { importDir: this.importDir, tmpDir: tmp, maxBytes: this.maxUnpackedBytes });
    let resolved: ResolvedImage;
    try {
      resolved = await resolveImage(src);
    } catch (e) {
      src.close();
      throw e;
    }
    const key = `${tenant}/${resolved.id}`;
    if (this.pulling.has(key)) {
      src.close();
      return this.image(tenant, resolved.id);
    }
    const now = Date.now();
    const prev = this.repo.getImage(tenant, resolved.id);
    // Recorded before the row, so that no collector sees its layers unclaimed once it reuses them.
    this.recordLayers(resolved.layers.map((l) => l.diffId));
    this.repo.putImage({
      tenant, id: resolved.id, ref: resolved.ref, source_kind: spec.kind, state: 'pulling', error: null, progress: 'queued',
      manifest: resolved.manifestBytes.toString('utf8'), config: resolved.config,
      layers: resolved.layers.map((l) => ({ digest: l.digest, diffId: l.diffId, size: l.size, mediaType: l.mediaType, storedBytes: null })),
      runtime: null, transferred_bytes: 0, created_at: prev?.created_at ?? now, updated_at: now,
    });
    const job = this.pulls.run(() => this.fetchLayers(tenant, resolved, src)).finally(() => {
      src.close();
      this.pulling.delete(key);
    });
    this.pulling.set(key, job);
    return this.image(tenant, resolved.id);
  }

  private async fetchLayers(tenant: string, img: ResolvedImage, src: ImageSource): Promise<void> {
    mkdirSync(homePaths(this.layers.cacheDir).tmp, { recursive: true });
    const stage = mkdtempSync(join(homePaths(this.layers.cacheDir).tmp, 'pull-'));
    const budget = newBudget(this.maxUnpackedBytes);
    const staged = new Map<string, StagedLayer>();
    const records: ImageLayerRecord[] = [];
    const progress = (p: string) => this.repo.updateImage(tenant, img.id, { progress: p });
    try {
      for (const [i, l] of img.layers.entries()) {
        if (this.closing) throw new CollimateError('shutting_down', 'the pull was interrupted by a shutdown; pull again');
        const label = `layer ${i + 1}/${img.layers.length} ${l.digest.slice(0, 19)}`;
        const already = staged.get(l.diffId);
        const held = this.layers.get(l.diffId);
        // A held layer is reused only if this store once verified that this very blob unpacks to it,
        // and the source proves it has the blob (a HEAD for registries, a hash for local files).
        // Touching it tells collectors it was just used (and fails if one took it meanwhile).
        if (already || (held && this.layers.diffOfBlob(l.digest) === l.diffId && (await src.holds(l)) && this.layers.touch(l.diffId))) {
          const unpacked = already ? already.meta.unpackedBytes : held!.unpackedBytes;
          budget.bytes += unpacked;
          if (budget.bytes > budget.maxBytes) throw new CollimateError('validation_error', `the image unpacks to more than the limit of ${budget.maxBytes} bytes`);
          records.push({ digest: l.digest, diffId: l.diffId, size: l.size, mediaType: l.mediaType, storedBytes: already ? already.meta.size : held!.size });
          progress(`${label}: held`);
          continue;
        }
        progress(`${label}: fetching ${l.size} bytes`);
        const s = await this.layers.build(await src.blobStream(l), l, budget, stage);
        staged.set(l.diffId, s);
        records.push({ digest: l.digest, diffId: l.diffId, size: l.size, mediaType: l.mediaType, storedBytes: s.meta.size });
        this.log(`image ${img.id.slice(0, 19)} ${label}: ${l.size} bytes -> erofs ${s.meta.size} bytes`);
      }
      // Every layer verified: only now does anything enter the store.
      for (const s of staged.values()) this.layers.commit(s);
      const facts = img.layers.map((l) => this.layers.get(l.diffId)!.facts).reverse();
      this.repo.updateImage(tenant, img.id, {
        state: 'ready', error: null, progress: null, layers: records, runtime: imageRuntime(img.config, facts), transferred_bytes: src.transferredBytes(),
      });
      this.log(`image ${img.ref} (${img.id.slice(0, 19)}) ready: ${staged.size} new layer(s), ${src.transferredBytes()} bytes moved`);
    } catch (e) {
      const message = e instanceof CollimateError ? e.message : `internal error: ${(e as Error).message}`;
      this.repo.updateImage(tenant, img.id, { state: 'failed', error: message, progress: null, transferred_bytes: src.transferredBytes() });
      this.log(`image ${img.ref} failed: ${message}`);
    } finally {
      rmSync(stage, { recursive: true, force: true });
    }
  }

  image(tenant: string, id: string): ImageRow {
    const r = this.repo.getImage(tenant, id);
    if (!r) throw new CollimateError('image_not_found', msg`No image ${id.slice(0, 80)}. List yours${see('listImages')}.`);
    return r;
  }

  images(tenant: string): ImageRow[] {
    return this.repo.listImages(tenant);
  }

  /** Forgets the tenant's image. Its layers stay in the shared store (other images may use them). */
  deleteImage(tenant: string, id: string): void {
    this.image(tenant, id);
    if (this.pulling.has(`${tenant}/${id}`)) throw new CollimateError('conflict', `Image ${id} is still being pulled; delete it once GET shows it ready or failed.`);
    const users = this.repo.envsOfImage(tenant, id).map((e) => e.name);
    if (users.length) throw new CollimateError('conflict', `Image ${id} is used by environment(s) ${users.join(', ')}; delete those first.`);
    this.repo.deleteImage(tenant, id);
    try {
      this.recordLayers();
    } catch (e) {
      // The record still holds the image's layers: nothing is lost, they are only kept longer.
      this.log(`layer record: ${(e as Error).message}`);
    }
  }

  // ---- layers ----------------------------------------------------------------------------------

  /**
   * Writes this home's record in the layer store (layerGc.ts): the layers of its images (and of
   * `extra`, an image about to be recorded), and those of the artifacts its templates and sandboxes
   * sit on. An environment needs nothing more: its image cannot be deleted before it.
   */
  recordLayers(extra: string[] = []): void {
    const diffIds = new Set([...extra, ...this.repo.allImages().flatMap((i) => i.layers.map((l) => l.diffId))]);
    for (const p of this.opts.host.artifactLayers()) {
      const d = this.layers.diffIdOf(p);
      if (d) diffIds.add(d);
    }
    const db = this.opts.db.memory ? null : this.opts.db.name;
    writeHomeLayers(this.layers, this.opts.host.cfg.home, db, diffIds);
  }

  /**
   * Rewrites this home's record, then removes the layers of the shared store that no home records,
   * no process has open and nobody wrote or reused for `graceSecs` (COLLIMATE_LAYER_GRACE_SECS).
   * Runs every 10 minutes once `restore` has run.
   */
  collectLayers(graceSecs = this.opts.host.cfg.layerGraceSecs ?? 3600): RemovedLayer[] {
    this.recordLayers();
    const removed = collectLayers(this.layers, graceSecs * 1000);
    for (const l of removed) this.log(`removed unused image layer ${l.diffId} (${l.bytes} bytes)`);
    return removed;
  }

  // ---- environments ----------------------------------------------------------------------------

  /** Validates and records the environment, then bakes it in the background (state pending → baking → ready | failed). */
  createEnvironment(tenant: string, spec: EnvironmentSpec): EnvironmentRow {
    this.assertOpen();
    if (!ENVIRONMENT_NAME_RE.test(spec.name)) throw new CollimateError('validation_error', `environment name must match ${ENVIRONMENT_NAME_RE.source}`);
    if (CATALOG.some((c) => c.id === spec.name)) throw new CollimateError('conflict', `${spec.name} is a catalog template; choose another name for your environment.`);
    if (this.repo.getEnv(tenant, spec.name)) throw new CollimateError('conflict', msg`Environment ${spec.name} exists; delete it first${see('deleteEnvironment', { name: spec.name })} to replace it.`);
    const egress = spec.egress === undefined ? 'allow' : parseEgress(spec.egress, 'egress');
    assertTenantEgress(egress, this.opts.host.egressOpened?.() ?? []);
    const img = spec.image.startsWith('sha256:') ? this.repo.getImage(tenant, spec.image) : this.repo.imageByRef(tenant, spec.image);
    if (!img) throw new CollimateError('image_not_found', msg`No image ${spec.image.slice(0, 100)}. Register it first${see('createImage')}.`);
    if (img.state === 'failed') throw new CollimateError('validation_error', `Image ${img.id} failed to pull (${img.error}); pull it again first.`);
    const secrets = spec.secrets ?? {};
    const names = Object.keys(secrets).sort();
    const now = Date.now();
    const row: EnvironmentRow = {
      tenant, name: spec.name, image: img.id, state: 'pending', error: null, progress: img.state === 'pulling' ? 'waiting for the image pull' : 'queued', log: '',
      description: spec.description ?? `${img.ref}`, interpreter: spec.interpreter ?? ['/bin/sh', '-c'],
      ready_command: spec.readyCommand ?? null, ready_probe: spec.readyProbe ?? null, ready_timeout_secs: spec.readyTimeoutSecs ?? null,
      vcpus: spec.vcpus ?? CATALOG_DEFAULTS.vcpus, memory_mib: spec.memoryMib ?? CATALOG_DEFAULTS.memoryMib, disk_mib: spec.diskMib ?? CATALOG_DEFAULTS.diskMib,
      egress,
      secrets: names.length ? this.secrets.seal(Buffer.from(JSON.stringify(secrets)), secretAad(tenant, spec.name)) : null,
      secret_names: names, created_at: now, updated_at: now,
    };
    this.repo.insertEnv(row);
    this.scheduleBake(tenant, spec.name);
    return this.environment(tenant, spec.name);
  }

  private scheduleBake(tenant: string, name: string): Promise<void> {
    const key = `${tenant}/${name}`;
    this.baking.add(key);
    const created = this.repo.getEnv(tenant, name)!.created_at;
    return this.bakes.run(async () => {
      const pull = this.pulling.get(`${tenant}/${this.repo.getEnv(tenant, name)?.image}`);
      if (pull) await pull;
      await this.bake(tenant, name, created);
    }).finally(() => this.baking.delete(key));
  }

  private async bake(tenant: string, name: string, createdAt: number): Promise<void> {
    const env = this.repo.getEnv(tenant, name);
    if (!env || env.created_at !== createdAt || this.closing) return; // deleted (or replaced) while queued
    const fail = (error: string) => {
      this.repo.updateEnv(tenant, name, { state: 'failed', error, progress: null });
      this.log(`environment ${tenant}/${name} failed: ${error.split('\n')[0]}`);
    };
    const img = this.repo.getImage(tenant, env.image);
    if (!img || img.state !== 'ready' || !img.runtime) return fail(`its image ${env.image} is ${img ? img.state : 'gone'}${img?.error ? `: ${img.error}` : ''}`);
    const layers = img.layers.map((l) => this.layers.get(l.diffId));
    if (layers.some((l) => !l)) return fail(`a layer of image ${env.image} is missing from the layer store; pull the image again`);
    // The checkpoint is keyed by the bytes the guest will read, not by the tars they came from.
    let layerDigests: string[];
    try {
      layerDigests = await Promise.all(layers.map((l) => this.layers.erofsDigestOf(l!.diffId)));
    } catch (e) {
      return fail(`a layer of image ${env.image} could not be read from the layer store (${(e as Error).message}); pull the image again`);
    }
    let secrets: Record<string, string> = {};
    if (env.secrets) {
      try { secrets = JSON.parse(this.secrets.open(env.secrets, secretAad(tenant, name)).toString('utf8')); } catch {
        return fail(`its secrets cannot be decrypted with this server's ${this.opts.clusterSecretsKey ? 'keys (the cluster\'s, or its own secrets.key for environments made before it joined)' : 'secrets.key'}; delete and re-create the environment`);
      }
    }
    this.repo.updateEnv(tenant, name, { state: 'baking', error: null, progress: 'baking' });
    // The log is flushed in batches: each database write is an fsync.
    let buf = '';
    const flush = () => { if (buf) { this.repo.appendLog(tenant, name, buf); buf = ''; } };
    const timer = setInterval(flush, 500);
    const recipe = environmentRecipe(env, img.runtime, layers.map((l, i) => ({ path: l!.path, digest: layerDigests[i] })), secrets);
    try {
      await this.opts.host.addTemplate(recipe, {
        progress: (m) => { buf += `# ${m}\n`; this.repo.updateEnv(tenant, name, { progress: m }); },
        log: (c) => { buf += c; },
        poolSize: this.opts.poolSize,
      });
      clearInterval(timer);
      flush();
      // Deleted while baking: take the template back out.
      const now = this.repo.getEnv(tenant, name);
      if (!now || now.created_at !== createdAt) { await this.opts.host.removeTemplate(tenant, name); return; }
      this.repo.updateEnv(tenant, name, { state: 'ready', error: null, progress: null });
      this.log(`environment ${tenant}/${name} ready`);
    } catch (e) {
      clearInterval(timer);
      if (e instanceof BakeError) buf += `\n${e.logTail}\n`;
      // The first line is the error; the rest (a guest's console when its agent never answered) goes to the log.
      else if (!(e instanceof CollimateError) && (e as Error).message.includes('\n')) buf += `\n${(e as Error).message}\n`;
      flush();
      const msg = e instanceof BakeError ? `the bake failed: ${e.message.split('\n')[0]}` : e instanceof CollimateError ? e.message : `the bake failed: ${(e as Error).message.split('\n')[0]}`;
      fail(msg);
    }
  }

  /**
   * Registers with the engine an environment another cluster host made (src/cluster/environmentPull.ts):
   * its layers are in this host's store by now (`diffIds`, the image's, bottom first) and its
   * artifact in this host's cache, so the engine finds the artifact under the key it computes and
   * bakes nothing. This host's own tables are not written: the environment stays the other host's.
   */
  async registerCopy(env: EnvironmentConfig, runtime: ImageRuntime, diffIds: string[]): Promise<TemplateInfo> {
    this.assertOpen();
    const layers: LayerAsset[] = [];
    for (const d of diffIds) {
      const l = this.layers.get(d);
      if (!l) throw new CollimateError('image_pull_failed', `Layer ${d} of environment ${env.name} is not in this host's layer store after its pull; retry the create.`);
      layers.push({ path: l.path, digest: await this.layers.erofsDigestOf(d) });
    }
    let secrets: Record<string, string> = {};
    if (env.secrets) {
      try { secrets = JSON.parse(this.secrets.open(env.secrets, secretAad(env.tenant, env.name)).toString('utf8')); } catch {
        throw new CollimateError('template_not_ready', `Environment ${env.name}'s secrets cannot be opened on this host (they were sealed with its first host's own secrets.key, before that host joined the cluster); delete and re-create the environment.`);
      }
    }
    return this.opts.host.addTemplate(environmentRecipe(env, runtime, layers, secrets), { poolSize: this.opts.poolSize });
  }

  environment(tenant: string, name: string): EnvironmentRow {
    const r = this.repo.getEnv(tenant, name);
    if (!r) throw new CollimateError('environment_not_found', msg`No environment ${name.slice(0, 80)}. List yours${see('listEnvironments')}.`);
    return r;
  }

  environments(tenant: string): EnvironmentRow[] {
    return this.repo.listEnvs(tenant);
  }

  /** Removes the environment and its template; sandboxes already created from it keep running. */
  async deleteEnvironment(tenant: string, name: string): Promise<void> {
    this.environment(tenant, name);
    this.repo.deleteEnv(tenant, name);
    await this.opts.host.removeTemplate(tenant, name);
  }

  /**
   * The environment templates of a tenant as /v1/templates shows them, baked or not. `network` is
   * false here: whether sandboxes get a NIC is the baked template's (the engine's TemplateInfo).
   */
  templateInfos(tenant: string): TemplateInfo[] {
    return this.repo.listEnvs(tenant).map((e) => ({
      id: e.name, kind: 'environment', description: e.description, interpreter: e.interpreter, ready: e.state === 'ready', vcpus: e.vcpus, memory_mib: e.memory_mib,
      egress: e.egress, network: false,
    }));
  }

  // ---- lifecycle -------------------------------------------------------------------------------

  /**
   * After the engine opens: pulls cut off by a restart are marked failed, ready environments are
   * registered with the engine again (their artifacts are cached, so this is quick), and environments
   * whose bake was cut off are baked again in the background. Resolves once the ready ones are back.
   * Also writes this home's layer record and starts collecting unused layers every 10 minutes.
   */
  async restore(): Promise<void> {
    for (const img of this.repo.allImages()) {
      if (img.state === 'pulling') this.repo.updateImage(img.tenant, img.id, { state: 'failed', error: 'the pull was interrupted by a server restart; pull again', progress: null });
    }
    this.recordLayers();
    this.layerGcTimer ??= setInterval(() => {
      try {
        this.collectLayers();
      } catch (e) {
        this.log(`image layers: ${(e as Error).message}`);
      }
    }, LAYER_GC_MS);
    this.layerGcTimer.unref();
    const again: EnvironmentRow[] = [];
    for (const env of this.repo.allEnvs()) {
      if (env.state === 'pending' || env.state === 'baking') { again.push(env); continue; }
      if (env.state !== 'ready') continue;
      this.repo.updateEnv(env.tenant, env.name, { state: 'baking', progress: 'restoring after a restart' });
      await this.scheduleBake(env.tenant, env.name);
    }
    for (const env of again) {
      this.repo.updateEnv(env.tenant, env.name, { state: 'pending', progress: 'queued again after a restart' });
      void this.scheduleBake(env.tenant, env.name);
    }
  }

  /** Resolves when no pull or bake is queued or running. */
  async idle(): Promise<void> {
    await this.pulls.idle;
    await this.bakes.idle;
  }

  /** Stops taking work and waits for the running pull and bake to finish. */
  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.layerGcTimer);
    await this.idle();
  }

  /** Whether the layer files of an image are all present (for tests and diagnostics). */
  layersPresent(img: ImageRow): boolean {
    return img.layers.every((l) => existsSync(join(this.layers.dir, `${l.diffId.slice(7)}.erofs`)));
  }
}

/**
 * The template an environment is baked into: its image's layers (paths in this host's store, with
 * the digests of their erofs bytes) and runtime, its configuration, and its opened secrets. One
 * function for a bake and for a copy registered on another cluster host, so both compute the same
 * artifact key.
 */
export function environmentRecipe(env: EnvironmentConfig, rt: ImageRuntime, layers: LayerAsset[], secrets: Record<string, string>): TemplateRecipe {
  return {
    id: env.name, tenant: env.tenant, description: env.description, interpreter: env.interpreter,
    layers,
    vcpus: env.vcpus, memoryMib: env.memory_mib, diskMib: env.disk_mib,
    // Ready steps run as root with the image's Env and WorkingDir (a build step); secrets are exec-only.
    ready: env.ready_command || env.ready_probe
      ? { command: env.ready_command ?? undefined, probe: env.ready_probe ?? undefined, env: rt.env, cwd: rt.cwd, timeoutSecs: env.ready_timeout_secs ?? undefined }
      : undefined,
    execDefaults: { env: { ...rt.env, ...secrets }, cwd: rt.cwd, prefix: rt.prefix },
    egress: env.egress,
  };
}

/** What of an environment's row its template is made from (its state, log and times are not). */
export type EnvironmentConfig = Pick<EnvironmentRow,
  'tenant' | 'name' | 'description' | 'interpreter' | 'ready_command' | 'ready_probe' | 'ready_timeout_secs' | 'vcpus' | 'memory_mib' | 'disk_mib' | 'egress' | 'secrets'>;

function secretAad(tenant: string, name: string): string {
  return `collimate-env-secrets\0${tenant}\0${name}`;
}
