import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { NODE_DISTS } from '../../src/images/debianRootfs.ts';
import { openEngine, testHome, assertNoLeaks } from './fixture.ts';

const tenant = { tenant: 'it-catalog' };
let engine: Engine;
let home: string;

before(async () => {
  home = testHome('catalog');
  engine = await openEngine(home, { catalog: ['base', 'python', 'node'], poolSize: 1 });
});

after(async () => {
  await assertNoLeaks(engine, home);
});

test('the catalog lists base, python and node, each ready', () => {
  const ids = engine.templates().map((t) => t.id).sort();
  assert.deepEqual(ids, ['base', 'node', 'python']);
  assert.ok(engine.templates().every((t) => t.ready && t.kind === 'catalog'));
});

/** The runtime versions the catalog states for a template (what GET /v1/images shows). */
function runtimesOf(id: string): Record<string, string> {
  return engine.templates().find((t) => t.id === id)!.runtimes ?? {};
}

test('python: code runs Python; pip and venv are there, at the versions the catalog states', async () => {
  const sb = await engine.create({ template: 'python' }, tenant);
  const v = await engine.exec(sb.id, { code: 'import sys; print(sys.version_info[0])' });
  assert.equal(v.stdout, '3\n', v.stderr);
  const { python, pip } = runtimesOf('python');
  const versions = await engine.exec(sb.id, { command: 'python3 --version; python3 -m pip --version | cut -d" " -f1-2' });
  assert.equal(versions.stdout, `Python ${python}\npip ${pip}\n`, versions.stderr);
  // --without-pip: ensurepip under TCG takes minutes on a loaded 2-core host; pip itself is checked first.
  const tools = await engine.exec(sb.id, { command: 'python3 -m pip --version >/dev/null && python3 -m venv --without-pip /tmp/venv && /tmp/venv/bin/python -c "print(42)"', timeout: 600 });
  assert.equal(tools.stdout, '42\n', tools.stderr);
  await engine.delete(sb.id);
});

test('node: code runs JavaScript on the Node.js LTS and npm the catalog states', async () => {
  const { node, npm } = runtimesOf('node');
  assert.equal(node, NODE_DISTS.node.version);
  assert.equal(npm, NODE_DISTS.npm.version);
  // An LTS line: even major, and the binary says so itself (process.release.lts is its codename).
  assert.equal(Number(node.split('.')[0]) % 2, 0);
  const sb = await engine.create({ template: 'node' }, tenant);
  const v = await engine.exec(sb.id, { code: 'console.log(typeof process.versions.node, 6 * 7, process.release.lts)' });
  assert.equal(v.stdout, 'string 42 Krypton\n', v.stderr);
  const versions = await engine.exec(sb.id, { command: 'node --version; npm --version; command -v node' });
  assert.equal(versions.stdout, `v${node}\n${npm}\n/usr/local/bin/node\n`, versions.stderr);
  await engine.delete(sb.id);
});

test('base states no runtimes', () => {
  assert.deepEqual(runtimesOf('base'), {});
});
