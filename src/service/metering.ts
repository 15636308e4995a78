/**
 * Metering by state intervals. Each sandbox has at most one open interval (running or suspended) in
 * usage_intervals; a transition closes it and opens the next. Usage over [from, to) is the sum of the
 * clipped intervals × the sandbox's vCPUs / RAM / disk (running) or snapshot size (suspended).
 *
 * Transitions are observed from the tenant service's own calls (create, fork, suspend, resume, delete)
 * and from the engine's transition events at the moment they are acknowledged, and a periodic
 * reconcile against the engine's list catches the rest (a restart, an engine without events): sandboxes that appeared are opened (from created_at if
 * never seen), vanished ones are closed — at their expiry when that is earlier, since the reaper acts
 * then. The error of anything seen only by reconcile is bounded by the reconcile period.
 */
import { CollimateError } from '../errors.js';
import type { Db } from '../store/db.js';
import type { SandboxInfo } from '../sandboxes/types.js';
import { applyApiMigrations } from './migrations.js';

const MiB = 1024 * 1024;

/** The engine may report the size of a suspended sandbox's snapshot; without it we assume its RAM size. */
export type MeteredSandboxInfo = SandboxInfo & { snapshot_bytes?: number };

export interface UsageTotals {
  running_secs: number;
  vcpu_secs: number;
  memory_mib_secs: number;
  disk_mib_secs: number;
  suspended_secs: number;
  snapshot_mib_secs: number;
}

export interface UsageReport {
  from: string;
  to: string;
  totals: UsageTotals;
  sandboxes: Array<{ id: string; template: string } & UsageTotals>;
  /** With `per=day`: each UTC day's totals, oldest first. */
  days?: Array<{ from: string; to: string; totals: UsageTotals }>;
}

/** One row of usage_intervals (the cluster's copy has the same fields). */
export interface IntervalRow {
  id: number;
  tenant: string;
  sandbox: string;
  template: string;
  state: 'running' | 'suspended';
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  snapshot_bytes: number;
  expires_ms: number | null;
  start_ms: number;
  end_ms: number | null;
}

const zero = (): UsageTotals => ({ running_secs: 0, vcpu_secs: 0, memory_mib_secs: 0, disk_mib_secs: 0, suspended_secs: 0, snapshot_mib_secs: 0 });
const round3 = (x: number) => Math.round(x * 1000) / 1000;
const rounded = (t: UsageTotals): UsageTotals =>
  Object.fromEntries(Object.keys(zero()).map((k) => [k, round3(t[k as keyof UsageTotals])])) as unknown as UsageTotals;
const DAY_MS = 86_400_000;
/** The most days one report may split into (a year and a day). */
export const MAX_USAGE_DAYS = 366;

/** What `secs` of an interval in its state cost. */
function charge(r: IntervalRow, secs: number): UsageTotals {
  return r.state === 'running'
    ? { ...zero(), running_secs: secs, vcpu_secs: secs * r.vcpus, memory_mib_secs: secs * r.memory_mib, disk_mib_secs: secs * r.disk_mib }
    : { ...zero(), suspended_secs: secs, snapshot_mib_secs: (secs * r.snapshot_bytes) / MiB };
}

function addTo(into: UsageTotals[], add: UsageTotals): void {
  for (const t of into) for (const k of Object.keys(add) as (keyof UsageTotals)[]) t[k] += add[k];
}

/** [fromMs, toMs) cut at UTC midnights: the first and last days are clipped to the range. */
function dayBuckets(fromMs: number, toMs: number): Array<{ fromMs: number; toMs: number; totals: UsageTotals }> {
  const out: Array<{ fromMs: number; toMs: number; totals: UsageTotals }> = [];
  for (let a = fromMs; a < toMs; ) {
    const b = Math.min(toMs, (Math.floor(a / DAY_MS) + 1) * DAY_MS);
    out.push({ fromMs: a, toMs: b, totals: zero() });
    a = b;
  }
  return out;
}

/**
 * Usage in [fromMs, toMs) of metered intervals (an open one counts until `at`): totals and per
 * sandbox, and with `perDay` the totals of each UTC day (the first and last days clipped to the
 * range), in one pass. Shared by one host's meter and the cluster's (src/cluster/usage.ts).
 */
export function usageOfIntervals(rows: readonly IntervalRow[], fromMs: number, toMs: number, at: number, opts: { perDay?: boolean } = {}): UsageReport {
  const per = new Map<string, { id: string; template: string } & UsageTotals>();
  const totals = zero();
  const days = opts.perDay ? dayBuckets(fromMs, toMs) : undefined;
  for (const r of rows) {
    const end = Math.min(r.end_ms ?? at, toMs, at);
    const start = Math.max(r.start_ms, fromMs);
    if (end <= start) continue;
    let s = per.get(r.sandbox);
    if (!s) per.set(r.sandbox, (s = { id: r.sandbox, template: r.template, ...zero() }));
    addTo([s, totals], charge(r, (end - start) / 1000));
    if (!days) continue;
    for (let i = Math.floor(start / DAY_MS) - Math.floor(fromMs / DAY_MS); i < days.length && days[i].fromMs < end; i++) {
      const secs = (Math.min(end, days[i].toMs) - Math.max(start, days[i].fromMs)) / 1000;
      if (secs > 0) addTo([days[i].totals], charge(r, secs));
    }
  }
  const sandboxes = [...per.values()].map((s) => Object.assign(s, rounded(s)));
  return {
    from: new Date(fromMs).toISOString(),
    to: new Date(toMs).toISOString(),
    totals: rounded(totals),
    sandboxes,
    ...(days ? { days: days.map((d) => ({ from: new Date(d.fromMs).toISOString(), to: new Date(d.toMs).toISOString(), totals: rounded(d.totals) })) } : {}),
  };
}

