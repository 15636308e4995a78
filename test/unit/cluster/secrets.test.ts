/**
 * Environment secrets in cluster mode, on a real PostgreSQL 15 (test/support/postgres.ts): the
 * cluster's secrets key is made once by its schema migration, every host of a cluster reads the
 * same one, and what one host's SecretBox (or image service) seals, another host's opens. A single
 * host still seals with its own secrets.key file, and a host keeps opening what it sealed with that
 * file before it joined.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { migrateCluster, openClusterDb } from '../../../src/cluster/db.js';
import { fetchClusterSecretsKey, readClusterSecretsKey } from '../../../src/cluster/secretsKey.js';
import { SecretBox } from '../../../src/images/secrets.js';
import { ImageService, type TemplateHost } from '../../../src/images/service.js';
import type { TemplateRecipe } from '../../../src/images/templates.js';
import { openDb } from '../../../src/store/db.js';
import { busyboxEntries, image, layer, writeLayout } from '../../support/oci.js';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../../support/postgres.js';

const skip = postgresUnavailable() ?? false;
const AAD = 'collimate-env-secrets\0acme\0web';
const SECRET = Buffer.from('{"API_TOKEN":"very-secret-value-123"}');

let server: ThrowawayPostgres;
let dir: string;
const pools: pg.Pool[] = [];

/** A migrated cluster database and `n` pools on it, one per host, migrating at once as hosts starting together do. */
async function cluster(name: string, n: number): Promise<{ url: string; hosts: pg.Pool[] }> {
  const url = server.createDatabase(name);
  const hosts = Array.from({ length: n }, () => openClusterDb({ url }));
  pools.push(...hosts);
  await Promise.all(hosts.map((p) => migrateCluster(p)));
  return { url, hosts };
}

function home(name: string): string {
  const h = join(dir, name);
  mkdirSync(h, { recursive: true });
  return h;
}

/** Records the recipes an image service would bake (no engine). */
class RecordingHost implements TemplateHost {
  recipes: TemplateRecipe[] = [];
  constructor(readonly cfg: { home: string; cacheDir: string }) {}
  async addTemplate(recipe: TemplateRecipe) {
    this.recipes.push(recipe);
    return { id: recipe.id, kind: 'environment' as const, description: '', interpreter: recipe.interpreter, ready: true, vcpus: recipe.vcpus, memory_mib: recipe.memoryMib, egress: recipe.egress ?? 'allow', network: false };
  }
  async removeTemplate() {}
  artifactLayers() { return []; }
}

describe('cluster secrets key on PostgreSQL', { skip }, () => {
  before(async () => {
    server = await startPostgres();
    dir = mkdtempSync(join(tmpdir(), 'cluster-secrets-'));
  });
  after(async () => {
    await Promise.all(pools.map((p) => p.end()));
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('every host of a cluster reads one key; another cluster has another', async () => {
    const { url, hosts } = await cluster('keys', 3);
    const keys = await Promise.all(hosts.map((p) => readClusterSecretsKey(p)));
    assert.equal(keys[0].length, 32);
    for (const k of keys) assert.deepEqual(k, keys[0]);
    assert.deepEqual(await fetchClusterSecretsKey(url), keys[0], 'and a host starting reads it too');
    assert.deepEqual(await readClusterSecretsKey(hosts[0]), keys[0], 'the key does not change');
    const other = await cluster('other_keys', 1);
    assert.notDeepEqual(await readClusterSecretsKey(other.hosts[0]), keys[0]);
  });

  test('what one host seals another opens; a single host keeps its file; a host opens what it sealed before it joined', async () => {
    const { hosts } = await cluster('boxes', 2);
    const [keyA, keyB] = await Promise.all(hosts.map((p) => readClusterSecretsKey(p)));
    const homeA = home('box-a');
    const homeB = home('box-b');
    // Host A was a single host before it joined: its secrets.key sealed what it had.
    const single = new SecretBox(join(homeA, 'secrets.key'));
    const before = single.seal(SECRET, AAD);
    assert.match(before, /^v1\./);
    assert.equal(statSync(join(homeA, 'secrets.key')).mode & 0o777, 0o600, 'a single host seals with its own file, as always');

    const a = new SecretBox(join(homeA, 'secrets.key'), keyA);
    const b = new SecretBox(join(homeB, 'secrets.key'), keyB);
    const sealed = a.seal(SECRET, AAD);
    assert.match(sealed, /^c1\./, 'a cluster host seals with the cluster key');
    assert.deepEqual(b.open(sealed, AAD), SECRET, 'another host of the cluster opens it');
    assert.deepEqual(a.open(b.seal(SECRET, AAD), AAD), SECRET, 'and the other way round');
    assert.ok(!existsSync(join(homeB, 'secrets.key')), 'host B never needed a file of its own');
    assert.throws(() => b.open(sealed, 'collimate-env-secrets\0acme\0other'), 'bound to its tenant and environment, as before');

    assert.deepEqual(a.open(before, AAD), SECRET, 'host A still opens what it sealed with its file before it joined');
    assert.throws(() => b.open(before, AAD), 'another host cannot: that file is A\'s alone');
    assert.throws(() => single.open(sealed, AAD), /not a host of a cluster/, 'a single host cannot open a cluster-sealed value');
    const stranger = new SecretBox(join(home('box-c'), 'secrets.key'), await readClusterSecretsKey((await cluster('stranger', 1)).hosts[0]));
    assert.throws(() => stranger.open(sealed, AAD), 'a host of another cluster cannot');
    assert.throws(() => new SecretBox(join(homeA, 'secrets.key'), Buffer.alloc(16)), /32 bytes/);
  });

  test('the image service of a cluster host seals environment secrets with the cluster key, and another host opens them', async () => {
    const { hosts } = await cluster('service', 2);
    const [keyA, keyB] = await Promise.all(hosts.map((p) => readClusterSecretsKey(p)));
    const homeA = home('svc-a');
    const imports = join(homeA, 'imports');
    mkdirSync(imports, { recursive: true });
    const db = openDb(join(homeA, 'collimate.db'));
    const host = new RecordingHost({ home: homeA, cacheDir: join(homeA, 'cache') });
    const svc = new ImageService({ host, db, importDir: imports, clusterSecretsKey: keyA });
    try {
      const img = await svc.pull('acme', { kind: 'oci-layout', path: writeLayout(join(imports, 'layout'), image([layer(busyboxEntries(), 'gzip')])) });
      await svc.idle();
      svc.createEnvironment('acme', { name: 'web', image: img.id, secrets: { API_TOKEN: 'very-secret-value-123' } });
      await svc.idle();
      assert.equal(svc.environment('acme', 'web').state, 'ready', svc.environment('acme', 'web').error ?? '');
      assert.equal(host.recipes[0].execDefaults!.env!.API_TOKEN, 'very-secret-value-123', 'its own bake opened them');
      const sealed = svc.repo.getEnv('acme', 'web')!.secrets!;
      assert.match(sealed, /^c1\./);
      assert.ok(!existsSync(join(homeA, 'secrets.key')), 'no per-host key file on a cluster host');
      const b = new SecretBox(join(home('svc-b'), 'secrets.key'), keyB);
      assert.deepEqual(JSON.parse(b.open(sealed, AAD).toString()), { API_TOKEN: 'very-secret-value-123' }, 'host B opens them');
    } finally {
      await svc.close();
      db.close();
    }
  });
});
