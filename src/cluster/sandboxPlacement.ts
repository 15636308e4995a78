/**
 * The tenant service's Placement (src/service/placement.ts) on a cluster host: where a sandbox lives
 * is the sandbox directory's answer (directory.ts), where new ones go and what they cost against the
 * tier's cap is the cluster's placement (placement.ts: one reservation table in PostgreSQL for every
 * host and every door). A sandbox on this host is operated through this host's SandboxHost; one on
 * another host through a client of that host (remoteHost.ts).
 *
 * - A create goes to any host with room that offers its template (a tenant's environment: any host
 *   of its class, which pulls it if it lacks it); a host that turns it away is replaced by another,
 *   up to PLACEMENT_ATTEMPTS hosts.
 * - A fork or resume goes to the sandbox's own host (children need the fork point's memory).
 * - A start from a snapshot goes to hosts holding it first, and spreads over several when one has
 *   no room for all; the others pull a copy (startSpread, snapshotPull.ts).
 * - A change of state made on this host is answered once the directory has it, so the next request,
 *   on any host, sees it.
 * - While the cluster database is unreachable this host still serves its own running sandboxes for
 *   what leaves their state as it is; the rest answers 503 cluster_database.
 */
import { CollimateError, environmentNotReady, sandboxEnded, sandboxNotFound, snapshotNotFound } from '../errors.js';
import type { EnvironmentRow } from '../images/imageRepo.js';
import type { ListFilter, SandboxInfo, ServiceEngine, SnapshotInfo, SnapshotListFilter, TemplateInfo } from '../sandboxes/types.js';
import type { UsageReport } from '../service/metering.js';
import { hostRefused, isHostRefusal, type Placement, type SpreadRequest, type StartRequest } from '../service/placement.js';
import type { ClusterReadings, LiveStat } from '../service/types.js';
import { hostOf, invoke, type SandboxHost } from '../service/sandboxHost.js';
import { clusterDatabaseUnavailable } from './db.js';
import type { DirectoryEntry } from './directory.js';
import type { ClusterEnvironmentHost } from './environmentHost.js';
import { alivePeers, compatKey } from './hosts.js';
import type { ClusterNode } from './node.js';
import type { PlaceRequest } from './placement.js';
import { RemoteHost, type SnapshotSource } from './remoteHost.js';
import type { SnapshotPuller } from './snapshotPull.js';
import { clusterUsage, type UsagePush } from './usage.js';

/** How many hosts a create tries when they turn it away (fenced, full, unreachable). */
const PLACEMENT_ATTEMPTS = 3;

function hostUnavailable(id: string): CollimateError {
  return new CollimateError('host_at_capacity', `Sandbox ${id} is on a host that is not answering; retry shortly.`, { retryAfterSecs: 5, details: { resource: 'cluster_host' } });
}

/** Every operation of `host`, each followed by `after()` when it changes a sandbox's state. */
function settling(host: SandboxHost, after: () => Promise<void>): SandboxHost {
  return hostOf((op, how, args) => {
    if (!('changes' in how)) return invoke(host, op, args);
    return (async () => {
      const r = await invoke(host, op, args);
      await after();
      return r;
    })();
  });
}

/** `host` with every operation that changes a sandbox's state refused (the directory cannot record it now). */
function readOnly(host: SandboxHost, cause: unknown): SandboxHost {
  return hostOf((op, how, args) => ('changes' in how ? Promise.reject(clusterDatabaseUnavailable(cause)) : invoke(host, op, args)));
}

/** An environment row as its host last wrote its view to the cluster database (the log's tail only). */
function rowOfView(tenant: string, v: Record<string, unknown>): EnvironmentRow {
  const time = (x: unknown) => (typeof x === 'string' ? Date.parse(x) : 0);
  return {
    tenant, name: String(v.name), image: String(v.image ?? ''), state: v.state as EnvironmentRow['state'], error: (v.error as string | null) ?? null,
    progress: (v.progress as string | null) ?? null, log: String(v.log_tail ?? ''), description: String(v.description ?? ''),
    interpreter: (v.interpreter as string[]) ?? [], ready_command: (v.ready_command as string | null) ?? null, ready_probe: (v.ready_probe as string | null) ?? null,
    ready_timeout_secs: null, vcpus: Number(v.vcpus ?? 1), memory_mib: Number(v.memory_mib ?? 256), disk_mib: Number(v.disk_mib ?? 0),
    egress: (v.egress as EnvironmentRow['egress']) ?? 'none', secrets: null, secret_names: (v.secret_names as string[]) ?? [],
    created_at: time(v.created_at), updated_at: time(v.updated_at),
  };
}

