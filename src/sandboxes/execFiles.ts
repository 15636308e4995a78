import { CollimateError, type ErrorCode } from '../errors.js';
import { AgentError, ClientErrorCode } from '../guest/agentClient.js';
import { listeningPorts } from '../net/ports.js';
import type { ReadyTemplate } from '../images/templates.js';
import { buildAgentExec, toExecResult, killedBySigkill, oomKilledDuring, execSeed, userNotFound, OOM_PROBE } from './exec.js';
import { settledLink, type Running } from './registry.js';
import { gone, networkReason, rowFor, runningFor, type EngineContext } from './context.js';
import type { ExecRequest, ExecResult, ExecStreamHandlers, OpenPort, PortTarget, Scope } from './types.js';
import { requestHostOf } from './portHost.js';

/**
 * What runs inside a running sandbox through its agent: execs, file reads and writes, and the
 * reading of its listening ports. Each takes its turn on the sandbox's queue.
 */

export async function execIn(ctx: EngineContext, id: string, req: ExecRequest, scope?: Scope, stream?: ExecStreamHandlers): Promise<ExecResult> {
  ctx.assertOpen();
  const r = runningFor(ctx, id, scope, 'exec');
  const row = ctx.repo.get(id)!;
  let t: ReadyTemplate | undefined;
  try { t = ctx.templates.resolve(row.template, row.tenant); } catch { t = undefined; /* removed since; run with defaults */ }
  const agentReq = buildAgentExec(req, {
    interpreter: t?.interpreter ?? ['/bin/sh', '-c'], defaultTimeoutSecs: ctx.cfg.defaultExecTimeoutSecs, maxOutputBytes: ctx.cfg.maxOutputBytes,
    defaults: t?.execDefaults,
  });
  const queuedAt = Date.now();
  return r.queue.run(async () => {
    if (r.deleting) throw gone(r);
    const startedAt = Date.now();
    try {
      // The guest enforces the exec timeout; the client-side limit only catches a guest that hangs.
      const out = await r.live.agent.exec(agentReq, { ...(stream ?? {}), timeoutMs: (agentReq.timeoutMs ?? 60_000) + 30_000 });
      const finishedAt = Date.now();
      const oomKilled = killedBySigkill(out.result) ? await oomProbe(r, startedAt) : false;
      ctx.registry.touch(id, true);
      return toExecResult({ ...out, oomKilled }, { queuedAt, startedAt, finishedAt }, agentReq.seed);
    } catch (e) {
      await settledLink(r);
      throw agentFailure(r, e);
    }
  });
}

export async function readFileIn(ctx: EngineContext, id: string, path: string, scope?: Scope): Promise<Buffer> {
  ctx.assertOpen();
  const r = runningFor(ctx, id, scope, 'reading a file');
  checkGuestPath(path);
  return r.queue.run(async () => {
    try {
      const data = await r.live.agent.readFile(path);
      ctx.registry.touch(id, false);
      return data;
    } catch (e) {
      await settledLink(r);
      throw agentFailure(r, e, path);
    }
  });
}

export async function writeFileIn(ctx: EngineContext, id: string, path: string, data: Buffer, scope?: Scope, mode?: number): Promise<void> {
  ctx.assertOpen();
  const r = runningFor(ctx, id, scope, 'writing a file');
  checkGuestPath(path);
  await r.queue.run(async () => {
    try {
      await r.live.agent.writeFile(path, data, mode);
      ctx.registry.touch(id, false);
    } catch (e) {
      await settledLink(r);
      throw agentFailure(r, e, path);
    }
  });
}

/**
 * The listening TCP ports of a running sandbox, read from the guest's /proc/net/tcp{,6} when no
 * operation is queued on it (an exec may run for an hour: then the last reading).
 */
export async function openPorts(ctx: EngineContext, id: string, scope?: Scope): Promise<OpenPort[]> {
  const row = rowFor(ctx, id, scope);
  const r = ctx.registry.get(id);
  if (row.state !== 'running' || !r || r.deleting || !row.vmm?.net) return ctx.registry.portsOf(id);
  // Busy, or paused for being quiescent (nothing of its own runs: it listens on nothing new).
  if (r.queue.depth > 0 || r.paused) return ctx.registry.portsOf(id);
  try {
    const ports = await r.queue.run(async () => {
      const tables = await Promise.all(['/proc/net/tcp', '/proc/net/tcp6'].map((p) => r.live.agent.readFile(p).then((b) => b.toString(), () => '')));
      return listeningPorts(tables.join('\n'));
    });
    ctx.registry.setPorts(id, ports);
    return ports;
  } catch {
    return ctx.registry.portsOf(id);
  }
}

