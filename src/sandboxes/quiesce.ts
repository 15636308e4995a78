import { CollimateError } from '../errors.js';
import type { EngineContext } from './context.js';
import type { Running } from './registry.js';
import { runAgain } from './runtime.js';
import { CODE_BUSY_FILE } from '../guest/codeServer.js';

/**
 * Quiescent sandboxes are paused by the host and woken by their next request
 * (COLLIMATE_IDLE_PAUSE_SECS; the README's "Idle pause" says what a user sees).
 *
 * An idle guest still costs host CPU under TCG (its timer interrupts, QEMU's main loop: ~0.3–0.4 %
 * of a core each), which is what limits how many idle sandboxes a host holds. A sandbox is
 * quiescent when nothing of its own runs in it — no exec in flight or queued, no process left by
 * one (its guest's /execs cgroup is unpopulated: background processes, servers and detached execs
 * keep it awake) — and it has been idle for the configured time. Then its VMM is stopped (QMP
 * `stop`): no vCPU runs, no guest timer fires, the host spends nothing on it.
 *
 * Every operation on a running sandbox waits its turn on the sandbox's queue (execQueue.ts); the
 * queue's gate wakes a paused one first: QMP `cont`, then SET_TIME, because the guest's clock stood
 * still while it was stopped (CLOCK_MONOTONIC and uptime stay behind by the paused time, as across a
 * suspend; CLOCK_REALTIME is set). The sandbox's state stays `running` throughout: a client sees
 * nothing but the wake-up's few milliseconds on its next request.
 */
export class Quiescer {
  private passing = false;
  /** Pauses and wake-ups since start (/metrics). */
  readonly counts = { paused: 0, woken: 0 };

  constructor(private readonly ctx: EngineContext) {}

  /** One pass (the engine's 1 s timer): pauses every running sandbox that has been quiescent long enough. */
  async pass(now = Date.now()): Promise<number> {
    const ctx = this.ctx;
    const after = ctx.cfg.idlePauseSecs * 1000;
    if (after <= 0 || this.passing || ctx.isClosing()) return 0;
    this.passing = true;
    let paused = 0;
    try {
      for (const r of ctx.registry.all()) {
        if (r.paused || r.deleting || r.queue.depth > 0 || now < (r.quiesceCheckAt ?? 0) || now - lastActive(ctx, r.id) < after) continue;
        if (await pauseIfQuiescent(ctx, r, after)) { paused++; this.counts.paused++; }
      }
    } finally {
      this.passing = false;
    }
    return paused;
  }

  /**
   * The queue's gate (registry.ts): wakes a paused sandbox before its next operation — the VMM runs
   * again and the guest's wall clock is set to now.
   */
  async wake(r: Running): Promise<void> {
    if (!r.paused || r.deleting) return;
    try {
      const { clock } = await runAgain(r.live);
      r.paused = undefined;
      await clock;
    } catch (e) {
      if (r.deleting) return;
      throw new CollimateError('vmm_failed', `Sandbox ${r.id} could not be woken from its idle pause; delete it and create another.`, { cause: e });
    }
    this.counts.woken++;
  }

  /** Sandboxes paused now. */
  pausedNow(): number {
    return this.ctx.registry.all().filter((r) => r.paused).length;
  }
}

function lastActive(ctx: EngineContext, id: string): number {
  const row = ctx.repo.get(id);
  return row ? ctx.registry.withActivity(row).last_active : Date.now();
}

/** Pauses `r` in its turn if it is still idle and its guest runs nothing of its own. */
async function pauseIfQuiescent(ctx: EngineContext, r: Running, after: number): Promise<boolean> {
  try {
    return await r.queue.run(async () => {
      if (r.paused || r.deleting || Date.now() - lastActive(ctx, r.id) < after) return false;
      if (!(await guestQuiescent(r))) {
        // Something of its own runs (a server, a background job): asked again only after as long.
        r.quiesceCheckAt = Date.now() + after;
        return false;
      }
      // Checked with no await before stop: a directory operation sent beside the queue from here on
      // sees `pausing` and waits its turn, whose gate wakes the sandbox.
      if (r.besides || Date.now() - lastActive(ctx, r.id) < after) return false;
      r.pausing = true;
      try {
        await r.live.vmm.stop();
        r.paused = { at: Date.now() };
      } finally {
        r.pausing = undefined;
      }
      return true;
    });
  } catch {
    // Deleted or failed meanwhile: its own operation reports that.
    return false;
  }
}

/**
 * Whether nothing of the sandbox's own runs in the guest: the agent's /execs cgroup is unpopulated
 * and the code interpreter (which lives outside /execs, so that its idle kernels do not count) runs
 * no cell.
 */
async function guestQuiescent(r: Running): Promise<boolean> {
  try {
    const events = (await r.live.agent.readFile('/sys/fs/cgroup/execs/cgroup.events', { maxBytes: 4096 })).toString();
    if (!/^populated 0$/m.test(events)) return false;
  } catch {
    // No cgroup v2 in the guest: its processes cannot be seen, so it is never paused.
    return false;
  }
  const busy = await r.live.agent.readFile(CODE_BUSY_FILE, { maxBytes: 64 }).then((b) => b.toString().trim(), () => '0');
  return busy === '0' || busy === '';
}