function makerDown(name: string): CollimateError {
  return new CollimateError('host_at_capacity', `The host that made environment ${name} is not answering; its log and its deletion wait for it. Retry shortly.`, {
    retryAfterSecs: 5,
    details: { resource: 'cluster_host' },
  });
}

export class ClusterSandboxPlacement implements Placement, ClusterReadings {
  /** This host's sandboxes, answered once the directory has their changes. */
  readonly here: SandboxHost;

  constructor(
    private readonly node: ClusterNode,
    private readonly engine: ServiceEngine,
    local: SandboxHost,
    private readonly envs?: ClusterEnvironmentHost,
    private readonly usagePush?: UsagePush,
    /** Copies of other hosts' snapshots (snapshotPull.ts), when this host runs sandboxes. */
    private readonly snapshots?: SnapshotPuller,
  ) {
    this.here = settling(local, () => node.directory.flushed());
  }

  private remote(hostId: string, address: string): RemoteHost {
    return new RemoteHost(hostId, address, this.node.secret);
  }

  private async entry(tenant: string | null, id: string): Promise<DirectoryEntry> {
    const entry = await this.node.directory.lookup(tenant, id);
    if (!entry) throw sandboxNotFound(id);
    if (entry.state === 'lost') throw sandboxEnded(id, 'the host it ran on stopped answering and the cluster marked it lost');
    return entry;
  }

  async locate(tenant: string, id: string): Promise<SandboxHost> {
    let entry: DirectoryEntry;
    try {
      entry = await this.entry(tenant, id);
    } catch (err) {
      if (err instanceof CollimateError) throw err;
      // The cluster database is unreachable: a running sandbox of this host is still served.
      if (this.runsHere(tenant, id)) return readOnly(this.here, err);
      throw clusterDatabaseUnavailable(err);
    }
    if (entry.hostId === this.node.hostId) return this.here;
    if (!entry.hostAlive) throw hostUnavailable(id);
    return this.remote(entry.hostId, entry.hostAddress).asHost();
  }

  async start<T>(req: StartRequest, start: (host: SandboxHost) => Promise<T>): Promise<T> {
    const near = req.near !== undefined ? await this.db(() => this.entry(req.tenant, req.near!)) : undefined;
    if (near && near.hostId !== this.node.hostId && !near.hostAlive) throw hostUnavailable(near.id);
    const env = !near && req.template !== undefined ? await this.db(() => this.environmentPlace(req)) : null;
    const exclude: string[] = [];
    for (let attempt = 1; ; attempt++) {
      const place: PlaceRequest = {
        tenant: req.tenant, tier: req.tier, slots: req.slots, operation: req.operation, exclude,
        ...(near ? { host: near.hostId } : {}),
        ...(!near && !env ? { template: req.template } : {}),
        // A VM host places new sandboxes within its own class; an API-only node anywhere.
        ...(!near && this.node.capacity > 0 ? { compat: compatKey(this.node.compat) } : {}),
        ...(env ?? {}),
      };
      const p = await this.db(() => this.node.placement.place(place));
      const pull = env && req.template !== undefined ? { tenant: req.tenant, name: req.template } : undefined;
      try {
        return p.hostId === this.node.hostId
          ? await this.startHere(req.slots, pull && this.envs?.puller ? () => this.envs!.puller!.ensure(pull.tenant, pull.name) : undefined, start)
          : await start(this.remote(p.hostId, p.address).placed({ admit: req.slots, ...(pull ? { pull } : {}) }));
      } catch (err) {
        if (near || !isHostRefusal(err) || attempt >= PLACEMENT_ATTEMPTS) throw err;
        exclude.push(p.hostId);
      } finally {
        await this.node.placement.release(p.reservationId).catch((err) => this.node.opts.log?.(err, 'releasing a cluster reservation failed'));
      }
    }
  }

