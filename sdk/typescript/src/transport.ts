/**
 * HTTP for the SDK: authentication, JSON and raw bodies, client-side timeouts, SSE parsing, and the
 * retry policy. Retries happen only where repeating the request cannot do anything twice:
 *   - `safe` (GETs): on connection errors and 502/503/504;
 *   - `idempotent` (create, fork): the caller sends an Idempotency-Key and the same key goes with
 *     every attempt, so the server runs the operation once; on connection errors and 503;
 *   - `none` (exec, suspend, resume, delete, file writes): never.
 */
import { CollimateError, ConnectionError, errorFromBody, TimeoutError } from './errors.js';

export type RetryPolicy = 'none' | 'safe' | 'idempotent';

export interface TransportOptions {
  baseUrl: string;
  apiKey?: string;
  /** Attempts after the first for retryable requests (default 3). */
  maxRetries?: number;
  /** Default client-side timeout per attempt, ms (default 60 000). */
  timeoutMs?: number;
  fetch?: typeof fetch;
}

export interface RequestSpec {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  path: string;
  query?: Record<string, string | number | string[] | undefined>;
  json?: unknown;
  raw?: Uint8Array;
  /** A body streamed as it is produced (sent chunked). */
  stream?: AsyncIterable<Uint8Array>;
  headers?: Record<string, string>;
  retry?: RetryPolicy;
  timeoutMs?: number;
}

