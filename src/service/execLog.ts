/**
 * The recent execs of each sandbox, kept in SQLite across restarts: what ran (a one-line summary,
 * never its stdin, files or env, which may hold secrets), its exit code and how long it took. Only
 * the last EXEC_LOG_PER_SANDBOX of each sandbox are kept; a deleted sandbox's go with it.
 */
import type { Db } from '../store/db.js';
import type { ExecRequest, ExecResult } from '../sandboxes/types.js';

export const EXEC_LOG_PER_SANDBOX = 50;
/** Longest command summary kept (characters). */
export const EXEC_SUMMARY_MAX = 200;

export interface ExecLogEntry {
  command: string;
  exit_code: number;
  timed_out: boolean;
  duration_ms: number;
  started_at: string;
}

/** The one line that says what an exec ran: its command, its code's first line, or its argv lists. */
export function execSummary(req: ExecRequest): string {
  return summaryLine(req.command ?? (req.code !== undefined ? `[code] ${req.code.split('\n').find((l) => l.trim()) ?? ''}` : (req.commands ?? []).map((argv) => argv.join(' ')).join(' && ')));
}

/** `text` on one line (runs of white space as one space), cut to `max` characters with an ellipsis. */
export function summaryLine(text: string, max = EXEC_SUMMARY_MAX): string {
  const line = text.replace(/\s+/g, ' ').trim();
  return line.length > max ? line.slice(0, max - 1) + '…' : line;
}

export class ExecLog {
  constructor(private readonly db: Db) {}

  record(tenant: string, sandbox: string, req: ExecRequest, startedMs: number, durationMs: number, r: Pick<ExecResult, 'exit_code' | 'timed_out'>): void {
    this.db.transaction(() => {
      this.db
        .prepare('INSERT INTO api_execs (tenant, sandbox, command, exit_code, timed_out, started_ms, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?)')
        .run(tenant, sandbox, execSummary(req), r.exit_code, r.timed_out ? 1 : 0, startedMs, Math.round(durationMs));
      this.db
        .prepare('DELETE FROM api_execs WHERE sandbox = ? AND id <= (SELECT id FROM api_execs WHERE sandbox = ? ORDER BY id DESC LIMIT 1 OFFSET ?)')
        .run(sandbox, sandbox, EXEC_LOG_PER_SANDBOX);
    })();
  }

  /** Newest first. */
  recent(tenant: string, sandbox: string, limit = EXEC_LOG_PER_SANDBOX): ExecLogEntry[] {
    const rows = this.db
      .prepare('SELECT command, exit_code, timed_out, started_ms, duration_ms FROM api_execs WHERE tenant = ? AND sandbox = ? ORDER BY id DESC LIMIT ?')
      .all(tenant, sandbox, limit) as Array<{ command: string; exit_code: number; timed_out: number; started_ms: number; duration_ms: number }>;
    return rows.map((r) => ({ command: r.command, exit_code: r.exit_code, timed_out: r.timed_out === 1, duration_ms: r.duration_ms, started_at: new Date(r.started_ms).toISOString() }));
  }

  forget(sandbox: string): void {
    this.db.prepare('DELETE FROM api_execs WHERE sandbox = ?').run(sandbox);
  }
}