/** A usage range a report may cover: `validation_error` saying how to fix it otherwise. */
export function checkUsageRange(fromMs: number, toMs: number, opts: { perDay?: boolean } = {}): void {
  if (!(fromMs < toMs)) throw new CollimateError('validation_error', '`from` must be before `to`.');
  if (opts.perDay && Math.floor((toMs - 1) / DAY_MS) - Math.floor(fromMs / DAY_MS) >= MAX_USAGE_DAYS) {
    throw new CollimateError('validation_error', `per=day covers at most ${MAX_USAGE_DAYS} days: narrow \`from\` and \`to\`, or ask without per=day.`);
  }
}

export class Meter {
  constructor(private readonly db: Db, private readonly now: () => number = Date.now) {
    applyApiMigrations(db);
  }

  /** Records the sandbox's current state (idempotent: observing the same state twice changes nothing). */
  observe(info: MeteredSandboxInfo, at = this.now()): void {
    this.db.transaction(() => this.observeTx(info, at))();
  }

  /** The sandbox is gone (deleted). */
  deleted(id: string, at = this.now()): void {
    this.db.prepare('UPDATE usage_intervals SET end_ms = MAX(start_ms, ?) WHERE sandbox = ? AND end_ms IS NULL').run(at, id);
  }

  /** `all`: every live sandbox of every tenant, as the service reports them now. */
  reconcile(all: MeteredSandboxInfo[], at = this.now()): void {
    this.db.transaction(() => {
      const live = new Set<string>();
      for (const info of all) {
        if (info.state === 'deleted') continue;
        live.add(info.id);
        this.observeTx(info, at);
      }
      const open = this.db.prepare('SELECT * FROM usage_intervals WHERE end_ms IS NULL').all() as IntervalRow[];
      for (const row of open) {
        if (live.has(row.sandbox)) continue;
        let end = at;
        if (row.state === 'running' && row.expires_ms !== null && row.expires_ms < at) end = Math.max(row.start_ms, row.expires_ms);
        this.db.prepare('UPDATE usage_intervals SET end_ms = ? WHERE id = ?').run(end, row.id);
      }
    })();
  }

  /**
   * Usage in [fromMs, toMs): totals and per sandbox, and with `perDay` the totals of each UTC day
   * (the first and last days clipped to the range) in one pass over the intervals.
   */
  usage(tenant: string, fromMs: number, toMs: number, opts: { perDay?: boolean } = {}): UsageReport {
    const rows = this.db
      .prepare('SELECT * FROM usage_intervals WHERE tenant = ? AND start_ms < ? AND (end_ms IS NULL OR end_ms > ?) ORDER BY sandbox, start_ms')
      .all(tenant, toMs, fromMs) as IntervalRow[];
    return usageOfIntervals(rows, fromMs, toMs, this.now(), opts);
  }

  private observeTx(info: MeteredSandboxInfo, at: number): void {
    const open = this.db.prepare('SELECT * FROM usage_intervals WHERE sandbox = ? AND end_ms IS NULL').get(info.id) as IntervalRow | undefined;
    const expires = Date.parse(info.expires_at);
    const expiresMs = Number.isFinite(expires) ? expires : null;
    if (open && open.state === info.state) {
      if (open.expires_ms !== expiresMs) this.db.prepare('UPDATE usage_intervals SET expires_ms = ? WHERE id = ?').run(expiresMs, open.id);
      return;
    }
    if (open) this.db.prepare('UPDATE usage_intervals SET end_ms = MAX(start_ms, ?) WHERE id = ?').run(at, open.id);
    if (info.state !== 'running' && info.state !== 'suspended') return;
    let start = at;
    if (!open && info.state === 'running') {
      // Never seen before (created behind our back, or before a restart): meter from its creation.
      const seen = this.db.prepare('SELECT 1 FROM usage_intervals WHERE sandbox = ? LIMIT 1').get(info.id);
      const created = Date.parse(info.created_at);
      if (!seen && Number.isFinite(created) && created < at) start = created;
    }
    this.db
      .prepare(
        `INSERT INTO usage_intervals (tenant, sandbox, template, state, vcpus, memory_mib, disk_mib, snapshot_bytes, expires_ms, start_ms)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      )
      .run(
        info.tenant,
        info.id,
        info.template,
        info.state,
        info.vcpus,
        info.memory_mib,
        info.disk_mib,
        info.state === 'suspended' ? info.snapshot_bytes ?? info.memory_mib * MiB : 0,
        expiresMs,
        start,
      );
  }
}
