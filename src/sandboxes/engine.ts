import { setTimeout as sleep } from 'node:timers/promises';
import { mkdirSync, rmdirSync } from 'node:fs';
import { EventEmitter } from 'node:events';
import { CollimateError } from '../errors.js';
import { loadConfig, type EngineConfig } from '../config.js';
import { openDb, type Db } from '../store/db.js';
import { homePaths } from '../host/paths.js';
import type { TemplateRecipe } from '../images/templates.js';
import type { CatalogEntry } from '../images/catalog.js';
import { netFor, forgetNet, type NetManager } from '../net/netns.js';
import { SandboxRepo } from './repo.js';
import { SandboxRegistry, type Running } from './registry.js';
import { envKey, TemplatePools } from './templatePools.js';
import { dirs, getInfo, infoOf, networkReason, type EngineContext } from './context.js';
import { createSandbox } from './create.js';
import { execIn, readFileIn, writeFileIn, openPorts, portTarget } from './execFiles.js';
import { downloadFile, fsList, fsMkdir, fsRemove, fsRename, fsStat, fsWatch, uploadFile } from './files.js';
import { forkSandbox } from './fork.js';
import { suspendSandbox, resumeSandbox } from './suspendResume.js';
import { createSnapshot, deleteSnapshot, getSnapshot, listSnapshots, promoteSnapshot, restoreSnapshot, startFromSnapshot } from './snapshots.js';
import { abortMoveIn, commitMoveIn, commitMoveOut, dropMovedOut, importMoveIn, pendingMovesIn, prepareMoveOut, type MoveEngine } from './move.js';
import { dropSnapshotCopy, exportSnapshot, importSnapshot, snapshotBlobs, type SnapshotCopyEngine } from './snapshotCopies.js';
import { deleteSandbox } from './delete.js';
import { guestDiskUsage } from './diskUsage.js';
import { isAlive, processUsage, procStartTicks } from '../vmm/vmm.js';
import { Reaper } from './reaper.js';
import { setEgress, setSessionEnd } from './session.js';
import { reconcile } from './reconcile.js';
import { restoreCounts } from './runtime.js';
import { ForkSeeds } from './forkSeeds.js';
import { ForkReceivers } from './forkReceivers.js';
import { RamSparsifier } from './ramSparse.js';
import { Quiescer } from './quiesce.js';
import { ProcessRegistry } from './processes.js';
import {
  startProcess, listProcesses, getProcess, watchProcessOutput, writeProcessStdin, closeProcessStdin, signalProcess, resizeProcess, waitProcess,
} from './processOps.js';
import { collectArtifactRam } from '../images/artifactGc.js';
import { HostCapacity, claimBudgets, type CapacityStatus } from './hostCapacity.js';
import { digHoles } from '../vmm/memory.js';
import type { EgressPolicy } from '../net/policy.js';
import type {
  CatalogStatus, GuestDiskUsage, SandboxService, SandboxInfo, Scope, CreateOptions, ExecRequest, ExecResult, ExecStreamHandlers, ForkOptions, ListFilter, TemplateInfo,
  OpenPort, PortTarget, ProcessStartRequest, ProcessInfo, ProcessEvent, DirListing, DirWatch, FileEntry, FileSink, MkdirOptions, UploadOptions, WatchHandlers,
  SnapshotInfo, SnapshotListFilter, SnapshotOptions, StartFromSnapshotOptions, SuspendOptions,
} from './types.js';

export interface EngineOptions extends Partial<EngineConfig> {
  home?: string;
  /** Progress lines during first-time set-up (template builds). */
  progress?: (msg: string) => void;
  /** Catalog templates to warm (default: all of them). */
  catalog?: string[];
  /**
   * Open once the guest assets and the first catalog template are ready, and build the other
   * catalog templates in the background (`serve`: a first start serves sooner). Default: open once
   * every catalog template is ready.
   */
  catalogInBackground?: boolean;
  /** Test hook: catalog entries in place of the built-in CATALOG. */
  catalogEntries?: CatalogEntry[];
  /** Skip warming catalog templates (for tools that only read the database, e.g. `keys`). */
  noTemplates?: boolean;
  /** Test hook: called at named points inside multi-step operations (crash injection). */
  faultPoint?: (name: string) => void | Promise<void>;
}

