/**
 * The server assembled: configuration in, a listening server out. The engine (or a stand-in
 * module), the image service, in cluster mode the host's membership with its views, blobs, moves
 * and environments, the tenant service, and the REST server with its other doors, started in that
 * order and stopped in the reverse one. `collimate serve` parses its arguments, applies the
 * accelerator policy and calls this; the tests and benches call it with an engine they opened
 * themselves (`engine`), so what they serve is wired as `serve` wires it. Nothing here reads argv or
 * the process environment.
 */
import type { FastifyInstance } from 'fastify';
import { CollimateError } from '../errors.js';
import type { ApiServer } from '../api/server.js';
import type { ClusterNode } from '../cluster/node.js';
import type { QuotaOverrides } from '../service/quotas.js';
import type { CatalogStatus } from '../sandboxes/types.js';
import type { TenantService, TenantServiceOptions } from '../service/tenantService.js';
import type { ClusterEnvironmentHost } from '../cluster/environmentHost.js';
import type { UsagePush } from '../cluster/usage.js';
import type { ImageService } from '../images/service.js';
import type { BuildServerOptions } from '../api/server.js';
import type { ServiceEngine } from '../sandboxes/types.js';
import type { Db } from '../store/db.js';
import type { TemplateHost } from '../images/service.js';
import type { EnvironmentEngine } from '../cluster/environmentHost.js';
import type { MoveEngine } from '../sandboxes/move.js';
import type { SnapshotCopyEngine } from '../sandboxes/snapshotCopies.js';
import type { SnapshotSource } from '../cluster/remoteHost.js';
import type { JailSettings } from '../vmm/jail.js';
import type * as RealEngine from '../sandboxes/engine.js';

/**
 * The engine the server is built around: the tenant service's surface (ServiceEngine) and its
 * database, and the host parts an engine may carry — configuration, confinement, environments
 * (TemplateHost), moves between hosts, a close. The real engine has them all; a stand-in (tests)
 * has the surface and what it chooses of the rest, and the server leaves out what it lacks.
 */
export type ServedEngine = ServiceEngine & EnvironmentEngine & Partial<Pick<TemplateHost, 'addTemplate' | 'removeTemplate' | 'artifactLayers'>> & {
  /** Its database, where keys and usage are kept unless the caller gives another (ServerConfig.db). */
  readonly db?: Db;
  readonly cfg?: { home?: string; cacheDir?: string; artifactRamDir?: string; layerGraceSecs?: number; qemuBinary?: string; jail?: JailSettings; homeTag?: string };
  readonly moves?: MoveEngine;
  readonly snapshotCopies?: SnapshotCopyEngine;
  poolHealth?(): Record<string, { ready: number; target: number; reason: string }>;
  close?(): Promise<void>;
};

/** What an engine module exports (src/sandboxes/engine.ts, or a stand-in named by `engineModule`). */
interface EngineModule {
  Engine: { open(o: { home: string; progress?: (m: string) => void; catalogInBackground?: boolean }): Promise<ServedEngine> };
}
// The real engine is one: the type checker holds it to what the server uses of it.
true satisfies (typeof RealEngine extends EngineModule ? true : false);

function missing(what: string): never {
  throw new StartError(`cannot start: ${what} is needed`);
}

/** An engine that makes environments: it has their configuration and templates (the real one). */
function makesTemplates(engine: ServedEngine): engine is ServedEngine & TemplateHost {
  return typeof engine.addTemplate === 'function' && typeof engine.removeTemplate === 'function' && typeof engine.artifactLayers === 'function'
    && typeof engine.cfg?.home === 'string' && typeof engine.cfg.cacheDir === 'string';
}

/** The server's knobs a caller may set beyond the defaults (body limits, grace, clock, console, envd backend, health). */
export type ServerTuning = Partial<Omit<BuildServerOptions, 'tenants' | 'tls' | 'beforeRoutes' | 'interceptUpgrade' | 'e2bEnv'>>;

