import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openDb, type Db } from '../../../src/store/db.ts';
import { ImageService, type TemplateHost } from '../../../src/images/service.ts';
import type { TemplateRecipe } from '../../../src/images/templates.ts';
import { busyboxEntries, image, layer, writeLayout } from '../../support/oci.ts';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { assertErrorBody, fixture, type Fixture } from './helpers.ts';

class FakeHost implements TemplateHost {
  recipes: TemplateRecipe[] = [];
  constructor(readonly cfg: { home: string; cacheDir: string }) {}
  async addTemplate(recipe: TemplateRecipe) {
    this.recipes.push(recipe);
    return { id: recipe.id, kind: 'environment' as const, description: '', interpreter: recipe.interpreter, ready: true, vcpus: recipe.vcpus, memory_mib: recipe.memoryMib, egress: 'allow' as const, network: true };
  }
  async removeTemplate() {}
  artifactLayers() { return []; }
}

describe('REST /v1/images and /v1/environments', () => {
  let dir: string; let db: Db; let f: Fixture; let images: ImageService; let layout: string; let host: FakeHost;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'collimate-api-images-'));
    mkdirSync(join(dir, 'imports'));
    db = openDb(join(dir, 'collimate.db'));
    host = new FakeHost({ home: dir, cacheDir: join(dir, 'cache') });
    images = new ImageService({ host, db, importDir: join(dir, 'imports') });
    f = await fixture({ dbPath: join(dir, 'collimate.db'), server: { images } });
    layout = writeLayout(join(dir, 'imports', 'img'), image([layer(busyboxEntries())], { Env: ['X=1'], Cmd: ['/bin/sh'] }));
  });
  after(async () => { await images.close(); await f.close(); db.close(); rmSync(dir, { recursive: true, force: true }); });

  test('demo keys get 403 tier_forbidden for own images and environments; the catalog still lists', async () => {
    const key = f.key('demo-t', 'demo');
    assertErrorBody(await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'oci-layout', path: layout } } }), 'tier_forbidden');
    assertErrorBody(await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'e', image: 'x' } }), 'tier_forbidden');
    const list = await f.req('listImages', { url: '/v1/images', key });
    assert.equal(list.statusCode, 200);
    assert.ok(list.json().images.some((t: any) => t.id === 'base'));
    assert.deepEqual(list.json().own, []);
  });

  test('pro: register, poll, create an environment with secrets that never come back, template listed, delete', async () => {
    const key = f.key('pro-t', 'pro');
    const r = await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'oci-layout', path: layout } } });
    assert.equal(r.statusCode, 202, r.body);
    const id = r.json().id;
    assert.match(id, /^sha256:[a-f0-9]{64}$/);
    await images.idle();
    const got = await f.req('getImage', { url: `/v1/images/${id}`, key });
    assert.equal(got.json().state, 'ready');
    assert.deepEqual(got.json().config.cmd, ['/bin/sh']);
    assert.equal(got.json().layers[0].stored_bytes > 0, true);
    assertErrorBody(await f.req('getImage', { url: `/v1/images/${id}`, key: f.key('other', 'pro') }), 'image_not_found');
    assert.equal((await f.req('listImages', { url: '/v1/images', key })).json().own.length, 1);

    assertErrorBody(await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'big', image: id, vcpus: 64 } }), 'tier_forbidden');
    assertErrorBody(await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'e', image: id, egress: 'deny' } }), 'validation_error');
    assertErrorBody(await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'e', image: id, secrets: { 'bad-name': 'x' } } }), 'validation_error');
    const secret = 'hunter2-secret-value';
    const c = await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'app', image: id, ready_command: 'true', secrets: { TOKEN: secret } } });
    assert.equal(c.statusCode, 202, c.body);
    assert.deepEqual(c.json().secret_names, ['TOKEN']);
    assertErrorBody(await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'app', image: id } }), 'conflict');
    // Followed while it bakes: the stream ends by itself once the environment is ready.
    const followed = f.api.app.inject({ url: '/v1/environments/app/log', headers: { authorization: `Bearer ${key}`, accept: 'text/event-stream' } });
    await images.idle();
    const stream = await followed;
    assert.match(String(stream.headers['content-type']), /^text\/event-stream/);
    const events = stream.body.split('\n\n').filter(Boolean).map((block) => ({ event: /^event: (.*)$/m.exec(block)![1], data: JSON.parse(/^data: (.*)$/m.exec(block)![1]) }));
    assert.deepEqual(events.at(-1), { event: 'end', data: { state: 'ready', error: null } });
    let followedLog = '';
    for (const e of events.slice(0, -1)) {
      assert.equal(e.event, 'log');
      followedLog = e.data.reset ? e.data.text : followedLog + e.data.text;
    }
    assert.equal(followedLog, (await f.req('getEnvironmentLog', { url: '/v1/environments/app/log', key })).body, 'the pieces add up to the log');
    assert.ok(!stream.body.includes(secret));
    const bodies = [
      (await f.req('getEnvironment', { url: '/v1/environments/app', key })).body,
      (await f.req('listEnvironments', { url: '/v1/environments', key })).body,
      (await f.req('getEnvironmentLog', { url: '/v1/environments/app/log', key })).body,
      (await f.req('listTemplates', { url: '/v1/templates', key })).body,
      c.body,
    ];
    for (const b of bodies) assert.ok(!b.includes(secret), `secret in ${b.slice(0, 200)}`);
    assert.equal(JSON.parse(bodies[0]).state, 'ready');
    assertErrorBody(await f.req('deleteImage', { url: `/v1/images/${id}`, key }), 'conflict');
    assert.equal((await f.req('deleteEnvironment', { url: '/v1/environments/app', key })).statusCode, 204);
    assertErrorBody(await f.req('getEnvironment', { url: '/v1/environments/app', key }), 'environment_not_found');
    assert.equal((await f.req('deleteImage', { url: `/v1/images/${id}`, key })).statusCode, 204);
  });

  test('environments take an egress policy: validated, normalised, shown, given to the bake; old rows read as "allow"', async () => {
    const key = f.key('pro-n', 'pro');
    const id = (await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'oci-layout', path: layout } } })).json().id;
    await images.idle();
    for (const egress of [{ domains: ['bad_name'] }, {}, { cidrs: ['1.2.3.4/8'] }, 'deny']) {
      assertErrorBody(await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'net', image: id, egress } }), 'validation_error');
    }
    // An environment naming cloud metadata or the operator's LAN is refused before it is recorded.
    for (const cidrs of [['10.0.0.0/8', '169.254.169.254/32'], ['172.16.0.0/12']]) {
      const r = await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'net', image: id, egress: { cidrs } } });
      assertErrorBody(r, 'egress_forbidden');
      assert.match(r.json().error.message, new RegExp(`${cidrs[0].replace(/\./g, '\\.')} reaches into`));
    }
    const c = await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'net', image: id, egress: { domains: ['PyPI.org', '*.pythonhosted.org'], ports: [443] } } });
    assert.equal(c.statusCode, 202, c.body);
    const policy = { domains: ['*.pythonhosted.org', 'pypi.org'], cidrs: [], ports: [443] };
    assert.deepEqual(c.json().egress, policy);
    const closed = await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'closed', image: id, egress: 'none' } });
    assert.equal(closed.json().egress, 'none');
    assert.equal((await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'open', image: id } })).json().egress, 'allow');
    await images.idle();
    assert.deepEqual(host.recipes.find((r) => r.id === 'net')!.egress, policy);
    assert.equal(host.recipes.find((r) => r.id === 'closed')!.egress, 'none');
    assert.deepEqual((await f.req('getEnvironment', { url: '/v1/environments/net', key })).json().egress, policy);
    // Rows written before policies were JSON hold the bare word.
    db.prepare(`UPDATE environments SET egress = 'allow' WHERE tenant = ? AND name = ?`).run('pro-n', 'closed');
    assert.equal((await f.req('getEnvironment', { url: '/v1/environments/closed', key })).json().egress, 'allow');
    for (const name of ['net', 'closed', 'open']) await f.req('deleteEnvironment', { url: `/v1/environments/${name}`, key });
  });

  test('an unbaked environment is listed as a template that is not ready, and create says template_not_ready', async () => {
    const key = f.key('pro-u', 'pro');
    const r = await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'oci-layout', path: layout } } });
    // Created while the pull is still queued: pending until the image is ready.
    const c = await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'slow', image: r.json().id } });
    assert.equal(c.json().state, 'pending');
    const t = (await f.req('listTemplates', { url: '/v1/templates', key })).json().templates.find((x: any) => x.id === 'slow');
    assert.equal(t.ready, false);
    assertErrorBody(await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'slow' } }), 'template_not_ready');
    await images.idle();
  });

  test('MCP create_sandbox on a baking environment is template_not_ready too, for Pro and Enterprise', async () => {
    const url = (await f.api.app.listen({ host: '127.0.0.1', port: 0 })) + '/mcp';
    for (const tier of ['pro', 'enterprise'] as const) {
      const key = f.key(`mcp-${tier}`, tier);
      const mcp = new Client({ name: 'unit', version: '1' });
      await mcp.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${key}` } } }));
      try {
        // Created while the pull is still queued: pending until the image is ready.
        const r = await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'oci-layout', path: layout } } });
        const c = await f.req('createEnvironment', { url: '/v1/environments', key, body: { name: 'baking', image: r.json().id } });
        assert.equal(c.json().state, 'pending');
        const m = await mcp.callTool({ name: 'create_sandbox', arguments: { template: 'baking' } });
        assert.equal(m.isError, true);
        assert.match((m.content as Array<{ text: string }>)[0].text, /^template_not_ready: Environment baking is pending/);
      } finally {
        await mcp.close();
      }
      await images.idle();
    }
  });

  test('bad sources: a missing path and a bad reference are clear errors', async () => {
    const key = f.key('pro-b', 'pro');
    assertErrorBody(await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'oci-layout', path: join(dir, 'imports', 'nope') } } }), 'image_not_found');
    assertErrorBody(await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'registry', ref: 'UPPER/Case' } } }), 'validation_error');
    assertErrorBody(await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'ftp', path: '/x' } } }), 'validation_error');
  });

  test("a registry pull reaches no more than a sandbox may: the server's loopback (an unlisted registry) is refused, and no request gets there", async () => {
    const key = f.key('pro-ssrf', 'pro');
    const hits: string[] = [];
    const internal = createServer((req, res) => {
      hits.push(req.url!);
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"secret": "hunter2"}');
    });
    await new Promise<void>((r) => internal.listen(0, '127.0.0.1', r));
    try {
      const port = (internal.address() as AddressInfo).port;
      for (const ref of [`127.0.0.1:${port}/team/app:v1`, `localhost:${port}/team/app:v1`]) {
        const r = await f.req('createImage', { url: '/v1/images', key, body: { source: { kind: 'registry', ref } }, allow5xx: true });
        assertErrorBody(r, 'image_pull_failed');
        assert.match(r.json().error.message, /127\.0\.0\.0\/8.*COLLIMATE_INSECURE_REGISTRIES/, ref);
        assert.doesNotMatch(r.body, /hunter2/);
      }
      assert.deepEqual(hits, [], 'the internal service saw no request');
    } finally {
      internal.close();
    }
  });
});