/** How often the RAM files sandboxes map are checked for zero pages to dig out again. */
const RAM_SWEEP_MS = 30_000;
/** How often template RAM files nobody uses are looked for (artifactGc.ts). */
const ARTIFACT_GC_MS = 600_000;
/** How long a bake waits for the host to have room for it before it fails. */
const BAKE_ADMISSION_WAIT_MS = 600_000;
/** How long a sandbox whose agent link closed is watched for its QEMU's exit before the link is taken for a glitch. */
const LINK_CHECK_MS = 2000;

/**
 * The engine: owns microVMs. Creates sandboxes by restoring a warm template checkpoint, live-forks
 * them, suspends and resumes them, runs their execs, and persists every transition before it is
 * acknowledged so that a restarted server reconciles to what clients were told.
 *
 * This class only composes: each lifecycle step is a file of its own (create.ts, execFiles.ts,
 * fork.ts, suspendResume.ts, delete.ts, reaper.ts, reconcile.ts) working on one EngineContext —
 * the rows (repo.ts), the sandboxes running in this process (registry.ts) and the templates with
 * their warm pools (templatePools.ts).
 *
 * Events: 'transition' (SandboxTransition) once a change of state is persisted; 'reaped'
 * ({ id, tenant, action }) when the reaper ended a session.
 */
export class Engine extends EventEmitter implements SandboxService {
  readonly repo: SandboxRepo;
  private readonly registry: SandboxRegistry;
  private readonly processes = new ProcessRegistry();
  /** The templates and their warm pools (metrics, tests and benches look inside). */
  readonly templatePools: TemplatePools;
  private readonly ctx: EngineContext;
  private readonly reaper: Reaper;
  private readonly quiescer: Quiescer;
  private reapTimer?: NodeJS.Timeout;
  private flusher?: NodeJS.Timeout;
  private readonly sparsifier: RamSparsifier;
  private sparseTimer?: NodeJS.Timeout;
  private gcTimer?: NodeJS.Timeout;
  private ready = false;
  private closing = false;

  private constructor(readonly cfg: EngineConfig, readonly db: Db, opts: EngineOptions, private readonly net: NetManager | null) {
    super();
    this.repo = new SandboxRepo(db);
    this.registry = new SandboxRegistry(this.repo, (r) => this.quiescer.wake(r), (r) => {
      this.watchVmm(r);
      // Every agent connection made (create, fork child, resume, a restarted server adopting a
      // VMM) learns the guest's background processes again.
      void this.processes.of(r.id).attach(r.live.agent);
    });
    this.templatePools = new TemplatePools(cfg, net);
    this.ctx = {
      cfg, repo: this.repo, registry: this.registry, processes: this.processes, templates: this.templatePools, net, seeds: new ForkSeeds(cfg.ramDir),
      receivers: new ForkReceivers(cfg, (key) => this.templatePools.artifactFor(key), { onError: opts.progress, net }),
      forking: new Set(),
      removals: new Set(),
      unlinking: new Set(),
      capacity: new HostCapacity(cfg.host, () => this.repo.runningMemoryMib(), { tmpfs: cfg.ramDir, disk: cfg.home }, () => claimBudgets(cfg, net)),
      emit: (event: string, payload: unknown) => { this.emit(event, payload); },
      fault: async (name) => { await opts.faultPoint?.(name); },
      assertOpen: () => this.assertOpen(),
      isClosing: () => this.closing,
      progress: opts.progress,
    };
    this.reaper = new Reaper(this.ctx);
    this.quiescer = new Quiescer(this.ctx);
    // Templates' and fork points' RAM files, but not one a fork under way is still writing.
    this.sparsifier = new RamSparsifier(() => [
      ...this.templatePools.ramFiles(),
      ...this.repo.allForkPoints().filter((fp) => !this.ctx.forking.has(fp.id)).map((fp) => fp.mem_path),
    ], (f) => digHoles(f, cfg.cacheDir));
  }

