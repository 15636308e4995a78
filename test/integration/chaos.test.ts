/**
 * The crash campaign's short form (test/chaos/campaign.ts): a real server on one home, SIGKILLed
 * six times under a seeded three-tenant workload, at fault points and at random moments; after
 * each restart nothing acknowledged is lost, nothing unacknowledged half-exists, nothing is left
 * on the host that no row accounts for, and the database is intact. The long form, with the
 * seed and counts in BENCHMARKS.md, is bench/chaos.ts. COLLIMATE_CHAOS_SEED replays a seed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runCampaign, COVERED_OPS } from '../chaos/campaign.ts';
import { TEST_CACHE, testHome, qemuProcesses } from './fixture.ts';

test('crash campaign (short form): 6 kills of the server under a seeded workload; nothing lost, no orphans, the database intact', async () => {
  const seed = Number(process.env.COLLIMATE_CHAOS_SEED ?? 20261203);
  const home = testHome('chaos');
  const r = await runCampaign({
    seed, kills: 6, home, cacheDir: TEST_CACHE,
    // VMM uids of its own, so that its claim check sees only its own server's.
    env: { COLLIMATE_VMM_UID_BASE: '430000', COLLIMATE_VMM_UID_COUNT: '4096' },
    log: process.env.COLLIMATE_TEST_VERBOSE ? (m) => console.error(`[chaos] ${m}`) : undefined,
  });
  console.error(`[chaos] seed ${seed}: ${JSON.stringify(r)}`);
  assert.deepEqual(r.violations, [], `seed ${seed}`);
  assert.equal(r.kills, 6);
  assert.equal(r.lost + r.orphans + r.integrityFailures, 0);
  // The campaign did work: sandboxes were made, forked, suspended and checked across restarts.
  for (const op of COVERED_OPS) assert.ok((r.acknowledged[op] ?? 0) > 0, `no ${op} was acknowledged: ${JSON.stringify(r.acknowledged)}`);
  assert.ok(r.checked > 0);
  assert.deepEqual(qemuProcesses(home), [], 'QEMU processes left running');
});
