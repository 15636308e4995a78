// Snapshot benchmark (issue 32), in one run beside the fork figures it is judged against:
//   snapshot of a 512 MiB sandbox with ~100 MB of dirtied memory and a running process, against
//   fork(1) of the same sandbox (target: within 1.2×); a start of one sandbox from a snapshot
//   started from often (its warm pool formed) against a warm create from the template (target:
//   within 1.5×), and the first start from a new snapshot beside it; a rollback of the sandbox to
//   a snapshot used often (target ≤ 300 ms), and to one without a pool beside it; and fork(16) beside a 16-wide start from a snapshot, with the
//   CPU the children's VMMs spend from claim to acknowledgement (target ≤ 50 ms per child).
// Runs alternate the measures, so load on the host falls on all of them alike.
// Usage: COLLIMATE_CACHE_DIR=/var/tmp/collimate-test-cache COLLIMATE_HOST_CPU_PRESSURE_MAX=0 node --import tsx bench/snapshots.ts [--runs 10] [--wide-runs 5] [--rollback-only]
//   --rollback-only: each run measures the two rollbacks alone (a new snapshot still taken for the one
//   without a pool), no wide runs: a few minutes instead of ~8 when the rollback is what changed.
import { rmSync } from 'node:fs';
import { loadavg } from 'node:os';
import { Engine } from '../src/sandboxes/engine.ts';
import { summary, fmt, phaseTable, timed } from './stats.ts';
import type { PhaseReport } from '../src/sandboxes/phases.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const RUNS = arg('runs', 10);
const ROLLBACK_ONLY = process.argv.includes('--rollback-only');
const WIDE_RUNS = ROLLBACK_ONLY ? 0 : arg('wide-runs', 5);
const home = `/tmp/clm-bsnap-${process.pid}`;
const tenant = { tenant: 'bench' };
const log = (m: string) => console.error(`[bench] ${m}`);
const loadAtStart = loadavg()[0];
const startedAt = new Date().toISOString();

const engine = await Engine.open({
  home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 2, catalog: ['base'], catalogMemoryMib: 512, progress: log,
});
let measuring = '';
const phaseReports = new Map<string, PhaseReport[]>();
engine.on('phases', (r: PhaseReport) => {
  if (!measuring) return;
  const list = phaseReports.get(measuring) ?? [];
  list.push(r);
  phaseReports.set(measuring, list);
});
const sh = async (id: string, command: string) => {
  const r = await engine.exec(id, { command, timeout: 600 }, tenant);
  if (r.exit_code !== 0) throw new Error(`${command}: ${r.stderr}`);
  return r.stdout;
};