  get accel(): 'kvm' | 'tcg' {
    return this.cfg.accel.accel;
  }

  static async open(opts: EngineOptions = {}): Promise<Engine> {
    const cfg = loadConfig(opts);
    const paths = homePaths(cfg.home);
    const { sandboxes, disks, forkpoints } = dirs(cfg);
    for (const d of [paths.home, sandboxes, disks, paths.tmp, forkpoints, cfg.ramDir]) mkdirSync(d, { recursive: true });
    const db = openDb(paths.db);
    // Rows from before sessions chose their end (migration 5) end as the server is set to.
    db.prepare('UPDATE sandboxes SET on_timeout = ? WHERE on_timeout IS NULL').run(cfg.reapAction);
    const net = opts.noTemplates ? null : await netFor(cfg);
    const engine = new Engine(cfg, db, opts, net);
    if (!opts.noTemplates) {
      // Reconcile before the pools spawn anything: every VMM dir found now belongs to the past.
      await reconcile(engine.ctx);
      net?.refill();
      await engine.templatePools.warmCatalog(opts.progress ?? (() => {}), opts.catalog, { background: opts.catalogInBackground, entries: opts.catalogEntries });
      engine.reapTimer = setInterval(() => { void engine.reap(); void engine.quiesce(); }, cfg.reapIntervalMs);
      engine.reapTimer.unref();
      engine.flusher = setInterval(() => engine.registry.flushActivity(), 1000);
      engine.flusher.unref();
      engine.sparseTimer = setInterval(() => {
        engine.sparsifyRam().catch((e) => opts.progress?.(`RAM files: ${(e as Error).message}`));
      }, RAM_SWEEP_MS);
      engine.sparseTimer.unref();
      engine.gcTimer = setInterval(() => {
        try {
          for (const f of engine.collectArtifacts()) opts.progress?.(`removed unused template RAM file ${f}`);
        } catch (e) {
          opts.progress?.(`template RAM files: ${(e as Error).message}`);
        }
        const pruned = engine.repo.pruneDeleted(Date.now() - cfg.deletedRetentionSecs * 1000);
        if (pruned) opts.progress?.(`pruned ${pruned} rows of sandboxes deleted more than ${cfg.deletedRetentionSecs} s ago`);
      }, ARTIFACT_GC_MS);
      engine.gcTimer.unref();
    }
    engine.ready = true;
    return engine;
  }

  /** Moves of suspended sandboxes between cluster hosts (move.ts); cluster mode calls them. */
  readonly moves: MoveEngine = {
    prepareOut: (id) => prepareMoveOut(this.ctx, id),
    commitOut: (id, suspendedAt, to, flip) => commitMoveOut(this.ctx, id, suspendedAt, to, flip),
    dropOut: (id, to) => {
      const row = this.repo.get(id);
      if (!row || row.state !== 'suspended' || row.pending_op) return false;
      dropMovedOut(this.ctx, row, to);
      return true;
    },
    importIn: (m, pull) => importMoveIn(this.ctx, m, pull),
    commitIn: (id) => commitMoveIn(this.ctx, id),
    abortIn: (id) => abortMoveIn(this.ctx, id),
    pendingIn: () => pendingMovesIn(this.ctx),
  };

  /** Snapshots across cluster hosts (snapshotCopies.ts): exports of this host's, copies of others'. */
  readonly snapshotCopies: SnapshotCopyEngine = {
    exportOut: (id, scope) => exportSnapshot(this.ctx, id, scope),
    importIn: (m, origin, pull) => importSnapshot(this.ctx, m, origin, pull),
    holds: (id) => this.repo.snapshot(id)?.state === 'ready',
    drop: (id) => dropSnapshotCopy(this.ctx, id),
    copies: () => this.repo.snapshotCopies().map((s) => ({ id: s.id, tenant: s.tenant, origin: s.origin! })),
    blobs: () => snapshotBlobs(this.ctx),
  };

