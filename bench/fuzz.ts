// Fuzzing at volume, long form (issue 19 item 4): rounds of test/integration/fuzz.test.ts, each a
// fresh server and engine with its own seed and --requests generated requests (valid, invalid and
// hostile; see test/integration/fuzzHarness.ts), each ending with the descriptor and leak checks.
// Prints one line per round (seed, requests, seconds, result) and the failures' replay commands.
// Then every door (bench/fuzz-doors.ts): --doors requests per door (10,000; 0 skips it) of REST,
// MCP, E2B's control plane and envd, the web terminal and the ports proxy against one server.
// Usage (one VM-heavy job at a time on a shared host):
//   flock /tmp/collimate-vm.lock node --import tsx bench/fuzz.ts [--rounds 5] [--requests 20000] [--seed 1] [--doors 10000]
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { fuzzDoors } from './fuzz-doors.ts';

const argOf = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const ROUNDS = Number(argOf('rounds', '5'));
const REQUESTS = Number(argOf('requests', '20000'));
const FIRST_SEED = Number(argOf('seed', String(Math.floor(Math.random() * 2 ** 31))));
const DOOR_REQUESTS = Number(argOf('doors', '10000'));
const root = fileURLToPath(new URL('..', import.meta.url));

const failed: number[] = [];
let sent = 0;
for (let round = 0; round < ROUNDS; round++) {
  const seed = (FIRST_SEED + round) >>> 0;
  const t0 = Date.now();
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-timeout=3600000', 'test/integration/fuzz.test.ts'], {
    cwd: root,
    env: {
      ...process.env,
      FUZZ_SEED: String(seed),
      FUZZ_N: String(REQUESTS),
      COLLIMATE_CACHE_DIR: process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache',
      COLLIMATE_HOST_CPU_PRESSURE_MAX: process.env.COLLIMATE_HOST_CPU_PRESSURE_MAX ?? '0',
    },
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
  const out = r.stdout + r.stderr;
  const count = Number(/: (\d+) requests in/.exec(out)?.[1] ?? 0);
  sent += count;
  const ok = r.status === 0;
  if (!ok) failed.push(seed);
  console.log(`round ${round + 1}/${ROUNDS} seed ${seed}: ${count} requests in ${((Date.now() - t0) / 1000).toFixed(0)} s, ${ok ? 'ok' : 'FAILED'}`);
  const statuses = /statuses (\{[^}]*\}); 5xx (\{[^}]*\})/.exec(out);
  if (statuses) console.log(`  statuses ${statuses[1]} 5xx ${statuses[2]}`);
  if (!ok) console.log(out.split('\n').filter((l) => !l.startsWith('# fuzz kinds')).slice(-80).join('\n'));
}
console.log(`${ROUNDS} rounds, ${sent} requests, ${failed.length} failed${failed.length ? `: replay with FUZZ_SEED=${failed.join(', ')} FUZZ_N=${REQUESTS}` : ''}`);
const doorsOk = DOOR_REQUESTS > 0 ? fuzzDoors(DOOR_REQUESTS, (FIRST_SEED + ROUNDS) >>> 0) : true;
process.exit(failed.length || !doorsOk ? 1 : 0);
