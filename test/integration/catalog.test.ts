import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import type { Engine } from '../../src/sandboxes/engine.ts';
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

test('python: code runs Python; pip and venv are there', async () => {
  const sb = await engine.create({ template: 'python' }, tenant);
  const v = await engine.exec(sb.id, { code: 'import sys; print(sys.version_info[0])' });
  assert.equal(v.stdout, '3\n', v.stderr);
  // --without-pip: ensurepip under TCG takes minutes on a loaded 2-core host; pip itself is checked first.
  const tools = await engine.exec(sb.id, { command: 'python3 -m pip --version >/dev/null && python3 -m venv --without-pip /tmp/venv && /tmp/venv/bin/python -c "print(42)"', timeout: 600 });
  assert.equal(tools.stdout, '42\n', tools.stderr);
  await engine.delete(sb.id);
});

test('node: code runs JavaScript', async () => {
  const sb = await engine.create({ template: 'node' }, tenant);
  const v = await engine.exec(sb.id, { code: 'console.log(typeof process.versions.node, 6 * 7)' });
  assert.equal(v.stdout, 'string 42\n', v.stderr);
  await engine.delete(sb.id);
});
