import { constants } from 'node:os';
import { CollimateError, msg, see } from '../errors.js';
import { AgentError, ClientErrorCode } from '../guest/agentClient.js';
import type { ProcStartRequest } from '../guest/protocol.js';
import { checkUser, execSeed, userNotFound, withoutImageHome } from './exec.js';
import { gone, rowFor, runningFor, type EngineContext } from './context.js';
import { settledLink, type Running } from './registry.js';
import type { ProcessEvent, ProcessInfo, SandboxProcesses } from './processes.js';
import type { ProcessStartRequest, Scope } from './types.js';

/**
 * Background processes in a running sandbox (processes.ts keeps what the host knows of them).
 *
 * Ordering: a start takes its turn on the sandbox's operation queue like an exec (so it is ordered
 * against execs, file transfers, fork and suspend) and returns as soon as the process runs. Input,
 * close-stdin, signal, resize, listing, waiting and output streaming never queue: they go to the
 * agent beside a running exec (or are answered from the host's table). Each wakes a sandbox the
 * idle pause stopped, as an exec does.
 */

/** Input is sent to the guest in pieces of at most this much (one PROC_INPUT each). */
export const STDIN_CHUNK_BYTES = 64 * 1024;
export const MAX_WAIT_SECS = 300;

const bad = (msg: string) => new CollimateError('validation_error', msg);

/** A signal given by name ("SIGTERM", "TERM") or number, as its number. */
export function signalNumber(signal: unknown): number {
  if (typeof signal === 'number' && Number.isInteger(signal) && signal >= 1 && signal <= 64) return signal;
  if (typeof signal === 'string') {
    const name = (signal.toUpperCase().startsWith('SIG') ? signal.toUpperCase() : `SIG${signal.toUpperCase()}`) as keyof typeof constants.signals;
    const n = constants.signals[name];
    if (typeof n === 'number') return n;
  }
  throw bad(`signal must be a signal name such as "SIGTERM", "SIGINT", "SIGKILL", "SIGHUP", or a number from 1 to 64; got ${JSON.stringify(signal)}.`);
}

/** The guest's request for a process start, validated (like buildAgentExec for an exec). */
export function buildProcStart(req: ProcessStartRequest, defaults?: { env?: Record<string, string>; cwd?: string; prefix?: string[] }, unseededAslr = true): ProcStartRequest {
  if ((req.command === undefined) === (req.argv === undefined)) throw bad('Give exactly one of command (a shell string, run by /bin/sh -c) or argv (a list of strings, e.g. ["python3", "-u", "server.py"]).');
  let argv: string[];
  if (req.command !== undefined) {
    if (typeof req.command !== 'string' || req.command.length === 0) throw bad('command must be a non-empty string.');
    argv = ['/bin/sh', '-c', req.command];
  } else {
    if (!Array.isArray(req.argv) || req.argv.length === 0 || !req.argv.every((a) => typeof a === 'string')) throw bad('argv must be a non-empty list of strings, e.g. ["sleep", "60"].');
    argv = [...req.argv];
  }
  if (argv.some((a) => a.includes('\0'))) throw bad('arguments cannot contain NUL bytes.');
  // A `user` of the request replaces the image's User (its setpriv prefix and the HOME it implies).
  if (defaults?.prefix?.length && req.user === undefined) argv = [...defaults.prefix, ...argv];
  const env: Record<string, string> = withoutImageHome(defaults?.env, req.user);
  for (const [k, v] of Object.entries(req.env ?? {})) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw bad(`env name ${JSON.stringify(k)} is not a valid variable name.`);
    if (typeof v !== 'string' || v.includes('\0')) throw bad(`env value of ${k} must be a string without NUL bytes.`);
    env[k] = v;
  }
  if (req.cwd !== undefined && (typeof req.cwd !== 'string' || !req.cwd.startsWith('/') || req.cwd.includes('\0') || req.cwd.length >= 1024)) throw bad('cwd must be an absolute path without NUL bytes, shorter than 1024 bytes.');
  if (req.tag !== undefined && (typeof req.tag !== 'string' || Buffer.byteLength(req.tag) > 256 || req.tag.includes('\0'))) throw bad('tag must be a string of at most 256 bytes.');
  checkUser(req.user);
  let pty: { cols: number; rows: number } | undefined;
  if (req.pty) {
    const cols = req.pty.cols ?? 80;
    const rows = req.pty.rows ?? 24;
    if (!Number.isInteger(cols) || !Number.isInteger(rows) || cols < 1 || rows < 1 || cols > 65535 || rows > 65535) throw bad('pty.cols and pty.rows must be integers from 1 to 65535.');
    pty = { cols, rows };
  }
  const cwd = req.cwd ?? defaults?.cwd;
  return {
    argv, env,
    // A background process (a server, a shell, a PTY) is seeded only when asked: unseeded it has the
    // kernel's randomness, and ASLR unless the host turns it off (under TCG by default: the engine's
    // unseededAslr, docs/determinism.md). Execs are always seeded.
    ...(req.seed !== undefined ? { seed: execSeed(req.seed) } : unseededAslr ? {} : { noAslr: true }),
    ...(cwd !== undefined ? { cwd } : {}),
    ...(pty ? { pty } : {}),
    ...(req.stdin ? { stdinOpen: true } : {}),
    ...(req.tag !== undefined ? { tag: req.tag } : {}),
    ...(req.user !== undefined ? { user: req.user } : {}),
  };
}

