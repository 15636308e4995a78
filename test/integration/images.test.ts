/**
 * Own images end to end, on real microVMs and a real registry (Debian's docker-registry, started
 * here): push test images built from files with our own client, pull them through a byte-counting
 * proxy, bake environments through the REST API, create sandboxes and exec in them.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import '../../src/service/migrations.ts';
import { ImageService } from '../../src/images/service.ts';
import { readArtifactManifest } from '../../src/images/artifactManifest.ts';
import { RegistryClient, parseReference } from '../../src/images/registry.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { assertNoLeaks, openEngine, testHome, TEST_CACHE, serveEngine, type Served } from './fixture.ts';
import { busyboxEntries, dockerSaveArchive, image, layer, push, writeLayout, type TestImage } from '../support/oci.ts';
import { countingProxy, startRegistry, type CountingProxy, type TestRegistry } from '../support/registry.ts';

const SECRET = 'sk-collimate-test-7f3a9c2e51d8';
const MiB = 1024 * 1024;
const mib = (n: number) => `${(n / MiB).toFixed(2)} MiB`;

/** Artifacts (and their RAM files) baked from layers under `storeDir`: they would outlive the test home. */
function removeArtifactsOf(storeDir: string, ramDir: string): void {
  const root = join(TEST_CACHE, 'artifacts');
  for (const k of existsSync(root) ? readdirSync(root) : []) {
    for (const b of readdirSync(join(root, k))) {
      if (!existsSync(join(root, k, b, 'artifact.json'))) continue;
      const a = readArtifactManifest(join(root, k, b), ramDir);
      if (!a.shape?.layers?.some((p: string) => p.startsWith(storeDir))) continue;
      rmSync(a.memPath, { force: true });
      rmSync(join(root, k), { recursive: true, force: true });
      break;
    }
  }
}

