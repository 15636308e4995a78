/**
 * Sandboxes, a part of the tenant service (tenantService.ts): every operation on a tenant's
 * sandboxes — lifecycle, execs, processes, files, ports — with its rules (tier caps through the
 * placement, session length, egress narrowing, state pre-checks, idempotency of retries). Where a
 * sandbox runs and where a new one goes is the placement's (placement.ts); the host that runs it is
 * reached through the same interface whether it is this one or another (sandboxHost.ts).
 */
import { CollimateError, environmentNotReady, invalidState, sandboxNotFound, snapshotNotFound, msg, see } from '../errors.js';
import { assertTenantEgress, parseEgress, widening, type EgressInput, type EgressPolicy } from '../net/policy.js';
import { portHostProblem } from '../sandboxes/portHost.js';
import { forkCountProblem } from '../sandboxes/types.js';
import type {
  DirListing, DirWatch, ExecRequest, ExecResult, ExecStreamHandlers, FileEntry, FileSink, ListFilter, MkdirOptions, OpenPort, ProcessEvent, ProcessInfo,
  ProcessStartRequest, SandboxInfo, ServiceEngine, SnapshotInfo, SnapshotListFilter, SnapshotOptions, StartFromSnapshotOptions, SuspendOptions, TemplateInfo, UploadOptions, WatchHandlers,
} from '../sandboxes/types.js';
import { DEFAULT_PORT_URL_SECS, ENVIRONMENT_NAME_RE, SANDBOX_ID_RE } from '../wire/schemas.js';
import type { ExecLogEntry } from './execLog.js';
import type { StoredResponse } from './idempotency.js';
import type { Histogram } from './metrics.js';
import type { Placement } from './placement.js';
import type { PortUrlSigner } from './portUrls.js';
import type { SandboxHost } from './sandboxHost.js';
import type { Quotas } from './quotas.js';
import type { MetricSample } from './sandboxMetrics.js';
import type { SandboxLogEntry, SandboxLogQuery } from './sandboxLog.js';
import type { Templates } from './templates.js';
import type { ClusterReadings, CreateInput, ForkInput, IdempotencyRunner, PortUrl, ResolvedPort, Scope, SnapshotStartInput } from './types.js';

/** The latencies a service call observes, every front door. */
export interface LifecycleTimers {
  createSeconds: Histogram;
  forkSeconds: Histogram;
  execSeconds: Histogram;
}

export interface SandboxesDeps {
  engine: ServiceEngine;
  placement: Placement;
  templates: Templates;
  signer: PortUrlSigner;
  idempotency: IdempotencyRunner;
  quotas: Quotas;
  timers: LifecycleTimers;
  clusterReadings?: ClusterReadings;
  now(): number;
  log(err: unknown, msg: string): void;
}

export class Sandboxes {
  private readonly engine: ServiceEngine;
  private readonly placement: Placement;
  private readonly signer: PortUrlSigner;
  private readonly clusterReadings?: ClusterReadings;
  private readonly now: () => number;
  private readonly createSeconds: Histogram;
  private readonly forkSeconds: Histogram;
  private readonly execSeconds: Histogram;

  constructor(private readonly d: SandboxesDeps) {
    this.engine = d.engine;
    this.placement = d.placement;
    this.signer = d.signer;
    this.clusterReadings = d.clusterReadings;
    this.now = d.now;
    ({ createSeconds: this.createSeconds, forkSeconds: this.forkSeconds, execSeconds: this.execSeconds } = d.timers);
  }

  private log(err: unknown, msg: string): void {
    this.d.log(err, msg);
  }

  /** The host that runs the tenant's sandbox `id` (sandbox_not_found for ids the tenant does not have). */
  private where(scope: Scope, id: string): Promise<SandboxHost> {
    return this.placement.locate(scope.tenant, id);
  }

  /** One sandbox as last observed (ports as last read). Other tenants' ids read as not found. */
  async get(scope: Scope, id: string): Promise<SandboxInfo> {
    const info = await (await this.where(scope, id)).get(id, scope);
    // Belt and braces against an engine that leaks across tenants.
    if (info.tenant !== scope.tenant) throw sandboxNotFound(id);
    return info;
  }