export interface ServerConfig {
  /** The server's home (database, sandboxes); required unless `engine` is given. */
  home?: string;
  /** Where to listen; default 127.0.0.1, port 0 (any free one). */
  host?: string;
  port?: number;
  /** Don't listen: the caller injects requests (`api.app.inject`). */
  listen?: boolean;
  /** The JSON log lines' level (logging.ts); none when unset. */
  logLevel?: string;
  tls?: { cert: Buffer; key: Buffer };
  /** The engine module (a path or URL resolved by the caller); default src/sandboxes/engine.ts. */
  engineModule?: string;
  /**
   * An engine the caller opened (tests, benches; a fake implements the same interface), with the
   * database of keys and usage (default its own) and its image service if it has one. The server
   * uses them as they are and leaves them open when it stops.
   */
  engine?: ServedEngine;
  db?: Db;
  images?: ImageService;
  /** The tenant service's clock, port-URL key file and metering period (tests). */
  service?: { now?: () => number; portUrlKeyPath?: string | null; reconcileIntervalMs?: number; quotas?: QuotaOverrides };
  server?: ServerTuning;
  /** Progress lines of the engine's first start and of environments' restore. */
  progress?: (m: string) => void;
  /** Status lines, whole ("collimate: joining the cluster…", a cluster host's warnings), without the newline. */
  say?: (line: string) => void;
  /** Cluster mode: the database, this host's advertised address and capacity, its timings and secrets key. */
  cluster?: {
    url: string;
    /** The URL without its password, for messages. */
    shownUrl: string;
    advertise: string;
    capacity: number;
    timings?: { heartbeatMs: number; leaseMs: number; deadAfterMs: number };
    secretsKey?: Buffer;
  };
}

export interface RunningServer {
  /** Where it listens ('' with `listen: false`). */
  address: string;
  /** The engine as opened (the real one or the module's stand-in). */
  engine: ServedEngine;
  tenants: TenantService;
  api: ApiServer;
  node?: ClusterNode;
  /** Catalog templates still being built in the background. */
  stillBuilding(): string[];
  /**
   * Drains requests (for `graceMs`, default the server's), then stops every part it started (VMs are
   * left running for re-adoption; an engine and images the caller gave stay open).
   */
  stop(graceMs?: number): Promise<void>;
}

/** Why a start failed at a step the operator can act on (one line, no stack). */
export class StartError extends Error {}

/** How this server's VMMs are confined, for /healthz (docs/security.md). */
async function vmmConfinement(engine: ServedEngine): Promise<{ enabled: boolean; cgroups?: string; reason?: string }> {
  const { jail, homeTag, cacheDir } = engine.cfg ?? {};
  if (!jail || !homeTag || cacheDir === undefined) return { enabled: false, reason: 'engine without VMM confinement' };
  const { jailerFor, jailAvailability } = await import('../vmm/jail.js');
  const j = await jailerFor({ jail, homeTag, cacheDir });
  if (!j) return { enabled: false, reason: jailAvailability(jail).reason };
  return { enabled: true, cgroups: j.status().cgroups };
}

