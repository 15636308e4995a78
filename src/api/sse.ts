/**
 * Server-sent events for a streaming exec: `stdout`/`stderr` events with base64 chunks, then
 * `result` (the ExecResult view) or `error` (an Error body). A ping comment every 15 s keeps
 * proxies from closing an idle stream. Shutdown aborts open streams with a `shutting_down` error.
 */
import type { FastifyReply } from 'fastify';
import { restNames } from './routes.js';
import { CollimateError } from '../errors.js';
import type { DirWatch, ExecResult, ExecStreamHandlers, FileChange, ProcessEvent, SandboxTransition, WatchEndReason, WatchHandlers } from '../sandboxes/types.js';
import { toClientError, type ErrorLog } from '../wire/errors.js';
import { execResultView } from '../wire/views.js';
import type { CodeResult, CodeStreamHandlers } from '../service/code.js';

/**
 * Bytes an event stream may have waiting for its client: past it a process output stream skips
 * output (reported as a gap), a watch drops changes (reported as one `overflow` change), and the
 * sandbox event stream is closed (the client reconnects and lists again).
 */
export const SSE_PENDING_MAX = 4 * 1024 * 1024;

export function wantsSse(accept: string | undefined): boolean {
  return /\btext\/event-stream\b/i.test(accept ?? '');
}

/** The streams open now, so that shutdown can end them. */
/** Takes `reply` over from Fastify and starts a 200 event stream on it (no caching, no proxy buffering). */
function openEventStream(reply: FastifyReply): FastifyReply['raw'] {
  reply.hijack();
  reply.raw.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache',
    'x-accel-buffering': 'no',
  });
  return reply.raw;
}

export class SseStreams {
  private readonly open = new Set<(err: CollimateError) => void>();

  abortAll(err: CollimateError): void {
    for (const abort of [...this.open]) abort(err);
  }

  /**
   * Hijacks `reply` for a 200 event stream that runs one operation to its `result` event (or an
   * `error` event with an Error body): `run` gets `send` for the events before it, and a signal
   * aborted when the client goes away. The caller has checked everything that should still get its
   * own status code.
   */
  private async streamOne<T>(reply: FastifyReply, log: ErrorLog, requestId: string, run: (send: (event: string, data: unknown) => void, gone: AbortSignal) => Promise<T>): Promise<void> {
    const res = openEventStream(reply);
    const gone = new AbortController();
    let live = true;
    const send = (event: string, data: unknown) => {
      if (live && !res.writableEnded && !res.destroyed) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    };
    const finish = () => {
      if (!live) return;
      live = false;
      clearInterval(ping);
      this.open.delete(abort);
      res.end();
    };
    const abort = (err: CollimateError) => {
      send('error', err.toJSON(restNames));
      finish();
    };
    this.open.add(abort);
    res.on('close', () => {
      if (live) gone.abort();
      finish();
    });
    const ping = setInterval(() => live && !res.destroyed && res.write(': ping\n\n'), 15_000);
    ping.unref();
    try {
      send('result', await run(send, gone.signal));
    } catch (err) {
      send('error', toClientError(err, log, requestId).toJSON(restNames));
    } finally {
      finish();
    }
  }

  /**
   * A streamed exec: `stdout`/`stderr` `{data: base64}`, then `result` (the ExecResult view). A
   * client that goes away just stops receiving; the exec itself runs to completion.
   */
  async streamExec(reply: FastifyReply, log: ErrorLog, requestId: string, exec: (h: ExecStreamHandlers) => Promise<ExecResult>): Promise<void> {
    await this.streamOne(reply, log, requestId, async (send) => execResultView(await exec({
      onStdout: (c) => send('stdout', { data: c.toString('base64') }),
      onStderr: (c) => send('stderr', { data: c.toString('base64') }),
    })));
  }