  /**
   * One sandbox with its listening ports read now. A failed reading keeps the last one: a port list
   * is not worth failing the read for.
   */
  async inspect(scope: Scope, id: string): Promise<SandboxInfo> {
    const host = await this.where(scope, id);
    const info = await host.get(id, scope);
    if (info.tenant !== scope.tenant) throw sandboxNotFound(id);
    if (info.state !== 'running') return info;
    let ports: OpenPort[];
    try {
      ports = await host.openPorts(id, scope);
    } catch (err) {
      if (err instanceof CollimateError && err.code === 'sandbox_not_found') throw err;
      this.log(err, `reading the open ports of ${id} failed`);
      return info;
    }
    return { ...info, ports };
  }

  list(scope: Scope, filter: ListFilter): Promise<{ sandboxes: SandboxInfo[]; next: string | null }> {
    return this.placement.list(scope.tenant, filter);
  }

  /** Throws invalid_state unless the sandbox is running (for callers that must know before they start streaming). */
  async requireRunning(scope: Scope, id: string, operation: string): Promise<SandboxInfo> {
    const info = await this.get(scope, id);
    // A suspended one with auto_resume is resumed by the operation itself (whileRunning).
    if (info.state !== 'running' && !(info.state === 'suspended' && info.auto_resume)) throw invalidState(id, info.state, operation, ['running']);
    return info;
  }

  async create(scope: Scope, input: CreateInput): Promise<SandboxInfo> {
    const tier = scope.tier;
    const unbaked = tier.ownImages ? this.d.templates.unbakedEnvironment(scope, input.template) : undefined;
    if (unbaked) throw environmentNotReady(input.template, unbaked.state, unbaked.error);
    // A tier limited to the catalog gets 403 for anything else, whether or not such a template exists.
    const inCatalog = this.d.templates.catalog(scope).some((t) => t.id === input.template);
    const tpl = !tier.ownImages && !inCatalog ? null : await this.templateToCreate(scope, input.template).catch(async (err) => {
      // Not a template: a snapshot promoted under that name starts the sandbox (Pro, as environments).
      const promoted = err instanceof CollimateError && err.code === 'template_not_found' ? await this.snapshotEnvironment(scope, input.template) : undefined;
      if (!promoted) throw err;
      return promoted;
    });
    if (tpl && 'sandbox_id' in tpl) {
      const { template: _, ...rest } = input;
      return (await this.startFromSnapshot(scope, { ...rest, snapshot: tpl.id, count: 1 }))[0];
    }
    if (!tpl || (tpl.kind !== 'catalog' && !tier.ownImages)) {
      throw new CollimateError(
        'template_forbidden',
        msg`Template ${input.template} is not in the catalog; the ${tier.name} tier can only create from catalog images (list them${see('listImages')}). Upgrade to Pro to use your own images.`,
      );
    }
    if (input.timeoutSecs !== undefined && input.timeoutSecs > tier.maxSessionSecs) {
      throw new CollimateError('tier_forbidden', `timeout_secs ${input.timeoutSecs} exceeds the ${tier.name} tier's maximum session of ${tier.maxSessionSecs} s.`);
    }
    const egress = this.effectiveEgress(tpl, input.egress);
    const timeoutSecs = input.timeoutSecs ?? tier.defaultSessionSecs ?? undefined;
    const opts = {
      template: input.template, labels: input.labels ?? {}, ...(timeoutSecs === undefined ? {} : { timeoutSecs }), ...(egress === undefined ? {} : { egress }),
      ...(input.onTimeout ? { onTimeout: input.onTimeout } : {}), ...(input.autoResume ? { autoResume: true } : {}),
      ...(input.keepMemory === false ? { keepMemory: false } : {}), ...portAccessOf(input),
    };
    return this.placement.start({ tenant: scope.tenant, tier, slots: 1, operation: 'create', template: input.template }, async (host) => {
      const stop = this.createSeconds.startTimer();
      const info = await host.create(opts, scope);
      stop();
      return info;
    });
  }

  /** The template a create names: this host's, else (a cluster) a tenant's environment another host made. */
  private async templateToCreate(scope: Scope, id: string): Promise<TemplateInfo> {
    try {
      return this.engine.template(id, scope);
    } catch (err) {
      const elsewhere = err instanceof CollimateError && err.code === 'template_not_found' ? await this.clusterReadings?.template(scope.tenant, id) : undefined;
      if (elsewhere) return elsewhere;
      throw err;
    }
  }

  async exec(scope: Scope, id: string, req: ExecRequest, stream?: ExecStreamHandlers): Promise<ExecResult> {
    const stop = this.execSeconds.startTimer();
    const r = await this.whileRunning(scope, id, (host) => host.exec(id, req, scope, stream));
    stop();
    return r;
  }

