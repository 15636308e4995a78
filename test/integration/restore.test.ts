/**
 * Restores that never hang: ≥300 guest restores — warm-pool refills, creates, fork children and
 * resumes — while two guests run busy loops on the host's cores, and not one restored guest may fail
 * to acknowledge (each would be an 8 s stall and a fresh VMM). The long form is
 * bench/restore-stress.ts (3,000 restores).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { restoreCounts, restoreEvents, type RestoreUnacknowledgedError } from '../../src/sandboxes/runtime.ts';
import { assertNoLeaks, openEngine, testHome } from './fixture.ts';

const RESTORES = 300;
const tenant = { tenant: 'restore-stress' };
let engine: Engine;
let home: string;

before(async () => {
  home = testHome('restore');
  engine = await openEngine(home, { catalog: ['base'], poolSize: 2 });
});
after(async () => {
  await assertNoLeaks(engine, home);
});

test(`${RESTORES} restores under two busy guests: every restored guest acknowledges`, async () => {
  const silent: string[] = [];
  const onSilent = (e: RestoreUnacknowledgedError) => silent.push(e.diagnostics ?? e.message);
  restoreEvents.on('unacknowledged', onSilent);
  try {
    for (let i = 0; i < 2; i++) {
      const busy = await engine.create({ template: 'base' }, tenant);
      await engine.exec(busy.id, { command: '(while :; do :; done) >/dev/null 2>&1 &' }, tenant);
    }
    const start = restoreCounts.acknowledged + restoreCounts.unacknowledged;
    let round = 0;
    while (restoreCounts.acknowledged + restoreCounts.unacknowledged - start < RESTORES) {
      round++;
      const s = await engine.create({ template: 'base' }, tenant);
      assert.equal((await engine.exec(s.id, { command: 'echo $((6*7)) > /root/x; cat /root/x' }, tenant)).stdout, '42\n');
      const kids = await engine.fork(s.id, { count: 2 }, tenant);
      for (const k of kids) assert.equal((await engine.exec(k.id, { command: 'cat /root/x' }, tenant)).stdout, '42\n');
      if (round % 3 === 0) {
        await engine.suspend(s.id, tenant);
        await engine.resume(s.id, tenant);
        assert.equal((await engine.exec(s.id, { command: 'cat /root/x' }, tenant)).stdout, '42\n');
      }
      for (const k of kids) await engine.delete(k.id, tenant);
      await engine.delete(s.id, tenant);
    }
    assert.deepEqual(silent, [], `${silent.length} restored guests never acknowledged; their state:\n${silent.join('\n\n')}`);
  } finally {
    restoreEvents.off('unacknowledged', onSilent);
  }
});
