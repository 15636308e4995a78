import { randomBytes } from 'node:crypto';
import { CollimateError } from '../errors.js';
import type { ExecRequest, ExecResult } from './types.js';

/** The request the guest agent takes: argv lists plus what to set up before running them. */
export interface AgentExecRequest {
  commands: string[][];
  env?: Record<string, string>;
  cwd?: string;
  stdin?: Buffer;
  files?: { path: string; mode?: number; data: Buffer }[];
  timeoutMs?: number;
  maxOutput?: number;
  /** Seed of the exec's user-space randomness (docs/determinism.md); always set by buildAgentExec. */
  seed: bigint;
  /** The image's account the commands run as (absent: root). */
  user?: string;
}

export interface AgentExecOutput {
  result: {
    exitCode: number;
    signal?: number;
    timedOut: boolean;
    stdoutTruncated: boolean;
    stderrTruncated: boolean;
    failedIndex: number;
    errorText?: string;
    /** The guest agent killed the exec's processes at its process limit. */
    pidsLimited?: true;
  };
  stdout: Buffer;
  stderr: Buffer;
  /** Set by the engine when the guest OOM killer killed a process of this exec (see OOM_PROBE). */
  oomKilled?: boolean;
}

export const MAX_EXEC_TIMEOUT_SECS = 3600;

const bad = (msg: string) => new CollimateError('validation_error', msg);

export const MAX_SEED = (1n << 64n) - 1n;
/** Canonical decimal of a u64: "0", or no leading zero, at most 20 digits (the range is checked apart). */
export const SEED_RE = /^(0|[1-9][0-9]{0,19})$/;
export const SEED_FORMAT_MESSAGE =
  'seed must be an unsigned 64-bit integer written as a decimal string without leading zeros, from "0" to "18446744073709551615" (e.g. "42"; a JSON number would lose precision).';

/** The seed of an exec: the caller's, validated, or a fresh one from the host CSPRNG. */
export function execSeed(seed: unknown): bigint {
  if (seed === undefined) return randomBytes(8).readBigUInt64LE(0);
  if (typeof seed !== 'string' || !SEED_RE.test(seed) || BigInt(seed) > MAX_SEED) throw bad(SEED_FORMAT_MESSAGE);
  return BigInt(seed);
}

/**
 * Turns the spec's three exec forms into argv lists for the agent: `command` is a shell string
 * (`/bin/sh -c`), `code` goes to the template's interpreter, `commands` are run as given, in order.
 */
export function buildAgentExec(
  req: ExecRequest,
  opts: { interpreter: string[]; defaultTimeoutSecs: number; maxOutputBytes: number; defaults?: { env?: Record<string, string>; cwd?: string; prefix?: string[] } },
): AgentExecRequest {
  const forms = [req.command !== undefined, req.code !== undefined, req.commands !== undefined].filter(Boolean).length;
  if (forms !== 1) throw bad('Give exactly one of command (a shell string), code (source for the template interpreter) or commands (a list of argv lists).');
  let commands: string[][];
  if (req.command !== undefined) {
    if (typeof req.command !== 'string' || req.command.length === 0) throw bad('command must be a non-empty string.');
    commands = [['/bin/sh', '-c', req.command]];
  } else if (req.code !== undefined) {
    if (typeof req.code !== 'string') throw bad('code must be a string.');
    commands = [[...opts.interpreter, req.code]];
  } else {
    const c = req.commands;
    if (!Array.isArray(c) || c.length === 0 || c.length > 256) throw bad('commands must be a list of 1 to 256 argv lists, e.g. [["ls", "-l"], ["pwd"]].');
    for (const argv of c) {
      if (!Array.isArray(argv) || argv.length === 0 || !argv.every((a) => typeof a === 'string')) throw bad('each entry of commands must be a non-empty list of strings, e.g. ["ls", "-l"].');
    }
    commands = c.map((a) => [...a]);
  }
  for (const argv of commands) for (const a of argv) if (a.includes('\0')) throw bad('arguments cannot contain NUL bytes.');
  const timeout = req.timeout ?? opts.defaultTimeoutSecs;
  if (typeof timeout !== 'number' || !(timeout > 0) || timeout > MAX_EXEC_TIMEOUT_SECS) throw bad(`timeout must be a number of seconds greater than 0 and at most ${MAX_EXEC_TIMEOUT_SECS}.`);
  // A `user` of the request replaces the image's User (its setpriv prefix and the HOME it implies).
  if (opts.defaults?.prefix?.length && req.user === undefined) commands = commands.map((argv) => [...opts.defaults!.prefix!, ...argv]);
  const env: Record<string, string> = withoutImageHome(opts.defaults?.env, req.user);
  for (const [k, v] of Object.entries(req.env ?? {})) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw bad(`env name ${JSON.stringify(k)} is not a valid variable name.`);
    if (typeof v !== 'string' || v.includes('\0')) throw bad(`env value of ${k} must be a string without NUL bytes.`);
    env[k] = v;
  }
  if (req.cwd !== undefined && (typeof req.cwd !== 'string' || !req.cwd.startsWith('/') || req.cwd.includes('\0'))) throw bad('cwd must be an absolute path without NUL bytes.');
  const seed = execSeed(req.seed);
  checkUser(req.user);
  const files = (req.files ?? []).map((f) => {
    if (typeof f?.path !== 'string' || !f.path.startsWith('/') || f.path.includes('\0')) throw bad('each file needs an absolute path.');
    if (typeof f.content !== 'string') throw bad(`file ${f.path}: content must be a string (utf8, or base64 with encoding "base64").`);
    const enc = f.encoding ?? 'utf8';
    if (enc !== 'utf8' && enc !== 'base64') throw bad(`file ${f.path}: encoding must be "utf8" or "base64".`);
    if (f.mode !== undefined && (!Number.isInteger(f.mode) || f.mode < 0 || f.mode > 0o7777)) throw bad(`file ${f.path}: mode must be an integer from 0 to 4095 (0o7777).`);
    return { path: f.path, mode: f.mode, data: Buffer.from(f.content, enc) };
  });
  return {
    commands,
    env,
    cwd: req.cwd ?? opts.defaults?.cwd,
    stdin: req.stdin === undefined ? undefined : Buffer.from(req.stdin, 'utf8'),
    files,
    timeoutMs: Math.round(timeout * 1000),
    maxOutput: opts.maxOutputBytes,
    seed,
    ...(req.user !== undefined ? { user: req.user } : {}),
  };
}