  /**
   * A streamed code cell: `stdout` / `stderr` `{text}`, `display` (a CodeOutput), `exception` (a
   * CodeError) as they come, then `result` (the CodeResult). A client that goes away interrupts the
   * cell (the kernel stays usable).
   */
  async streamCode(reply: FastifyReply, log: ErrorLog, requestId: string, run: (h: CodeStreamHandlers) => Promise<CodeResult>): Promise<void> {
    await this.streamOne(reply, log, requestId, (send, gone) => run({
      onStdout: (text) => send('stdout', { text }),
      onStderr: (text) => send('stderr', { text }),
      onResult: (output) => send('display', output),
      onError: (error) => send('exception', error),
      signal: gone,
    }));
  }

  /**
   * Hijacks `reply` for a 200 stream of a background process's output: `stdout`/`stderr`/`pty`
   * events `{data: base64, offset}`, `gap` `{from, to}`, then `exit` `{process}` and the end.
   * `subscribe` has been checked (the process exists); it is called with the listener and returns
   * the unsubscribe. A client that goes away unsubscribes; the process runs on.
   */
  async streamProcess(reply: FastifyReply, subscribe: (listener: (e: ProcessEvent) => void) => Promise<() => void>): Promise<void> {
    const res = openEventStream(reply);
    let live = true;
    let unsubscribe: (() => void) | undefined;
    const send = (event: string, data: unknown) => {
      if (live && !res.writableEnded && !res.destroyed) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    };
    const finish = () => {
      if (!live) return;
      live = false;
      clearInterval(ping);
      this.open.delete(abort);
      unsubscribe?.();
      res.end();
    };
    const abort = (err: CollimateError) => {
      send('error', err.toJSON(restNames));
      finish();
    };
    this.open.add(abort);
    res.on('close', finish);
    const ping = setInterval(() => live && !res.destroyed && res.write(': ping\n\n'), 15_000);
    ping.unref();
    let ended = false;
    // A client that reads slower than the process writes is not buffered for without bound: output
    // past SSE_PENDING_MAX unsent is skipped and reported as a gap (it can read it again by offset).
    let skipped: { from: number; to: number } | undefined;
    const flushSkipped = () => {
      if (skipped) send('gap', skipped);
      skipped = undefined;
    };
    const unsub = await subscribe((e) => {
      if (e.type === 'output') {
        if (res.writableLength > SSE_PENDING_MAX) {
          skipped = { from: skipped?.from ?? e.offset, to: e.offset + e.data.length };
          return;
        }
        flushSkipped();
        send(e.stream, { data: e.data.toString('base64'), offset: e.offset });
      } else if (e.type === 'gap') {
        flushSkipped();
        send('gap', { from: e.from, to: e.to });
      } else {
        flushSkipped();
        send('exit', { process: e.process });
        ended = true;
        // Replayed synchronously inside subscribe: the stream ends once it returned.
        queueMicrotask(finish);
      }
    });
    unsubscribe = unsub;
    if (!live || ended) unsub();
  }

  /**
   * A directory watch as an event stream: `change` events, then `end` with the reason when the watch
   * ends on its own (or the server shuts down). `start` sets the watch up first, so its errors still
   * get their status code; the client closing the connection stops the watch.
   */
  async streamWatch(reply: FastifyReply, start: (h: WatchHandlers) => Promise<DirWatch>): Promise<void> {
    const res = reply.raw;
    let live = false;
    let endedEarly: WatchEndReason | undefined;
    const early: FileChange[] = [];
    const write = (event: string, data: unknown) => {
      if (!res.writableEnded && !res.destroyed) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    };
    // A client behind by more than SSE_PENDING_MAX loses changes, and is told so once it catches up.
    let lost = false;
    const change = (c: FileChange) => {
      if (res.writableLength > SSE_PENDING_MAX) {
        lost = true;
        return;
      }
      if (lost) write('change', { op: 'overflow', name: '' });
      lost = false;
      write('change', c);
    };
    let finish = (_reason: WatchEndReason) => {};
    // Events can arrive before the stream is open (in the same read as the watch's reply): kept until then.
    const watch = await start({
      onChange: (c) => (live ? change(c) : early.push(c)),
      onEnd: (reason) => (live ? finish(reason) : (endedEarly = reason)),
    });
    openEventStream(reply);
    // Sent now, not with the first event: the client learns at once that the watch is in place.
    res.flushHeaders();
    live = true;
    const ping = setInterval(() => !res.destroyed && res.write(': ping\n\n'), 15_000);
    ping.unref();
    let done = false;
    const close = () => {
      if (done) return false;
      done = true;
      clearInterval(ping);
      this.open.delete(abort);
      return true;
    };
    finish = (reason) => {
      if (!close()) return;
      write('end', { reason });
      res.end();
    };
    const abort = () => {
      void watch.close();
      finish('shutting_down');
    };
    this.open.add(abort);
    res.once('close', () => {
      if (close()) void watch.close();
    });
    for (const c of early) write('change', c);
    if (endedEarly) finish(endedEarly);
  }

