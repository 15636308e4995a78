import type { EngineContext } from './context.js';
import { deleteSandbox } from './delete.js';
import { suspendSandbox } from './suspendResume.js';
import type { SandboxRow } from './repo.js';

/**
 * Ends sessions that ran past their end: suspends or deletes (the sandbox's on_timeout, chosen at
 * create; COLLIMATE_REAP_ACTION for rows from before) every running
 * sandbox whose session_ends_at has passed (timeout_secs after its start, or as a lease set it).
 * One pass at a time.
 */
export class Reaper {
  private reaping = false;

  constructor(private readonly ctx: EngineContext) {}

  /** The running sandboxes whose session has ended at `now`. */
  due(now: number): SandboxRow[] {
    return this.ctx.repo.sessionsEndedBy(now);
  }

  /** One pass; returns the ids it acted on. A sandbox that is busy or already gone is left for the next pass. */
  async reap(now = Date.now()): Promise<string[]> {
    const ctx = this.ctx;
    if (this.reaping || ctx.isClosing()) return [];
    this.reaping = true;
    const reaped: string[] = [];
    try {
      for (const row of this.due(now)) {
        try {
          const action = row.on_timeout ?? ctx.cfg.reapAction;
          if (action === 'suspend') await suspendSandbox(ctx, row.id);
          else await deleteSandbox(ctx, row.id);
          reaped.push(row.id);
          ctx.emit('reaped', { id: row.id, tenant: row.tenant, action });
        } catch {
          // Busy or already gone; the next tick retries.
        }
      }
    } finally {
      this.reaping = false;
    }
    return reaped;
  }
}
