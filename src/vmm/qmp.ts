import { connect, type Socket } from 'node:net';
import { EventEmitter } from 'node:events';

export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
  timestamp?: { seconds: number; microseconds: number };
}

export class QmpError extends Error {
  constructor(readonly qmpClass: string, message: string) {
    super(message);
    this.name = 'QmpError';
  }
}

interface Pending {
  resolve(v: unknown): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout;
  command: string;
}

/** The most a single QMP line may hold; QEMU's replies here are small, a runaway one is a bug. */
const MAX_LINE = 4 * 1024 * 1024;

/**
 * A small QMP client: greeting, capabilities negotiation, id-matched replies, events, timeouts.
 * QMP is JSON lines over a unix socket; replies carry the `id` we sent, events carry none.
 */
export class QmpClient extends EventEmitter {
  private buf = '';
  private nextId = 1;
  private pending = new Map<string, Pending>();
  private closed = false;
  greeting: Record<string, unknown> | undefined;

  private constructor(private readonly sock: Socket) {
    super();
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => this.onData(d));
    sock.on('close', () => this.onClose(new Error('QMP socket closed')));
    sock.on('error', (e) => this.onClose(e));
  }

  /** Connects, waits for the greeting and negotiates capabilities. */
  static async connect(path: string, timeoutMs = 5000): Promise<QmpClient> {
    const sock = await new Promise<Socket>((resolve, reject) => {
      const s = connect(path);
      const t = setTimeout(() => { s.destroy(); reject(new Error(`QMP connect to ${path} timed out`)); }, timeoutMs);
      s.once('connect', () => { clearTimeout(t); resolve(s); });
      s.once('error', (e) => { clearTimeout(t); reject(e); });
    });
    const client = new QmpClient(sock);
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('QMP greeting timed out')), timeoutMs);
      client.once('greeting', () => { clearTimeout(t); resolve(); });
      client.once('closed', (e: Error) => { clearTimeout(t); reject(e); });
    });
    await client.execute('qmp_capabilities', undefined, timeoutMs);
    return client;
  }

  execute<T = unknown>(command: string, args?: Record<string, unknown>, timeoutMs = 10000): Promise<T> {
    if (this.closed) return Promise.reject(new Error(`QMP closed; cannot run ${command}`));
    const id = String(this.nextId++);
    const msg = JSON.stringify(args === undefined ? { execute: command, id } : { execute: command, arguments: args, id });
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`QMP ${command} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, timer, command });
      this.sock.write(msg + '\n');
    });
  }

  /** Resolves with the first event named `name` that satisfies `pred`. */
  waitEvent(name: string, timeoutMs: number, pred: (e: QmpEvent) => boolean = () => true): Promise<QmpEvent> {
    return new Promise((resolve, reject) => {
      const onEvent = (e: QmpEvent) => {
        if (e.event === name && pred(e)) { cleanup(); resolve(e); }
      };
      const onClosed = (err: Error) => { cleanup(); reject(err); };
      const timer = setTimeout(() => { cleanup(); reject(new Error(`timed out waiting for QMP event ${name}`)); }, timeoutMs);
      const cleanup = () => { clearTimeout(timer); this.off('event', onEvent); this.off('closed', onClosed); };
      this.on('event', onEvent);
      this.once('closed', onClosed);
    });
  }

  close(): void {
    this.closed = true;
    this.sock.destroy();
  }

  private onData(d: string): void {
    this.buf += d;
    if (this.buf.length > MAX_LINE && !this.buf.includes('\n')) {
      this.onClose(new Error('QMP line too long'));
      this.sock.destroy();
      return;
    }
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl).trim();
      this.buf = this.buf.slice(nl + 1);
      if (!line) continue;
      let msg: any;
      try { msg = JSON.parse(line); } catch { continue; }
      if (msg.QMP) { this.greeting = msg.QMP; this.emit('greeting', msg.QMP); continue; }
      if (msg.event) { this.emit('event', msg as QmpEvent); continue; }
      const id = msg.id === undefined ? undefined : String(msg.id);
      const p = id === undefined ? undefined : this.pending.get(id);
      if (!p) continue;
      this.pending.delete(id!);
      clearTimeout(p.timer);
      if (msg.error) p.reject(new QmpError(msg.error.class, `QMP ${p.command}: ${msg.error.desc}`));
      else p.resolve(msg.return);
    }
  }

  private onClose(err: Error): void {
    if (this.closed && this.pending.size === 0) { this.emit('closed', err); return; }
    this.closed = true;
    for (const [, p] of this.pending) { clearTimeout(p.timer); p.reject(new Error(`QMP ${p.command}: ${err.message}`)); }
    this.pending.clear();
    this.emit('closed', err);
  }
}