  /**
   * Runs an operation that needs the sandbox running. One that is suspended with auto_resume
   * (E2B's autoResume) is resumed first — within the tier's cap, like any resume — and the
   * operation runs on it; without it the host's 409 invalid_state stands.
   */
  private async whileRunning<T>(scope: Scope, id: string, op: (host: SandboxHost) => T | Promise<T>): Promise<T> {
    const host = await this.where(scope, id);
    try {
      return await op(host);
    } catch (err) {
      if (!(err instanceof CollimateError && err.code === 'invalid_state' && err.details?.state === 'suspended')) throw err;
      const info = await Promise.resolve().then(() => host.get(id, scope)).catch(() => null);
      if (!info?.auto_resume || info.state !== 'suspended') throw err;
      await this.resume(scope, id).catch((e) => {
        // Resumed meanwhile by another request: it runs, which is all this needs.
        if (!(e instanceof CollimateError && e.code === 'invalid_state')) throw e;
      });
      return op(await this.where(scope, id));
    }
  }

  /** The sandbox's resource use sampled within [fromMs, toMs] (either open), oldest first. */
  async metrics(scope: Scope, id: string, fromMs?: number, toMs?: number): Promise<MetricSample[]> {
    return (await this.where(scope, id)).metrics(id, fromMs, toMs, scope);
  }

  /** The sandbox's recent execs, newest first (execs that never started, e.g. refused, are not listed). */
  async recentExecs(scope: Scope, id: string, limit?: number): Promise<ExecLogEntry[]> {
    const host = await this.where(scope, id);
    await host.get(id, scope);
    return host.recentExecs(id, limit, scope);
  }

  /**
   * What happened to the sandbox (sandboxLog.ts), read on the host that runs it: the entries matching
   * `query`, oldest first unless it reads backward.
   */
  async logs(scope: Scope, id: string, query: SandboxLogQuery = {}): Promise<SandboxLogEntry[]> {
    const host = await this.where(scope, id);
    await host.get(id, scope);
    return host.logs(id, query, scope);
  }

  /**
   * Live fork of a running sandbox, or fork of a suspended one (it stays suspended; the children run
   * and keep its processes). Every child takes a slot of the tier's cap.
   */
  async fork(scope: Scope, id: string, input: ForkInput): Promise<SandboxInfo[]> {
    const count = input.count;
    const problem = forkCountProblem(count);
    if (problem) throw new CollimateError('validation_error', problem);
    const parent = await this.get(scope, id);
    if (parent.state !== 'running' && parent.state !== 'suspended') throw invalidState(id, parent.state, 'fork', ['running', 'suspended']);
    const stop = this.forkSeconds.startTimer({ count: String(count) });
    try {
      const children = await this.placement.start({ tenant: scope.tenant, tier: scope.tier, slots: count, operation: `fork of ${count}`, near: id }, (host) => host.fork(id, { count, labels: input.labels }, scope));
      stop();
      return children;
    } catch (err) {
      // Its host has no room for every child: on a cluster, the fork spills onto other hosts.
      if (!(err instanceof CollimateError && err.code === 'host_at_capacity' && err.details?.resource === 'cluster_host') || !this.placement.spills) throw err;
      const children = await this.forkSpilling(scope, parent, count, input.labels ?? {});
      stop();
      return children;
    }
  }

  /**
   * A fork too wide for its sandbox's host: the moment is kept as a snapshot (the sandbox pauses as
   * a fork pauses it), the children start from it on its host as far as it has room and on other
   * hosts for the rest (Placement.startSpread: they pull it), each the sandbox's child; the snapshot
   * then goes (its files stay while children sit on them).
   */
  private async forkSpilling(scope: Scope, parent: SandboxInfo, count: number, labels: Record<string, string>): Promise<SandboxInfo[]> {
    const host = await this.where(scope, parent.id);
    const snap = await host.createSnapshot(parent.id, { name: `fork of ${parent.id}`, labels: { 'collimate.fork_spill': parent.id } }, scope);
    try {
      return await this.startSpread(scope, snap.id, `fork of ${count}`, {
        count, labels: { ...parent.labels, ...labels }, forkOf: parent.id, timeoutSecs: parent.timeout_secs,
      });
    } finally {
      // Best effort: the children are started whatever becomes of it (a snapshot left over is the tenant's to delete).
      try {
        await host.deleteSnapshot(snap.id, scope);
        await this.placement.snapshotDeleted(scope.tenant, snap.id);
      } catch { /* listed under its label collimate.fork_spill */ }
    }
  }

