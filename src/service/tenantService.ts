/**
 * The tenant service: every rule a tenant meets, written once, in front of the engine. REST
 * (src/api), MCP (src/mcp), E2B's API and envd (src/e2b), the CLI (through REST) and the in-process
 * RL fleet (src/sdk/rl/local.ts) all call it; each of them only parses its input, makes one call here
 * and renders the result (src/wire/views.ts). Nothing here knows HTTP or MCP.
 *
 * It is put together from parts, each a file to read alone:
 * - accounts (accounts.ts): API keys and sandbox tokens → Scope, the tenant's keys, its limits;
 * - sandboxes (sandboxes.ts): every sandbox operation and its rules, over a Placement (placement.ts)
 *   that says where sandboxes live and what a start costs — this host alone, or a cluster;
 * - templates (templates.ts): the catalog, own images and environments;
 * - usage (usage.ts): metering, usage reports, live stats and the Prometheus instruments;
 * - events (events.ts): each tenant's sandbox events.
 *
 * Every call takes a Scope, always: which tenant acts and under which tier. The local RL fleet, which
 * holds the engine in its own process, passes trustedScope(tenant).
 */
import { CodeInterpreter } from './code.js';
import { dirname, join } from 'node:path';
import type { ImageService } from '../images/service.js';
import type { ReapedEvent, SandboxTransition, ServiceEngine } from '../sandboxes/types.js';
import type { Db } from '../store/db.js';
import { Accounts } from './accounts.js';
import type { Admission } from './admission.js';
import { SandboxEvents } from './events.js';
import { ExecLog } from './execLog.js';
import { IdempotencyStore } from './idempotency.js';
import { KeyStore } from './keys.js';
import { Meter } from './metering.js';
import type { MetricsRegistry } from './metrics.js';
import { applyApiMigrations } from './migrations.js';
import { LocalPlacement, type Placement } from './placement.js';
import { PortUrlSigner } from './portUrls.js';
import { localHost, type SandboxHost } from './sandboxHost.js';
import { Sandboxes } from './sandboxes.js';
import { Templates } from './templates.js';
import { QUOTA_NAMES, Quotas, type QuotaName, type QuotaOverrides } from './quotas.js';
import { SandboxGrantStore, type SandboxGrants } from './sandboxGrants.js';
import { SAMPLE_MS, SandboxMetrics } from './sandboxMetrics.js';
import { reapedLine, SandboxLog, transitionLine, type SandboxLogLine } from './sandboxLog.js';
import type { AccountKeys, ClusterReadings, IdempotencyRunner, Scope } from './types.js';
import { Usage } from './usage.js';

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
  /** The operator's quota overrides by tier or tenant (COLLIMATE_QUOTAS, quotas.ts); default the tiers' defaults. */
  quotas?: QuotaOverrides;
  /** Who each sandbox's access tokens were issued to; default the database's (a cluster host passes the cluster's). */
  sandboxGrants?: SandboxGrants;
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

export class TenantService {
  readonly accounts: Accounts;
  readonly sandboxes: Sandboxes;
  readonly templates: Templates;
  /** Per-tenant quotas (tier defaults, the operator's overrides) and what operations under way hold of them. */
  readonly quotas: Quotas;
  readonly usage: Usage;
  readonly events: SandboxEvents;
  /** Cells of code in the sandboxes' stateful kernels (the code interpreter). */
  readonly code: CodeInterpreter;

  readonly engine: ServiceEngine;
  /** The service's database; a front door with state of its own (the E2B envVars) keeps it here too. */
  readonly db: Db;
  readonly signer: PortUrlSigner;
  /** Where sandboxes live and new ones go. */
  readonly placement: Placement;
  /** This host's sandboxes (what the placement hands out for them, and what peers operate). */
  readonly here: SandboxHost;
  /** The single-host admission, when the placement is this host's alone (tests read its in-flight slots). */
  readonly admission?: Admission;
  readonly idempotency: IdempotencyRunner;
  /** Each sandbox's recent execs (what ran, exit code, duration), for GET /v1/sandboxes/{id}/execs. */
  readonly execLog: ExecLog;
  /** What happened to each sandbox on this host, for GET /v1/sandboxes/{id}/logs and E2B's logs. */
  readonly sandboxLog: SandboxLog;
  /** Where failures of background work (metering, port readings) go; settable once a logger exists. */
  log: (err: unknown, msg: string) => void;
  private readonly timers: NodeJS.Timeout[] = [];
  private readonly onTransition = (ev: SandboxTransition) => {
    this.usage.transition(ev);
    if (ev.state === 'deleted') {
      this.execLog.forget(ev.id);
      this.sandboxLog.forget(ev.id);
      this.sandboxMetrics.forget(ev.id);
      this.grants.forget(ev.id).catch((err) => this.log(err, `forgetting deleted sandbox ${ev.id}'s token grant failed`));
    } else {
      this.note(ev.tenant, ev.id, transitionLine(ev));
    }
    this.events.feed(ev);
  };
  /** A reaper's suspend is written (after the suspend's own entry); its delete took the log with it. */
  private readonly onReaped = (r: ReapedEvent) => {
    if (r.action === 'suspend') this.note(r.tenant, r.id, reapedLine(r.action));
  };
  private closed = false;
  private readonly grants: SandboxGrants;

