import { mkdirSync, rmdirSync, readdirSync, readFileSync, existsSync, rmSync, statSync, openSync, fsyncSync, closeSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { EventEmitter } from 'node:events';
import { CollimateError, invalidState, sandboxNotFound } from '../errors.js';
import { loadConfig, type EngineConfig } from '../config.js';
import { openDb, type Db } from '../store/db.js';
import { homePaths } from '../host/paths.js';
import { ensureArtifact, stopOrphanedBakes, type Artifact } from '../images/bake.js';
import { loadCatalog, bakeRecipe, type ReadyTemplate, type TemplateRecipe } from '../images/templates.js';
import { Vmm, isAlive, procStartTicks } from '../vmm/vmm.js';
import { vmmFiles, type MachineShape } from '../vmm/machine.js';
import { AgentError } from '../guest/agentClient.js';
import { ExecQueue } from './execQueue.js';
import { WarmPool } from './warmPool.js';
import { SandboxRepo, toInfo, type SandboxRow, type VmmRecord } from './repo.js';
import { buildAgentExec, toExecResult, killedBySigkill, oomKilledDuring, execSeed, OOM_PROBE } from './exec.js';
import {
  newSandboxId, newForkPointId, newDiskPath, spawnIncoming, prewarm, claimWarm, restoreCheckpoint, restoreStream, finishRestore, adoptVm, createOverlay,
  snapshotUpperDisk, releaseRecorded, sweepConfinement, RestoreUnacknowledgedError,
  type LiveVm, type PendingVm,
} from './runtime.js';
import type {
  SandboxService, SandboxInfo, Scope, CreateOptions, ExecRequest, ExecResult, ExecStreamHandlers, ForkOptions, ListFilter, TemplateInfo,
  EgressInput, EgressPolicy, OpenPort, PortTarget,
} from './types.js';
import { parseEgress, policyKey, widening } from '../net/policy.js';
import { netAvailability, netFor, forgetNet, type NetManager } from '../net/netns.js';
import { listeningPorts } from '../net/ports.js';

/** A sandbox that is running in this process: its VMM, agent link and operation queue. */
interface Running {
  id: string;
  live: LiveVm;
  queue: ExecQueue;
  /** Set by delete so queued operations fail fast instead of talking to a dying VMM. */
  deleting: boolean;
}

export interface EngineOptions extends Partial<EngineConfig> {
  home?: string;
  /** Progress lines during first-time set-up (template builds). */
  progress?: (msg: string) => void;
  /** Catalog templates to warm (default: all of them). */
  catalog?: string[];
  /** Skip warming catalog templates (for tools that only read the database, e.g. `keys`). */
  noTemplates?: boolean;
  /** Test hook: called at named points inside multi-step operations (crash injection). */
  faultPoint?: (name: string) => void | Promise<void>;
}

/**
 * The engine: owns microVMs. Creates sandboxes by restoring a warm template checkpoint, live-forks
 * them, suspends and resumes them, runs their execs, and persists every transition before it is
 * acknowledged so that a restarted server reconciles to what clients were told.
 */
export class Engine extends EventEmitter implements SandboxService {
  readonly repo: SandboxRepo;
  private readonly templatesById = new Map<string, ReadyTemplate>();
  private readonly pools = new Map<string, WarmPool<PendingVm>>();
  private readonly running = new Map<string, Running>();
  /** Artifacts by key, for restoring sandboxes whose template was made by an earlier build. */
  private readonly artifacts = new Map<string, Artifact>();
  private reaper?: NodeJS.Timeout;
  private flusher?: NodeJS.Timeout;
  private dirtyActivity = new Set<string>();
  private ready = false;
  private closing = false;
  /** Networking (src/net): null when the server runs without (COLLIMATE_NET=off, not root). */
  private net: NetManager | null = null;
  /** The last reading of each running sandbox's listening ports. */
  private readonly portCache = new Map<string, OpenPort[]>();

  private constructor(readonly cfg: EngineConfig, readonly db: Db, private readonly opts: EngineOptions) {
    super();
    this.repo = new SandboxRepo(db);
  }

  get accel(): 'kvm' | 'tcg' {
    return this.cfg.accel.accel;
  }

  static async open(opts: EngineOptions = {}): Promise<Engine> {
    const cfg = loadConfig(opts);
    const paths = homePaths(cfg.home);
    for (const d of [paths.home, paths.sandboxes, paths.disks, paths.tmp, join(cfg.home, 'forkpoints'), cfg.ramDir]) mkdirSync(d, { recursive: true });
    const db = openDb(paths.db);
    const engine = new Engine(cfg, db, opts);
    if (!opts.noTemplates) {
      engine.net = await netFor(cfg);
      // Reconcile before the pools spawn anything: every VMM dir found now belongs to the past.
      await engine.reconcile();
      engine.net?.refill();
      await engine.warmTemplates();
      engine.reaper = setInterval(() => void engine.reap(), cfg.reapIntervalMs);
      engine.reaper.unref();
      engine.flusher = setInterval(() => engine.flushActivity(), 1000);
      engine.flusher.unref();
    }
    engine.ready = true;
    return engine;
  }

  isReady(): boolean {
    return this.ready && !this.closing;
  }

  /** Pool sizes by template, for metrics. */
  poolSizes(): Record<string, number> {
    return Object.fromEntries([...this.pools].map(([k, p]) => [k, p.size]));
  }

  private async warmTemplates(): Promise<void> {
    const progress = this.opts.progress ?? (() => {});
    const templates = await loadCatalog(this.cfg, progress, this.opts.catalog);
    for (const t of templates) {
      this.templatesById.set(t.id, t);
      this.artifacts.set(t.artifact.key, t.artifact);
      const pool = new WarmPool<PendingVm>(
        t.id,
        this.cfg.poolSize,
        () => this.spawnForTemplate(t),
        (p) => this.destroyPending(p),
        (e) => progress(`warm pool ${t.id}: spawn failed: ${(e as Error).message}`),
      );
      this.pools.set(t.id, pool);
      pool.refill();
    }
    for (const [, pool] of this.pools) await pool.waitFull(60_000);
  }

  private async spawnForTemplate(t: ReadyTemplate): Promise<PendingVm> {
    const id = newSandboxId();
    const pending = await spawnIncoming(this.cfg, t.artifact.shape, {
      id, dir: join(homePaths(this.cfg.home).sandboxes, id), memPath: t.artifact.memPath, memShared: false,
      backing: { path: t.artifact.diskPath, format: 'raw' }, diskPath: newDiskPath(this.disksDir, id), artifactKey: t.artifact.key,
      trustedLayers: [t.artifact.diskPath], network: true,
    });
    try {
      // The template's policy is in place before the guest first runs; a create that narrows it re-applies.
      if (pending.record.net) await this.net!.apply(pending.record.net, t.egress);
      if (!this.cfg.prewarmPool) return pending;
      return await prewarm(pending, t.deviceState);
    } catch (e) {
      await this.destroyPending(pending).catch(() => {});
      throw e;
    }
  }

  /**
   * The read-only layers below `owner`'s disk as the server knows them (its fork points' disks and
   * a fork point's own, and the artifact's). The backing chain a VMM is started on is read from
   * qcow2 headers, which the previous VMM could write; a confined VMM only starts if every layer
   * it names is one of these.
   */
  private layersOf(owner: string, artifactKey: string): string[] {
    const fps = [owner, ...this.repo.refsOf(owner)].map((id) => this.repo.forkPoint(id)?.disk_path).filter((p): p is string => !!p);
    let artifactDisk: string[] = [];
    try { artifactDisk = [this.artifactFor(artifactKey).diskPath]; } catch { /* no artifact: no layer of it is trusted */ }
    return [...fps, ...artifactDisk];
  }

  private get disksDir(): string {
    return homePaths(this.cfg.home).disks;
  }

  private async destroyPending(p: PendingVm): Promise<void> {
    p.warm?.agent.close();
    await p.vmm.kill();
    rmSync(p.dir, { recursive: true, force: true });
    rmSync(p.record.diskPath, { force: true });
  }

  // ---- templates -------------------------------------------------------------------------------

  /** The catalog plus, with a scope, that tenant's environments. */
  templates(scope?: Scope): TemplateInfo[] {
    return [...this.templatesById.values()]
      .filter((t) => t.kind === 'catalog' || (scope && t.tenant === scope.tenant))
      .map((t) => this.templateInfo(t));
  }

  template(id: string, scope?: Scope): TemplateInfo {
    return this.templateInfo(this.resolveTemplate(id, scope?.tenant));
  }

  /** A tenant's environment of that name, else the catalog template. */
  private resolveTemplate(id: string, tenant: string | undefined): ReadyTemplate {
    const t = (tenant !== undefined ? this.templatesById.get(envKey(tenant, id)) : undefined) ?? this.templatesById.get(id);
    if (!t || (t.kind === 'environment' && t.tenant !== tenant)) {
      throw new CollimateError('template_not_found', `No template ${JSON.stringify(id)}. List them with GET /v1/templates.`);
    }
    return t;
  }

  private templateInfo(t: ReadyTemplate): TemplateInfo {
    return {
      id: t.id, kind: t.kind, description: t.description, interpreter: t.interpreter, ready: true,
      vcpus: t.artifact.shape.vcpus, memory_mib: t.artifact.shape.memoryMib,
    };
  }

  /**
   * Registers (baking if needed) a tenant's template: an image's layers plus an environment's
   * configuration. Replaces an earlier one of the same name; sandboxes already made from it keep
   * running on their own artifact.
   */
  async addTemplate(recipe: TemplateRecipe, opts: { progress?: (m: string) => void; log?: (c: string) => void; poolSize?: number } = {}): Promise<TemplateInfo> {
    this.assertOpen();
    const t = await bakeRecipe(this.cfg, recipe, opts.progress ?? (() => {}), opts.log);
    const key = envKey(recipe.tenant, recipe.id);
    await this.removeTemplateKey(key);
    this.templatesById.set(key, t);
    this.artifacts.set(t.artifact.key, t.artifact);
    const pool = new WarmPool<PendingVm>(key, opts.poolSize ?? this.cfg.environmentPoolSize, () => this.spawnForTemplate(t), (p) => this.destroyPending(p));
    this.pools.set(key, pool);
    pool.refill();
    return this.templateInfo(t);
  }

  async removeTemplate(tenant: string, id: string): Promise<void> {
    await this.removeTemplateKey(envKey(tenant, id));
  }

  private async removeTemplateKey(key: string): Promise<void> {
    const pool = this.pools.get(key);
    this.pools.delete(key);
    this.templatesById.delete(key);
    await pool?.close();
  }

  // ---- reads -----------------------------------------------------------------------------------

  /** The row for `id` as `scope` may see it; other tenants' and deleted ids read as not found. */
  private rowFor(id: string, scope?: Scope): SandboxRow {
    const row = typeof id === 'string' ? this.repo.get(id) : undefined;
    if (!row || row.state === 'deleted' || (scope && row.tenant !== scope.tenant)) throw sandboxNotFound(String(id));
    return row;
  }

  get(id: string, scope?: Scope): SandboxInfo {
    return toInfo(this.rowFor(id, scope), this.repo.children(id), Date.now(), this.portCache.get(id));
  }

  list(filter: ListFilter, scope?: Scope): { sandboxes: SandboxInfo[]; next: string | null } {
    const limit = Math.min(Math.max(filter.limit ?? 100, 1), 1000);
    const rows = this.repo.list({ ...filter, limit }, scope?.tenant);
    const page = rows.slice(0, limit);
    return {
      sandboxes: page.map((r) => toInfo(r, this.repo.children(r.id), Date.now(), this.portCache.get(r.id))),
      next: rows.length > limit ? page[page.length - 1].id : null,
    };
  }

  countRunning(tenant: string): number {
    return this.repo.countRunning(tenant);
  }

  // ---- create ----------------------------------------------------------------------------------

  async create(opts: CreateOptions, scope: Scope): Promise<SandboxInfo> {
    this.assertOpen();
    const t = this.resolveTemplate(opts.template, scope.tenant);
    const egress = this.effectiveEgress(t, opts.egress);
    // A guest that never acknowledges its restore (see announceRestore) gets one fresh VMM.
    return this.createOnce(t, opts, egress, scope).catch((e) => {
      if (!isUnacknowledgedRestore(e)) throw e;
      return this.createOnce(t, opts, egress, scope);
    });
  }

  private async createOnce(t: ReadyTemplate, opts: CreateOptions, egress: EgressPolicy, scope: Scope): Promise<SandboxInfo> {
    const pool = this.pools.get(t.kind === 'catalog' ? t.id : envKey(scope.tenant, t.id))!;
    // A pool that is empty spawns on demand: its failure is the VMM's (502), never an internal error.
    const pending = await pool.take().catch((e) => { throw vmmFailure('create', e); });
    let live: LiveVm | undefined;
    try {
      if (pending.record.net && policyKey(egress) !== policyKey(t.egress)) await this.net!.apply(pending.record.net, egress);
      live = pending.warm ? await claimWarm(pending.warm, pending.id) : await restoreCheckpoint(pending, t.deviceState, pending.id);
      const now = Date.now();
      const row: SandboxRow = {
        id: pending.id, tenant: scope.tenant, template: t.id, state: 'running', labels: opts.labels ?? {},
        created_at: now, last_active: now, exec_count: 0, parent: null, forked_at: null,
        timeout_secs: opts.timeoutSecs ?? this.cfg.defaultSessionSecs, session_started_at: now,
        vcpus: t.artifact.shape.vcpus, memory_mib: t.artifact.shape.memoryMib, disk_mib: t.artifact.diskMib,
        egress, vmm: live.record, snapshot: null, pending_op: null,
      };
      this.repo.insert(row);
      this.running.set(row.id, { id: row.id, live, queue: new ExecQueue(), deleting: false });
      this.emit('transition', { id: row.id, tenant: row.tenant, state: 'running', op: 'create' });
      return toInfo(row, []);
    } catch (e) {
      live?.agent.close();
      await this.destroyPending(pending).catch(() => {});
      throw vmmFailure('create', e);
    }
  }

  /** The template's policy, or the create's if it is the same or narrower. */
  private effectiveEgress(t: ReadyTemplate, raw: EgressInput | undefined): EgressPolicy {
    // Normalised here too: in-process callers (the RL local fleet) do not go through the API's validation.
    const asked = raw === undefined ? undefined : parseEgress(raw);
    if (!this.net || !t.artifact.shape.nic) {
      if (asked !== undefined && asked !== 'none') {
        throw new CollimateError('network_unavailable', `This server runs without networking (${this.networkReason()}), so sandboxes have no egress; create without egress or with "none".`);
      }
      return 'none';
    }
    if (asked === undefined) return t.egress;
    const wider = widening(asked, t.egress);
    if (wider) throw new CollimateError('egress_forbidden', `The egress policy is wider than template ${t.id}'s: ${wider}. A sandbox may only narrow its environment's policy.`);
    return asked;
  }

  // ---- ports -----------------------------------------------------------------------------------

  private networkReason(): string {
    return netAvailability(this.cfg.net).reason;
  }

  /** Networking as /healthz shows it. */
  networkStatus(): { enabled: boolean; reason?: string } {
    return this.net ? { enabled: true } : { enabled: false, reason: this.networkReason() };
  }

  /**
   * The listening TCP ports of a running sandbox, read from the guest's /proc/net/tcp{,6} when no
   * operation is queued on it (an exec may run for an hour: then the last reading).
   */
  async openPorts(id: string, scope?: Scope): Promise<OpenPort[]> {
    const row = this.rowFor(id, scope);
    const r = this.running.get(id);
    if (row.state !== 'running' || !r || r.deleting || !row.vmm?.net) return this.portCache.get(id) ?? [];
    if (r.queue.depth > 0) return this.portCache.get(id) ?? [];
    try {
      const ports = await r.queue.run(async () => {
        const tables = await Promise.all(['/proc/net/tcp', '/proc/net/tcp6'].map((p) => r.live.agent.readFile(p).then((b) => b.toString(), () => '')));
        return listeningPorts(tables.join('\n'));
      });
      this.portCache.set(id, ports);
      return ports;
    } catch {
      return this.portCache.get(id) ?? [];
    }
  }

  portTarget(id: string, port: number, scope?: Scope): PortTarget {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new CollimateError('validation_error', `port must be an integer from 1 to 65535, not ${JSON.stringify(port)}.`);
    const r = this.runningFor(id, scope, 'reaching a port');
    const net = r.live.record.net;
    if (!net) throw new CollimateError('network_unavailable', `Sandbox ${id} has no network (${this.net ? 'its template was baked without one' : this.networkReason()}), so its ports cannot be reached.`);
    return { host: net.nsIp, port };
  }

  // ---- exec and files --------------------------------------------------------------------------

  private runningFor(id: string, scope: Scope | undefined, operation: string): Running {
    const row = this.rowFor(id, scope);
    const r = this.running.get(id);
    if (row.state !== 'running' || !r || r.deleting) throw invalidState(id, row.state === 'running' ? 'busy' : row.state, operation, ['running']);
    return r;
  }

  async exec(id: string, req: ExecRequest, scope?: Scope, stream?: ExecStreamHandlers): Promise<ExecResult> {
    this.assertOpen();
    const r = this.runningFor(id, scope, 'exec');
    const row = this.repo.get(id)!;
    let t: ReadyTemplate | undefined;
    try { t = this.resolveTemplate(row.template, row.tenant); } catch { t = undefined; /* removed since; run with defaults */ }
    const agentReq = buildAgentExec(req, {
      interpreter: t?.interpreter ?? ['/bin/sh', '-c'], defaultTimeoutSecs: this.cfg.defaultExecTimeoutSecs, maxOutputBytes: this.cfg.maxOutputBytes,
      defaults: t?.execDefaults,
    });
    const queuedAt = Date.now();
    return r.queue.run(async () => {
      if (r.deleting) throw sandboxNotFound(id);
      const startedAt = Date.now();
      try {
        // The guest enforces the exec timeout; the client-side limit only catches a guest that hangs.
        const out = await r.live.agent.exec(agentReq, { ...(stream ?? {}), timeoutMs: (agentReq.timeoutMs ?? 60_000) + 30_000 });
        const finishedAt = Date.now();
        const oomKilled = killedBySigkill(out.result) ? await this.oomProbe(r, startedAt) : false;
        this.touch(id, true);
        return toExecResult({ ...out, oomKilled }, { queuedAt, startedAt, finishedAt }, agentReq.seed);
      } catch (e) {
        throw this.agentFailure(r, e);
      }
    });
  }

  async readFile(id: string, path: string, scope?: Scope): Promise<Buffer> {
    this.assertOpen();
    const r = this.runningFor(id, scope, 'reading a file');
    checkGuestPath(path);
    return r.queue.run(async () => {
      try {
        const data = await r.live.agent.readFile(path);
        this.touch(id, false);
        return data;
      } catch (e) {
        throw this.agentFailure(r, e, path);
      }
    });
  }

  async writeFile(id: string, path: string, data: Buffer, scope?: Scope, mode?: number): Promise<void> {
    this.assertOpen();
    const r = this.runningFor(id, scope, 'writing a file');
    checkGuestPath(path);
    await r.queue.run(async () => {
      try {
        await r.live.agent.writeFile(path, data, mode);
        this.touch(id, false);
      } catch (e) {
        throw this.agentFailure(r, e, path);
      }
    });
  }

  /** Whether the guest OOM killer struck during an exec that just ended by SIGKILL (exec.ts OOM_PROBE). */
  private async oomProbe(r: Running, startedAt: number): Promise<boolean> {
    try {
      const probe = await r.live.agent.exec({ commands: [['/bin/sh', '-c', OOM_PROBE]], timeoutMs: 10_000, maxOutput: 64 * 1024, seed: execSeed(undefined) }, { timeoutMs: 20_000 });
      // The window runs from the exec's start to the probe's answer, which read the guest's uptime.
      return oomKilledDuring(probe.stdout.toString(), Date.now() - startedAt);
    } catch {
      return false;
    }
  }

  private agentFailure(r: Running, e: unknown, path?: string): Error {
    if (r.deleting) return sandboxNotFound(r.id);
    if (e instanceof CollimateError) return e;
    if (e instanceof AgentError) {
      if (e.code === 'file_not_found') return new CollimateError('file_not_found', `No file at ${path ?? 'that path'} in sandbox ${r.id}.`);
      if (e.code === 'not_a_file') return new CollimateError('validation_error', `${path} in sandbox ${r.id} is not a regular file.`);
      if (e.code === 'file_write_failed' || e.code === 'file_read_failed') return new CollimateError('validation_error', `${e.message}`);
      if (e.code === 'file_too_large') return new CollimateError('payload_too_large', e.message);
      if (e.code === 'bad_request') return new CollimateError('validation_error', `The guest rejected the request: ${e.message}`);
    }
    return new CollimateError('agent_unavailable', `The guest agent of sandbox ${r.id} did not answer (${(e as Error).message}). The sandbox can still be deleted.`, { cause: e });
  }

  /** Activity is flushed to SQLite once a second: it is not a transition, and an fsync per exec would dominate its latency. */
  private touch(id: string, isExec: boolean): void {
    const row = this.repo.get(id);
    if (!row) return;
    const mem = this.activity.get(id) ?? { last: row.last_active, execs: 0 };
    mem.last = Date.now();
    if (isExec) mem.execs++;
    this.activity.set(id, mem);
    this.dirtyActivity.add(id);
  }

  private readonly activity = new Map<string, { last: number; execs: number }>();

  private flushActivity(): void {
    if (this.dirtyActivity.size === 0) return;
    const ids = [...this.dirtyActivity];
    this.dirtyActivity.clear();
    this.repo.tx(() => {
      for (const id of ids) {
        const a = this.activity.get(id);
        if (!a) continue;
        this.activity.delete(id);
        this.db.prepare('UPDATE sandboxes SET last_active = MAX(last_active, ?), exec_count = exec_count + ? WHERE id = ?').run(a.last, a.execs, id);
      }
    });
  }

  // ---- fork ------------------------------------------------------------------------------------

  async fork(id: string, opts: ForkOptions, scope?: Scope): Promise<SandboxInfo[]> {
    this.assertOpen();
    const count = opts.count;
    if (!Number.isInteger(count) || count < 1 || count > 64) throw new CollimateError('validation_error', 'count must be an integer from 1 to 64.');
    const row = this.rowFor(id, scope);
    if (row.state === 'suspended') return this.forkSuspended(row, opts);
    const r = this.runningFor(id, scope, 'fork');
    return r.queue.run(async () => {
      if (r.deleting) throw sandboxNotFound(id);
      this.flushActivity();
      return this.forkRunning(r, opts);
    });
  }

  /**
   * Live fork: freeze the parent's disk into a fork point, migrate its RAM into the fork point's
   * share=on file, let the parent run on, and restore N children copy-on-write from that file.
   */
  private async forkRunning(r: Running, opts: ForkOptions): Promise<SandboxInfo[]> {
    const parentRow = this.repo.get(r.id)!;
    const shape = this.shapeOf(parentRow);
    // The parent's current top layer becomes the fork point's frozen disk, in place.
    const fpDisk = r.live.record.diskPath;
    const { fpId, fpDir, fpMem } = this.beginForkPoint(r.id, fpDisk, (id) => {
      this.repo.update(r.id, { pending_op: { op: 'fork', forkPoint: id, startedAt: Date.now() } });
    });
    const vmm = r.live.vmm;
    const children: PendingVm[] = [];
    let recv: PendingVm | undefined;
    let parentStopped = false;
    try {
      await this.fault('fork:before-stop');
      await vmm.qmp.execute('stop');
      parentStopped = true;
      const newDisk = newDiskPath(this.disksDir, r.id);
      await snapshotUpperDisk(this.cfg, r.live, newDisk, `upper-${fpId}`);
      r.live.record.diskPath = newDisk;
      this.repo.update(r.id, { vmm: r.live.record });
      await this.fault('fork:after-disk');

      recv = await spawnIncoming(this.cfg, shape, {
        id: fpId, dir: join(fpDir, 'recv'), memPath: fpMem, memShared: true,
        backing: { path: fpDisk, format: 'qcow2' }, diskPath: join(fpDir, 'recv.qcow2'), artifactKey: r.live.record.artifactKey,
        trustedLayers: this.layersOf(fpId, r.live.record.artifactKey),
      });
      await this.fault('fork:recv-spawned');
      await vmm.migrateTo(recv.vmm, 300_000);
      await this.fault('fork:after-migrate');
      // The parent runs on as soon as its memory is copied.
      await vmm.cont();
      parentStopped = false;
      const devState = join(fpDir, 'device.state');
      await recv.vmm.checkpointDeviceState(devState, join(recv.dir, 'save.sock'));
      await this.destroyPending(recv);
      recv = undefined;
      this.repo.markForkPointReady(fpId);
      return await this.spawnChildren(parentRow, shape, fpId, fpDisk, fpMem, readFileSync(devState), opts, children);
    } catch (e) {
      if (parentStopped) await vmm.cont().catch(() => {});
      if (recv) await this.destroyPending(recv).catch(() => {});
      for (const c of children) await this.destroyPending(c).catch(() => {});
      this.repo.update(r.id, { pending_op: null });
      this.gcForkPoints();
      throw vmmFailure('fork', e);
    }
  }

  /**
   * Records a new fork point on `fpDisk` before anything moves, in one transaction with `alsoInTx`:
   * the owner references it from the moment its disk freezes, and the fork point inherits the
   * owner's references (its disk chain and RAM lie on those).
   */
  private beginForkPoint(owner: string, fpDisk: string, alsoInTx: (fpId: string) => void): { fpId: string; fpDir: string; fpMem: string } {
    const fpId = newForkPointId();
    const fpDir = join(this.cfg.home, 'forkpoints', fpId);
    const fpMem = join(this.cfg.ramDir, `${fpId}.mem`);
    mkdirSync(fpDir, { recursive: true });
    this.repo.tx(() => {
      this.repo.addForkPoint(fpId, fpDir, fpMem, fpDisk);
      this.repo.addRef(fpId, owner);
      for (const up of this.repo.refsOf(owner)) if (up !== fpId) this.repo.addRef(up, fpId);
      alsoInTx(fpId);
    });
    return { fpId, fpDir, fpMem };
  }

  private async spawnChildren(
    parentRow: SandboxRow, shape: MachineShape, fpId: string, fpDisk: string, fpMem: string, devState: Buffer,
    opts: ForkOptions, children: PendingVm[],
  ): Promise<SandboxInfo[]> {
    const lives: LiveVm[] = [];
    try {
      // allSettled, not all: when one child fails the others are still landing, and every one
      // that lands must be in `children` for the caller to stop it.
      const spawnChild = async () => {
        const id = newSandboxId();
        const p = await spawnIncoming(this.cfg, shape, {
          id, dir: join(homePaths(this.cfg.home).sandboxes, id), memPath: fpMem, memShared: false,
          backing: { path: fpDisk, format: 'qcow2' }, diskPath: newDiskPath(this.disksDir, id), artifactKey: parentRow.vmm?.artifactKey ?? '',
          trustedLayers: this.layersOf(fpId, parentRow.vmm?.artifactKey ?? ''), network: true,
        });
        children.push(p);
        // Children inherit the parent's policy, in place before they wake.
        if (p.record.net) await this.net!.apply(p.record.net, parentRow.egress);
        return p;
      };
      const spawnedAll = await Promise.allSettled(Array.from({ length: opts.count }, spawnChild));
      const spawnFailure = spawnedAll.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (spawnFailure) throw spawnFailure.reason;
      const spawned = children.slice();
      await this.fault('fork:children-spawned');
      // A restore whose guest never acknowledges (see finishRestore) gets one fresh VMM.
      const restoreChild = async (p: PendingVm): Promise<{ id: string; live: LiveVm }> => {
        try {
          return { id: p.id, live: await restoreCheckpoint(p, devState, p.id) };
        } catch (e) {
          if (!isUnacknowledgedRestore(e)) throw e;
          await this.destroyPending(p).catch(() => {});
          const q = await spawnChild();
          return { id: q.id, live: await restoreCheckpoint(q, devState, q.id) };
        }
      };
      const restored = await Promise.allSettled(spawned.map(restoreChild));
      const ids: string[] = [];
      for (const r of restored) if (r.status === 'fulfilled') { lives.push(r.value.live); ids.push(r.value.id); }
      const restoreFailure = restored.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (restoreFailure) throw restoreFailure.reason;
      await this.fault('fork:children-restored');
      const now = Date.now();
      const rows: SandboxRow[] = ids.map((id, i) => ({
        id, tenant: parentRow.tenant, template: parentRow.template, state: 'running',
        labels: { ...parentRow.labels, ...(opts.labels ?? {}) },
        created_at: now, last_active: now, exec_count: 0, parent: parentRow.id, forked_at: now,
        timeout_secs: parentRow.timeout_secs, session_started_at: now,
        vcpus: parentRow.vcpus, memory_mib: parentRow.memory_mib, disk_mib: parentRow.disk_mib, egress: parentRow.egress,
        vmm: lives[i].record, snapshot: null, pending_op: null,
      }));
      this.repo.tx(() => {
        for (const row of rows) {
          this.repo.insert(row);
          this.repo.addRef(fpId, row.id);
          for (const up of this.repo.refsOf(fpId)) this.repo.addRef(up, row.id);
        }
        this.repo.update(parentRow.id, { pending_op: null });
      });
      rows.forEach((row, i) => {
        this.running.set(row.id, { id: row.id, live: lives[i], queue: new ExecQueue(), deleting: false });
        this.emit('transition', { id: row.id, tenant: row.tenant, state: 'running', op: 'fork' });
      });
      return rows.map((row) => toInfo(row, []));
    } catch (e) {
      for (const l of lives) l.agent.close();
      throw e;
    }
  }

  /** Fork of a suspended sandbox: its snapshot is restored into a fork point, children come from that. */
  private async forkSuspended(row: SandboxRow, opts: ForkOptions): Promise<SandboxInfo[]> {
    const snap = row.snapshot;
    if (!snap || !row.vmm) throw invalidState(row.id, row.state, 'fork', ['running', 'suspended']);
    return this.serialized(row.id, async () => {
      const shape = this.shapeOf(row);
      // The suspended sandbox's top layer freezes into the fork point; the sandbox gets a fresh overlay on it.
      const fpDisk = row.vmm!.diskPath;
      const newDisk = newDiskPath(this.disksDir, row.id);
      await createOverlay(newDisk, fpDisk, 'qcow2');
      const { fpId, fpDir, fpMem } = this.beginForkPoint(row.id, fpDisk, () => {
        this.repo.update(row.id, { vmm: { ...row.vmm!, diskPath: newDisk } });
      });
      const children: PendingVm[] = [];
      let recv: PendingVm | undefined;
      try {
        recv = await spawnIncoming(this.cfg, shape, {
          id: fpId, dir: join(fpDir, 'recv'), memPath: fpMem, memShared: true,
          backing: { path: fpDisk, format: 'qcow2' }, diskPath: join(fpDir, 'recv.qcow2'), artifactKey: row.vmm!.artifactKey,
          trustedLayers: this.layersOf(fpId, row.vmm!.artifactKey),
        });
        await restoreStream(recv, snap.statePath);
        const devState = join(fpDir, 'device.state');
        await recv.vmm.checkpointDeviceState(devState, join(recv.dir, 'save.sock'));
        await this.destroyPending(recv);
        recv = undefined;
        this.repo.markForkPointReady(fpId);
        return await this.spawnChildren(row, shape, fpId, fpDisk, fpMem, readFileSync(devState), opts, children);
      } catch (e) {
        if (recv) await this.destroyPending(recv).catch(() => {});
        for (const c of children) await this.destroyPending(c).catch(() => {});
        this.gcForkPoints();
        throw vmmFailure('fork', e);
      }
    });
  }

  // ---- suspend / resume ------------------------------------------------------------------------

  /** Suspended sandboxes have no ExecQueue; their operations are serialized here. */
  private readonly suspendedQueues = new Map<string, ExecQueue>();

  private serialized<T>(id: string, fn: () => Promise<T>): Promise<T> {
    let q = this.suspendedQueues.get(id);
    if (!q) { q = new ExecQueue(); this.suspendedQueues.set(id, q); }
    const queue = q;
    return queue.run(fn).finally(() => { if (queue.depth === 0) this.suspendedQueues.delete(id); });
  }

  async suspend(id: string, scope?: Scope): Promise<SandboxInfo> {
    this.assertOpen();
    const r = this.runningFor(id, scope, 'suspend');
    return r.queue.run(async () => {
      if (r.deleting) throw sandboxNotFound(id);
      this.flushActivity();
      return this.serialized(id, () => this.suspendRunning(r));
    });
  }

  private async suspendRunning(r: Running): Promise<SandboxInfo> {
    const snapDir = join(homePaths(this.cfg.home).sandboxes, r.id, 'suspend');
    mkdirSync(snapDir, { recursive: true });
    const statePath = join(snapDir, 'state.mig');
    this.repo.update(r.id, { pending_op: { op: 'suspend', startedAt: Date.now() } });
    const vmm = r.live.vmm;
    try {
      await this.fault('suspend:before-save');
      await vmm.saveFullState(statePath, vmmFiles(r.live.record.dir).migrationSocket);
      const fd = openSync(statePath, 'r');
      fsyncSync(fd);
      closeSync(fd);
      writeFileSync(join(snapDir, 'complete'), '');
      await this.fault('suspend:after-save');
    } catch (e) {
      await vmm.cont().catch(() => {});
      rmSync(snapDir, { recursive: true, force: true });
      this.repo.update(r.id, { pending_op: null });
      throw vmmFailure('suspend', e);
    }
    const bytes = statSync(statePath).size;
    // Persisted before the VMM goes: a crash from here on finds a complete snapshot and a dead or
    // stopped VMM, and finishes the suspend.
    this.repo.update(r.id, { state: 'suspended', snapshot: { statePath, bytes, suspendedAt: Date.now() }, pending_op: null });
    this.running.delete(r.id);
    r.live.agent.close();
    await vmm.kill();
    if (r.live.record.memPath.startsWith(this.cfg.ramDir) && ownsMemFile(r.live.record.memPath, r.id)) rmSync(r.live.record.memPath, { force: true });
    this.emit('transition', { id: r.id, tenant: this.repo.get(r.id)!.tenant, state: 'suspended', op: 'suspend', snapshotBytes: bytes });
    return this.get(r.id);
  }

  async resume(id: string, scope?: Scope): Promise<SandboxInfo> {
    this.assertOpen();
    const row = this.rowFor(id, scope);
    if (row.state !== 'suspended') throw invalidState(id, row.state === 'running' ? 'running' : row.state, 'resume', ['suspended']);
    return this.serialized(id, async () => {
      const cur = this.repo.get(id)!;
      if (cur.state !== 'suspended') throw invalidState(id, cur.state, 'resume', ['suspended']);
      const snap = cur.snapshot!;
      const rec = cur.vmm!;
      const shape = this.shapeOf(cur);
      // A resumed sandbox owns its RAM outright (the stream carries every page). Mapped share=on:
      // share=off over an empty tmpfs file would cost each page twice (a zero page in the file,
      // then the private copy), and the VMM's memory limit counts both.
      const memPath = join(this.cfg.ramDir, `${id}.mem`);
      let pending: PendingVm | undefined;
      let live: LiveVm | undefined;
      try {
        rmSync(join(rec.dir, 'qmp.sock'), { force: true });
        pending = await spawnIncoming(this.cfg, shape, {
          id, dir: rec.dir, memPath, memShared: true, backing: null, diskPath: this.repo.get(id)!.vmm!.diskPath, artifactKey: rec.artifactKey,
          trustedLayers: this.layersOf(id, rec.artifactKey), network: true,
        });
        if (pending.record.net) await this.net!.apply(pending.record.net, cur.egress);
        await restoreStream(pending, snap.statePath);
        live = await finishRestore(pending, id);
      } catch (e) {
        live?.agent.close();
        if (pending) await pending.vmm.kill().catch(() => {});
        rmSync(memPath, { force: true });
        throw vmmFailure('resume', e);
      }
      const now = Date.now();
      this.repo.update(id, { state: 'running', vmm: live.record, snapshot: null, pending_op: null, session_started_at: now, last_active: now });
      this.running.set(id, { id, live, queue: new ExecQueue(), deleting: false });
      rmSync(join(rec.dir, 'suspend'), { recursive: true, force: true });
      this.emit('transition', { id, tenant: cur.tenant, state: 'running', op: 'resume' });
      return this.get(id);
    });
  }

  // ---- delete ----------------------------------------------------------------------------------

  /** Deletes from any state, at once: queued operations on the sandbox fail with not found. */
  async delete(id: string, scope?: Scope): Promise<void> {
    const row = this.rowFor(id, scope);
    const r = this.running.get(id);
    if (r) r.deleting = true;
    this.repo.update(id, { state: 'deleting' });
    if (r) {
      r.live.agent.close();
      await r.live.vmm.kill();
      this.running.delete(id);
    } else if (row.vmm) {
      await killRecorded(this.cfg, row.vmm);
    }
    this.removeSandboxFiles(row);
    this.repo.tx(() => {
      this.repo.update(id, { state: 'deleted', vmm: null, snapshot: null, pending_op: null });
      this.db.prepare('UPDATE sandboxes SET deleted_at = ? WHERE id = ?').run(Date.now(), id);
      this.repo.dropRefs(id);
    });
    this.activity.delete(id);
    this.dirtyActivity.delete(id);
    this.portCache.delete(id);
    this.gcForkPoints();
    this.emit('transition', { id, tenant: row.tenant, state: 'deleted', op: 'delete' });
  }

  private removeSandboxFiles(row: SandboxRow): void {
    rmSync(join(homePaths(this.cfg.home).sandboxes, row.id), { recursive: true, force: true });
    // Every disk layer named after it except those fork points hold (removed with the fork point).
    // By name rather than by the row's top-disk path: a delete that overtakes a fork may read the
    // row before the fork recorded the parent's new top layer.
    const held = new Set(this.repo.allForkPoints().map((f) => f.disk_path));
    if (row.vmm?.diskPath && !held.has(row.vmm.diskPath)) rmSync(row.vmm.diskPath, { force: true });
    for (const f of readdirSync(this.disksDir)) {
      const p = join(this.disksDir, f);
      if (f.startsWith(`${row.id}-`) && !held.has(p)) rmSync(p, { force: true });
    }
    rmSync(join(this.cfg.ramDir, `${row.id}.mem`), { force: true });
  }

  /** Removes fork points nothing depends on, repeatedly (removing one can free its ancestors). */
  private gcForkPoints(): void {
    for (;;) {
      const dead = this.repo.unreferencedForkPoints();
      if (dead.length === 0) return;
      for (const fp of dead) {
        rmSync(fp.dir, { recursive: true, force: true });
        rmSync(fp.mem_path, { force: true });
        rmSync(fp.disk_path, { force: true });
        this.repo.removeForkPoint(fp.id);
      }
    }
  }

  // ---- reaping ---------------------------------------------------------------------------------

  private reaping = false;

  async reap(now = Date.now()): Promise<string[]> {
    if (this.reaping || this.closing) return [];
    this.reaping = true;
    const reaped: string[] = [];
    try {
      for (const row of this.repo.list({ state: 'running', limit: 1000 })) {
        if (row.state !== 'running' || now < row.session_started_at + row.timeout_secs * 1000) continue;
        try {
          if (this.cfg.reapAction === 'suspend') await this.suspend(row.id);
          else await this.delete(row.id);
          reaped.push(row.id);
          this.emit('reaped', { id: row.id, action: this.cfg.reapAction });
        } catch {
          // Busy or already gone; the next tick retries.
        }
      }
    } finally {
      this.reaping = false;
    }
    return reaped;
  }

  // ---- crash recovery --------------------------------------------------------------------------

  /**
   * Brings the database and the host back into agreement after a start: re-adopts VMMs of running
   * sandboxes, finishes or rolls back half-done suspends and forks, and stops every VMM and removes
   * every file that no row accounts for.
   */
  private async reconcile(): Promise<void> {
    const known = new Set<string>();
    for (const row of this.repo.live()) {
      known.add(row.id);
      await this.reconcileRow(row).catch(async (e) => {
        this.opts.progress?.(`reconcile ${row.id}: ${(e as Error).message}; marking it deleted`);
        if (row.vmm) await killRecorded(this.cfg, row.vmm);
        this.markLost(row);
      });
    }
    // Warm-pool VMMs of the previous process and children of a fork that never committed.
    const sbxRoot = homePaths(this.cfg.home).sandboxes;
    for (const d of readdirSync(sbxRoot)) {
      if (known.has(d) && this.repo.get(d)?.state !== 'deleted') continue;
      await killFromDir(this.cfg, join(sbxRoot, d));
      rmSync(join(sbxRoot, d), { recursive: true, force: true });
    }
    // Fork points whose recv VMM survived a crash mid-fork.
    const fpRoot = join(this.cfg.home, 'forkpoints');
    const fps = new Set(this.repo.allForkPoints().map((f) => f.id));
    for (const d of readdirSync(fpRoot)) {
      await killFromDir(this.cfg, join(fpRoot, d, 'recv'));
      rmSync(join(fpRoot, d, 'recv'), { recursive: true, force: true });
      if (!fps.has(d)) rmSync(join(fpRoot, d), { recursive: true, force: true });
    }
    // A half-made fork point stays while its parent's disk chain refers to it; otherwise it goes.
    this.gcForkPoints();
    // Disk layers no row accounts for: warm-pool disks of the previous process, children of a fork
    // that never committed.
    const inUse = new Set<string>([
      ...this.repo.live().map((r) => r.vmm?.diskPath).filter((p): p is string => !!p),
      ...this.repo.allForkPoints().map((f) => f.disk_path),
    ]);
    for (const f of readdirSync(this.disksDir)) {
      const p = join(this.disksDir, f);
      if (!inUse.has(p)) rmSync(p, { force: true });
    }
    for (const f of readdirSync(this.cfg.ramDir)) {
      const p = join(this.cfg.ramDir, f);
      if (f.startsWith('artifact-')) continue;
      const owner = f.replace(/\.mem$/, '');
      if (owner.startsWith('fp_') && fps.has(owner)) continue;
      if (owner.startsWith('sbx_') && this.running.has(owner)) continue;
      rmSync(p, { force: true });
    }
    // Template bakes cut off by a crash: their VMMs run on, recorded in their build directories.
    await stopOrphanedBakes(this.cfg.cacheDir, this.cfg.artifactRamDir, this.opts.progress);
    // Cgroups of VMMs that never started (a crash between preparing a VMM and spawning it).
    await sweepConfinement(this.cfg);
    // Namespaces of VMMs that are gone (or never started).
    await this.net?.sweep(new Set([...this.running.values()].map((r) => r.live.record.net?.ns).filter((n): n is string => !!n)));
  }

  private async reconcileRow(row: SandboxRow): Promise<void> {
    if (row.state === 'deleting') {
      if (row.vmm) await killRecorded(this.cfg, row.vmm);
      this.removeSandboxFiles(row);
      this.markLost(row);
      return;
    }
    const snapDir = join(homePaths(this.cfg.home).sandboxes, row.id, 'suspend');
    if (row.state === 'suspended' || (row.pending_op?.op === 'suspend' && existsSync(join(snapDir, 'complete')))) {
      // Finish a suspend whose snapshot was complete: the VMM must not run on beside the snapshot.
      if (row.vmm) await killRecorded(this.cfg, row.vmm);
      if (row.state !== 'suspended') {
        const statePath = join(snapDir, 'state.mig');
        this.repo.update(row.id, { state: 'suspended', snapshot: { statePath, bytes: statSync(statePath).size, suspendedAt: Date.now() }, pending_op: null });
      }
      if (!row.snapshot && row.state === 'suspended') throw new Error('suspended without a snapshot');
      return;
    }
    if (!row.vmm) throw new Error('no VMM recorded');
    const artifact = this.artifactFor(row.vmm.artifactKey);
    const live = await adoptVm(this.cfg, artifact.shape, row.vmm);
    if (!live) throw new Error('its VMM is gone');
    // The namespace kept its rules, but its resolver went with the previous server: point DNS at a new one.
    if (live.record.net) {
      if (!this.net) { await live.vmm.kill(); throw new Error('it has a network namespace but networking is off now'); }
      await this.net.apply(live.record.net, row.egress);
    }
    // A half-done suspend or fork is rolled back: adoptVm resumed a stopped VM.
    rmSync(snapDir, { recursive: true, force: true });
    this.repo.update(row.id, { state: 'running', vmm: live.record, pending_op: null });
    this.running.set(row.id, { id: row.id, live, queue: new ExecQueue(), deleting: false });
  }

  private markLost(row: SandboxRow): void {
    this.repo.tx(() => {
      this.repo.update(row.id, { state: 'deleted', vmm: null, snapshot: null, pending_op: null });
      this.repo.dropRefs(row.id);
    });
    this.removeSandboxFiles(row);
  }

  private artifactFor(key: string): Artifact {
    const a = this.artifacts.get(key);
    if (a) return a;
    // An artifact from an earlier build: its manifest is still on disk (its RAM file may not be).
    const root = join(homePaths(this.cfg.cacheDir).artifacts, key.slice(0, 24));
    for (const b of existsSync(root) ? readdirSync(root).sort().reverse() : []) {
      const m = join(root, b, 'artifact.json');
      if (existsSync(m)) {
        const art = JSON.parse(readFileSync(m, 'utf8')) as Artifact;
        this.artifacts.set(key, art);
        return art;
      }
    }
    throw new Error(`artifact ${key.slice(0, 12)} is gone`);
  }

  private shapeOf(row: SandboxRow): MachineShape {
    return this.artifactFor(row.vmm!.artifactKey).shape;
  }

  // ---- shutdown --------------------------------------------------------------------------------

  /** Stops background work and closes connections. Running VMMs are left for re-adoption. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    clearInterval(this.reaper);
    clearInterval(this.flusher);
    await Promise.all([...this.pools.values()].map((p) => p.close()));
    await Promise.all([...this.running.values()].map((r) => r.queue.drain().catch(() => {})));
    this.flushActivity();
    for (const r of this.running.values()) { r.live.agent.close(); r.live.vmm.qmp.close(); }
    this.running.clear();
    // Running VMMs keep their namespaces (and rules) for the next server; the pool and resolvers go.
    await this.net?.close();
    forgetNet(this.cfg);
    this.db.close();
    // The RAM directory goes too once nothing in it is left (running VMMs keep theirs).
    try { rmdirSync(this.cfg.ramDir); } catch { /* not empty, or already gone */ }
  }

  /** Deletes every sandbox this engine holds (tests, `collimate` shutdown with --delete). */
  async deleteAll(): Promise<void> {
    for (const row of this.repo.live()) await this.delete(row.id).catch(() => {});
  }

  private assertOpen(): void {
    if (this.closing) throw new CollimateError('shutting_down', 'The server is shutting down; retry against the restarted server.', { retryAfterSecs: 5 });
  }

  private async fault(name: string): Promise<void> {
    await this.opts.faultPoint?.(name);
  }
}

