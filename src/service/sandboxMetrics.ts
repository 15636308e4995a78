/**
 * Each sandbox's resource use over time, sampled on the host that runs it (E2B's getMetrics time
 * series, GET /v1/sandboxes/{id}/metrics): every SAMPLE_MS, the CPU share and resident memory of
 * every running sandbox's VMM (engine.vmmUsage). A sandbox keeps its last KEEP samples for its life
 * (12 hours at one every 5 s); a suspended one gains none while suspended; a deleted one's go with it.
 * Kept in memory: a server restart starts the series anew.
 */
import type { ServiceEngine } from '../sandboxes/types.js';

export const SAMPLE_MS = 5000;
const KEEP = (12 * 3600 * 1000) / SAMPLE_MS;

export interface MetricSample {
  /** Unix milliseconds. */
  atMs: number;
  /** Of the sandbox's vCPUs together (100 = one vCPU busy); null for a sandbox's first sample. */
  cpuPercent: number | null;
  /** Resident memory of its VMM, MiB. */
  memoryMib: number;
}

export class SandboxMetrics {
  private readonly series = new Map<string, MetricSample[]>();
  private readonly last = new Map<string, { atMs: number; cpuSecs: number }>();

  constructor(private readonly engine: ServiceEngine, private readonly now: () => number) {}

  /** One sample of every running sandbox on this host. */
  sample(): void {
    if (!this.engine.vmmUsage) return;
    this.record(runningHere(this.engine));
  }

  private record(ids: readonly string[]): void {
    const now = this.now();
    for (const [id, u] of this.engine.vmmUsage!(ids)) {
      const prev = this.last.get(id);
      this.last.set(id, { atMs: now, cpuSecs: u.cpuSecs });
      const dt = prev ? (now - prev.atMs) / 1000 : 0;
      const used = prev ? u.cpuSecs - prev.cpuSecs : -1;
      const s = this.series.get(id) ?? [];
      s.push({ atMs: now, cpuPercent: dt > 0 && used >= 0 ? Math.round((used / dt) * 1000) / 10 : null, memoryMib: Math.round(u.rssBytes / 1048576) });
      if (s.length > KEEP) s.splice(0, s.length - KEEP);
      this.series.set(id, s);
    }
  }

  /**
   * The samples of `id` taken within [fromMs, toMs] (either open), oldest first. `running`: it has
   * none yet is sampled now, so a caller never waits a whole period for its first.
   */
  of(id: string, fromMs?: number, toMs?: number, running = false): MetricSample[] {
    if (running && !this.series.has(id) && this.engine.vmmUsage) this.record([id]);
    return (this.series.get(id) ?? []).filter((s) => (fromMs === undefined || s.atMs >= fromMs) && (toMs === undefined || s.atMs <= toMs));
  }

  /** Drops a deleted sandbox's samples. */
  forget(id: string): void {
    this.series.delete(id);
    this.last.delete(id);
  }
}

/** Every running sandbox's id on this host's engine, whoever's. */
export function runningHere(engine: ServiceEngine): string[] {
  const ids: string[] = [];
  let after: string | undefined;
  do {
    const page = engine.list({ state: 'running', limit: 1000, ...(after ? { after } : {}) });
    ids.push(...page.sandboxes.map((s) => s.id));
    after = page.next ?? undefined;
  } while (after);
  return ids;
}
