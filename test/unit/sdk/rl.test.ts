/** The RL helpers on the in-process fleet over the fake service (no VMs): cleanup, pruning, caps. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FakeSandboxService } from '../../support/fakeSandboxService.js';
import { NotFoundError } from '../../../src/sdk/index.js';
import { bestOfN, createLocalFleet, map, mapSandboxes, RUN_LABEL, sweep, treeSearch } from '../../../src/sdk/rl/index.js';

import { openDb } from '../../../src/store/db.js';
import { TenantService } from '../../../src/service/tenantService.js';
import { trustedScope } from '../../../src/service/types.js';

const scope = trustedScope('t1');
/** The local fleet calls the tenant service, over the fake engine here. */
const tenantsOn = (svc: FakeSandboxService) => new TenantService({ engine: svc, db: openDb(':memory:'), reconcileIntervalMs: 0 });
const live = (svc: FakeSandboxService) => svc.list({}, scope).sandboxes.map((s) => s.id).sort();

test('create and fork carry the run label; the service errors become SDK classes', async () => {
  const svc = new FakeSandboxService();
  const fleet = createLocalFleet(tenantsOn(svc), scope, { runId: 'r1' });
  const root = await fleet.create('base', { labels: { a: 'b' } });
  assert.deepEqual(root.info.labels, { a: 'b', [RUN_LABEL]: 'r1' });
  const [kid] = await root.fork(1, { labels: { c: 'd' } });
  assert.equal(kid.info.labels[RUN_LABEL], 'r1');
  assert.equal(kid.info.labels.c, 'd');
  assert.equal((await kid.exec({ command: 'echo hi' })).stdout, 'hi\n');
  await kid.delete();
  await assert.rejects(kid.exec({ command: 'echo' }), NotFoundError);
  assert.equal(await fleet.sweep(undefined, { quietMs: 1 }), 1);
  assert.deepEqual(live(svc), []);
});

test('bestOfN keeps only the winner when asked, deletes every child on a failing step', async () => {
  const svc = new FakeSandboxService();
  const fleet = createLocalFleet(tenantsOn(svc), scope);
  const root = await fleet.create('base');
  const out = await bestOfN(root, 4, (sb, i) => sb.exec({ command: `echo ${[3, 9, 9, 1][i]}` }), (r) => Number(r.stdout), { keepWinner: true });
  assert.equal(out.winner.index, 1, 'ties go to the lowest index');
  assert.deepEqual(live(svc), [root.id, out.winner.sandbox!.id].sort());
  await out.winner.sandbox!.delete();

  const none = await bestOfN(root, 2, (sb) => sb.exec({ command: 'echo x' }), () => NaN);
  assert.equal(none.winner.score, -Infinity);
  assert.equal(none.winner.sandbox, undefined);
  assert.deepEqual(live(svc), [root.id]);

  await assert.rejects(bestOfN(root, 3, async (sb, i) => (i === 2 ? Promise.reject(new Error('boom')) : sb.exec({ command: 'echo 1' })), () => 1), /boom/);
  await assert.rejects(bestOfN(root, 3, (sb) => sb.exec({ command: 'echo 1' }), () => { throw new Error('bad score'); }), /bad score/);
  assert.deepEqual(live(svc), [root.id]);
});

