/**
 * How many VMMs a template's warm pool keeps, from the demand it has seen (templatePools.ts). A
 * burst of creates larger than the pool pays the slow path (a restore on the create path, ~0.3–0.5 s
 * under TCG, instead of ~10 ms), so the pool grows to the largest burst seen: the number of VMMs
 * taken within any `burstWindowMs`. It does not shrink while the template is in use — it is ready
 * for the next burst, and a VMM destroyed now would cost a restore to make again — and shrinks to
 * `min` once no create was asked for or served for `idleMs`, freeing the VMMs' memory. A create
 * still being served (a slow-path restore on a loaded host can take longer than `idleMs`) keeps the
 * template in use. It starts at `initial`.
 * Always within [min, max]. Pure: the clock is passed in.
 *
 * A burst is what arrives before the pool can make a VMM again: the window is `burstWindowMs` or,
 * when making one takes longer (a loaded host, a large guest), the time it takes (`onRefill`, a
 * moving average) — creates that arrive within one refill all need a VMM already waiting.
 */
export interface PoolBounds {
  /** Size before the template has seen any demand (catalog: COLLIMATE_POOL_SIZE; environment: COLLIMATE_ENV_POOL_SIZE). */
  initial: number;
  min: number;
  max: number;
  /** Nothing taken for this long: back to `min`. */
  idleMs: number;
  /** Takes within this long of each other count as one burst. */
  burstWindowMs: number;
}

export interface PoolSize {
  target: number;
  /** Why, in words (shown in /healthz). */
  reason: string;
}

export class PoolSizer {
  private takes: number[] = [];
  /** The largest burst since the pool was last idle (the initial size until the first create). */
  private peak: number;
  /** When a create last arrived or was served. */
  private lastTake = -Infinity;
  /** Creates asked of the pool and not yet served. */
  private inFlight = 0;
  private used = false;
  /** Moving average of the time to make one VMM (spawn, restore, warm), once one was made. */
  private refillMs: number | undefined;

  constructor(private readonly bounds: PoolBounds) {
    this.peak = bounds.initial;
  }

  /** The pool made a VMM in `ms`. */
  onRefill(ms: number): void {
    this.refillMs = this.refillMs === undefined ? ms : 0.7 * this.refillMs + 0.3 * ms;
  }

  /** How close together creates count as one burst: the configured window, or one refill when that is longer. */
  private window(): number {
    return Math.max(this.bounds.burstWindowMs, this.refillMs ?? 0);
  }

  /** A VMM was asked of the pool at `now` (a create); the size to hold from now on. `onServed` follows. */
  onTake(now: number): PoolSize {
    this.used = true;
    this.inFlight++;
    this.lastTake = now;
    this.takes.push(now);
    const window = this.window();
    this.takes = this.takes.filter((t) => now - t < window);
    this.peak = Math.max(this.peak, this.takes.length);
    return this.size(now);
  }

  /** The create asked for by an `onTake` got its VMM (or failed) at `now`. */
  onServed(now: number): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    this.lastTake = Math.max(this.lastTake, now);
  }

  /** The size to hold at `now`. */
  size(now: number): PoolSize {
    const { initial, min, max, idleMs } = this.bounds;
    const window = this.window();
    const clamp = (n: number) => Math.max(min, Math.min(max, n));
    if (!this.used) return { target: clamp(initial), reason: `initial size (no create yet), within [${min}, ${max}]` };
    if (this.inFlight === 0 && now - this.lastTake >= idleMs) {
      this.peak = 0;
      this.takes = [];
      return { target: min, reason: `no create for ${Math.round(idleMs / 1000)} s: shrunk to the minimum (${min})` };
    }
    const want = this.peak;
    const capped = want > max ? ` (capped at ${max})` : want < min ? ` (raised to ${min})` : '';
    const recent = this.takes.filter((t) => now - t < window).length;
    const refill = this.refillMs === undefined ? '' : `; a VMM takes ${(this.refillMs / 1000).toFixed(1)} s to make`;
    return {
      target: clamp(want),
      reason: `largest burst since the pool was last idle: ${want} (now: ${recent} create${recent === 1 ? '' : 's'} within ${Math.round(window / 1000)} s${refill})${capped}`,
    };
  }
}

/**
 * Fits the pools' wanted sizes into a host budget of `budget` VMMs in all: when they ask for more,
 * the largest give way first (each keeps at least one while the budget allows). Returns the sizes
 * in the same order.
 */
export function fitBudget(wanted: number[], budget: number): number[] {
  const out = wanted.slice();
  let total = out.reduce((a, b) => a + b, 0);
  while (total > budget) {
    let big = 0;
    for (let i = 1; i < out.length; i++) if (out[i] > out[big]) big = i;
    if (out[big] === 0) break;
    out[big]--;
    total--;
  }
  return out;
}