export async function startServer(cfg: ServerConfig): Promise<RunningServer> {
  await import('../service/migrations.js'); // register the API's tables before the engine opens the db
  const { buildServer } = await import('../api/server.js');
  const say = cfg.say ?? (() => {});
  const progress = cfg.progress ?? (() => {});
  const given = cfg.engine !== undefined;
  let engine: ServedEngine;
  if (cfg.engine) engine = cfg.engine;
  else {
    if (!cfg.home) throw new StartError('cannot start: no home directory given (--home)');
    const { Engine } = (await import(cfg.engineModule ?? '../sandboxes/engine.js')) as EngineModule;
    try {
      // The first start with an empty cache builds base first and the other catalog templates once serving.
      engine = await Engine.open({ home: cfg.home, progress, catalogInBackground: true });
    } catch (err) {
      throw new StartError(`cannot start: ${(err as Error).message}`);
    }
  }
  const db = cfg.db ?? engine.db ?? missing('a database (the engine has none)');
  const confinement = await vmmConfinement(engine);
  // Own images and environments: ready environments are registered with the engine again before
  // the server listens (their artifacts are cached), interrupted bakes resume in the background.
  let images = cfg.images;
  if (!given && makesTemplates(engine)) {
    const { ImageService } = await import('../images/service.js');
    images = new ImageService({ host: engine, db, log: progress, clusterSecretsKey: cfg.cluster?.secretsKey });
    say('collimate: restoring environments...');
    await images.restore();
  }
  const c = cfg.cluster;
  const clusterLog = (err: unknown, msg: string) => say(`collimate cluster: ${msg}${err ? `: ${(err as Error).message}` : ''}`);
  let node: ClusterNode | undefined;
  if (c) {
    const { ClusterNode } = await import('../cluster/node.js');
    say(`collimate: joining the cluster at ${c.shownUrl} as ${c.advertise} (capacity ${c.capacity})...`);
    try {
      node = await ClusterNode.join({ url: c.url, advertise: c.advertise, capacity: c.capacity, home: cfg.home ?? engine.cfg?.home ?? missing('a home directory (--home) for the cluster host id'), ...(c.timings ? { timings: c.timings } : {}), log: clusterLog }, engine);
    } catch (err) {
      if (!given) {
        await images?.close();
        await engine.close?.();
      }
      throw new StartError(`cannot join the cluster: ${(err as Error).message}`);
    }
  }
  // Cluster-wide views: every host's sandbox events (LISTEN/NOTIFY) and usage (pushed to PostgreSQL).
  const views = node ? await (await import('../cluster/views.js')).startClusterViews(node, engine, db, { url: c!.url, log: clusterLog }) : undefined;
  // Cluster hosts serve their layers and artifact files to peers by digest and say where they are.
  const blobs = node ? await import('../api/blobRoutes.js').then((m) => m.serveClusterBlobs(node!, { layers: images?.layers, cacheDir: engine.cfg?.cacheDir, ramDir: engine.cfg?.artifactRamDir, snapshots: engine.snapshotCopies ? () => engine.snapshotCopies!.blobs() : undefined })) : undefined;
  // Environments across hosts: this host's mirrored to the cluster database, others' pulled when a create needs them.
  const envs = node && blobs ? await import('../cluster/environmentHost.js').then((m) => m.startClusterEnvironments(node!, engine, images, blobs.publishNow)) : undefined;
  const { TenantService } = await import('../service/tenantService.js');
  const cluster = node && views ? await clusterParts(node, engine, db, views, envs, blobs) : undefined;
  const tenants = new TenantService({ engine, images, db, ...cfg.service, ...(cluster?.service ?? {}) });
  if (node) tenants.signer.useKey(node.signingKey());
  const { serverLoggerOptions } = await import('../api/logging.js');
  const moveRoutes = node && engine.moves ? await import('../api/moveRoutes.js') : undefined;
  const peers = node && cluster ? cluster.peers(tenants, images, envs) : undefined;
  const catalogStatus = (): CatalogStatus | undefined => (typeof engine.catalogStatus === 'function' ? engine.catalogStatus() : undefined);
  const api = await buildServer({
    tenants,
    logger: cfg.logLevel ? serverLoggerOptions(cfg.logLevel) : false,
    tls: cfg.tls,
    ...(node && peers
      ? {
        beforeRoutes: (app: FastifyInstance) => {
          // Other hosts operate this host's sandboxes (they entered the cluster by another host).
          peers.register(app);
          blobs?.register(app);
          // Operators move suspended sandboxes between hosts (collimate cluster move / drain).
          if (blobs && engine.moves) moveRoutes!.registerMoveRoutes(app, { node: node!, engine, moves: engine.moves, blobs: blobs.blobs });
          app.addHook('preClose', async () => peers.closeTunnels());
        },
        interceptUpgrade: (req, socket, head) => peers.tunnel(req, socket, head),
        e2bEnv: cluster!.e2bEnv,
      }
      : {}),
    health: () => {
      const catalog = catalogStatus();
      return {
      ready: typeof engine.isReady === 'function' ? engine.isReady() : true,
      accel: engine.accel ?? 'unknown',
      mode: engine.accel === 'kvm' ? 'production' : 'development',
      ...(engine.accel === 'kvm' ? {} : { isolation: 'QEMU does not treat TCG guest escapes as security bugs' }),
      confinement,
      ...(typeof engine.networkStatus === 'function' ? { network: engine.networkStatus() } : {}),
      ...(typeof engine.poolHealth === 'function' ? { pools: engine.poolHealth() } : {}),
      ...(typeof engine.capacity === 'function' ? { capacity: engine.capacity() } : {}),
      // Catalog templates a first start still builds after it began serving (creates of them: 503 template_not_ready).
      ...(catalog ? { catalog } : {}),
      ...(node ? { cluster: { host_id: node.hostId, address: node.address, capacity: node.capacity, lease: node.membership.holdsLease() } } : {}),
      };
    },
    ...cfg.server,
  });
  const address = cfg.listen === false ? '' : await api.app.listen({ host: cfg.host ?? '127.0.0.1', port: cfg.port ?? 0 });
  if (address) api.app.log.info({ event: 'serving', address, home: cfg.home, accel: engine.accel, mode: engine.accel === 'kvm' ? 'production' : 'development', tls: cfg.tls !== undefined, confinement: confinement.enabled }, 'serving');
  return {
    address, engine, tenants, api, node,
    stillBuilding: () => Object.keys(catalogStatus()?.building ?? {}),
    async stop(graceMs?: number) {
      await api.shutdown(graceMs);
      blobs?.stop();
      peers?.stop();
      envs?.stop();
      await envs?.flushed();
      await views?.stop();
      await node?.leave();
      tenants.close();
      if (given) return;
      await images?.close();
      await engine.close?.();
    },
  };
}

/**
 * What a cluster host adds to the tenant service and the server: the cluster's placement, keys,
 * idempotency, events and E2B envVars for the service, and the peer endpoint other hosts operate
 * this host's sandboxes through.
 */
