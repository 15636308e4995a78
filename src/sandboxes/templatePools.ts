import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { CollimateError, msg, see } from '../errors.js';
import type { EngineConfig } from '../config.js';
import { homePaths } from '../host/paths.js';
import type { Artifact } from '../images/artifactManifest.js';
import { claimArtifact, releaseArtifact } from '../images/artifactGc.js';
import { ARTIFACT_FILES, readArtifactManifest } from '../images/artifactManifest.js';
import { CATALOG, catalogTemplate, guestBase, loadCatalog, bakeRecipe, type GuestBase, type ReadyTemplate, type TemplateInfo, type TemplateRecipe } from '../images/templates.js';
import type { CatalogEntry } from '../images/catalog.js';
import type { NetManager } from '../net/netns.js';
import { WarmPool } from './warmPool.js';
import { PoolSizer, fitBudget, type PoolSize } from './poolSizer.js';
import { SANDBOX_FOOTPRINT_MIB } from './hostCapacity.js';
import { spawnPooled, destroyPending, type PendingVm } from './runtime.js';
import type { CatalogStatus, Scope } from './types.js';

/**
 * The templates sandboxes are made from — the catalog's and tenants' environments — each with a
 * warm pool of VMMs waiting to become its next sandbox, and the artifacts they were baked into
 * (also those of earlier builds that running or suspended sandboxes still sit on).
 */
export class TemplatePools {
  /** Catalog templates by id, environments by `<tenant>/<id>`. */
  private readonly byKey = new Map<string, ReadyTemplate>();
  private readonly pools = new Map<string, WarmPool<PendingVm>>();
  /** Each pool's sizer (poolSizer.ts) and the size it holds now, with why. */
  private readonly sizers = new Map<string, PoolSizer>();
  private readonly sized = new Map<string, PoolSize>();
  /** Creates served from a pool (hit) and on the slow path (miss), per template. */
  private readonly takes = new Map<string, { hit: number; miss: number }>();
  private resizer?: NodeJS.Timeout;
  /** Artifacts by key, for restoring sandboxes whose template was made by an earlier build. */
  private readonly artifacts = new Map<string, Artifact>();
  /** Catalog templates still being built after the server started listening (warmCatalog's background), by id. */
  private readonly building = new Map<string, { step: string; since: number }>();
  /** Catalog templates whose background build failed, by id, with why. A create starts it again. */
  private readonly failed = new Map<string, string>();
  /** The catalog's entries (CATALOG, or a test's). */
  private catalog: CatalogEntry[] = CATALOG;
  private background?: { base: GuestBase; progress: (msg: string) => void; queue: Promise<void> };
  private closed = false;
  /** Pools taken out and still destroying their VMMs. */
  private readonly closing = new Set<Promise<void>>();

  constructor(private readonly cfg: EngineConfig, private readonly net: NetManager | null) {}

  /**
   * Builds (or finds) the catalog's templates and fills their pools; resolves once they are full or
   * after a minute. With `background`, resolves once the guest assets, the first catalog template
   * (`base`) and those whose layers are built already are ready, and builds the others after it,
   * one at a time: a first start serves in seconds rather than after debootstrap, and a create of a
   * template still being built is answered template_not_ready (catalogStatus).
   */
  async warmCatalog(progress: (msg: string) => void, only?: string[], opts: { background?: boolean; entries?: CatalogEntry[] } = {}): Promise<void> {
    this.catalog = opts.entries ?? CATALOG;
    if (!opts.background) {
      for (const t of await loadCatalog(this.cfg, progress, only, this.catalog)) this.addCatalog(t, progress);
      for (const [, pool] of this.pools) await pool.waitFull(60_000);
      return;
    }
    const entries = this.catalog.filter((e) => !only || only.includes(e.id));
    const base = await guestBase(this.cfg, progress);
    this.background = { base, progress, queue: Promise.resolve() };
    // The first (base) and those whose layers are built already (a bake at most: seconds) now; the rest later.
    const now = entries.filter((e, i) => i === 0 || e.layersCached?.(this.cfg.cacheDir) !== false);
    for (const e of now) this.addCatalog(await catalogTemplate(this.cfg, e, base, progress), progress);
    for (const e of now) await this.pools.get(e.id)!.waitFull(60_000);
    for (const e of entries) if (!now.includes(e)) this.buildInBackground(e.id);
  }

