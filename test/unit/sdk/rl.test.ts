/** The RL helpers on the in-process fleet over the fake service (no VMs): cleanup, pruning, caps, seeded code cells. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FakeSandboxService } from '../../support/fakeSandboxService.js';
import { Collimate, Execution, NotFoundError, SnapshotMismatchError } from '../../../src/sdk/index.js';
import { CODE_PORT } from '../../../src/guest/codeServer.js';
import { startFakeCodeServer } from '../../support/fakeCodeServer.js';
import { fixture } from '../api/helpers.js';
import { bestOfN, connect, createLocalFleet, map, mapSandboxes, RUN_LABEL, sweep, treeSearch, type Sandbox, type TreeNodeContext } from '../../../src/sdk/rl/index.js';

import { openDb } from '../../../src/store/db.js';
import { TenantService } from '../../../src/service/tenantService.js';
import { trustedScope } from '../../../src/service/types.js';

const scope = trustedScope('t1');
/** The local fleet calls the tenant service, over the fake engine here. */
const tenantsOn = (svc: FakeSandboxService) => new TenantService({ engine: svc, db: openDb(':memory:'), reconcileIntervalMs: 0 });
const live = (svc: FakeSandboxService) => svc.list({}, scope).sandboxes.map((s) => s.id).sort();
const storedIds = (svc: FakeSandboxService) => svc.listSnapshots({}, scope).snapshots.map((s) => s.id).sort();
const text = async (sb: Sandbox, path: string) => (await sb.readFile(path)).toString();

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
  // The limiter spaces the moments starts pass its gate 50 ms apart; each task begins a moment after,
  // later on a busy event loop, so one gap seen from inside the tasks can shrink by that delay
  // (43 ms was seen under load). Without the limiter two starts would come within a millisecond.
  for (let i = 1; i < starts.length; i++) assert.ok(starts[i] - starts[i - 1] >= 25, `starts ${i} are spaced by the rate (${starts[i] - starts[i - 1]} ms)`);
  assert.ok(starts[starts.length - 1] - starts[0] >= (starts.length - 1) * 50 - 15, `6 starts at 20/s span ≥ 250 ms less a task's delay (${starts[starts.length - 1] - starts[0]} ms)`);

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

test("sweep deletes the run's snapshots too (sandbox.snapshot, treeSearch's keep: 'snapshots'), not another run's or unlabelled ones", async () => {
  const svc = new FakeSandboxService();
  const tenants = tenantsOn(svc);
  const fleet = createLocalFleet(tenants, scope, { runId: 'snap-run' });
  const other = createLocalFleet(tenants, scope, { runId: 'other-run' });
  const keepSandbox = await other.create('base');
  const keepState = await keepSandbox.snapshot({ name: 'another run' });
  const unlabelled = await svc.createSnapshot(keepSandbox.id, { labels: { mine: 'yes' } }, scope);
  const root = await fleet.create('base');
  const state = await root.snapshot({ labels: { k: 'v' } });
  const t = await treeSearch(root, { expand: 2, depth: 2, beam: 1, step: (sb) => sb.exec({ command: 'echo 1' }), score: () => 1, keep: 'snapshots' });
  const treeStates = t.levels.flat().filter((n) => n.snapshot).map((n) => n.snapshot!.id);
  assert.equal(treeStates.length, 2);
  await fleet.fromSnapshot(state, 2);
  assert.deepEqual(storedIds(svc), [keepState.id, unlabelled.id, state.id, ...treeStates].sort());
  assert.deepEqual((await fleet.listSnapshotIds({ labels: fleet.runLabel })).sort(), [state.id, ...treeStates].sort());
  // A snapshot still being taken when the trainer died: it lands after sweep's first empty lists.
  const listSnapshotIds = fleet.listSnapshotIds.bind(fleet);
  let late: Promise<unknown> | undefined;
  const lateRoot = await other.create('base');
  fleet.listSnapshotIds = async (q) => {
    const ids = await listSnapshotIds(q);
    if (ids.length === 0 && !late) await (late = svc.createSnapshot(lateRoot.id, { labels: fleet.runLabel }, scope));
    return ids;
  };
  // root and the 2 started from the state; the state, the tree's 2 and the late one.
  assert.equal(await fleet.sweep(undefined, { quietMs: 1 }), 3 + 4);
  assert.ok(late, 'the late snapshot happened');
  assert.deepEqual(live(svc), [keepSandbox.id, lateRoot.id].sort());
  assert.deepEqual(storedIds(svc), [keepState.id, unlabelled.id].sort());
  assert.equal(await fleet.sweep(undefined, { quietMs: 1 }), 0, 'nothing left to sweep');
});

