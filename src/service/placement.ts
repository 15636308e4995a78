/**
 * Where sandboxes live and where new ones go, asked by the tenant service for every operation,
 * whichever door it came by. Two implementations: this host alone (LocalPlacement, below) and a
 * cluster of hosts over PostgreSQL (src/cluster/clusterPlacement.ts). The tenant service's rules sit
 * above it; what a start costs against the tier's cap is decided here, once, for both modes.
 */
import { CollimateError, sandboxNotFound } from '../errors.js';
import type { ListFilter, SandboxInfo, ServiceEngine, SnapshotInfo, SnapshotListFilter } from '../sandboxes/types.js';
import { Admission } from './admission.js';
import type { SandboxHost } from './sandboxHost.js';
import { runningHere } from './sandboxMetrics.js';
import type { Tier } from './tiers.js';

/** What starts sandboxes: how many, for the messages, and where they must or may go. */
export interface StartRequest {
  tenant: string;
  tier: Tier;
  /** Sandboxes it starts (the slots it takes of the tier's cap). */
  slots: number;
  /** For messages: "create", "fork of 4", "resume". */
  operation: string;
  /** A fork or a resume: where this sandbox runs (its children need its memory). */
  near?: string;
  /** A create: from this template or environment (a host that has it, or can pull it). */
  template?: string;
}

/** A start from a snapshot (Placement.startSpread): hosts holding it first, others pulling it. */
export interface SpreadRequest extends Omit<StartRequest, 'near' | 'template'> {
  snapshot: string;
}

export interface Placement {
  /** The host that runs the tenant's sandbox `id`; sandbox_not_found when the tenant has none by that id. */
  locate(tenant: string, id: string): Promise<SandboxHost>;
  /**
   * Runs `start` on a host with room for `req.slots` new sandboxes, within the tier's cap
   * (concurrency_limit past it). The slots are held until `start` settles; a host that turns the
   * start away (host_at_capacity from a host the placement could not know was full) is replaced by
   * another where one may go.
   */
  start<T>(req: StartRequest, start: (host: SandboxHost) => Promise<T>): Promise<T>;
  /**
   * A start of `req.slots` sandboxes from snapshot `req.snapshot` that may spread over hosts: as
   * many on one host as it has room for, the rest on others (which pull the snapshot first). All
   * or none: when one part fails, `undo` removes the sandboxes the others started, and it throws.
   */
  startSpread(req: SpreadRequest, start: (host: SandboxHost, count: number) => Promise<SandboxInfo[]>, undo: (host: SandboxHost, started: SandboxInfo[]) => Promise<void>): Promise<SandboxInfo[]>;
  /** Whether a fork too wide for its sandbox's host may spill onto others (a cluster). */
  readonly spills: boolean;
  /** Snapshot `id` was deleted: the copies other hosts pulled of it go too (nothing for one host). */
  snapshotDeleted(tenant: string, id: string): Promise<void>;
  /** The tenant's sandboxes, by id, a page at a time. */
  list(tenant: string, filter: ListFilter): Promise<{ sandboxes: SandboxInfo[]; next: string | null }>;
  /** How many of the tenant's sandboxes run now, on every host. */
  running(tenant: string): Promise<number>;
  /** Every running sandbox's id on every host (E2B's signed file URLs name none: each is tried). */
  runningIds(): Promise<string[]>;
  /** Whose sandbox `id` is (for a request that proves access with a token, which names no tenant); null when none has it. */
  tenantOf(id: string): Promise<string | null>;
  /** The host that holds the tenant's snapshot `id`; snapshot_not_found when the tenant has none by that id. */
  locateSnapshot(tenant: string, id: string): Promise<SandboxHost>;
  /** The tenant's snapshots on every host, by id, a page at a time. */
  listSnapshots(tenant: string, filter: SnapshotListFilter): Promise<{ snapshots: SnapshotInfo[]; next: string | null }>;
}

/** One host: every sandbox is this engine's, and the cap counts its running sandboxes plus those starting. */
export class LocalPlacement implements Placement {
  readonly admission: Admission;

  constructor(private readonly engine: ServiceEngine, private readonly host: SandboxHost, admissionWaitMs?: number) {
    this.admission = new Admission(engine, admissionWaitMs);
  }

  async locate(tenant: string, id: string): Promise<SandboxHost> {
    // The engine answers sandbox_not_found for an id it lacks or another tenant's.
    if (this.engine.get(id, { tenant }).tenant !== tenant) throw sandboxNotFound(id);
    return this.host;
  }

  async start<T>(req: StartRequest, start: (host: SandboxHost) => Promise<T>): Promise<T> {
    const slot = await this.admission.reserve(req.tenant, req.tier, req.slots, req.operation);
    try {
      return await start(this.host);
    } finally {
      slot.release();
    }
  }

  readonly spills = false;

  startSpread(req: SpreadRequest, start: (host: SandboxHost, count: number) => Promise<SandboxInfo[]>): Promise<SandboxInfo[]> {
    return this.start(req, (host) => start(host, req.slots));
  }

  async snapshotDeleted(): Promise<void> {}

  async list(tenant: string, filter: ListFilter): Promise<{ sandboxes: SandboxInfo[]; next: string | null }> {
    const r = this.engine.list(filter, { tenant });
    return { sandboxes: r.sandboxes.filter((s) => s.tenant === tenant), next: r.next };
  }

  async running(tenant: string): Promise<number> {
    return this.engine.countRunning(tenant);
  }

  async tenantOf(id: string): Promise<string | null> {
    try {
      return this.engine.get(id).tenant;
    } catch {
      return null;
    }
  }

  async runningIds(): Promise<string[]> {
    return runningHere(this.engine);
  }

  async locateSnapshot(tenant: string, id: string): Promise<SandboxHost> {
    this.engine.getSnapshot(id, { tenant }); // snapshot_not_found for an id it lacks or another tenant's
    return this.host;
  }

  async listSnapshots(tenant: string, filter: SnapshotListFilter): Promise<{ snapshots: SnapshotInfo[]; next: string | null }> {
    return this.engine.listSnapshots(filter, { tenant });
  }
}

/** A host turned a placed start away (it filled up, or lost its lease): the placement may try another. */
export function hostRefused(why: string): CollimateError {
  return new CollimateError('host_at_capacity', `This host cannot take it: ${why}; place it elsewhere.`, { retryAfterSecs: 5, details: { resource: 'cluster_host', refused: true } });
}

export function isHostRefusal(err: unknown): boolean {
  return err instanceof CollimateError && err.code === 'host_at_capacity' && err.details?.refused === true;
}
