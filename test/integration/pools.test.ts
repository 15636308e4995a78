/**
 * Warm pools that size themselves (poolSizer.ts), on real VMs: a bursty demand trace — quiet, 30
 * creates in about 2 s, quiet, the same burst again — against one template. The pool grows ahead of
 * the second burst (most of its creates find a VMM waiting) and shrinks to zero once the template
 * has been idle.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { openEngine, testHome, assertNoLeaks } from './fixture.ts';

const tenant = { tenant: 'it-pools' };
const IDLE_SECS = 90;
let engine: Engine;
let home: string;

before(async () => {
  home = testHome('pools');
  // The idle period is long enough for the pool to refill to the burst on a loaded host (30 VMMs
  // restored two at a time: about 40 s under the whole suite's load), and short enough to watch.
  engine = await openEngine(home, { poolSize: 2, poolIdleSecs: IDLE_SECS, poolBurstSecs: 10, poolMax: 32 });
});

after(async () => {
  await assertNoLeaks(engine, home);
});

/** 30 creates started over ~2 s; the ids, and how many of them a warm VMM served. */
async function burst(): Promise<{ ids: string[]; hits: number }> {
  const before = engine.poolStatus().base;
  const made = await Promise.all(Array.from({ length: 30 }, async (_, i) => {
    await sleep(i * 66);
    return (await engine.create({ template: 'base' }, tenant)).id;
  }));
  return { ids: made, hits: engine.poolStatus().base.hits - before.hits };
}

async function until(what: string, ok: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    assert.ok(Date.now() < deadline, `${what}: ${JSON.stringify(engine.poolStatus().base)}`);
    await sleep(200);
  }
}

test('a bursty trace: the pool grows to the burst ahead of the next one and shrinks to zero when the template goes quiet', async (t) => {
  assert.equal(engine.poolStatus().base.target, 2, 'before any demand: the initial size');
  const first = await burst();
  assert.ok(first.hits < 15, `the first burst mostly pays the slow path (${first.hits} of 30 from the pool)`);
  assert.equal(engine.poolStatus().base.target, 30, 'the pool now holds the size of the burst');
  assert.match(engine.poolStatus().base.reason, /largest burst since the pool was last idle: 30/);
  for (const id of first.ids) await engine.delete(id);
  // Quiet: the pool refills to 30 in the background.
  await until('the pool refills to the burst', () => engine.poolStatus().base.ready >= 30, 240_000);
  const second = await burst();
  t.diagnostic(`warm hits: first burst ${first.hits} of 30, second burst ${second.hits} of 30`);
  assert.ok(second.hits >= 25, `most creates of the second burst come from the pool (${second.hits} of 30)`);
  for (const id of second.ids) {
    assert.equal((await engine.exec(id, { command: 'echo ok' })).stdout, 'ok\n');
    await engine.delete(id);
  }
  // Idle past COLLIMATE_POOL_IDLE_SECS: back to the minimum (0), the VMMs destroyed.
  await until('the pool shrinks to zero', () => engine.poolStatus().base.target === 0 && engine.poolStatus().base.ready === 0, (IDLE_SECS + 60) * 1000);
  assert.match(engine.poolStatus().base.reason, new RegExp(`no create for ${IDLE_SECS} s: shrunk to the minimum \\(0\\)`));
  // Demand again: a create still works (slow path) and the pool grows back.
  const again = await engine.create({ template: 'base' }, tenant);
  await until('the pool grows back after demand', () => engine.poolStatus().base.target >= 1, 10_000);
  await engine.delete(again.id);
});
