/**
 * Serializes the operations on one sandbox: execs, file reads/writes, fork and suspend all take their
 * turn here, FIFO. A fork therefore waits for the running exec and for every exec queued before it.
 */
export class ExecQueue {
  private tail: Promise<void> = Promise.resolve();
  private pending = 0;

  /** `gate` runs before each operation in its turn (a paused sandbox is woken: quiesce.ts). */
  constructor(private readonly gate?: () => Promise<void>) {}

  run<T>(fn: () => Promise<T>): Promise<T> {
    this.pending++;
    const gate = this.gate;
    const p = this.tail.then(gate ? async () => { await gate(); return fn(); } : fn);
    this.tail = p.then(
      () => { this.pending--; },
      () => { this.pending--; },
    );
    return p;
  }

  /** Operations queued or running. */
  get depth(): number {
    return this.pending;
  }

  /** Resolves once everything queued so far has finished. */
  drain(): Promise<void> {
    return this.tail;
  }
}
