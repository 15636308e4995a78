/**
 * Background processes of a sandbox: started once, they run beside execs and outlive the call that
 * started them. `sb.processes.start(...)` answers as soon as the process runs (the start waits its
 * turn behind the sandbox's queued execs, like an exec); the handle's other calls never wait behind
 * an exec.
 */
import { errorFromBody } from './errors.js';
import type { Transport } from './transport.js';
import type { ProcessInfo, ProcessOutputEvent, ProcessStartRequest } from './types.js';

/** Output streams run as long as the process does: their client-side limit is a day unless given. */
const OUTPUT_STREAM_TIMEOUT_MS = 24 * 3600_000;
/** One long poll of wait(); the server caps it at 300 s. */
const WAIT_POLL_SECS = 60;

export class SandboxProcesses {
  constructor(private readonly http: Transport, private readonly sandboxId: string) {}

  private path(suffix = ''): string {
    return `/v1/sandboxes/${encodeURIComponent(this.sandboxId)}/processes${suffix}`;
  }

  /**
   * Starts a background process: `{ command: 'python3 -m http.server' }` (a /bin/sh -c string) or
   * `{ argv: ['sh'] }`; `stdin: true` keeps its stdin open for sendStdin, `pty: { cols, rows }` runs
   * it on a terminal (one output stream, `pty`; input is typed into it). Never retried.
   */
  async start(req: ProcessStartRequest): Promise<ProcessHandle> {
    const info = await this.http.json<ProcessInfo>({ method: 'POST', path: this.path(), json: req, retry: 'none' });
    return new ProcessHandle(this.http, this.sandboxId, info);
  }

  /** Running processes and the last ones that exited, in start order. */
  async list(): Promise<ProcessInfo[]> {
    return (await this.http.json<{ processes: ProcessInfo[] }>({ method: 'GET', path: this.path(), retry: 'safe' })).processes;
  }

  /** A handle on process `pid` (NotFoundError, code process_not_found, if there is none). */
  async get(pid: number): Promise<ProcessHandle> {
    const info = await this.http.json<ProcessInfo>({ method: 'GET', path: this.path(`/${pid}`), retry: 'safe' });
    return new ProcessHandle(this.http, this.sandboxId, info);
  }
}

export class ProcessHandle {
  /** As of the last call that returned it (refresh() re-reads it). */
  info: ProcessInfo;

  constructor(private readonly http: Transport, readonly sandboxId: string, info: ProcessInfo) {
    this.info = info;
  }

  get pid(): number {
    return this.info.pid;
  }

  private path(suffix = ''): string {
    return `/v1/sandboxes/${encodeURIComponent(this.sandboxId)}/processes/${this.info.pid}${suffix}`;
  }

  async refresh(): Promise<this> {
    this.info = await this.http.json<ProcessInfo>({ method: 'GET', path: this.path(), retry: 'safe' });
    return this;
  }

  /**
   * Its output as it comes: `{type: 'stdout'|'stderr'|'pty', data, offset}` chunks, `{type: 'gap',
   * from, to}` for output the server no longer has, then `{type: 'exit', process}` and the end.
   * `from`: 'start' (default: what the server holds, then live), 'now', or an offset (to reattach:
   * the last offset seen plus its data's length). Breaking out of the loop detaches; the process runs on.
   */
  async *output(opts: { from?: 'start' | 'now' | number; timeoutMs?: number } = {}): AsyncGenerator<ProcessOutputEvent, void, undefined> {
    const from = opts.from === undefined ? undefined : String(opts.from);
    for await (const ev of this.http.sse({ method: 'GET', path: this.path('/output'), query: { from }, retry: 'none', timeoutMs: opts.timeoutMs ?? OUTPUT_STREAM_TIMEOUT_MS })) {
      const payload = JSON.parse(ev.data);
      if (ev.event === 'stdout' || ev.event === 'stderr' || ev.event === 'pty') {
        yield { type: ev.event, data: Buffer.from(payload.data, 'base64'), offset: payload.offset };
      } else if (ev.event === 'gap') {
        yield { type: 'gap', from: payload.from, to: payload.to };
      } else if (ev.event === 'exit') {
        this.info = payload.process;
        yield { type: 'exit', process: payload.process };
        return;
      } else if (ev.event === 'error') {
        throw errorFromBody(undefined, payload);
      }
    }
  }

  /**
   * Sends bytes to its stdin (a string is sent as UTF-8). An async iterable is streamed as it
   * produces (one request; nothing is buffered whole). Resolves once the guest wrote it all into the
   * process's stdin: a process that does not read holds the call. Never retried.
   */
  async sendStdin(data: string | Uint8Array | AsyncIterable<Uint8Array>, opts: { timeoutMs?: number } = {}): Promise<number> {
    const body = typeof data === 'string' ? { raw: Buffer.from(data, 'utf8') } : data instanceof Uint8Array ? { raw: data } : { stream: data };
    const r = await this.http.json<{ written: number }>({ method: 'POST', path: this.path('/stdin'), ...body, retry: 'none', timeoutMs: opts.timeoutMs });
    return r.written;
  }

  /** Ends its input (on a terminal: types the EOF character, ^D). */
  async closeStdin(): Promise<this> {
    this.info = await this.http.json<ProcessInfo>({ method: 'POST', path: this.path('/close-stdin'), retry: 'none' });
    return this;
  }

  /** Sends a signal ('SIGTERM', 'INT', 9…) to its process group. */
  async signal(signal: string | number): Promise<this> {
    this.info = await this.http.json<ProcessInfo>({ method: 'POST', path: this.path('/signal'), json: { signal }, retry: 'none' });
    return this;
  }

  /** SIGKILL to its process group. */
  kill(): Promise<this> {
    return this.signal('SIGKILL');
  }

  /** Resizes its terminal (a process started with `pty`). */
  async resize(cols: number, rows: number): Promise<this> {
    this.info = await this.http.json<ProcessInfo>({ method: 'POST', path: this.path('/resize'), json: { cols, rows }, retry: 'safe' });
    return this;
  }

  /**
   * Waits until it exits (long polls), at most `timeoutSecs` (default: for ever); returns it as it is
   * then (status `running` if the time ran out).
   */
  async wait(opts: { timeoutSecs?: number } = {}): Promise<ProcessInfo> {
    const deadline = opts.timeoutSecs === undefined ? Infinity : Date.now() + opts.timeoutSecs * 1000;
    for (;;) {
      const left = Math.max(0, Math.min(WAIT_POLL_SECS, (deadline - Date.now()) / 1000));
      this.info = await this.http.json<ProcessInfo>({ method: 'POST', path: this.path('/wait'), json: { timeout: left }, retry: 'safe', timeoutMs: (left + 30) * 1000 });
      if (this.info.status !== 'running' || Date.now() >= deadline) return this.info;
    }
  }
}