  /**
   * Starts `req.slots` sandboxes from a snapshot on hosts of its origin's compatibility class: the
   * hosts holding it take as many as they have room for, the rest go to a host with room for all of
   * them, else to the roomiest and round again — a fork spill. A host that is not the origin pulls
   * a copy first (snapshotPull.ts). A host that turns its part away is replaced; when a part fails
   * otherwise, the parts started are undone.
   */
  async startSpread(req: SpreadRequest, start: (host: SandboxHost, count: number) => Promise<SandboxInfo[]>, undo: (host: SandboxHost, started: SandboxInfo[]) => Promise<void>): Promise<SandboxInfo[]> {
    const origin = await this.snapshotHost(req.tenant, req.snapshot);
    const originAddress = origin.hostId === this.node.hostId ? this.node.address : origin.address;
    const { compat, holders } = await this.db(async () => {
      const c = await this.node.pool.query<{ compat: string }>('SELECT compat FROM hosts WHERE id = $1', [origin.hostId]);
      const h = await this.node.pool.query<{ host_id: string }>(`SELECT DISTINCT host_id FROM blob_locations WHERE kind = 'snapshot' AND of = $1`, [req.snapshot]);
      return { compat: c.rows[0]?.compat, holders: [origin.hostId, ...h.rows.map((r) => r.host_id)] };
    });
    const done: Array<{ host: SandboxHost; started: SandboxInfo[] }> = [];
    const exclude: string[] = [];
    let refusals = 0;
    try {
      for (let left = req.slots; left > 0;) {
        const p = await this.db(() => this.node.placement.place({
          tenant: req.tenant, tier: req.tier, slots: left, operation: req.operation, exclude, prefer: holders, upTo: true,
          ...(compat ? { compat } : {}),
        }));
        const src = p.hostId === origin.hostId ? undefined : { tenant: req.tenant, id: req.snapshot, origin: { hostId: origin.hostId, address: originAddress } };
        try {
          const host = p.hostId === this.node.hostId ? this.here : this.remote(p.hostId, p.address).placed({ admit: p.slots, ...(src ? { snapshot: src } : {}) });
          const started = p.hostId === this.node.hostId
            ? await this.startHere(p.slots, src ? () => this.pullSnapshot(src) : undefined, (h) => start(h, p.slots))
            : await start(host, p.slots);
          done.push({ host, started });
          left -= started.length;
        } catch (err) {
          if (!isHostRefusal(err) || ++refusals >= PLACEMENT_ATTEMPTS) throw err;
          exclude.push(p.hostId);
        } finally {
          await this.node.placement.release(p.reservationId).catch((err) => this.node.opts.log?.(err, 'releasing a cluster reservation failed'));
        }
      }
    } catch (err) {
      for (const d of done) await undo(d.host, d.started).catch((e) => this.node.opts.log?.(e, 'removing the sandboxes of a failed start from a snapshot failed'));
      throw err;
    }
    return done.flatMap((d) => d.started);
  }

  /**
   * A copy of a snapshot pulled here before a start from it (snapshotPull.ts); a host that cannot
   * hold it (it lacks the template's artifact) turns the start away, so it is placed elsewhere.
   */
  async pullSnapshot(src: SnapshotSource): Promise<void> {
    if (!this.snapshots) throw hostRefused('it holds no snapshots of other hosts');
    try {
      await this.snapshots.ensure(src);
    } catch (err) {
      if (err instanceof CollimateError && err.code === 'conflict' && err.details?.reason === 'artifact_missing') throw hostRefused(err.message);
      throw err;
    }
  }

  get spills(): boolean {
    return this.snapshots !== undefined || this.node.capacity === 0;
  }

  async snapshotDeleted(_tenant: string, id: string): Promise<void> {
    this.snapshotHosts.delete(id);
    await this.snapshots?.dropEverywhere(id);
  }

  async list(tenant: string, filter: ListFilter): Promise<{ sandboxes: SandboxInfo[]; next: string | null }> {
    const page = await this.db(() => this.node.directory.list(tenant, {
      ...(filter.state === 'running' || filter.state === 'suspended' ? { state: filter.state } : {}),
      ...(filter.after ? { after: filter.after } : {}),
      ...(filter.labels ? { labels: filter.labels } : {}),
      limit: filter.limit ?? 100,
    }));
    return { sandboxes: page.views as unknown as SandboxInfo[], next: page.next };
  }

