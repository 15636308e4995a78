import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { ForkReceivers } from '../../../src/sandboxes/forkReceivers.ts';
import { loadConfig } from '../../../src/config.ts';
import type { Artifact } from '../../../src/images/artifactManifest.ts';
import type { PendingVm } from '../../../src/sandboxes/runtime.ts';

/** Receivers that are only names: spawned one by one, destroyed into a list. */
function fakes(opts: { max?: number; idleSecs?: number; available?: boolean } = {}) {
  const cfg = loadConfig({ home: '/nonexistent', forkPoolMax: opts.max ?? 16, forkPoolIdleSecs: opts.idleSecs ?? 600 }, {});
  const made: string[] = [];
  const destroyed: string[] = [];
  const artifact = (key: string) => ({ key }) as unknown as Artifact;
  const r = new ForkReceivers(cfg, artifact, {
    available: async () => opts.available ?? true,
    spawn: async (a) => {
      await sleep(1);
      const id = `${a.key}-${made.length}`;
      made.push(id);
      return { id } as PendingVm;
    },
    destroy: async (p) => { destroyed.push(p.id); },
  });
  const ready = async (key: string, n: number) => {
    const deadline = Date.now() + 5000;
    while ((r.sizes()[key]?.ready ?? 0) < n) {
      assert.ok(Date.now() < deadline, `never ${n} ready: ${JSON.stringify(r.sizes())}`);
      await sleep(5);
    }
  };
  return { r, made, destroyed, ready };
}

test('no receivers until a template\'s sandboxes fork; then as many as the largest fork, refilled after each take', async () => {
  const { r, ready } = fakes();
  assert.deepEqual(r.take('a', 4), [], 'nothing is spawned ahead of the first fork');
  assert.deepEqual(r.sizes(), {});
  await r.forked('a', 3);
  await ready('a', 3);
  assert.deepEqual(r.sizes().a, { ready: 3, target: 3 });
  assert.equal(r.take('a', 2).length, 2);
  await r.forked('a', 2);
  await ready('a', 3);
  assert.deepEqual(r.sizes().a, { ready: 3, target: 3 }, 'a smaller fork does not shrink the pool');
  assert.equal(r.take('a', 5).length, 3, 'a fork larger than the pool takes what is there');
  assert.deepEqual(r.take('b', 1), [], 'pools are per artifact');
  await r.close();
});

test('the pool is capped by COLLIMATE_FORK_POOL_MAX and goes after COLLIMATE_FORK_POOL_IDLE_SECS without a fork', async () => {
  const { r, destroyed, ready } = fakes({ max: 4, idleSecs: 60 });
  await r.forked('a', 16);
  await ready('a', 4);
  assert.deepEqual(r.sizes().a, { ready: 4, target: 4 });
  await r.sweepIdle(Date.now() + 30_000);
  assert.equal(r.sizes().a?.ready, 4, 'still used recently');
  await r.sweepIdle(Date.now() + 61_000);
  assert.equal(r.sizes().a, undefined);
  assert.equal(destroyed.length, 4, 'its VMMs are destroyed');
  await r.close();
});

test('without confinement (or with COLLIMATE_FORK_POOL_MAX=0) no receiver is ever spawned', async () => {
  const { r, made } = fakes({ available: false });
  await r.forked('a', 4);
  await sleep(700);
  assert.deepEqual(made, []);
  assert.deepEqual(r.sizes(), {});
  await r.close();
});

test('close destroys every ready receiver', async () => {
  const { r, destroyed, ready } = fakes();
  await r.forked('a', 2);
  await ready('a', 2);
  await r.close();
  assert.equal(destroyed.length, 2);
  assert.deepEqual(r.take('a', 1), []);
});

test('settled waits for a fork\'s receivers even before their pool size is set, so a count taken then is stable', async () => {
  const { r, made } = fakes();
  // As a fork does: announced without waiting (the size is set a moment later, then filled).
  void r.forked('a', 2);
  await r.settled(Date.now() + 5000);
  assert.deepEqual(r.sizes().a, { ready: 2, target: 2 });
  assert.equal(made.length, 2);
  await r.close();
});
