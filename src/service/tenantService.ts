/**
 * The tenant service: every rule a tenant meets, written once, in front of the engine. REST
 * (src/api), MCP (src/mcp), the CLI (through REST) and the in-process RL fleet (src/sdk/rl/local.ts)
 * all call it; each of them only parses its input, makes one call here and renders the result
 * (src/wire/views.ts). Nothing here knows HTTP or MCP.
 *
 * What it owns: API keys → scope; tier rules (catalog-only tiers, session length, VM size, own
 * images); concurrency admission (one reservation table for every front door); template readiness
 * (an environment still baking); egress narrowing; the idempotency of retried requests; state
 * pre-checks; metering; the lifecycle metrics (create, fork, exec latency).
 *
 * Every call takes a Scope, always: which tenant acts and under which tier. The local RL fleet, which
 * holds the engine in its own process, passes trustedScope(tenant).
 */
import { dirname, join } from 'node:path';
import { CollimateError, invalidState, sandboxNotFound } from '../errors.js';
import type { Db } from '../store/db.js';
import type { EnvironmentSpec, ImageService } from '../images/service.js';
import type { EnvironmentRow, ImageRow } from '../images/imageRepo.js';
import type { SourceSpec } from '../images/sources.js';
import { parseEgress, widening, type EgressInput, type EgressPolicy } from '../net/policy.js';
import type { PhaseReport } from '../sandboxes/phases.js';
import type { CapacityStatus } from '../sandboxes/hostCapacity.js';
import { forkCountProblem } from '../sandboxes/types.js';
import type {
  ExecRequest, ExecResult, ExecStreamHandlers, ListFilter, OpenPort, PortTarget, ProcessEvent, ProcessInfo, ProcessStartRequest,
  SandboxInfo, SandboxTransition, ServiceEngine, TemplateInfo,
  DirListing, DirWatch, FileEntry, FileSink, UploadOptions, WatchHandlers,
} from '../sandboxes/types.js';
import type { Admission } from './admission.js';
import { ExecLog, type ExecLogEntry } from './execLog.js';
import { IdempotencyStore, type StoredResponse } from './idempotency.js';
import { KeyStore, type KeyRecord } from './keys.js';
import { LocalPlacement, type Placement } from './placement.js';
import { localHost, type PortRoute, type SandboxHost } from './sandboxHost.js';
import { checkUsageRange, Meter, type MeteredSandboxInfo, type UsageReport } from './metering.js';
import { Gauge, Histogram, MetricsRegistry } from './metrics.js';
import { applyApiMigrations } from './migrations.js';
import { PortUrlSigner } from './portUrls.js';
import { TRUSTED_TIER, type Tier } from './tiers.js';
import { DEFAULT_PORT_URL_SECS } from '../wire/schemas.js';

/** Who acts: the tenant and the tier whose rules apply. Required on every call. */
export interface Scope {
  tenant: string;
  tier: Tier;
}

/** The scope of a process that holds the engine itself (the local RL fleet): no caps. */
export function trustedScope(tenant: string): Scope {
  return { tenant, tier: TRUSTED_TIER };
}

export interface CreateInput {
  template: string;
  labels?: Record<string, string>;
  /** Default: the tier's default session (the server's, for a trusted scope). */
  timeoutSecs?: number;
  /** Narrows the template's policy; absent: the template's. */
  egress?: EgressInput;
}

export interface ForkInput {
  count: number;
  labels?: Record<string, string>;
}

export interface PortUrl {
  /** The token of `/v1/p/<token>/`. */
  token: string;
  port: number;
  expiresAt: number;
}

/** A sandbox port resolved for the ports proxy. */
export interface ResolvedPort {
  sandboxId: string;
  port: number;
  target: PortRoute;
}

/** Runs a request once per (tenant, key): this server's store, or the cluster's (src/cluster/idempotency.ts). */
export interface IdempotencyRunner {
  run(tenant: string, key: string, fp: string, exec: () => Promise<StoredResponse>): Promise<StoredResponse & { replayed: boolean }>;
  /** Drops records past their time (a store that expires its own has none). */
  prune?(): void;
}

/** Managing a tenant's keys: this server's store, or the cluster's (src/cluster/keys.ts ClusterKeys). */
export interface AccountKeys {
  list(filter: { tenant: string }): KeyRecord[] | Promise<KeyRecord[]>;
  create(opts: { tenant: string; name?: string }): { key: string; record: KeyRecord } | Promise<{ key: string; record: KeyRecord }>;
  get(id: string): KeyRecord | null | Promise<KeyRecord | null>;
  revoke(id: string): unknown;
}

/** Live use of one running sandbox's VMM. */
export interface LiveStat {
  id: string;
  cpuPercent: number | null;
  memoryMib: number;
}

/** Where a cluster host's tenant-wide readings come from: every host, not this one alone. */
export interface ClusterReadings {
  /** The tenant's usage over every host. */
  usage(tenant: string, fromMs: number, toMs: number, opts: { perDay?: boolean }): Promise<UsageReport>;
  /** The live stats of the tenant's sandboxes on the other hosts (a host that does not answer is left out). */
  otherHostsStats(tenant: string): Promise<LiveStat[]>;
  /** A tenant's environment made on another host, as a template to check a create against. */
  template(tenant: string, name: string): Promise<TemplateInfo | undefined>;
  /** The tenant's environments as every host last wrote them. */
  environments(tenant: string): Promise<EnvironmentRow[]>;
  /**
   * One of the tenant's environments another host made: as its host last wrote it to the cluster,
   * or with `fromItsHost` (its whole bake log) asked of that host, 503 while it does not answer.
   * Undefined when no other host made one by that name.
   */
  environmentElsewhere(tenant: string, name: string, fromItsHost: boolean): Promise<EnvironmentRow | undefined>;
  /** Deletes an environment another host made, on that host; false when no other host made one by that name. */
  deleteEnvironmentElsewhere(tenant: string, name: string): Promise<boolean>;
  /** Resolves once this host's environment changes so far are in the cluster database (so every host shows them). */
  environmentsWritten(): Promise<void>;
}

