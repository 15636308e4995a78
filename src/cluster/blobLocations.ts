import type pg from 'pg';
import type { LocalBlob, LocalBlobs } from '../images/localBlobs.js';
import { inTransaction } from './db.js';

/**
 * Where each blob lives (`blob_locations`, migration 2): one row per (digest, host) for every blob a
 * host serves through its blob API (src/api/blobRoutes.ts). A host publishes what it holds at start
 * and every `BLOB_PUBLISH_MS`: new blobs are added and the rows of blobs it no longer holds (its
 * layer or artifact collector removed them) are dropped, in one transaction. Between two
 * publications a row can name a blob already gone: the host then answers 404 and the puller asks
 * the next holder (blobFetcher.ts), so a stale row costs a request, never wrong bytes.
 */
export const BLOB_PUBLISH_MS = 30_000;

export interface BlobHolder {
  hostId: string;
  address: string;
  size: number;
}

export class BlobLocations {
  constructor(private readonly pool: pg.Pool) {}

  /** Makes `blobs` exactly what the directory says `hostId` holds. */
  async publish(hostId: string, blobs: LocalBlob[]): Promise<{ added: number; dropped: number }> {
    const digests = blobs.map((b) => b.digest);
    return inTransaction(this.pool, async (c) => {
      const dropped = await c.query(`DELETE FROM blob_locations WHERE host_id = $1 AND NOT (digest = ANY($2::text[]))`, [hostId, digests]);
      const added = await c.query(
        `INSERT INTO blob_locations (digest, host_id, kind, size, of)
         SELECT d, $1, k, s, o FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[]) AS t (d, k, s, o)
         ON CONFLICT (digest, host_id) DO NOTHING`,
        [hostId, digests, blobs.map((b) => b.kind), blobs.map((b) => b.size), blobs.map((b) => b.of)],
      );
      return { added: added.rowCount ?? 0, dropped: dropped.rowCount ?? 0 };
    });
  }

  /**
   * The alive hosts that hold `digest`, other than `except`, in random order (pulls spread over
   * the holders rather than all hitting the first).
   */
  async holders(digest: string, except?: string): Promise<BlobHolder[]> {
    const r = await this.pool.query<{ host_id: string; address: string; size: string }>(
      `SELECT b.host_id, h.address, b.size FROM blob_locations b JOIN hosts h ON h.id = b.host_id
       WHERE b.digest = $1 AND h.state = 'alive' AND b.host_id IS DISTINCT FROM $2 ORDER BY random()`,
      [digest, except ?? null],
    );
    return r.rows.map((row) => ({ hostId: row.host_id, address: row.address, size: Number(row.size) }));
  }
}

/**
 * Publishes this host's blobs (LocalBlobs.scan) now and then every `everyMs`, until stopped. A
 * failed publication (database unreachable) is reported and retried at the next tick.
 */
export class BlobPublisher {
  private timer?: NodeJS.Timeout;
  private running?: Promise<void>;
  private next?: Promise<void>;
  private stopped = false;

  constructor(
    private readonly locations: BlobLocations,
    private readonly hostId: string,
    private readonly blobs: LocalBlobs,
    private readonly log: (err: unknown, msg: string) => void = () => {},
    private readonly everyMs = BLOB_PUBLISH_MS,
  ) {}

  async start(): Promise<void> {
    await this.publishNow();
    if (this.stopped) return;
    this.timer = setInterval(() => void this.publishNow(), this.everyMs);
    this.timer.unref();
  }

  /**
   * A publication of what this host holds now: one under way may have scanned before what the
   * caller needs existed, so callers meanwhile share one more that starts when it ends.
   */
  publishNow(): Promise<void> {
    if (this.running) {
      this.next ??= this.running.then(() => {
        this.next = undefined;
        return this.publishNow();
      });
      return this.next;
    }
    this.running = (async () => {
      try {
        const held = await this.blobs.scan();
        if (this.stopped) return;
        await this.locations.publish(this.hostId, held);
      } catch (err) {
        this.log(err, 'publishing this host\'s blobs to the cluster failed');
      }
    })().finally(() => (this.running = undefined));
    return this.running;
  }

  /**
   * Stops publishing. A scan under way (the first one hashes every artifact file never hashed, which
   * can take a minute) is not waited for: its result is dropped, so a stopping host is not held up.
   */
  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
  }
}