  isReady(): boolean {
    return this.ready && !this.closing;
  }

  /**
   * Makes the zero pages that running sandboxes faulted into the templates' and fork points' RAM
   * files holes again (ramSparse.ts): those that grew enough since, or `all`. Runs every 30 s.
   */
  sparsifyRam(opts: { all?: boolean } = {}): Promise<number> {
    return this.sparsifier.sweep(opts);
  }

  /** The host's budgets for admission and what is used of them (/healthz, /metrics). */
  capacity(): CapacityStatus {
    return this.ctx.capacity.status();
  }

  /**
   * Removes template RAM files no process claims or maps and nobody claimed for
   * COLLIMATE_ARTIFACT_GRACE_SECS (artifactGc.ts); the paths removed. Runs every 10 minutes.
   */
  collectArtifacts(graceSecs = this.cfg.artifactGraceSecs): string[] {
    return collectArtifactRam(this.cfg.cacheDir, this.cfg.artifactRamDir, new Set(this.templatePools.ramFiles()), graceSecs * 1000);
  }

  /**
   * The layer files of the artifacts this home's templates and sandboxes (running, suspended or
   * being deleted; a fork point always has one of these) and snapshots sit on, for the image
   * service's layer record.
   */
  artifactLayers(): string[] {
    return this.templatePools.layerFiles([...this.repo.artifactKeys(), ...this.repo.snapshotArtifactKeys()]);
  }

  /** Pool sizes by template, for metrics. */
  poolSizes(): Record<string, number> {
    return this.templatePools.poolSizes();
  }

  /**
   * Resolves once the background work forks leave behind is done: spare copies made and fork
   * receivers spawned up to their pools' sizes (benches measure a fork with nothing else running).
   */
  async settled(timeoutMs = 120_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    await this.ctx.seeds.idle();
    await Promise.all(this.ctx.removals);
    await this.ctx.receivers.settled(deadline);
  }

  /** Warm pools by template: ready, the size held and why, creates served from the pool or not. */
  poolStatus(): Record<string, { ready: number; target: number; reason: string; hits: number; misses: number }> {
    return this.templatePools.poolStatus();
  }

  /**
   * Warm pools as the unauthenticated /healthz shows them: catalog templates by id, tenants'
   * environments (whose keys name tenants) summed under `environments`.
   */
  poolHealth(): Record<string, { ready: number; target: number; reason: string }> {
    const out: Record<string, { ready: number; target: number; reason: string }> = {};
    let envs: { ready: number; target: number; reason: string } | undefined;
    for (const [key, s] of Object.entries(this.poolStatus())) {
      if (!key.includes('/')) { out[key] = { ready: s.ready, target: s.target, reason: s.reason }; continue; }
      envs ??= { ready: 0, target: 0, reason: 'sum over tenants\' environments' };
      envs.ready += s.ready;
      envs.target += s.target;
    }
    if (envs) out.environments = envs;
    return out;
  }

  /** Catalog templates still being built in the background, and those whose build failed (/healthz). */
  catalogStatus(): CatalogStatus {
    return this.templatePools.catalogStatus();
  }

  /** VMMs spawned ahead of forks, ready and wanted, by artifact (forkReceivers.ts). */
  forkReceiverSizes(): Record<string, { ready: number; target: number }> {
    return this.ctx.receivers.sizes();
  }

  /** Guest restores in this process, by whether the guest acknowledged (for metrics). */
  restoreCounts(): { acknowledged: number; unacknowledged: number } {
    return { ...restoreCounts };
  }

  // ---- templates -------------------------------------------------------------------------------

  /** The catalog plus, with a scope, that tenant's environments. */
  templates(scope?: Scope): TemplateInfo[] {
    return this.templatePools.list(scope);
  }