export interface TenantServiceOptions {
  engine: ServiceEngine;
  /** The database of keys, idempotency records and usage (the engine's own in production). */
  db: Db;
  /** Own images and environments; without it those calls answer not_found. */
  images?: ImageService;
  /** Where API keys live; default the database's (a cluster host passes the cluster's, src/cluster/keys.ts). */
  keys?: KeyStore;
  /** Where a tenant's own keys are listed, made and revoked; default `keys`. */
  accountKeys?: AccountKeys;
  /** Idempotency-Key records; default the database's. */
  idempotency?: IdempotencyRunner;
  /**
   * A cluster host: where sandboxes live and new ones go, and tenant-wide readings, over every host
   * (src/cluster/sandboxPlacement.ts), given this host's sandboxes. Default: this host alone.
   */
  cluster?: (here: SandboxHost) => Placement & ClusterReadings;
  /**
   * The key file signing port URLs. Default: `port-urls.key` beside the database; null (or an
   * in-memory database) keeps a key in memory only, so URLs die with the process.
   */
  portUrlKeyPath?: string | null;
  /** Period of the metering reconcile; 0 disables it. Default 10 s, or 60 s when the engine emits transitions. */
  reconcileIntervalMs?: number;
  /** Longest a create, fork or resume waits for in-flight operations before concurrency_limit (tests). */
  admissionWaitMs?: number;
  /**
   * Where the tenant's sandbox events come from (watchSandboxes). Default: this engine's own
   * transitions; a cluster host passes every host's (src/cluster/events.ts).
   */
  sandboxEvents?: (tenant: string, listener: (t: SandboxTransition) => void) => () => void;
  now?: () => number;
  /** Where failures of background work (metering) are reported. */
  log?: (err: unknown, msg: string) => void;
}

type Transition = { id: string; state: string; snapshotBytes?: number };
export class TenantService {
  readonly engine: ServiceEngine;
  readonly keys: KeyStore;
  readonly accountKeys: AccountKeys;
  /** Where sandboxes live and new ones go. */
  readonly placement: Placement;
  /** This host's sandboxes (what the placement hands out for them, and what peers operate). */
  readonly here: SandboxHost;
  /** The single-host admission, when the placement is this host's alone (tests read its in-flight slots). */
  readonly admission?: Admission;
  readonly idempotency: IdempotencyRunner;
  private readonly clusterReadings?: ClusterReadings;
  readonly meter: Meter;
  readonly signer: PortUrlSigner;
  /** Each sandbox's recent execs (what ran, exit code, duration), for GET /v1/sandboxes/{id}/execs. */
  readonly execLog: ExecLog;
  /** The service's database; a front door with state of its own (the E2B envVars) keeps it here too. */
  readonly db: Db;
  /** The service's instruments; front doors register theirs in the same registry. */
  readonly metrics = new MetricsRegistry();
  private readonly images?: ImageService;
  private readonly now: () => number;
  /** Where failures of background work (metering, port readings) go; settable once a logger exists. */
  log: (err: unknown, msg: string) => void;
  private readonly createSeconds: Histogram;
  private readonly forkSeconds: Histogram;
  private readonly execSeconds: Histogram;
  private readonly timers: NodeJS.Timeout[] = [];
  /** The last CPU reading of each running sandbox's VMM, for liveStats' percentages. */
  private readonly cpuSamples = new Map<string, { atMs: number; cpuSecs: number }>();
  /** Listeners of watchSandboxes: one engine subscription fans out to every open event stream. */
  private readonly sandboxWatchers = new Set<(t: SandboxTransition) => void>();
  private readonly sandboxEvents?: TenantServiceOptions['sandboxEvents'];
  private readonly onTransition = (ev: Transition) => {
    this.meterTransition(ev);
    if (ev.state === 'deleted') this.execLog.forget(ev.id);
    if (ev.state !== 'running') this.cpuSamples.delete(ev.id);
    for (const watcher of this.sandboxWatchers) watcher(ev as SandboxTransition);
  };
  private readonly onPhases: (r: PhaseReport) => void;
  private closed = false;

