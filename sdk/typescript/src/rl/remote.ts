/** connect(): a Fleet over HTTP, through the TypeScript SDK. */
import { Collimate, type CollimateOptions } from '../client.js';
import { NotFoundError } from '../errors.js';
import type { Sandbox as SdkSandbox } from '../sandbox.js';
import type { Execution } from '../code.js';
import type { ExecHandlers, ExecRequest, ExecResult, RunCodeOptions, SandboxInfo, SandboxState } from '../types.js';
import { newRunId, newSeed, RUN_LABEL, storedStateId, type CreateOptions, type Fleet, type Sandbox, type SnapshotOptions, type StoredState, type StoredStateRef, type SweepOptions } from './fleet.js';
import { sweep } from './helpers.js';

export interface ConnectOptions extends CollimateOptions {
  /** Default: a fresh run id. Pass the same id to reattach to (or sweep) an earlier run. */
  runId?: string;
  /** Use this client instead of building one. */
  client?: Collimate;
}

export function connect(opts: ConnectOptions = {}): RemoteFleet {
  return new RemoteFleet(opts.client ?? new Collimate(opts), opts.runId ?? newRunId());
}

export class RemoteFleet implements Fleet {
  readonly runLabel: Record<string, string>;
  constructor(readonly client: Collimate, readonly runId: string) {
    this.runLabel = { [RUN_LABEL]: runId };
  }

  async create(template: string, opts: CreateOptions = {}): Promise<Sandbox> {
    const sb = await this.client.sandboxes.create({ template, labels: { ...opts.labels, ...this.runLabel }, timeoutSecs: opts.timeoutSecs });
    return new RemoteSandbox(this, sb);
  }

  async fromSnapshot(state: StoredStateRef, n: number, opts: CreateOptions = {}): Promise<Sandbox[]> {
    const sbs = await this.client.sandboxes.manyFromSnapshot(storedStateId(state), n, { labels: { ...opts.labels, ...this.runLabel }, timeoutSecs: opts.timeoutSecs });
    return sbs.map((sb) => new RemoteSandbox(this, sb));
  }

  async deleteSnapshot(state: StoredStateRef): Promise<void> {
    await this.client.snapshots.delete(storedStateId(state));
  }

  /** A fleet handle on an existing sandbox of yours. */
  async get(id: string): Promise<Sandbox> {
    return new RemoteSandbox(this, await this.client.sandboxes.get(id));
  }

  async listIds(filter: { labels?: Record<string, string>; state?: SandboxState }): Promise<string[]> {
    return (await this.client.sandboxes.list({ labels: filter.labels, state: filter.state, limit: 1000 }).all()).map((s) => s.id);
  }

  async listSnapshotIds(filter: { labels?: Record<string, string> }): Promise<string[]> {
    return (await this.client.snapshots.list({ labels: filter.labels, limit: 1000 }).all()).map((s) => s.id);
  }

  async deleteById(id: string): Promise<void> {
    await this.client.http.json({ method: 'DELETE', path: `/v1/sandboxes/${encodeURIComponent(id)}` });
  }

  sweep(runId: string = this.runId, opts?: SweepOptions): Promise<number> {
    return sweep(this, runId, opts);
  }
}

export class RemoteSandbox implements Sandbox {
  constructor(readonly fleet: RemoteFleet, readonly sdk: SdkSandbox) {}

  get id(): string {
    return this.sdk.id;
  }
  get info(): SandboxInfo {
    return this.sdk.info;
  }

  exec(req: ExecRequest, handlers?: ExecHandlers): Promise<ExecResult> {
    return this.sdk.exec(req, handlers);
  }

  runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    return this.sdk.runCode(code, { ...opts, seed: opts.seed ?? newSeed() });
  }

  async fork(n: number, opts: { labels?: Record<string, string> } = {}): Promise<Sandbox[]> {
    const kids = await this.sdk.fork(n, { labels: { ...opts.labels, ...this.fleet.runLabel } });
    return kids.map((k) => new RemoteSandbox(this.fleet, k));
  }

  async snapshot(opts: SnapshotOptions = {}): Promise<StoredState> {
    const s = await this.sdk.snapshot({ name: opts.name, labels: { ...opts.labels, ...this.fleet.runLabel } });
    return { id: s.id, name: s.name, labels: s.labels, sandbox_id: s.sandbox_id };
  }
  async restore(state: StoredStateRef): Promise<void> {
    await this.sdk.restore(storedStateId(state));
  }

  async suspend(): Promise<void> {
    await this.sdk.suspend();
  }
  async resume(): Promise<void> {
    await this.sdk.resume();
  }
  delete(): Promise<void> {
    return this.sdk.delete();
  }
  readFile(path: string): Promise<Buffer> {
    return this.sdk.files.read(path);
  }
  async writeFile(path: string, data: string | Uint8Array, mode?: number): Promise<void> {
    await this.sdk.files.write(path, data, { mode });
  }
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.sdk.delete();
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }
}
