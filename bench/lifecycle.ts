// Lifecycle benchmark (issue: live fork, suspend/resume). In one run:
//   fork latency (request → all N children running) for N = 1, 4, 16 from a 512 MiB sandbox with
//   ~100 MB of dirtied memory, with the template's fork receivers ready (forkReceivers.ts); fork(1)
//   by migration and with children spawned at fork time as baselines, and of a 2 GiB guest with the
//   same dirty set; the memory each child adds before it writes; the replay tax (reaching
//   a 20-step episode's state by replaying it in a fresh sandbox vs forking it); suspend and resume.
// Usage: node --import tsx bench/lifecycle.ts [--runs 5] [--suspend-resume-only]
//   --suspend-resume-only: only the suspend / resume runs and their phases (minutes less), and
//   after them the same with keep_memory false (only the files kept; the resume boots afresh).
import { readFileSync, rmSync } from 'node:fs';
import { Engine } from '../src/sandboxes/engine.ts';
import { summary, fmt, phaseTable, timed, pssMiB, rssMiB } from './stats.ts';
import type { PhaseReport } from '../src/sandboxes/phases.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const RUNS = arg('runs', 5);
const home = `/tmp/collimate-bench-lifecycle-${process.pid}`;
const tenant = { tenant: 'bench' };
const read = (p: string) => readFileSync(p, 'utf8');
const log = (m: string) => console.error(`[bench] ${m}`);

const engine = await Engine.open({
  home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 2, catalog: ['base'], catalogMemoryMib: 512, progress: log,
});
const pid = (id: string) => engine.repo.get(id)!.vmm!.pid;
// Every operation's phases (src/sandboxes/phases.ts), filed under what the bench is measuring now.
let measuring = '';
const phaseReports = new Map<string, PhaseReport[]>();
engine.on('phases', (r: PhaseReport) => {
  if (!measuring) return;
  const list = phaseReports.get(measuring) ?? [];
  list.push(r);
  phaseReports.set(measuring, list);
});
const sh = async (id: string, command: string) => {
  const r = await engine.exec(id, { command, timeout: 600 });
  if (r.exit_code !== 0) throw new Error(`${command}: ${r.stderr}`);
  return r.stdout;
};

/** PSS of the guest-RAM mapping alone (the memory-backend file), from smaps. */
function guestRamPssMiB(p: number, memPath: string): number {
  const smaps = read(`/proc/${p}/smaps`);
  let total = 0;
  let inRam = false;
  for (const line of smaps.split('\n')) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) inRam = line.includes(memPath);
    else if (inRam && line.startsWith('Pss:')) total += Number(line.split(/\s+/)[1]);
  }
  return total / 1024;
}

/** A sandbox with ~100 MB of its memory dirtied and a process running. */
async function dirtyParent(eng: Engine): Promise<string> {
  const p = await eng.create({ template: 'base' }, tenant);
  const run = async (command: string) => {
    const r = await eng.exec(p.id, { command, timeout: 600 });
    if (r.exit_code !== 0) throw new Error(`${command}: ${r.stderr}`);
  };
  await run('dd if=/dev/urandom of=/dev/shm/dirty bs=1M count=100 2>/dev/null; sync');
  await run('(i=0; while true; do i=$((i+1)); echo $i > /root/counter.new; mv /root/counter.new /root/counter; sleep 1; done) >/dev/null 2>&1 &');
  return p.id;
}

/**
 * Waits until `eng` holds `n` VMMs spawned ahead of forks of `id`'s template (forkReceivers.ts; the
 * pool follows the largest recent fork, refilled one at a time after each): the fork measured next
 * is one of a template whose sandboxes fork steadily.
 */
