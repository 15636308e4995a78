/**
 * The Collimate client: `new Collimate({ apiKey, baseUrl })`, then `client.sandboxes.create(...)`.
 * Defaults come from COLLIMATE_API_KEY and COLLIMATE_BASE_URL (http://127.0.0.1:7070).
 */
import { randomUUID } from 'node:crypto';
import { Sandbox, snapshotId } from './sandbox.js';
import { Transport } from './transport.js';
import type {
  CreateSandboxParams, FromSnapshotParams, ListSandboxesParams, ListSnapshotsParams, SandboxInfo, Snapshot, Template,
} from './types.js';

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
  readonly snapshots: Snapshots;
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
    this.snapshots = new Snapshots(this.http);
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
    if (params.publicPorts !== undefined) body.public_ports = params.publicPorts;
    if (params.portHost !== undefined) body.port_host = params.portHost;
    if (params.keepMemory !== undefined) body.keep_memory = params.keepMemory;
    return new Sandbox(this.http, await this.postSandboxes(body));
  }

  /**
   * Starts a running sandbox from a snapshot (`sb.snapshot()`): its memory, processes and files,
   * with a fresh identity, as a fork child has; its template, shape and egress policy are the
   * snapshot's. NotFoundError (`snapshot_not_found`) for unknown ids and other tenants'. Counts
   * against the tier's cap; safe to retry, as create is.
   */
  async fromSnapshot(snapshot: string | Snapshot, params: FromSnapshotParams = {}): Promise<Sandbox> {
    const info = await this.startFromSnapshot(snapshot, undefined, params);
    return new Sandbox(this.http, info);
  }

  /**
   * Starts `count` (1..64) running sandboxes from one snapshot in one request, each as fromSnapshot
   * starts one. Each counts against the tier's cap. Safe to retry, as create is.
   */
  async manyFromSnapshot(snapshot: string | Snapshot, count: number, params: FromSnapshotParams = {}): Promise<Sandbox[]> {
    const first = await this.startFromSnapshot(snapshot, count, params);
    // With `count` the answer is the first sandbox and, in `sandboxes`, all of them (it first).
    return first.sandboxes!.map((info) => new Sandbox(this.http, info));
  }

  /** POST /v1/sandboxes with `snapshot` (and `count`: the answer lists every sandbox in `sandboxes`). */
  private startFromSnapshot(snapshot: string | Snapshot, count: number | undefined, params: FromSnapshotParams): Promise<SandboxInfo & { sandboxes?: SandboxInfo[] }> {
    const body: Record<string, unknown> = { snapshot: snapshotId(snapshot) };
    if (count !== undefined) body.count = count;
    if (params.labels) body.labels = params.labels;
    if (params.timeoutSecs !== undefined) body.timeout_secs = params.timeoutSecs;
    if (params.egress !== undefined) body.egress = params.egress;
    if (params.onTimeout !== undefined) body.on_timeout = params.onTimeout;
    if (params.autoResume !== undefined) body.auto_resume = params.autoResume;
    if (params.publicPorts !== undefined) body.public_ports = params.publicPorts;
    if (params.portHost !== undefined) body.port_host = params.portHost;
    if (params.keepMemory !== undefined) body.keep_memory = params.keepMemory;
    return this.postSandboxes(body);
  }

  /**
   * POST /v1/sandboxes (a create, or a start from a snapshot): one Idempotency-Key for every
   * attempt, so a retry never starts twice.
   */
  private postSandboxes(body: Record<string, unknown>): Promise<SandboxInfo & { sandboxes?: SandboxInfo[] }> {
    return this.http.json<SandboxInfo & { sandboxes?: SandboxInfo[] }>({
      method: 'POST',
      path: '/v1/sandboxes',
      json: body,
      headers: { 'idempotency-key': randomUUID() },
      retry: 'idempotent',
      timeoutMs: CREATE_TIMEOUT_MS,
    });
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
    const query = { state: this.params.state, label: labelFilter(this.params.labels), limit: this.params.limit };
    for await (const page of listPages<SandboxInfo>(this.http, '/v1/sandboxes', 'sandboxes', query)) {
      yield page.map((info) => new Sandbox(this.http, info));
    }
  }

  /** Every page, concatenated. */
  async all(): Promise<Sandbox[]> {
    const out: Sandbox[] = [];
    for await (const page of this) out.push(...page);
    return out;
  }
}

/** The tenant's snapshots (take one with `sb.snapshot()`). */
export class Snapshots {
  constructor(private readonly http: Transport) {}

  /** NotFoundError (`snapshot_not_found`) for unknown ids and other tenants'. */
  get(id: string): Promise<Snapshot> {
    return this.http.json<Snapshot>({ method: 'GET', path: `/v1/snapshots/${encodeURIComponent(id)}`, retry: 'safe' });
  }

  /**
   * Your snapshots by id, optionally only those of one sandbox and with every label given. Iterate
   * it for pages (`for await (const page of client.snapshots.list())`), or `await ….all()`.
   */
  list(params: ListSnapshotsParams = {}): SnapshotPages {
    return new SnapshotPages(this.http, params);
  }

  /**
   * Deletes a snapshot: nothing starts from it or rolls back to it any more. Sandboxes started from
   * it run on. Not retried: a repeat would answer NotFoundError.
   */
  async delete(snapshot: string | Snapshot): Promise<void> {
    await this.http.json<void>({ method: 'DELETE', path: `/v1/snapshots/${encodeURIComponent(snapshotId(snapshot))}` });
  }

  /**
   * Promotes a snapshot to an environment (Pro): `environment` becomes a template id, and every
   * sandbox created with it (`client.sandboxes.create({ template: environment })`) starts from the
   * snapshot. `null` takes the name away. ConflictError when the name is taken. Retried: promoting
   * twice under one name is the same.
   */
  promote(snapshot: string | Snapshot, environment: string | null): Promise<Snapshot> {
    return this.http.json<Snapshot>({ method: 'POST', path: `/v1/snapshots/${encodeURIComponent(snapshotId(snapshot))}/promote`, json: { environment }, retry: 'safe' });
  }
}

export class SnapshotPages implements AsyncIterable<Snapshot[]> {
  constructor(private readonly http: Transport, private readonly params: ListSnapshotsParams) {}

  [Symbol.asyncIterator](): AsyncIterator<Snapshot[]> {
    const query = { sandbox_id: this.params.sandboxId, label: labelFilter(this.params.labels), limit: this.params.limit };
    return listPages<Snapshot>(this.http, '/v1/snapshots', 'snapshots', query);
  }

  /** Every page, concatenated. */
  async all(): Promise<Snapshot[]> {
    const out: Snapshot[] = [];
    for await (const page of this) out.push(...page);
    return out;
  }
}

/** The pages of a list operation: `{ [key]: items, next }` answers, followed by `?after=next` until `next` is null. */
async function* listPages<T>(http: Transport, path: string, key: string, query: Record<string, string | number | string[] | undefined>): AsyncGenerator<T[]> {
  let after: string | undefined;
  for (;;) {
    const page = await http.json<Record<string, unknown> & { next: string | null }>({ method: 'GET', path, query: { ...query, after }, retry: 'safe' });
    const items = page[key] as T[];
    yield items;
    if (!page.next || items.length === 0) return;
    after = page.next;
  }
}

function labelFilter(labels: Record<string, string> | undefined): string[] {
  return Object.entries(labels ?? {}).map(([k, v]) => `${k}=${v}`);
}
