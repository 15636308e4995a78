/**
 * A streamed request body (an upload, a process's stdin) that the server may refuse part-way: its
 * consumers read it without destroying it, and an error is answered only once the rest of the body
 * has been read and discarded, within a time bound.
 *
 * Why: a server that answers 413 (or 404, 409) while the client is still sending and then closes
 * the connection with unread bytes in it makes the kernel send a reset. A client that sends the
 * whole body before it reads the answer (Python's http.client, fetch in Node and so most SDKs) then
 * sees a broken pipe instead of the error. Reading the rest first is what web servers call a
 * lingering close (nginx reads for up to 30 s, giving up after 5 s without a byte); the bytes are
 * dropped as they arrive, so a long body costs the server bandwidth, never memory or disk. Past the
 * bound the error goes out on a connection that is then closed.
 */
import type { IncomingMessage } from 'node:http';

/** A refused body is read and discarded for at most `ms`, and given up after `idleMs` without a byte. */
export const DISCARD_LIMITS = { ms: 30_000, idleMs: 5_000 };

/**
 * The body as chunks for a consumer that may stop early (on a size limit, a closed stdin, a dead
 * agent): stopping pauses it instead of destroying it (and, with it, the client's connection), so
 * the error can still be answered on that connection.
 */
export function bodyChunks(body: IncomingMessage): AsyncIterable<Buffer> {
  return body.iterator({ destroyOnReturn: false });
}

/**
 * Reads and discards what is left of `body`. True when the body was read to its end (the
 * connection can carry the answer and the next request); false when it was cut or outlasted the
 * bound (then answer with `connection: close`).
 */
export function discardRest(body: IncomingMessage, limits = DISCARD_LIMITS): Promise<boolean> {
  if (body.readableEnded || body.complete) return Promise.resolve(true);
  if (body.destroyed) return Promise.resolve(false);
  return new Promise((resolve) => {
    const finish = (ended: boolean) => {
      clearTimeout(overall);
      clearTimeout(idle);
      body.off('data', onData).off('end', onEnd).off('error', onCut).off('close', onCut);
      if (!ended) body.pause();
      resolve(ended);
    };
    const onData = () => idle.refresh();
    const onEnd = () => finish(true);
    const onCut = () => finish(false);
    const overall = setTimeout(() => finish(false), limits.ms);
    const idle = setTimeout(() => finish(false), limits.idleMs);
    body.on('data', onData).on('end', onEnd).on('error', onCut).on('close', onCut);
    body.resume();
  });
}
