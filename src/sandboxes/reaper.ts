import type { EngineContext } from './context.js';
import { deleteSandbox } from './delete.js';
import { suspendSandbox } from './suspendResume.js';

/**
 * Ends sessions that ran past their timeout: suspends or deletes (COLLIMATE_REAP_ACTION) every
 * running sandbox whose session started more than its timeout_secs ago. One pass at a time.
 */
export class Reaper {
  private reaping = false;

  constructor(private readonly ctx: EngineContext) {}

  /** One pass; returns the ids it acted on. A sandbox that is busy or already gone is left for the next pass. */
  async reap(now = Date.now()): Promise<string[]> {
    const ctx = this.ctx;
    if (this.reaping || ctx.isClosing()) return [];
    this.reaping = true;
    const reaped: string[] = [];
    try {
      for (const row of ctx.repo.list({ state: 'running', limit: 1000 })) {
        if (row.state !== 'running' || now < row.session_started_at + row.timeout_secs * 1000) continue;
        try {
          if (ctx.cfg.reapAction === 'suspend') await suspendSandbox(ctx, row.id);
          else await deleteSandbox(ctx, row.id);
          reaped.push(row.id);
          ctx.emit('reaped', { id: row.id, action: ctx.cfg.reapAction });
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
