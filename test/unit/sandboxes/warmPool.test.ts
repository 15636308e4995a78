import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { WarmPool } from '../../../src/sandboxes/warmPool.ts';

/** Spawns numbered items; each spawn waits for `delayMs`, fails while `failing` is set. */
function spawner(opts: { delayMs?: number } = {}) {
  const s = {
    n: 0,
    inFlight: 0,
    maxInFlight: 0,
    failing: false,
    destroyed: [] as number[],
    errors: [] as unknown[],
    spawn: async (): Promise<number> => {
      s.inFlight++;
      s.maxInFlight = Math.max(s.maxInFlight, s.inFlight);
      try {
        await sleep(opts.delayMs ?? 1);
        if (s.failing) throw new Error('qemu would not start');
        return ++s.n;
      } finally {
        s.inFlight--;
      }
    },
    destroy: async (i: number) => { s.destroyed.push(i); },
    onError: (e: unknown) => { s.errors.push(e); },
  };
  return s;
}

test('WarmPool: refills to its target, at most two spawns at a time, and stops there', async () => {
  const s = spawner({ delayMs: 5 });
  const pool = new WarmPool('base', 5, s.spawn, s.destroy, s.onError);
  pool.refill();
  assert.equal(await pool.waitFull(2000), true);
  assert.equal(pool.size, 5);
  await sleep(20);
  assert.equal(s.n, 5, 'no spawn beyond the target');
  assert.equal(s.maxInFlight, 2);
  await pool.close();
});

test('WarmPool: take hands out pooled items first-in first-out and refills behind them', async () => {
  const s = spawner();
  const pool = new WarmPool('base', 2, s.spawn, s.destroy, s.onError);
  pool.refill();
  await pool.waitFull(2000);
  assert.equal(await pool.take(), 1);
  assert.equal(await pool.take(), 2);
  assert.equal(await pool.waitFull(2000), true);
  assert.equal(pool.size, 2);
  assert.equal(s.n, 4);
  await pool.close();
});

test('WarmPool: take on an empty pool spawns one on demand', async () => {
  const s = spawner();
  const pool = new WarmPool('base', 0, s.spawn, s.destroy, s.onError);
  assert.equal(await pool.take(), 1);
  assert.equal(pool.size, 0);
  assert.equal(s.n, 1);
  await pool.close();
});

test('WarmPool: a failing on-demand spawn surfaces to the taker', async () => {
  const s = spawner();
  s.failing = true;
  const pool = new WarmPool('base', 0, s.spawn, s.destroy, s.onError);
  await assert.rejects(pool.take(), /qemu would not start/);
  await pool.close();
});

test('WarmPool: a failing background spawn is reported, and the pool retries after a back-off', async () => {
  const s = spawner();
  s.failing = true;
  const pool = new WarmPool('base', 1, s.spawn, s.destroy, s.onError);
  pool.refill();
  await sleep(50);
  assert.ok(s.errors.length >= 1);
  assert.match((s.errors[0] as Error).message, /qemu would not start/);
  assert.equal(pool.size, 0);
  s.failing = false;
  assert.equal(await pool.waitFull(3000), true, 'the pool fills once spawning works again');
  await pool.close();
});

test('WarmPool: close destroys pooled items and spawns still in flight, and take fails afterwards', async () => {
  const s = spawner({ delayMs: 30 });
  const pool = new WarmPool('base', 3, s.spawn, s.destroy, s.onError);
  pool.refill();
  // Wait until two are pooled and the third is spawning.
  while (pool.size < 2) await sleep(5);
  await pool.close();
  assert.equal(pool.size, 0);
  assert.deepEqual(s.destroyed.sort(), Array.from({ length: s.n }, (_, i) => i + 1), 'every item spawned is destroyed');
  assert.equal(s.n, 3);
  await assert.rejects(pool.take(), /closed/);
  pool.refill();
  await sleep(40);
  assert.equal(s.n, 3, 'a closed pool spawns nothing');
});

test('WarmPool: setTarget grows the pool', async () => {
  const s = spawner();
  const pool = new WarmPool('base', 1, s.spawn, s.destroy, s.onError);
  pool.refill();
  await pool.waitFull(2000);
  pool.setTarget(3);
  assert.equal(pool.targetSize, 3);
  assert.equal(await pool.waitFull(2000), true);
  assert.equal(pool.size, 3);
  await pool.close();
});

test('WarmPool: a smaller target destroys the ready items beyond it, oldest first; a larger one refills', async () => {
  const s = spawner();
  const pool = new WarmPool('t', 5, s.spawn, s.destroy, s.onError);
  pool.refill();
  assert.ok(await pool.waitFull(2000));
  pool.setTarget(2);
  assert.equal(pool.size, 2);
  await sleep(5);
  assert.deepEqual(s.destroyed.sort(), [1, 2, 3]);
  pool.setTarget(0);
  assert.equal(pool.size, 0);
  pool.setTarget(3);
  assert.ok(await pool.waitFull(2000));
  assert.equal(pool.size, 3);
  await pool.close();
});
