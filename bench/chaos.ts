// The crash campaign's long form (test/chaos/campaign.ts; its short form runs in `npm test`):
// a real server SIGKILLed --kills times under a seeded three-tenant workload, the invariants
// checked after every restart. Prints the result as JSON and a markdown table for BENCHMARKS.md.
// Usage: node --import tsx bench/chaos.ts [--kills 200] [--seed N]
import { mkdtempSync, mkdirSync } from 'node:fs';
import { runCampaign } from '../test/chaos/campaign.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const kills = arg('kills', 200);
const seed = arg('seed', Date.now() % 2 ** 31);
mkdirSync('/tmp/collimate-bench', { recursive: true });
const home = mkdtempSync('/tmp/collimate-bench/chaos-');
const started = Date.now();
const r = await runCampaign({
  seed, kills, home, cacheDir: process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache',
  env: { COLLIMATE_VMM_UID_BASE: '440000', COLLIMATE_VMM_UID_COUNT: '4096' },
  log: (m) => console.error(`[chaos] ${m}`),
});
const mins = ((Date.now() - started) / 60_000).toFixed(1);
console.log(JSON.stringify(r, null, 2));
console.log([
  `| seed | kills | at fault points | at random moments | operations acknowledged | cut off | sandboxes checked | lost | orphans | integrity failures | minutes |`,
  '|---|---|---|---|---|---|---|---|---|---|---|',
  `| ${seed} | ${r.kills} | ${r.kills - (r.killedAt['random moment'] ?? 0)} | ${r.killedAt['random moment'] ?? 0} | ${Object.values(r.acknowledged).reduce((a, b) => a + b, 0)} | ${r.cutOff} | ${r.checked} | ${r.lost} | ${r.orphans} | ${r.integrityFailures} | ${mins} |`,
].join('\n'));
if (r.violations.length) {
  console.log(`\n${r.violations.length} violations:\n${r.violations.join('\n')}`);
  process.exitCode = 1;
}