  /**
   * Suspends within the tenant's quotas of suspended sandboxes and their sizes (quotas.ts): a
   * suspend that would pass one is 429 quota_exceeded and the sandbox keeps running. `keepMemory`
   * false keeps only its files (default: the sandbox's keep_memory).
   */
  async suspend(scope: Scope, id: string, opts: SuspendOptions = {}): Promise<SandboxInfo> {
    const host = await this.where(scope, id);
    const info = await host.get(id, scope);
    // Not running: the host answers invalid_state, which says more than a quota would.
    if (info.state !== 'running') return host.suspend(id, scope, opts);
    const held = await this.suspendedUse(scope.tenant);
    const keepMemory = opts.keepMemory ?? info.keep_memory !== false;
    return this.d.quotas.within(scope, {
      suspended_sandboxes: { used: held.count, adding: 1 },
      suspended_mib: { used: held.mib, adding: suspendedMib(info, keepMemory) },
    }, () => host.suspend(id, scope, opts));
  }

  /** The tenant's suspended sandboxes on every host: how many, and their memory plus disk sizes in MiB. */
  async suspendedUse(tenant: string): Promise<{ count: number; mib: number }> {
    let count = 0;
    let mib = 0;
    let after: string | undefined;
    do {
      const page = await this.placement.list(tenant, { state: 'suspended', limit: 1000, ...(after ? { after } : {}) });
      for (const s of page.sandboxes) {
        if (s.state !== 'suspended') continue;
        count += 1;
        mib += suspendedMib(s, s.memory_kept !== false);
      }
      after = page.next ?? undefined;
    } while (after);
    return { count, mib };
  }

  async resume(scope: Scope, id: string): Promise<SandboxInfo> {
    const cur = await this.get(scope, id);
    // Checked before a slot is taken: resuming a running sandbox is invalid_state, not concurrency_limit.
    if (cur.state !== 'suspended') throw invalidState(id, cur.state, 'resume', ['suspended']);
    return this.placement.start({ tenant: scope.tenant, tier: scope.tier, slots: 1, operation: 'resume', near: id }, (host) => host.resume(id, scope));
  }

  /**
   * A lease: ends a running sandbox's session `timeoutSecs` from now, earlier or later than before.
   * The tier's maximum session still counts from the session's start (create, fork or resume), so a
   * lease past it is tier_forbidden, saying how much is left (`max_timeout_secs`) rather than
   * silently cut short. Only while running: a suspended sandbox's session ended, and a resume starts
   * a new one of timeout_secs (invalid_state).
   */
  async setTimeout(scope: Scope, id: string, timeoutSecs: number): Promise<SandboxInfo> {
    // Checked here too: in-process callers (the RL local fleet) do not go through a schema.
    if (!Number.isInteger(timeoutSecs) || timeoutSecs < 1) throw new CollimateError('validation_error', `timeout_secs must be a whole number of seconds, at least 1 (got ${timeoutSecs}).`);
    const host = await this.where(scope, id);
    const info = await host.get(id, scope);
    if (info.state !== 'running') throw invalidState(id, info.state, 'setting its timeout', ['running']);
    const tier = scope.tier;
    const now = this.now();
    const startedMs = Date.parse(info.session_started_at);
    const latestEnd = startedMs + tier.maxSessionSecs * 1000;
    const endsAt = now + timeoutSecs * 1000;
    if (endsAt > latestEnd) {
      const left = Math.max(0, Math.floor((latestEnd - now) / 1000));
      throw new CollimateError(
        'tier_forbidden',
        `timeout_secs ${timeoutSecs} would run sandbox ${id}'s session past the ${tier.name} tier's maximum session of ${tier.maxSessionSecs} s, ` +
          `counted from its start at ${info.session_started_at}: ` +
          (left >= 1 ? `${left} s of it are left, so ask for at most ${left}.` : 'none of it is left; suspend and resume the sandbox to start a new session.'),
        { details: { max_session_secs: tier.maxSessionSecs, max_timeout_secs: left } },
      );
    }
    // Only while running: the engine refuses the new end otherwise (a suspend in between is invalid_state).
    return host.setSessionEnd(id, endsAt, scope);
  }

