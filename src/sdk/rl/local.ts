/**
 * createLocalFleet(): the in-process hot path. It calls the tenant service (the same one REST and MCP
 * call, over the engine in this process) directly — no HTTP, no JSON, no keys — with the same
 * interface as connect(). Service errors are mapped to the SDK's error classes, so code written
 * against one fleet handles the other's errors the same way. The scope is explicit: trustedScope()
 * for a process that owns the engine (no tier caps), or a tenant's own scope and tier. It needs the
 * server's own modules, so it lives here and not in the SDK package (sdk/typescript), whose Fleet
 * interface and helpers it implements.
 */
import { CollimateError as ServiceError } from '../../errors.js';
import type { ExecRequest as ServiceExecRequest, SandboxInfo as ServiceSandboxInfo } from '../../sandboxes/types.js';
import type { TenantService } from '../../service/tenantService.js';
import type { Scope } from '../../service/types.js';
import { sandboxView } from '../../wire/views.js';
import { errorFromBody, Execution, NotFoundError, type ExecHandlers, type ExecRequest, type ExecResult, type RunCodeOptions, type SandboxInfo, type SandboxState } from '../../../sdk/typescript/src/index.js';
import { codeContextId } from '../../../sdk/typescript/src/code.js';
import {
  newRunId, newSeed, RUN_LABEL, storedStateId, sweep, type CreateOptions, type Fleet, type Sandbox, type SnapshotOptions, type StoredState, type StoredStateRef, type SweepOptions,
} from '../../../sdk/typescript/src/rl/index.js';

export interface LocalFleetOptions {
  runId?: string;
}

export function createLocalFleet(service: TenantService, scope: Scope, opts: LocalFleetOptions = {}): LocalFleet {
  return new LocalFleet(service, scope, opts.runId ?? newRunId());
}

/** Rethrows service errors as the SDK's classes (same code, status, details, retryAfter). */
async function mapped<T>(call: () => T | Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (e) {
    if (e instanceof ServiceError) {
      const err = errorFromBody(e.status, e.toJSON(), e.retryAfterSecs === undefined ? undefined : String(e.retryAfterSecs));
      (err as { cause?: unknown }).cause = e;
      throw err;
    }
    throw e;
  }
}

/** The REST view of a sandbox: no tenant, ports with their proxy path. */
function view(info: ServiceSandboxInfo): SandboxInfo {
  return sandboxView(info) as SandboxInfo;
}

export class LocalFleet implements Fleet {
  readonly runLabel: Record<string, string>;
  constructor(readonly service: TenantService, readonly scope: Scope, readonly runId: string) {
    this.runLabel = { [RUN_LABEL]: runId };
  }

  async create(template: string, opts: CreateOptions = {}): Promise<Sandbox> {
    const info = await mapped(() => this.service.sandboxes.create(this.scope, { template, labels: { ...opts.labels, ...this.runLabel }, timeoutSecs: opts.timeoutSecs }));
    return new LocalSandbox(this, view(info));
  }

  async fromSnapshot(state: StoredStateRef, n: number, opts: CreateOptions = {}): Promise<Sandbox[]> {
    const infos = await mapped(() => this.service.sandboxes.startFromSnapshot(this.scope, { snapshot: storedStateId(state), count: n, labels: { ...opts.labels, ...this.runLabel }, timeoutSecs: opts.timeoutSecs }));
    return infos.map((i) => new LocalSandbox(this, view(i)));
  }

  async deleteSnapshot(state: StoredStateRef): Promise<void> {
    await mapped(() => this.service.sandboxes.deleteSnapshot(this.scope, storedStateId(state)));
  }

  /** A fleet handle on an existing sandbox of this scope. */
  async get(id: string): Promise<Sandbox> {
    return new LocalSandbox(this, view(await mapped(() => this.service.sandboxes.get(this.scope, id))));
  }

  async listIds(filter: { labels?: Record<string, string>; state?: SandboxState }): Promise<string[]> {
    const ids: string[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await mapped(() => this.service.sandboxes.list(this.scope, { labels: filter.labels, state: filter.state, after, limit: 1000 }));
      ids.push(...page.sandboxes.map((s) => s.id));
      if (!page.next || page.sandboxes.length === 0) return ids;
      after = page.next;
    }
  }

