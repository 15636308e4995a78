// `serve`'s first start: the engine opens once `base` is ready and builds the catalog templates whose
// layers are not built yet in the background (catalogInBackground). A create of one still building
// is template_not_ready, it is listed not ready, and catalogStatus (GET /healthz's `catalog`) says
// which step it is at; once built it serves creates like any other. On real VMs: the stand-in
// entries' layers are base's own, held back by a gate, so the test controls when a "build" ends.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { CATALOG } from '../../src/images/templates.ts';
import type { CatalogEntry } from '../../src/images/catalog.ts';
import { CollimateError } from '../../src/errors.ts';
import { restNames } from '../../src/api/routes.ts';
import { openEngine, testHome, assertNoLeaks } from './fixture.ts';

const tenant = { tenant: 'it-first-start' };
const base = CATALOG.find((e) => e.id === 'base')!;
let engine: Engine;
let home: string;
let release!: () => void;
const gate = new Promise<void>((r) => { release = r; });
let brokenTries = 0;

/** Built in the background: its layers "build" until the gate opens. */
const slow: CatalogEntry = {
  ...base, id: 'slow', description: 'held back by the test',
  layersCached: () => false,
  layers: async (home, progress) => { progress('building the slow layer'); await gate; return base.layers(home, progress); },
};
/** Its first build fails; a create starts it again. */
const broken: CatalogEntry = {
  ...base, id: 'broken', description: 'fails once',
  layersCached: () => false,
  layers: async (home, progress) => {
    if (++brokenTries === 1) throw new Error('debootstrap exited 1: the mirror did not answer');
    return base.layers(home, progress);
  },
};
/** Its layers are built already: ready when the engine opens, as base is. */
const cached: CatalogEntry = { ...base, id: 'cached', description: 'layers on disk', layersCached: () => true };

before(async () => {
  home = testHome('first-start');
  engine = await openEngine(home, { catalog: ['base', 'broken', 'slow', 'cached'], catalogEntries: [base, broken, slow, cached], catalogInBackground: true, poolSize: 1 });
  // Background builds run one at a time, in catalog order: broken fails at once, then slow waits at the gate.
  for (let i = 0; i < 100 && !('broken' in engine.catalogStatus().failed); i++) await new Promise((r) => setTimeout(r, 20));
});

after(async () => {
  release();
  await assertNoLeaks(engine, home);
});

async function refusal(p: Promise<unknown>): Promise<CollimateError> {
  const e = await p.then(() => undefined, (err: unknown) => err);
  assert.ok(e instanceof CollimateError, `expected a CollimateError, got ${String(e)}`);
  return e;
}

test('the engine opens with base and the cached entry ready while the others build; a create of one building is template_not_ready', async () => {
  const listed = Object.fromEntries(engine.templates().map((t) => [t.id, t.ready]));
  assert.deepEqual(listed, { base: true, cached: true, slow: false, broken: false });
  const status = engine.catalogStatus();
  assert.deepEqual(Object.keys(status.building).sort(), ['slow']);
  assert.equal(status.building.slow.step, 'building the slow layer');
  assert.deepEqual(Object.keys(status.failed), ['broken']);
  assert.match(status.failed.broken, /mirror did not answer/);

  const e = await refusal(engine.create({ template: 'slow' }, tenant));
  assert.equal(e.code, 'template_not_ready');
  assert.match(e.message, /slow is still being built.*now: building the slow layer/);
  // Where the build's progress shows, as REST names it.
  assert.match((e as CollimateError).text(restNames), /health lists what is still being built with GET \/healthz/);

  // Base serves meanwhile, from its warm pool.
  const sb = await engine.create({ template: 'base' }, tenant);
  assert.equal((await engine.exec(sb.id, { command: 'echo up' })).stdout, 'up\n');
  await engine.delete(sb.id);
});

test('a failed build is started again by the next create of it, which is told so', async () => {
  const e = await refusal(engine.create({ template: 'broken' }, tenant));
  assert.equal(e.code, 'template_not_ready');
  assert.match(e.message, /broken failed to build \(debootstrap exited 1: the mirror did not answer\); it is being built again now/);
  assert.equal(engine.catalogStatus().building.broken?.step, 'queued', 'building again, behind slow');
  assert.ok(!('broken' in engine.catalogStatus().failed));
});

test('once built, a background template serves creates and is listed ready', async () => {
  release();
  await engine.templatePools.backgroundSettled();
  assert.deepEqual(engine.catalogStatus(), { building: {}, failed: {} });
  assert.ok(engine.templates().every((t) => t.ready));
  for (const id of ['slow', 'broken']) {
    const sb = await engine.create({ template: id }, tenant);
    assert.equal((await engine.exec(sb.id, { command: 'echo ok' })).stdout, 'ok\n');
    await engine.delete(sb.id);
  }
  assert.equal(brokenTries, 2);
});
