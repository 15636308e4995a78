/**
 * The code interpreter, as the tenant service offers it (docs/code.md): cells run in stateful kernels
 * inside a sandbox, their outputs as MIME bundles. The kernels and their server live in the guest
 * (src/guest/code/, reached on CODE_PORT through the sandbox's port route — a tunnel when another
 * host of a cluster runs it); this side speaks the server's HTTP protocol, starts the server in a
 * sandbox whose template did not bake one, and turns a cell's stream into a result.
 *
 * The kernels' state is the guest's memory, so whatever keeps a sandbox's memory keeps its kernels:
 * suspend and resume, live fork (each child's kernel goes on from the parent's), snapshots.
 */
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { CollimateError, msg, see } from '../errors.js';
import { CODE_PORT, codeServerScript } from '../guest/codeServer.js';
import type { z } from 'zod';
import type * as S from '../wire/schemas.js';
import type { Scope } from './types.js';
import type { Sandboxes } from './sandboxes.js';

/** The wire's shapes are the service's: what a cell answers goes out as the guest server gave it. */
export type CodeLanguage = NonNullable<z.infer<typeof S.CreateCodeContext>['language']>;
export type CodeContext = z.infer<typeof S.CodeContext>;

export interface RunCodeRequest {
  code: string;
  /** A language's default context (python when absent and the image has it); not with `context`. */
  language?: CodeLanguage;
  /** A context made with createContext. */
  context?: string;
  /** Environment variables set for this cell only. */
  env?: Record<string, string>;
  /** Seconds the cell may run before it is interrupted; default 300. */
  timeoutSecs?: number;
  /** Reseeds the language's own generators before the cell (decimal u64): the same seed in the same state replays it. */
  seed?: string;
}

/** One output of a cell: the last expression's value (`is_main_result`) or a display, as a MIME bundle. */
export type CodeOutput = z.infer<typeof S.CodeOutput>;
export type CodeError = z.infer<typeof S.CodeError>;
/** `timed_out`: the cell ran past its timeout and was interrupted (`error` is then the interruption). */
export type CodeResult = z.infer<typeof S.CodeResult>;

export interface CodeStreamHandlers {
  onStdout?(text: string): void;
  onStderr?(text: string): void;
  onResult?(output: CodeOutput): void;
  onError?(error: CodeError): void;
  /** Aborted: the cell is interrupted (a client that went away). */
  signal?: AbortSignal;
}

export const CODE_TIMEOUT_DEFAULT_SECS = 300;
export const CODE_TIMEOUT_MAX_SECS = 3600;
/** How long a cell past its timeout has to stop once interrupted. */
const INTERRUPT_GRACE_MS = 10_000;
/**
 * How long a request other than a cell (contexts, health) may take: a new Python kernel takes tens of
 * seconds under TCG, and minutes on a loaded host (the guest server gives up on one at 180 s).
 */
const CONTROL_TIMEOUT_MS = 600_000;

interface GuestAnswer {
  status: number;
  body: string;
}

export class CodeInterpreter {
  /** Server starts under way, by sandbox id: concurrent first cells share one. */
  private readonly starting = new Map<string, Promise<void>>();

  constructor(private readonly sandboxes: Sandboxes, private readonly opts: { interruptGraceMs?: number } = {}) {}

