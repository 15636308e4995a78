// Where a fork child's CPU goes (issue 32's ≤ 50 ms per child): fork(16) of a 512 MiB sandbox with
// ~100 MB dirtied, `runs` times, the last under `perf record -a`; then the QEMU processes' samples
// by function: TCG's translation (named translator functions, and the unnamed static ones of
// Debian's stripped binary, among them TCG's x86 front end and back end), the guest's own
// translated code ([JIT]), the kernel and the rest. Needs perf; run as root.
// Usage: COLLIMATE_CACHE_DIR=/var/tmp/collimate-test-cache COLLIMATE_HOST_CPU_PRESSURE_MAX=0 node --import tsx bench/fork-profile.ts [--runs 10]
import { spawn, execFileSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { loadavg } from 'node:os';
import { Engine } from '../src/sandboxes/engine.ts';
import type { PhaseReport } from '../src/sandboxes/phases.ts';
import { summary, fmt } from './stats.ts';

const i = process.argv.indexOf('--runs');
const RUNS = i > 0 ? Number(process.argv[i + 1]) : 10;
const home = `/tmp/clm-forkprofile-${process.pid}`;
const data = `/tmp/clm-forkprofile-${process.pid}.perf`;
const tenant = { tenant: 'bench' };
const loadAtStart = loadavg()[0];
const startedAt = new Date().toISOString();

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 2, catalog: ['base'], catalogMemoryMib: 512 });
let reports: PhaseReport[] = [];
engine.on('phases', (r: PhaseReport) => reports.push(r));
const perChild: number[] = [];
try {
  const parent = (await engine.create({ template: 'base' }, tenant)).id;
  await engine.exec(parent, { command: 'dd if=/dev/urandom of=/dev/shm/dirty bs=1M count=100 2>/dev/null; sync', timeout: 600 }, tenant);
  for (let r = 0; r < RUNS; r++) {
    await engine.settled();
    await new Promise((res) => setTimeout(res, 5000)); // receivers spawned ahead, pools refilled
    reports = [];
    const last = r === RUNS - 1;
    const perf = last ? spawn('perf', ['record', '-q', '-F', '4999', '-a', '-o', data], { stdio: 'ignore' }) : undefined;
    if (perf) await new Promise((res) => setTimeout(res, 1500));
    const kids = await engine.fork(parent, { count: 16 }, tenant);
    if (perf) { perf.kill('SIGINT'); await new Promise((res) => perf.on('exit', res)); }
    const cpu = reports.find((x) => x.cpuMs?.children_vmm !== undefined)?.cpuMs?.children_vmm;
    if (cpu !== undefined) perChild.push(cpu / 16);
    for (const k of kids) await engine.delete(k.id, tenant);
  }
} finally {
  await engine.deleteAll();
  await engine.close();
  rmSync(home, { recursive: true, force: true });
}

// Samples of the QEMU processes by shared object and symbol, as percentages of all samples.
const rows = execFileSync('perf', ['report', '-i', data, '--comm', 'qemu-system-x86', '--sort', 'dso,sym', '--stdio'], { encoding: 'utf8', maxBuffer: 64 << 20 })
  .split('\n').filter((l) => /^\s+[\d.]+%/.test(l));
rmSync(data, { force: true });
const share = { translation: 0, unnamed: 0, jit: 0, kernel: 0, other: 0 };
for (const l of rows) {
  const pct = Number(/([\d.]+)%/.exec(l)![1]);
  const sym = /\[[.k]\] (\S+)/.exec(l)?.[1] ?? '';
  if (l.includes('[JIT]')) share.jit += pct;
  else if (l.includes('[kernel')) share.kernel += pct;
  else if (l.includes('qemu-system-x86_64') && /^0x/.test(sym)) share.unnamed += pct;
  else if (l.includes('qemu-system-x86_64') && /^(tcg_|translator_|tb_|qht_|gen_|disas|page_)/.test(sym)) share.translation += pct;
  else share.other += pct;
}
const total = Object.values(share).reduce((a, b) => a + b, 0);
const pct = (x: number) => `${((100 * x) / total).toFixed(0)} %`;
const per = summary(perChild);
console.log([
  `## Where a fork child's CPU goes — \`bench/fork-profile.ts --runs ${RUNS}\` (accel ${engine.cfg.accel.accel}; ${startedAt}; 512 MiB guest, ~100 MB dirtied; load average ${loadAtStart.toFixed(1)} at the start, ${loadavg()[0].toFixed(1)} at the end)`,
  '',
  `CPU of the children's VMMs, claim → acknowledgement, per child (each run's total / 16): p50 ${fmt(per.p50)} ms, p99 ${fmt(per.p99)} ms, min ${fmt(per.min)} ms over ${per.n} fork(16) runs (the first spawns its children; later ones take VMMs spawned ahead).`,
  '',
  '| samples of every QEMU process (parent, pools, children) during the last fork(16) | share |', '|---|---|',
  `| TCG translation, named (tcg_*, translator_*, tb_*, qht_*, page_*) | ${pct(share.translation)} |`,
  `| unnamed functions of the stripped QEMU binary (its static ones, among them TCG's x86 front end and back end) | ${pct(share.unnamed)} |`,
  `| the guest's translated code ([JIT]) | ${pct(share.jit)} |`,
  `| kernel | ${pct(share.kernel)} |`,
  `| the rest (device state load, main loop, libc, glib) | ${pct(share.other)} |`,
].join('\n'));
