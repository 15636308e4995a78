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
    const c = new RegistryClient(parseReference(`${base.slice(7)}/team/app:v1`), { username: 'alice', password: 'pw', privateRegistries: [base.slice(7)] });
    const m = await c.getManifest('v1');
    assert.equal(m.digest, sha(manifest));
    await c.getManifest('v1');
    assert.equal(tokenRequests.length, 1);
    assert.equal(tokenRequests[0].searchParams.get('service'), 'fake.registry');
    assert.equal(tokenRequests[0].searchParams.get('scope'), 'repository:team/app:pull');
  });

  test('without credentials the token service refuses, and the error says so', async () => {
    const c = new RegistryClient(parseReference(`${base.slice(7)}/team/app:v1`), { privateRegistries: [base.slice(7)] });
    await assert.rejects(c.getManifest('v1'), (e: any) => e.code === 'image_pull_failed' && /refused the credentials \(none were given/.test(e.message));
  });

  test('an unknown manifest is image_not_found', async () => {
    const c = new RegistryClient(parseReference(`${base.slice(7)}/team/app:v1`), { username: 'alice', password: 'pw', privateRegistries: [base.slice(7)] });
    await assert.rejects(c.getManifest('nope'), (e: any) => e.code === 'image_not_found');
  });
});

describe('a pull reaches no more than a sandbox may', () => {
  // An "internal service" on loopback that no pull may reach, and a registry that points pulls at it.
  let internal: Server;
  let internalHost = '';
  const internalHits: string[] = [];
  let registry: Server;
  let regHost = '';
  before(async () => {
    internal = createServer((req, res) => {
      internalHits.push(req.url!);
      res.writeHead(200, { 'content-type': 'text/html' }).end('<html>admin panel, secret=hunter2</html>');
    });
    await new Promise<void>((r) => internal.listen(0, '127.0.0.1', r));
    internalHost = `127.0.0.1:${(internal.address() as AddressInfo).port}`;
    registry = createServer((req, res) => {
      if (req.url === '/v2/team/redirect/manifests/v1') res.writeHead(302, { location: `http://${internalHost}/v2/team/app/manifests/v1` }).end();
      else if (req.url === '/v2/team/named/manifests/v1') res.writeHead(307, { location: `http://localhost:${internalHost.split(':')[1]}/x` }).end();
      else if (req.url === '/v2/team/realm/manifests/v1') res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${internalHost}/token",service="x"` }).end();
      else if (req.url === '/v2/team/html/manifests/v1') res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' }).end('<html>secret=hunter2</html>');
      else if (req.url === '/v2/team/err/manifests/v1') res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ errors: [{ code: 'secret=hunter2', message: 'secret=hunter2' }] }));
      else res.writeHead(404).end();
    });
    await new Promise<void>((r) => registry.listen(0, '127.0.0.1', r));
    regHost = `127.0.0.1:${(registry.address() as AddressInfo).port}`;
  });
  after(async () => {
    await new Promise<void>((r) => internal.close(() => r()));
    await new Promise<void>((r) => registry.close(() => r()));
  });
  const refused = (what: RegExp) => (e: any) => e.code === 'image_pull_failed' && what.test(e.message) && !/hunter2/.test(e.message);

  test('a registry the operator did not list is not reached at a loopback address or by a name that resolves to one, nor over plain HTTP', async () => {
    // An unlisted registry is asked over HTTPS, and its address is refused before any connection.
    await assert.rejects(new RegistryClient(parseReference(`${internalHost}/team/app:v1`), { privateRegistries: [] }).getManifest('v1'), refused(/leads to 127\.0\.0\.1:\d+, the blocked range 127\.0\.0\.0\/8/));
    await assert.rejects(new RegistryClient(parseReference(`${internalHost}/team/app:v1`), { privateRegistries: [] }).request('GET', `http://${internalHost}/v2/`), refused(/plain HTTP/));
    const viaHttps = new RegistryClient(parseReference(`${internalHost}/team/app:v1`), { privateRegistries: [] });
    await assert.rejects(viaHttps.request('GET', `https://${internalHost}/v2/`), refused(/blocked range 127\.0\.0\.0\/8/));
    await assert.rejects(viaHttps.request('GET', `https://localhost:${internalHost.split(':')[1]}/v2/`), refused(/localhost resolves to 127\.0\.0\.1, the blocked range 127\.0\.0\.0\/8/));
    assert.deepEqual(internalHits, []);
  });

  test('a listed registry cannot redirect a pull or send its token request to an unlisted address', async () => {
    const listed = { privateRegistries: [regHost] };
    await assert.rejects(new RegistryClient(parseReference(`${regHost}/team/redirect:v1`), listed).getManifest('v1'), refused(/leads to plain HTTP/));
    await assert.rejects(new RegistryClient(parseReference(`${regHost}/team/named:v1`), listed).getManifest('v1'), refused(/leads to plain HTTP at localhost/));
    await assert.rejects(new RegistryClient(parseReference(`${regHost}/team/realm:v1`), listed).getManifest('v1'), refused(/token service .* leads to plain HTTP/));
    assert.deepEqual(internalHits, [], 'the internal service saw no request');
    // Listed too, the same redirect is followed (the operator opened it).
    const both = new RegistryClient(parseReference(`${regHost}/team/redirect:v1`), { privateRegistries: [regHost, internalHost] });
    assert.match((await both.getManifest('v1')).bytes.toString(), /admin panel/);
    assert.equal(internalHits.length, 1);
  });

  test("no byte of a registry's answer appears in an error", async () => {
    const listed = { privateRegistries: [regHost] };
    const { parseManifestOrIndex } = await import('../../../src/images/oci.ts');
    const html = await new RegistryClient(parseReference(`${regHost}/team/html:v1`), listed).getManifest('v1');
    assert.throws(() => parseManifestOrIndex(html.bytes, html.mediaType, 'manifest v1'), (e: any) => /not valid JSON/.test(e.message) && !/hunter2|<html/.test(e.message));
    await assert.rejects(new RegistryClient(parseReference(`${regHost}/team/err:v1`), listed).getManifest('v1'), refused(/answered 500/));
  });
});
