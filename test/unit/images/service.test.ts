import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { after, before, describe, test } from 'node:test';
import { openDb, type Db } from '../../../src/store/db.ts';
import { ImageService, type TemplateHost } from '../../../src/images/service.ts';
import type { TemplateRecipe } from '../../../src/images/templates.ts';
import { busyboxEntries, dockerSaveArchive, image, layer, ociArchive, writeLayout } from '../../support/oci.ts';

/** Records recipes instead of baking them. */
class FakeHost implements TemplateHost {
  recipes: TemplateRecipe[] = [];
  removed: string[] = [];
  fail?: Error;
  constructor(readonly cfg: { home: string; cacheDir: string }) {}
  async addTemplate(recipe: TemplateRecipe, opts: { progress?: (m: string) => void; log?: (c: string) => void } = {}) {
    if (this.fail) throw this.fail;
    opts.progress?.('baking (fake)');
    opts.log?.('ready output\n');
    this.recipes.push(recipe);
    return { id: recipe.id, kind: 'environment' as const, description: '', interpreter: recipe.interpreter, ready: true, vcpus: recipe.vcpus, memory_mib: recipe.memoryMib, egress: recipe.egress ?? 'allow', network: false };
  }
  async removeTemplate(tenant: string, id: string) { this.removed.push(`${tenant}/${id}`); }
  /** Layer files the fake's sandboxes sit on. */
  sandboxLayers: string[] = [];
  artifactLayers() { return this.sandboxLayers; }
}

