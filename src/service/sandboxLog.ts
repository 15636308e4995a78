/**
 * Each sandbox's log, kept in SQLite on the host that runs it: what happened to the sandbox, as it
 * happened — its lifecycle (created, forked, suspended, resumed, rolled back, moved here), every exec
 * (a one-line summary, exit code, duration), its background processes' starts and exits, the
 * reaper's action, snapshots taken and failures of the guest. Never stdin, env values or file
 * contents, which may hold secrets: a command is kept as execSummary keeps it for the exec log.
 *
 * Only the last LOG_KEPT_PER_SANDBOX entries of each sandbox are kept; a deleted sandbox's go
 * with it (so its deletion, or the death of its VM, is never read from here: the sandbox's id
 * answers that itself). GET /v1/sandboxes/{id}/logs and E2B's logs (v1 and v2) read it.
 */
import { ERROR_CODES, type ErrorCode, CollimateError } from '../errors.js';
import type { ExecRequest, ExecResult, ProcessInfo, ProcessStartRequest, SandboxTransition } from '../sandboxes/types.js';
import type { Db } from '../store/db.js';
import { LOG_KEPT_PER_SANDBOX, LOG_LEVELS, LOG_READ_MAX, type LogLevel } from '../wire/schemas.js';
import { execSummary, summaryLine } from './execLog.js';

/** Longest error message kept in an entry's fields. */
const ERROR_TEXT_MAX = 300;

/** One entry as every door answers it (E2B's SandboxLogEntry has the same shape). */
export interface SandboxLogEntry {
  timestamp: string;
  level: LogLevel;
  message: string;
  fields: Record<string, string>;
}

/** What to write: the level, a line for people and the fields for programs. */
export interface SandboxLogLine {
  level: LogLevel;
  message: string;
  fields: Record<string, string>;
}

export interface SandboxLogQuery {
  /**
   * Where to start, ms since the epoch, inclusive: forward reads entries at or after it (default:
   * the oldest kept), backward at or before it (default: the newest).
   */
  cursorMs?: number;
  /** `forward`: oldest first (the default); `backward`: newest first. */
  direction?: 'forward' | 'backward';
  /** The least severe level returned (default debug: all). */
  level?: LogLevel;
  /** Only entries whose message contains this, case-sensitive. */
  search?: string;
  /** At most this many (default LOG_READ_MAX). */
  limit?: number;
}

const severity = (level: LogLevel): number => LOG_LEVELS.indexOf(level);

export class SandboxLog {
  constructor(private readonly db: Db, private readonly now: () => number = Date.now) {}

  add(tenant: string, sandbox: string, line: SandboxLogLine): void {
    this.db.transaction(() => {
      this.db
        .prepare('INSERT INTO api_sandbox_logs (tenant, sandbox, at_ms, level, message, fields) VALUES (?, ?, ?, ?, ?, ?)')
        .run(tenant, sandbox, this.now(), severity(line.level), line.message, JSON.stringify(line.fields));
      this.db
        .prepare('DELETE FROM api_sandbox_logs WHERE sandbox = ? AND id <= (SELECT id FROM api_sandbox_logs WHERE sandbox = ? ORDER BY id DESC LIMIT 1 OFFSET ?)')
        .run(sandbox, sandbox, LOG_KEPT_PER_SANDBOX);
    })();
  }

  /** The tenant's sandbox's entries matching `q`, in its direction. Precondition: `q` was validated (SandboxLogsQuery). */
  read(tenant: string, sandbox: string, q: SandboxLogQuery = {}): SandboxLogEntry[] {
    const backward = q.direction === 'backward';
    const where = ['tenant = ?', 'sandbox = ?'];
    const args: unknown[] = [tenant, sandbox];
    if (q.cursorMs !== undefined) {
      where.push(backward ? 'at_ms <= ?' : 'at_ms >= ?');
      args.push(q.cursorMs);
    }
    if (q.level !== undefined && severity(q.level) > 0) {
      where.push('level >= ?');
      args.push(severity(q.level));
    }
    // instr is case-sensitive; LIKE would not be (and would read % and _ as patterns).
    if (q.search) {
      where.push('instr(message, ?) > 0');
      args.push(q.search);
    }
    const order = backward ? 'at_ms DESC, id DESC' : 'at_ms ASC, id ASC';
    const rows = this.db
      .prepare(`SELECT at_ms, level, message, fields FROM api_sandbox_logs WHERE ${where.join(' AND ')} ORDER BY ${order} LIMIT ?`)
      .all(...args, q.limit ?? LOG_READ_MAX) as Array<{ at_ms: number; level: number; message: string; fields: string }>;
    return rows.map((r) => ({ timestamp: new Date(r.at_ms).toISOString(), level: LOG_LEVELS[r.level] ?? 'info', message: r.message, fields: JSON.parse(r.fields) as Record<string, string> }));
  }

  forget(sandbox: string): void {
    this.db.prepare('DELETE FROM api_sandbox_logs WHERE sandbox = ?').run(sandbox);
  }
}

// ---- what is written ------------------------------------------------------------------------------

/**
 * A lifecycle transition's entry. None for `deleted` (a delete, a lost VM, a move away): the log goes
 * with the sandbox, so nothing could read it.
 */