  template(id: string, scope?: Scope): TemplateInfo {
    return this.templatePools.infoOf(this.templatePools.resolve(id, scope?.tenant));
  }

  /**
   * Registers (baking if needed) a tenant's template: an image's layers plus an environment's
   * configuration. Replaces an earlier one of the same name; sandboxes already made from it keep
   * running on their own artifact.
   */
  /**
   * Bakes (or finds) a tenant's template. Admitted like a sandbox of its size (hostCapacity.ts): a
   * bake boots a VMM and writes a RAM file of the guest's memory on tmpfs, and a host without room
   * for them must not find out from the kernel's OOM killer. A bake is queued work, so it waits
   * for room (saying so in its progress) for up to `BAKE_ADMISSION_WAIT_MS`, then fails with the
   * reason.
   */
  async addTemplate(recipe: TemplateRecipe, opts: { progress?: (m: string) => void; log?: (c: string) => void; poolSize?: number } = {}): Promise<TemplateInfo> {
    this.assertOpen();
    return this.ctx.capacity.withinWaiting('bake', { vmms: 1, memoryMib: recipe.memoryMib, tmpfsMib: recipe.memoryMib }, () => this.templatePools.add(recipe, opts), {
      waitMs: BAKE_ADMISSION_WAIT_MS,
      onWait: (why) => opts.progress?.(`waiting for room on the host: ${why}`),
    });
  }

  /** The artifact (key, build directory) a tenant's environment template is registered on here, if it is. */
  environmentArtifact(tenant: string, id: string): { key: string; dir: string } | undefined {
    const a = this.templatePools.get(envKey(tenant, id))?.artifact;
    return a && { key: a.key, dir: a.dir };
  }

  async removeTemplate(tenant: string, id: string): Promise<void> {
    await this.templatePools.remove(tenant, id);
  }

  // ---- reads -----------------------------------------------------------------------------------

  /** As `scope` may see it, with the activity of the last second (not yet in the database). */
  get(id: string, scope?: Scope): SandboxInfo {
    return getInfo(this.ctx, id, scope);
  }

  list(filter: ListFilter, scope?: Scope): { sandboxes: SandboxInfo[]; next: string | null } {
    const limit = Math.min(Math.max(filter.limit ?? 100, 1), 1000);
    const rows = this.repo.list({ ...filter, limit }, scope?.tenant);
    const page = rows.slice(0, limit);
    return {
      sandboxes: page.map((r) => infoOf(this.ctx, r)),
      next: rows.length > limit ? page[page.length - 1].id : null,
    };
  }

  countRunning(tenant: string): number {
    return this.repo.countRunning(tenant);
  }

  /**
   * What each of these sandboxes' VMM process uses of the host now: CPU seconds so far and resident
   * memory. Sandboxes not running in this process are left out. The caller checks the tenant.
   */
  vmmUsage(ids: readonly string[]): Map<string, { cpuSecs: number; rssBytes: number }> {
    const out = new Map<string, { cpuSecs: number; rssBytes: number }>();
    for (const id of ids) {
      const r = this.registry.get(id);
      const usage = r && !r.deleting ? processUsage(r.live.record.pid) : undefined;
      if (usage) out.set(id, usage);
    }
    return out;
  }

  /**
   * How full these sandboxes' root file systems are (df /), asked of their agents beside their
   * queues; a sandbox paused for idling is not woken for it (diskUsage.ts). The caller checks the tenant.
   */
  guestDiskUsage(ids: readonly string[]): Promise<Map<string, GuestDiskUsage>> {
    return guestDiskUsage(this.ctx, ids);
  }

  // ---- lifecycle -------------------------------------------------------------------------------

  create(opts: CreateOptions, scope: Scope): Promise<SandboxInfo> {
    return createSandbox(this.ctx, opts, scope);
  }