  async running(tenant: string): Promise<number> {
    return (await this.db(() => this.node.placement.occupancy(tenant))).running;
  }

  /** Alive hosts other than this one. */
  private async peers(): Promise<Array<{ id: string; address: string }>> {
    return this.db(() => alivePeers(this.node.pool, this.node.hostId));
  }

  /**
   * The host that holds snapshot `id`: this one, else the alive host that answers for it (a
   * snapshot lies on the host of the sandbox it was taken of). Remembered once found.
   */
  private async snapshotHost(tenant: string, id: string): Promise<{ hostId: string; address: string }> {
    try {
      this.engine.getSnapshot(id, { tenant });
      return { hostId: this.node.hostId, address: '' };
    } catch (err) {
      if (!(err instanceof CollimateError && err.code === 'snapshot_not_found')) throw err;
    }
    const known = this.snapshotHosts.get(id);
    const peers = await this.peers();
    for (const p of known ? [...peers.filter((x) => x.id === known), ...peers.filter((x) => x.id !== known)] : peers) {
      try {
        await this.remote(p.id, p.address).asHost().getSnapshot(id, { tenant });
        this.snapshotHosts.set(id, p.id);
        return { hostId: p.id, address: p.address };
      } catch (err) {
        if (err instanceof CollimateError && err.code === 'snapshot_not_found') continue;
        this.node.opts.log?.(err, `host ${p.id} did not answer for snapshot ${id}`);
      }
    }
    throw snapshotNotFound(id);
  }

  private readonly snapshotHosts = new Map<string, string>();

  async locateSnapshot(tenant: string, id: string): Promise<SandboxHost> {
    const h = await this.snapshotHost(tenant, id);
    return h.hostId === this.node.hostId ? this.here : this.remote(h.hostId, h.address).asHost();
  }

  /** Every alive host's page after `filter.after`, merged by id: a page of the tenant's snapshots on the whole cluster. */
  async listSnapshots(tenant: string, filter: SnapshotListFilter): Promise<{ snapshots: SnapshotInfo[]; next: string | null }> {
    const limit = Math.min(Math.max(filter.limit ?? 100, 1), 1000);
    const pages = [this.engine.listSnapshots({ ...filter, limit }, { tenant })];
    for (const p of await this.peers()) {
      try {
        pages.push(await this.remote(p.id, p.address).asHost().listSnapshots({ ...filter, limit }, { tenant }));
      } catch (err) {
        this.node.opts.log?.(err, `host ${p.id} did not list its snapshots`);
      }
    }
    const all = pages.flatMap((x) => x.snapshots).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    const page = all.slice(0, limit);
    const more = all.length > limit || pages.some((x) => x.next !== null);
    return { snapshots: page, next: more && page.length > 0 ? page[page.length - 1].id : null };
  }

  async tenantOf(id: string): Promise<string | null> {
    const entry = await this.db(() => this.node.directory.lookup(null, id));
    return entry && entry.state !== 'lost' ? entry.tenant : null;
  }

  async runningIds(): Promise<string[]> {
    const r = await this.db(() => this.node.pool.query<{ id: string }>(`SELECT id FROM sandboxes WHERE state = 'running' ORDER BY id`));
    return r.rows.map((x) => x.id);
  }

  /** The tenant's usage over every host: this host's latest rows are pushed first, so its own changes show at once. */
  async usage(tenant: string, fromMs: number, toMs: number, opts: { perDay?: boolean }): Promise<UsageReport> {
    await this.usagePush?.push().catch((err) => this.node.opts.log?.(err, 'pushing usage before a report failed'));
    return this.db(() => clusterUsage(this.node.pool, tenant, fromMs, toMs, Date.now(), opts));
  }

  /** Each other alive host that runs some of the tenant's sandboxes, asked for their live stats; one that does not answer is left out. */
  async otherHostsStats(tenant: string): Promise<LiveStat[]> {
    const peers = await this.db(() => this.node.pool.query<{ id: string; address: string }>(
      `SELECT DISTINCT h.id, h.address FROM sandboxes s JOIN hosts h ON h.id = s.host_id
       WHERE s.tenant = $1 AND s.state = 'running' AND h.state = 'alive' AND h.id <> $2`,
      [tenant, this.node.hostId],
    ));
    const each = await Promise.all(peers.rows.map(async ({ id, address }) => {
      try {
        return (await this.remote(id, address).call('liveStats', [tenant])) as LiveStat[];
      } catch (err) {
        this.node.opts.log?.(err, `host ${id} did not give its live stats`);
        return [];
      }
    }));
    return each.flat();
  }