  private addCatalog(t: ReadyTemplate, progress: (msg: string) => void): void {
    this.byKey.set(t.id, t);
    this.artifacts.set(t.artifact.key, t.artifact);
    this.newPool(t.id, t, this.cfg.poolSize, (e) => progress(`warm pool ${t.id}: spawn failed: ${(e as Error).message}`));
  }

  /** Queues the build of catalog template `id` behind the others (one bake at a time). */
  private buildInBackground(id: string): void {
    const bg = this.background!;
    const entry = this.catalog.find((e) => e.id === id)!;
    this.failed.delete(id);
    this.building.set(id, { step: 'queued', since: Date.now() });
    bg.queue = bg.queue.then(async () => {
      if (this.closed) return;
      const t0 = Date.now();
      const progress = (m: string) => {
        this.building.set(id, { step: m, since: t0 });
        bg.progress(`${id}: ${m}`);
      };
      progress('building');
      try {
        const t = await catalogTemplate(this.cfg, entry, bg.base, progress);
        if (this.closed) return;
        this.addCatalog(t, bg.progress);
        bg.progress(`${id}: ready (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
      } catch (e) {
        this.failed.set(id, (e as Error).message);
        bg.progress(`${id}: build failed: ${(e as Error).message}`);
      } finally {
        this.building.delete(id);
      }
    });
  }

  /** Catalog templates still being built (the step they are at, seconds so far) and those whose build failed. */
  catalogStatus(): CatalogStatus {
    const now = Date.now();
    return {
      building: Object.fromEntries([...this.building].map(([id, b]) => [id, { step: b.step, secs: Math.round((now - b.since) / 1000) }])),
      failed: Object.fromEntries(this.failed),
    };
  }

  /** Resolves once every background build queued so far has ended (tests). */
  async backgroundSettled(): Promise<void> {
    await this.background?.queue;
  }

  /**
   * Registers (baking if needed) a tenant's template: an image's layers plus an environment's
   * configuration. Replaces an earlier one of the same name; sandboxes already made from it keep
   * running on their own artifact.
   */
  async add(recipe: TemplateRecipe, opts: { progress?: (m: string) => void; log?: (c: string) => void; poolSize?: number } = {}): Promise<TemplateInfo> {
    const t = await bakeRecipe(this.cfg, recipe, opts.progress ?? (() => {}), opts.log);
    const key = envKey(recipe.tenant, recipe.id);
    const replaced = await this.removeKey(key);
    this.byKey.set(key, t);
    this.artifacts.set(t.artifact.key, t.artifact);
    if (replaced) this.release(replaced.artifact.key);
    // Prewarmed right after its bake: its first creates find VMMs waiting.
    this.newPool(key, t, opts.poolSize ?? this.cfg.environmentPoolSize);
    return this.infoOf(t);
  }

  /** Whether a template or environment offered now is on the artifact `key` (new sandboxes may still come from it). */
  offers(key: string): boolean {
    return [...this.byKey.values()].some((t) => t.artifact.key === key);
  }

  async remove(tenant: string, id: string): Promise<void> {
    const removed = await this.removeKey(envKey(tenant, id));
    if (removed) this.release(removed.artifact.key);
  }

  /** Takes a template and its pool out; the template removed, if there was one. */
  private async removeKey(key: string): Promise<ReadyTemplate | undefined> {
    const pool = this.pools.get(key);
    const t = this.byKey.get(key);
    this.pools.delete(key);
    this.sizers.delete(key);
    this.sized.delete(key);
    this.byKey.delete(key);
    if (pool) {
      // Spawns still in flight land after this: close() waits for them too.
      const closing = pool.close();
      this.closing.add(closing);
      await closing.finally(() => this.closing.delete(closing));
    }
    return t;
  }

  /**
   * Lets an artifact no template here uses any more be collected (artifactGc.ts): it leaves the
   * files this server keeps and this process's claim on it goes. A sandbox still running on it maps
   * its RAM file, which keeps it; one restored later finds its manifest again (artifactFor).
   */
  private release(artifactKey: string): void {
    if ([...this.byKey.values()].some((t) => t.artifact.key === artifactKey)) return;
    this.artifacts.delete(artifactKey);
    releaseArtifact(join(homePaths(this.cfg.cacheDir).artifacts, artifactKey.slice(0, 24)));
  }

  /** A self-sizing pool for `t` under `key`, starting at `initial` (within the bounds). */
  private newPool(key: string, t: ReadyTemplate, initial: number, onError?: (e: unknown) => void): void {
    this.addPool(key, () => this.spawnFor(t), { initial, min: this.cfg.poolMin }, onError);
  }

  /**
   * A self-sizing pool of VMMs `spawn` makes (prewarmed, paused), under `key`, sharing the host's
   * budget for warm VMMs with the templates' pools: a snapshot's (snapshotPools.ts) as a template's.
   */
  addPool(key: string, spawn: () => Promise<PendingVm>, bounds: { initial: number; min: number }, onError?: (e: unknown) => void): void {
    const sizer = new PoolSizer({
      ...bounds, max: this.cfg.poolMax, idleMs: this.cfg.poolIdleSecs * 1000, burstWindowMs: this.cfg.poolBurstSecs * 1000,
    });
    this.sizers.set(key, sizer);
    const timed = async (): Promise<PendingVm> => {
      const t0 = Date.now();
      const vm = await spawn();
      sizer.onRefill(Date.now() - t0);
      return vm;
    };
    this.pools.set(key, new WarmPool<PendingVm>(key, 0, timed, destroyPending, onError));
    this.resize();
    this.resizer ??= setInterval(() => this.resize(), 5000);
    this.resizer.unref();
  }

  hasPool(key: string): boolean {
    return this.pools.has(key);
  }

  /**
   * Up to `n` VMMs waiting in pool `key` (never spawned on demand), counted as `n` asked of it: the
   * pool sizes itself by that demand, the part it could not serve included. `served` once the
   * caller has made its sandboxes, however.
   */
  takeReady(key: string, n: number): { vms: PendingVm[]; served: () => void } {
    const pool = this.pools.get(key);
    const sizer = this.sizers.get(key);
    const vms: PendingVm[] = [];
    for (let i = 0; i < n && pool; i++) {
      const vm = pool.takeReady();
      if (!vm) break;
      vms.push(vm);
    }
    const count = this.takes.get(key) ?? { hit: 0, miss: 0 };
    count.hit += vms.length;
    count.miss += n - vms.length;
    this.takes.set(key, count);
    const now = Date.now();
    for (let i = 0; i < n; i++) sizer?.onTake(now);
    this.resize();
    let done = false;
    return {
      vms,
      served: () => {
        if (done) return;
        done = true;
        for (let i = 0; i < n; i++) sizer?.onServed(Date.now());
      },
    };
  }

  /** Takes pool `key` out and destroys its VMMs. */
  async removePool(key: string): Promise<void> {
    await this.removeKey(key);
  }

  /**
   * A VMM for a new sandbox of `t`: from its pool when one is waiting, else made now (the slow
   * path). The demand is what the pool sizes itself by.
   */
  take(t: ReadyTemplate): Promise<PendingVm> {
    const key = this.keyOf(t);
    const pool = this.pools.get(key)!;
    const count = this.takes.get(key) ?? { hit: 0, miss: 0 };
    if (pool.size > 0) count.hit++; else count.miss++;
    this.takes.set(key, count);
    const sizer = this.sizers.get(key);
    sizer?.onTake(Date.now());
    const p = pool.take();
    // Until it is served the template is in use, however long a slow-path restore takes.
    const served = () => sizer?.onServed(Date.now());
    p.then(served, served);
    this.resize();
    return p;
  }

  /**
   * Sets every pool to what its sizer wants now, fitted into the host's budget for warm VMMs
   * (COLLIMATE_POOL_MEMORY_MIB, at ~64 MiB a VMM: its QEMU, prewarmed and paused).
   */
  resize(now = Date.now()): void {
    const keys = [...this.sizers.keys()];
    const wanted = keys.map((k) => this.sizers.get(k)!.size(now));
    const budget = Math.floor(this.cfg.poolMemoryMib / SANDBOX_FOOTPRINT_MIB);
    const fitted = fitBudget(wanted.map((w) => w.target), budget);
    keys.forEach((k, i) => {
      const reason = fitted[i] < wanted[i].target ? `${wanted[i].reason}; ${fitted[i]} within the host budget (COLLIMATE_POOL_MEMORY_MIB=${this.cfg.poolMemoryMib})` : wanted[i].reason;
      this.sized.set(k, { target: fitted[i], reason });
      const pool = this.pools.get(k);
      if (pool && pool.targetSize !== fitted[i]) pool.setTarget(fitted[i]);
    });
  }

  /** Every pool: VMMs ready, the size it holds and why, creates served from it and not (metrics, /healthz). */
  poolStatus(): Record<string, { ready: number; target: number; reason: string; hits: number; misses: number }> {
    return Object.fromEntries([...this.pools].map(([k, p]) => {
      const s = this.sized.get(k) ?? { target: p.targetSize, reason: '' };
      const c = this.takes.get(k) ?? { hit: 0, miss: 0 };
      return [k, { ready: p.size, target: s.target, reason: s.reason, hits: c.hit, misses: c.miss }];
    }));
  }

  private keyOf(t: ReadyTemplate): string {
    return t.kind === 'catalog' ? t.id : envKey(t.tenant!, t.id);
  }

  /** The catalog plus, with a scope, that tenant's environments. */
  list(scope?: Scope): TemplateInfo[] {
    const ready = [...this.byKey.values()]
      .filter((t) => t.kind === 'catalog' || (scope && t.tenant === scope.tenant))
      .map((t) => this.infoOf(t));
    // Catalog templates still being built (or failed) are listed too, not ready.
    const pending = this.catalog.filter((e) => !this.byKey.has(e.id) && (this.building.has(e.id) || this.failed.has(e.id))).map((e): TemplateInfo => ({
      id: e.id, kind: 'catalog', description: e.description, interpreter: e.interpreter, runtimes: e.runtimes ?? {}, ready: false,
      vcpus: e.vcpus, memory_mib: this.cfg.catalogMemoryMib ?? e.memoryMib, egress: this.cfg.catalogEgress, network: !!this.net,
    }));
    return [...ready, ...pending];
  }

  /** A tenant's environment of that name, else the catalog template. */
  resolve(id: string, tenant: string | undefined): ReadyTemplate {
    const t = (tenant !== undefined ? this.byKey.get(envKey(tenant, id)) : undefined) ?? this.byKey.get(id);
    if (!t) this.assertNotBuilding(id);
    if (!t || (t.kind === 'environment' && t.tenant !== tenant)) {
      throw new CollimateError('template_not_found', msg`No template ${JSON.stringify(id)}. List them${see('listTemplates')}.`);
    }
    return t;
  }

  /** A catalog template still being built, or whose build failed (then started again), is template_not_ready. */
  private assertNotBuilding(id: string): void {
    const b = this.building.get(id);
    if (b) {
      const secs = Math.round((Date.now() - b.since) / 1000);
      throw new CollimateError('template_not_ready', msg`The catalog template ${id} is still being built (this server's first start with this cache; ${b.step === 'queued' ? 'queued behind another template' : `${secs} s so far, now: ${b.step}`}). Retry in a minute; the server's health lists what is still being built${see('health')}.`, { retryAfterSecs: 30 });
    }
    const f = this.failed.get(id);
    if (f !== undefined && this.background && !this.closed) {
      this.buildInBackground(id);
      throw new CollimateError('template_not_ready', msg`The catalog template ${id} failed to build (${f}); it is being built again now. Retry in a minute; the server's health shows its progress${see('health')}.`, { retryAfterSecs: 30 });
    }
  }

  infoOf(t: ReadyTemplate): TemplateInfo {
    return {
      id: t.id, kind: t.kind, description: t.description, interpreter: t.interpreter, runtimes: t.runtimes ?? {}, ready: true,
      vcpus: t.artifact.shape.vcpus, memory_mib: t.artifact.shape.memoryMib,
      egress: t.egress, network: this.hasNetwork(t),
    };
  }

  /** Whether sandboxes of `t` get a NIC: networking is on and the template was baked with one. */
  hasNetwork(t: ReadyTemplate): boolean {
    return !!this.net && !!t.artifact.shape.nic;
  }

  /** The warm pool of a template `resolve` returned. */
  poolOf(t: ReadyTemplate): WarmPool<PendingVm> | undefined {
    return this.pool(this.keyOf(t));
  }

  /** A template by key: a catalog id, or `<tenant>/<id>` of an environment (tests, benches). */
  get(key: string): ReadyTemplate | undefined {
    return this.byKey.get(key);
  }

  /** A template's warm pool by key, as `get` (tests, benches). */
  pool(key: string): WarmPool<PendingVm> | undefined {
    return this.pools.get(key);
  }

  /** Pool sizes by template, for metrics. */
  poolSizes(): Record<string, number> {
    return Object.fromEntries([...this.pools].map(([k, p]) => [k, p.size]));
  }

  /** The RAM files of the artifacts loaded (templates now, and earlier builds sandboxes sit on). */
  ramFiles(): string[] {
    return [...this.artifacts.values()].map((a) => a.memPath);
  }

  /** The artifact of that key: of a template now, or of an earlier build whose manifest is still on disk. */
  artifactFor(key: string): Artifact {
    const a = this.artifacts.get(key);
    if (a) return a;
    // An artifact from an earlier build: its manifest is still on disk (its RAM file may not be).
    const root = join(homePaths(this.cfg.cacheDir).artifacts, key.slice(0, 24));
    if (existsSync(root)) claimArtifact(root);
    const art = this.manifestOf(key);
    if (!art) throw new Error(`artifact ${key.slice(0, 12)} is gone`);
    this.artifacts.set(key, art);
    return art;
  }

  /** The layer files of the templates' artifacts and of those of `keys` (without claiming them). */
  layerFiles(keys: Iterable<string>): string[] {
    const out = new Set<string>();
    for (const t of this.byKey.values()) t.artifact.shape.layers.forEach((l) => out.add(l));
    for (const k of keys) (this.artifacts.get(k) ?? this.manifestOf(k))?.shape.layers.forEach((l) => out.add(l));
    return [...out];
  }

  /** The manifest of the newest build of the artifact `key` on disk, if any. */
  private manifestOf(key: string): Artifact | undefined {
    const root = join(homePaths(this.cfg.cacheDir).artifacts, key.slice(0, 24));
    for (const b of existsSync(root) ? readdirSync(root).sort().reverse() : []) {
      if (existsSync(join(root, b, ARTIFACT_FILES.manifest))) return readArtifactManifest(join(root, b), this.cfg.artifactRamDir);
    }
    return undefined;
  }

  /** Stops the pools; their VMMs are destroyed. */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.resizer);
    // A background build under way finishes (its files are written in place by rename), but registers nothing.
    await this.background?.queue;
    await Promise.all([...this.pools.values()].map((p) => p.close()));
    await Promise.all(this.closing);
  }

  /** A pool's next VMM: waiting for its restore under the template's egress policy (prewarmed if configured). */
  private spawnFor(t: ReadyTemplate): Promise<PendingVm> {
    // The template's policy is in place before the guest first runs; a create with another policy re-applies.
    return spawnPooled(this.cfg, this.net, t.artifact.shape,
      { memPath: t.artifact.memPath, backing: { path: t.artifact.diskPath, format: 'raw' }, artifactKey: t.artifact.key, trustedLayers: [t.artifact.diskPath] },
      t.egress, this.cfg.prewarmPool ? t.deviceState : null);
  }
}

export function envKey(tenant: string, id: string): string {
  return `${tenant}/${id}`;
}