test('sweep over HTTP (connect) deletes the run\'s snapshots too', async () => {
  const f = await fixture();
  try {
    const base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
    const client = new Collimate({ baseUrl: base, apiKey: f.key('rl-sweep', 'pro') });
    const fleet = connect({ client, runId: 'http-snap-run' });
    const root = await fleet.create('base');
    const state = await root.snapshot();
    const other = await connect({ client }).create('base');
    const otherState = await other.snapshot();
    assert.deepEqual(await fleet.listSnapshotIds({ labels: fleet.runLabel }), [state.id]);
    assert.equal(await fleet.sweep(undefined, { quietMs: 1 }), 2);
    await assert.rejects(fleet.deleteSnapshot(state), NotFoundError);
    assert.deepEqual(await fleet.listSnapshotIds({}), [otherState.id]);
    await other.delete();
  } finally {
    await f.close();
  }
});

test('stored states: snapshot, restore, fromSnapshot and deleteSnapshot carry the run label; sweep removes what fromSnapshot started', async () => {
  const svc = new FakeSandboxService();
  const fleet = createLocalFleet(tenantsOn(svc), scope, { runId: 'r-snap' });
  const root = await fleet.create('base');
  await root.writeFile('/s.txt', 'one');
  const state = await root.snapshot({ name: 'after one', labels: { k: 'v' } });
  assert.deepEqual(state.labels, { k: 'v', [RUN_LABEL]: 'r-snap' });
  assert.equal(state.name, 'after one');
  assert.equal(state.sandbox_id, root.id);

  await root.writeFile('/s.txt', 'two');
  await root.restore(state);
  assert.equal(await text(root, '/s.txt'), 'one');

  const kids = await fleet.fromSnapshot(state.id, 2, { labels: { role: 'w' } });
  assert.equal(kids.length, 2);
  for (const k of kids) {
    assert.deepEqual(k.info.labels, { role: 'w', [RUN_LABEL]: 'r-snap' });
    assert.equal(k.info.from_snapshot, state.id);
    assert.equal(await text(k, '/s.txt'), 'one');
  }
  await assert.rejects(kids[0].restore(state), SnapshotMismatchError, 'only the sandbox it was taken of rolls back to it');

  await fleet.deleteSnapshot(state);
  assert.deepEqual(storedIds(svc), []);
  await assert.rejects(fleet.fromSnapshot(state, 1), NotFoundError);
  await assert.rejects(fleet.deleteSnapshot(state.id), NotFoundError);
  assert.equal(await fleet.sweep(undefined, { quietMs: 1 }), 3, 'the root and both sandboxes started from the state');
  assert.deepEqual(live(svc), []);
});

test('bestOfN from a stored state: every candidate starts from it, not from what its sandbox did later', async () => {
  const svc = new FakeSandboxService();
  const fleet = createLocalFleet(tenantsOn(svc), scope);
  const root = await fleet.create('base');
  await root.writeFile('/f', 'stored');
  const state = await root.snapshot();
  await root.writeFile('/f', 'later');
  await root.writeFile('/g', 'only later');
  svc.calls.length = 0;

  const step = async (sb: Sandbox, i: number) => {
    const seen = await text(sb, '/f');
    await assert.rejects(sb.readFile('/g'), /No file/);
    await sb.writeFile('/f', seen + i);
    return seen;
  };
  const out = await bestOfN({ fleet, snapshot: state }, 3, step, (_r, i) => i, { keepWinner: true });
  assert.deepEqual(out.all.map((a) => a.result), ['stored', 'stored', 'stored']);
  assert.equal(out.winner.index, 2);
  const winner = out.winner.sandbox!;
  assert.equal(winner.info.from_snapshot, state.id);
  assert.equal(winner.info.labels[RUN_LABEL], fleet.runId);
  assert.equal(await text(winner, '/f'), 'stored2');
  assert.ok(svc.calls.includes('startFromSnapshot') && !svc.calls.includes('fork'), `started from the state, not forked (${svc.calls})`);
  assert.equal(await text(root, '/f'), 'later', 'the source sandbox is left as it was');
  assert.deepEqual(live(svc), [root.id, winner.id].sort());
  await winner.delete();

  // The state outlives its sandbox; by id too. A failing step deletes every candidate, not the state.
  await root.delete();
  const again = await bestOfN({ fleet, snapshot: state.id }, 2, step, () => 1);
  assert.deepEqual(again.all.map((a) => a.result), ['stored', 'stored']);
  await assert.rejects(bestOfN({ fleet, snapshot: state }, 2, async (_sb, i) => { if (i === 1) throw new Error('boom'); return ''; }, () => 1), /boom/);
  assert.deepEqual(live(svc), []);
  assert.deepEqual(storedIds(svc), [state.id]);
});