  async delete(scope: Scope, id: string): Promise<void> {
    await (await this.where(scope, id)).delete(id, scope);
  }

  async readFile(scope: Scope, id: string, path: string): Promise<Buffer> {
    return this.whileRunning(scope, id, (host) => host.readFile(id, path, scope));
  }

  async writeFile(scope: Scope, id: string, path: string, data: Buffer, mode?: number): Promise<void> {
    await this.whileRunning(scope, id, (host) => host.writeFile(id, path, data, scope, mode));
  }

  async startProcess(scope: Scope, id: string, req: ProcessStartRequest): Promise<ProcessInfo> {
    return this.whileRunning(scope, id, (host) => host.startProcess(id, req, scope));
  }

  async listProcesses(scope: Scope, id: string): Promise<ProcessInfo[]> {
    return (await this.where(scope, id)).listProcesses(id, scope);
  }

  async getProcess(scope: Scope, id: string, pid: number): Promise<ProcessInfo> {
    return (await this.where(scope, id)).getProcess(id, pid, scope);
  }

  async watchProcessOutput(scope: Scope, id: string, pid: number, from: 'start' | 'now' | number, listener: (e: ProcessEvent) => void): Promise<() => void> {
    return (await this.where(scope, id)).watchProcessOutput(id, pid, from, listener, scope);
  }

  async writeProcessStdin(scope: Scope, id: string, pid: number, data: AsyncIterable<Buffer> | Buffer): Promise<number> {
    return this.whileRunning(scope, id, (host) => host.writeProcessStdin(id, pid, data, scope));
  }

  async closeProcessStdin(scope: Scope, id: string, pid: number): Promise<void> {
    return this.whileRunning(scope, id, (host) => host.closeProcessStdin(id, pid, scope));
  }

  async signalProcess(scope: Scope, id: string, pid: number, signal: string | number): Promise<void> {
    return this.whileRunning(scope, id, (host) => host.signalProcess(id, pid, signal, scope));
  }

  async resizeProcess(scope: Scope, id: string, pid: number, cols: number, rows: number): Promise<void> {
    return this.whileRunning(scope, id, (host) => host.resizeProcess(id, pid, cols, rows, scope));
  }

  async waitProcess(scope: Scope, id: string, pid: number, timeoutSecs: number): Promise<ProcessInfo> {
    return (await this.where(scope, id)).waitProcess(id, pid, timeoutSecs, scope);
  }

  async fsStat(scope: Scope, id: string, path: string): Promise<FileEntry> {
    return this.whileRunning(scope, id, (host) => host.fsStat(id, path, scope));
  }

  /** Whether anything (a file, directory, symlink…) is at `path`; a file in the way above it counts as nothing. */
  async fsExists(scope: Scope, id: string, path: string): Promise<boolean> {
    try {
      await this.fsStat(scope, id, path);
      return true;
    } catch (e) {
      if (e instanceof CollimateError && (e.code === 'file_not_found' || e.code === 'not_a_directory')) return false;
      throw e;
    }
  }

  async fsList(scope: Scope, id: string, path: string, depth = 1): Promise<DirListing> {
    return this.whileRunning(scope, id, (host) => host.fsList(id, path, depth, scope));
  }

  async fsMkdir(scope: Scope, id: string, path: string, opts?: MkdirOptions): Promise<{ created: boolean; entry: FileEntry }> {
    return this.whileRunning(scope, id, (host) => host.fsMkdir(id, path, opts, scope));
  }

  async fsRemove(scope: Scope, id: string, path: string): Promise<{ removed: number }> {
    return this.whileRunning(scope, id, (host) => host.fsRemove(id, path, scope));
  }

  async fsRename(scope: Scope, id: string, from: string, to: string): Promise<FileEntry> {
    return this.whileRunning(scope, id, (host) => host.fsRename(id, from, to, scope));
  }

  async fsWatch(scope: Scope, id: string, path: string, recursive: boolean, handlers: WatchHandlers): Promise<DirWatch> {
    return this.whileRunning(scope, id, (host) => host.fsWatch(id, path, recursive, handlers, scope));
  }

  /** Streams a file of any size (up to the server's download limit) to `sink`. */
  async downloadFile(scope: Scope, id: string, path: string, sink: FileSink): Promise<{ size: number }> {
    return this.whileRunning(scope, id, (host) => host.downloadFile(id, path, sink, scope));
  }

