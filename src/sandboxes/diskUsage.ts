import type { EngineContext } from './context.js';
import type { GuestDiskUsage } from './types.js';

/**
 * How full each running sandbox's root file system is, as `df /` in it says: its agent's FS_USAGE
 * (statvfs of the overlay root, which reports the sandbox's writable disk), for the metrics sampler
 * (src/service/sandboxMetrics.ts).
 *
 * A reading is no use of the sandbox: it is sent beside the queue (answered while an exec runs),
 * does not count as activity, and is not sent at all to a sandbox the idle pause stopped or is
 * stopping — nothing runs in one, so its disk use stands where it was. While a reading is under way
 * the idle pause leaves the sandbox alone (`besides`), so it never stops the VM under a request.
 */

/** A guest that has not answered within this long (stopped for a fork or a suspend, its agent backed up) gives no reading. */
const READING_TIMEOUT_MS = 5000;

export async function guestDiskUsage(ctx: EngineContext, ids: readonly string[]): Promise<Map<string, GuestDiskUsage>> {
  const out = new Map<string, GuestDiskUsage>();
  if (ctx.isClosing()) return out;
  await Promise.all(ids.map(async (id) => {
    const r = ctx.registry.get(id);
    if (!r || r.deleting || r.lost || r.paused || r.pausing || r.live.agent.closed) return;
    r.besides = (r.besides ?? 0) + 1;
    try {
      const u = await r.live.agent.fsUsage(READING_TIMEOUT_MS);
      out.set(id, { totalBytes: u.totalBytes, usedBytes: u.totalBytes - u.freeBytes });
    } catch {
      // An agent from before FS_USAGE (bad_request), a guest that did not answer in time, a VM going
      // away: no reading this time; the sampler keeps the last one.
    } finally {
      r.besides -= 1;
    }
  }));
  return out;
}
