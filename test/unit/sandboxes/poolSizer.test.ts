import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PoolSizer, fitBudget } from '../../../src/sandboxes/poolSizer.ts';

/** A create served at once (from the pool): asked for and served at `now`. */
function create(s: PoolSizer, now: number) {
  const size = s.onTake(now);
  s.onServed(now);
  return size;
}

const bounds = { initial: 4, min: 0, max: 32, idleMs: 300_000, burstWindowMs: 10_000 };

test('before any create the pool holds its initial size; a burst grows it to the burst; it holds that while in use', () => {
  const s = new PoolSizer(bounds);
  assert.equal(s.size(0).target, 4);
  assert.match(s.size(0).reason, /initial/);
  let last = create(s, 1000);
  assert.equal(last.target, 4, 'one create does not shrink the pool it came from');
  for (let i = 1; i < 30; i++) last = create(s, 1000 + i * 66); // 30 creates in 2 s
  assert.equal(last.target, 30);
  assert.match(last.reason, /largest burst since the pool was last idle: 30 \(now: 30 creates within 10 s\)/);
  // Quiet for a minute, then single creates: the pool stays ready for the next burst.
  assert.equal(create(s, 70_000).target, 30);
  assert.equal(s.size(200_000).target, 30);
});

test('no create for the idle period: back to the minimum (zero frees the memory); demand grows it again', () => {
  const s = new PoolSizer(bounds);
  for (let i = 0; i < 8; i++) create(s, i * 100);
  assert.equal(s.size(1000).target, 8);
  assert.equal(s.size(200_000).target, 8, 'not shrunk while in use');
  const idle = s.size(700 + 300_000);
  assert.equal(idle.target, 0);
  assert.match(idle.reason, /shrunk to the minimum/);
  assert.equal(create(s, 400_000).target, 1, 'an earlier burst is forgotten after the quiet period');
});

test('a create still being served keeps the template in use: a slow-path burst outlasting the idle period does not shrink the pool', () => {
  const s = new PoolSizer({ ...bounds, idleMs: 20_000 });
  for (let i = 0; i < 30; i++) s.onTake(i * 66); // 30 creates in 2 s, each paying a restore on a loaded host
  for (let i = 0; i < 29; i++) s.onServed(10_000 + i * 1000);
  assert.equal(s.size(40_000).target, 30, 'one create is still being served 38 s after the last arrived');
  s.onServed(41_000);
  assert.equal(s.size(60_000).target, 30, 'idle counts from the last create served');
  assert.equal(s.size(61_000).target, 0, 'and then the pool shrinks');
});

test('time to refill: when making a VMM takes longer than the burst window, creates within one refill count as one burst', () => {
  const s = new PoolSizer({ ...bounds, burstWindowMs: 1000 });
  for (let i = 0; i < 6; i++) create(s, i * 600); // one create every 0.6 s
  assert.equal(s.size(3000).target, 4, 'with a 1 s window no two creates are one burst; the initial size holds');
  const slow = new PoolSizer({ ...bounds, burstWindowMs: 1000 });
  slow.onRefill(5000);
  let last = create(slow, 0);
  for (let i = 1; i < 6; i++) last = create(slow, i * 600);
  assert.equal(last.target, 6, 'a VMM takes 5 s to make, so all six arrived within one refill');
  assert.match(last.reason, /within 5 s; a VMM takes 5\.0 s to make/);
});

test('bounds: max caps a burst, min holds a floor', () => {
  const s = new PoolSizer({ ...bounds, initial: 1, max: 6, min: 2 });
  assert.equal(s.size(0).target, 2, 'the initial size is raised to the minimum');
  let last = create(s, 0);
  assert.equal(last.target, 2);
  for (let i = 1; i < 20; i++) last = create(s, i);
  assert.equal(last.target, 6);
  assert.match(last.reason, /capped at 6/);
  assert.equal(s.size(10_000_000).target, 2);
});

test('takes further apart than the burst window are not one burst', () => {
  const s = new PoolSizer({ ...bounds, initial: 0 });
  let last = create(s, 0);
  for (let i = 1; i < 10; i++) last = create(s, i * 11_000);
  assert.equal(last.target, 1);
});

test('fitBudget: within budget nothing changes; over it the largest pools give way first', () => {
  assert.deepEqual(fitBudget([4, 1, 30], 64), [4, 1, 30]);
  assert.deepEqual(fitBudget([4, 1, 30], 20), [4, 1, 15]);
  assert.deepEqual(fitBudget([10, 10], 10), [5, 5]);
  assert.deepEqual(fitBudget([3, 0], 0), [0, 0]);
});