/** Where the host connects to reach `port` of a running sandbox (its namespace's address). */
export function portTarget(ctx: EngineContext, id: string, port: number, scope?: Scope): PortTarget {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new CollimateError('validation_error', `port must be an integer from 1 to 65535, not ${JSON.stringify(port)}.`);
  const r = runningFor(ctx, id, scope, 'reaching a port');
  const net = r.live.record.net;
  if (!net) throw new CollimateError('network_unavailable', `Sandbox ${id} has no network (${ctx.net ? 'its template was baked without one' : networkReason(ctx.cfg)}), so its ports cannot be reached.`);
  // A connection to a sandbox paused for being quiescent wakes it (its gate runs in the next turn).
  if (r.paused) r.queue.run(async () => {}).catch(() => {});
  const row = ctx.repo.get(id);
  return { host: net.nsIp, port, publicPorts: row?.public_ports === 1, requestHost: requestHostOf(row?.port_host, port) };
}

/** Whether the guest OOM killer struck during an exec that just ended by SIGKILL (exec.ts OOM_PROBE). */
async function oomProbe(r: Running, startedAt: number): Promise<boolean> {
  try {
    const probe = await r.live.agent.exec({ commands: [['/bin/sh', '-c', OOM_PROBE]], timeoutMs: 10_000, maxOutput: 64 * 1024, seed: execSeed(undefined) }, { timeoutMs: 20_000 });
    // The window runs from the exec's start to the probe's answer, which read the guest's uptime.
    return oomKilledDuring(probe.stdout.toString(), Date.now() - startedAt);
  } catch {
    return false;
  }
}

/** Guest file-system codes (docs/agent-protocol.md, FS error codes) and what clients see for them. */
const FS_CODES: Readonly<Record<string, ErrorCode>> = {
  not_a_directory: 'not_a_directory',
  is_a_directory: 'is_a_directory',
  file_exists: 'file_exists',
  directory_not_empty: 'directory_not_empty',
  permission_denied: 'permission_denied',
  too_many_watches: 'too_many_watches',
  no_space: 'no_space',
  file_changed: 'file_changed',
  invalid_path: 'validation_error',
  cross_device: 'file_operation_failed',
  read_only: 'file_operation_failed',
  fs_failed: 'file_operation_failed',
  watch_not_found: 'not_found',
};

/** An agent's failure as clients see it: the guest's own errors by code, anything else agent_unavailable. */
export function agentFailure(r: Running, e: unknown, path?: string): Error {
  if (r.lost) return new CollimateError('vmm_failed', `Sandbox ${r.id}'s VM died during this request: ${r.lost}. The sandbox is deleted; create or fork a new one.`, { cause: e });
  if (r.deleting) return gone(r);
  if (e instanceof CollimateError) return e;
  if (e instanceof AgentError) {
    if (e.code === 'file_not_found') return new CollimateError('file_not_found', path !== undefined ? `No file at ${path} in sandbox ${r.id}${/destination/.test(e.message) ? ` (${e.message})` : ''}.` : `${e.message} (sandbox ${r.id}).`);
    if (e.code === 'not_a_file') return new CollimateError('validation_error', `${path} in sandbox ${r.id} is not a regular file.`);
    if (e.code === 'file_write_failed' || e.code === 'file_read_failed') return new CollimateError('validation_error', `${e.message}`);
    if (e.code === 'file_too_large') return new CollimateError('payload_too_large', e.message);
    if (e.code === 'bad_request') return new CollimateError('validation_error', `The guest rejected the request: ${e.message}`);
    if (e.code === 'user_not_found') return userNotFound(r.id, e.message);
    const fsCode = FS_CODES[e.code];
    if (fsCode) return new CollimateError(fsCode, `${e.message} (sandbox ${r.id}).`);
    // The host could not even encode it (a field the protocol cannot carry): the request's fault, not the agent's.
    if (e.code === ClientErrorCode.InvalidRequest) return new CollimateError('validation_error', `The request cannot be sent to the guest: ${e.message}`);
  }
  return new CollimateError('agent_unavailable', `The guest agent of sandbox ${r.id} did not answer (${(e as Error).message}). The sandbox can still be deleted.`, { cause: e });
}

function checkGuestPath(path: string): void {
  if (typeof path !== 'string' || !path.startsWith('/') || path.includes('\0') || path.length > 4096) {
    throw new CollimateError('validation_error', 'path must be an absolute path inside the sandbox, e.g. /root/data.txt.');
  }
}
