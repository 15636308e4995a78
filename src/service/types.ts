/**
 * What the parts of the tenant service (tenantService.ts) and its callers say to each other: who acts
 * (Scope), what a create or fork asks, and what a cluster host plugs in beneath (idempotency, keys,
 * readings over every host).
 */
import type { EnvironmentRow } from '../images/imageRepo.js';
import type { EgressInput } from '../net/policy.js';
import type { OnTimeout, TemplateInfo } from '../sandboxes/types.js';
import type { StoredResponse } from './idempotency.js';
import type { KeyRecord } from './keys.js';
import type { UsageReport } from './metering.js';
import type { PortRoute } from './sandboxHost.js';
import { TRUSTED_TIER, type Tier } from './tiers.js';

export interface Scope {
  tenant: string;
  tier: Tier;
  /**
   * The API key acting (key_…), or the key a sandbox token acting was issued under: sandbox tokens
   * issued to this scope die with it. Absent for the engine's own fleet.
   */
  keyId?: string;
}

/** The scope of a process that holds the engine itself (the local RL fleet): no caps. */
export function trustedScope(tenant: string): Scope {
  return { tenant, tier: TRUSTED_TIER };
}

export interface CreateInput {
  template: string;
  labels?: Record<string, string>;
  /** Default: the tier's default session (the server's, for a trusted scope). */
  timeoutSecs?: number;
  /** Narrows the template's policy; absent: the template's. */
  egress?: EgressInput;
  /** What the session's end does; absent: the server's default. */
  onTimeout?: OnTimeout;
  /** Resume on a request that needs it running, while suspended. */
  autoResume?: boolean;
  /** false: a suspend that does not say keeps only its files; default true. */
  keepMemory?: boolean;
  /** Its ports answer without a key or token; default false. */
  publicPorts?: boolean;
  /** The Host header template its servers see through the ports proxy (`${PORT}` replaced); checked by portHostProblem. */
  portHost?: string;
}

export interface ForkInput {
  count: number;
  labels?: Record<string, string>;
}

/** A start of sandboxes from a snapshot (POST /v1/sandboxes with `snapshot`). */
export interface SnapshotStartInput {
  snapshot: string;
  count: number;
  labels?: Record<string, string>;
  /** Default: the tier's default session, else that of the sandbox the snapshot was taken of. */
  timeoutSecs?: number;
  /** Narrows the snapshot's policy; absent: the snapshot's. */
  egress?: EgressInput;
  onTimeout?: OnTimeout;
  autoResume?: boolean;
  /** Default: the snapshot's. */
  keepMemory?: boolean;
  /** Default: the snapshot's. */
  publicPorts?: boolean;
  /** Default: the snapshot's. */
  portHost?: string;
}

export interface PortUrl {
  /** The token of `/v1/p/<token>/`. */
  token: string;
  port: number;
  expiresAt: number;
}

/** A sandbox port resolved for the ports proxy. */
export interface ResolvedPort {
  sandboxId: string;
  /** Whose sandbox it is: its connections count against that tenant's open_streams quota. */
  tenant: string;
  port: number;
  target: PortRoute;
  /** A signed URL's expiry (unix seconds). */
  expiresAt?: number;
}

/** Runs a request once per (tenant, key): this server's store, or the cluster's (src/cluster/idempotency.ts). */
export interface IdempotencyRunner {
  run(tenant: string, key: string, fp: string, exec: () => Promise<StoredResponse>): Promise<StoredResponse & { replayed: boolean }>;
  /** Drops records past their time (a store that expires its own has none). */
  prune?(): void;
}

/** Managing a tenant's keys: this server's store, or the cluster's (src/cluster/keys.ts ClusterKeys). */
export interface AccountKeys {
  list(filter: { tenant: string }): KeyRecord[] | Promise<KeyRecord[]>;
  create(opts: { tenant: string; name?: string }): { key: string; record: KeyRecord } | Promise<{ key: string; record: KeyRecord }>;
  get(id: string): KeyRecord | null | Promise<KeyRecord | null>;
  revoke(id: string): unknown;
}

/** Live use of one running sandbox's VMM. */
export interface LiveStat {
  id: string;
  cpuPercent: number | null;
  memoryMib: number;
}

/** Where a cluster host's tenant-wide readings come from: every host, not this one alone. */
export interface ClusterReadings {
  /** The tenant's usage over every host. */
  usage(tenant: string, fromMs: number, toMs: number, opts: { perDay?: boolean }): Promise<UsageReport>;
  /** The live stats of the tenant's sandboxes on the other hosts (a host that does not answer is left out). */
  otherHostsStats(tenant: string): Promise<LiveStat[]>;
  /** A tenant's environment made on another host, as a template to check a create against. */
  template(tenant: string, name: string): Promise<TemplateInfo | undefined>;
  /** The tenant's environments as every host last wrote them. */
  environments(tenant: string): Promise<EnvironmentRow[]>;
  /**
   * One of the tenant's environments another host made: as its host last wrote it to the cluster,
   * or with `fromItsHost` (its whole bake log) asked of that host, 503 while it does not answer.
   * Undefined when no other host made one by that name.
   */
  environmentElsewhere(tenant: string, name: string, fromItsHost: boolean): Promise<EnvironmentRow | undefined>;
  /** Deletes an environment another host made, on that host; false when no other host made one by that name. */
  deleteEnvironmentElsewhere(tenant: string, name: string): Promise<boolean>;
  /** Resolves once this host's environment changes so far are in the cluster database (so every host shows them). */
  environmentsWritten(): Promise<void>;
}
