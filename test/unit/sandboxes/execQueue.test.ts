import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { ExecQueue } from '../../../src/sandboxes/execQueue.ts';

test('ExecQueue: operations run one at a time, in the order they were queued, each with its own result', async () => {
  const q = new ExecQueue();
  const log: string[] = [];
  let running = 0;
  const op = (name: string, ms: number) => q.run(async () => {
    running++;
    assert.equal(running, 1, `${name} overlapped another operation`);
    log.push(`start ${name}`);
    await sleep(ms);
    log.push(`end ${name}`);
    running--;
    return name.toUpperCase();
  });
  // The first is the slowest: a later, quicker one must still wait for it.
  const results = await Promise.all([op('a', 20), op('b', 1), op('c', 5)]);
  assert.deepEqual(results, ['A', 'B', 'C']);
  assert.deepEqual(log, ['start a', 'end a', 'start b', 'end b', 'start c', 'end c']);
});

test('ExecQueue: a failing operation rejects its caller and does not block the next', async () => {
  const q = new ExecQueue();
  const failed = q.run(async () => { throw new Error('agent gone'); });
  const next = q.run(async () => 'ran');
  await assert.rejects(failed, /agent gone/);
  assert.equal(await next, 'ran');
});

test('ExecQueue: depth counts queued and running operations', async () => {
  const q = new ExecQueue();
  assert.equal(q.depth, 0);
  let release!: () => void;
  const first = q.run(() => new Promise<void>((r) => { release = r; }));
  const second = q.run(async () => { throw new Error('x'); });
  assert.equal(q.depth, 2);
  await sleep(1);
  release();
  await first;
  await second.catch(() => {});
  await q.drain();
  assert.equal(q.depth, 0);
});

test('ExecQueue: drain waits for everything queued so far, and resolves even when the last one failed', async () => {
  const q = new ExecQueue();
  const done: string[] = [];
  void q.run(async () => { await sleep(10); done.push('a'); });
  q.run(async () => { await sleep(5); done.push('b'); throw new Error('b failed'); }).catch(() => {});
  await q.drain();
  assert.deepEqual(done, ['a', 'b']);
  assert.equal(q.depth, 0);
});