  /** Runs one cell to its end; `handlers` see its output as it comes. */
  async run(scope: Scope, id: string, req: RunCodeRequest, handlers: CodeStreamHandlers = {}): Promise<CodeResult> {
    if (req.context !== undefined && req.language !== undefined) {
      throw new CollimateError('validation_error', 'Give either context or language, not both: a context already has its language.');
    }
    const started = Date.now();
    const timeoutSecs = req.timeoutSecs ?? CODE_TIMEOUT_DEFAULT_SECS;
    const result: CodeResult = { context: req.context ?? null, results: [], stdout: '', stderr: '', error: null, execution_count: null, timed_out: false, duration_ms: 0, seed: req.seed ?? null };
    const body = { code: req.code, ...(req.context ? { context_id: req.context } : {}), ...(req.language ? { language: req.language } : {}), ...(req.env ? { env_vars: req.env } : {}), ...(req.seed ? { seed: req.seed } : {}) };
    const abort = new AbortController();
    let interrupting: Promise<unknown> | undefined;
    const interrupt = () => {
      if (interrupting || !result.context) return;
      interrupting = this.call(scope, id, 'POST', `/contexts/${result.context}/interrupt`).catch(() => undefined);
    };
    // Past the timeout the cell is interrupted; a cell deaf to that (a long call in C code that does
    // not check for signals) is left running after a grace period, and the answer says so.
    let abandoned = false;
    let grace: NodeJS.Timeout | undefined;
    const timer = setTimeout(() => {
      result.timed_out = true;
      interrupt();
      grace = setTimeout(() => {
        abandoned = true;
        abort.abort();
      }, this.opts.interruptGraceMs ?? INTERRUPT_GRACE_MS);
    }, timeoutSecs * 1000);
    const onAbort = () => {
      interrupt();
      abort.abort();
    };
    handlers.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      await this.withServer(scope, id, async () => {
        const res = await this.send(scope, id, 'POST', '/execute?format=mime', body, CONTROL_TIMEOUT_MS, abort.signal);
        if (res.statusCode !== 200) throw guestError(id, { status: res.statusCode ?? 502, body: await text(res) }, req.context);
        let ended = false;
        const died = () => new CollimateError('code_unavailable', `The code interpreter of sandbox ${id} stopped answering before the cell ended (its server or kernel died); the context's state may be lost.`);
        for await (const line of lines(res, died)) {
          const ev = parseLine(line);
          if (!ev) continue;
          switch (ev.type) {
            case 'end_of_execution': ended = true; break;
            case 'context': result.context = String(ev.id); break;
            case 'number_of_executions': result.execution_count = Number(ev.execution_count); break;
            case 'stdout': result.stdout += String(ev.text); handlers.onStdout?.(String(ev.text)); break;
            case 'stderr': result.stderr += String(ev.text); handlers.onStderr?.(String(ev.text)); break;
            case 'result': {
              const out = { is_main_result: ev.is_main_result === true, data: (ev.data ?? {}) as Record<string, unknown> };
              result.results.push(out);
              handlers.onResult?.(out);
              break;
            }
            case 'error': {
              const err = { name: String(ev.name ?? ''), value: String(ev.value ?? ''), traceback: String(ev.traceback ?? '') };
              result.error = err;
              handlers.onError?.(err);
              break;
            }
          }
        }
        if (!ended) throw died();
      });
    } catch (err) {
      if (handlers.signal?.aborted) throw new CollimateError('validation_error', 'The cell was interrupted: its client went away.', { cause: err });
      if (!abandoned) throw err;
      result.error = {
        name: 'TimeoutError',
        value: `The cell ran past its timeout (${timeoutSecs} s) and did not stop when interrupted; it may still be running, and its context runs no other cell until it ends: restart the context (POST /v1/sandboxes/${id}/code/contexts/${result.context}/restart).`,
        traceback: '',
      };
      handlers.onError?.(result.error);
    } finally {
      clearTimeout(timer);
      clearTimeout(grace);
      handlers.signal?.removeEventListener('abort', onAbort);
      await interrupting;
    }
    result.duration_ms = Date.now() - started;
    return result;
  }

  async contexts(scope: Scope, id: string): Promise<CodeContext[]> {
    return this.withServer(scope, id, async () => JSON.parse((await this.call(scope, id, 'GET', '/contexts')).body) as CodeContext[]);
  }

  async createContext(scope: Scope, id: string, opts: { language?: CodeLanguage; cwd?: string }): Promise<CodeContext> {
    return this.withServer(scope, id, async () => JSON.parse((await this.call(scope, id, 'POST', '/contexts', { language: opts.language, cwd: opts.cwd })).body) as CodeContext);
  }

  /** A fresh kernel for the context (its variables are gone), same id and working directory. */
  async restartContext(scope: Scope, id: string, context: string): Promise<CodeContext> {
    return this.withServer(scope, id, async () => {
      await this.call(scope, id, 'POST', `/contexts/${encodeURIComponent(context)}/restart`, undefined, context);
      return this.contextOf(scope, id, context);
    });
  }

  /** Interrupts the cell the context runs now (SIGINT: Python raises KeyboardInterrupt); nothing when it is idle. */
  async interruptContext(scope: Scope, id: string, context: string): Promise<CodeContext> {
    return this.withServer(scope, id, async () => {
      await this.call(scope, id, 'POST', `/contexts/${encodeURIComponent(context)}/interrupt`, undefined, context);
      return this.contextOf(scope, id, context);
    });
  }

  async deleteContext(scope: Scope, id: string, context: string): Promise<void> {
    await this.withServer(scope, id, () => this.call(scope, id, 'DELETE', `/contexts/${encodeURIComponent(context)}`, undefined, context));
  }

  private async contextOf(scope: Scope, id: string, context: string): Promise<CodeContext> {
    const found = (await this.contexts(scope, id)).find((c) => c.id === context);
    if (!found) throw contextNotFound(id, context);
    return found;
  }

  /** Runs `op` against the sandbox's server; a sandbox whose server is not running gets it started, then `op` runs again. */
  private async withServer<T>(scope: Scope, id: string, op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (err) {
      if (!isRefused(err)) throw err;
    }
    let start = this.starting.get(id);
    if (!start) {
      start = this.startServer(scope, id).finally(() => this.starting.delete(id));
      this.starting.set(id, start);
    }
    await start;
    return op();
  }

  /** Installs and starts the server in the sandbox (its template baked none), as an exec; waits for its default kernel. */
  private async startServer(scope: Scope, id: string): Promise<void> {
    const r = await this.sandboxes.exec(scope, id, { commands: [['/bin/sh', '-c', codeServerScript()]], timeout: 330 });
    if (r.exit_code === 0) return;
    const why = r.stderr.trim().split('\n').slice(-10).join('\n');
    if (r.exit_code === 3) {
      throw new CollimateError('code_unavailable', `Sandbox ${id} cannot run code cells: its image has no python3, which the code interpreter's server needs. Use the python or node template (or an image with python3 and, for Python cells, ipykernel).`);
    }
    throw new CollimateError('code_unavailable', `The code interpreter of sandbox ${id} did not start (exit ${r.exit_code}${r.timed_out ? ', timed out' : ''}): ${why || 'no output'}`);
  }

  /** A request whose answer is read whole; a non-2xx answer becomes the API's error. */
  private async call(scope: Scope, id: string, method: string, path: string, body?: unknown, context?: string): Promise<GuestAnswer> {
    const res = await this.send(scope, id, method, path, body, CONTROL_TIMEOUT_MS);
    const answer = { status: res.statusCode ?? 502, body: await text(res) };
    if (answer.status < 200 || answer.status >= 300) throw guestError(id, answer, context);
    return answer;
  }

  /** Opens a request to the sandbox's server and resolves with its answer's head. */
  private async send(scope: Scope, id: string, method: string, path: string, body: unknown, timeoutMs: number, signal?: AbortSignal): Promise<IncomingMessage> {
    const route = await this.sandboxes.portTarget(scope, id, CODE_PORT);
    const tunnel: Duplex | undefined = route.target.connect ? await route.target.connect() : undefined;
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    return new Promise<IncomingMessage>((resolve, reject) => {
      const req = httpRequest({
        method, path, host: route.target.host, port: route.target.port, setHost: false,
        headers: { host: `localhost:${CODE_PORT}`, ...(payload ? { 'content-type': 'application/json', 'content-length': String(payload.length) } : {}) },
        ...(tunnel ? { createConnection: () => tunnel as Socket } : { createConnection: () => connect({ host: route.target.host, port: route.target.port }) }),
        signal,
      });
      // Only until the answer's head: a cell's stream may then run as long as its own timeout.
      const timer = setTimeout(() => req.destroy(Object.assign(new Error('no answer'), { code: 'ETIMEDOUT' })), timeoutMs);
      req.on('response', (res) => { clearTimeout(timer); resolve(res); });
      req.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      req.end(payload);
    }).catch((err: NodeJS.ErrnoException) => {
      if (isRefused(err) || signal?.aborted) throw err;
      throw new CollimateError('code_unavailable', `The code interpreter of sandbox ${id} did not answer (${err.code ?? err.message}).`, { cause: err });
    });
  }
}

