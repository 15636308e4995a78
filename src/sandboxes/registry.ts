import { ExecQueue } from './execQueue.js';
import type { LiveVm } from './runtime.js';
import type { SandboxRepo, SandboxRow } from './repo.js';
import type { OpenPort } from '../net/ports.js';

/** A sandbox that is running in this process: its VMM, agent link and operation queue. */
export interface Running {
  id: string;
  live: LiveVm;
  queue: ExecQueue;
  /** Set by delete (and a rollback) so queued operations fail fast instead of talking to a dying VMM. */
  deleting: boolean;
  /** Set by a rollback (snapshots.ts) with the snapshot's id: queued operations fail with sandbox_restored. */
  rolledBack?: string;
  /** Set while the host has it paused for being quiescent (quiesce.ts); its next operation wakes it. */
  paused?: { at: number };
  /** Set while the idle pause stops its VMM: a request sent beside the queue then waits its turn instead (files.ts). */
  pausing?: boolean;
  /** Requests sent beside the queue (directory operations) now under way: the idle pause waits for them. */
  besides?: number;
  /** When the idle pause may next ask the guest whether it runs anything (quiesce.ts). */
  quiesceCheckAt?: number;
  /** Why it is going other than by a delete (its VM died): requests under way fail saying so. */
  lost?: string;
  /**
   * Set while a closed agent link is being told apart from a VM that died (engine.ts watchVmm):
   * the link closes as QEMU's descriptors go, a moment before the process is gone. A request that
   * failed on the link waits for it before saying why (`settledLink`).
   */
  linkCheck?: Promise<void>;
}

/** Resolves once a closed agent link has been judged: `lost` is set by then if the VM died. */
export async function settledLink(r: Running): Promise<void> {
  await r.linkCheck;
}

/** Activity not yet written to the database. */
export interface Activity {
  /** When the sandbox was last used (ms since the epoch). */
  last: number;
  /** Execs since the last flush. */
  execs: number;
}

/**
 * What this process holds of its sandboxes beyond their rows: the running ones (VMM, agent link,
 * operation queue), the operation queues of suspended ones, their activity since the last flush and
 * the last reading of their listening ports. The database holds everything that must survive a
 * restart; nothing here does.
 */
export class SandboxRegistry {
  private readonly running = new Map<string, Running>();
  /** Suspended sandboxes have no Running; their operations are serialized here. */
  private readonly suspendedQueues = new Map<string, ExecQueue>();
  private readonly activity = new Map<string, Activity>();
  private readonly ports = new Map<string, OpenPort[]>();

  /** `wake` runs before each operation on a running sandbox, in its turn (quiesce.ts). */
  constructor(
    private readonly repo: Pick<SandboxRepo, 'addActivity'>,
    private readonly wake?: (r: Running) => Promise<void>,
    /** Called for each sandbox registered (the engine watches its VMM). */
    private readonly added?: (r: Running) => void,
  ) {}

  // ---- running sandboxes -------------------------------------------------------------------------

  get(id: string): Running | undefined {
    return this.running.get(id);
  }

  has(id: string): boolean {
    return this.running.has(id);
  }

  /** Registers a sandbox whose VMM now runs in this process, with an empty operation queue. */
  add(id: string, live: LiveVm): Running {
    const wake = this.wake;
    const r: Running = { id, live, queue: new ExecQueue(wake && (() => wake(r))), deleting: false };
    this.running.set(id, r);
    this.added?.(r);
    return r;
  }

  /** The sandbox's VMM no longer runs in this process (suspended, deleted). */
  remove(id: string): void {
    this.running.delete(id);
  }

  all(): Running[] {
    return [...this.running.values()];
  }

  /** Forgets every running sandbox (the server is closing; their VMMs run on for the next one). */
  clear(): void {
    this.running.clear();
  }

  /** Forgets the activity and ports of a deleted sandbox. */
  forget(id: string): void {
    this.activity.delete(id);
    this.ports.delete(id);
  }

  // ---- suspended sandboxes -----------------------------------------------------------------------

  /** Runs `fn` after every operation queued on suspended sandbox `id` before it (resume, fork). */
  serialized<T>(id: string, fn: () => Promise<T>): Promise<T> {
    let q = this.suspendedQueues.get(id);
    if (!q) { q = new ExecQueue(); this.suspendedQueues.set(id, q); }
    const queue = q;
    return queue.run(fn).finally(() => { if (queue.depth === 0) this.suspendedQueues.delete(id); });
  }

  // ---- activity ----------------------------------------------------------------------------------

  /**
   * Counts a use of the sandbox (an exec, or a file read or write). Written to the database by
   * flushActivity, about once a second: it is not a transition, and an fsync per exec would
   * dominate its latency. Reads see it at once through withActivity.
   */
  touch(id: string, isExec: boolean, now = Date.now()): void {
    const a = this.activity.get(id) ?? { last: now, execs: 0 };
    a.last = Math.max(a.last, now);
    if (isExec) a.execs++;
    this.activity.set(id, a);
  }

  /** Writes the activity counted since the last flush. */
  flushActivity(): void {
    if (this.activity.size === 0) return;
    const entries = [...this.activity];
    this.activity.clear();
    this.repo.addActivity(entries);
  }

  /** The row as it will be once its activity is flushed (what a client should see now). */
  withActivity(row: SandboxRow): SandboxRow {
    const a = this.activity.get(row.id);
    if (!a) return row;
    return { ...row, last_active: Math.max(row.last_active, a.last), exec_count: row.exec_count + a.execs };
  }

  // ---- ports -------------------------------------------------------------------------------------

  /** The last reading of the sandbox's listening ports (none yet: empty). */
  portsOf(id: string): OpenPort[] {
    return this.ports.get(id) ?? [];
  }

  setPorts(id: string, ports: OpenPort[]): void {
    this.ports.set(id, ports);
  }
}