async function receiversReady(eng: Engine, id: string, n: number): Promise<void> {
  const key = eng.repo.get(id)!.vmm!.artifactKey;
  const want = Math.min(n, eng.forkReceiverSizes()[key]?.target ?? 0);
  const deadline = Date.now() + 120_000;
  while ((eng.forkReceiverSizes()[key]?.ready ?? 0) < want && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
}

/**
 * Nothing left running in the background of either engine (spare copies of backing files made,
 * receiver pools full) when a fork is measured: a fork that follows another at once pays for the
 * first one's background work too.
 */
async function settle(n: number): Promise<void> {
  await receiversReady(engine, parent.id, n);
  await engine.settled();
  await big.settled();
}

/** Runs `fn` with the engine's fork receivers off: every child is spawned at fork time. */
async function withoutReceivers<T>(eng: Engine, fn: () => Promise<T>): Promise<T> {
  const max = eng.cfg.forkPoolMax;
  eng.cfg.forkPoolMax = 0;
  try {
    return await fn();
  } finally {
    eng.cfg.forkPoolMax = max;
  }
}

log('parent: 512 MiB guest, dirtying ~100 MB');
const parent = await dirtyParent(engine).then((id) => ({ id }));
const parentRss = rssMiB(pid(parent.id), read);
if (process.argv.includes('--suspend-resume-only')) {
  const { suspendMs, resumeMs } = await suspendResumeRuns();
  // Afterwards: a files-only resume boots afresh, so the dirtied memory is gone from then on.
  const files = await suspendResumeRuns(false);
  await engine.deleteAll();
  await engine.close();
  rmSync(home, { recursive: true, force: true });
  const [su, re, fsu, fre] = [summary(suspendMs), summary(resumeMs), summary(files.suspendMs), summary(files.resumeMs)];
  console.log([
    `## Suspend / resume (accel ${engine.cfg.accel.accel}; 512 MiB guest with ~100 MB dirtied)`, '',
    '| measure | n | p50 | p99 |', '|---|---|---|---|',
    `| suspend | ${su.n} | ${fmt(su.p50)} ms | ${fmt(su.p99)} ms |`,
    `| resume | ${re.n} | ${fmt(re.p50)} ms | ${fmt(re.p99)} ms |`,
    `| suspend, files only (keep_memory false) | ${fsu.n} | ${fmt(fsu.p50)} ms | ${fmt(fsu.p99)} ms |`,
    `| resume of it (a boot) | ${fre.n} | ${fmt(fre.p50)} ms | ${fmt(fre.p99)} ms |`,
    `| **files-only suspend / suspend (p50)** | | ${(fsu.p50 / su.p50).toFixed(2)}× | |`,
    `| **its resume / resume (p50)** | | ${(fre.p50 / re.p50).toFixed(2)}× | |`, '',
    ...phaseTable(phaseReports),
  ].join('\n'));
  process.exit(0);
}
// The same dirty set in a 2 GiB guest (its own engine: the catalog's guest size is per engine).
log('parent: 2 GiB guest, dirtying ~100 MB');
const big = await Engine.open({
  home: `${home}-2g`, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 1, catalog: ['base'], catalogMemoryMib: 2048, progress: log,
});
const bigParent = await dirtyParent(big);
big.on('phases', (r: PhaseReport) => {
  if (r.op !== 'fork') return;
  const list = phaseReports.get('fork(1), 2 GiB guest') ?? [];
  list.push(r);
  phaseReports.set('fork(1), 2 GiB guest', list);
});
// One fork of each template first: its receivers are asked for by a fork.
for (const [eng, id] of [[engine, parent.id], [big, bigParent]] as const) {
  for (const k of await eng.fork(id, { count: 1 })) await eng.delete(k.id);
}

const forkMs: Record<number, number[]> = { 1: [], 4: [], 16: [] };
let childPss: number[] = [];
let childRamPss: number[] = [];
// fork(1) by migration (the earlier path, COLLIMATE_FORK_CAPTURE=migrate, children spawned at fork
// time), fork(1) by page copy with children spawned at fork time, and fork(1) of the 2 GiB guest,
// interleaved with the fork(1) runs: the baselines and the size comparison, in the same run.
const forkMigrateMs: number[] = [];
const forkSpawnedMs: number[] = [];
const forkBigMs: number[] = [];
for (const n of [1, 4, 16]) {
  // Unmeasured: the template's sandboxes have forked this wide before (the pool follows the largest recent fork).
  if (n > 1) for (const k of await engine.fork(parent.id, { count: n })) await engine.delete(k.id);
  for (let r = 0; r < (n === 16 ? Math.max(3, Math.ceil(RUNS / 2)) : RUNS); r++) {
    if (n === 1) {
      await settle(1);
      engine.cfg.forkCapture = 'migrate';
      measuring = 'fork(1) by migration';
      const [mms, mkids] = await withoutReceivers(engine, () => timed(() => engine.fork(parent.id, { count: 1 })));
      engine.cfg.forkCapture = 'pages';
      forkMigrateMs.push(mms);
      log(`fork(1) by migration run ${r + 1}: ${fmt(mms)} ms`);
      for (const k of mkids) await engine.delete(k.id);
      await settle(1);
      measuring = 'fork(1), children spawned at fork time';
      const [sms, skids] = await withoutReceivers(engine, () => timed(() => engine.fork(parent.id, { count: 1 })));
      forkSpawnedMs.push(sms);
      log(`fork(1) spawned at fork time run ${r + 1}: ${fmt(sms)} ms`);
      for (const k of skids) await engine.delete(k.id);
      measuring = '';
      await settle(1);
      const [bms, bkids] = await timed(() => big.fork(bigParent, { count: 1 }));
      forkBigMs.push(bms);
      log(`fork(1) of the 2 GiB guest run ${r + 1}: ${fmt(bms)} ms`);
      for (const k of bkids) await big.delete(k.id);
    }
    await settle(n);
    measuring = `fork(${n})`;
    const [ms, kids] = await timed(() => engine.fork(parent.id, { count: n }));
    measuring = '';
    forkMs[n].push(ms);
    log(`fork(${n}) run ${r + 1}: ${fmt(ms)} ms`);
    if (n === 4 && r === 0) {
      await new Promise((res) => setTimeout(res, 3000));
      childPss = kids.map((k) => pssMiB(pid(k.id), read));
      childRamPss = kids.map((k) => guestRamPssMiB(pid(k.id), engine.repo.get(k.id)!.vmm!.memPath));
    }
    for (const k of kids) await engine.delete(k.id);
  }
}

log('replay tax: a 20-step episode, each step about 1 s of guest CPU work (a tool call, a test run)');
const episode = await engine.create({ template: 'base' }, tenant);
// Calibrate the loop so a step costs ~1 s here, whatever the accelerator.
const probe = await engine.exec(episode.id, { command: 'i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done' });
const iters = Math.max(1000, Math.round((5000 * 1000) / Math.max(1, probe.timing.run_ms)));
const STEP = `i=0; while [ $i -lt ${iters} ]; do i=$((i+1)); done; echo step >> /root/episode`;
for (let s = 0; s < 20; s++) await sh(episode.id, STEP);
const replayMs: number[] = [];
const forkReplayMs: number[] = [];
for (let r = 0; r < Math.max(3, Math.ceil(RUNS / 2)); r++) {
  const [ms, id] = await timed(async () => {
    const fresh = await engine.create({ template: 'base' }, tenant);
    for (let s = 0; s < 20; s++) await sh(fresh.id, STEP);
    return fresh.id;
  });
  replayMs.push(ms);
  await engine.delete(id);
  const [fms, kids] = await timed(() => engine.fork(episode.id, { count: 1 }));
  forkReplayMs.push(fms);
  if ((await sh(kids[0].id, 'wc -l < /root/episode')).trim() !== '20') throw new Error('forked episode lost its state');
  await engine.delete(kids[0].id);
}

const { suspendMs, resumeMs } = await suspendResumeRuns();

await big.deleteAll();
await big.close();
rmSync(`${home}-2g`, { recursive: true, force: true });
await engine.deleteAll();
await engine.close();
rmSync(home, { recursive: true, force: true });

const f1 = summary(forkMs[1]);
const fm = summary(forkMigrateMs);
const fs = summary(forkSpawnedMs);
const fb = summary(forkBigMs);
const f4 = summary(forkMs[4]);
const f16 = summary(forkMs[16]);
const rp = summary(replayMs);
const fr = summary(forkReplayMs);
const su = summary(suspendMs);
const re = summary(resumeMs);
const cp = summary(childPss);
const cr = summary(childRamPss);
console.log([
  `## Lifecycle (accel ${engine.cfg.accel.accel}; 512 MiB guest with ~100 MB dirtied; parent RSS ${parentRss.toFixed(0)} MiB)`,
  '',
  '| measure | n | p50 | p99 |',
  '|---|---|---|---|',
  `| fork(1): request → child running | ${f1.n} | ${fmt(f1.p50)} ms | ${fmt(f1.p99)} ms |`,
  `| fork(1) by migration (COLLIMATE_FORK_CAPTURE=migrate), same run | ${fm.n} | ${fmt(fm.p50)} ms | ${fmt(fm.p99)} ms |`,
  `| **fork(1) by migration / by page copy (p50)** | | **${(fm.p50 / f1.p50).toFixed(1)}×** | |`,
  `| fork(1), children spawned at fork time (no receivers), same run | ${fs.n} | ${fmt(fs.p50)} ms | ${fmt(fs.p99)} ms |`,
  `| fork(1) of a 2 GiB guest, same dirty set, same run | ${fb.n} | ${fmt(fb.p50)} ms | ${fmt(fb.p99)} ms |`,
  `| **2 GiB / 512 MiB fork(1) (p50)** | | **${(fb.p50 / f1.p50).toFixed(2)}×** | |`,
  `| fork(4) | ${f4.n} | ${fmt(f4.p50)} ms | ${fmt(f4.p99)} ms |`,
  `| fork(16) | ${f16.n} | ${fmt(f16.p50)} ms | ${fmt(f16.p99)} ms |`,
  `| **fork(16) / fork(1) (p50)** | | **${(f16.p50 / f1.p50).toFixed(2)}×** | |`,
  `| child PSS, whole QEMU process, before it writes | ${cp.n} | ${cp.p50.toFixed(1)} MiB (${((cp.p50 / parentRss) * 100).toFixed(1)} % of parent RSS) | ${cp.p99.toFixed(1)} MiB |`,
  `| child PSS of its guest-RAM mapping only | ${cr.n} | ${cr.p50.toFixed(1)} MiB (${((cr.p50 / parentRss) * 100).toFixed(1)} %) | ${cr.p99.toFixed(1)} MiB |`,
  `| replay a 20-step episode (~1 s per step) in a fresh sandbox | ${rp.n} | ${fmt(rp.p50)} ms | ${fmt(rp.p99)} ms |`,
  `| fork the episode instead | ${fr.n} | ${fmt(fr.p50)} ms | ${fmt(fr.p99)} ms |`,
  `| **replay / fork (p50)** | | **${(rp.p50 / fr.p50).toFixed(1)}×** | |`,
  `| suspend (512 MiB, ~100 MB dirty) | ${su.n} | ${fmt(su.p50)} ms | ${fmt(su.p99)} ms |`,
  `| resume | ${re.n} | ${fmt(re.p50)} ms | ${fmt(re.p99)} ms |`,
  '',
  'Phases (p50 / p99 ms, src/sandboxes/phases.ts; children restored in parallel record the slowest; "CPU:" rows are CPU time summed over the operation):',
  '',
  ...phaseTable(phaseReports),
].join('\n'));

async function suspendResumeRuns(keepMemory = true): Promise<{ suspendMs: number[]; resumeMs: number[] }> {
  log(`suspend / resume of the 512 MiB sandbox${keepMemory ? '' : ', keeping only its files'}`);
  const suspendMs: number[] = [];
  const resumeMs: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    measuring = keepMemory ? 'suspend' : 'suspend (files only)';
    suspendMs.push((await timed(() => engine.suspend(parent.id, undefined, { keepMemory })))[0]);
    measuring = keepMemory ? 'resume' : 'resume (boot)';
    resumeMs.push((await timed(() => engine.resume(parent.id)))[0]);
    measuring = '';
  }
  return { suspendMs, resumeMs };
}