test('treeSearch keeping nodes as snapshots: node sandboxes are gone, a node is expanded again from its state, seeds per node', async () => {
  const svc = new FakeSandboxService();
  const fleet = createLocalFleet(tenantsOn(svc), scope);
  const root = await fleet.create('base');
  await root.writeFile('/trail', 'r');
  let peak = 0;
  const seeds = new Map<string, string>();
  const parents = new Map<string, string>();
  const step = async (sb: Sandbox, ctx: TreeNodeContext) => {
    peak = Math.max(peak, live(svc).length);
    const trail = (await text(sb, '/trail')) + ctx.path[ctx.path.length - 1];
    await sb.writeFile('/trail', trail);
    const r = await sb.exec({ command: `echo ${ctx.path.join('')}` });
    seeds.set(trail, r.seed);
    parents.set(trail, ctx.parentId);
    return r;
  };
  const score = (r: { stdout: string }) => Number(r.stdout);
  const t = await treeSearch(root, { expand: 2, depth: 3, beam: 2, step, score, keep: 'snapshots' });
  assert.deepEqual(t.best.path, [1, 1, 1]);
  assert.equal(t.best.sandbox, undefined);
  assert.deepEqual(live(svc), [root.id], 'every node sandbox is deleted; the states carry the beam');
  assert.ok(peak <= 1 + 2 * 2, `at most root + beam × expand alive (${peak})`);
  assert.deepEqual(t.levels.map((l) => l.length), [2, 4, 4]);
  // Only the beam is stored: 2 per level, each labelled with the run.
  const kept = t.levels.flat().filter((n) => n.snapshot);
  assert.equal(kept.length, 6);
  assert.deepEqual(storedIds(svc), kept.map((n) => n.snapshot!.id).sort());
  assert.ok(kept.every((n) => n.snapshot!.labels[RUN_LABEL] === fleet.runId));
  assert.equal(t.best.snapshot!.id, t.levels[2].find((n) => n.path.join('') === '111')!.snapshot!.id);
  // Every node ran its own exec with its own seed, recorded by its trail.
  assert.equal(seeds.size, 10);
  assert.ok([...seeds.values()].every((s) => /^\d+$/.test(s)));
  assert.equal(t.best.result.seed, seeds.get('r111'));
  // A deeper node's parent is the stored node it started from.
  assert.equal(parents.get('r0'), root.id);

  // Node [1]'s sandbox is gone; expand it again, twice, from its state: each time it is as it was stored.
  const node1 = t.levels[0].find((n) => n.path.join('') === '1')!.snapshot!;
  assert.ok(!live(svc).includes(node1.sandbox_id));
  for (let round = 0; round < 2; round++) {
    seeds.clear();
    const again = await treeSearch({ fleet, snapshot: node1 }, { expand: 2, depth: 1, beam: 1, step, score });
    assert.deepEqual([...seeds.keys()].sort(), ['r10', 'r11']);
    assert.equal(parents.get('r10'), node1.id);
    assert.equal(again.best.snapshot, undefined, "keep 'sandboxes' stores nothing");
  }
  assert.deepEqual(live(svc), [root.id]);

  // On an error the search deletes the sandboxes and the states it made, not earlier ones.
  const before = storedIds(svc);
  await assert.rejects(
    treeSearch(root, { expand: 2, depth: 3, beam: 2, keep: 'snapshots', step: async (sb, ctx) => { if (ctx.depth === 3) throw new Error('deep'); return step(sb, ctx); }, score }),
    /deep/,
  );
  assert.deepEqual(live(svc), [root.id]);
  assert.deepEqual(storedIds(svc), before);

  // keepBest keeps the best final node's sandbox beside its state.
  const kb = await treeSearch({ fleet, snapshot: node1 }, { expand: 2, depth: 2, beam: 1, step, score, keep: 'snapshots', keepBest: true });
  assert.equal(await text(kb.best.sandbox!, '/trail'), 'r111');
  assert.equal(kb.best.snapshot!.sandbox_id, kb.best.sandbox!.id);
  await kb.best.sandbox!.delete();
  for (const id of storedIds(svc)) await fleet.deleteSnapshot(id);
  assert.deepEqual(live(svc), [root.id]);
});