describe('own images on real VMs and a real registry', () => {
  const home = testHome('images');
  const regDir = join(home, 'registries');
  let engine: Engine;
  let images: ImageService;
  let api: Served;
  let reg: TestRegistry;
  let authReg: TestRegistry;
  let proxy: CountingProxy;
  let key: string;
  const logLines: string[] = [];
  const bodies: string[] = [];

  const open = async () => {
    engine = await openEngine(home, { catalog: ['base'], poolSize: 1, progress: (m) => logLines.push(m) });
    // The layer store lives in this home: every run pulls for real, and artifacts made here are removed after.
    images = new ImageService({ host: engine, db: engine.db, importDir: join(home, 'imports'), storeDir: join(home, 'store'), maxUnpackedBytes: 64 * MiB, poolSize: 1, log: (m) => logLines.push(m) });
    await images.restore();
    api = await serveEngine(engine, {
      images,
      logger: { level: 'debug', stream: { write: (s: string) => void logLines.push(s) } } as any,
    });
  };
  const close = async () => {
    await api.close(100);
    await images.close();
  };

  const call = async (method: string, url: string, body?: unknown) => {
    const res = await api.app.inject({ method: method as any, url, headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) }, payload: body ? JSON.stringify(body) : undefined });
    bodies.push(res.body);
    return { status: res.statusCode, body: res.body, json: () => JSON.parse(res.body) };
  };
  const until = async <T>(what: string, get: () => Promise<T>, done: (v: T) => boolean, ms = 600_000): Promise<T> => {
    const deadline = Date.now() + ms;
    for (;;) {
      const v = await get();
      if (done(v)) return v;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(v).slice(0, 500)}`);
      await new Promise((r) => setTimeout(r, 250));
    }
  };
  const pull = async (source: any) => {
    const r = await call('POST', '/v1/images', { source });
    assert.equal(r.status, 202, r.body);
    return until(`image ${source.ref ?? source.path}`, async () => (await call('GET', `/v1/images/${r.json().id}`)).json(), (i) => i.state !== 'pulling');
  };
  const bake = async (body: any) => {
    const r = await call('POST', '/v1/environments', body);
    assert.equal(r.status, 202, r.body);
    return until(`environment ${body.name}`, async () => (await call('GET', `/v1/environments/${body.name}`)).json(), (e) => e.state === 'ready' || e.state === 'failed');
  };
  const sandbox = async (template: string) => {
    const r = await call('POST', '/v1/sandboxes', { template });
    assert.equal(r.status, 201, r.body);
    return r.json().id as string;
  };
  const sh = async (id: string, command: string) => {
    const r = await call('POST', `/v1/sandboxes/${id}/exec`, { command });
    assert.equal(r.status, 200, r.body);
    return r.json() as { stdout: string; stderr: string; exit_code: number };
  };
  const storeFiles = () => (existsSync(images.layers.dir) ? readdirSync(images.layers.dir).sort() : []);
  const tmpLeft = () => (existsSync(join(home, 'store', 'tmp')) ? readdirSync(join(home, 'store', 'tmp')).filter((f) => f.startsWith('pull-') || f.startsWith('archive-')) : []);

  // The test images: a busybox base (gzip) shared by everything, and small diff layers on top.
  const marker = `${Date.now()}-${process.pid}`; // keeps this run's layers new to a shared cache
  const baseLayer = layer([...busyboxEntries(),
    { name: 'etc/base-marker', data: `base ${marker}\n` },
    { name: 'etc/removed-me', data: 'you should not see me\n' },
    { name: 'data/', type: 'dir' }, { name: 'data/lower/', type: 'dir' },
    { name: 'data/lower/a', data: 'a\n' }, { name: 'data/lower/b', data: 'b\n' },
  ], 'gzip');
  const appLayer = layer([
    { name: 'etc/', type: 'dir' }, { name: 'etc/.wh.removed-me', data: '' },
    { name: 'data/lower/', type: 'dir' }, { name: 'data/lower/.wh..wh..opq', data: '' }, { name: 'data/lower/new', data: 'new\n' },
    { name: 'opt/app/', type: 'dir' }, { name: 'opt/app/hello', data: 'hello from the app layer\n', mode: 0o755, uid: 1000, gid: 1000 },
    { name: 'opt/app/hello-link', type: 'hardlink', linkname: 'opt/app/hello' },
    { name: 'opt/app/sym', type: 'symlink', linkname: '/etc/base-marker' },
  ], 'zstd');
  const appImage = image([baseLayer, appLayer], { Env: ['PATH=/usr/sbin:/usr/bin:/sbin:/bin', 'APP_MODE=test'], WorkingDir: '/opt/app', Cmd: ['/opt/app/hello'] }, { docker: false });

  before(async () => {
    mkdirSync(join(home, 'imports'), { recursive: true });
    reg = await startRegistry(join(regDir, 'open'));
    authReg = await startRegistry(join(regDir, 'auth'), { username: 'alice', password: 'wonderland' });
    proxy = await countingProxy(reg.host);
    await open();
    key = api.keys.create({ tenant: 'acme', tier: 'pro' }).key;
    await push(new RegistryClient(parseReference(`${reg.host}/test/app:v1`)), 'v1', appImage);
  });

  after(async () => {
    try {
      await close();
      await assertNoLeaks(engine, home);
    } finally {
      removeArtifactsOf(join(home, 'store'), engine.cfg.artifactRamDir);
      await proxy?.stop();
      await reg?.stop();
      await authReg?.stop();
      rmSync(home, { recursive: true, force: true });
    }
  });

  test('demo keys cannot bring images', async () => {
    const demo = api.keys.create({ tenant: 'demo-co', tier: 'demo' }).key;
    const r = await api.app.inject({ method: 'POST', url: '/v1/images', headers: { authorization: `Bearer ${demo}`, 'content-type': 'application/json' }, payload: JSON.stringify({ source: { kind: 'registry', ref: `${reg.host}/test/app:v1` } }) });
    assert.equal(r.statusCode, 403);
    assert.equal(r.json().error.code, 'tier_forbidden');
  });

  let appId: string;
  test('pull by tag through the proxy; pulling again moves no layer bytes', async () => {
    proxy.reset();
    const img = await pull({ kind: 'registry', ref: `${proxy.host}/test/app:v1` });
    assert.equal(img.state, 'ready', img.error);
    assert.equal(img.id, appImage.manifestDigest);
    assert.deepEqual(img.layers.map((l: any) => l.diff_id), [baseLayer.diffId, appLayer.diffId]);
    const firstBytes = proxy.bytesDown;
    const layerBytes = baseLayer.blob.length + appLayer.blob.length;
    assert.equal(img.transferred_bytes, layerBytes);
    assert.ok(firstBytes >= layerBytes, `proxy saw ${firstBytes}`);
    appId = img.id;

    proxy.reset();
    const again = await pull({ kind: 'registry', ref: `${proxy.host}/test/app@${appImage.manifestDigest}` });
    assert.equal(again.state, 'ready');
    assert.equal(again.transferred_bytes, 0);
    assert.ok(proxy.bytesDown < 16 * 1024, `a re-pull moved ${proxy.bytesDown} bytes (manifest, config and HEADs only)`);
    console.log(`[images] first pull: ${firstBytes} bytes through the proxy (layers ${layerBytes}); second pull: ${proxy.bytesDown} bytes`);
  });

  test('bake with a ready command and a secret: whiteouts, opaque dirs, links, Env, WorkingDir; the secret stays write-only', async () => {
    const env = await bake({ name: 'app', image: appId, ready_command: 'mkdir -p /opt/venv && echo ok > /opt/venv/marker && echo bake-ran', secrets: { API_TOKEN: SECRET } });
    assert.equal(env.state, 'ready', `${env.error}\n${env.log_tail}`);
    assert.deepEqual(env.secret_names, ['API_TOKEN']);
    const log = await call('GET', '/v1/environments/app/log');
    assert.match(log.body, /bake-ran/);
    const t = (await call('GET', '/v1/templates')).json().templates.find((x: any) => x.id === 'app');
    assert.equal(t.kind, 'environment');
    assert.equal(t.ready, true);

    for (const round of [1, 2]) {
      const id = await sandbox('app');
      const r = await sh(id, [
        'echo "token=$API_TOKEN mode=$APP_MODE pwd=$(pwd)"',
        'cat /opt/venv/marker',
        'test -e /etc/removed-me && echo removed-visible || echo removed-hidden',
        'ls /data/lower | tr "\\n" " "; echo',
        'cat /etc/base-marker',
        '[ "$(stat -c %i /opt/app/hello)" = "$(stat -c %i /opt/app/hello-link)" ] && echo hardlinked',
        'cat /opt/app/sym',
        'stat -c "%u:%g %a" /opt/app/hello',
      ].join('; '));
      assert.equal(r.exit_code, 0, r.stderr);
      const lines = r.stdout.trim().split('\n');
      assert.equal(lines[0], `token=${SECRET} mode=test pwd=/opt/app`, `round ${round}`);
      assert.equal(lines[1], 'ok', 'the ready command ran once at bake; its result is in every sandbox');
      assert.equal(lines[2], 'removed-hidden', 'a whiteout hides the lower layer\'s file');
      assert.equal(lines[3], 'new ', 'an opaque directory hides the lower contents');
      assert.match(lines[4], /^base /);
      assert.equal(lines[5], 'hardlinked');
      assert.match(lines[6], /^base /);
      assert.equal(lines[7], '1000:1000 755');
      assert.equal((await call('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    }
    // The secret: in the exec's environment (above), and nowhere else.
    for (const b of bodies) if (!b.includes('"stdout"')) assert.ok(!b.includes(SECRET), `secret in a response: ${b.slice(0, 200)}`);
    for (const l of logLines) assert.ok(!l.includes(SECRET), `secret in a log line: ${l.slice(0, 200)}`);
    engine.db.pragma('wal_checkpoint(TRUNCATE)');
    for (const f of readdirSync(home).filter((x) => x.startsWith('collimate.db'))) {
      assert.ok(!readFileSync(join(home, f)).includes(SECRET), `plaintext secret in ${f}`);
    }
    assert.equal(statSync(join(home, 'secrets.key')).mode & 0o777, 0o600);
  });

  test('ten variants on one base: the store holds the base once plus ten small diffs; variant 10 moves and bakes only its diff', async () => {
    const held = new Set(storeFiles());
    const client = new RegistryClient(parseReference(`${reg.host}/test/variant:1`));
    const variants: TestImage[] = [];
    for (let n = 1; n <= 10; n++) {
      const diff = layer([{ name: 'variants/', type: 'dir' }, { name: `variants/v${n}`, data: `variant ${n} ${marker}\n${'x'.repeat(2000 * n)}` }], n % 2 ? 'gzip' : 'zstd');
      const v = image([baseLayer, diff], { Env: [`VARIANT=${n}`] });
      await push(client, `v${n}`, v);
      variants.push(v);
    }
    const perPull: number[] = [];
    for (const [i, v] of variants.entries()) {
      proxy.reset();
      const img = await pull({ kind: 'registry', ref: `${proxy.host}/test/variant:v${i + 1}` });
      assert.equal(img.state, 'ready', img.error);
      assert.equal(img.transferred_bytes, v.layers[1].blob.length, `variant ${i + 1} moved only its diff`);
      perPull.push(proxy.bytesDown);
      assert.ok(proxy.bytesDown < v.layers[1].blob.length + 16 * 1024, `variant ${i + 1}: ${proxy.bytesDown} bytes through the proxy`);
    }
    const size = (diffId: string) => statSync(join(images.layers.dir, `${diffId.slice(7)}.erofs`)).size;
    const baseBytes = size(baseLayer.diffId);
    const diffBytes = variants.map((v) => size(v.layers[1].diffId));
    const added = storeFiles().filter((f) => !held.has(f) && f.endsWith('.erofs'));
    assert.equal(added.length, 10, 'ten new layers, the base not stored again');
    const tenImages = baseBytes + diffBytes.reduce((a, b) => a + b, 0);
    const flat = variants.length * baseBytes;
    console.log(`[images] store for 10 variants: base ${mib(baseBytes)} + 10 diffs ${mib(tenImages - baseBytes)} = ${mib(tenImages)} (10 flat copies would be ${mib(flat)}); blob bytes per variant pull: ${perPull.join(', ')}`);
    assert.ok(tenImages < baseBytes * 1.5, 'ten variants cost about one base');

    const env = await bake({ name: 'variant10', image: variants[9].manifestDigest });
    assert.equal(env.state, 'ready', `${env.error}\n${env.log_tail}`);
    const id = await sandbox('variant10');
    const r = await sh(id, 'head -1 /variants/v10; echo $VARIANT; ls /variants');
    assert.equal(r.stdout, `variant 10 ${marker}\n10\nv10\n`);
    await call('DELETE', `/v1/sandboxes/${id}`);
  });

  test('a manifest list: linux/amd64 is picked; a docker v2 manifest and a docker save archive work too', async () => {
    const client = new RegistryClient(parseReference(`${reg.host}/test/multi:1`));
    const docker = image([baseLayer, layer([{ name: 'docker-v2', data: 'yes' }])], {}, { docker: true });
    await push(client, 'amd64', docker);
    const other = image([layer([{ name: 'arm', data: 'arm' }])], {}, { configOverride: (c) => ({ ...c, architecture: 'arm64' }) });
    await push(client, 'arm64', other);
    const list = Buffer.from(JSON.stringify({
      schemaVersion: 2, mediaType: 'application/vnd.docker.distribution.manifest.list.v2+json',
      manifests: [
        { mediaType: other.manifestType, digest: other.manifestDigest, size: other.manifest.length, platform: { os: 'linux', architecture: 'arm64' } },
        { mediaType: docker.manifestType, digest: docker.manifestDigest, size: docker.manifest.length, platform: { os: 'linux', architecture: 'amd64' } },
      ],
    }));
    await client.pushManifest('1', list, 'application/vnd.docker.distribution.manifest.list.v2+json');
    const img = await pull({ kind: 'registry', ref: `${reg.host}/test/multi:1` });
    assert.equal(img.state, 'ready', img.error);
    assert.equal(img.id, docker.manifestDigest);

    dockerSaveArchive(join(home, 'imports', 'saved.tar'), [busyboxEntries(), [{ name: 'saved', data: 'from docker save' }]], { Env: ['SAVED=1'] });
    const saved = await pull({ kind: 'archive', path: join(home, 'imports', 'saved.tar') });
    assert.equal(saved.state, 'ready', saved.error);
    assert.equal(saved.source, 'archive');
  });

  test('basic auth: no credentials and wrong ones are refused clearly; the right ones pull', async () => {
    const ref = `${authReg.host}/private/app:v1`;
    await push(new RegistryClient(parseReference(ref), { username: 'alice', password: 'wonderland' }), 'v1', image([baseLayer, layer([{ name: 'private', data: 'p' }])]));
    const anon = await call('POST', '/v1/images', { source: { kind: 'registry', ref } });
    assert.equal(anon.status, 502);
    assert.equal(anon.json().error.code, 'image_pull_failed');
    assert.match(anon.json().error.message, /needs credentials/);
    const wrong = await call('POST', '/v1/images', { source: { kind: 'registry', ref, username: 'alice', password: 'nope' } });
    assert.equal(wrong.status, 502);
    assert.match(wrong.json().error.message, /check the username and password/);
    const ok = await pull({ kind: 'registry', ref, username: 'alice', password: 'wonderland' });
    assert.equal(ok.state, 'ready', ok.error);
    for (const b of bodies) assert.ok(!b.includes('wonderland'), 'the password is never echoed');
  });

  test('broken images fail with a clear error and leave nothing behind', async () => {
    const client = new RegistryClient(parseReference(`${reg.host}/test/broken:1`));
    const artifactsBefore = readdirSync(join(TEST_CACHE, 'artifacts')).length;
    const passwdBefore = createHash('sha256').update(readFileSync('/etc/passwd')).digest('hex');
    const cases: { name: string; source: () => Promise<any>; expect: RegExp }[] = [
      {
        name: 'missing blob',
        source: async () => {
          const img = image([baseLayer, layer([{ name: 'gone', data: `gone ${marker}` }])]);
          await push(client, 'missing', img);
          const del = await client.request('DELETE', `/v2/test/broken/blobs/${img.layers[1].digest}`);
          assert.equal(del.status, 202);
          return { kind: 'registry', ref: `${reg.host}/test/broken:missing` };
        },
        expect: /blob sha256:[a-f0-9]+ not found/,
      },
      {
        name: 'digest mismatch',
        source: async () => {
          const l = layer([{ name: 'c', data: `corrupt me ${marker} ${'y'.repeat(5000)}` }], 'none');
          const img = image([baseLayer, l]);
          await push(client, 'corrupt', img);
          const p = reg.blobDataPath(l.digest);
          const bytes = readFileSync(p);
          bytes[600] ^= 0xff; // inside the file data: still a valid tar, wrong digest
          writeFileSync(p, bytes);
          return { kind: 'registry', ref: `${reg.host}/test/broken:corrupt` };
        },
        expect: /does not match its digest/,
      },
      {
        name: 'wrong media type',
        source: async () => {
          const img = image([baseLayer], {}, { manifestOverride: (m) => ({ ...m, layers: [{ ...m.layers[0], mediaType: 'application/vnd.example.not-a-layer' }] }) });
          return { kind: 'oci-layout', path: writeLayout(join(home, 'imports', 'badtype'), img) };
        },
        expect: /not a tar layer/,
      },
      {
        name: 'tar bomb',
        source: async () => {
          const img = image([baseLayer, layer([{ name: 'bomb', data: Buffer.alloc(100 * MiB) }])]);
          await push(client, 'bomb', img);
          return { kind: 'registry', ref: `${reg.host}/test/broken:bomb` };
        },
        expect: /limit of 67108864 bytes/,
      },
      {
        name: '../../etc/passwd',
        source: async () => {
          const img = image([baseLayer, layer([{ name: '../../etc/passwd', data: 'root::0:0:pwned:/:/bin/sh\n' }])]);
          await push(client, 'escape', img);
          return { kind: 'registry', ref: `${reg.host}/test/broken:escape` };
        },
        expect: /escapes the root/,
      },
    ];
    for (const c of cases) {
      const before = storeFiles();
      const source = await c.source();
      const r = await call('POST', '/v1/images', { source });
      let error: string;
      if (r.status === 202) {
        const img = await until(c.name, async () => (await call('GET', `/v1/images/${r.json().id}`)).json(), (i) => i.state !== 'pulling');
        assert.equal(img.state, 'failed', c.name);
        error = img.error;
        const env = await call('POST', '/v1/environments', { name: `broken-${c.name.replace(/\W+/g, '-').replace(/^-+/, '')}`, image: img.id });
        assert.equal(env.status, 400, `no environment from a failed image: ${env.body}`);
      } else {
        assert.equal(r.status, 400, r.body);
        error = r.json().error.message;
      }
      assert.match(error, c.expect, c.name);
      console.log(`[images] ${c.name}: ${error}`);
      assert.deepEqual(storeFiles(), before, `${c.name}: no layer file left`);
      assert.deepEqual(tmpLeft(), [], `${c.name}: no staging files left`);
    }
    assert.equal(readdirSync(join(TEST_CACHE, 'artifacts')).length, artifactsBefore, 'no artifact made');
    assert.equal(createHash('sha256').update(readFileSync('/etc/passwd')).digest('hex'), passwdBefore);
  });

  test('environments survive a server restart', async () => {
    await close();
    await engine.close();
    await open();
    const env = (await call('GET', '/v1/environments/app')).json();
    assert.equal(env.state, 'ready', env.error);
    const id = await sandbox('app');
    const r = await sh(id, 'cat /opt/venv/marker; echo $API_TOKEN');
    assert.equal(r.stdout, `ok\n${SECRET}\n`);
    await call('DELETE', `/v1/sandboxes/${id}`);
    // A deleted environment's RAM file is this server's no longer: past the grace it is collected,
    // though this process made and claimed it (a long-running server must not keep every one).
    const { memPath: ram, dir } = engine.templatePools.get('acme/variant10')!.artifact;
    assert.equal((await call('DELETE', '/v1/environments/variant10')).status, 204);
    // As if the grace (an hour since its last use) had passed.
    const anHourAgo = new Date(Date.now() - 3700_000);
    utimesSync(join(dirname(dir), 'claimed-at'), anHourAgo, anHourAgo);
    assert.ok(engine.collectArtifacts().includes(ram) && !existsSync(ram), 'the deleted environment\'s RAM file is collected');
    assert.ok(existsSync(engine.templatePools.get('acme/app')!.artifact.memPath), 'an environment still there keeps its RAM file');
  });

  test('layers nobody uses are collected; a suspended sandbox keeps its layers after its environment and image are gone', async () => {
    const layerFile = (diffId: string) => join(images.layers.dir, `${diffId.slice(7)}.erofs`);
    const own = (await call('GET', '/v1/images')).json().own as any[];
    const variant10 = own.find((i) => i.ref.endsWith('/test/variant:v10'));
    const v10Diff = variant10.layers[1];
    // A sandbox of `app`, suspended: no VMM holds its layers open now.
    const id = await sandbox('app');
    assert.equal((await sh(id, 'echo kept > /root/state')).exit_code, 0);
    assert.equal((await call('POST', `/v1/sandboxes/${id}/suspend`)).status, 200);
    assert.equal((await call('DELETE', '/v1/environments/app')).status, 204);
    assert.equal((await call('DELETE', `/v1/images/${appId}`)).status, 204);
    assert.equal((await call('DELETE', `/v1/images/${variant10.id}`)).status, 204, 'its environment went in the test before');

    const removed = images.collectLayers(0).map((l) => l.diffId);
    assert.deepEqual(removed, [v10Diff.diff_id], 'only the layer of variant 10 that nothing else uses');
    assert.ok(!existsSync(layerFile(v10Diff.diff_id)));
    assert.equal(images.layers.diffOfBlob(v10Diff.digest), undefined);
    assert.ok(logLines.some((l) => l.includes(`removed unused image layer ${v10Diff.diff_id}`)));
    for (const d of [baseLayer.diffId, appLayer.diffId]) assert.ok(existsSync(layerFile(d)), `${d} stays`);

    // The suspended sandbox resumes on its layers, the app layer among them.
    assert.equal((await call('POST', `/v1/sandboxes/${id}/resume`)).status, 200);
    const r = await sh(id, 'cat /root/state /opt/app/hello');
    assert.equal(r.stdout, 'kept\nhello from the app layer\n', r.stderr);
    // Running, its row and its VMM hold them; deleted, the app layer goes (the base is still the variants').
    assert.deepEqual(images.collectLayers(0), []);
    assert.equal((await call('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    assert.deepEqual(images.collectLayers(0).map((l) => l.diffId), [appLayer.diffId]);
    assert.ok(existsSync(layerFile(baseLayer.diffId)));
  });
});
