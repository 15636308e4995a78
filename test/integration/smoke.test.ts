import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, type Served } from './fixture.ts';

/**
 * The smallest end-to-end path, run on every supported Node.js (scripts/test-node.sh runs it on
 * another major than the machine's): the REST server on loopback, keys and state in SQLite (the one
 * native module), a sandbox restored from the `base` template, an exec, a live fork, the leak check.
 */

let engine: Engine;
let api: Served;
let home: string;
let base: string;
let key: string;

async function call(method: string, path: string, body?: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : undefined };
}

before(async () => {
  home = testHome('smoke');
  engine = await openEngine(home, { poolSize: 1 });
  api = await serveEngine(engine);
  base = await api.app.listen({ host: '127.0.0.1', port: 0 });
  key = api.keys.create({ tenant: 'smoke', tier: 'pro' }).key;
});

after(async () => {
  await api?.close(1000);
  if (engine) await assertNoLeaks(engine, home);
});

test('runs on the Node.js scripts/test-node.sh chose', { skip: !process.env.COLLIMATE_TEST_NODE_VERSION }, () => {
  assert.equal(process.versions.node, process.env.COLLIMATE_TEST_NODE_VERSION);
});

test('create, exec and fork through the REST API, on real microVMs', async () => {
  console.error(`[smoke] Node.js ${process.version} (ABI ${process.versions.modules}), accel ${engine.accel}`);
  const images = await call('GET', '/v1/images');
  assert.equal(images.status, 200);
  assert.deepEqual(images.json.images.find((t: { id: string }) => t.id === 'base')?.runtimes, {});

  const created = await call('POST', '/v1/sandboxes', { template: 'base' });
  assert.equal(created.status, 201, JSON.stringify(created.json));
  const id = created.json.id;
  const ex = await call('POST', `/v1/sandboxes/${id}/exec`, { command: 'echo remembered > /root/note; uname -s' });
  assert.equal(ex.status, 200);
  assert.equal(ex.json.stdout, 'Linux\n', ex.json.stderr);

  const fork = await call('POST', `/v1/sandboxes/${id}/fork`, { count: 1 });
  assert.equal(fork.status, 201, JSON.stringify(fork.json));
  const child = fork.json.sandboxes[0].id;
  assert.equal((await call('POST', `/v1/sandboxes/${child}/exec`, { command: 'cat /root/note' })).json.stdout, 'remembered\n');

  const listed = await call('GET', '/v1/sandboxes');
  assert.deepEqual(listed.json.sandboxes.map((s: { id: string }) => s.id).sort(), [id, child].sort());
  for (const s of [child, id]) assert.equal((await call('DELETE', `/v1/sandboxes/${s}`)).status, 204);
});
