import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { RegistryClient, parseChallenge, parseReference } from '../../../src/images/registry.ts';
import { sha } from '../../support/oci.ts';

test('parseReference: Docker defaults, ports, tags and digests', () => {
  assert.deepEqual(parseReference('busybox'), { registry: 'docker.io', repository: 'library/busybox', tag: 'latest', digest: undefined });
  assert.deepEqual(parseReference('localhost:5000/a/b:v1'), { registry: 'localhost:5000', repository: 'a/b', tag: 'v1', digest: undefined });
  const d = `sha256:${'a'.repeat(64)}`;
  assert.deepEqual(parseReference(`ghcr.io/o/r@${d}`), { registry: 'ghcr.io', repository: 'o/r', tag: undefined, digest: d });
  assert.throws(() => parseReference('Bad/Name'), /invalid repository/);
  assert.throws(() => parseReference('x@sha512:abc'), /sha256/);
});

test('parseChallenge', () => {
  assert.deepEqual(parseChallenge('Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull"'), {
    scheme: 'bearer', params: { realm: 'https://auth.example/token', service: 'registry.example', scope: 'repository:a/b:pull' },
  });
  assert.deepEqual(parseChallenge('Basic realm="r"'), { scheme: 'basic', params: { realm: 'r' } });
});

describe('bearer token auth against a fake registry', () => {
  let server: Server;
  let base: string;
  const tokenRequests: URL[] = [];
  const manifest = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json' }));
  before(async () => {
    server = createServer((req, res) => {
      const url = new URL(req.url!, base);
      if (url.pathname === '/token') {
        tokenRequests.push(url);
        if (req.headers.authorization !== `Basic ${Buffer.from('alice:pw').toString('base64')}`) { res.writeHead(401).end(); return; }
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ access_token: 'tok-1' }));
        return;
      }
      if (req.headers.authorization !== 'Bearer tok-1') {
        res.writeHead(401, { 'www-authenticate': `Bearer realm="${base}/token",service="fake.registry",scope="repository:team/app:pull"` }).end();
        return;
      }
      if (url.pathname === '/v2/team/app/manifests/v1') {
        res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json', 'docker-content-digest': sha(manifest) }).end(manifest);
        return;
      }
      res.writeHead(404).end();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => new Promise<void>((r) => server.close(() => r())));

  test('a 401 challenge sends the client to the token endpoint with service, scope and basic credentials; the token is reused', async () => {
    const c = new RegistryClient(parseReference(`${base.slice(7)}/team/app:v1`), { username: 'alice', password: 'pw' });
    const m = await c.getManifest('v1');
    assert.equal(m.digest, sha(manifest));
    await c.getManifest('v1');
    assert.equal(tokenRequests.length, 1);
    assert.equal(tokenRequests[0].searchParams.get('service'), 'fake.registry');
    assert.equal(tokenRequests[0].searchParams.get('scope'), 'repository:team/app:pull');
  });

  test('without credentials the token service refuses, and the error says so', async () => {
    const c = new RegistryClient(parseReference(`${base.slice(7)}/team/app:v1`));
    await assert.rejects(c.getManifest('v1'), (e: any) => e.code === 'image_pull_failed' && /refused the credentials \(none were given/.test(e.message));
  });

  test('an unknown manifest is image_not_found', async () => {
    const c = new RegistryClient(parseReference(`${base.slice(7)}/team/app:v1`), { username: 'alice', password: 'pw' });
    await assert.rejects(c.getManifest('nope'), (e: any) => e.code === 'image_not_found');
  });
});