/** A paused sandbox is woken first (its queue's gate); one that is not is not queued behind an exec. */
async function awake(r: Running): Promise<void> {
  if (r.paused) await r.queue.run(async () => {});
}

/** The agent's refusal as clients see it. */
function processFailure(ctx: EngineContext, r: Running, pid: number | undefined, e: unknown): Error {
  if (r.lost) return new CollimateError('vmm_failed', `Sandbox ${r.id}'s VM died during this request: ${r.lost}. The sandbox is deleted; create or fork a new one.`, { cause: e });
  if (r.deleting) return gone(r);
  if (e instanceof AgentError && e.code === 'stdin_closed' && pid !== undefined) ctx.processes.of(r.id).stdinClosed(pid);
  return processError(r.id, pid, e);
}

/** A guest agent's process error (its codes, docs/agent-protocol.md) as a CollimateError. */
export function processError(id: string, pid: number | undefined, e: unknown): Error {
  if (e instanceof CollimateError) return e;
  if (e instanceof AgentError) {
    switch (e.code) {
      case 'process_not_found': return processNotFound(id, pid ?? 0);
      case 'process_exited': return new CollimateError('process_exited', `Process ${pid} in sandbox ${id} has exited; its output and status stay readable.`);
      case 'stdin_closed': return new CollimateError('stdin_closed', `Process ${pid} in sandbox ${id} takes no input: start it with "stdin": true (or a pty), and before closing its stdin.`);
      case 'not_a_terminal': return new CollimateError('not_a_terminal', `Process ${pid} in sandbox ${id} does not run on a pseudo-terminal; start it with "pty" to resize it.`);
      case 'too_many_processes': return new CollimateError('too_many_processes', `Sandbox ${id} runs 64 background processes, the most it may; wait for one to exit or signal one.`);
      case 'command_not_found': return new CollimateError('command_not_found', `The program was not found in sandbox ${id}: ${e.message}. Give a path, or a program on PATH.`);
      case 'user_not_found': return userNotFound(id, e.message);
      case 'spawn_failed': return new CollimateError('spawn_failed', `The process could not be started in sandbox ${id}: ${e.message}.`);
      case 'bad_request': return new CollimateError('validation_error', `The guest rejected the request: ${e.message}`);
      case ClientErrorCode.InvalidRequest: return new CollimateError('validation_error', `The request cannot be sent to the guest: ${e.message}`);
    }
  }
  return new CollimateError('agent_unavailable', `The guest agent of sandbox ${id} did not answer (${(e as Error).message}). The sandbox can still be deleted.`, { cause: e });
}

export function processNotFound(id: string, pid: number): CollimateError {
  return new CollimateError('process_not_found', msg`Sandbox ${id} has no background process ${pid}. List them${see('listProcesses', { id })}.`);
}

export function checkPid(pid: unknown): number {
  if (typeof pid !== 'number' || !Number.isInteger(pid) || pid < 1 || pid > 0x7fffffff) throw bad('pid must be a positive integer.');
  return pid;
}

export function checkWaitSecs(timeoutSecs: unknown): number {
  if (typeof timeoutSecs !== 'number' || !(timeoutSecs >= 0) || timeoutSecs > MAX_WAIT_SECS) throw bad(`timeout must be a number of seconds from 0 to ${MAX_WAIT_SECS}.`);
  return timeoutSecs;
}

export function checkSize(cols: unknown, rows: unknown): void {
  if (!Number.isInteger(cols) || !Number.isInteger(rows) || (cols as number) < 1 || (rows as number) < 1 || (cols as number) > 65535 || (rows as number) > 65535) throw bad('cols and rows must be integers from 1 to 65535.');
}

/** Starts a background process in its turn on the queue; resolves once it runs. */
export async function startProcess(ctx: EngineContext, id: string, req: ProcessStartRequest, scope?: Scope): Promise<ProcessInfo> {
  ctx.assertOpen();
  const r = runningFor(ctx, id, scope, 'starting a process');
  const row = ctx.repo.get(id)!;
  let defaults;
  try { defaults = ctx.templates.resolve(row.template, row.tenant).execDefaults; } catch { defaults = undefined; }
  const agentReq = buildProcStart(req, defaults, ctx.cfg.unseededAslr);
  return r.queue.run(async () => {
    if (r.deleting) throw gone(r);
    try {
      const started = await r.live.agent.startProcess(agentReq);
      ctx.registry.touch(id, false);
      return ctx.processes.of(id).started(agentReq, started);
    } catch (e) {
      await settledLink(r);
      throw processFailure(ctx, r, undefined, e);
    }
  });
}