  async listSnapshotIds(filter: { labels?: Record<string, string> }): Promise<string[]> {
    const ids: string[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await mapped(() => this.service.sandboxes.listSnapshots(this.scope, { labels: filter.labels, after, limit: 1000 }));
      ids.push(...page.snapshots.map((s) => s.id));
      if (!page.next || page.snapshots.length === 0) return ids;
      after = page.next;
    }
  }

  async deleteById(id: string): Promise<void> {
    await mapped(() => this.service.sandboxes.delete(this.scope, id));
  }

  sweep(runId: string = this.runId, opts?: SweepOptions): Promise<number> {
    return sweep(this, runId, opts);
  }
}

export class LocalSandbox implements Sandbox {
  constructor(readonly fleet: LocalFleet, public info: SandboxInfo) {}

  get id(): string {
    return this.info.id;
  }

  private get svc(): TenantService {
    return this.fleet.service;
  }

  exec(req: ExecRequest, handlers?: ExecHandlers): Promise<ExecResult> {
    return mapped(() => this.svc.sandboxes.exec(this.fleet.scope, this.info.id, req as ServiceExecRequest, handlers));
  }

  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    const { language, context, env, timeoutSecs, seed, signal, ...callbacks } = opts;
    // As over HTTP, where a throwing callback closes the stream: it interrupts the cell, then is rethrown.
    const stop = new AbortController();
    let thrown: { error: unknown } | undefined;
    const guard = <A extends unknown[]>(fn: ((...a: A) => void) | undefined) =>
      fn &&
      ((...a: A) => {
        if (thrown) return;
        try {
          fn(...a);
        } catch (error) {
          thrown ??= { error };
          stop.abort();
        }
      });
    const request = { code, language, context: context === undefined ? undefined : codeContextId(context), env, timeoutSecs, seed: seed ?? newSeed() };
    const handlers = {
      onStdout: guard(callbacks.onStdout),
      onStderr: guard(callbacks.onStderr),
      onResult: guard(callbacks.onResult),
      onError: guard(callbacks.onError),
      signal: signal ? AbortSignal.any([signal, stop.signal]) : stop.signal,
    };
    let result: Execution;
    try {
      result = new Execution(await mapped(() => this.svc.code.run(this.fleet.scope, this.info.id, request, handlers)));
    } catch (e) {
      if (thrown) throw thrown.error;
      if (signal?.aborted) throw signal.reason;
      throw e;
    }
    if (thrown) throw thrown.error;
    return result;
  }

  async fork(n: number, opts: { labels?: Record<string, string> } = {}): Promise<Sandbox[]> {
    const kids = await mapped(() => this.svc.sandboxes.fork(this.fleet.scope, this.info.id, { count: n, labels: { ...opts.labels, ...this.fleet.runLabel } }));
    return kids.map((k) => new LocalSandbox(this.fleet, view(k)));
  }

  async snapshot(opts: SnapshotOptions = {}): Promise<StoredState> {
    const s = await mapped(() => this.svc.sandboxes.createSnapshot(this.fleet.scope, this.info.id, { name: opts.name, labels: { ...opts.labels, ...this.fleet.runLabel } }));
    return { id: s.id, name: s.name, labels: s.labels, sandbox_id: s.sandbox_id };
  }
  async restore(state: StoredStateRef): Promise<void> {
    this.info = view(await mapped(() => this.svc.sandboxes.restore(this.fleet.scope, this.info.id, storedStateId(state))));
  }

  async suspend(): Promise<void> {
    this.info = view(await mapped(() => this.svc.sandboxes.suspend(this.fleet.scope, this.info.id)));
  }
  async resume(): Promise<void> {
    this.info = view(await mapped(() => this.svc.sandboxes.resume(this.fleet.scope, this.info.id)));
  }
  async delete(): Promise<void> {
    await mapped(() => this.svc.sandboxes.delete(this.fleet.scope, this.info.id));
    this.info = { ...this.info, state: 'deleted' };
  }
  readFile(path: string): Promise<Buffer> {
    return mapped(() => this.svc.sandboxes.readFile(this.fleet.scope, this.info.id, path));
  }
  writeFile(path: string, data: string | Uint8Array, mode?: number): Promise<void> {
    return mapped(() => this.svc.sandboxes.writeFile(this.fleet.scope, this.info.id, path, typeof data === 'string' ? Buffer.from(data) : Buffer.from(data), mode));
  }
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.info.state === 'deleted') return;
    try {
      await this.delete();
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }
}