  /** Streams `source` into a file, replacing it whole once complete (payload_too_large past `opts.maxBytes`). */
  async uploadFile(scope: Scope, id: string, path: string, source: AsyncIterable<Buffer | Uint8Array | string>, opts: UploadOptions = {}): Promise<FileEntry & { bytes: number }> {
    return this.whileRunning(scope, id, (host) => host.uploadFile(id, path, source, opts, scope));
  }

  /** A signed URL token for a sandbox port: anyone holding it reaches the port until it expires. */
  async portUrl(scope: Scope, id: string, port: number, expiresInSecs = DEFAULT_PORT_URL_SECS): Promise<PortUrl> {
    await this.get(scope, id);
    const expiresAt = Math.floor(this.now() / 1000) + expiresInSecs;
    return { token: this.signer.sign({ sandboxId: id, port, expiresAt }), port, expiresAt };
  }

  /** Where the proxy connects for a tenant's request to a port (invalid_state unless running). */
  async portTarget(scope: Scope, id: string, port: number): Promise<ResolvedPort> {
    return { sandboxId: id, tenant: scope.tenant, port, target: await this.whileRunning(scope, id, (host) => host.portTarget(id, port, scope)) };
  }

  /**
   * The tenant whose sandbox `id` has public ports (anyone may reach them, E2B's allowPublicTraffic),
   * or null when there is no such sandbox or its ports need a key or token: the proxy tells these
   * two apart from no one, answering both as a request without a key.
   */
  async publicPortsOwner(id: string): Promise<string | null> {
    if (!SANDBOX_ID_RE.test(id)) return null;
    const tenant = await this.placement.tenantOf(id);
    if (tenant === null) return null;
    const info = await Promise.resolve()
      .then(async () => (await this.placement.locate(tenant, id)).get(id, { tenant }))
      .catch((err) => {
        if (err instanceof CollimateError && err.code === 'sandbox_not_found') return null;
        throw err;
      });
    return info?.public_ports ? tenant : null;
  }

  /** Where the proxy connects for a signed URL (unauthorized when the token is bad or expired). */
  async signedPortTarget(token: string): Promise<ResolvedPort> {
    const grant = this.signer.verify(token);
    const tenant = await this.placement.tenantOf(grant.sandboxId);
    if (tenant === null) throw sandboxNotFound(grant.sandboxId);
    const scope = { tenant };
    return { sandboxId: grant.sandboxId, tenant, port: grant.port, expiresAt: grant.expiresAt, target: await (await this.placement.locate(tenant, grant.sandboxId)).portTarget(grant.sandboxId, grant.port, scope) };
  }

  /**
   * Runs `exec` once per (tenant, key): a retry with the same key and fingerprint gets the stored
   * response back (`replayed`), a different request under a used key idempotency_key_reused.
   */
  idempotent(scope: Scope, key: string, fingerprint: string, exec: () => Promise<StoredResponse>): Promise<StoredResponse & { replayed: boolean }> {
    return this.d.idempotency.run(scope.tenant, key, fingerprint, exec);
  }

  /** The template's policy, or the asked one if it is the same or narrower. */
  /**
   * Replaces the egress policy of a running or suspended sandbox: never wider than its template's
   * (environment's) policy, as at create (egress_forbidden), and the operator's blocked ranges stay
   * blocked (egress_forbidden). A running sandbox's firewall changes at once.
   */
  async setEgress(scope: Scope, id: string, raw: EgressInput): Promise<SandboxInfo> {
    const host = await this.where(scope, id);
    const info = await host.get(id, scope);
    const egress = this.effectiveEgress(await this.templateToCreate(scope, info.template), raw) ?? parseEgress(raw);
    return host.setEgress(id, egress, scope);
  }

  // ---- snapshots ----------------------------------------------------------------------------------

  /** The tenant's snapshots on every host: how many, and the MiB their files take (rounded up). */
  async snapshotUse(tenant: string): Promise<{ snapshots: number; snapshot_mib: number }> {
    let snapshots = 0;
    let bytes = 0;
    let after: string | undefined;
    do {
      const page = await this.placement.listSnapshots(tenant, { limit: 1000, ...(after ? { after } : {}) });
      for (const s of page.snapshots) {
        snapshots += 1;
        bytes += s.size_bytes;
      }
      after = page.next ?? undefined;
    } while (after);
    return { snapshots, snapshot_mib: Math.ceil(bytes / (1024 * 1024)) };
  }

