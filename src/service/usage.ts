/**
 * Metering and metrics, a part of the tenant service (tenantService.ts): the meter of this host's
 * sandboxes (from the engine's transitions, with a periodic reconcile), usage reports (every host's
 * on a cluster host), live stats of running sandboxes, and the Prometheus instruments.
 */
import { checkUsageRange, Meter, type MeteredSandboxInfo, type UsageReport } from './metering.js';
import { Gauge, Histogram, MetricsRegistry, type RenderOptions } from './metrics.js';
import type { PhaseReport } from '../sandboxes/phases.js';
import type { SandboxInfo, ServiceEngine } from '../sandboxes/types.js';
import type { LifecycleTimers } from './sandboxes.js';
import type { ClusterReadings, LiveStat, Scope } from './types.js';

/** A change of state as the engine reports it. */
export type Transition = { id: string; state: string; snapshotBytes?: number };

export class Usage {
  /** The service's instruments; front doors register theirs in the same registry. */
  readonly metrics = new MetricsRegistry();
  readonly timers: LifecycleTimers;
  /** Observes one lifecycle operation's phases (the engine's `phases` event). */
  readonly onPhases: (r: PhaseReport) => void;
  /** The last CPU reading of each running sandbox's VMM, for liveStats' percentages. */
  private readonly cpuSamples = new Map<string, { atMs: number; cpuSecs: number }>();

  constructor(
    private readonly engine: ServiceEngine,
    readonly meter: Meter,
    private readonly clusterReadings: ClusterReadings | undefined,
    private readonly now: () => number,
    private readonly log: (err: unknown, msg: string) => void,
  ) {
    let createSeconds!: Histogram;
    let forkSeconds!: Histogram;
    let execSeconds!: Histogram;
    createSeconds = this.metrics.register(new Histogram('collimate_create_seconds', 'Sandbox create latency (service call), every front door.'));
    execSeconds = this.metrics.register(new Histogram('collimate_exec_seconds', 'Exec latency including queueing (service call), every front door.'));
    forkSeconds = this.metrics.register(new Histogram('collimate_fork_seconds', 'Live fork latency (service call), by child count, every front door.'));
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
      new Gauge('collimate_pool_size', 'Warm pool size by template (when the engine reports it); tenants\' environments summed under template="environments" unless the scrape may see names.', (o) =>
        byTemplate(Object.entries(this.engine.poolSizes?.() ?? {}), o, (n) => [n], (t, [value]) => [{ labels: { template: t }, value }]),
      ),
    );

    this.metrics.register(
      new Gauge('collimate_pool_target', 'The size each warm pool holds now (it follows demand: the largest burst of creates since it was last idle, within COLLIMATE_POOL_MIN/MAX and COLLIMATE_POOL_MEMORY_MIB; /healthz says why).', (o) =>
        byTemplate(Object.entries(this.engine.poolStatus?.() ?? {}), o, (s) => [s.target], (t, [value]) => [{ labels: { template: t }, value }]),
      ),
    );
    this.metrics.register(
      new Gauge('collimate_pool_takes_total', 'Creates by template: served by a warm VMM (hit) or made on the create path (miss).', (o) =>
        byTemplate(Object.entries(this.engine.poolStatus?.() ?? {}), o, (s) => [s.hits, s.misses], (t, [hits, misses]) => [
          { labels: { template: t, outcome: 'hit' }, value: hits },
          { labels: { template: t, outcome: 'miss' }, value: misses },
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
    this.timers = { createSeconds, forkSeconds, execSeconds };
  }

  /** A change of state of one of this host's sandboxes: metered, and its CPU reading dropped once it stops running. */
  transition(ev: Transition): void {
    this.meterTransition(ev);
    if (ev.state !== 'running') this.cpuSamples.delete(ev.id);
  }

  async report(scope: Scope, fromMs: number, toMs: number, opts: { perDay?: boolean } = {}): Promise<UsageReport> {
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

/**
 * Pool readings by template for /metrics: catalog templates by id; tenants' environments (keyed
 * `<tenant>/<name>`) by name only when the scrape may see names, else summed under `environments`.
 */
function byTemplate<T>(
  entries: Array<[string, T]>, o: RenderOptions, values: (t: T) => number[],
  samples: (template: string, v: number[]) => Array<{ labels: Record<string, string>; value: number }>,
): Array<{ labels: Record<string, string>; value: number }> {
  const out: Array<{ labels: Record<string, string>; value: number }> = [];
  let envs: number[] | undefined;
  for (const [template, t] of entries) {
    const v = values(t);
    if (o.names || !template.includes('/')) out.push(...samples(template, v));
    else envs = envs ? envs.map((x, i) => x + v[i]) : v;
  }
  if (envs) out.push(...samples('environments', envs));
  return out;
}