  exec(id: string, req: ExecRequest, scope?: Scope, stream?: ExecStreamHandlers): Promise<ExecResult> {
    return execIn(this.ctx, id, req, scope, stream);
  }

  readFile(id: string, path: string, scope?: Scope): Promise<Buffer> {
    return readFileIn(this.ctx, id, path, scope);
  }

  writeFile(id: string, path: string, data: Buffer, scope?: Scope, mode?: number): Promise<void> {
    return writeFileIn(this.ctx, id, path, data, scope, mode);
  }

  // ---- background processes (processOps.ts) -----------------------------------------------------

  startProcess(id: string, req: ProcessStartRequest, scope?: Scope): Promise<ProcessInfo> {
    return startProcess(this.ctx, id, req, scope);
  }

  listProcesses(id: string, scope?: Scope): Promise<ProcessInfo[]> {
    return listProcesses(this.ctx, id, scope);
  }

  getProcess(id: string, pid: number, scope?: Scope): Promise<ProcessInfo> {
    return getProcess(this.ctx, id, pid, scope);
  }

  watchProcessOutput(id: string, pid: number, from: 'start' | 'now' | number, listener: (e: ProcessEvent) => void, scope?: Scope): Promise<() => void> {
    return watchProcessOutput(this.ctx, id, pid, from, listener, scope);
  }

  writeProcessStdin(id: string, pid: number, data: AsyncIterable<Buffer> | Buffer, scope?: Scope): Promise<number> {
    return writeProcessStdin(this.ctx, id, pid, data, scope);
  }

  closeProcessStdin(id: string, pid: number, scope?: Scope): Promise<void> {
    return closeProcessStdin(this.ctx, id, pid, scope);
  }

  signalProcess(id: string, pid: number, signal: string | number, scope?: Scope): Promise<void> {
    return signalProcess(this.ctx, id, pid, signal, scope);
  }

  resizeProcess(id: string, pid: number, cols: number, rows: number, scope?: Scope): Promise<void> {
    return resizeProcess(this.ctx, id, pid, cols, rows, scope);
  }

  waitProcess(id: string, pid: number, timeoutSecs: number, scope?: Scope): Promise<ProcessInfo> {
    return waitProcess(this.ctx, id, pid, timeoutSecs, scope);
  }

  // ---- files and directories (files.ts) ---------------------------------------------------------

  fsStat(id: string, path: string, scope?: Scope): Promise<FileEntry> {
    return fsStat(this.ctx, id, path, scope);
  }

  fsList(id: string, path: string, depth?: number, scope?: Scope): Promise<DirListing> {
    return fsList(this.ctx, id, path, depth, scope);
  }

  fsMkdir(id: string, path: string, opts?: MkdirOptions, scope?: Scope): Promise<{ created: boolean; entry: FileEntry }> {
    return fsMkdir(this.ctx, id, path, opts, scope);
  }

  fsRemove(id: string, path: string, scope?: Scope): Promise<{ removed: number }> {
    return fsRemove(this.ctx, id, path, scope);
  }

  fsRename(id: string, from: string, to: string, scope?: Scope): Promise<FileEntry> {
    return fsRename(this.ctx, id, from, to, scope);
  }

  fsWatch(id: string, path: string, recursive: boolean, handlers: WatchHandlers, scope?: Scope): Promise<DirWatch> {
    return fsWatch(this.ctx, id, path, recursive, handlers, scope);
  }

  downloadFile(id: string, path: string, sink: FileSink, scope?: Scope): Promise<{ size: number }> {
    return downloadFile(this.ctx, id, path, sink, scope, this.cfg.maxDownloadBytes);
  }

  uploadFile(id: string, path: string, source: AsyncIterable<Buffer | Uint8Array | string>, opts?: UploadOptions, scope?: Scope): Promise<FileEntry & { bytes: number }> {
    return uploadFile(this.ctx, id, path, source, opts, scope);
  }

  /** Live fork of a running sandbox, or fork of a suspended one from its snapshot. */
  fork(id: string, opts: ForkOptions, scope?: Scope): Promise<SandboxInfo[]> {
    return forkSandbox(this.ctx, id, opts, scope);
  }

