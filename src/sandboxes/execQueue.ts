/**
 * Serializes the operations on one sandbox: execs, file reads/writes, fork and suspend all take their
 * turn here, FIFO. A fork therefore waits for the running exec and for every exec queued before it.
 */
export class ExecQueue {
  private tail: Promise<void> = Promise.resolve();
  private pending = 0;

  run<T>(fn: () => Promise<T>): Promise<T> {
    this.pending++;
    const p = this.tail.then(fn);
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