async function clusterParts(node: ClusterNode, engine: ServedEngine, db: Db, views: { sandboxEvents: NonNullable<TenantServiceOptions['sandboxEvents']>; usage?: UsagePush }, envs: ClusterEnvironmentHost | undefined, blobs: { publishNow(): Promise<void> } | undefined) {
  const { ClusterSandboxPlacement } = await import('../cluster/sandboxPlacement.js');
  const copies = engine.snapshotCopies;
  // Copies of other hosts' snapshots, pulled by digest before a start from one (a host that runs sandboxes).
  const snapshots = copies && blobs && node.capacity > 0 ? await snapshotPuller(node, copies, blobs) : undefined;
  const { ClusterSandboxEnvs } = await import('../cluster/sandboxEnvs.js');
  const { ClusterSandboxGrants } = await import('../cluster/sandboxGrants.js');
  const { registerPeerHost, peerTunnel } = await import('../api/peerRoutes.js');
  let placement: InstanceType<typeof ClusterSandboxPlacement> | undefined;
  const service: Partial<TenantServiceOptions> = {
    keys: node.keyCache(db),
    accountKeys: node.keys,
    sandboxGrants: new ClusterSandboxGrants(node.pool),
    idempotency: node.idempotency,
    sandboxEvents: views.sandboxEvents,
    cluster: (here) => (placement = new ClusterSandboxPlacement(node, engine, here, envs, views.usage, snapshots)),
  };
  return {
    service,
    e2bEnv: new ClusterSandboxEnvs(node.pool),
    peers(tenants: TenantService, images: ImageService | undefined, envs: ClusterEnvironmentHost | undefined) {
      const tunnels = new Set<import('node:stream').Duplex>();
      const opts = {
        host: placement!.here,
        isPeer: (secret: string | string[] | undefined) => node.isPeer(secret),
        admit: (slots: number) => node.admit(slots),
        ...(envs?.puller ? { pull: (tenant: string, name: string) => envs.puller!.ensure(tenant, name) } : {}),
        ...(snapshots ? { pullSnapshot: (src: SnapshotSource) => placement!.pullSnapshot(src) } : {}),
        calls: {
          // A snapshot of this host's, for another that starts from it (its files then served by digest).
          exportSnapshot: (tenant: string, id: string) => copiesOf(copies).exportOut(id, { tenant }),
          dropSnapshotCopy: (id: string) => copies?.drop(id) ?? false,
          liveStats: (tenant: string) => tenants.usage.liveStatsHere(tenant),
          // Its sealed secrets stay on this host.
          environment: (tenant: string, name: string) => ({ ...imagesOf(images).environment(tenant, name), secrets: null }),
          deleteEnvironment: async (tenant: string, name: string) => {
            await imagesOf(images).deleteEnvironment(tenant, name);
            await envs?.flushed();
          },
        },
      };
      const tunnel = peerTunnel(opts, tunnels);
      return {
        stop: () => snapshots?.stop(),
        register: (app: FastifyInstance) => registerPeerHost(app, opts),
        tunnel,
        closeTunnels() {
          for (const t of [...tunnels]) t.destroy();
          tunnels.clear();
        },
      };
    },
  };
}

/** The host's puller of other hosts' snapshots, its sweep of copies whose snapshot went started. */
async function snapshotPuller(node: ClusterNode, copies: SnapshotCopyEngine, blobs: { publishNow(): Promise<void> }) {
  const { SnapshotPuller } = await import('../cluster/snapshotPull.js');
  const { BlobFetcher } = await import('../cluster/blobFetcher.js');
  const { BlobLocations } = await import('../cluster/blobLocations.js');
  const { PEER_HEADER } = await import('../cluster/peerHeader.js');
  const locations = new BlobLocations(node.pool);
  const { alivePeers } = await import('../cluster/hosts.js');
  const { RemoteHost } = await import('../cluster/remoteHost.js');
  const puller = new SnapshotPuller((id, address) => new RemoteHost(id, address, node.secret), node.hostId, copies, new BlobFetcher(locations, { hostId: node.hostId, secret: () => node.secret, peerHeader: PEER_HEADER }),
    locations, () => alivePeers(node.pool, node.hostId), (err, msg) => node.opts.log?.(err, msg), () => void blobs.publishNow());
  puller.start();
  return puller;
}

function copiesOf(copies: SnapshotCopyEngine | undefined): SnapshotCopyEngine {
  if (!copies) throw new CollimateError('snapshot_not_found', 'This host holds no snapshots.');
  return copies;
}

function imagesOf(images: ImageService | undefined): ImageService {
  if (!images) throw new CollimateError('environment_not_found', 'This host runs without an image service, so it made no environments.');
  return images;
}