/** Nothing left running in the background (receiver and warm pools full, spare seeds made) when a measure starts. */
async function settle(id: string, n: number): Promise<void> {
  const key = engine.repo.get(id)?.vmm?.artifactKey;
  const deadline = Date.now() + 120_000;
  if (key) {
    const want = () => Math.min(n, engine.forkReceiverSizes()[key]?.target ?? 0);
    while ((engine.forkReceiverSizes()[key]?.ready ?? 0) < want() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  }
  const pools = () => Object.values(engine.poolStatus());
  while (pools().some((p) => p.ready < p.target) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  await engine.settled();
}

async function measure<T>(what: string, fn: () => Promise<T>): Promise<[number, T]> {
  measuring = what;
  try {
    return await timed(fn);
  } finally {
    measuring = '';
  }
}

log('parent: 512 MiB guest, dirtying ~100 MB, a process running');
const parent = (await engine.create({ template: 'base' }, tenant)).id;
await sh(parent, 'dd if=/dev/urandom of=/dev/shm/dirty bs=1M count=100 2>/dev/null; sync');
await sh(parent, '(i=0; while true; do i=$((i+1)); echo $i > /root/counter.new; mv /root/counter.new /root/counter; sleep 1; done) >/dev/null 2>&1 &');

// A snapshot started from often: started twice ahead, so its warm pool is formed as it is for a template.
const hot = await engine.createSnapshot(parent, { name: 'hot' }, tenant);
for (let i = 0; i < 2; i++) for (const k of await engine.startFromSnapshot(hot.id, { count: 1 }, tenant)) await engine.delete(k.id, tenant);

const ms = { fork1: [] as number[], snapshot: [] as number[], create: [] as number[], start1: [] as number[], firstStart: [] as number[], rollback: [] as number[], firstRollback: [] as number[] };
let sizes: number[] = [];
for (let r = 0; r < RUNS; r++) {
  let [f, s, c, st, fs] = [NaN, NaN, NaN, NaN, NaN];
  if (!ROLLBACK_ONLY) {
    await settle(parent, 1);
    const [ff, kids] = await measure('fork(1)', () => engine.fork(parent, { count: 1 }, tenant));
    ms.fork1.push(f = ff);
    for (const k of kids) await engine.delete(k.id, tenant);
  }

  await settle(parent, 1);
  const [ss, snap] = await measure(ROLLBACK_ONLY ? '' : 'snapshot', () => engine.createSnapshot(parent, { name: `run-${r}` }, tenant));
  if (!ROLLBACK_ONLY) ms.snapshot.push(s = ss);
  sizes.push(snap.size_bytes);

  if (!ROLLBACK_ONLY) {
    await settle(parent, 1);
    const [cc, created] = await measure('create', () => engine.create({ template: 'base' }, tenant));
    ms.create.push(c = cc);
    await engine.delete(created.id, tenant);

    await settle(parent, 1);
    const [sst, started] = await measure('start from a snapshot (1)', () => engine.startFromSnapshot(hot.id, { count: 1 }, tenant));
    ms.start1.push(st = sst);
    if ((await sh(started[0].id, 'test -s /dev/shm/dirty && echo ok')).trim() !== 'ok') throw new Error('a sandbox from the snapshot lost its memory');
    for (const k of started) await engine.delete(k.id, tenant);

    await settle(parent, 1);
    const [ffs, first] = await measure('first start from a new snapshot (1)', () => engine.startFromSnapshot(snap.id, { count: 1 }, tenant));
    ms.firstStart.push(fs = ffs);
    for (const k of first) await engine.delete(k.id, tenant);
  }

  await settle(parent, 1);
  const [frb] = await measure('rollback to a snapshot without a pool', () => engine.restore(parent, snap.id, tenant));
  ms.firstRollback.push(frb);
  engine.deleteSnapshot(snap.id, tenant);

  await settle(parent, 1);
  const [rb] = await measure('rollback', () => engine.restore(parent, hot.id, tenant));
  ms.rollback.push(rb);
  log(`run ${r + 1}: ${ROLLBACK_ONLY ? '' : `fork(1) ${fmt(f)}, snapshot ${fmt(s)}, create ${fmt(c)}, start(1) ${fmt(st)}, first start(1) ${fmt(fs)}, `}rollback ${fmt(rb)}, without a pool ${fmt(frb)} ms`);
}

const wide = { fork16: [] as number[], start16: [] as number[] };
const wideSnap = WIDE_RUNS > 0 ? await engine.createSnapshot(parent, { name: 'wide' }, tenant) : undefined;
// Started from twice ahead as well: a 16-wide start then finds its pool (up to COLLIMATE_POOL_MAX and the pools' memory budget).
if (wideSnap) for (let i = 0; i < 2; i++) for (const k of await engine.startFromSnapshot(wideSnap.id, { count: 16 }, tenant)) await engine.delete(k.id, tenant);
for (let r = 0; wideSnap && r < WIDE_RUNS; r++) {
  await settle(parent, 16);
  const [f, kids] = await measure('fork(16)', () => engine.fork(parent, { count: 16 }, tenant));
  wide.fork16.push(f);
  for (const k of kids) await engine.delete(k.id, tenant);
  await settle(parent, 16);
  const [s, started] = await measure('start from a snapshot (16)', () => engine.startFromSnapshot(wideSnap.id, { count: 16 }, tenant));
  wide.start16.push(s);
  for (const k of started) await engine.delete(k.id, tenant);
  log(`wide run ${r + 1}: fork(16) ${fmt(f)}, start(16) ${fmt(s)} ms`);
}

await engine.deleteAll();
await engine.close();
rmSync(home, { recursive: true, force: true });

const S = Object.fromEntries(Object.entries({ ...ms, ...wide }).map(([k, v]) => [k, summary(v)])) as Record<keyof typeof ms | keyof typeof wide, ReturnType<typeof summary>>;
const ratio = (a: number[], b: number[]) => summary(a.map((x, i) => x / b[i]));
const snapVsFork = ratio(ms.snapshot, ms.fork1);
const startVsCreate = ratio(ms.start1, ms.create);
const cpuPerChild = (what: string, n: number) => {
  const v = (phaseReports.get(what) ?? []).map((r) => r.cpuMs?.children_vmm).filter((x): x is number => x !== undefined);
  return v.length ? `${fmt(summary(v).p50 / n)} ms (p50 ${fmt(summary(v).p50)} ms over ${n} children)` : 'n/a';
};
console.log([
  `## Snapshots — \`bench/snapshots.ts --runs ${RUNS} ${ROLLBACK_ONLY ? '--rollback-only' : `--wide-runs ${WIDE_RUNS}`}\` (accel ${engine.cfg.accel.accel}; ${startedAt}; load average ${loadAtStart.toFixed(1)} at the start, ${loadavg()[0].toFixed(1)} at the end)`,
  '',
  '512 MiB guest with ~100 MB dirtied and a process running; the measures alternate within each run. Ratios are per run, then the median.',
  '',
  '| measure | n | p50 | p99 |', '|---|---|---|---|',
  ...(ROLLBACK_ONLY ? [] : [
  `| fork(1): request → child running | ${S.fork1.n} | ${fmt(S.fork1.p50)} ms | ${fmt(S.fork1.p99)} ms |`,
  `| snapshot (sandbox runs on) | ${S.snapshot.n} | ${fmt(S.snapshot.p50)} ms | ${fmt(S.snapshot.p99)} ms |`,
  `| **snapshot / fork(1)** (target ≤ 1.2×) | | **${snapVsFork.p50.toFixed(2)}×** | ${snapVsFork.p99.toFixed(2)}× |`,
  `| warm create from the template | ${S.create.n} | ${fmt(S.create.p50)} ms | ${fmt(S.create.p99)} ms |`,
  `| start of 1 from a snapshot started from often (its warm pool) | ${S.start1.n} | ${fmt(S.start1.p50)} ms | ${fmt(S.start1.p99)} ms |`,
  `| first start of 1 from a new snapshot (restored on the spot) | ${S.firstStart.n} | ${fmt(S.firstStart.p50)} ms | ${fmt(S.firstStart.p99)} ms |`,
  `| **start from a snapshot / warm create** (target ≤ 1.5×) | | **${startVsCreate.p50.toFixed(2)}×** | ${startVsCreate.p99.toFixed(2)}× |`,
  ]),
  `| **rollback in place** to a snapshot used often (its warm pool) (target ≤ 300 ms) | ${S.rollback.n} | **${fmt(S.rollback.p50)} ms** | ${fmt(S.rollback.p99)} ms |`,
  `| rollback in place to a snapshot without a pool (resumed on the spot) | ${S.firstRollback.n} | ${fmt(S.firstRollback.p50)} ms | ${fmt(S.firstRollback.p99)} ms |`,
  ...(ROLLBACK_ONLY ? [] : [
  `| fork(16) | ${S.fork16.n} | ${fmt(S.fork16.p50)} ms | ${fmt(S.fork16.p99)} ms |`,
  `| start of 16 from a snapshot started from often | ${S.start16.n} | ${fmt(S.start16.p50)} ms | ${fmt(S.start16.p99)} ms |`,
  '',
  `Snapshot size on disk (p50): ${fmt(summary(sizes).p50 / 1024 / 1024)} MiB. CPU of the children's VMMs, claim → acknowledgement, per child: fork(16) ${cpuPerChild('fork(16)', 16)}; start of 16 from a snapshot ${cpuPerChild('start from a snapshot (16)', 16)} (target ≤ 50 ms).`,
  ]),
  '',
  'Phases (p50 / p99 ms, src/sandboxes/phases.ts; "CPU:" rows are CPU time summed over the operation):', '',
  ...phaseTable(phaseReports),
].join('\n'));