describe('image service (layout and archive sources, fake engine)', () => {
  let dir: string; let db: Db; let host: FakeHost; let svc: ImageService; let imports: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'collimate-images-'));
    imports = join(dir, 'imports');
    mkdirSync(imports);
    db = openDb(join(dir, 'collimate.db'));
    host = new FakeHost({ home: dir, cacheDir: join(dir, 'cache') });
    svc = new ImageService({ host, db, importDir: imports, maxUnpackedBytes: 64 * 1024 * 1024 });
  });
  after(async () => { await svc.close(); db.close(); rmSync(dir, { recursive: true, force: true }); });

  const pulled = async (tenant: string, spec: any) => {
    const img = await svc.pull(tenant, spec);
    await svc.idle();
    return svc.image(tenant, img.id);
  };

  const base = () => layer(busyboxEntries(), 'gzip');
  const diff = () => layer([{ name: 'etc/', type: 'dir' }, { name: 'etc/.wh.hostname', data: '' }, { name: 'opt/app/', type: 'dir' }, { name: 'opt/app/run', data: '#!/bin/sh\necho hi\n', mode: 0o755 }, { name: 'usr/bin/setpriv', data: '#!/bin/sh\n', mode: 0o755 }], 'zstd');

  test('an OCI layout with an index (linux/amd64 picked), gzip + zstd layers, Env/WorkingDir/User', async () => {
    const img = image([base(), diff()], { Env: ['PATH=/bin:/usr/bin', 'GREETING=hi'], WorkingDir: '/opt/app', User: 'app', Entrypoint: ['/opt/app/run'], Cmd: ['x'] });
    const r = await pulled('t1', { kind: 'oci-layout', path: writeLayout(join(imports, 'layout1'), img) });
    assert.equal(r.state, 'ready', r.error ?? '');
    assert.equal(r.id, img.manifestDigest);
    assert.equal(r.layers.length, 2);
    for (const l of r.layers) assert.ok(existsSync(join(svc.layers.dir, `${l.diffId.slice(7)}.erofs`)));
    assert.deepEqual(r.runtime!.prefix, ['/usr/bin/setpriv', '--reuid=1000', '--regid=1000', '--init-groups', '--']);
    assert.equal(r.runtime!.env.GREETING, 'hi');
    assert.equal(r.runtime!.env.HOME, '/home/app');
    assert.equal(r.runtime!.cwd, '/opt/app');
    assert.deepEqual(r.runtime!.warnings, []);
    assert.deepEqual(r.config.entrypoint, ['/opt/app/run']);
    assert.ok(r.transferred_bytes > 0);
    assert.deepEqual(readdirSync(join(dir, 'cache', 'tmp')), [], 'nothing left in the staging area');

    // Again: every layer is held, nothing moves.
    const again = await pulled('t1', { kind: 'oci-layout', path: join(imports, 'layout1') });
    assert.equal(again.state, 'ready');
    assert.equal(again.transferred_bytes, 0);
  });

  test("busybox's setpriv applet cannot apply a User: a warning, and commands run as root", async () => {
    const img = image([base()], { User: 'app' });
    const r = await pulled('t1', { kind: 'oci-layout', path: writeLayout(join(imports, 'bbuser'), img) });
    assert.equal(r.runtime!.prefix, undefined);
    assert.match(r.runtime!.warnings.join('\n'), /util-linux setpriv/);
  });

  test('a docker save archive and an OCI archive (gzip-compressed too)', async () => {
    const { diffIds } = dockerSaveArchive(join(imports, 'saved.tar'), [busyboxEntries(), [{ name: 'hello', data: 'world' }]], { Env: ['A=1'] });
    const r = await pulled('t1', { kind: 'archive', path: join(imports, 'saved.tar') });
    assert.equal(r.state, 'ready', r.error ?? '');
    assert.deepEqual(r.layers.map((l) => l.diffId), diffIds);
    const img = image([base(), layer([{ name: 'x', data: 'y' }], 'none')]);
    ociArchive(join(imports, 'oci.tar'), img);
    writeFileSync(join(imports, 'oci.tar.gz'), gzipSync(readFileSync(join(imports, 'oci.tar'))));
    const o = await pulled('t1', { kind: 'archive', path: join(imports, 'oci.tar.gz') });
    assert.equal(o.state, 'ready', o.error ?? '');
    assert.equal(o.id, img.manifestDigest);
    assert.equal(o.transferred_bytes, img.layers[1].blob.length, 'the base layer was held already');
  });

  test('paths outside the import directory are refused', async () => {
    await assert.rejects(svc.pull('t1', { kind: 'oci-layout', path: '/etc' }), /outside the import directory/);
    await assert.rejects(svc.pull('t1', { kind: 'archive', path: join(imports, '../collimate.db') }), /outside the import directory/);
  });

  const broken: [string, () => any, RegExp][] = [
    ['missing blob', () => { const img = image([base(), layer([{ name: 'm', data: 'm' }])]); return { img, opts: { omitBlob: img.layers[1].digest } }; }, /is missing from/],
    ['digest mismatch', () => { const img = image([base(), layer([{ name: 'c', data: 'c'.repeat(100) }])]); return { img, opts: { corruptBlob: img.layers[1].digest } }; }, /does not match its digest|not valid gzip/],
    ['wrong layer media type', () => ({ img: image([base()], {}, { manifestOverride: (m) => ({ ...m, layers: [{ ...m.layers[0], mediaType: 'text/plain' }] }) }) }), /not a tar layer/],
    ['wrong config media type', () => ({ img: image([base()], {}, { manifestOverride: (m) => ({ ...m, config: { ...m.config, mediaType: 'application/vnd.example+json' } }) }) }), /not a container image/],
    ['diff id mismatch', () => ({ img: image([base()], {}, { configOverride: (c) => ({ ...c, rootfs: { type: 'layers', diff_ids: [`sha256:${'1'.repeat(64)}`] } }) }) }), /diff id/],
    ['../../etc/passwd', () => ({ img: image([layer([{ name: '../../etc/passwd', data: 'root::0:0::/:/bin/sh\n' }])]) }), /escapes the root/],
    ['tar bomb', () => ({ img: image([layer([{ name: 'zeros', data: Buffer.alloc(80 * 1024 * 1024) }])]) }), /limit of 67108864 bytes/],
  ];
  for (const [what, make, re] of broken) {
    test(`broken image: ${what} fails with a clear error and leaves nothing behind`, async () => {
      const before = svc.layers.usage();
      const { img, opts } = make();
      const path = writeLayout(join(imports, `broken-${what.replace(/\W+/g, '-')}`), img, opts);
      let msg: string;
      try {
        const r = await pulled('t2', { kind: 'oci-layout', path });
        assert.equal(r.state, 'failed');
        msg = r.error!;
      } catch (e) {
        msg = (e as Error).message;
      }
      assert.match(msg, re);
      assert.deepEqual(svc.layers.usage(), before, 'no layer file added');
      assert.deepEqual(readdirSync(join(dir, 'cache', 'tmp')).filter((f) => !f.startsWith('build-')), []);
    });
  }

  test('environments: secrets sealed in the database, given to execs only; state, log, delete', async () => {
    const img = image([base()], { Env: ['FOO=bar'] });
    const r = await pulled('t3', { kind: 'oci-layout', path: writeLayout(join(imports, 'env1'), img) });
    const env = svc.createEnvironment('t3', { name: 'web', image: r.id, readyCommand: 'echo ok', secrets: { API_TOKEN: 'very-secret-value-123' } });
    assert.equal(env.state, 'pending');
    await svc.idle();
    const done = svc.environment('t3', 'web');
    assert.equal(done.state, 'ready', done.error ?? '');
    assert.match(done.log, /ready output/);
    const recipe = host.recipes.find((x) => x.id === 'web')!;
    assert.equal(recipe.execDefaults!.env!.API_TOKEN, 'very-secret-value-123');
    assert.equal(recipe.execDefaults!.env!.FOO, 'bar');
    assert.equal(recipe.ready!.command, 'echo ok');
    assert.equal(recipe.ready!.env!.API_TOKEN, undefined, 'ready steps do not see secrets');
    assert.equal(recipe.layers[0].path, join(svc.layers.dir, `${img.layers[0].diffId.slice(7)}.erofs`));
    db.pragma('wal_checkpoint(FULL)');
    assert.ok(!readFileSync(join(dir, 'collimate.db')).includes('very-secret-value-123'), 'no plaintext secret in the database');
    assert.ok(existsSync(join(dir, 'secrets.key')));
    assert.throws(() => svc.createEnvironment('t3', { name: 'web', image: r.id }), /exists/);
    assert.throws(() => svc.createEnvironment('t3', { name: 'base', image: r.id }), /catalog/);
    assert.throws(() => svc.deleteImage('t3', r.id), /used by environment/);
    await svc.deleteEnvironment('t3', 'web');
    assert.deepEqual(host.removed, ['t3/web']);
    svc.deleteImage('t3', r.id);
  });

  test('restore: ready environments are registered again, interrupted pulls are marked failed', async () => {
    const img = image([base()]);
    const r = await pulled('t4', { kind: 'oci-layout', path: writeLayout(join(imports, 'env2'), img) });
    svc.createEnvironment('t4', { name: 'again', image: r.id, secrets: { K: 'v' } });
    await svc.idle();
    const host2 = new FakeHost(host.cfg);
    const svc2 = new ImageService({ host: host2, db, importDir: imports });
    await svc2.restore();
    await svc2.idle();
    assert.equal(svc2.environment('t4', 'again').state, 'ready');
    assert.equal(host2.recipes.find((x) => x.id === 'again')!.execDefaults!.env!.K, 'v');
    await svc2.close();
  });

  test('a failing bake records the error', async () => {
    const img = image([base()]);
    const r = await pulled('t5', { kind: 'oci-layout', path: writeLayout(join(imports, 'env3'), img) });
    host.fail = new Error('boom');
    try {
      svc.createEnvironment('t5', { name: 'bad', image: r.id });
      await svc.idle();
      const e = svc.environment('t5', 'bad');
      assert.equal(e.state, 'failed');
      assert.match(e.error!, /boom/);
    } finally {
      host.fail = undefined;
    }
  });

  test("the home's layer record follows its images; a deleted image's own layers are collected, shared and sandbox-held ones stay", async () => {
    const own = layer([{ name: 'own', data: `own ${process.pid} ${Date.now()}` }], 'gzip');
    const held = layer([{ name: 'held', data: `held ${process.pid} ${Date.now()}` }], 'zstd');
    const img = image([base(), own, held]);
    const r = await pulled('t6', { kind: 'oci-layout', path: writeLayout(join(imports, 'gc1'), img) });
    assert.equal(r.state, 'ready', r.error ?? '');
    const record = () => JSON.parse(readFileSync(join(svc.layers.homesDir, readdirSync(svc.layers.homesDir).find((f) => f.endsWith('.json'))!), 'utf8'));
    assert.equal(record().db, join(dir, 'collimate.db'));
    for (const l of img.layers) assert.ok(record().layers.includes(l.diffId), `${l.diffId} recorded`);
    assert.deepEqual(svc.collectLayers(0), [], "every image's layers stay");
    const file = (l: { diffId: string }) => join(svc.layers.dir, `${l.diffId.slice(7)}.erofs`);
    // A sandbox of a deleted environment, suspended, resumes on its artifact's layers.
    host.sandboxLayers = [file(held)];
    svc.deleteImage('t6', r.id);
    assert.ok(!record().layers.includes(own.diffId) && record().layers.includes(held.diffId));
    assert.deepEqual(svc.collectLayers(0).map((l) => l.diffId), [own.diffId]);
    assert.ok(!existsSync(file(own)));
    assert.equal(svc.layers.diffOfBlob(own.digest), undefined, 'its by-blob entry went with it');
    assert.ok(existsSync(file(held)) && existsSync(file(img.layers[0])), 'the sandbox\'s layer and the base other images share stay');
    host.sandboxLayers = [];
    assert.deepEqual(svc.collectLayers(0).map((l) => l.diffId), [held.diffId], 'once the sandbox is gone');
    // Pulled again: built again, not served from a by-blob entry of a layer that is gone.
    const again = await pulled('t6', { kind: 'oci-layout', path: writeLayout(join(imports, 'gc2'), img) });
    assert.equal(again.state, 'ready', again.error ?? '');
    assert.ok(svc.layersPresent(again));
  });
});