function isRefused(err: unknown): boolean {
  return (err as NodeJS.ErrnoException)?.code === 'ECONNREFUSED';
}

export function contextNotFound(id: string, context: string): CollimateError {
  return new CollimateError('context_not_found', msg`Sandbox ${id} has no code context ${JSON.stringify(context.slice(0, 100))}. List its contexts${see('listCodeContexts')}, or create one.`);
}

/** The server's non-2xx answer (text/plain) as the API's error. */
function guestError(id: string, a: GuestAnswer, context?: string): CollimateError {
  if (a.status === 404 && context !== undefined) return contextNotFound(id, context);
  if (a.status === 400) return new CollimateError('validation_error', a.body.trim() || 'The code interpreter refused the request.');
  return new CollimateError('code_unavailable', `The code interpreter of sandbox ${id} failed (${a.status}): ${a.body.trim().slice(0, 2000) || 'no message'}`);
}

async function text(res: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** The answer's lines as they come; a connection cut mid-answer is `cut()`. */
async function* lines(res: IncomingMessage, cut: () => Error): AsyncGenerator<string> {
  res.setEncoding('utf8'); // a character split across chunks is decoded whole
  let pending = '';
  try {
    for await (const chunk of res) {
      pending += chunk as string;
      let nl: number;
      while ((nl = pending.indexOf('\n')) >= 0) {
        yield pending.slice(0, nl);
        pending = pending.slice(nl + 1);
      }
    }
  } catch (err) {
    throw Object.assign(cut(), { cause: err });
  }
  if (pending.trim()) yield pending;
}

function parseLine(line: string): Record<string, unknown> | undefined {
  if (!line.trim()) return undefined;
  try {
    const v = JSON.parse(line);
    return v && typeof v === 'object' ? v : undefined;
  } catch {
    return undefined;
  }
}