test('connect(): the same stored-state calls over REST', async () => {
  const f = await fixture();
  try {
    const base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
    const fleet = connect({ client: new Collimate({ baseUrl: base, apiKey: f.key('rl-remote', 'pro') }), runId: 'r-remote' });
    const root = await fleet.create('python');
    await root.writeFile('/root/f', 'stored');
    const state = await root.snapshot({ labels: { k: 'v' } });
    assert.deepEqual(state.labels, { k: 'v', [RUN_LABEL]: 'r-remote' });
    await root.writeFile('/root/f', 'later');
    const out = await bestOfN({ fleet, snapshot: state }, 2, (sb) => text(sb, '/root/f'), () => 1, { keepWinner: true });
    assert.deepEqual(out.all.map((a) => a.result), ['stored', 'stored']);
    assert.equal(out.winner.sandbox!.info.labels[RUN_LABEL], 'r-remote');
    await root.restore(state.id);
    assert.equal(await text(root, '/root/f'), 'stored');
    await fleet.deleteSnapshot(state);
    await assert.rejects(fleet.fromSnapshot(state.id, 1), NotFoundError);
    assert.equal(await fleet.sweep(undefined, { quietMs: 1 }), 2, 'the root and the kept winner');
  } finally {
    await f.close();
  }
});

test('code cells as steps, in-process and over REST: each node runs seeded (one drawn when none is given), its result records the seed, and the seed replays the cell; signal and a throwing callback interrupt it', { timeout: 60_000 }, async () => {
  const code = await startFakeCodeServer();
  const f = await fixture();
  try {
    const svc = new FakeSandboxService();
    svc.portMap.set(CODE_PORT, code.port);
    f.svc.portMap.set(CODE_PORT, code.port);
    const base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
    const fleets = [createLocalFleet(tenantsOn(svc), scope), connect({ client: new Collimate({ baseUrl: base, apiKey: f.key('rl-code', 'pro') }) })];
    for (const fleet of fleets) {
      const root = await fleet.create('python');
      const ran: Execution[] = [];
      const step = async (sb: Sandbox) => {
        const r = await sb.runCode('Math.random()', { language: 'javascript' });
        ran.push(r);
        return r;
      };
      const t = await treeSearch(root, { expand: 2, depth: 2, beam: 1, step, score: (r) => Number(r.text) });
      assert.equal(ran.length, 4);
      assert.ok(ran.every((r) => r instanceof Execution && /^\d+$/.test(r.seed ?? '')), JSON.stringify(ran.map((r) => r.seed)));
      assert.equal(new Set(ran.map((r) => r.seed)).size, 4, 'a fresh seed per node');
      assert.deepEqual(code.executed.slice(-4).map((b) => b.seed), ran.map((r) => r.seed), 'the seed each cell ran with is the one recorded');
      assert.ok(ran.includes(t.best.result));
      // Replaying a node's cell with its recorded seed gives its output again.
      for (const r of ran) assert.equal((await root.runCode('Math.random()', { language: 'javascript', seed: r.seed! })).text, r.text);
      assert.equal((await root.runCode('1', { seed: '5' })).seed, '5', 'a given seed passes through');

      // Interrupting: the signal rejects with its AbortError, a throwing callback with its error; both interrupt the cell.
      const ctrl = new AbortController();
      let interrupted = code.interrupted();
      const waiting = root.runCode('wait()', { signal: ctrl.signal });
      await code.waiting();
      ctrl.abort();
      await assert.rejects(waiting, (e: unknown) => (e as Error).name === 'AbortError');
      await interrupted;
      interrupted = code.interrupted();
      await assert.rejects(root.runCode('wait()', { onStdout: () => { throw new Error('enough'); } }), /enough/);
      await interrupted;
      await assert.rejects(root.runCode('1', { context: '00000000-0000-0000-0000-000000000000' }), (e: unknown) => e instanceof NotFoundError && e.code === 'context_not_found');
      await root.delete();
    }
  } finally {
    await f.close();
    await code.close();
  }
});