  suspend(id: string, scope?: Scope, opts?: SuspendOptions): Promise<SandboxInfo> {
    return suspendSandbox(this.ctx, id, scope, opts);
  }

  /** Keeps this moment of a running or suspended sandbox (snapshots.ts); it runs on. */
  createSnapshot(id: string, opts: SnapshotOptions, scope?: Scope): Promise<SnapshotInfo> {
    return createSnapshot(this.ctx, id, opts, scope);
  }

  getSnapshot(id: string, scope?: Scope): SnapshotInfo {
    return getSnapshot(this.ctx, id, scope);
  }

  listSnapshots(filter: SnapshotListFilter, scope?: Scope): { snapshots: SnapshotInfo[]; next: string | null } {
    return listSnapshots(this.ctx, filter, scope);
  }

  deleteSnapshot(id: string, scope?: Scope): void {
    deleteSnapshot(this.ctx, id, scope);
  }

  /** Promotes a snapshot under a name its tenant creates sandboxes from (snapshots.ts); null takes it away. */
  promoteSnapshot(id: string, environment: string | null, scope?: Scope): SnapshotInfo {
    return promoteSnapshot(this.ctx, id, environment, scope);
  }

  /** Starts `opts.count` sandboxes from a snapshot, each a fresh identity with its memory, processes and files. */
  startFromSnapshot(id: string, opts: StartFromSnapshotOptions, scope: Scope): Promise<SandboxInfo[]> {
    return startFromSnapshot(this.ctx, id, opts, scope);
  }

  /** Rolls sandbox `id` back to its snapshot `snapshotId`, in place. */
  restore(id: string, snapshotId: string, scope?: Scope): Promise<SandboxInfo> {
    return restoreSnapshot(this.ctx, id, snapshotId, scope);
  }

  resume(id: string, scope?: Scope): Promise<SandboxInfo> {
    return resumeSandbox(this.ctx, id, scope);
  }

  /** Deletes from any state, at once: queued operations on the sandbox fail with not found. */
  delete(id: string, scope?: Scope): Promise<void> {
    return deleteSandbox(this.ctx, id, scope);
  }

  /** Deletes every sandbox and snapshot this engine holds (tests, `collimate` shutdown with --delete). */
  async deleteAll(): Promise<void> {
    for (const row of this.repo.live()) await this.delete(row.id).catch(() => {});
    for (const s of this.repo.snapshots(undefined, { limit: 1000 })) deleteSnapshot(this.ctx, s.id);
  }

  /** Moves the end of a running sandbox's session (a lease); the reaper acts then (session.ts). */
  setSessionEnd(id: string, endsAtMs: number, scope?: Scope): SandboxInfo {
    return setSessionEnd(this.ctx, id, endsAtMs, scope);
  }

  setEgress(id: string, egress: EgressPolicy, scope?: Scope): Promise<SandboxInfo> {
    return setEgress(this.ctx, id, egress, scope);
  }

  /** Suspends or deletes (COLLIMATE_REAP_ACTION) the running sandboxes whose session timed out. */
  reap(now = Date.now()): Promise<string[]> {
    return this.reaper.reap(now);
  }

  /** One pass of the idle pause (quiesce.ts, COLLIMATE_IDLE_PAUSE_SECS): how many sandboxes it paused. */
  quiesce(now = Date.now()): Promise<number> {
    return this.quiescer.pass(now);
  }

  /** Idle pauses: sandboxes paused now, and pauses and wake-ups since start (/metrics). */
  idlePauses(): { pausedNow: number; paused: number; woken: number } {
    return { pausedNow: this.quiescer.pausedNow(), ...this.quiescer.counts };
  }

  /** Whether the host has `id` paused for being quiescent (tests, benches). */
  isIdlePaused(id: string): boolean {
    return !!this.registry.get(id)?.paused;
  }

