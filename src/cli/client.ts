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

  private async fetch(method: string, path: string, body: unknown, headers: Record<string, string>): Promise<Response> {
    const h: Record<string, string> = { ...headers };
    if (this.opts.key) h.authorization = `Bearer ${this.opts.key}`;
    let payload: string | undefined;
    if (body !== undefined) {
      payload = JSON.stringify(body);
      h['content-type'] = 'application/json';
    }
    try {
      return await fetch(new URL(path, this.opts.url), { method, headers: h, body: payload });
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