  constructor(opts: TenantServiceOptions) {
    this.engine = opts.engine;
    this.images = opts.images;
    this.now = opts.now ?? Date.now;
    this.log = opts.log ?? (() => {});
    this.db = opts.db;
    applyApiMigrations(opts.db);
    this.keys = opts.keys ?? new KeyStore(opts.db);
    this.accountKeys = opts.accountKeys ?? this.keys;
    this.idempotency = opts.idempotency ?? new IdempotencyStore(opts.db);
    this.execLog = new ExecLog(opts.db);
    this.meter = new Meter(opts.db, this.now);
    this.sandboxEvents = opts.sandboxEvents;
    this.here = localHost(this.engine, { execLog: this.execLog, meter: this.meter, now: this.now, log: (err, msg) => this.log(err, msg) });
    if (opts.cluster) {
      const cluster = opts.cluster(this.here);
      this.placement = cluster;
      this.clusterReadings = cluster;
    } else {
      const local = new LocalPlacement(this.engine, this.here, opts.admissionWaitMs);
      this.placement = local;
      this.admission = local.admission;
    }
    const dbFile = (opts.db as { name?: string }).name;
    const keyPath = opts.portUrlKeyPath !== undefined ? opts.portUrlKeyPath : dbFile && dbFile !== ':memory:' ? join(dirname(dbFile), 'port-urls.key') : null;
    this.signer = new PortUrlSigner(keyPath, this.now);

    this.createSeconds = this.metrics.register(new Histogram('collimate_create_seconds', 'Sandbox create latency (service call), every front door.'));
    this.execSeconds = this.metrics.register(new Histogram('collimate_exec_seconds', 'Exec latency including queueing (service call), every front door.'));
    this.forkSeconds = this.metrics.register(new Histogram('collimate_fork_seconds', 'Live fork latency (service call), by child count, every front door.'));
    this.metrics.register(
      new Gauge('collimate_sandboxes', 'Sandboxes by state.', () => {
        const counts: Record<string, number> = { running: 0, suspended: 0 };
        for (const s of this.allSandboxes()) counts[s.state] = (counts[s.state] ?? 0) + 1;
        return Object.entries(counts).map(([state, value]) => ({ labels: { state }, value }));
      }),
    );
    const phaseSeconds = this.metrics.register(
      new Histogram('collimate_lifecycle_phase_seconds', 'Where a create, fork, suspend or resume spends its time, by operation and phase (src/sandboxes/phases.ts).'),
    );
    this.onPhases = (r: PhaseReport) => {
      for (const [phase, ms] of Object.entries(r.phases)) phaseSeconds.observe(ms / 1000, { op: r.op, phase });
      phaseSeconds.observe(r.totalMs / 1000, { op: r.op, phase: 'total' });
    };
    this.metrics.register(
      new Gauge('collimate_restores_total', 'Guest restores (creates, fork children, resumes, warm-pool refills) by whether the guest acknowledged; an unacknowledged one is retried with a fresh VMM where it can be.', () => {
        const c = this.engine.restoreCounts?.();
        return c ? [{ labels: { outcome: 'acknowledged' }, value: c.acknowledged }, { labels: { outcome: 'unacknowledged' }, value: c.unacknowledged }] : [];
      }),
    );
    this.metrics.register(
      new Gauge('collimate_pool_size', 'Warm pool size by template (when the engine reports it).', () =>
        Object.entries(this.engine.poolSizes?.() ?? {}).map(([template, value]) => ({ labels: { template }, value })),
      ),
    );

    this.metrics.register(
      new Gauge('collimate_pool_target', 'The size each warm pool holds now (it follows demand: the largest burst of creates since it was last idle, within COLLIMATE_POOL_MIN/MAX and COLLIMATE_POOL_MEMORY_MIB; /healthz says why).', () =>
        Object.entries(this.engine.poolStatus?.() ?? {}).map(([template, s]) => ({ labels: { template }, value: s.target })),
      ),
    );
    this.metrics.register(
      new Gauge('collimate_pool_takes_total', 'Creates by template: served by a warm VMM (hit) or made on the create path (miss).', () =>
        Object.entries(this.engine.poolStatus?.() ?? {}).flatMap(([template, s]) => [
          { labels: { template, outcome: 'hit' }, value: s.hits },
          { labels: { template, outcome: 'miss' }, value: s.misses },
        ]),
      ),
    );
    const host = this.engine;
    if (host.capacity) {
      const cap = () => host.capacity!();
      this.metrics.register(
        new Gauge('collimate_host_memory_bytes', 'Host memory for admission: available (MemAvailable), reserve (COLLIMATE_HOST_MEMORY_RESERVE_MIB), committed (guest memory of running sandboxes), limit (COLLIMATE_HOST_MEMORY_MIB, when set).', () => {
          const m = cap().memory;
          const mib = (n: number) => n * 1024 * 1024;
          return [
            { labels: { kind: 'available' }, value: mib(m.availableMib) },
            { labels: { kind: 'reserve' }, value: mib(m.reserveMib) },
            { labels: { kind: 'committed' }, value: mib(m.committedMib) },
            ...(m.limitMib !== null ? [{ labels: { kind: 'limit' }, value: mib(m.limitMib) }] : []),
          ];
        }),
      );
      this.metrics.register(
        new Gauge('collimate_host_cpu_pressure', 'Percent of the last 10 s some task waited for a CPU (PSI), and the level at which new sandboxes are refused (COLLIMATE_HOST_CPU_PRESSURE_MAX).', () => {
          const c = cap().cpu;
          return [
            ...(c.pressure !== null ? [{ labels: { kind: 'now' }, value: c.pressure }] : []),
            ...(c.max !== null ? [{ labels: { kind: 'max' }, value: c.max }] : []),
          ];
        }),
      );
      this.metrics.register(
        new Gauge('collimate_host_storage_bytes', 'Free space where sandboxes write, and the reserve admission keeps: tmpfs (RAM files; COLLIMATE_TMPFS_RESERVE_MIB) and disk (the home: layers, snapshots; COLLIMATE_DISK_RESERVE_MIB).', () => {
          const c = cap();
          const mib = (n: number) => n * 1024 * 1024;
          return (['tmpfs', 'disk'] as const).flatMap((resource) => [
            { labels: { resource, kind: 'free' }, value: mib(c[resource].freeMib) },
            { labels: { resource, kind: 'reserve' }, value: mib(c[resource].reserveMib) },
          ]);
        }),
      );
      this.metrics.register(
        new Gauge('collimate_host_claims', 'Host-wide claims each VMM takes one of: VMM uids (COLLIMATE_VMM_UID_BASE/COUNT) and network indexes (COLLIMATE_NET_TRANSIT), free and in all.', () =>
          Object.entries(cap().claims).flatMap(([resource, c]) => [
            { labels: { resource, kind: 'free' }, value: c.free },
            { labels: { resource, kind: 'total' }, value: c.total },
          ])),
      );
      this.metrics.register(
        new Gauge('collimate_admission_refusals_total', 'Creates, forks, resumes and suspends refused with host_at_capacity, by the resource that was short.', () =>
          Object.entries(cap().refusals).map(([resource, value]) => ({ labels: { resource }, value }))),
      );
    }
    const idle = this.engine;
    if (idle.idlePauses) {
      this.metrics.register(
        new Gauge('collimate_idle_paused', 'Sandboxes paused by the host for being quiescent (COLLIMATE_IDLE_PAUSE_SECS): paused now, and pauses and wake-ups since start.', () => {
          const c = idle.idlePauses!();
          return [{ labels: { kind: 'now' }, value: c.pausedNow }, { labels: { kind: 'pauses_total' }, value: c.paused }, { labels: { kind: 'wakes_total' }, value: c.woken }];
        }),
      );
    }
    this.metrics.register(
      new Gauge('collimate_fork_receivers', 'VMMs spawned ahead of forks by artifact: ready now, and the number the pool keeps (the largest recent fork, capped by COLLIMATE_FORK_POOL_MAX).', () =>
        Object.entries(this.engine.forkReceiverSizes?.() ?? {}).flatMap(([artifact, s]) => [
          { labels: { artifact: artifact.slice(0, 12), kind: 'ready' }, value: s.ready },
          { labels: { artifact: artifact.slice(0, 12), kind: 'target' }, value: s.target },
        ]),
      ),
    );

    // The engine emits a `transition` for every acknowledged state change, the reaper's included;
    // metering from those is exact. Without events the reconcile timer catches up.
    const emitter = this.engine;
    if (emitter.on) {
      emitter.on('transition', this.onTransition);
      emitter.on('phases', this.onPhases);
    }
    this.reconcile();
    const period = opts.reconcileIntervalMs ?? (emitter.on ? 60_000 : 10_000);
    if (period > 0) this.timers.push(setInterval(() => this.reconcile(), period));
    this.timers.push(setInterval(() => this.idempotency.prune?.(), 60 * 60 * 1000));
    this.timers.forEach((t) => t.unref());
  }