  // ---- network and ports -----------------------------------------------------------------------

  /** Networking as /healthz shows it. */
  networkStatus(): { enabled: boolean; reason?: string } {
    return this.net ? { enabled: true } : { enabled: false, reason: this.networkReason() };
  }

  /** Blocked ranges the operator lets tenants' egress allowlists name (COLLIMATE_EGRESS_OPEN_CIDRS). */
  egressOpened(): readonly string[] {
    return this.cfg.net.openCidrs;
  }

  /** Why this server runs without networking (for network_unavailable messages). */
  networkReason(): string {
    return networkReason(this.cfg);
  }

  /**
   * The listening TCP ports of a running sandbox, read from the guest's /proc/net/tcp{,6} when no
   * operation is queued on it (an exec may run for an hour: then the last reading).
   */
  openPorts(id: string, scope?: Scope): Promise<OpenPort[]> {
    return openPorts(this.ctx, id, scope);
  }

  portTarget(id: string, port: number, scope?: Scope): PortTarget {
    return portTarget(this.ctx, id, port, scope);
  }

  // ---- shutdown --------------------------------------------------------------------------------

  /** Stops background work and closes connections. Running VMMs are left for re-adoption. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    clearInterval(this.reapTimer);
    clearInterval(this.flusher);
    clearInterval(this.sparseTimer);
    clearInterval(this.gcTimer);
    await this.sparsifier.idle();
    await this.templatePools.close();
    await this.ctx.receivers.close();
    await this.ctx.seeds.close();
    await Promise.all(this.ctx.removals);
    await Promise.all(this.registry.all().map((r) => r.queue.drain().catch(() => {})));
    this.registry.flushActivity();
    for (const r of this.registry.all()) { r.live.agent.close(); r.live.vmm.qmp.close(); }
    this.registry.clear();
    // Running VMMs keep their namespaces (and rules) for the next server; the pool and resolvers go.
    await this.net?.close();
    forgetNet(this.cfg);
    this.db.close();
    // The RAM directory goes too once nothing in it is left (running VMMs keep theirs).
    try { rmdirSync(this.cfg.ramDir); } catch { /* not empty, or already gone */ }
  }

  /**
   * A running sandbox whose VM dies (its QEMU killed, the host's OOM killer) is deleted at once: its
   * agent link closes with the process, requests under way fail with vmm_failed saying so, later
   * ones with sandbox_not_found and the reason, and nothing of it is left on the host. A link closed
   * on purpose (suspend, delete, the server closing) is not a death.
   */
  private watchVmm(r: Running): void {
    r.live.agent.once('close', () => {
      if (this.closing || this.registry.get(r.id) !== r || r.deleting) return;
      const rec = r.live.record;
      const running = () => isAlive(rec.pid) && procStartTicks(rec.pid) === rec.startTicks;
      const lost = () => {
        if (this.closing || this.registry.get(r.id) !== r || r.deleting) return;
        r.lost = `its VM exited unexpectedly at ${new Date().toISOString()} (QEMU process ${rec.pid} is gone: killed, or out of memory)`;
        this.ctx.progress?.(`sandbox ${r.id}: ${r.lost}; deleting it`);
        void deleteSandbox(this.ctx, r.id, undefined, r.lost).catch((e) => this.ctx.progress?.(`sandbox ${r.id}: deleting it failed: ${(e as Error).message}`));
      };
      if (!running()) return lost();
      // The process may be exiting still: its descriptors (the agent's link) go before it is gone,
      // and on a busy host the gap is long enough to be seen. Judged once it is gone or has stayed.
      r.linkCheck = (async () => {
        for (const until = Date.now() + LINK_CHECK_MS; Date.now() < until;) {
          await sleep(10);
          if (!running()) return lost();
        }
      })();
    });
  }

  private assertOpen(): void {
    if (this.closing) throw new CollimateError('shutting_down', 'The server is shutting down; retry against the restarted server.', { retryAfterSecs: 5 });
  }
}
