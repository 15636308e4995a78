/**
 * Snapshots across cluster hosts, the cluster's side (the engine's: src/sandboxes/snapshotCopies.ts).
 * A start from a snapshot placed on a host that is not its origin makes that host pull a copy first:
 * the origin exports the snapshot (its files named by digest, the disk flattened over the template
 * artifact's disk) and serves the files through its blob API; this host fetches each by digest —
 * from the origin, or from another host whose copy holds the same bytes — verifying each, holes not
 * sent, and records the copy. Concurrent starts on one host wait for one pull.
 *
 * A copy goes when the snapshot does: the host that deletes it asks every other to drop theirs, and
 * each host asks, every COPY_RECONCILE_MS, the origin of each copy it holds whether the snapshot is
 * still there (a host that was away when it was deleted).
 */
import { CollimateError } from '../errors.js';
import type { SnapshotCopyEngine, SnapshotManifest } from '../sandboxes/snapshotCopies.js';
import type { BlobFetcher } from './blobFetcher.js';
import type { BlobLocations, BlobHolder } from './blobLocations.js';
import { COPY_RECONCILE_MS } from './environmentPull.js';
import type { RemoteHost, SnapshotSource } from './remoteHost.js';

/** What a pull moved. */
export interface SnapshotPullReport {
  snapshot: string;
  /** The files' sizes, and the bytes that crossed the network for them (holes are not sent). */
  bytes: number;
  transferred: number;
  ms: number;
  /** Of `ms`: the origin's answer with the manifest (its export, the first time), and fetching the files. */
  exportMs: number;
  fetchMs: number;
}

export class SnapshotPuller {
  private timer?: NodeJS.Timeout;
  /** The last pulls made here, newest last (a few, for the host's log and the tests' figures). */
  readonly pulls: SnapshotPullReport[] = [];

  constructor(
    /** A client of another host of the cluster (a RemoteHost). */
    private readonly peer: (hostId: string, address: string) => Pick<RemoteHost, 'call'>,
    private readonly selfId: string,
    private readonly engine: SnapshotCopyEngine,
    private readonly fetcher: Pick<BlobFetcher, 'fetchFrom'>,
    private readonly locations: Pick<BlobLocations, 'holders'>,
    private readonly peers: () => Promise<Array<{ id: string; address: string }>>,
    private readonly log: (err: unknown, msg: string) => void = () => {},
    /** After a pull: tell the cluster what this host holds now (BlobPublisher.publishNow). */
    private readonly onPulled: () => void = () => {},
  ) {}

  /**
   * Makes snapshot `src.id` startable here: nothing when this host holds it (its own, or a copy),
   * else a copy pulled from its origin. Null when nothing had to move. Throws snapshot_not_found
   * (the origin no longer has it), conflict artifact_missing, image_pull_failed.
   */
  async ensure(src: SnapshotSource): Promise<SnapshotPullReport | null> {
    if (this.engine.holds(src.id)) return null;
    const t0 = Date.now();
    const m = (await this.peer(src.origin.hostId, src.origin.address).call('exportSnapshot', [src.tenant, src.id])) as SnapshotManifest;
    const exportMs = Date.now() - t0;
    let transferred = 0;
    let fetchMs = 0;
    const made = await this.engine.importIn(m, src.origin.hostId, async (f, dest) => {
      // The origin first (it holds every file), then hosts whose copies hold the same bytes.
      const others = (await this.locations.holders(f.digest, this.selfId)).filter((h) => h.hostId !== src.origin.hostId);
      const holders: BlobHolder[] = [{ hostId: src.origin.hostId, address: src.origin.address, size: f.size }, ...others];
      const t1 = Date.now();
      const got = await this.fetcher.fetchFrom(holders, f.digest, dest, { sparse: f.sparse });
      fetchMs += Date.now() - t1;
      transferred += got.transferred;
    });
    if (!made) return null;
    const report = { snapshot: src.id, bytes: m.files.reduce((n, f) => n + f.size, 0), transferred, ms: Date.now() - t0, exportMs, fetchMs };
    this.pulls.push(report);
    if (this.pulls.length > 20) this.pulls.shift();
    this.log(null, `pulled a copy of snapshot ${src.id} from host ${src.origin.hostId}: ${report.bytes} bytes of files, ${transferred} sent, ${report.ms} ms (export ${exportMs} ms, fetch ${fetchMs} ms)`);
    this.onPulled();
    return report;
  }

  /** Asks every other alive host to drop its copy of snapshot `id` (deleted); one that does not answer drops it at its next sweep. */
  async dropEverywhere(id: string): Promise<void> {
    this.engine.drop(id);
    for (const p of await this.peers()) {
      await this.peer(p.id, p.address).call('dropSnapshotCopy', [id])
        .catch((err) => this.log(err, `host ${p.id} did not drop its copy of snapshot ${id}; it does at its next sweep`));
    }
    this.onPulled();
  }

  /** Drops the copies whose origin answers that it no longer has the snapshot. */
  async reconcile(): Promise<void> {
    const alive = new Map((await this.peers()).map((p) => [p.id, p.address]));
    let dropped = false;
    for (const c of this.engine.copies()) {
      const address = alive.get(c.origin);
      if (!address) continue; // its origin is away: the copy waits for it
      try {
        await this.peer(c.origin, address).call('getSnapshot', [c.id, { tenant: c.tenant }]);
      } catch (err) {
        if (!(err instanceof CollimateError && err.code === 'snapshot_not_found')) continue;
        dropped = this.engine.drop(c.id) || dropped;
        this.log(null, `dropped this host's copy of snapshot ${c.id}: host ${c.origin} no longer has it`);
      }
    }
    if (dropped) this.onPulled();
  }

  start(everyMs = COPY_RECONCILE_MS): void {
    this.timer = setInterval(() => void this.reconcile().catch((err) => this.log(err, 'dropping copies of deleted snapshots failed')), everyMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
