/**
 * The Connect protocol (connectrpc.com/docs/protocol) as E2B's envd speaks it to its SDK: HTTP/1.1,
 * JSON codec. Unary calls are a JSON body in and out; server-streaming calls carry enveloped messages
 * (1 flag byte, 4-byte big-endian length, JSON) and end with an end-stream envelope (flag 0x02)
 * holding `{}` or `{"error": {code, message}}`. Client streaming (StreamInput) arrives as enveloped
 * messages in one request body. Only what envd's two services use is here.
 */
import type { ServerResponse } from 'node:http';
import { CollimateError } from '../errors.js';
import { e2bNames } from './names.js';

export const CONNECT_STREAM_TYPE = 'application/connect+json';
const END_STREAM = 0x02;
const COMPRESSED = 0x01;
/** One message: envd's largest (a directory listing) stays far under this. */
export const MAX_ENVELOPE_BYTES = 16 * 1024 * 1024;

export type ConnectCode =
  | 'canceled' | 'unknown' | 'invalid_argument' | 'deadline_exceeded' | 'not_found' | 'already_exists' | 'permission_denied'
  | 'resource_exhausted' | 'failed_precondition' | 'aborted' | 'out_of_range' | 'unimplemented' | 'internal' | 'unavailable' | 'unauthenticated';

const HTTP_STATUS: Record<ConnectCode, number> = {
  canceled: 499, unknown: 500, invalid_argument: 400, deadline_exceeded: 504, not_found: 404, already_exists: 409,
  permission_denied: 403, resource_exhausted: 429, failed_precondition: 400, aborted: 409, out_of_range: 400,
  unimplemented: 501, internal: 500, unavailable: 503, unauthenticated: 401,
};

export class ConnectError extends Error {
  constructor(readonly code: ConnectCode, message: string) {
    super(message);
  }
  get httpStatus(): number {
    return HTTP_STATUS[this.code];
  }
  toJSON(): { code: ConnectCode; message: string } {
    return { code: this.code, message: this.message };
  }
}

/** Our error codes in Connect's vocabulary (the SDK maps these to its error classes). */
export function connectErrorOf(err: CollimateError): ConnectError {
  const byStatus = (): ConnectCode => {
    switch (err.status) {
      case 400: case 413: case 415: return 'invalid_argument';
      case 401: return 'unauthenticated';
      case 403: return 'permission_denied';
      case 404: return 'not_found';
      case 409: return (err.code as string) === 'file_exists' ? 'already_exists' : 'failed_precondition';
      // The guest refused the file operation (busy, read-only, another device): the path's state, not a server fault.
      case 422: return 'failed_precondition';
      case 507: return 'resource_exhausted';
      case 429: return 'resource_exhausted';
      case 501: return 'unimplemented';
      case 502: case 503: return 'unavailable';
      case 504: return 'deadline_exceeded';
      default: return 'internal';
    }
  };
  // A sandbox that is not running has no envd: the SDK reads `unavailable` as "it timed out".
  const code: ConnectCode = err.code === 'invalid_state' ? 'unavailable' : byStatus();
  return new ConnectError(code, err.text(e2bNames));
}

/**
 * A message's JSON text: UTF-8 only, as for every door's JSON (wire/jsonBody.ts). Decoding bad bytes
 * to U+FFFD would run a command or name a path other than the one the client sent.
 */
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
function jsonOf(bytes: Buffer, what: string): unknown {
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    throw new ConnectError('invalid_argument', `${what} is not valid UTF-8; JSON must be sent as UTF-8`);
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new ConnectError('invalid_argument', `${what} is not valid JSON`);
  }
}

export function envelope(message: unknown, flags = 0): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}