  /**
   * Keeps this moment of a running or suspended sandbox, within the tenant's snapshot quotas (a
   * snapshot is counted at its guest's memory size while it is taken, the most its RAM image takes).
   */
  async createSnapshot(scope: Scope, id: string, input: SnapshotOptions): Promise<SnapshotInfo> {
    const host = await this.where(scope, id);
    const info = await host.get(id, scope);
    if (info.state !== 'running' && info.state !== 'suspended') throw invalidState(id, info.state, 'snapshot', ['running', 'suspended']);
    const held = await this.snapshotUse(scope.tenant);
    return this.d.quotas.within(scope, {
      snapshots: { used: held.snapshots, adding: 1 },
      snapshot_mib: { used: held.snapshot_mib, adding: info.memory_mib },
    }, () => host.createSnapshot(id, input, scope));
  }

  /**
   * Names snapshot `id` as a template of the tenant's (`environment`; null takes the name away): a
   * create with it as `template` starts a sandbox from the snapshot. Pro, as environments are; the
   * name must be free among the catalog, the tenant's environments and its other snapshots.
   */
  async promoteSnapshot(scope: Scope, id: string, environment: string | null): Promise<SnapshotInfo> {
    if (!scope.tier.ownImages) {
      throw new CollimateError('tier_forbidden', msg`The ${scope.tier.name} tier cannot promote snapshots to environments; it creates from catalog images only (list them${see('listImages')}). Upgrade to Pro to make your own.`);
    }
    const snap = await this.getSnapshot(scope, id);
    if (environment !== null && snap.environment !== environment) {
      if (!ENVIRONMENT_NAME_RE.test(environment)) throw new CollimateError('validation_error', `environment: ${JSON.stringify(environment.slice(0, 80))} must match ${ENVIRONMENT_NAME_RE.source} (lower-case letters, digits, ".", "_", "-"; at most 63).`);
      const taken = this.d.templates.catalog(scope).some((t) => t.id === environment) ? 'a catalog template'
        : (await this.d.templates.environments(scope)).some((e) => e.name === environment) ? 'one of your environments'
        : (await this.snapshotEnvironment(scope, environment)) ? 'another of your snapshots' : null;
      if (taken) throw new CollimateError('conflict', msg`${environment} is already ${taken}'s name; choose another (list templates${see('listTemplates')}).`);
    }
    return (await this.placement.locateSnapshot(scope.tenant, id)).promoteSnapshot(id, environment, scope);
  }

  /** The tenant's snapshot promoted under `name`, if one is. */
  async snapshotEnvironment(scope: Scope, name: string): Promise<SnapshotInfo | undefined> {
    return (await this.placement.listSnapshots(scope.tenant, { environment: name, limit: 1 })).snapshots[0];
  }

  async getSnapshot(scope: Scope, id: string): Promise<SnapshotInfo> {
    const s = await (await this.placement.locateSnapshot(scope.tenant, id)).getSnapshot(id, scope);
    if (s.tenant !== scope.tenant) throw snapshotNotFound(id);
    return s;
  }

  listSnapshots(scope: Scope, filter: SnapshotListFilter): Promise<{ snapshots: SnapshotInfo[]; next: string | null }> {
    return this.placement.listSnapshots(scope.tenant, filter);
  }

  async deleteSnapshot(scope: Scope, id: string): Promise<void> {
    await (await this.placement.locateSnapshot(scope.tenant, id)).deleteSnapshot(id, scope);
    await this.placement.snapshotDeleted(scope.tenant, id);
  }