export interface SseEvent {
  event: string;
  data: string;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export class Transport {
  readonly baseUrl: string;
  private readonly apiKey: string | undefined;
  private readonly maxRetries: number;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(opts: TransportOptions) {
    this.baseUrl = opts.baseUrl.replace(/\/+$/, '');
    this.apiKey = opts.apiKey;
    this.maxRetries = opts.maxRetries ?? 3;
    this.timeoutMs = opts.timeoutMs ?? 60_000;
    this.fetchImpl = opts.fetch ?? fetch;
  }

  /** An absolute URL of an API path (the `url` of a port or a signed port URL: relative to the API base). */
  absolute(path: string): string {
    return this.baseUrl + path;
  }

  /**
   * A request through the ports proxy (`path` under /v1/sandboxes/{id}/ports/{port}/): this client's
   * key goes with it (the proxy keeps it), and the sandbox server's own response comes back whatever
   * its status. Only errors of the proxy itself, marked `X-Collimate-Error`, are thrown as the mapped
   * errors. Never retried. The client-side timeout covers the wait for the response headers.
   */
  async proxy(path: string, init: RequestInit = {}, timeoutMs = this.timeoutMs): Promise<Response> {
    const ctrl = new AbortController();
    const signal = init.signal ? AbortSignal.any([init.signal, ctrl.signal]) : ctrl.signal;
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ctrl.abort();
    }, timeoutMs);
    const headers = new Headers(init.headers);
    if (this.apiKey) headers.set('authorization', `Bearer ${this.apiKey}`);
    let res: Response;
    try {
      res = await this.fetchImpl(this.baseUrl + path, { ...init, headers, signal, ...(init.body instanceof ReadableStream ? { duplex: 'half' } : {}) } as RequestInit);
    } catch (e) {
      const spec: RequestSpec = { method: (init.method ?? 'GET') as RequestSpec['method'], path };
      if (timedOut) throw timeoutError(spec, timeoutMs, e);
      if (init.signal?.aborted) throw e;
      const cause = (e as Error & { cause?: { code?: string; message?: string } }).cause;
      throw new ConnectionError(`Cannot reach ${this.baseUrl} (${cause?.code ?? cause?.message ?? (e as Error).message}).`, { code: 'connection_failed', status: 0, cause: e });
    } finally {
      clearTimeout(timer);
    }
    if (res.headers.has('x-collimate-error')) throw await responseError(res);
    return res;
  }

  /**
   * A request with a streamed body and/or a streamed response: resolves with the 2xx Response once
   * its headers arrive (errors are thrown mapped). The client-side timeout covers the wait for the
   * headers only; `signal` aborts the whole exchange. Never retried.
   */
  async open(spec: RequestSpec & { body?: ReadableStream<Uint8Array> | Uint8Array; signal?: AbortSignal }): Promise<Response> {
    const ctrl = new AbortController();
    const signal = spec.signal ? AbortSignal.any([spec.signal, ctrl.signal]) : ctrl.signal;
    const ms = spec.timeoutMs ?? this.timeoutMs;
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ctrl.abort();
    }, ms);
    const url = new URL(this.baseUrl + spec.path);
    for (const [k, v] of Object.entries(spec.query ?? {})) {
      if (v === undefined) continue;
      for (const item of Array.isArray(v) ? v : [v]) url.searchParams.append(k, String(item));
    }
    const headers: Record<string, string> = { ...spec.headers };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    if (spec.body !== undefined) headers['content-type'] = 'application/octet-stream';
    let res: Response;
    try {
      res = await this.fetchImpl(url, { method: spec.method, headers, body: spec.body, signal, ...(spec.body instanceof ReadableStream ? { duplex: 'half' } : {}) } as RequestInit);
    } catch (e) {
      if (timedOut) throw timeoutError(spec, ms, e);
      if (spec.signal?.aborted) throw e;
      const cause = (e as Error & { cause?: { code?: string; message?: string } }).cause;
      throw new ConnectionError(`Cannot reach ${this.baseUrl} (${cause?.code ?? cause?.message ?? (e as Error).message}).`, { code: 'connection_failed', status: 0, cause: e });
    } finally {
      clearTimeout(timer);
    }
    if (!res.ok) throw await responseError(res);
    return res;
  }

  /** A JSON request; resolves with the parsed body (undefined for 204). */
  json<T>(spec: RequestSpec): Promise<T> {
    return this.request(spec, async (res) => {
      const text = res.status === 204 ? '' : await res.text();
      return (text ? JSON.parse(text) : undefined) as T;
    });
  }

  /** A request whose successful body is raw bytes. */
  bytes(spec: RequestSpec): Promise<Buffer> {
    return this.request(spec, async (res) => Buffer.from(await res.arrayBuffer()));
  }

  /**
   * A request answered with an SSE stream; yields its events. Error responses before the stream
   * starts are thrown as mapped errors. The timeout covers the whole stream. Stopping the iteration,
   * or `signal`, closes the connection; an aborted `signal` rejects with its AbortError.
   */
  async *sse(spec: RequestSpec & { signal?: AbortSignal }): AsyncGenerator<SseEvent> {
    const ctrl = new AbortController();
    const signal = spec.signal ? AbortSignal.any([spec.signal, ctrl.signal]) : ctrl.signal;
    const ms = spec.timeoutMs ?? this.timeoutMs;
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ctrl.abort();
    }, ms);
    try {
      const res = await this.attempt({ ...spec, headers: { ...spec.headers, accept: 'text/event-stream' } }, signal, () => timedOut, ms);
      if (!res.ok) throw await responseError(res);
      if (!res.body) throw new ConnectionError('The server sent no stream.', { code: 'stream_ended', status: res.status });
      try {
        yield* parseSse(res.body);
      } catch (e) {
        if (timedOut) throw timeoutError(spec, ms, e);
        if (e instanceof CollimateError || spec.signal?.aborted) throw e;
        throw new ConnectionError(`The stream from ${this.baseUrl} broke (${(e as Error).message}).`, { code: 'connection_failed', status: 0, cause: e });
      }
    } finally {
      clearTimeout(timer);
      ctrl.abort(); // frees the connection if the consumer stopped early
    }
  }

  /**
   * Sends with retries per the policy and reads a 2xx response with `read` (under the same
   * client-side timeout); throws mapped errors.
   */
  async request<T>(spec: RequestSpec, read: (res: Response) => Promise<T>): Promise<T> {
    const policy = spec.retry ?? 'none';
    const ms = spec.timeoutMs ?? this.timeoutMs;
    for (let attempt = 0; ; attempt++) {
      const ctrl = new AbortController();
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        ctrl.abort();
      }, ms);
      let retryAfterMs: number | undefined;
      try {
        const res = await this.attempt(spec, ctrl.signal, () => timedOut, ms);
        if (res.ok) {
          try {
            return await read(res);
          } catch (e) {
            if (timedOut) throw timeoutError(spec, ms, e);
            throw new ConnectionError(`The response from ${this.baseUrl} broke off (${(e as Error).message}).`, { code: 'connection_failed', status: 0, cause: e });
          }
        }
        const err = await responseError(res);
        const retryable = policy === 'safe' ? [502, 503, 504].includes(res.status) : policy === 'idempotent' ? res.status === 503 : false;
        if (!retryable || attempt >= this.maxRetries) throw err;
        const hinted = Number(res.headers.get('retry-after'));
        if (Number.isFinite(hinted) && hinted > 0 && hinted <= 30) retryAfterMs = hinted * 1000;
      } catch (e) {
        if (!(e instanceof ConnectionError) || policy === 'none' || attempt >= this.maxRetries) throw e;
      } finally {
        clearTimeout(timer);
      }
      await sleep(retryAfterMs ?? backoffMs(attempt));
    }
  }

  private async attempt(spec: RequestSpec, signal: AbortSignal, timedOut: () => boolean, ms: number): Promise<Response> {
    const url = new URL(this.baseUrl + spec.path);
    for (const [k, v] of Object.entries(spec.query ?? {})) {
      if (v === undefined) continue;
      for (const item of Array.isArray(v) ? v : [v]) url.searchParams.append(k, String(item));
    }
    const headers: Record<string, string> = { ...spec.headers };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    let body: string | Uint8Array | ReadableStream<Uint8Array> | undefined;
    if (spec.json !== undefined) {
      body = JSON.stringify(spec.json);
      headers['content-type'] = 'application/json';
    } else if (spec.raw !== undefined) {
      body = spec.raw;
      headers['content-type'] = 'application/octet-stream';
    } else if (spec.stream !== undefined) {
      const source = spec.stream[Symbol.asyncIterator]();
      body = new ReadableStream<Uint8Array>({
        async pull(controller) {
          const { value, done } = await source.next();
          if (done) controller.close();
          else controller.enqueue(value);
        },
        async cancel() {
          await source.return?.();
        },
      });
      headers['content-type'] = 'application/octet-stream';
    }
    try {
      // duplex 'half': a streamed request body (Node's fetch requires saying so).
      return await this.fetchImpl(url, { method: spec.method, headers, body, signal, ...(spec.stream ? { duplex: 'half' } : {}) } as RequestInit);
    } catch (e) {
      if (timedOut()) throw timeoutError(spec, ms, e);
      // Aborted, not by the timeout: the caller's own signal (sse's), whose AbortError is theirs.
      if (signal.aborted) throw e;
      const cause = (e as Error & { cause?: { code?: string; message?: string } }).cause;
      throw new ConnectionError(
        `Cannot reach ${this.baseUrl} (${cause?.code ?? cause?.message ?? (e as Error).message}). Is the server running? Check baseUrl / COLLIMATE_BASE_URL.`,
        { code: 'connection_failed', status: 0, cause: e },
      );
    }
  }
}