function envKey(tenant: string, id: string): string {
  return `${tenant}/${id}`;
}

/** Whether `e` is, or (wrapped by vmmFailure) was caused by, a restore the guest never acknowledged. */
function isUnacknowledgedRestore(e: unknown): boolean {
  return e instanceof RestoreUnacknowledgedError || (e instanceof Error && e.cause instanceof RestoreUnacknowledgedError);
}

function vmmFailure(op: string, e: unknown): CollimateError {
  if (e instanceof CollimateError) return e;
  return new CollimateError('vmm_failed', `The ${op} failed inside the VMM: ${(e as Error).message}. Nothing was changed; retry, or delete the sandbox.`, { cause: e });
}

function checkGuestPath(path: string): void {
  if (typeof path !== 'string' || !path.startsWith('/') || path.includes('\0') || path.length > 4096) {
    throw new CollimateError('validation_error', 'path must be an absolute path inside the sandbox, e.g. /root/data.txt.');
  }
}

function ownsMemFile(memPath: string, id: string): boolean {
  return memPath.endsWith(`/${id}.mem`);
}

/** Stops a VMM known only by its record (not in memory: suspended, or found at start). */
async function killRecorded(cfg: EngineConfig, rec: VmmRecord): Promise<void> {
  if (rec.pid && isAlive(rec.pid) && procStartTicks(rec.pid) === rec.startTicks) {
    try { process.kill(rec.pid, 'SIGKILL'); } catch { /* gone */ }
    const deadline = Date.now() + 5000;
    while (isAlive(rec.pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  }
  await releaseRecorded(cfg, rec);
}

async function killFromDir(cfg: EngineConfig, dir: string): Promise<void> {
  const f = vmmFiles(dir).vmmJson;
  if (!existsSync(f)) return;
  try {
    await killRecorded(cfg, JSON.parse(readFileSync(f, 'utf8')) as VmmRecord);
  } catch {
    // unreadable record: nothing we can safely kill
  }
}

// Re-exported for tests that need to reason about VMM processes.
export { Vmm };
