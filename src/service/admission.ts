/**
 * Tier concurrency caps, enforced atomically. Node runs handlers on one thread, so the check and the
 * reservation below happen in one synchronous step that no other request can interleave with: the
 * tenant's running sandboxes (engine.countRunning) plus the slots held by in-flight creates, forks
 * and resumes either leave room — then the slots are taken before the caller's first await — or not.
 * The caller releases the reservation when its service call settles, success or failure.
 *
 * countRunning may or may not already include a sandbox whose operation is still in flight (the
 * engine counts a create, fork child or resume only once its row says running, which happens
 * before the call returns). So with R = countRunning
 * and P = slots reserved in flight, the true occupancy lies in [R, R + P]:
 *   R + P + n ≤ cap → admit (certainly fits);   R + n > cap → 429 (certainly does not);
 *   otherwise        → wait until an in-flight operation of this tenant settles, and decide again.
 * That never overshoots and never refuses a request that would fit once the counts are exact.
 */
import { CollimateError, msg, see } from '../errors.js';
import type { SandboxService } from '../sandboxes/types.js';
import type { Tier } from './tiers.js';

/** Seconds a client is told to wait after a concurrency_limit. */
export const CONCURRENCY_RETRY_AFTER_SECS = 5;
/** Longest a request waits for in-flight operations to settle before it is refused. */
const MAX_WAIT_MS = 30_000;

/** The tier's cap refuses a start: one error, whichever placement (one host, a cluster) counted. */
export function concurrencyLimit(tier: Tier, running: number, starting: number, operation: string, slots: number): CollimateError {
  return new CollimateError(
    'concurrency_limit',
    [
      ...msg`The ${tier.name} tier allows ${tier.maxRunning} running sandboxes and you have ${running}${starting ? ` (plus ${starting} starting)` : ''}; `,
      ...msg`${operation} needs ${slots} more. Suspend one${see('suspendSandbox')} or delete one${see('deleteSandbox')} and retry, or upgrade to Pro for no concurrency cap.`,
    ],
    { retryAfterSecs: CONCURRENCY_RETRY_AFTER_SECS, details: { limit: tier.maxRunning, running } },
  );
}

export interface Reservation {
  readonly slots: number;
  /** Idempotent. */
  release(): void;
}

export class Admission {
  private readonly reserved = new Map<string, number>();
  private readonly waiters = new Map<string, Array<() => void>>();

  constructor(private readonly service: Pick<SandboxService, 'countRunning'>, private readonly maxWaitMs = MAX_WAIT_MS) {}

  /** Reserves `slots` running sandboxes for `tenant`, or throws concurrency_limit. */
  async reserve(tenant: string, tier: Tier, slots: number, operation: string): Promise<Reservation> {
    const deadline = Date.now() + this.maxWaitMs;
    for (;;) {
      const r = this.tryReserve(tenant, tier, slots, operation, Date.now() >= deadline);
      if (r) return r;
      await this.settled(tenant, deadline);
    }
  }

  /**
   * The synchronous step: a reservation, null when the outcome depends on in-flight operations
   * (and `final` is false), or a thrown concurrency_limit.
   */
  tryReserve(tenant: string, tier: Tier, slots: number, operation: string, final = true): Reservation | null {
    if (tier.maxRunning !== null) {
      const running = this.service.countRunning(tenant);
      const inFlight = this.reserved.get(tenant) ?? 0;
      if (running + inFlight + slots > tier.maxRunning) {
        if (running + slots <= tier.maxRunning && inFlight > 0 && !final) return null;
        throw concurrencyLimit(tier, running, inFlight, operation, slots);
      }
    }
    this.reserved.set(tenant, (this.reserved.get(tenant) ?? 0) + slots);
    let released = false;
    return {
      slots,
      release: () => {
        if (released) return;
        released = true;
        const left = (this.reserved.get(tenant) ?? 0) - slots;
        if (left > 0) this.reserved.set(tenant, left);
        else this.reserved.delete(tenant);
        const w = this.waiters.get(tenant);
        if (w) {
          this.waiters.delete(tenant);
          // After the releasing call's continuation has run (the service's count is final by then).
          setImmediate(() => w.forEach((f) => f()));
        }
      },
    };
  }

  /** Slots held by in-flight operations (for tests and metrics). */
  inFlight(tenant: string): number {
    return this.reserved.get(tenant) ?? 0;
  }

  private settled(tenant: string, deadline: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(resolve, Math.max(0, deadline - Date.now()));
      t.unref();
      const list = this.waiters.get(tenant) ?? [];
      list.push(() => {
        clearTimeout(t);
        resolve();
      });
      this.waiters.set(tenant, list);
    });
  }
}
