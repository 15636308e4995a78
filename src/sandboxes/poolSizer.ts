/**
 * How many VMMs a template's warm pool keeps, from the demand it has seen (templatePools.ts). A
 * burst of creates larger than the pool pays the slow path (a restore on the create path, ~0.3–0.5 s
 * under TCG, instead of ~10 ms), so the pool grows to the largest burst seen: the number of VMMs
 * taken within any `burstWindowMs`. It does not shrink while the template is in use — it is ready
 * for the next burst, and a VMM destroyed now would cost a restore to make again — and shrinks to
 * `min` once nothing was taken for `idleMs`, freeing the VMMs' memory. It starts at `initial`.
 * Always within [min, max]. Pure: the clock is passed in.
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
  private lastTake = -Infinity;
  private used = false;

  constructor(private readonly bounds: PoolBounds) {
    this.peak = bounds.initial;
  }

  /** A VMM was asked of the pool at `now` (a create); the size to hold from now on. */
  onTake(now: number): PoolSize {
    this.used = true;
    this.lastTake = now;
    this.takes.push(now);
    this.takes = this.takes.filter((t) => now - t < this.bounds.burstWindowMs);
    this.peak = Math.max(this.peak, this.takes.length);
    return this.size(now);
  }

  /** The size to hold at `now`. */
  size(now: number): PoolSize {
    const { initial, min, max, idleMs, burstWindowMs } = this.bounds;
    const clamp = (n: number) => Math.max(min, Math.min(max, n));
    if (!this.used) return { target: clamp(initial), reason: `initial size (no create yet), within [${min}, ${max}]` };
    if (now - this.lastTake >= idleMs) {
      this.peak = 0;
      this.takes = [];
      return { target: min, reason: `no create for ${Math.round(idleMs / 1000)} s: shrunk to the minimum (${min})` };
    }
    const want = this.peak;
    const capped = want > max ? ` (capped at ${max})` : want < min ? ` (raised to ${min})` : '';
    const recent = this.takes.filter((t) => now - t < burstWindowMs).length;
    return {
      target: clamp(want),
      reason: `largest burst since the pool was last idle: ${want} (now: ${recent} create${recent === 1 ? '' : 's'} within ${Math.round(burstWindowMs / 1000)} s)${capped}`,
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
