/**
 * One host of a cluster: its engine and SQLite journal stay as on a single host; this joins them to
 * the cluster database. It registers the host and keeps its lease (hosts.ts), mirrors every
 * persisted transition of its engine into the sandbox directory (directory.ts), and holds what the
 * tenant service's cluster placement (sandboxPlacement.ts) needs: placement, keys, idempotency and
 * the peer secret.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type pg from 'pg';
import type { SandboxInfo, SandboxService, SandboxTransition } from '../sandboxes/types.js';
import type { Db } from '../store/db.js';
import { migrateCluster, openClusterDb } from './db.js';
import { SandboxDirectory } from './directory.js';
import { compatKey, DEFAULT_TIMINGS, HostMembership, type CompatClass, type HostTimings } from './hosts.js';
import { ClusterIdempotency } from './idempotency.js';
import { ClusterKeys, KeyCache } from './keys.js';
import { ClusterPlacement } from './placement.js';
import { reconcileMoves, type MovesReconcileEngine } from './moves.js';

/** Set by an owner on a 503 that means "not here, place elsewhere" (fenced, or at capacity). */
export const REFUSED_HEADER = 'x-collimate-refused';

export interface ClusterOptions {
  /** postgres://… of the cluster database. */
  url: string;
  /** How peers reach this host's API: http://ADDR:PORT. */
  advertise: string;
  /** Running sandboxes this host takes at most; 0 makes it an API-only node. */
  capacity: number;
  /** Where the host keeps its identity (cluster-host-id), normally the server's home. */
  home: string;
  timings?: HostTimings;
  log?: (err: unknown, msg: string) => void;
}

type ClusterEngine = Pick<SandboxService, 'get' | 'list' | 'templates' | 'delete'> & {
  on?: (e: 'transition', f: (t: SandboxTransition) => void) => unknown;
  off?: (e: 'transition', f: (t: SandboxTransition) => void) => unknown;
  poolStatus?: () => Record<string, { ready: number }>;
  accel?: string;
  cfg?: { qemuBinary?: string };
  /** Moves of suspended sandboxes between hosts (Engine.moves); absent on engines that cannot move. */
  moves?: MovesReconcileEngine['moves'];
};

/** A stable id for this host across restarts (so a restart rejoins as itself and learns what was lost). */
export function hostIdOf(home: string): string {
  const file = join(home, 'cluster-host-id');
  if (existsSync(file)) return readFileSync(file, 'utf8').trim();
  const id = 'host_' + randomBytes(6).toString('hex');
  writeFileSync(file, id + '\n', { mode: 0o644 });
  return id;
}

/** This host's compatibility class: QEMU's version, the machine type, the CPU model and the accelerator. */
export function compatOf(engine: ClusterEngine): CompatClass {
  const accel = engine.accel === 'kvm' ? 'kvm' : engine.accel === 'tcg' ? 'tcg' : String(engine.accel ?? 'unknown');
  const bin = engine.cfg?.qemuBinary ?? 'qemu-system-x86_64';
  const v = spawnSync(bin, ['--version'], { encoding: 'utf8' });
  const qemuVersion = /version (\S+)/.exec(v.stdout ?? '')?.[1] ?? 'unknown';
  // The models qemuArgv (src/vmm/argv.ts) gives each accelerator.
  return { qemuVersion, machine: 'microvm', cpuModel: accel === 'kvm' ? 'host,-arch-capabilities' : 'max', accel };
}

export class ClusterNode {
  readonly hostId: string;
  readonly compat: CompatClass;
  readonly membership: HostMembership;
  readonly directory: SandboxDirectory;
  readonly placement: ClusterPlacement;
  readonly keys: ClusterKeys;
  readonly idempotency: ClusterIdempotency;
  private peerSecret = '';
  /** Creates, forks and resumes this host is running now (slots), for its own capacity re-check. */
  private inFlight = 0;
  private readonly onTransition = (t: SandboxTransition) => this.mirror(t.id, t.tenant, t.state === 'deleted' ? null : t.state);

  private constructor(
    readonly pool: pg.Pool,
    readonly opts: ClusterOptions,
    readonly engine: ClusterEngine,
  ) {
    const log = opts.log ?? (() => {});
    this.hostId = hostIdOf(opts.home);
    this.compat = compatOf(engine);
    this.directory = new SandboxDirectory(pool, log);
    this.placement = new ClusterPlacement(pool);
    this.keys = new ClusterKeys(pool);
    this.idempotency = new ClusterIdempotency(pool);
    this.membership = new HostMembership(
      pool,
      { id: this.hostId, address: opts.advertise.replace(/\/+$/, ''), capacity: opts.capacity, compat: this.compat },
      () => this.report(),
      opts.timings ?? DEFAULT_TIMINGS,
      {
        onError: log,
        onLost: (ids) => this.stopLost(ids),
        onSwept: (hosts, lost) => log(null, `marked hosts ${hosts.join(', ')} dead (heartbeat stale); ${lost} running sandboxes lost`),
      },
    );
  }

