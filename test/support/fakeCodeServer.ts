/**
 * A stand-in for the guest's code interpreter server (src/guest/code/server.py) on a host port, so
 * the API server on the fake engine (whose portTarget maps CODE_PORT here) runs code cells without a
 * VM. It speaks the same protocol: POST /execute answers NDJSON lines (context,
 * number_of_executions, stdout/stderr, result, error, end_of_execution); /contexts lists, creates,
 * restarts, interrupts and deletes. Each context is a node:vm context, so state carries across cells
 * for real; a seed reseeds its Math.random, so a seeded cell replays.
 *
 * Special cells: `wait()` prints `waiting` and blocks until its context is interrupted (then raises
 * KeyboardInterrupt; as the real server, a client that goes away mid-cell interrupts it too), for
 * tests of interrupting a cell by closing its stream; `die()` ends the
 * answer without end_of_execution, as a server whose kernel died.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { once } from 'node:events';
import vm from 'node:vm';

interface FakeContext {
  id: string;
  language: string;
  cwd: string;
  sandbox: vm.Context;
  count: number;
  /** Ends the cell waiting in it (`wait()`), if one is. */
  interruptWaiting?: () => void;
}

export interface FakeCodeServer {
  port: number;
  /** Every /execute body, in order. */
  readonly executed: Array<Record<string, unknown>>;
  /** Context ids interrupted, in order. */
  readonly interrupts: string[];
  /** Resolves once a cell calling wait() is waiting. */
  waiting(): Promise<void>;
  /** Resolves with the context of the next interrupt. */
  interrupted(): Promise<string>;
  /** Resolves once `context` has been interrupted (at once if it already was). */
  interruptOf(context: string): Promise<void>;
  close(): Promise<void>;
}

/** A small deterministic PRNG (mulberry32) from a u64 seed's low 32 bits. */
function seeded(seed: string): () => number {
  let a = Number(BigInt(seed) & 0xffffffffn);
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export async function startFakeCodeServer(): Promise<FakeCodeServer> {
  const contexts = new Map<string, FakeContext>();
  const defaults = new Map<string, string>();
  const executed: Array<Record<string, unknown>> = [];
  const interrupts: string[] = [];
  let onWaiting: (() => void) | undefined;
  let waitingNow = false;
  const onInterrupt = new Set<(context: string) => void>();

  const make = (language: string, cwd = '/root'): FakeContext => {
    const ctx: FakeContext = { id: randomUUID(), language, cwd, sandbox: vm.createContext({ Math: Object.create(Math) }), count: 0 };
    contexts.set(ctx.id, ctx);
    return ctx;
  };
  const interrupt = (ctx: FakeContext) => {
    interrupts.push(ctx.id);
    for (const listener of onInterrupt) listener(ctx.id);
    ctx.interruptWaiting?.();
    ctx.interruptWaiting = undefined;
  };
  const view = (c: FakeContext) => ({ id: c.id, language: c.language, cwd: c.cwd });
  const body = async (req: IncomingMessage): Promise<Record<string, any>> => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    return chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : {};
  };
  const text = (res: ServerResponse, status: number, msg: string) => res.writeHead(status, { 'content-type': 'text/plain' }).end(msg);
  const json = (res: ServerResponse, value: unknown) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(value));

  const execute = async (b: Record<string, any>, res: ServerResponse) => {
    executed.push(b);
    let ctx: FakeContext | undefined;
    if (b.context_id) {
      ctx = contexts.get(b.context_id);
      if (!ctx) return text(res, 404, `Context ${b.context_id} not found`);
    } else {
      const language = b.language ?? 'python';
      ctx = contexts.get(defaults.get(language) ?? '') ?? make(language);
      defaults.set(language, ctx.id);
    }
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.on('close', () => !res.writableFinished && interrupt(ctx));
    const line = (v: unknown) => res.write(`${JSON.stringify(v)}\n`);
    line({ type: 'context', id: ctx.id, language: ctx.language });
    line({ type: 'number_of_executions', execution_count: ++ctx.count });
    if (b.seed !== undefined) ctx.sandbox.Math.random = seeded(b.seed);
    ctx.sandbox.env = { ...(b.env_vars ?? {}) };
    if (b.code.trim() === 'die()') return res.end();
    if (b.code.trim() === 'wait()') {
      line({ type: 'stdout', text: 'waiting\n' });
      await new Promise<void>((resolve) => {
        ctx.interruptWaiting = resolve;
        waitingNow = true;
        onWaiting?.();
      });
      waitingNow = false;
      line({ type: 'error', name: 'KeyboardInterrupt', value: '', traceback: 'KeyboardInterrupt' });
    } else {
      ctx.sandbox.print = (...xs: unknown[]) => line({ type: 'stdout', text: `${xs.join(' ')}\n` });
      ctx.sandbox.printErr = (...xs: unknown[]) => line({ type: 'stderr', text: `${xs.join(' ')}\n` });
      ctx.sandbox.display = (v: unknown) => line({ type: 'result', is_main_result: false, data: { 'text/plain': String(v), 'text/html': `<b>${String(v)}</b>` } });
      try {
        const value = vm.runInContext(b.code, ctx.sandbox);
        if (value !== undefined) line({ type: 'result', is_main_result: true, data: { 'text/plain': String(value) } });
      } catch (e) {
        const err = e as Error;
        line({ type: 'error', name: err.name, value: err.message, traceback: `${err.name}: ${err.message}` });
      }
    }
    ctx.sandbox.env = {};
    line({ type: 'end_of_execution' });
    res.end();
  };

  const server: Server = createServer(async (req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    const parts = url.pathname.split('/').filter(Boolean);
    const b = await body(req);
    if (req.method === 'POST' && parts[0] === 'execute') return execute(b, res);
    if (parts[0] !== 'contexts') return text(res, 404, `No route ${req.method} ${url.pathname}`);
    if (parts.length === 1 && req.method === 'GET') return json(res, [...contexts.values()].map(view));
    if (parts.length === 1 && req.method === 'POST') return json(res, view(make(b.language ?? 'python', b.cwd)));
    const ctx = contexts.get(parts[1]);
    if (!ctx) return text(res, 404, `Context ${parts[1]} not found`);
    if (req.method === 'DELETE' && parts.length === 2) {
      contexts.delete(ctx.id);
      return text(res, 204, '');
    }
    if (req.method === 'POST' && parts[2] === 'restart') {
      ctx.sandbox = vm.createContext({ Math: Object.create(Math) });
      ctx.count = 0;
      return json(res, view(ctx));
    }
    if (req.method === 'POST' && parts[2] === 'interrupt') {
      interrupt(ctx);
      return json(res, view(ctx));
    }
    return text(res, 404, `No route ${req.method} ${url.pathname}`);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as { port: number }).port,
    executed,
    interrupts,
    waiting: () => (waitingNow ? Promise.resolve() : new Promise<void>((resolve) => (onWaiting = resolve))),
    interrupted: () =>
      new Promise<string>((resolve) => {
        const once = (context: string) => (onInterrupt.delete(once), resolve(context));
        onInterrupt.add(once);
      }),
    interruptOf: (context) =>
      new Promise<void>((resolve) => {
        if (interrupts.includes(context)) return resolve();
        const once = (c: string) => c === context && (onInterrupt.delete(once), resolve());
        onInterrupt.add(once);
      }),
    async close() {
      for (const c of contexts.values()) c.interruptWaiting?.();
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
}
