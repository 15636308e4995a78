/**
 * Pre-spawned VMMs waiting in `-incoming defer`, so spawning QEMU (~40–60 ms here) stays off the
 * create path. `take()` hands one out at once when there is one, and spawns on demand otherwise;
 * the pool refills in the background, a few spawns at a time.
 */
export class WarmPool<T> {
  private ready: T[] = [];
  private spawning = 0;
  private closed = false;
  private failures = 0;

  constructor(
    readonly name: string,
    private target: number,
    private readonly spawnOne: () => Promise<T>,
    private readonly destroy: (item: T) => Promise<void>,
    private readonly onError: (e: unknown) => void = () => {},
    private readonly maxParallelSpawns = 2,
  ) {}

  get size(): number {
    return this.ready.length;
  }

  get targetSize(): number {
    return this.target;
  }

  /** A new size: grows in the background, or destroys ready items beyond it (the oldest first). */
  setTarget(n: number): void {
    this.target = n;
    const extra = this.ready.splice(0, Math.max(0, this.ready.length - n));
    for (const item of extra) void this.destroy(item).catch(() => {});
    this.refill();
  }

  async take(): Promise<T> {
    if (this.closed) throw new Error(`warm pool ${this.name} is closed`);
    const item = this.ready.shift();
    this.refill();
    return item ?? this.spawnOne();
  }

  /** A ready item if there is one (never spawns on demand). */
  takeReady(): T | undefined {
    if (this.closed) return undefined;
    const item = this.ready.shift();
    this.refill();
    return item;
  }

  refill(): void {
    if (this.closed) return;
    while (this.ready.length + this.spawning < this.target && this.spawning < this.maxParallelSpawns) {
      this.spawning++;
      this.spawnOne().then(
        (item) => {
          this.failures = 0;
          if (this.closed) {
            void this.destroy(item).catch(() => {}).finally(() => { this.spawning--; });
            return;
          }
          this.spawning--;
          this.ready.push(item);
          this.refill();
        },
        (e) => {
          this.spawning--;
          this.failures++;
          this.onError(e);
          // Back off instead of spinning on a broken QEMU or a full disk.
          if (!this.closed) setTimeout(() => this.refill(), Math.min(30_000, 100 * 2 ** this.failures)).unref();
        },
      );
    }
  }

  /** Resolves when the pool holds its target (or gives up after timeoutMs). */
  async waitFull(timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (this.ready.length < this.target) {
      if (Date.now() > deadline || this.closed) return false;
      await new Promise((r) => setTimeout(r, 10));
    }
    return true;
  }

  async close(): Promise<void> {
    this.closed = true;
    const items = this.ready.splice(0);
    await Promise.all(items.map((i) => this.destroy(i).catch(() => {})));
    // Spawns still in flight destroy their VMM when they land (see refill); wait for them.
    while (this.spawning > 0) await new Promise((r) => setTimeout(r, 10));
  }
}