/** The processes the host knows of in `id` (any state: a suspended sandbox's are listed as they were). */
export async function listProcesses(ctx: EngineContext, id: string, scope?: Scope): Promise<ProcessInfo[]> {
  const procs = await tableOf(ctx, id, scope);
  return procs.list();
}

export async function getProcess(ctx: EngineContext, id: string, pid: number, scope?: Scope): Promise<ProcessInfo> {
  const procs = await tableOf(ctx, id, scope);
  const info = procs.get(checkPid(pid));
  if (!info) throw processNotFound(id, pid);
  return info;
}

/** The sandbox's table once the last sync with its agent is in. */
async function tableOf(ctx: EngineContext, id: string, scope?: Scope): Promise<SandboxProcesses> {
  rowFor(ctx, id, scope);
  const procs = ctx.processes.of(id);
  await procs.synced;
  return procs;
}

/**
 * Output of a process as events: what the host holds from `from` on, then live output, then its
 * exit. Returns the unsubscribe.
 */
export async function watchProcessOutput(
  ctx: EngineContext, id: string, pid: number, from: 'start' | 'now' | number, listener: (e: ProcessEvent) => void, scope?: Scope,
): Promise<() => void> {
  const procs = await tableOf(ctx, id, scope);
  if (!procs.has(checkPid(pid))) throw processNotFound(id, pid);
  return procs.subscribe(pid, from, listener);
}

/** Resolves once the process exited, or after `timeoutSecs` with it as it is then (status running). */
export async function waitProcess(ctx: EngineContext, id: string, pid: number, timeoutSecs: number, scope?: Scope): Promise<ProcessInfo> {
  checkWaitSecs(timeoutSecs);
  const procs = await tableOf(ctx, id, scope);
  if (!procs.has(checkPid(pid))) throw processNotFound(id, pid);
  const r = ctx.registry.get(id);
  if (r && procs.get(pid)?.status === 'running') await awake(r);
  return procs.wait(pid, timeoutSecs * 1000);
}

/** A running sandbox with a process `pid` known to the host, awake. */
async function liveProcess(ctx: EngineContext, id: string, pid: number, scope: Scope | undefined, operation: string): Promise<Running> {
  ctx.assertOpen();
  const r = runningFor(ctx, id, scope, operation);
  const procs = ctx.processes.of(id);
  await procs.synced;
  if (!procs.has(checkPid(pid))) throw processNotFound(id, pid);
  await awake(r);
  return r;
}

/**
 * Writes `data` to the process's stdin as it comes, in pieces of at most STDIN_CHUNK_BYTES, each
 * acknowledged by the guest once written into the pipe: a process that does not read holds the
 * caller (nothing is buffered whole).
 */
export async function writeProcessStdin(ctx: EngineContext, id: string, pid: number, data: AsyncIterable<Buffer> | Buffer, scope?: Scope): Promise<number> {
  const r = await liveProcess(ctx, id, pid, scope, 'writing to a process');
  let written = 0;
  const source: AsyncIterable<Buffer> | Buffer[] = Buffer.isBuffer(data) ? [data] : data;
  try {
    for await (const chunk of source) {
      for (let at = 0; at < chunk.length; at += STDIN_CHUNK_BYTES) {
        const piece = chunk.subarray(at, at + STDIN_CHUNK_BYTES);
        await r.live.agent.processInput(pid, piece);
        written += piece.length;
      }
    }
  } catch (e) {
    await settledLink(r);
    throw processFailure(ctx, r, pid, e);
  }
  ctx.registry.touch(id, false);
  return written;
}

export async function closeProcessStdin(ctx: EngineContext, id: string, pid: number, scope?: Scope): Promise<void> {
  const r = await liveProcess(ctx, id, pid, scope, 'closing a process\'s stdin');
  try {
    await r.live.agent.closeProcessStdin(pid);
    ctx.processes.of(id).stdinClosed(pid);
  } catch (e) {
    await settledLink(r);
    throw processFailure(ctx, r, pid, e);
  }
}

export async function signalProcess(ctx: EngineContext, id: string, pid: number, signal: unknown, scope?: Scope): Promise<void> {
  const n = signalNumber(signal);
  const r = await liveProcess(ctx, id, pid, scope, 'signalling a process');
  try {
    await r.live.agent.signalProcess(pid, n);
    ctx.registry.touch(id, false);
  } catch (e) {
    await settledLink(r);
    throw processFailure(ctx, r, pid, e);
  }
}

export async function resizeProcess(ctx: EngineContext, id: string, pid: number, cols: number, rows: number, scope?: Scope): Promise<void> {
  checkSize(cols, rows);
  const r = await liveProcess(ctx, id, pid, scope, 'resizing a terminal');
  try {
    await r.live.agent.resizeProcess(pid, cols, rows);
  } catch (e) {
    await settledLink(r);
    throw processFailure(ctx, r, pid, e);
  }
}