  async environments(tenant: string): Promise<EnvironmentRow[]> {
    if (!this.envs) return [];
    const views = await this.db(() => this.envs!.environments.list(tenant));
    return views.map((v) => rowOfView(tenant, v));
  }

  async environmentElsewhere(tenant: string, name: string, fromItsHost: boolean): Promise<EnvironmentRow | undefined> {
    const row = this.envs ? await this.db(() => this.envs!.environments.get(tenant, name)) : null;
    if (!row || row.hostId === this.node.hostId) return undefined;
    if (!fromItsHost) return rowOfView(tenant, row.view);
    if (!row.hostAlive) throw makerDown(name);
    return (await this.remote(row.hostId, row.hostAddress).call('environment', [tenant, name])) as EnvironmentRow;
  }

  async environmentsWritten(): Promise<void> {
    await this.envs?.flushed();
  }

  async deleteEnvironmentElsewhere(tenant: string, name: string): Promise<boolean> {
    const row = this.envs ? await this.db(() => this.envs!.environments.get(tenant, name)) : null;
    if (!row || row.hostId === this.node.hostId) return false;
    if (!row.hostAlive) throw makerDown(name);
    // Its host answers once its mirror has written the deletion to the cluster database.
    await this.remote(row.hostId, row.hostAddress).call('deleteEnvironment', [tenant, name]);
    return true;
  }

  /**
   * A tenant's environment made on another host, as a template to check a create against (its
   * policy and size as that host recorded them); undefined when the tenant has none by that name.
   */
  async template(tenant: string, name: string): Promise<TemplateInfo | undefined> {
    if (!this.envs) return undefined;
    const row = await this.db(() => this.envs!.environments.get(tenant, name));
    if (!row) return undefined;
    const v = row.view as { state?: string; error?: string | null; description?: string; interpreter?: string[]; vcpus?: number; memory_mib?: number; egress?: TemplateInfo['egress'] };
    if (row.state !== 'ready') throw environmentNotReady(name, row.state, v.error);
    return {
      id: name, kind: 'environment', description: v.description ?? '', interpreter: v.interpreter ?? [], ready: true,
      vcpus: v.vcpus ?? 1, memory_mib: v.memory_mib ?? 256, egress: v.egress ?? 'none',
      network: this.engine.networkStatus?.().enabled ?? false,
    };
  }

  /** A placed start on this host: its lease and capacity re-checked for the slots, what it lacks pulled first (`prepare`). */
  private async startHere<T>(slots: number, prepare: (() => Promise<unknown>) | undefined, start: (host: SandboxHost) => Promise<T>): Promise<T> {
    const slot = this.node.admit(slots);
    if (typeof slot === 'string') throw hostRefused(slot);
    try {
      await prepare?.();
      return await start(this.here);
    } finally {
      slot.release();
    }
  }

  /** Where a create from one of the tenant's environments may go (any host of its class; the maker while its copy is undescribed). */
  private async environmentPlace(req: StartRequest): Promise<Pick<PlaceRequest, 'environment' | 'host' | 'compat'> | null> {
    if (!this.envs || !req.tier.ownImages || req.template === undefined) return null;
    const row = await this.envs.environments.get(req.tenant, req.template);
    if (!row || row.state !== 'ready') return null;
    if (!row.copy) return { host: row.hostId, compat: row.compat };
    return { environment: { warmKey: `${req.tenant}/${req.template}`, artifactKey: row.copy.artifact.key }, compat: row.compat };
  }

  private runsHere(tenant: string, id: string): boolean {
    try {
      const info = this.engine.get(id);
      return info.tenant === tenant && info.state === 'running';
    } catch {
      return false;
    }
  }

  /** A cluster database call; its failure is the 503 clients retry (a CollimateError passes as it is). */
  private async db<T>(f: () => Promise<T>): Promise<T> {
    try {
      return await f();
    } catch (err) {
      throw err instanceof CollimateError ? err : clusterDatabaseUnavailable(err);
    }
  }
}