  // ---- who acts --------------------------------------------------------------------------------

  /** The scope of an API key; `unauthorized` when it is missing, unknown or revoked. */
  async authenticate(key: string | undefined): Promise<Scope> {
    if (!key) throw new CollimateError('unauthorized', 'Missing API key. Send Authorization: Bearer <key> (create one with `collimate keys create`).');
    await this.keys.load(key);
    const p = this.keys.authenticate(key);
    if (!p) throw new CollimateError('unauthorized', 'Invalid or revoked API key.');
    return { tenant: p.tenant, tier: p.tier };
  }

  // ---- the tenant's account ----------------------------------------------------------------------

  /** The tenant's keys that are not revoked (records only; the keys themselves are never kept). */
  async ownKeys(scope: Scope): Promise<KeyRecord[]> {
    return this.accountKeys.list({ tenant: scope.tenant });
  }

  /** A new key of the same tenant, under its current tier (a key cannot change its own tier). */
  async createOwnKey(scope: Scope, name?: string): Promise<{ key: string; record: KeyRecord }> {
    const { key, record } = await this.accountKeys.create({ tenant: scope.tenant, ...(name === undefined ? {} : { name }) });
    return { key, record };
  }

  /** Revokes one of the tenant's keys by id; another tenant's key is as unknown as one that never was. */
  async revokeOwnKey(scope: Scope, keyId: string): Promise<void> {
    const rec = await this.accountKeys.get(keyId);
    if (!rec || rec.tenant !== scope.tenant || rec.revoked_at !== null) {
      throw new CollimateError('not_found', `No key ${JSON.stringify(keyId.slice(0, 100))} of yours; list them with GET /v1/keys.`);
    }
    await this.accountKeys.revoke(keyId);
  }

