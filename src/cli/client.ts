import { parseSse } from '../sdk/transport.js';

/**
 * A minimal HTTP client for the REST API, used by the CLI. Errors come back as CliHttpError carrying
 * the server's stable error code.
 */
export class CliHttpError extends Error {
  constructor(readonly status: number, readonly code: string, message: string) {
    super(message);
  }
}

export interface ClientOptions {
  url: string;
  key?: string;
}

export class ApiClient {
  constructor(private readonly opts: ClientOptions) {}

  /** An API path (a signed port URL, say) as an absolute URL, resolved like every request's. */
  absolute(path: string): string {
    return new URL(path, this.opts.url).href;
  }

  async request(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any; headers: Headers }> {
    const res = await this.fetch(method, path, body, headers);
    const text = await res.text();
    let parsed: any = undefined;
    if (text) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = text;
      }
    }
    if (!res.ok) throw toError(res.status, parsed);
    return { status: res.status, body: parsed, headers: res.headers };
  }

  /** POST exec with Accept: text/event-stream; calls onEvent for each SSE event, returns the result. */
  async execStream(path: string, body: unknown, onEvent: (event: string, data: any) => void): Promise<any> {
    const res = await this.fetch('POST', path, body, { accept: 'text/event-stream' });
    if (!res.ok || !res.body) {
      const text = await res.text();
      let parsed: any = text;
      try {
        parsed = JSON.parse(text);
      } catch {}
      throw toError(res.status, parsed);
    }
    let result: any = undefined;
    for await (const { event, data } of parseSse(res.body)) {
      const payload = JSON.parse(data);
      if (event === 'error') throw toError(0, payload);
      if (event === 'result') result = payload;
      onEvent(event, payload);
    }
    if (result === undefined) throw new CliHttpError(0, 'stream_ended', 'The stream ended without a result.');
    return result;
  }

  /** GET an SSE stream; calls onEvent for each event until the server ends it (an `error` event throws). */
  async stream(path: string, onEvent: (event: string, data: any) => void): Promise<void> {
    const res = await this.fetch('GET', path, undefined, { accept: 'text/event-stream' });
    if (!res.ok || !res.body) {
      const text = await res.text();
      let parsed: any = text;
      try {
        parsed = JSON.parse(text);
      } catch {}
      throw toError(res.status, parsed);
    }
    for await (const { event, data } of parseSse(res.body)) {
      const payload = JSON.parse(data);
      if (event === 'error') throw toError(0, payload);
      onEvent(event, payload);
    }
  }

  /** POST a raw body: bytes, or a stream sent as it is read (chunked). */
  async upload(path: string, body: Buffer | AsyncIterable<Uint8Array>): Promise<{ status: number; body: any }> {
    const res = await this.fetch('POST', path, Buffer.isBuffer(body) ? { raw: body } : { stream: body }, {});
    const text = await res.text();
    let parsed: any = text;
    try {
      parsed = JSON.parse(text);
    } catch {}
    if (!res.ok) throw toError(res.status, parsed);
    return { status: res.status, body: parsed };
  }

  private async fetch(method: string, path: string, body: unknown, headers: Record<string, string>): Promise<Response> {
    const h: Record<string, string> = { ...headers };
    if (this.opts.key) h.authorization = `Bearer ${this.opts.key}`;
    let payload: string | Buffer | ReadableStream<Uint8Array> | undefined;
    const raw = body as { raw?: Buffer; stream?: AsyncIterable<Uint8Array> } | undefined;
    if (raw && typeof raw === 'object' && (raw.raw || raw.stream)) {
      h['content-type'] = 'application/octet-stream';
      if (raw.raw) payload = raw.raw;
      else {
        const it = raw.stream![Symbol.asyncIterator]();
        payload = new ReadableStream<Uint8Array>({
          async pull(c) {
            const { value, done } = await it.next();
            if (done) c.close();
            else c.enqueue(value);
          },
        });
      }
    } else if (body !== undefined) {
      payload = JSON.stringify(body);
      h['content-type'] = 'application/json';
    }
    try {
      return await fetch(new URL(path, this.opts.url), { method, headers: h, body: payload, ...(payload instanceof ReadableStream ? { duplex: 'half' } : {}) } as RequestInit);
    } catch (e) {
      throw new CliHttpError(0, 'connection_failed', `Cannot reach ${this.opts.url} (${(e as Error).cause ?? (e as Error).message}). Is \`collimate serve\` running? Set --url or COLLIMATE_BASE_URL.`);
    }
  }
}

function toError(status: number, body: any): CliHttpError {
  const e = body && typeof body === 'object' ? body.error : undefined;
  if (e && typeof e.code === 'string') return new CliHttpError(status, e.code, e.message ?? e.code);
  return new CliHttpError(status, 'http_error', `HTTP ${status}: ${String(body ?? '').slice(0, 200)}`);
}
