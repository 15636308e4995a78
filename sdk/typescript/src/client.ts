/**
 * The Collimate client: `new Collimate({ apiKey, baseUrl })`, then `client.sandboxes.create(...)`.
 * Defaults come from COLLIMATE_API_KEY and COLLIMATE_BASE_URL (http://127.0.0.1:7070).
 */
import { randomUUID } from 'node:crypto';
import { Sandbox } from './sandbox.js';
import { Transport } from './transport.js';
import type { CreateSandboxParams, ListSandboxesParams, SandboxInfo, Template } from './types.js';

export const DEFAULT_BASE_URL = 'http://127.0.0.1:7070';
const CREATE_TIMEOUT_MS = 300_000;

export interface CollimateOptions {
  /** Bearer key (`clm_…`); default $COLLIMATE_API_KEY. */
  apiKey?: string;
  /** Default $COLLIMATE_BASE_URL, else http://127.0.0.1:7070. */
  baseUrl?: string;
  /** Retries of safe and idempotent requests (default 3). */
  maxRetries?: number;
  /** Client-side timeout of ordinary requests, ms (default 60 000; execs wait for their own timeout). */
  timeoutMs?: number;
  fetch?: typeof fetch;
}

export class Collimate {
  readonly sandboxes: Sandboxes;
  /** @internal */
  readonly http: Transport;

  constructor(opts: CollimateOptions = {}) {
    this.http = new Transport({
      baseUrl: opts.baseUrl ?? process.env.COLLIMATE_BASE_URL ?? DEFAULT_BASE_URL,
      apiKey: opts.apiKey ?? process.env.COLLIMATE_API_KEY,
      maxRetries: opts.maxRetries,
      timeoutMs: opts.timeoutMs,
      fetch: opts.fetch,
    });
    this.sandboxes = new Sandboxes(this.http);
  }

  get baseUrl(): string {
    return this.http.baseUrl;
  }

  /** Catalog images: ready to run on every tier, no build step. */
  async images(): Promise<Template[]> {
    return (await this.http.json<{ images: Template[] }>({ method: 'GET', path: '/v1/images', retry: 'safe' })).images;
  }

  /** Every template you can create from (catalog images and, on Pro, your environments). */
  async templates(): Promise<Template[]> {
    return (await this.http.json<{ templates: Template[] }>({ method: 'GET', path: '/v1/templates', retry: 'safe' })).templates;
  }
}

export class Sandboxes {
  constructor(private readonly http: Transport) {}

  /**
   * Creates a running sandbox from a template. Counts against the tier's concurrency cap
   * (ConcurrencyLimitError with `retryAfter` when full). Safe to retry: one Idempotency-Key goes
   * with every attempt, so a retried create never makes two sandboxes.
   */
  async create(params: CreateSandboxParams): Promise<Sandbox> {
    const body: Record<string, unknown> = { template: params.template };
    if (params.labels) body.labels = params.labels;
    if (params.timeoutSecs !== undefined) body.timeout_secs = params.timeoutSecs;
    if (params.egress !== undefined) body.egress = params.egress;
    const info = await this.http.json<SandboxInfo>({
      method: 'POST',
      path: '/v1/sandboxes',
      json: body,
      headers: { 'idempotency-key': randomUUID() },
      retry: 'idempotent',
      timeoutMs: CREATE_TIMEOUT_MS,
    });
    return new Sandbox(this.http, info);
  }

  /** A handle on an existing sandbox (NotFoundError for unknown ids and other tenants'). */
  async get(id: string): Promise<Sandbox> {
    const info = await this.http.json<SandboxInfo>({ method: 'GET', path: `/v1/sandboxes/${encodeURIComponent(id)}`, retry: 'safe' });
    return new Sandbox(this.http, info);
  }

  /**
   * Your sandboxes, optionally filtered by state and labels. Iterate it for pages
   * (`for await (const page of client.sandboxes.list())`), or `await ….all()`.
   */
  list(params: ListSandboxesParams = {}): SandboxPages {
    return new SandboxPages(this.http, params);
  }
}

export class SandboxPages implements AsyncIterable<Sandbox[]> {
  constructor(private readonly http: Transport, private readonly params: ListSandboxesParams) {}

  async *[Symbol.asyncIterator](): AsyncIterator<Sandbox[]> {
    let after: string | undefined;
    for (;;) {
      const page = await this.http.json<{ sandboxes: SandboxInfo[]; next: string | null }>({
        method: 'GET',
        path: '/v1/sandboxes',
        query: {
          state: this.params.state,
          label: Object.entries(this.params.labels ?? {}).map(([k, v]) => `${k}=${v}`),
          limit: this.params.limit,
          after,
        },
        retry: 'safe',
      });
      yield page.sandboxes.map((info) => new Sandbox(this.http, info));
      if (!page.next || page.sandboxes.length === 0) return;
      after = page.next;
    }
  }

  /** Every page, concatenated. */
  async all(): Promise<Sandbox[]> {
    const out: Sandbox[] = [];
    for await (const page of this) out.push(...page);
    return out;
  }
}
