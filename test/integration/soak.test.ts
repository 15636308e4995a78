/**
 * The soak's short form (bench/soak.ts, which runs it for an hour): `collimate serve` in a process of
 * its own, three minutes of waves from the TypeScript and Python SDKs at once (create → exec →
 * fork(4) → exec in the children → suspend some → resume → delete), the server's RSS, descriptors,
 * tmpfs, QEMU processes and database sampled every 10 s. Fails when a measure grew past its bound or
 * did not come back after the settle, when an operation failed (other than a 503 retried after its
 * Retry-After), or when the waves did no work; then the leak check on the home.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import '../../src/service/migrations.ts';
import { runSoak, checkSoak, soakTable } from '../../bench/soak.ts';
import { openEngine, assertNoLeaks } from './fixture.ts';

test('soak: three minutes of waves from both SDKs; every measure bounded and back at the end', async () => {
  const r = await runSoak({ minutes: 3, log: process.env.COLLIMATE_TEST_VERBOSE ? undefined : () => {} });
  console.log(soakTable(r));
  assert.deepEqual(checkSoak(r), []);
  assert.ok(r.counts.ts.waves >= 2 && r.counts.py.waves >= 2, 'each SDK completed waves');
  await assertNoLeaks(await openEngine(r.home, { poolSize: 0 }), r.home);
});