test('treeSearch prunes to the beam, deletes expanded nodes, keeps the root, cleans up on error', async () => {
  const svc = new FakeSandboxService();
  const fleet = createLocalFleet(tenantsOn(svc), scope);
  const root = await fleet.create('base');
  let peak = 0;
  const t = await treeSearch(root, {
    expand: 3,
    depth: 3,
    beam: 2,
    step: async (sb, ctx) => {
      peak = Math.max(peak, live(svc).length);
      return sb.exec({ command: `echo ${ctx.path.join('')}` });
    },
    score: (r) => Number(r.stdout),
    keepBest: true,
  });
  assert.deepEqual(t.best.path, [2, 2, 2]);
  assert.equal(t.levels.length, 3);
  assert.deepEqual(t.levels.map((l) => l.length), [3, 6, 6]);
  assert.ok(peak <= 1 + 2 * (3 + 1), `at most root + beam × (expand + 1) alive (${peak})`);
  assert.deepEqual(live(svc), [root.id, t.best.sandbox!.id].sort());
  await t.best.sandbox!.delete();

  await assert.rejects(
    treeSearch(root, { expand: 2, depth: 3, beam: 2, step: async (sb, ctx) => { if (ctx.depth === 2) throw new Error('deep'); return sb.exec({ command: 'echo 1' }); }, score: () => 1 }),
    /deep/,
  );
  assert.deepEqual(live(svc), [root.id]);
});

test('map: hard concurrency cap, start-rate limit, input order, stops after the first failure', async () => {
  let running = 0;
  let peak = 0;
  const starts: number[] = [];
  const out = await map(
    [1, 2, 3, 4, 5, 6],
    async (x) => {
      starts.push(Date.now());
      running++;
      peak = Math.max(peak, running);
      await new Promise((r) => setTimeout(r, 150 - x * 10));
      running--;
      return x * 10;
    },
    { concurrency: 2, ratePerSec: 20 },
  );
  assert.deepEqual(out, [10, 20, 30, 40, 50, 60]);
  assert.equal(peak, 2);
  for (let i = 1; i < starts.length; i++) assert.ok(starts[i] - starts[i - 1] >= 45, `starts ${i} are 50 ms apart (${starts[i] - starts[i - 1]})`);

  const started: number[] = [];
  await assert.rejects(
    map([0, 1, 2, 3, 4, 5], async (x) => { started.push(x); if (x === 1) throw new Error('x1'); await new Promise((r) => setTimeout(r, 20)); }, { concurrency: 2 }),
    /x1/,
  );
  assert.ok(started.length <= 3, `no new task after the failure (${started})`);
});

test('mapSandboxes creates one sandbox per item and always deletes it', async () => {
  const svc = new FakeSandboxService();
  const fleet = createLocalFleet(tenantsOn(svc), scope);
  let alive = 0;
  let peak = 0;
  const r = await mapSandboxes(fleet, 'base', ['a', 'b', 'c', 'd'], async (sb, item) => {
    alive = svc.list({}, scope).sandboxes.length;
    peak = Math.max(peak, alive);
    return (await sb.exec({ command: `echo ${item}` })).stdout.trim();
  }, { concurrency: 2 });
  assert.deepEqual(r, ['a', 'b', 'c', 'd']);
  assert.ok(peak <= 2);
  assert.deepEqual(live(svc), []);
  await assert.rejects(mapSandboxes(fleet, 'base', [1], async () => { throw new Error('inner'); }, { concurrency: 1 }), /inner/);
  assert.deepEqual(live(svc), []);
});

test('sweep deletes only the run, including a create that lands after the first empty list', async () => {
  const svc = new FakeSandboxService();
  const fleet = createLocalFleet(tenantsOn(svc), scope, { runId: 'dead-run' });
  const other = createLocalFleet(tenantsOn(svc), scope, { runId: 'other-run' });
  const keep = await other.create('base');
  const a = await fleet.create('base');
  await a.fork(2);
  await a.suspend();
  // A trainer's create still in flight: it lands just after sweep's first empty list (made so by
  // the list itself, not by a timer, which a loaded machine could fire after the sweep ended).
  const listIds = fleet.listIds.bind(fleet);
  let late: Promise<unknown> | undefined;
  fleet.listIds = async (q) => {
    const ids = await listIds(q);
    if (ids.length === 0 && !late) await (late = fleet.create('base'));
    return ids;
  };
  const n = await sweep(fleet, 'dead-run', { quietMs: 150 });
  assert.ok(late, 'the late create happened');
  assert.equal(n, 4);
  assert.deepEqual(live(svc), [keep.id]);
});
