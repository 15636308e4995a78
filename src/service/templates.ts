/**
 * Templates, images and environments, a part of the tenant service (tenantService.ts): the catalog
 * every tier creates from, a tenant's own images and environments (tier rules: own images, VM size),
 * and on a cluster host the environments other hosts made.
 */
import { CollimateError, msg, see } from '../errors.js';
import type { EnvironmentSpec, ImageService } from '../images/service.js';
import type { EnvironmentRow, ImageRow } from '../images/imageRepo.js';
import type { SourceSpec } from '../images/sources.js';
import type { ServiceEngine, SnapshotInfo, TemplateInfo } from '../sandboxes/types.js';
import type { Quotas } from './quotas.js';
import type { ClusterReadings, Scope } from './types.js';

/** The tenant's snapshots promoted to environments, wherever they lie (the placement's listSnapshots). */
export interface PromotedSnapshots {
  /** All of them (a template list). */
  all(tenant: string): Promise<SnapshotInfo[]>;
  /** The one promoted under `name`, if one is: at most one per tenant and name. */
  named(tenant: string, name: string): Promise<SnapshotInfo | undefined>;
}

const NO_PROMOTED: PromotedSnapshots = { all: async () => [], named: async () => undefined };

export class Templates {
  constructor(
    private readonly engine: ServiceEngine,
    private readonly images: ImageService | undefined,
    private readonly clusterReadings: ClusterReadings | undefined,
    private readonly quotas: Quotas,
    private readonly promoted: PromotedSnapshots = NO_PROMOTED,
  ) {}

  catalog(scope: Scope): TemplateInfo[] {
    return this.engine.templates(scope).filter((t) => t.kind === 'catalog');
  }

  /** The catalog and the tenant's environments, baked or not, and its snapshots promoted to environments. */
  async templates(scope: Scope): Promise<TemplateInfo[]> {
    const baked = this.engine.templates(scope);
    const unbaked = (this.images?.templateInfos(scope.tenant) ?? []).filter((t) => !t.ready && !baked.some((b) => b.kind === 'environment' && b.id === t.id));
    const promoted = scope.tier.ownImages ? (await this.promoted.all(scope.tenant)).map(snapshotTemplate) : [];
    return [...baked, ...unbaked, ...promoted];
  }

  async template(scope: Scope, id: string): Promise<TemplateInfo> {
    if (this.unbakedEnvironment(scope, id)) return this.images!.templateInfos(scope.tenant).find((t) => t.id === id)!;
    try {
      return this.engine.template(id, scope);
    } catch (err) {
      if (!(err instanceof CollimateError && err.code === 'template_not_found') || !scope.tier.ownImages) throw err;
      const promoted = await this.promoted.named(scope.tenant, id);
      if (!promoted) throw err;
      return snapshotTemplate(promoted);
    }
  }

  ownImages(scope: Scope): ImageRow[] {
    return this.images?.images(scope.tenant) ?? [];
  }

  async pullImage(scope: Scope, source: SourceSpec): Promise<ImageRow> {
    requireOwnImages(scope, 'register images');
    const images = this.imagesOrThrow();
    return this.quotas.within(scope, { images: { used: images.images(scope.tenant).length, adding: 1 } }, () => images.pull(scope.tenant, source));
  }

  image(scope: Scope, id: string): ImageRow {
    return this.imagesOrThrow().image(scope.tenant, id);
  }

  deleteImage(scope: Scope, id: string): void {
    this.imagesOrThrow().deleteImage(scope.tenant, id);
  }

  async createEnvironment(scope: Scope, spec: EnvironmentSpec): Promise<EnvironmentRow> {
    requireOwnImages(scope, 'create environments');
    if (this.clusterReadings && !this.images?.repo.getEnv(scope.tenant, spec.name) && (await this.clusterReadings.environmentElsewhere(scope.tenant, spec.name, false))) {
      throw new CollimateError('conflict', msg`Environment ${spec.name} exists; delete it first${see('deleteEnvironment', { name: spec.name })} to replace it.`);
    }
    const tier = scope.tier;
    if ((spec.vcpus ?? 1) > tier.maxVcpus || (spec.memoryMib ?? 256) > tier.maxMemoryMib) {
      throw new CollimateError('tier_forbidden', `The ${tier.name} tier allows at most ${tier.maxVcpus} vCPUs and ${tier.maxMemoryMib} MiB per environment.`);
    }
    const images = this.imagesOrThrow();
    // Made again under its name, an environment replaces itself: it adds none.
    const existing = await this.environments(scope);
    const adding = existing.some((e) => e.name === spec.name) ? 0 : 1;
    const row = await this.quotas.within(scope, { environments: { used: existing.length, adding } }, async () => images.createEnvironment(scope.tenant, spec));
    await this.clusterReadings?.environmentsWritten();
    return row;
  }

  async environments(scope: Scope): Promise<EnvironmentRow[]> {
    if (this.clusterReadings) return this.clusterReadings.environments(scope.tenant);
    return this.images?.environments(scope.tenant) ?? [];
  }

  /**
   * One of the tenant's environments. On a cluster host, one another host made is as that host last
   * recorded it; `fromItsHost` (its bake log) asks that host, and needs it to answer.
   */
  async environment(scope: Scope, name: string, opts: { fromItsHost?: boolean } = {}): Promise<EnvironmentRow> {
    const here = this.images?.repo.getEnv(scope.tenant, name);
    if (here || !this.clusterReadings) return this.imagesOrThrow().environment(scope.tenant, name);
    const elsewhere = await this.clusterReadings.environmentElsewhere(scope.tenant, name, opts.fromItsHost === true);
    if (!elsewhere) return this.imagesOrThrow().environment(scope.tenant, name); // environment_not_found, in its words
    return elsewhere;
  }

  async deleteEnvironment(scope: Scope, name: string): Promise<void> {
    if (this.clusterReadings && !this.images?.repo.getEnv(scope.tenant, name) && (await this.clusterReadings.deleteEnvironmentElsewhere(scope.tenant, name))) return;
    await this.imagesOrThrow().deleteEnvironment(scope.tenant, name);
    await this.clusterReadings?.environmentsWritten();
  }

  /** An environment the image service knows but the engine has not (yet) registered. */
  unbakedEnvironment(scope: Scope, id: string): EnvironmentRow | undefined {
    const env = this.images?.repo.getEnv(scope.tenant, id);
    return env && env.state !== 'ready' ? env : undefined;
  }

  private imagesOrThrow(): ImageService {
    if (!this.images) throw new CollimateError('not_found', 'This server runs without an image service.');
    return this.images;
  }
}

/** A snapshot promoted to an environment, as a template: each sandbox made of it starts from the snapshot. */
function snapshotTemplate(s: SnapshotInfo): TemplateInfo {
  return {
    id: s.environment!, kind: 'snapshot', snapshot_id: s.id,
    description: `Snapshot ${s.id}${s.name ? ` (${s.name})` : ''} of a sandbox of ${s.template}: each sandbox starts from its memory, processes and files.`,
    interpreter: [], ready: true, vcpus: s.vcpus, memory_mib: s.memory_mib, egress: s.egress, network: true,
  };
}

function requireOwnImages(scope: Scope, what: string): void {
  if (!scope.tier.ownImages) {
    throw new CollimateError('tier_forbidden', msg`The ${scope.tier.name} tier cannot ${what}; it creates from catalog images only (list them${see('listImages')}). Upgrade to Pro to bring your own images.`);
  }
}