/** An image's exec environment, less the HOME of its User when a request names its own account (the agent sets that one's). */
export function withoutImageHome(env: Record<string, string> | undefined, user: string | undefined): Record<string, string> {
  const out = { ...(env ?? {}) };
  if (user !== undefined) delete out.HOME;
  return out;
}

/** The agent's refusal of a `user` the sandbox's image does not have. */
export function userNotFound(id: string, why: string): CollimateError {
  return new CollimateError('user_not_found', `Sandbox ${id} has no such account (${why}). Name an account of its image (root always; "user" in the debian image), or create it first (useradd).`);
}

/** What a `user` may be: an account name as useradd makes them (and at most USER_NAME_MAX long). */
export const USER_NAME_RE = /^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}$/;

/**
 * `user`: the name of an account in the sandbox's image (its /etc/passwd), as execs, processes and
 * file writes take it. Whether the image has it is the agent's to say (user_not_found).
 */
export function checkUser(user: unknown): void {
  if (user === undefined) return;
  if (typeof user !== 'string' || !USER_NAME_RE.test(user)) {
    throw new CollimateError('validation_error', `user must be the name of an account in the sandbox's image (its /etc/passwd), e.g. "root" or "user": letters, digits, '_', '.', '-', at most 64; not ${JSON.stringify(String(user).slice(0, 80))}.`);
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Output that is valid UTF-8 is returned as text; anything else as base64, flagged — never mangled. */
export function encodeOutput(buf: Buffer): { text: string; encoding: 'utf8' | 'base64' } {
  try {
    return { text: utf8.decode(buf), encoding: 'utf8' };
  } catch {
    return { text: buf.toString('base64'), encoding: 'base64' };
  }
}

/** `seed` is the one the request was sent with (AgentExecRequest.seed); the result echoes it. */
export function toExecResult(out: AgentExecOutput, t: { queuedAt: number; startedAt: number; finishedAt: number }, seed: bigint): ExecResult {
  const so = encodeOutput(out.stdout);
  const se = encodeOutput(out.stderr);
  const r = out.result;
  return {
    stdout: so.text,
    stderr: se.text,
    stdout_encoding: so.encoding,
    stderr_encoding: se.encoding,
    exit_code: r.exitCode,
    timed_out: r.timedOut,
    stdout_truncated: r.stdoutTruncated,
    stderr_truncated: r.stderrTruncated,
    ...(r.failedIndex !== undefined ? { failed_index: r.failedIndex } : {}),
    ...(r.signal !== undefined ? { signal: r.signal } : {}),
    ...(out.oomKilled ? { oom_killed: true } : {}),
    ...(r.pidsLimited ? { pids_limited: true } : {}),
    ...(r.errorText ? { error: r.errorText } : {}),
    seed: seed.toString(),
    timing: {
      queued_at: new Date(t.queuedAt).toISOString(),
      started_at: new Date(t.startedAt).toISOString(),
      finished_at: new Date(t.finishedAt).toISOString(),
      queued_ms: t.startedAt - t.queuedAt,
      run_ms: t.finishedAt - t.startedAt,
    },
  };
}

/**
 * Run after an exec that ended by SIGKILL (signal 9, or a shell's exit 137) without a timeout, to
 * tell a guest OOM kill from a plain `kill -9`: the agent cannot see why a child died, the guest
 * kernel log can. Prints the guest uptime, then the last OOM-kill lines with their timestamps.
 */
export const OOM_PROBE = "cat /proc/uptime; dmesg 2>/dev/null | grep -i 'killed process' | tail -n 20";

/** Whether the exec was SIGKILLed in a way worth probing for the OOM killer (not by a timeout or the process limit). */
export function killedBySigkill(r: AgentExecOutput['result']): boolean {
  return !r.timedOut && !r.pidsLimited && (r.signal === 9 || r.exitCode === 137);
}

/**
 * True when the guest kernel logged an OOM kill during the exec's run: a `Killed process` line
 * stamped within [uptime - runMs - slack, uptime], where runMs spans the exec's start to the probe's
 * answer (kernel log stamps and /proc/uptime both count from the guest's boot, restored clones
 * included). A process OOM-killed in that window that was not the exec's (a background job) would
 * be attributed to it; the exec must also have died by SIGKILL.
 */
export function oomKilledDuring(probeStdout: string, runMs: number, slackMs = 500): boolean {
  const lines = probeStdout.split('\n');
  const uptime = Number.parseFloat(lines[0] ?? '');
  if (!Number.isFinite(uptime)) return false;
  const from = uptime - (runMs + slackMs) / 1000;
  for (const l of lines.slice(1)) {
    const m = /^\[\s*(\d+\.\d+)\]\s.*Killed process/.exec(l);
    if (m && Number(m[1]) >= from && Number(m[1]) <= uptime + 1) return true;
  }
  return false;
}
