/**
 * A cluster host's part in environments across hosts, put together at start: the cluster database's
 * view of them (environments.ts), and on a host with an image service the mirror of its own
 * environments and the puller of others' (environmentPull.ts).
 */
import type { ImageService } from '../images/service.js';
import { BlobFetcher } from './blobFetcher.js';
import { BlobLocations } from './blobLocations.js';
import { EnvironmentPuller } from './environmentPull.js';
import { ClusterEnvironments, EnvironmentMirror } from './environments.js';
import { compatKey } from './hosts.js';
import type { ClusterNode } from './node.js';
import { PEER_HEADER } from './peerHeader.js';

export interface ClusterEnvironmentHost {
  environments: ClusterEnvironments;
  /** On a host with an image service: pulls environments other hosts made. */
  puller?: EnvironmentPuller;
  /** Resolves once this host's environment writes so far are in the database. */
  flushed(): Promise<void>;
  stop(): void;
}

/** What of the engine this needs (Engine). */
export interface EnvironmentEngine {
  cfg?: { cacheDir?: string; artifactRamDir?: string };
  environmentArtifact?(tenant: string, id: string): { key: string; dir: string } | undefined;
  removeTemplate?(tenant: string, id: string): Promise<void>;
}

/**
 * Starts mirroring this host's environments (writing them all once) and copy reconciliation.
 * `publishNow` tells the cluster what blobs this host holds after a pull (BlobPublisher).
 */
export async function startClusterEnvironments(node: ClusterNode, engine: EnvironmentEngine, images: ImageService | undefined, publishNow: () => Promise<void>): Promise<ClusterEnvironmentHost> {
  const environments = new ClusterEnvironments(node.pool);
  const log = node.opts.log ?? (() => {});
  const cacheDir = engine.cfg?.cacheDir;
  const ramDir = engine.cfg?.artifactRamDir;
  if (!images || !cacheDir || !ramDir || !engine.environmentArtifact || !engine.removeTemplate) {
    return { environments, flushed: async () => {}, stop: () => {} };
  }
  const artifactOf = (tenant: string, name: string) => engine.environmentArtifact!(tenant, name);
  const mirror = new EnvironmentMirror(environments, node.hostId, compatKey(node.compat), { repo: images.repo, layers: images.layers, ramDir, artifactOf }, log, publishNow);
  await mirror.start();
  const fetcher = new BlobFetcher(new BlobLocations(node.pool), { hostId: node.hostId, secret: () => node.secret, peerHeader: PEER_HEADER });
  const puller = new EnvironmentPuller(environments, fetcher, {
    layers: images.layers, cacheDir, ramDir, artifactOf,
    madeHere: (tenant, name) => images.repo.getEnv(tenant, name) !== undefined,
    registerCopy: (config, runtime, diffIds) => images.registerCopy(config, runtime, diffIds),
    removeTemplate: (tenant, name) => engine.removeTemplate!(tenant, name),
  }, log, () => void publishNow());
  puller.start();
  return {
    environments, puller,
    flushed: () => mirror.flushed(),
    stop: () => {
      mirror.stop();
      puller.stop();
    },
  };
}