  /**
   * The tenant's sandbox changes as an event stream: one `sandbox` event per change, until the client
   * goes away or the server shuts down. `subscribe` is called with the listener and returns the unsubscribe.
   */
  streamSandboxEvents(reply: FastifyReply, subscribe: (listener: (t: SandboxTransition) => void) => () => void): void {
    const res = openEventStream(reply);
    // Sent now, with a first comment: the client knows the stream is in place before anything
    // changes (it lists the sandboxes after that), and a reader waiting for bytes gets some.
    res.write(': open\n\n');
    const write = (event: string, data: unknown) => {
      if (res.writableEnded || res.destroyed) return;
      // A client this far behind is cut off rather than buffered for: it reconnects and lists again.
      if (res.writableLength > SSE_PENDING_MAX) res.destroy();
      else res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    };
    const unsubscribe = subscribe((t) =>
      write('sandbox', { sandbox_id: t.id, op: t.op, state: t.state, at: new Date().toISOString() }),
    );
    const ping = setInterval(() => !res.destroyed && res.write(': ping\n\n'), 15_000);
    ping.unref();
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearInterval(ping);
      unsubscribe();
      this.open.delete(abort);
    };
    const abort = (err: CollimateError) => {
      write('error', err.toJSON(restNames));
      finish();
      res.end();
    };
    this.open.add(abort);
    res.once('close', finish);
  }

  /**
   * An environment's bake log as it grows: `log` events `{text}` with what was appended (or
   * `{text, reset: true}` with the whole log when its kept tail moved on), until the bake is over:
   * then `end` `{state, error}`. `read` gives the environment now, or null once it is gone. The log
   * lives in the database row the bake writes, so it is read again every `periodMs`.
   */
  streamBakeLog(reply: FastifyReply, read: () => Promise<{ log: string; state: string; error: string | null } | null>, periodMs = 500): void {
    const res = openEventStream(reply);
    const write = (event: string, data: unknown) => {
      if (!res.writableEnded && !res.destroyed) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    };
    let sent = '';
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearInterval(timer);
      this.open.delete(abort);
      res.end();
    };
    let reading = false;
    const tick = async () => {
      if (reading || done) return; // a slow read (another host's environment) is not overtaken
      reading = true;
      let env: Awaited<ReturnType<typeof read>>;
      try {
        env = await read();
      } finally {
        reading = false;
      }
      if (done) return;
      if (!env) {
        write('end', { state: 'deleted', error: null });
        return finish();
      }
      if (env.log !== sent) {
        if (env.log.startsWith(sent)) write('log', { text: env.log.slice(sent.length) });
        else write('log', { text: env.log, reset: true });
        sent = env.log;
      }
      if (env.state === 'ready' || env.state === 'failed') {
        write('end', { state: env.state, error: env.error });
        finish();
      }
    };
    const abort = (err: CollimateError) => {
      write('error', err.toJSON(restNames));
      finish();
    };
    this.open.add(abort);
    const run = () => void tick().catch((err) => abort(err instanceof CollimateError ? err : new CollimateError('internal_error', 'Reading the bake log failed.')));
    const timer = setInterval(run, periodMs);
    timer.unref();
    res.once('close', () => {
      done = true;
      clearInterval(timer);
      this.open.delete(abort);
    });
    run();
  }
}
