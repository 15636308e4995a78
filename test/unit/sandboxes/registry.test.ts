import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { SandboxRow } from '../../../src/sandboxes/repo.ts';
import { SandboxRegistry } from '../../../src/sandboxes/registry.ts';
import { getInfo, runningFor, type EngineContext } from '../../../src/sandboxes/context.ts';
import type { LiveVm } from '../../../src/sandboxes/runtime.ts';
import { freshRepo, row } from '../../support/sandboxRows.ts';

const t = freshRepo('registry');
let registry: SandboxRegistry;
beforeEach(() => {
  registry = new SandboxRegistry(t.repo);
});

/** Just what the reads need of an engine context. */
const ctxOf = () => ({ repo: t.repo, registry }) as unknown as EngineContext;
const fakeLive = {} as LiveVm;

test('activity: reads see execs and the last use at once; the flush writes them and leaves nothing behind', () => {
  t.repo.insert(row('sbx_a', { last_active: 1000, exec_count: 2 }));
  registry.touch('sbx_a', true, 5000);
  registry.touch('sbx_a', false, 6000);
  registry.touch('sbx_a', true, 7000);
  assert.deepEqual(pick(registry.withActivity(t.repo.get('sbx_a')!)), { last_active: 7000, exec_count: 4 });
  assert.deepEqual(pick(t.repo.get('sbx_a')!), { last_active: 1000, exec_count: 2 }, 'not in the database before the flush');
  registry.flushActivity();
  assert.deepEqual(pick(t.repo.get('sbx_a')!), { last_active: 7000, exec_count: 4 });
  // Flushed activity is not counted twice.
  assert.deepEqual(pick(registry.withActivity(t.repo.get('sbx_a')!)), { last_active: 7000, exec_count: 4 });
  registry.flushActivity();
  assert.deepEqual(pick(t.repo.get('sbx_a')!), { last_active: 7000, exec_count: 4 });
});

test('activity: last_active never moves back (a resume may have written a later one meanwhile)', () => {
  t.repo.insert(row('sbx_a', { last_active: 9000 }));
  registry.touch('sbx_a', true, 5000);
  assert.equal(registry.withActivity(t.repo.get('sbx_a')!).last_active, 9000);
  registry.flushActivity();
  assert.deepEqual(pick(t.repo.get('sbx_a')!), { last_active: 9000, exec_count: 1 });
});

test('activity of a deleted sandbox is forgotten with its ports', () => {
  t.repo.insert(row('sbx_a'));
  registry.touch('sbx_a', true, 5000);
  registry.setPorts('sbx_a', [{ port: 8000, protocol: 'tcp' }]);
  registry.forget('sbx_a');
  registry.flushActivity();
  assert.deepEqual(pick(t.repo.get('sbx_a')!), { last_active: 1000, exec_count: 0 });
  assert.deepEqual(registry.portsOf('sbx_a'), []);
});

test('getInfo shows an exec the moment it ends, not a second later', () => {
  const now = Date.now();
  t.repo.insert(row('sbx_a', { created_at: now - 60_000, last_active: now - 60_000, session_started_at: now - 60_000 }));
  registry.touch('sbx_a', true);
  const info = getInfo(ctxOf(), 'sbx_a', { tenant: 't1' });
  assert.equal(info.exec_count, 1);
  assert.ok(info.idle_secs < 5, `idle ${info.idle_secs} s right after an exec`);
  assert.ok(info.age_secs >= 60);
  assert.throws(() => getInfo(ctxOf(), 'sbx_a', { tenant: 't2' }), { code: 'sandbox_not_found' });
});

test('ports: the last reading, empty before the first', () => {
  assert.deepEqual(registry.portsOf('sbx_a'), []);
  registry.setPorts('sbx_a', [{ port: 8000, protocol: 'tcp' }]);
  assert.deepEqual(registry.portsOf('sbx_a'), [{ port: 8000, protocol: 'tcp' }]);
});

test('running sandboxes: added with an empty queue, found by id, removed; runningFor refuses the others', () => {
  t.repo.insert(row('sbx_a'));
  t.repo.insert(row('sbx_s', { state: 'suspended' }));
  const r = registry.add('sbx_a', fakeLive);
  assert.equal(r.queue.depth, 0);
  assert.equal(r.deleting, false);
  assert.equal(registry.get('sbx_a'), r);
  assert.equal(runningFor(ctxOf(), 'sbx_a', undefined, 'exec'), r);
  assert.throws(() => runningFor(ctxOf(), 'sbx_s', undefined, 'exec'), { code: 'invalid_state' });
  r.deleting = true;
  assert.throws(() => runningFor(ctxOf(), 'sbx_a', undefined, 'exec'), { code: 'invalid_state' });
  registry.remove('sbx_a');
  assert.equal(registry.has('sbx_a'), false);
  assert.deepEqual(registry.all(), []);
});

test('serialized: operations on one suspended sandbox run one at a time, in order; other sandboxes do not wait', async () => {
  const log: string[] = [];
  const op = (id: string, name: string, ms: number) => registry.serialized(id, async () => {
    log.push(`start ${name}`);
    await sleep(ms);
    log.push(`end ${name}`);
  });
  // a1 holds sbx_a until sbx_b's operation has ended: no timer order to rely on (under load a 1 ms
  // timer set after a 20 ms one can fire second).
  let releaseA!: () => void;
  const held = new Promise<void>((r) => (releaseA = r));
  const a1 = registry.serialized('sbx_a', async () => {
    log.push('start a1');
    await held;
    log.push('end a1');
  });
  const a2 = op('sbx_a', 'a2', 1);
  const b1 = op('sbx_b', 'b1', 1);
  await Promise.race([b1, sleep(10_000, undefined, { ref: false }).then(() => assert.fail('sbx_b waited for sbx_a'))]);
  assert.ok(!log.includes('end a1') && !log.includes('start a2'), 'sbx_a is still held by a1');
  releaseA();
  await Promise.all([a1, a2]);
  assert.deepEqual(log.filter((l) => / a\d/.test(l)), ['start a1', 'end a1', 'start a2', 'end a2']);
});

function pick(r: SandboxRow) {
  return { last_active: r.last_active, exec_count: r.exec_count };
}
