/**
 * Environments across cluster hosts, on a real PostgreSQL 15 (test/support/postgres.ts), with each
 * "host" a real image service (OCI layouts pulled into its own layer store, real erofs layers) over
 * a template host that records recipes and writes an artifact build the way a bake leaves one, and
 * a real HTTP server with the blob routes. Covered:
 *
 * - rows: a host's environments are mirrored into the cluster database as they change (pending →
 *   ready, with what another host needs once ready), listed per tenant, removed when deleted; a row
 *   another host made is never overwritten;
 * - placement for a create from an environment: any host of its class, warm pool first, then a host
 *   holding its artifact, then one that must pull it; capacity and class still hold;
 * - the pull: a host that lacks the environment fetches only the layers it lacks (a base layer it
 *   has is not fetched) and the artifact's files, by digest, and registers the template, which finds
 *   the artifact without a bake, with the secrets opened under the cluster's key; concurrent creates
 *   pull once; a failed pull leaves nothing staged, committed or registered; a deleted environment's
 *   copy is dropped.
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, existsSync, ftruncateSync, mkdirSync, mkdtempSync, openSync, readdirSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import Fastify, { type FastifyInstance } from 'fastify';
import type pg from 'pg';
import { registerBlobRoutes } from '../../../src/api/blobRoutes.js';
import { BlobFetcher } from '../../../src/cluster/blobFetcher.js';
import { BlobLocations } from '../../../src/cluster/blobLocations.js';
import { migrateCluster, openClusterDb } from '../../../src/cluster/db.js';
import { EnvironmentPuller } from '../../../src/cluster/environmentPull.js';
import { ClusterEnvironments, EnvironmentMirror } from '../../../src/cluster/environments.js';
import { HostMembership } from '../../../src/cluster/hosts.js';
import { ClusterPlacement } from '../../../src/cluster/placement.js';
import { readClusterSecretsKey } from '../../../src/cluster/secretsKey.js';
import { CollimateError } from '../../../src/errors.js';
import { writeArtifactManifest } from '../../../src/images/artifactManifest.js';
import { builtArtifact } from '../../../src/images/bake.js';
import { LocalBlobs } from '../../../src/images/localBlobs.js';
import { ImageService, type TemplateHost } from '../../../src/images/service.js';
import type { TemplateRecipe } from '../../../src/images/templates.js';
import { homePaths } from '../../../src/host/paths.js';
import { TIERS } from '../../../src/service/tiers.js';
import { openDb, type Db } from '../../../src/store/db.js';
import { busyboxEntries, image, layer, writeLayout } from '../../support/oci.js';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../../support/postgres.js';

const skip = postgresUnavailable() ?? false;
const SECRET = 'peer-secret-of-this-test';
const PEER = 'x-collimate-peer';
const COMPAT = { qemuVersion: '7.2.0', machine: 'microvm', cpuModel: 'max', accel: 'tcg' };
const COMPAT_KEY = 'qemu=7.2.0;machine=microvm;cpu=max;accel=tcg';
const LONG = { heartbeatMs: 1000, leaseMs: 600_000, deadAfterMs: 1_200_000 };
const list = (dir: string) => (existsSync(dir) ? readdirSync(dir).sort() : []);

/**
 * An engine's part in templates, without VMs: an artifact is keyed by the recipe's layer digests
 * and shape (as bakeKey is), found in the cache when a build is there (builtArtifact, as
 * ensureArtifact does) and otherwise "baked": a build directory and a RAM file of holes and a few
 * data pages written as a bake leaves them.
 */