/** The enveloped messages of a whole request body (streaming calls), without the end-stream one. */
export function decodeEnvelopes(body: Buffer): unknown[] {
  const out: unknown[] = [];
  let at = 0;
  while (at < body.length) {
    if (body.length - at < 5) throw new ConnectError('invalid_argument', 'truncated envelope header');
    const flags = body[at];
    const len = body.readUInt32BE(at + 1);
    if (len > MAX_ENVELOPE_BYTES) throw new ConnectError('resource_exhausted', `message of ${len} bytes is over the ${MAX_ENVELOPE_BYTES}-byte limit`);
    if (body.length - at - 5 < len) throw new ConnectError('invalid_argument', 'truncated envelope');
    if (flags & COMPRESSED) throw new ConnectError('unimplemented', 'compressed messages are not supported; send them uncompressed');
    const payload = body.subarray(at + 5, at + 5 + len);
    at += 5 + len;
    if (flags & END_STREAM) break;
    out.push(jsonOf(payload, 'a message'));
  }
  return out;
}

/** A unary request's JSON body (empty = `{}`). */
export function decodeUnary(body: Buffer | undefined): Record<string, unknown> {
  if (!body || body.length === 0) return {};
  const value = jsonOf(body, 'the request body');
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new ConnectError('invalid_argument', 'the request body must be a JSON object');
  return value as Record<string, unknown>;
}

export function sendUnary(res: ServerResponse, message: unknown): void {
  const body = Buffer.from(JSON.stringify(message));
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
  res.end(body);
}

export function sendUnaryError(res: ServerResponse, err: ConnectError): void {
  if (res.headersSent) return void res.destroy();
  const body = Buffer.from(JSON.stringify(err.toJSON()));
  res.writeHead(err.httpStatus, { 'content-type': 'application/json', 'content-length': body.length });
  res.end(body);
}

/**
 * One server-streaming response. Errors before the first message still go out as a stream (status
 * 200, an end-stream envelope with the error), which is what Connect clients expect of a stream.
 */
/**
 * Bytes a server stream may have waiting for a client that does not read before it is cut off:
 * producers (a process's output, a directory's changes) do not wait for a client, so without a
 * bound a stalled one would hold all of it in the server's memory.
 */
export const STREAM_PENDING_MAX = 4 * 1024 * 1024;

export class ServerStream {
  private ended = false;
  private keepalive?: NodeJS.Timeout;
  /** Resolves at the next drain (or close), while the socket has more waiting than it takes. */
  private drained?: Promise<void>;

  constructor(private readonly res: ServerResponse) {
    res.writeHead(200, { 'content-type': CONNECT_STREAM_TYPE, 'cache-control': 'no-store' });
    res.flushHeaders();
  }

  get closed(): boolean {
    return this.ended || this.res.destroyed;
  }

  /** Closes the connection of a client too far behind: nothing more is sent. */
  cutOff(): void {
    this.ended = true;
    if (this.keepalive) clearInterval(this.keepalive);
    this.res.destroy();
  }

  /**
   * Writes one message; resolves when the socket took it (backpressure reaches a producer that
   * waits). A client more than STREAM_PENDING_MAX behind is cut off: its connection is closed.
   */
  send(message: unknown): Promise<void> {
    if (this.closed) return Promise.resolve();
    if (this.res.writableLength > STREAM_PENDING_MAX) {
      this.cutOff();
      return Promise.resolve();
    }
    const ok = this.res.write(envelope(message));
    if (ok) return Promise.resolve();
    // Every message sent while the client is behind waits for the same drain: one pair of
    // listeners, not one per message.
    this.drained ??= new Promise<void>((resolve) => {
      const done = () => {
        this.res.off('drain', done);
        this.res.off('close', done);
        this.drained = undefined;
        resolve();
      };
      this.res.once('drain', done);
      this.res.once('close', done);
    });
    return this.drained;
  }

  /** Sends `message()` every `secs` seconds while the stream is open (envd's keepalive events). */
  keepAlive(secs: number, message: () => unknown): void {
    if (!(secs > 0)) return;
    this.keepalive = setInterval(() => void this.send(message()), secs * 1000);
    this.keepalive.unref();
  }

  end(error?: ConnectError): void {
    if (this.keepalive) clearInterval(this.keepalive);
    if (this.closed) return;
    this.ended = true;
    this.res.end(envelope(error ? { error: error.toJSON() } : {}, END_STREAM));
  }
}
