// Every door fuzzed at volume, long form (issue 31): test/integration/doorFuzz.test.ts with
// --requests (10,000) generated requests per door — REST, MCP, E2B's control plane and envd, the web
// terminal, the ports proxy (test/integration/doorFuzz.ts) — against one real server on a real
// engine, ending with the RSS bound and the leak check. Prints per door the counts by status, any
// 5xx, and RSS at the start, peak and end of the door; then the memory line and the result.
// Usage (one VM-heavy job at a time on a shared host):
//   flock /tmp/collimate-vm.lock node --import tsx bench/fuzz-doors.ts [--requests 10000] [--seed 1] [--doors mcp,envd]
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const argOf = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};

/** Runs the door form once; resolves to whether it passed. Also called by bench/fuzz.ts. */
export function fuzzDoors(requests: number, seed: number, doors = ''): boolean {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const t0 = Date.now();
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-timeout=14400000', 'test/integration/doorFuzz.test.ts'], {
    cwd: root,
    env: {
      ...process.env,
      FUZZ_SEED: String(seed),
      FUZZ_N: String(requests),
      ...(doors ? { FUZZ_DOORS: doors } : {}),
      COLLIMATE_CACHE_DIR: process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache',
      COLLIMATE_HOST_CPU_PRESSURE_MAX: process.env.COLLIMATE_HOST_CPU_PRESSURE_MAX ?? '0',
    },
    encoding: 'utf8',
    maxBuffer: 256 * 1024 * 1024,
  });
  const out = r.stdout + r.stderr;
  const ok = r.status === 0;
  console.log(`doors, ${requests} requests each, seed ${seed}: ${((Date.now() - t0) / 1000).toFixed(0)} s, ${ok ? 'ok' : 'FAILED'}`);
  for (const line of out.split('\n')) {
    const l = line.replace(/^# /, '');
    if (/^door \w+: /.test(l) || /^door fuzz (memory|after warm-up|target)/.test(l)) console.log(`  ${l}`);
  }
  if (!ok) {
    console.log(out.split('\n').filter((l) => !/^# (rest fuzz|door \w+ kinds|\w+: \d+ requests)/.test(l)).slice(-120).join('\n'));
    console.log(`replay: FUZZ_SEED=${seed} FUZZ_N=${requests}${doors ? ` FUZZ_DOORS=${doors}` : ''} node --import tsx --test test/integration/doorFuzz.test.ts`);
  }
  return ok;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const ok = fuzzDoors(Number(argOf('requests', '10000')), Number(argOf('seed', String(Math.floor(Math.random() * 2 ** 31)))), argOf('doors', ''));
  process.exit(ok ? 0 : 1);
}