class ArtifactHost implements TemplateHost {
  recipes: TemplateRecipe[] = [];
  removed: string[] = [];
  bakes = 0;
  readonly templates = new Map<string, { key: string; dir: string }>();
  constructor(readonly cfg: { home: string; cacheDir: string }, readonly ramDir: string) {}
  async addTemplate(recipe: TemplateRecipe) {
    const key = createHash('sha256').update(JSON.stringify([recipe.layers.map((l) => l.digest), recipe.vcpus, recipe.memoryMib, recipe.diskMib, recipe.ready ?? null])).digest('hex');
    const root = join(homePaths(this.cfg.cacheDir).artifacts, key.slice(0, 24));
    mkdirSync(root, { recursive: true });
    let art = builtArtifact(root, key, this.ramDir);
    if (!art) {
      this.bakes++;
      const dir = join(root, `b${this.bakes}-${process.pid}`);
      mkdirSync(dir);
      mkdirSync(this.ramDir, { recursive: true });
      const memPath = join(this.ramDir, `artifact-${key.slice(0, 24)}-b${this.bakes}.mem`);
      const fd = openSync(memPath, 'w');
      ftruncateSync(fd, 8 << 20);
      for (const page of [0, 7, 1000]) writeSync(fd, randomBytes(4096), 0, 4096, page * 4096);
      closeSync(fd);
      writeFileSync(join(dir, 'device.state'), randomBytes(3000));
      const disk = openSync(join(dir, 'disk.raw'), 'w');
      ftruncateSync(disk, 4 << 20);
      writeSync(disk, randomBytes(4096), 0, 4096, 8192);
      closeSync(disk);
      const shape = { vcpus: recipe.vcpus, memoryMib: recipe.memoryMib, kernel: join(this.cfg.cacheDir, 'vmlinuz'), initrd: join(this.cfg.cacheDir, 'initrd'), cmdline: '', layers: recipe.layers.map((l) => l.path) };
      art = { key, dir, shape, diskMib: recipe.diskMib, memPath, devStatePath: join(dir, 'device.state'), diskPath: join(dir, 'disk.raw'), uptimeAtCheckpointMs: 1, bakedAt: '' };
      writeArtifactManifest(art);
    }
    this.recipes.push(recipe);
    this.templates.set(`${recipe.tenant}/${recipe.id}`, { key, dir: art.dir });
    return { id: recipe.id, kind: 'environment' as const, description: '', interpreter: recipe.interpreter, ready: true, vcpus: recipe.vcpus, memory_mib: recipe.memoryMib, egress: recipe.egress ?? 'allow', network: false };
  }
  async removeTemplate(tenant: string, id: string) {
    this.removed.push(`${tenant}/${id}`);
    this.templates.delete(`${tenant}/${id}`);
  }
  artifactLayers() { return []; }
}

interface Host {
  id: string;
  home: string;
  cache: string;
  ramDir: string;
  imports: string;
  db: Db;
  engine: ArtifactHost;
  images: ImageService;
  mirror: EnvironmentMirror;
  puller: EnvironmentPuller;
  app: FastifyInstance;
  /** GETs of blobs this host served, by digest. */
  served: string[];
}

