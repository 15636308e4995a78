// Slow readers, repeated (issue 31 item 5): runs test/integration/slowReaders.test.ts --runs times
// (each a fresh server and engine) and prints, per stream kind, what the server's memory grew by
// while a client read nothing: RSS after a full collection (the client still attached), the RSS peak
// on the way, and what the heap and Buffers still reference, as median and max over the runs,
// beside what the producer wrote. The bounds the test asserts: RSS_BOUND_MIB, REFERENCED_BOUND_MIB.
// Usage (one VM-heavy job at a time on a shared host):
//   flock /tmp/collimate-vm.lock node --import tsx bench/slow-readers.ts [--runs 3]
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const argOf = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const RUNS = Number(argOf('runs', '3'));
const root = fileURLToPath(new URL('..', import.meta.url));
/** The test's line per kind (`# `-prefixed as the test runner relays it): `[slow-readers] <kind>: rss +<held> MiB after <produced> MiB produced (peak +<peak> MiB, referenced +<ref> MiB)`. */
const LINE = /^\[slow-readers\] ([\w-]+): rss \+(-?[\d.]+) MiB after ([\d.]+) MiB produced \(peak \+(-?[\d.]+) MiB, referenced \+(-?[\d.]+) MiB\)$/;

const byKind = new Map<string, { held: number[]; peak: number[]; referenced: number[]; produced: number[] }>();
let failures = 0;
for (let run = 0; run < RUNS; run++) {
  const t0 = Date.now();
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-timeout=900000', 'test/integration/slowReaders.test.ts'], {
    cwd: root,
    // What the server holds is measured, not CPU admission: on a shared host a create refused for
    // another job's load (503 host_at_capacity) would stop a run before it starts (scripts/test.sh sets the same).
    env: { ...process.env, COLLIMATE_CACHE_DIR: process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache', COLLIMATE_HOST_CPU_PRESSURE_MAX: process.env.COLLIMATE_HOST_CPU_PRESSURE_MAX ?? '0' },
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
  const out = r.stdout + r.stderr;
  for (const line of out.split('\n')) {
    const m = LINE.exec(line.trim().replace(/^# /, ''));
    if (!m) continue;
    const k = byKind.get(m[1]) ?? { held: [], peak: [], referenced: [], produced: [] };
    k.held.push(Number(m[2]));
    k.produced.push(Number(m[3]));
    k.peak.push(Number(m[4]));
    k.referenced.push(Number(m[5]));
    byKind.set(m[1], k);
  }
  const ok = r.status === 0;
  if (!ok) failures++;
  console.log(`run ${run + 1}/${RUNS}: ${((Date.now() - t0) / 1000).toFixed(0)} s, ${ok ? 'ok' : 'FAILED'}`);
  if (!ok) console.log(out.split('\n').slice(-80).join('\n'));
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmt = (n: number) => n.toFixed(1).padStart(9);
const columns = ['rss med', 'rss max', 'peak med', 'peak max', 'ref med', 'ref max', 'produced'];
console.log(`\n${'kind'.padEnd(16)} runs ${columns.map((c) => c.padStart(9)).join(' ')}   (MiB)`);
for (const [kind, k] of byKind) {
  const cells = [median(k.held), Math.max(...k.held), median(k.peak), Math.max(...k.peak), median(k.referenced), Math.max(...k.referenced), median(k.produced)];
  console.log(`${kind.padEnd(16)} ${String(k.held.length).padStart(4)} ${cells.map((n) => fmt(n)).join(' ')}`);
}
process.exit(failures ? 1 : 0);