function timeoutError(spec: RequestSpec, ms: number, cause: unknown): TimeoutError {
  return new TimeoutError(`${spec.method} ${spec.path} got no complete answer within ${ms} ms (client-side timeout).`, {
    code: 'client_timeout',
    status: 0,
    cause,
  });
}

async function responseError(res: Response): Promise<CollimateError> {
  let text = '';
  try {
    text = await res.text();
  } catch {}
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {}
  return errorFromBody(res.status, body, res.headers.get('retry-after'));
}

function backoffMs(attempt: number): number {
  const base = Math.min(5000, 200 * 2 ** attempt);
  return base / 2 + Math.random() * (base / 2);
}

/** Parses a text/event-stream body into events (`event:` name, joined `data:` lines). */
export async function* parseSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const decoder = new TextDecoder();
  let buf = '';
  let heldCr = false; // a chunk ending in \r may be the first half of \r\n
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    let text: string = (heldCr ? '\r' : '') + decoder.decode(chunk, { stream: true });
    heldCr = text.endsWith('\r');
    if (heldCr) text = text.slice(0, -1);
    buf += text.replace(/\r\n?/g, '\n');
    let sep: number;
    while ((sep = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, sep);
      buf = buf.slice(sep + 2);
      let event = 'message';
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue; // comment (keep-alive ping)
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') event = value;
        else if (field === 'data') data.push(value);
      }
      if (data.length > 0) yield { event, data: data.join('\n') };
    }
  }
}