export function transitionLine(t: SandboxTransition): SandboxLogLine | undefined {
  if (t.state === 'deleted') return undefined;
  const fields: Record<string, string> = { event: 'lifecycle', op: t.op, state: t.state };
  if (t.snapshotBytes !== undefined) fields.snapshot_bytes = String(t.snapshotBytes);
  const message = {
    create: 'Sandbox created',
    fork: 'Sandbox started from a fork point (a live fork or a snapshot)',
    suspend: t.snapshotBytes !== undefined ? `Sandbox suspended (snapshot of ${mib(t.snapshotBytes)} MiB)` : 'Sandbox suspended',
    resume: 'Sandbox resumed',
    restore: `Sandbox rolled back to a snapshot (${t.state})`,
    move: `Sandbox moved to this host (${t.state})`,
    delete: 'Sandbox deleted',
    lost: 'Sandbox lost',
  }[t.op];
  return { level: 'info', message, fields };
}

const mib = (bytes: number) => Math.round((bytes / (1024 * 1024)) * 10) / 10;

/** An exec that ran: info when it exited 0, warn on another exit, error when it timed out or was OOM-killed. */
export function execLine(req: ExecRequest, durationMs: number, r: Pick<ExecResult, 'exit_code' | 'timed_out' | 'signal' | 'oom_killed' | 'pids_limited'>): SandboxLogLine {
  const command = execSummary(req);
  const ms = Math.round(durationMs);
  const fields: Record<string, string> = { event: 'exec', command, exit_code: String(r.exit_code), duration_ms: String(ms), timed_out: String(r.timed_out) };
  if (r.signal !== undefined) fields.signal = String(r.signal);
  if (r.oom_killed) fields.oom_killed = 'true';
  if (r.pids_limited) fields.pids_limited = 'true';
  if (r.timed_out) return { level: 'error', message: `Exec timed out after ${ms} ms: ${command}`, fields };
  if (r.oom_killed) return { level: 'error', message: `Exec killed for want of memory (OOM) after ${ms} ms: ${command}`, fields };
  const how = r.signal !== undefined ? `was killed by signal ${r.signal}` : `exited ${r.exit_code}`;
  return { level: r.exit_code === 0 && r.signal === undefined ? 'info' : 'warn', message: `Exec ${how} in ${ms} ms: ${command}`, fields };
}

/**
 * A request's failure worth a line in the sandbox's log: one of the server or the guest (5xx:
 * agent_unavailable, vmm_failed, internal_error…). A refused request (not found, not running, bad
 * input, a limit) did nothing to the sandbox and is the caller's answer only.
 */
export function failureLine(what: 'Exec' | 'Process start', command: string, err: unknown): SandboxLogLine | undefined {
  const code: ErrorCode = err instanceof CollimateError ? err.code : 'internal_error';
  if (ERROR_CODES[code] < 500) return undefined;
  const text = err instanceof CollimateError ? err.message : 'internal error';
  return {
    level: 'error',
    message: `${what} failed (${code}): ${command}`,
    fields: { event: what === 'Exec' ? 'exec' : 'process', command, error_code: code, error: summaryLine(text, ERROR_TEXT_MAX) },
  };
}

/** What a process start ran, on one line: its command, or its argv joined. */
export function processSummary(req: ProcessStartRequest): string {
  return summaryLine(req.command ?? (req.argv ?? []).join(' '));
}

export function processStartLine(req: ProcessStartRequest, p: ProcessInfo): SandboxLogLine {
  const command = processSummary(req);
  const fields: Record<string, string> = { event: 'process', pid: String(p.pid), command };
  if (p.tag !== null) fields.tag = p.tag;
  if (p.pty) fields.pty = 'true';
  return { level: 'info', message: `Process ${p.pid} started: ${command}`, fields };
}

/** A process's end: info when it exited 0, warn when it exited otherwise, was killed, or was lost. */
export function processExitLine(command: string, p: ProcessInfo): SandboxLogLine {
  const fields: Record<string, string> = { event: 'process', pid: String(p.pid), command, status: p.status };
  if (p.tag !== null) fields.tag = p.tag;
  if (p.exit_code !== null) fields.exit_code = String(p.exit_code);
  if (p.signal !== null) fields.signal = String(p.signal);
  if (p.pids_limited) fields.pids_limited = 'true';
  if (p.status === 'lost') return { level: 'warn', message: `Process ${p.pid} lost (the guest no longer lists it): ${command}`, fields };
  const how = p.signal !== null ? `was killed by signal ${p.signal}` : `exited ${p.exit_code}`;
  const ok = p.signal === null && p.exit_code === 0;
  return { level: ok ? 'info' : 'warn', message: `Process ${p.pid} ${how}${p.pids_limited ? ' (its process limit was hit)' : ''}: ${command}`, fields };
}

/** The reaper ended the session (a suspend; a delete takes the log with it). */
export function reapedLine(action: 'suspend' | 'delete'): SandboxLogLine {
  return { level: 'info', message: `Session timed out: the sandbox was ${action === 'suspend' ? 'suspended' : 'deleted'}`, fields: { event: 'reaper', action } };
}

export function forkedLine(children: readonly string[]): SandboxLogLine {
  return { level: 'info', message: `Forked into ${children.length}: ${children.join(', ')}`, fields: { event: 'lifecycle', op: 'fork', children: children.join(',') } };
}

export function startedFromSnapshotLine(snapshot: string): SandboxLogLine {
  return { level: 'info', message: `Started from snapshot ${snapshot}`, fields: { event: 'lifecycle', op: 'start_from_snapshot', snapshot } };
}

export function snapshotTakenLine(snapshot: string, name: string | null): SandboxLogLine {
  return { level: 'info', message: `Snapshot ${snapshot} taken${name === null ? '' : ` (${name})`}`, fields: { event: 'snapshot', snapshot, ...(name === null ? {} : { name }) } };
}

export function sessionEndLine(endsAtMs: number): SandboxLogLine {
  const at = new Date(endsAtMs).toISOString();
  return { level: 'info', message: `Session now ends at ${at}`, fields: { event: 'lifecycle', op: 'timeout', ends_at: at } };
}