  /** Writes an entry of sandbox `id`'s log; a failure is reported, never thrown into the engine's event. */
  private note(tenant: string, id: string, line: SandboxLogLine | undefined): void {
    if (!line) return;
    try {
      this.sandboxLog.add(tenant, id, line);
    } catch (err) {
      this.log(err, `writing sandbox ${id}'s log failed`);
    }
  }
  /** Each sandbox's resource use over time on this host (GET /v1/sandboxes/{id}/metrics, E2B's getMetrics). */
  readonly sandboxMetrics: SandboxMetrics;

  constructor(opts: TenantServiceOptions) {
    const engine = (this.engine = opts.engine);
    const now = opts.now ?? Date.now;
    this.log = opts.log ?? (() => {});
    const log = (err: unknown, msg: string) => this.log(err, msg);
    this.db = opts.db;
    applyApiMigrations(opts.db);
    const keys = opts.keys ?? new KeyStore(opts.db);
    this.idempotency = opts.idempotency ?? new IdempotencyStore(opts.db);
    this.execLog = new ExecLog(opts.db);
    this.sandboxLog = new SandboxLog(opts.db, now);
    const meter = new Meter(opts.db, now);
    this.sandboxMetrics = new SandboxMetrics(engine, now);
    this.here = localHost(engine, { execLog: this.execLog, sandboxLog: this.sandboxLog, meter, metrics: this.sandboxMetrics, now, log });
    let clusterReadings: ClusterReadings | undefined;
    if (opts.cluster) {
      const cluster = opts.cluster(this.here);
      this.placement = cluster;
      clusterReadings = cluster;
    } else {
      const local = new LocalPlacement(engine, this.here, opts.admissionWaitMs);
      this.placement = local;
      this.admission = local.admission;
    }
    const dbFile = (opts.db as { name?: string }).name;
    const keyPath = opts.portUrlKeyPath !== undefined ? opts.portUrlKeyPath : dbFile && dbFile !== ':memory:' ? join(dirname(dbFile), 'port-urls.key') : null;
    this.signer = new PortUrlSigner(keyPath, now);

    this.usage = new Usage(engine, meter, clusterReadings, now, log);
    this.quotas = new Quotas(opts.quotas);
    const placement = this.placement;
    this.templates = new Templates(engine, opts.images, clusterReadings, this.quotas, {
      all: async (tenant) => (await placement.listSnapshots(tenant, { environment: true, limit: 1000 })).snapshots,
      named: async (tenant, name) => (await placement.listSnapshots(tenant, { environment: name, limit: 1 })).snapshots[0],
    });
    this.grants = opts.sandboxGrants ?? new SandboxGrantStore(opts.db);
    this.accounts = new Accounts(keys, opts.accountKeys ?? keys, this.signer, this.placement, this.grants, this.quotas);
    this.sandboxes = new Sandboxes({
      engine, placement: this.placement, templates: this.templates, signer: this.signer, idempotency: this.idempotency, quotas: this.quotas,
      timers: this.usage.timers, clusterReadings, now, log,
    });
    this.events = new SandboxEvents(opts.sandboxEvents);
    this.code = new CodeInterpreter(this.sandboxes);

    // The engine emits a `transition` for every acknowledged state change, the reaper's included;
    // metering from those is exact. Without events the reconcile timer catches up.
    if (engine.on) {
      engine.on('transition', this.onTransition);
      engine.on('phases', this.usage.onPhases);
      engine.on('reaped', this.onReaped);
    }
    this.usage.reconcile();
    const period = opts.reconcileIntervalMs ?? (engine.on ? 60_000 : 10_000);
    if (period > 0) this.timers.push(setInterval(() => this.usage.reconcile(), period));
    this.timers.push(setInterval(() => this.idempotency.prune?.(), 60 * 60 * 1000));
    if (engine.vmmUsage) this.timers.push(setInterval(() => void this.sandboxMetrics.sample().catch((err) => this.log(err, 'sampling sandbox metrics failed')), SAMPLE_MS));
    this.timers.forEach((t) => t.unref());
  }

  /** The service's instruments; front doors register theirs in the same registry. */
  get metrics(): MetricsRegistry {
    return this.usage.metrics;
  }

  /** Each quota's limit for the scope and the tenant's use of it now (GET /v1/limits). */
  async quotaUse(scope: Scope): Promise<Record<QuotaName, { limit: number | null; used: number }>> {
    const limits = this.quotas.limits(scope);
    const suspended = await this.sandboxes.suspendedUse(scope.tenant);
    const used: Record<QuotaName, number> = {
      suspended_sandboxes: suspended.count,
      suspended_mib: suspended.mib,
      ...(await this.sandboxes.snapshotUse(scope.tenant)),
      images: this.templates.ownImages(scope).length,
      environments: (await this.templates.environments(scope)).length,
      open_streams: this.quotas.holding(scope.tenant, 'open_streams'),
      keys: (await this.accounts.ownKeys(scope)).length,
    };
    return Object.fromEntries(QUOTA_NAMES.map((n) => [n, { limit: limits[n], used: used[n] }])) as Record<QuotaName, { limit: number | null; used: number }>;
  }

  /** API keys (ApiServer.keys: tests and the CLI make them here). */
  get keys(): KeyStore {
    return this.accounts.keys;
  }

  get meter(): Meter {
    return this.usage.meter;
  }

  /** Stops the background work (a last reconcile included). Does not close the engine. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.timers.forEach(clearInterval);
    if (this.engine.off) {
      this.engine.off('transition', this.onTransition);
      this.engine.off('phases', this.usage.onPhases);
      this.engine.off('reaped', this.onReaped);
    }
    this.usage.reconcile();
  }
}