  /** Connects, migrates the schema, registers this host, mirrors its sandboxes and starts heartbeating. */
  static async join(opts: ClusterOptions, engine: ClusterEngine): Promise<ClusterNode> {
    const pool = openClusterDb({ url: opts.url, applicationName: 'collimate' }, (err) => opts.log?.(err, 'cluster database connection error'));
    try {
      await migrateCluster(pool);
      const node = new ClusterNode(pool, opts, engine);
      node.peerSecret = (await pool.query<{ value: string }>(`SELECT value FROM cluster_settings WHERE name = 'peer_secret'`)).rows[0].value;
      await node.membership.start();
      // Moves a crash cut off are settled first: a sandbox half-moved onto this host must not be
      // mirrored into the directory as this host's.
      if (engine.moves) for (const done of await reconcileMoves(node.hostId, node.directory, { moves: engine.moves, list: (f) => engine.list(f) })) opts.log?.(null, done);
      await node.syncDirectory();
      engine.on?.('transition', node.onTransition);
      return node;
    } catch (err) {
      await pool.end().catch(() => {});
      throw err;
    }
  }

  /** The tenant service's key store on this host (keys live in the cluster database). */
  keyCache(db: Db): KeyCache {
    return new KeyCache(db, this.keys);
  }

  /** The address peers reach this host at. */
  get address(): string {
    return this.membership.self.address;
  }

  get capacity(): number {
    return this.opts.capacity;
  }

  isPeer(header: string | string[] | undefined): boolean {
    const v = Array.isArray(header) ? header[0] : header;
    if (!v || !this.peerSecret) return false;
    const a = Buffer.from(v);
    const b = Buffer.from(this.peerSecret);
    return a.length === b.length && timingSafeEqual(a, b);
  }

  get secret(): string {
    return this.peerSecret;
  }

  /** The key every host signs port URLs and sandbox tokens with: derived from the peer secret, so all hosts share it. */
  signingKey(): Buffer {
    return createHmac('sha256', this.peerSecret).update('collimate port url key').digest();
  }

  /**
   * The owner's re-check before it runs a create, fork or resume placed on it: its lease holds and
   * its capacity has room for `slots` more. Returns why not, or null. Takes the slots when it allows.
   */
  admit(slots: number): { release(): void } | string {
    if (!this.membership.holdsLease()) return 'this host could not renew its cluster lease, so it takes no new sandboxes until it can';
    const running = this.engine.list({ state: 'running', limit: 1000 }).sandboxes.length;
    if (running + this.inFlight + slots > this.opts.capacity) {
      return `this host runs ${running} sandboxes (plus ${this.inFlight} starting) of its capacity ${this.opts.capacity}`;
    }
    this.inFlight += slots;
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        this.inFlight -= slots;
      },
    };
  }

  /** Stops heartbeating and closes the pool; the host's sandboxes stay in the directory for its restart. */
  async leave(): Promise<void> {
    this.engine.off?.('transition', this.onTransition);
    await this.directory.flushed();
    await this.membership.stop({ deregister: true }).catch((err) => this.opts.log?.(err, 'leaving the cluster failed'));
    await this.pool.end();
  }

  private report(): { templates: string[]; warmPools: Record<string, number> } {
    const templates = this.engine.templates().filter((t) => t.ready && t.kind === 'catalog').map((t) => t.id);
    const warmPools: Record<string, number> = {};
    // Catalog pools by template id, environments' by tenant/name (what placement asks for them).
    for (const [id, s] of Object.entries(this.engine.poolStatus?.() ?? {})) warmPools[id] = s.ready;
    return { templates, warmPools };
  }

  private mirror(id: string, tenant: string, state: string | null): void {
    if (state === null) return this.directory.record(this.hostId, this.membership.hostEpoch, id, tenant, null);
    if (state !== 'running' && state !== 'suspended') return;
    let info: SandboxInfo;
    try {
      info = this.engine.get(id);
    } catch {
      return; // gone again already: its deletion follows
    }
    // The whole record, so a list through any host renders it as the owner would.
    const view: Record<string, unknown> = { ...info };
    this.directory.record(this.hostId, this.membership.hostEpoch, id, tenant, state, view);
  }

  /** Writes every local sandbox to the directory and drops rows of this host the engine no longer has. */
  private async syncDirectory(): Promise<void> {
    const local = new Set<string>();
    let after: string | undefined;
    do {
      const page = this.engine.list({ limit: 1000, ...(after ? { after } : {}) });
      for (const s of page.sandboxes) {
        local.add(s.id);
        this.mirror(s.id, s.tenant, s.state);
      }
      after = page.next ?? undefined;
    } while (after);
    for (const row of await this.directory.ofHost(this.hostId)) {
      if (!local.has(row.id) && row.state !== 'lost') this.directory.record(this.hostId, this.membership.hostEpoch, row.id, '', null);
    }
    await this.directory.flushed();
  }

  /** Stops the VMs of sandboxes the cluster declared lost while this host was away. */
  private async stopLost(ids: string[]): Promise<void> {
    for (const id of ids) {
      try {
        const info = this.engine.get(id);
        await this.engine.delete(id, { tenant: info.tenant });
        this.opts.log?.(null, `stopped sandbox ${id}: the cluster marked it lost while this host was away`);
      } catch {
        // not on this host any more
      }
    }
  }
}