  /**
   * Live use of the tenant's running sandboxes on the host: their VMM's resident memory, and CPU as
   * a percentage of one core since the previous reading (null on the first, or after a resume
   * started a new VMM). An engine that cannot tell (a fake) reports none.
   */
  async liveStats(scope: Scope): Promise<LiveStat[]> {
    const here = this.liveStatsHere(scope.tenant);
    const others = (await this.clusterReadings?.otherHostsStats(scope.tenant)) ?? [];
    return [...here, ...others].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /** liveStats of the tenant's sandboxes running on this host (what a cluster peer asks this host for). */
  liveStatsHere(tenant: string): LiveStat[] {
    const scope = { tenant };
    const engine = this.engine;
    if (!engine.vmmUsage) return [];
    const running = this.engine.list({ state: 'running', limit: 1000 }, scope).sandboxes.filter((s) => s.tenant === scope.tenant);
    const usage = engine.vmmUsage(running.map((s) => s.id));
    const now = this.now();
    const out: Array<{ id: string; cpuPercent: number | null; memoryMib: number }> = [];
    for (const [id, u] of usage) {
      const prev = this.cpuSamples.get(id);
      this.cpuSamples.set(id, { atMs: now, cpuSecs: u.cpuSecs });
      const dt = prev ? (now - prev.atMs) / 1000 : 0;
      const used = prev ? u.cpuSecs - prev.cpuSecs : -1;
      out.push({ id, cpuPercent: dt > 0 && used >= 0 ? Math.round((used / dt) * 1000) / 10 : null, memoryMib: Math.round(u.rssBytes / 1048576) });
    }
    return out;
  }

  /** The tier's limits and how many of the tenant's sandboxes run now. */
  async limits(scope: Scope): Promise<{ tier: Tier; running: number }> {
    return { tier: scope.tier, running: await this.placement.running(scope.tenant) };
  }

  /**
   * Calls `listener` with every persisted change of state of the tenant's own sandboxes, until the
   * returned unsubscribe is called. An engine without events (a fake) never calls it.
   */
  watchSandboxes(scope: Scope, listener: (t: SandboxTransition) => void): () => void {
    if (this.sandboxEvents) return this.sandboxEvents(scope.tenant, listener);
    const watcher = (t: SandboxTransition) => {
      if (t.tenant === scope.tenant) listener(t);
    };
    this.sandboxWatchers.add(watcher);
    return () => this.sandboxWatchers.delete(watcher);
  }

  // ---- templates and images --------------------------------------------------------------------

  /** The catalog, which every tier may create from. */
  /**
   * The scope of whoever holds a sandbox's access token (E2B's envd token, PortUrlSigner.sandboxToken):
   * its tenant, under the tenant's tier. 401 for a wrong token or an unknown sandbox alike, so a
   * token-less caller learns nothing about which ids exist.
   */
  async sandboxScope(id: string, token: string): Promise<Scope> {
    const refused = () => new CollimateError('unauthorized', 'The sandbox access token (X-Access-Token) is missing or wrong; use the envdAccessToken the create or connect answered.');
    if (!token || !/^sbx_[0-9a-f]{12}$/.test(id) || !this.signer.verifySandboxToken(id, token)) throw refused();
    const tenant = await this.placement.tenantOf(id);
    if (tenant === null) throw sandboxNotFound(id);
    const tier = await this.keys.findTier(tenant);
    if (!tier) throw refused();
    return { tenant, tier };
  }

  /**
   * The running sandbox whose access token `matches` accepts, with its scope; null if none does.
   * For E2B's signed file URLs, which name no sandbox: a signature is a hash over the token, so the
   * only way to find its sandbox is to try each running one (a hash per sandbox, cheap next to a VM).
   */
  async sandboxByToken(matches: (id: string, token: string) => boolean): Promise<{ id: string; scope: Scope } | null> {
    for (const id of await this.placement.runningIds()) {
      const token = this.signer.sandboxToken(id);
      if (matches(id, token)) return { id, scope: await this.sandboxScope(id, token) };
    }
    return null;
  }

  catalog(scope: Scope): TemplateInfo[] {
    return this.engine.templates(scope).filter((t) => t.kind === 'catalog');
  }

  /** The catalog and the tenant's environments, baked or not. */
  templates(scope: Scope): TemplateInfo[] {
    const baked = this.engine.templates(scope);
    const unbaked = (this.images?.templateInfos(scope.tenant) ?? []).filter((t) => !t.ready && !baked.some((b) => b.kind === 'environment' && b.id === t.id));
    return [...baked, ...unbaked];
  }

  template(scope: Scope, id: string): TemplateInfo {
    if (this.unbakedEnvironment(scope, id)) return this.images!.templateInfos(scope.tenant).find((t) => t.id === id)!;
    return this.engine.template(id, scope);
  }

  ownImages(scope: Scope): ImageRow[] {
    return this.images?.images(scope.tenant) ?? [];
  }

  async pullImage(scope: Scope, source: SourceSpec): Promise<ImageRow> {
    requireOwnImages(scope, 'register images');
    return this.imagesOrThrow().pull(scope.tenant, source);
  }

  image(scope: Scope, id: string): ImageRow {
    return this.imagesOrThrow().image(scope.tenant, id);
  }

  deleteImage(scope: Scope, id: string): void {
    this.imagesOrThrow().deleteImage(scope.tenant, id);
  }

  async createEnvironment(scope: Scope, spec: EnvironmentSpec): Promise<EnvironmentRow> {
    requireOwnImages(scope, 'create environments');
    if (this.clusterReadings && !this.images?.repo.getEnv(scope.tenant, spec.name) && (await this.clusterReadings.environmentElsewhere(scope.tenant, spec.name, false))) {
      throw new CollimateError('conflict', `Environment ${spec.name} exists; DELETE /v1/environments/${spec.name} first to replace it.`);
    }
    const tier = scope.tier;
    if ((spec.vcpus ?? 1) > tier.maxVcpus || (spec.memoryMib ?? 256) > tier.maxMemoryMib) {
      throw new CollimateError('tier_forbidden', `The ${tier.name} tier allows at most ${tier.maxVcpus} vCPUs and ${tier.maxMemoryMib} MiB per environment.`);
    }
    const row = this.imagesOrThrow().createEnvironment(scope.tenant, spec);
    await this.clusterReadings?.environmentsWritten();
    return row;
  }

  async environments(scope: Scope): Promise<EnvironmentRow[]> {
    if (this.clusterReadings) return this.clusterReadings.environments(scope.tenant);
    return this.images?.environments(scope.tenant) ?? [];
  }

  /**
   * One of the tenant's environments. On a cluster host, one another host made is as that host last
   * recorded it; `fromItsHost` (its bake log) asks that host, and needs it to answer.
   */
  async environment(scope: Scope, name: string, opts: { fromItsHost?: boolean } = {}): Promise<EnvironmentRow> {
    const here = this.images?.repo.getEnv(scope.tenant, name);
    if (here || !this.clusterReadings) return this.imagesOrThrow().environment(scope.tenant, name);
    const elsewhere = await this.clusterReadings.environmentElsewhere(scope.tenant, name, opts.fromItsHost === true);
    if (!elsewhere) return this.imagesOrThrow().environment(scope.tenant, name); // environment_not_found, in its words
    return elsewhere;
  }

  async deleteEnvironment(scope: Scope, name: string): Promise<void> {
    if (this.clusterReadings && !this.images?.repo.getEnv(scope.tenant, name) && (await this.clusterReadings.deleteEnvironmentElsewhere(scope.tenant, name))) return;
    await this.imagesOrThrow().deleteEnvironment(scope.tenant, name);
    await this.clusterReadings?.environmentsWritten();
  }

  // ---- reads -----------------------------------------------------------------------------------

  /** The host that runs the tenant's sandbox `id` (sandbox_not_found for ids the tenant does not have). */
  private where(scope: Scope, id: string): Promise<SandboxHost> {
    return this.placement.locate(scope.tenant, id);
  }

  /** One sandbox as last observed (ports as last read). Other tenants' ids read as not found. */
  async get(scope: Scope, id: string): Promise<SandboxInfo> {
    const info = await (await this.where(scope, id)).get(id, scope);
    // Belt and braces against an engine that leaks across tenants.
    if (info.tenant !== scope.tenant) throw sandboxNotFound(id);
    return info;
  }

  /**
   * One sandbox with its listening ports read now. A failed reading keeps the last one: a port list
   * is not worth failing the read for.
   */
  async inspect(scope: Scope, id: string): Promise<SandboxInfo> {
    const host = await this.where(scope, id);
    const info = await host.get(id, scope);
    if (info.tenant !== scope.tenant) throw sandboxNotFound(id);
    if (info.state !== 'running') return info;
    let ports: OpenPort[];
    try {
      ports = await host.openPorts(id, scope);
    } catch (err) {
      if (err instanceof CollimateError && err.code === 'sandbox_not_found') throw err;
      this.log(err, `reading the open ports of ${id} failed`);
      return info;
    }
    return { ...info, ports };
  }

  list(scope: Scope, filter: ListFilter): Promise<{ sandboxes: SandboxInfo[]; next: string | null }> {
    return this.placement.list(scope.tenant, filter);
  }

  /** Throws invalid_state unless the sandbox is running (for callers that must know before they start streaming). */
  async requireRunning(scope: Scope, id: string, operation: string): Promise<SandboxInfo> {
    const info = await this.get(scope, id);
    if (info.state !== 'running') throw invalidState(id, info.state, operation, ['running']);
    return info;
  }

  // ---- lifecycle -------------------------------------------------------------------------------

  async create(scope: Scope, input: CreateInput): Promise<SandboxInfo> {
    const tier = scope.tier;
    const unbaked = tier.ownImages ? this.unbakedEnvironment(scope, input.template) : undefined;
    if (unbaked) {
      throw new CollimateError(
        'template_not_ready',
        `Environment ${input.template} is ${unbaked.state}${unbaked.error ? ` (${unbaked.error})` : ''}; create sandboxes from it once GET /v1/environments/${input.template} shows state ready.`,
        unbaked.state === 'failed' ? {} : { retryAfterSecs: 10 },
      );
    }
    // A tier limited to the catalog gets 403 for anything else, whether or not such a template exists.
    const inCatalog = this.catalog(scope).some((t) => t.id === input.template);
    const tpl = !tier.ownImages && !inCatalog ? null : await this.templateToCreate(scope, input.template);
    if (!tpl || (tpl.kind !== 'catalog' && !tier.ownImages)) {
      throw new CollimateError(
        'template_forbidden',
        `Template ${input.template} is not in the catalog; the ${tier.name} tier can only create from catalog images (GET /v1/images, or list_images over MCP). Upgrade to Pro to use your own images.`,
      );
    }
    if (input.timeoutSecs !== undefined && input.timeoutSecs > tier.maxSessionSecs) {
      throw new CollimateError('tier_forbidden', `timeout_secs ${input.timeoutSecs} exceeds the ${tier.name} tier's maximum session of ${tier.maxSessionSecs} s.`);
    }
    const egress = this.effectiveEgress(tpl, input.egress);
    const timeoutSecs = input.timeoutSecs ?? tier.defaultSessionSecs ?? undefined;
    const opts = { template: input.template, labels: input.labels ?? {}, ...(timeoutSecs === undefined ? {} : { timeoutSecs }), ...(egress === undefined ? {} : { egress }) };
    return this.placement.start({ tenant: scope.tenant, tier, slots: 1, operation: 'create', template: input.template }, async (host) => {
      const stop = this.createSeconds.startTimer();
      const info = await host.create(opts, scope);
      stop();
      return info;
    });
  }

  /** The template a create names: this host's, else (a cluster) a tenant's environment another host made. */
  private async templateToCreate(scope: Scope, id: string): Promise<TemplateInfo> {
    try {
      return this.engine.template(id, scope);
    } catch (err) {
      const elsewhere = err instanceof CollimateError && err.code === 'template_not_found' ? await this.clusterReadings?.template(scope.tenant, id) : undefined;
      if (elsewhere) return elsewhere;
      throw err;
    }
  }

  async exec(scope: Scope, id: string, req: ExecRequest, stream?: ExecStreamHandlers): Promise<ExecResult> {
    const host = await this.where(scope, id);
    const stop = this.execSeconds.startTimer();
    const r = await host.exec(id, req, scope, stream);
    stop();
    return r;
  }

  /** The sandbox's recent execs, newest first (execs that never started, e.g. refused, are not listed). */
  async recentExecs(scope: Scope, id: string, limit?: number): Promise<ExecLogEntry[]> {
    const host = await this.where(scope, id);
    await host.get(id, scope);
    return host.recentExecs(id, limit, scope);
  }

  /**
   * Live fork of a running sandbox, or fork of a suspended one (it stays suspended; the children run
   * and keep its processes). Every child takes a slot of the tier's cap.
   */
  async fork(scope: Scope, id: string, input: ForkInput): Promise<SandboxInfo[]> {
    const count = input.count;
    const problem = forkCountProblem(count);
    if (problem) throw new CollimateError('validation_error', problem);
    const parent = await this.get(scope, id);
    if (parent.state !== 'running' && parent.state !== 'suspended') throw invalidState(id, parent.state, 'fork', ['running', 'suspended']);
    return this.placement.start({ tenant: scope.tenant, tier: scope.tier, slots: count, operation: `fork of ${count}`, near: id }, async (host) => {
      const stop = this.forkSeconds.startTimer({ count: String(count) });
      const children = await host.fork(id, { count, labels: input.labels }, scope);
      stop();
      return children;
    });
  }

  async suspend(scope: Scope, id: string): Promise<SandboxInfo> {
    return (await this.where(scope, id)).suspend(id, scope);
  }

  async resume(scope: Scope, id: string): Promise<SandboxInfo> {
    const cur = await this.get(scope, id);
    // Checked before a slot is taken: resuming a running sandbox is invalid_state, not concurrency_limit.
    if (cur.state !== 'suspended') throw invalidState(id, cur.state, 'resume', ['suspended']);
    return this.placement.start({ tenant: scope.tenant, tier: scope.tier, slots: 1, operation: 'resume', near: id }, (host) => host.resume(id, scope));
  }

  /**
   * A lease: ends a running sandbox's session `timeoutSecs` from now, earlier or later than before.
   * The tier's maximum session still counts from the session's start (create, fork or resume), so a
   * lease past it is tier_forbidden, saying how much is left (`max_timeout_secs`) rather than
   * silently cut short. Only while running: a suspended sandbox's session ended, and a resume starts
   * a new one of timeout_secs (invalid_state).
   */
  async setTimeout(scope: Scope, id: string, timeoutSecs: number): Promise<SandboxInfo> {
    // Checked here too: in-process callers (the RL local fleet) do not go through a schema.
    if (!Number.isInteger(timeoutSecs) || timeoutSecs < 1) throw new CollimateError('validation_error', `timeout_secs must be a whole number of seconds, at least 1 (got ${timeoutSecs}).`);
    const host = await this.where(scope, id);
    const info = await host.get(id, scope);
    if (info.state !== 'running') throw invalidState(id, info.state, 'setting its timeout', ['running']);
    const tier = scope.tier;
    const now = this.now();
    const startedMs = Date.parse(info.session_started_at);
    const latestEnd = startedMs + tier.maxSessionSecs * 1000;
    const endsAt = now + timeoutSecs * 1000;
    if (endsAt > latestEnd) {
      const left = Math.max(0, Math.floor((latestEnd - now) / 1000));
      throw new CollimateError(
        'tier_forbidden',
        `timeout_secs ${timeoutSecs} would run sandbox ${id}'s session past the ${tier.name} tier's maximum session of ${tier.maxSessionSecs} s, ` +
          `counted from its start at ${info.session_started_at}: ` +
          (left >= 1 ? `${left} s of it are left, so ask for at most ${left}.` : 'none of it is left; suspend and resume the sandbox to start a new session.'),
        { details: { max_session_secs: tier.maxSessionSecs, max_timeout_secs: left } },
      );
    }
    // Only while running: the engine refuses the new end otherwise (a suspend in between is invalid_state).
    return host.setSessionEnd(id, endsAt, scope);
  }

  async delete(scope: Scope, id: string): Promise<void> {
    await (await this.where(scope, id)).delete(id, scope);
  }

  async readFile(scope: Scope, id: string, path: string): Promise<Buffer> {
    return (await this.where(scope, id)).readFile(id, path, scope);
  }

  async writeFile(scope: Scope, id: string, path: string, data: Buffer, mode?: number): Promise<void> {
    await (await this.where(scope, id)).writeFile(id, path, data, scope, mode);
  }

  // ---- background processes ---------------------------------------------------------------------
  // A start takes its turn in the sandbox's FIFO like an exec; the rest never waits behind one.

  async startProcess(scope: Scope, id: string, req: ProcessStartRequest): Promise<ProcessInfo> {
    return (await this.where(scope, id)).startProcess(id, req, scope);
  }

  async listProcesses(scope: Scope, id: string): Promise<ProcessInfo[]> {
    return (await this.where(scope, id)).listProcesses(id, scope);
  }

  async getProcess(scope: Scope, id: string, pid: number): Promise<ProcessInfo> {
    return (await this.where(scope, id)).getProcess(id, pid, scope);
  }

  async watchProcessOutput(scope: Scope, id: string, pid: number, from: 'start' | 'now' | number, listener: (e: ProcessEvent) => void): Promise<() => void> {
    return (await this.where(scope, id)).watchProcessOutput(id, pid, from, listener, scope);
  }

  async writeProcessStdin(scope: Scope, id: string, pid: number, data: AsyncIterable<Buffer> | Buffer): Promise<number> {
    return (await this.where(scope, id)).writeProcessStdin(id, pid, data, scope);
  }

  async closeProcessStdin(scope: Scope, id: string, pid: number): Promise<void> {
    return (await this.where(scope, id)).closeProcessStdin(id, pid, scope);
  }

  async signalProcess(scope: Scope, id: string, pid: number, signal: string | number): Promise<void> {
    return (await this.where(scope, id)).signalProcess(id, pid, signal, scope);
  }

  async resizeProcess(scope: Scope, id: string, pid: number, cols: number, rows: number): Promise<void> {
    return (await this.where(scope, id)).resizeProcess(id, pid, cols, rows, scope);
  }

  async waitProcess(scope: Scope, id: string, pid: number, timeoutSecs: number): Promise<ProcessInfo> {
    return (await this.where(scope, id)).waitProcess(id, pid, timeoutSecs, scope);
  }

  // ---- files and directories -------------------------------------------------------------------
  // Paths are guest paths, absolute or relative to /root. Only while running; a paused sandbox wakes.

  async fsStat(scope: Scope, id: string, path: string): Promise<FileEntry> {
    return (await this.where(scope, id)).fsStat(id, path, scope);
  }

  /** Whether anything (a file, directory, symlink…) is at `path`; a file in the way above it counts as nothing. */
  async fsExists(scope: Scope, id: string, path: string): Promise<boolean> {
    try {
      await this.fsStat(scope, id, path);
      return true;
    } catch (e) {
      if (e instanceof CollimateError && (e.code === 'file_not_found' || e.code === 'not_a_directory')) return false;
      throw e;
    }
  }

  async fsList(scope: Scope, id: string, path: string, depth = 1): Promise<DirListing> {
    return (await this.where(scope, id)).fsList(id, path, depth, scope);
  }

  async fsMkdir(scope: Scope, id: string, path: string, mode?: number): Promise<{ created: boolean; entry: FileEntry }> {
    return (await this.where(scope, id)).fsMkdir(id, path, mode, scope);
  }

  async fsRemove(scope: Scope, id: string, path: string): Promise<{ removed: number }> {
    return (await this.where(scope, id)).fsRemove(id, path, scope);
  }

  async fsRename(scope: Scope, id: string, from: string, to: string): Promise<FileEntry> {
    return (await this.where(scope, id)).fsRename(id, from, to, scope);
  }

  async fsWatch(scope: Scope, id: string, path: string, recursive: boolean, handlers: WatchHandlers): Promise<DirWatch> {
    return (await this.where(scope, id)).fsWatch(id, path, recursive, handlers, scope);
  }

  /** Streams a file of any size (up to the server's download limit) to `sink`. */
  async downloadFile(scope: Scope, id: string, path: string, sink: FileSink): Promise<{ size: number }> {
    return (await this.where(scope, id)).downloadFile(id, path, sink, scope);
  }

  /** Streams `source` into a file, replacing it whole once complete (payload_too_large past `opts.maxBytes`). */
  async uploadFile(scope: Scope, id: string, path: string, source: AsyncIterable<Buffer | Uint8Array | string>, opts: UploadOptions = {}): Promise<FileEntry & { bytes: number }> {
    return (await this.where(scope, id)).uploadFile(id, path, source, opts, scope);
  }

  // ---- ports -----------------------------------------------------------------------------------

  /** A signed URL token for a sandbox port: anyone holding it reaches the port until it expires. */
  async portUrl(scope: Scope, id: string, port: number, expiresInSecs = DEFAULT_PORT_URL_SECS): Promise<PortUrl> {
    await this.get(scope, id);
    const expiresAt = Math.floor(this.now() / 1000) + expiresInSecs;
    return { token: this.signer.sign({ sandboxId: id, port, expiresAt }), port, expiresAt };
  }

  /** Where the proxy connects for a tenant's request to a port (invalid_state unless running). */
  async portTarget(scope: Scope, id: string, port: number): Promise<ResolvedPort> {
    return { sandboxId: id, port, target: await (await this.where(scope, id)).portTarget(id, port, scope) };
  }

  /** Where the proxy connects for a signed URL (unauthorized when the token is bad or expired). */
  async signedPortTarget(token: string): Promise<ResolvedPort> {
    const grant = this.signer.verify(token);
    const tenant = await this.placement.tenantOf(grant.sandboxId);
    if (tenant === null) throw sandboxNotFound(grant.sandboxId);
    const scope = { tenant };
    return { sandboxId: grant.sandboxId, port: grant.port, target: await (await this.placement.locate(tenant, grant.sandboxId)).portTarget(grant.sandboxId, grant.port, scope) };
  }

  // ---- idempotency and usage -------------------------------------------------------------------

  /**
   * Runs `exec` once per (tenant, key): a retry with the same key and fingerprint gets the stored
   * response back (`replayed`), a different request under a used key idempotency_key_reused.
   */
  idempotent(scope: Scope, key: string, fingerprint: string, exec: () => Promise<StoredResponse>): Promise<StoredResponse & { replayed: boolean }> {
    return this.idempotency.run(scope.tenant, key, fingerprint, exec);
  }

  async usage(scope: Scope, fromMs: number, toMs: number, opts: { perDay?: boolean } = {}): Promise<UsageReport> {
    checkUsageRange(fromMs, toMs, opts);
    if (this.clusterReadings) return this.clusterReadings.usage(scope.tenant, fromMs, toMs, opts);
    return this.meter.usage(scope.tenant, fromMs, toMs, opts);
  }

  /** Brings the meter in line with the engine's current sandboxes. */
  reconcile(): void {
    try {
      this.meter.reconcile(this.allSandboxes() as MeteredSandboxInfo[]);
    } catch (err) {
      this.log(err, 'metering reconcile failed');
    }
  }

  /** Stops the background work (a last reconcile included). Does not close the engine. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.timers.forEach(clearInterval);
    const emitter = this.engine;
    if (emitter.off) {
      emitter.off('transition', this.onTransition);
      emitter.off('phases', this.onPhases);
    }
    this.reconcile();
  }

  // ---- rules -----------------------------------------------------------------------------------

  /** The template's policy, or the asked one if it is the same or narrower. */
  private effectiveEgress(t: TemplateInfo, raw: EgressInput | undefined): EgressPolicy | undefined {
    // Normalised here too: in-process callers (the RL local fleet) do not go through a schema.
    const asked = raw === undefined ? undefined : parseEgress(raw);
    if (!t.network) {
      if (asked !== undefined && asked !== 'none') {
        throw new CollimateError('network_unavailable', `This server runs without networking (${this.networkReason()}), so sandboxes have no egress; create without egress or with "none".`);
      }
      return 'none';
    }
    if (asked === undefined) return undefined;
    const wider = widening(asked, t.egress);
    if (wider) throw new CollimateError('egress_forbidden', `The egress policy is wider than template ${t.id}'s: ${wider}. A sandbox may only narrow its environment's policy.`);
    return asked;
  }

  private networkReason(): string {
    const net = this.engine.networkStatus?.();
    return net?.reason ?? (net?.enabled ? "its template was baked without a network" : 'networking is off');
  }

  /** An environment the image service knows but the engine has not (yet) registered. */
  private unbakedEnvironment(scope: Scope, id: string): EnvironmentRow | undefined {
    const env = this.images?.repo.getEnv(scope.tenant, id);
    return env && env.state !== 'ready' ? env : undefined;
  }

  private imagesOrThrow(): ImageService {
    if (!this.images) throw new CollimateError('not_found', 'This server runs without an image service.');
    return this.images;
  }

  private observe(info: SandboxInfo): void {
    try {
      this.meter.observe(info as MeteredSandboxInfo);
    } catch (err) {
      this.log(err, 'metering failed'); // metering must never fail a request
    }
  }

  private meterTransition(ev: Transition): void {
    try {
      if (ev.state === 'deleted') this.meter.deleted(ev.id);
      else this.meter.observe({ ...this.engine.get(ev.id), ...(ev.snapshotBytes === undefined ? {} : { snapshot_bytes: ev.snapshotBytes }) });
    } catch (err) {
      this.log(err, 'metering a transition failed');
    }
  }

  private allSandboxes(): SandboxInfo[] {
    const out: SandboxInfo[] = [];
    let after: string | undefined;
    for (let page = 0; page < 10_000; page++) {
      const r = this.engine.list({ limit: 1000, after });
      out.push(...r.sandboxes);
      if (!r.next || r.sandboxes.length === 0) break;
      after = r.next;
    }
    return out;
  }
}

function requireOwnImages(scope: Scope, what: string): void {
  if (!scope.tier.ownImages) {
    throw new CollimateError('tier_forbidden', `The ${scope.tier.name} tier cannot ${what}; it creates from catalog images only (GET /v1/images). Upgrade to Pro to bring your own images.`);
  }
}