  /**
   * Starts `count` sandboxes from a snapshot on the host that holds it; each takes a slot of the
   * tier's cap. Session length and egress are checked as a create's (egress may only narrow the
   * snapshot's).
   */
  async startFromSnapshot(scope: Scope, input: SnapshotStartInput): Promise<SandboxInfo[]> {
    const tier = scope.tier;
    const problem = forkCountProblem(input.count);
    if (problem) throw new CollimateError('validation_error', problem);
    const snap = await this.getSnapshot(scope, input.snapshot);
    if (input.timeoutSecs !== undefined && input.timeoutSecs > tier.maxSessionSecs) {
      throw new CollimateError('tier_forbidden', `timeout_secs ${input.timeoutSecs} exceeds the ${tier.name} tier's maximum session of ${tier.maxSessionSecs} s.`);
    }
    const timeoutSecs = input.timeoutSecs ?? tier.defaultSessionSecs ?? undefined;
    let egress: EgressPolicy | undefined;
    if (input.egress !== undefined) {
      egress = parseEgress(input.egress);
      assertTenantEgress(egress, this.engine.egressOpened?.() ?? []);
      const wider = widening(egress, snap.egress);
      if (wider) throw new CollimateError('egress_forbidden', `The egress policy is wider than snapshot ${snap.id}'s: ${wider}. A sandbox may only narrow the policy it starts with.`);
    }
    const opts: StartFromSnapshotOptions = {
      count: input.count, labels: input.labels ?? {}, ...(timeoutSecs === undefined ? {} : { timeoutSecs }), ...(egress === undefined ? {} : { egress }),
      ...(input.onTimeout ? { onTimeout: input.onTimeout } : {}), ...(input.autoResume === undefined ? {} : { autoResume: input.autoResume }),
      ...(input.keepMemory === undefined ? {} : { keepMemory: input.keepMemory }),
      ...portAccessOf(input),
    };
    const stop = this.createSeconds.startTimer();
    const out = await this.startSpread(scope, snap.id, `start of ${input.count} from a snapshot`, opts);
    stop();
    return out;
  }

  /** A start from a snapshot on as many hosts as it takes (Placement.startSpread); all of it or none. */
  private startSpread(scope: Scope, snapshot: string, operation: string, opts: StartFromSnapshotOptions): Promise<SandboxInfo[]> {
    return this.placement.startSpread(
      { tenant: scope.tenant, tier: scope.tier, slots: opts.count, operation, snapshot },
      (host, count) => host.startFromSnapshot(snapshot, { ...opts, count }, scope),
      async (host, started) => {
        for (const s of started) await host.delete(s.id, scope);
      },
    );
  }

  /**
   * Rolls sandbox `id` back to one of its own snapshots, in place: a running one runs on from the
   * snapshot's moment, a suspended one stays suspended at it. No slot: it runs as many sandboxes as before.
   */
  async restore(scope: Scope, id: string, snapshotId: string): Promise<SandboxInfo> {
    const host = await this.where(scope, id);
    const info = await host.get(id, scope);
    if (info.state !== 'running' && info.state !== 'suspended') throw invalidState(id, info.state, 'restore', ['running', 'suspended']);
    return host.restore(id, snapshotId, scope);
  }

  private effectiveEgress(t: TemplateInfo, raw: EgressInput | undefined): EgressPolicy | undefined {
    // Normalised here too: in-process callers (the RL local fleet) do not go through a schema.
    const asked = raw === undefined ? undefined : parseEgress(raw);
    if (asked !== undefined) assertTenantEgress(asked, this.engine.egressOpened?.() ?? []);
    if (!t.network) {
      if (asked !== undefined && asked !== 'none') {
        throw new CollimateError('network_unavailable', `This server runs without networking (${this.networkReason()}), so sandboxes have no egress; create without egress or with "none".`);
      }
      return 'none';
    }
    if (asked === undefined) return undefined;
    const wider = widening(asked, t.egress);
    if (wider) throw new CollimateError('egress_forbidden', `The egress policy is wider than template ${t.id}'s: ${wider}. A sandbox may only narrow its environment's policy.`);
    return asked;
  }

  private networkReason(): string {
    const net = this.engine.networkStatus?.();
    return net?.reason ?? (net?.enabled ? "its template was baked without a network" : 'networking is off');
  }
}

/**
 * What a suspended sandbox holds on the host's disk at most, as suspended_mib counts it: its disk,
 * and its memory's image when the suspend kept it.
 */
function suspendedMib(s: Pick<SandboxInfo, 'memory_mib' | 'disk_mib'>, memoryKept: boolean): number {
  return (memoryKept ? s.memory_mib : 0) + s.disk_mib;
}

/** A create's public ports and port Host as the engine takes them: validation_error for a port Host that is not hostname[:port]. */
function portAccessOf(input: { publicPorts?: boolean; portHost?: string }): { publicPorts?: boolean; portHost?: string } {
  if (input.portHost !== undefined) {
    const problem = portHostProblem(input.portHost);
    if (problem) throw new CollimateError('validation_error', problem);
  }
  return { ...(input.publicPorts === undefined ? {} : { publicPorts: input.publicPorts }), ...(input.portHost === undefined ? {} : { portHost: input.portHost }) };
}
