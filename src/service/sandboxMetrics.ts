/**
 * Each sandbox's resource use over time, sampled on the host that runs it (E2B's getMetrics time
 * series, GET /v1/sandboxes/{id}/metrics): every SAMPLE_MS, the CPU share and resident memory of
 * every running sandbox's VMM (engine.vmmUsage, read host-side), and every DISK_SAMPLE_MS how full
 * its root file system is (engine.guestDiskUsage, asked of its guest agent; the samples between
 * carry the last reading). A sandbox keeps its last KEEP samples for its life (12 hours at one every
 * 5 s); a suspended one gains none while suspended; a deleted one's go with it. Kept in memory: a
 * server restart starts the series anew.
 */
import type { GuestDiskUsage, ServiceEngine } from '../sandboxes/types.js';

export const SAMPLE_MS = 5000;
/**
 * How often a sandbox's guest is asked how full its disk is. Unlike CPU and memory, which the host
 * reads from /proc, that is a request to the guest's agent: a few a minute cost the guest nothing
 * worth counting, and a sandbox the idle pause stopped is not asked at all (its disk stands still).
 */
export const DISK_SAMPLE_MS = 30_000;
const KEEP = (12 * 3600 * 1000) / SAMPLE_MS;

export interface MetricSample {
  /** Unix milliseconds. */
  atMs: number;
  /** Of the sandbox's vCPUs together (100 = one vCPU busy); null for a sandbox's first sample. */
  cpuPercent: number | null;
  /** Resident memory of its VMM, MiB. */
  memoryMib: number;
  /**
   * Its root file system as `df /` in the guest says it, bytes used and its size: the last reading
   * (at most DISK_SAMPLE_MS old); null before the first, or when its guest cannot tell (an agent
   * from before the disk reading).
   */
  diskUsedBytes: number | null;
  diskTotalBytes: number | null;
}

/** A sandbox's last disk reading, and when it was asked for. */
interface DiskReading {
  askedMs: number;
  asking: boolean;
  usage?: GuestDiskUsage;
}

export class SandboxMetrics {
  private readonly series = new Map<string, MetricSample[]>();
  private readonly last = new Map<string, { atMs: number; cpuSecs: number }>();
  private readonly disk = new Map<string, DiskReading>();

  constructor(private readonly engine: ServiceEngine, private readonly now: () => number) {}

  /**
   * One sample of every running sandbox on this host. The samples are taken at once; the promise
   * resolves when the disk readings due are in them (the timer does not wait for it).
   */
  sample(): Promise<void> {
    if (!this.engine.vmmUsage) return Promise.resolve();
    return this.record(runningHere(this.engine));
  }

  private record(ids: readonly string[]): Promise<void> {
    const now = this.now();
    const taken = new Map<string, MetricSample>();
    for (const [id, u] of this.engine.vmmUsage!(ids)) {
      const prev = this.last.get(id);
      this.last.set(id, { atMs: now, cpuSecs: u.cpuSecs });
      const dt = prev ? (now - prev.atMs) / 1000 : 0;
      const used = prev ? u.cpuSecs - prev.cpuSecs : -1;
      const disk = this.disk.get(id)?.usage;
      const sample: MetricSample = {
        atMs: now,
        cpuPercent: dt > 0 && used >= 0 ? Math.round((used / dt) * 1000) / 10 : null,
        memoryMib: Math.round(u.rssBytes / 1048576),
        diskUsedBytes: disk?.usedBytes ?? null,
        diskTotalBytes: disk?.totalBytes ?? null,
      };
      const s = this.series.get(id) ?? [];
      s.push(sample);
      if (s.length > KEEP) s.splice(0, s.length - KEEP);
      this.series.set(id, s);
      taken.set(id, sample);
    }
    return this.readDisks(taken, now);
  }

  /**
   * Asks the guests of the sandboxes just sampled whose last disk reading is due how full their
   * disks are, and puts each answer in the sample just taken. One question per sandbox at a time;
   * one that gets no answer (paused for idling, an older agent) is asked again a period later.
   */
  private async readDisks(taken: Map<string, MetricSample>, now: number): Promise<void> {
    if (!this.engine.guestDiskUsage) return;
    // Half a period of slack: a timer that fires a little early still finds the reading due.
    const due = [...taken.keys()].filter((id) => {
      const d = this.disk.get(id);
      return !d || (!d.asking && now - d.askedMs >= DISK_SAMPLE_MS - SAMPLE_MS / 2);
    });
    if (due.length === 0) return;
    for (const id of due) this.disk.set(id, { askedMs: now, asking: true, usage: this.disk.get(id)?.usage });
    const readings = await this.engine.guestDiskUsage(due).catch(() => new Map<string, GuestDiskUsage>());
    for (const id of due) {
      const d = this.disk.get(id);
      if (!d) continue; // deleted meanwhile
      d.asking = false;
      const u = readings.get(id);
      if (!u) continue;
      d.usage = u;
      const s = taken.get(id)!;
      s.diskUsedBytes = u.usedBytes;
      s.diskTotalBytes = u.totalBytes;
    }
  }

  /**
   * The samples of `id` taken within [fromMs, toMs] (either open), oldest first. `running`: it has
   * none yet is sampled now (its disk read too), so a caller never waits a whole period for its first.
   */
  async of(id: string, fromMs?: number, toMs?: number, running = false): Promise<MetricSample[]> {
    if (running && !this.series.has(id) && this.engine.vmmUsage) await this.record([id]);
    return (this.series.get(id) ?? []).filter((s) => (fromMs === undefined || s.atMs >= fromMs) && (toMs === undefined || s.atMs <= toMs));
  }

  /** Drops a deleted sandbox's samples. */
  forget(id: string): void {
    this.series.delete(id);
    this.last.delete(id);
    this.disk.delete(id);
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