describe('environments across cluster hosts', { skip }, () => {
  let server: ThrowawayPostgres;
  let pool: pg.Pool;
  let root: string;
  let envs: ClusterEnvironments;
  const hosts: Host[] = [];
  /** What the mirrors and pullers reported failing (none expected). */
  const errors: string[] = [];
  /** Publications of what a host holds after a pull (its publisher's publishNow), awaited before the database goes. */
  const publications: Promise<void>[] = [];

  async function startHost(id: string, clusterKey: Buffer): Promise<Host> {
    const home = join(root, id);
    const cache = join(home, 'cache');
    const ramDir = join(home, 'ram');
    const imports = join(home, 'imports');
    mkdirSync(imports, { recursive: true });
    const db = openDb(join(home, 'collimate.db'));
    const engine = new ArtifactHost({ home, cacheDir: cache }, ramDir);
    const images = new ImageService({ host: engine, db, importDir: imports, maxUnpackedBytes: 64 << 20, clusterSecretsKey: clusterKey });
    const blobs = new LocalBlobs({ layers: images.layers, artifacts: { dir: homePaths(cache).artifacts, ramDir } });
    const served: string[] = [];
    const app = Fastify();
    app.addHook('onRequest', async (req) => {
      if (req.method === 'GET') served.push(req.url.split('/').pop()!);
    });
    registerBlobRoutes(app, { blobs, isPeer: (h) => h === SECRET, peerHeader: PEER });
    const address = await app.listen({ host: '127.0.0.1', port: 0 });
    await new HostMembership(pool, { id, address, capacity: 4, compat: COMPAT }, () => ({ templates: [], warmPools: {} }), LONG).register();
    const artifactOf = (t: string, n: string) => engine.templates.get(`${t}/${n}`);
    const mirror = new EnvironmentMirror(envs, id, COMPAT_KEY, { repo: images.repo, layers: images.layers, ramDir, artifactOf }, (err, what) => errors.push(`${what}: ${(err as Error).message}`),
      () => publish({ id, cache, ramDir, images }));
    await mirror.start();
    const locations = new BlobLocations(pool);
    const puller = new EnvironmentPuller(envs, new BlobFetcher(locations, { hostId: id, secret: () => SECRET, peerHeader: PEER }), {
      layers: images.layers, cacheDir: cache, ramDir, artifactOf,
      madeHere: (t, n) => images.repo.getEnv(t, n) !== undefined,
      registerCopy: (c, rt, d) => images.registerCopy(c, rt, d),
      removeTemplate: (t, n) => engine.removeTemplate(t, n),
    }, (err, what) => { if (err) errors.push(`${what}: ${(err as Error).message}`); }, () => {
      publications.push(blobs.scan().then((b) => locations.publish(id, b)).then(() => {}, (err) => { errors.push(`publishing: ${(err as Error).message}`); }));
    });
    const h: Host = { id, home, cache, ramDir, imports, db, engine, images, mirror, puller, app, served };
    hosts.push(h);
    return h;
  }

  /** Publishes what a host holds to blob_locations, as its BlobPublisher does. */
  const publish = async (h: Pick<Host, 'id' | 'cache' | 'ramDir' | 'images'>) => {
    const blobs = new LocalBlobs({ layers: h.images.layers, artifacts: { dir: homePaths(h.cache).artifacts, ramDir: h.ramDir } });
    await new BlobLocations(pool).publish(h.id, await blobs.scan());
  };

  const pullImage = async (h: Host, tenant: string, name: string, img: ReturnType<typeof image>) => {
    const r = await h.images.pull(tenant, { kind: 'oci-layout', path: writeLayout(join(h.imports, name), img) });
    await h.images.idle();
    const got = h.images.image(tenant, r.id);
    assert.equal(got.state, 'ready', got.error ?? '');
    return got;
  };

  const base = layer(busyboxEntries(), 'gzip');
  const variant = layer([{ name: 'opt/', type: 'dir' }, { name: 'opt/app/', type: 'dir' }, { name: 'opt/app/data', data: randomBytes(200_000) }], 'gzip');
  const variantImage = image([base, variant], { Env: ['PATH=/bin:/usr/bin', 'GREETING=hi'] });
  let a: Host, b: Host, c: Host;

  before(async () => {
    server = await startPostgres();
    pool = openClusterDb({ url: server.createDatabase('envs') });
    await migrateCluster(pool);
    envs = new ClusterEnvironments(pool);
    root = mkdtempSync(join(tmpdir(), 'cluster-envs-'));
    const key = await readClusterSecretsKey(pool);
    a = await startHost('host_a', key);
    b = await startHost('host_b', key);
    c = await startHost('host_c', key);
  });

  after(async () => {
    await Promise.all(publications);
    for (const h of hosts) {
      h.mirror.stop();
      await h.images.close();
      await h.app.close();
      h.db.close();
    }
    await pool?.end();
    await server?.stop();
    rmSync(root, { recursive: true, force: true });
  });

  test('a host\'s environments are rows in PostgreSQL as they change, listed per tenant, gone when deleted; another host\'s row is left alone', async () => {
    await pullImage(a, 'acme', 'variant', variantImage);
    const made = a.images.createEnvironment('acme', { name: 'web', image: variantImage.manifestDigest, secrets: { API_TOKEN: 'very-secret-123' }, readyCommand: 'true' });
    assert.equal(made.state, 'pending');
    await a.mirror.flushed();
    const early = await envs.get('acme', 'web');
    assert.ok(early, 'the row exists as soon as the environment does');
    assert.equal(early.hostId, 'host_a');
    await a.images.idle();
    await a.mirror.flushed();
    assert.deepEqual(errors, []);
    const row = (await envs.get('acme', 'web'))!;
    assert.equal(row.state, 'ready');
    assert.equal(row.view.state, 'ready');
    assert.deepEqual(row.view.secret_names, ['API_TOKEN']);
    assert.equal(row.compat, COMPAT_KEY);
    const copy = row.copy!;
    assert.ok(copy, 'a ready environment says what another host needs');
    assert.deepEqual(copy.layers.map((l) => l.diffId), [base.diffId, variant.diffId]);
    for (const l of copy.layers) assert.equal(l.erofsDigest, await a.images.layers.erofsDigestOf(l.diffId));
    assert.equal(copy.artifact.key, a.engine.templates.get('acme/web')!.key);
    assert.deepEqual(copy.artifact.files.map((f) => f.kind).sort(), ['artifact-disk', 'artifact-mem', 'artifact-state']);
    const published = await pool.query(`SELECT kind FROM blob_locations WHERE host_id = 'host_a' AND (of = $1 OR digest = ANY($2))`, [copy.artifact.key, copy.layers.map((l) => l.erofsDigest)]);
    assert.equal(published.rowCount, 5, 'its blobs (two layers, three artifact files) were findable before its row said what to pull');
    assert.match(copy.config.secrets!, /^c1\./, 'sealed under the cluster\'s key');
    assert.ok(!JSON.stringify(row).includes('very-secret-123'), 'no secret value in the database');
    assert.deepEqual((await envs.list('acme')).map((v) => v.name), ['web']);
    assert.deepEqual(await envs.list('other-tenant'), []);

    // A host writing a row of the same name (it made one too, racing) does not take it over.
    await envs.put('host_b', COMPAT_KEY, { ...a.images.environment('acme', 'web'), state: 'failed' }, null);
    assert.equal((await envs.get('acme', 'web'))!.hostId, 'host_a');
    assert.equal((await envs.get('acme', 'web'))!.state, 'ready');

    // Deleted on its host: the row goes.
    a.images.createEnvironment('acme', { name: 'scratch', image: variantImage.manifestDigest });
    await a.images.idle();
    await a.images.deleteEnvironment('acme', 'scratch');
    await a.mirror.flushed();
    assert.equal(await envs.get('acme', 'scratch'), null);
    assert.deepEqual((await envs.list('acme')).map((v) => v.name), ['web']);
  });

  test('placement for an environment: a warm pool first, then a host holding its artifact, then one that must pull; class and capacity hold', async () => {
    const placement = new ClusterPlacement(pool);
    const row = (await envs.get('acme', 'web'))!;
    const env = { warmKey: 'acme/web', artifactKey: row.copy!.artifact.key };
    const pro = TIERS.pro;
    const place = async (exclude: string[] = []) => {
      const p = await placement.place({ tenant: 'acme', tier: pro, slots: 1, operation: 'create', environment: env, compat: row.compat, exclude });
      await placement.release(p.reservationId);
      return p.hostId;
    };
    // Host A holds the artifact (it baked it, and published its blobs before its row said what to pull); B and C hold nothing of it: A every time.
    for (let i = 0; i < 5; i++) assert.equal(await place(), 'host_a');
    // A warm pool for it beats holding the artifact (C reports one in its heartbeat).
    await pool.query(`UPDATE hosts SET warm_pools = '{"acme/web": 1}' WHERE id = 'host_c'`);
    for (let i = 0; i < 5; i++) assert.equal(await place(), 'host_c');
    await pool.query(`UPDATE hosts SET warm_pools = '{}' WHERE id = 'host_c'`);
    // A full (its capacity reserved): the create goes to a host that must pull it, B or C.
    await pool.query(`INSERT INTO reservations (id, tenant, host_id, slots, lease_until) VALUES ('rsv_fill_a', 'other', 'host_a', 4, now() + interval '1 hour')`);
    const spread = new Set<string>();
    for (let i = 0; i < 10; i++) spread.add(await place());
    assert.ok(!spread.has('host_a'));
    assert.ok([...spread].every((h) => h === 'host_b' || h === 'host_c'));
    await pool.query(`DELETE FROM reservations WHERE id = 'rsv_fill_a'`);
    // No host of the artifact's class: refused, never placed elsewhere.
    await assert.rejects(
      placement.place({ tenant: 'acme', tier: pro, slots: 1, operation: 'create', environment: env, compat: 'qemu=9;machine=microvm;cpu=host;accel=kvm' }),
      (e: CollimateError) => e.code === 'host_at_capacity',
    );
    // A catalog create is placed as before: only hosts offering the template.
    await assert.rejects(placement.place({ tenant: 'acme', tier: pro, slots: 1, operation: 'create', template: 'web' }), (e: CollimateError) => e.code === 'template_not_found');
  });

  test('a host that lacks the environment pulls only the layers it lacks and the artifact\'s files, once for concurrent creates, and registers it without a bake', async () => {
    // B holds the base layer already (an image on that base was pulled there); C holds nothing.
    await pullImage(b, 'acme', 'base', image([base], {}));
    await publish(a);
    const row = (await envs.get('acme', 'web'))!;
    const copy = row.copy!;
    a.served.length = 0;
    const reports = await Promise.all(Array.from({ length: 5 }, () => b.puller.ensure('acme', 'web')));
    const report = reports[0]!;
    assert.ok(reports.every((r) => r === report), 'five concurrent creates, one pull');
    assert.deepEqual(report.layersHeld, [base.diffId], 'the base layer it had is not fetched');
    assert.deepEqual(report.layersPulled, [variant.diffId]);
    assert.equal(report.artifactPulled, true);
    const variantLayer = copy.layers[1];
    assert.equal(report.layerBytes, variantLayer.size, 'layer bytes moved: the variant layer\'s erofs size');
    // Each blob asked for once: the variant layer and the artifact's three files.
    assert.deepEqual(a.served.sort(), [variantLayer.erofsDigest, ...copy.artifact.files.map((f) => f.digest)].sort());
    const mem = copy.artifact.files.find((f) => f.kind === 'artifact-mem')!;
    assert.ok(report.artifactBytes < mem.size, `the RAM file moved as data only (${report.artifactBytes} bytes for a ${mem.size}-byte artifact)`);
    // In B's store, with the same erofs digest; the artifact in B's cache, its RAM file in B's RAM directory.
    assert.equal(await b.images.layers.erofsDigestOf(variant.diffId), variantLayer.erofsDigest);
    const found = builtArtifact(join(homePaths(b.cache).artifacts, copy.artifact.key.slice(0, 24)), copy.artifact.key, b.ramDir);
    assert.ok(found, 'the pulled build is found under its key');
    assert.ok(existsSync(join(b.ramDir, copy.artifact.ramFile)));
    assert.equal(b.engine.bakes, 0, 'registered without a bake');
    assert.equal(b.engine.templates.get('acme/web')!.key, copy.artifact.key);
    const recipe = b.engine.recipes.find((r) => r.id === 'web')!;
    assert.equal(recipe.tenant, 'acme');
    assert.ok(recipe.layers.every((l) => l.path.startsWith(b.images.layers.dir)), 'with B\'s own layer paths');
    assert.equal(recipe.execDefaults?.env?.API_TOKEN, 'very-secret-123', 'its secrets opened on B with the cluster\'s key');
    assert.equal(recipe.execDefaults?.env?.GREETING, 'hi');
    assert.equal(b.images.environments('acme').length, 0, 'B\'s own tables do not take it: it stays A\'s');
    // Asked again: nothing moves.
    a.served.length = 0;
    assert.equal(await b.puller.ensure('acme', 'web'), null);
    assert.deepEqual(a.served, []);
    // Its own host never pulls it.
    assert.equal(await a.puller.ensure('acme', 'web'), null);
    // B publishes what it pulled (its publisher does after a pull; here at once): C pulls from A or B.
    await publish(b);
    const holders = (await pool.query(`SELECT host_id FROM blob_locations WHERE digest = $1 ORDER BY host_id`, [variantLayer.erofsDigest])).rows.map((r) => r.host_id);
    assert.deepEqual(holders, ['host_a', 'host_b']);
    const fromC = (await c.puller.ensure('acme', 'web'))!;
    assert.deepEqual(fromC.layersPulled, [base.diffId, variant.diffId], 'C had nothing: both layers');
    assert.equal(c.engine.bakes, 0);
  });

  test('a pull that cannot get a blob fails with image_pull_failed and leaves nothing staged, committed or registered; errors for unknown and unready environments', async () => {
    // An environment whose row names a layer and an artifact nobody holds (its host lost them).
    const row = (await envs.get('acme', 'web'))!;
    const copy = structuredClone(row.copy!);
    const lost = { diffId: `sha256:${'e'.repeat(64)}`, blobDigest: `sha256:${'d'.repeat(64)}`, erofsDigest: `sha256:${'f'.repeat(64)}`, size: 1234, unpackedBytes: 1, facts: copy.layers[0].facts };
    copy.layers.push(lost);
    copy.artifact.key = 'b'.repeat(64);
    copy.config.name = 'broken';
    const env = { ...a.images.environment('acme', 'web'), name: 'broken', created_at: Date.now() };
    await envs.put('host_a', COMPAT_KEY, env, copy);
    const before = { layers: list(c.images.layers.dir), ram: list(c.ramDir), recipes: c.engine.recipes.length };
    await assert.rejects(c.puller.ensure('acme', 'broken'), (e: CollimateError) => {
      assert.equal(e.code, 'image_pull_failed');
      assert.match(e.message, /no alive host holds it/);
      return true;
    });
    assert.deepEqual(list(c.images.layers.dir), before.layers, 'no layer committed');
    assert.deepEqual(list(c.ramDir), before.ram, 'no RAM file left');
    assert.deepEqual(list(homePaths(c.cache).tmp), [], 'nothing staged left');
    const artRoot = join(homePaths(c.cache).artifacts, copy.artifact.key.slice(0, 24));
    assert.ok(!existsSync(artRoot) || readdirSync(artRoot).every((f) => f === 'users' || f === 'claimed-at'), 'no build directory');
    assert.equal(c.engine.recipes.length, before.recipes, 'nothing registered');
    assert.equal(c.engine.templates.has('acme/broken'), false);

    await assert.rejects(c.puller.ensure('acme', 'nope'), (e: CollimateError) => e.code === 'template_not_found');
    await envs.put('host_a', COMPAT_KEY, { ...env, name: 'baking', state: 'baking' }, null);
    await assert.rejects(c.puller.ensure('acme', 'baking'), (e: CollimateError) => e.code === 'template_not_ready' && /baking/.test(e.message));
  });

  test('a copy is dropped once its environment is deleted on the host that made it', async () => {
    assert.ok(b.engine.templates.has('acme/web'));
    await a.images.deleteEnvironment('acme', 'web');
    await a.mirror.flushed();
    assert.equal(await envs.get('acme', 'web'), null);
    await b.puller.reconcile();
    await c.puller.reconcile();
    assert.ok(b.engine.removed.includes('acme/web'));
    assert.ok(c.engine.removed.includes('acme/web'));
    assert.equal(b.engine.templates.has('acme/web'), false);
    await Promise.all(publications);
    assert.deepEqual(errors, [], 'no mirror write, pull log or publication failed');
  });
});
