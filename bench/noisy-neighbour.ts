// Noisy-neighbour benchmark (issue: isolation hardening and resource limits). In one run, sandbox A
// fork-bombs, runs a memory hog past its RAM (guest OOM), fills its disk, then floods 1 GB of
// stdout, while sandbox B runs `true` at a steady pace. Reports B's exec latency in each phase against
// its quiet baseline (the target: p99 within 2x), what A was told, where the host CPU went (A's QEMU
// process, the server), A's cgroup counters (CPU throttling, peak memory) and the server's RSS. Run
// with COLLIMATE_JAIL=off to compare without confinement.
// Usage: node --import tsx bench/noisy-neighbour.ts [--baseline 200] [--pace-ms 50] [--quiet-ms 5000] [--flood-bytes 1000000000]
//        [--phases bomb,hog,disk,flood] [--repeat 1]
import { readFileSync, rmSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { Engine } from '../src/sandboxes/engine.ts';
import type { ExecResult } from '../src/sandboxes/types.ts';
import { summary, fmt, timed } from './stats.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const BASELINE = arg('baseline', 200);
const FLOOD = arg('flood-bytes', 1_000_000_000);
const PACE_MS = arg('pace-ms', 50);
const QUIET_MS = arg('quiet-ms', 5000);
const REPEAT = arg('repeat', 1);
const phasesArg = process.argv.indexOf('--phases');
const PHASES = new Set((phasesArg > 0 ? process.argv[phasesArg + 1] : 'bomb,hog,disk,flood').split(','));
const home = `/tmp/collimate-bench-noisy-${process.pid}`;
const tenant = { tenant: 'bench' };
const log = (m: string) => console.error(`[bench] ${m}`);

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 2, catalog: ['base'], progress: log });
const rssMiB = () => process.memoryUsage().rss / 1048576;
const a = await engine.create({ template: 'base' }, tenant);
const b = await engine.create({ template: 'base' }, tenant);
const jailA = engine.repo.get(a.id)!.vmm!.jail;
const pidA = engine.repo.get(a.id)!.vmm!.pid;
/** CPU seconds used so far by A's QEMU (all threads) and by this process (the server). */
const cpuSecs = () => {
  const f = readFileSync(`/proc/${pidA}/stat`, 'utf8').split(') ')[1].split(' ');
  const own = process.cpuUsage();
  return { a: (Number(f[11]) + Number(f[12])) / 100, server: (own.user + own.system) / 1e6 };
};
const cgFile = (ctrl: string, file: string): string | undefined => {
  const dir = jailA?.cgroups.find((d) => d.includes(`/${ctrl}/`)) ?? (jailA?.cgroups.length === 1 ? jailA.cgroups[0] : undefined);
  const p = dir && join(dir, file);
  return p && existsSync(p) ? readFileSync(p, 'utf8').trim() : undefined;
};
const throttled = () => {
  const s = cgFile('cpu', 'cpu.stat') ?? '';
  const n = /nr_throttled (\d+)/.exec(s);
  const t = /throttled_(?:time|usec) (\d+)/.exec(s);
  return { n: n ? Number(n[1]) : NaN, ms: t ? Number(t[1]) / (s.includes('throttled_usec') ? 1e3 : 1e6) : NaN };
};

for (let i = 0; i < 10; i++) await engine.exec(b.id, { command: 'true' });
log(`quiet baseline: ${BASELINE} execs of \`true\` in B, one every ${PACE_MS} ms`);
const loadAvg = () => readFileSync('/proc/loadavg', 'utf8').split(' ')[0];
const load0 = loadAvg();

/** B's probe: `true` execs paced at PACE_MS (not back to back, which would make B a CPU hog itself). */
function probeB(): { stop: () => Promise<{ lat: number[]; failed: number }> } {
  const lat: number[] = [];
  let failed = 0;
  let stop = false;
  const loop = (async () => {
    let next = performance.now();
    while (!stop) {
      const [ms, r] = await timed(() => engine.exec(b.id, { command: 'true', timeout: 120 }));
      lat.push(ms);
      if (r.exit_code !== 0) failed++;
      rssMax = Math.max(rssMax, rssMiB());
      next += PACE_MS;
      const wait = next - performance.now();
      if (wait > 0) await new Promise((res) => setTimeout(res, wait));
      else next = performance.now();
    }
  })();
  return { stop: async () => { stop = true; await loop; return { lat, failed }; } };
}

interface Phase { name: string; outcome: string; aMs: number; quiet: ReturnType<typeof summary>; b: ReturnType<typeof summary>; bFailed: number; throttledMs: number; aCpu: number; serverCpu: number; load: string }

/** B's latency with A idle, just before a phase: the host's other load drifts, so each phase gets its own baseline. */
async function quietB(): Promise<ReturnType<typeof summary>> {
  const p = probeB();
  await new Promise((res) => setTimeout(res, QUIET_MS));
  return summary((await p.stop()).lat);
}
const phases: Phase[] = [];
const rss0 = rssMiB();
let rssMax = rss0;
const quietProbe = probeB();
await new Promise((res) => setTimeout(res, BASELINE * PACE_MS));
const base = summary((await quietProbe.stop()).lat);

const flags = (r: ExecResult) => [
  `exit ${r.exit_code}`, r.timed_out ? 'timed_out' : '', r.signal ? `signal ${r.signal}` : '', r.oom_killed ? 'oom_killed' : '',
  r.pids_limited ? 'pids_limited' : '', r.stdout_truncated ? `stdout_truncated (${Buffer.byteLength(r.stdout)} B kept)` : '',
].filter(Boolean).join(', ');
async function phase(name: string, command: string, timeout: number, describe: (r: ExecResult) => string): Promise<void> {
  log(`phase: ${name}`);
  const quiet = await quietB();
  const th0 = throttled();
  const cpu0 = cpuSecs();
  const probe = probeB();
  const [aMs, r] = await timed(() => engine.exec(a.id, { command, timeout }));
  const { lat, failed } = await probe.stop();
  const th1 = throttled();
  const cpu1 = cpuSecs();
  phases.push({ name, outcome: describe(r), aMs, quiet, b: summary(lat), bFailed: failed, throttledMs: th1.ms - th0.ms, aCpu: cpu1.a - cpu0.a, serverCpu: cpu1.server - cpu0.server, load: loadAvg() });
  // A cleans up after itself between phases: what a fork bomb leaves running outlives its exec
  // (background processes survive an exec by design), so everything but the agent is killed.
  for (let attempt = 1; ; attempt++) {
    const ok = await engine.exec(a.id, { command: 'kill -9 -1 2>/dev/null; rm -f /root/fill; echo ok', timeout: 300 });
    if (ok.stdout === 'ok\n') break;
    if (attempt === 10) throw new Error(`A did not recover after ${name}: ${JSON.stringify(ok)}`);
    log(`A still busy after ${name} (attempt ${attempt}): ${flags(ok)} ${ok.error ?? ''}`);
  }
}

const firstLine = (s: string) => s.split('\n').find((l) => l.trim()) ?? '';

// The guest agent contains a fork bomb (a per-exec process limit, killed whole when hit), so it
// runs in A like every other phase; the sandbox stays usable afterwards.
for (let i = 0; i < REPEAT; i++) {
  if (PHASES.has('bomb')) await phase('fork bomb (15 s timeout)', 'bomb() { bomb | bomb & }; bomb; sleep 10', 15, (r) => `${flags(r)}; "${r.error ?? ''}"`);
  if (PHASES.has('hog')) await phase('memory hog past guest RAM', 'head -c 600m /dev/zero | tail', 300, (r) => `${flags(r)}; stderr "${firstLine(r.stderr)}"`);
  if (PHASES.has('disk')) await phase('disk fill (dd until full)', 'dd if=/dev/zero of=/root/fill bs=1M', 900, (r) => `${flags(r)}; stderr "${firstLine(r.stderr)}"`);
  if (PHASES.has('flood')) await phase(`stdout flood (${(FLOOD / 1e9).toFixed(1)} GB)`, `head -c ${FLOOD} /dev/zero`, 900, (r) => flags(r));
}
const rss1 = rssMiB();
const memPeak = Number(cgFile('memory', 'memory.max_usage_in_bytes') ?? cgFile('memory', 'memory.peak') ?? NaN) / 1048576;
const memLimit = Number(cgFile('memory', 'memory.limit_in_bytes') ?? cgFile('memory', 'memory.max') ?? NaN) / 1048576;

await engine.deleteAll();
await engine.close();
rmSync(home, { recursive: true, force: true });

const conf = jailA ? `confined, cgroup ${jailA.cgroups.length === 1 ? 'v2' : 'v1'}` : 'not confined (COLLIMATE_JAIL=off or not root)';
console.log([
  `## Noisy neighbour (accel ${engine.cfg.accel.accel}; VMMs ${conf}; 1 vCPU / 256 MiB guests; host ${readFileSync('/proc/cpuinfo', 'utf8').split('\n').filter((l) => l.startsWith('processor')).length} CPUs)`,
  '',
  `B's \`true\` exec, one every ${PACE_MS} ms; quiet at the start: n ${base.n}, p50 ${fmt(base.p50)} ms, p99 ${fmt(base.p99)} ms; each phase is compared with ${QUIET_MS / 1000} s of quiet just before it. Host load average ${load0} at the start, ${loadAvg()} at the end (other work on the host included; the last column is the load at each phase's end).`,
  '',
  '| phase in A | what A was told | A took | B quiet just before: p50 / p99 | B during: n, p50 / p99 | B p99 during / quiet | B failures | A throttled | CPU: A\'s QEMU / server | host load |',
  '|---|---|---|---|---|---|---|---|---|---|',
  ...phases.map((p) => `| ${p.name} | ${p.outcome} | ${(p.aMs / 1000).toFixed(1)} s | ${fmt(p.quiet.p50)} / ${fmt(p.quiet.p99)} ms | ${p.b.n}, ${fmt(p.b.p50)} / ${fmt(p.b.p99)} ms | ${(p.b.p99 / p.quiet.p99).toFixed(2)}× | ${p.bFailed} | ${Number.isFinite(p.throttledMs) ? `${fmt(p.throttledMs)} ms` : 'n/a'} | ${p.aCpu.toFixed(1)} s / ${p.serverCpu.toFixed(2)} s | ${p.load} |`),
  '',
  `Server RSS: ${rss0.toFixed(0)} MiB before the phases, at most ${rssMax.toFixed(0)} MiB during them, ${rss1.toFixed(0)} MiB after.` +
    (Number.isFinite(memPeak) ? ` A's VMM cgroup: peak ${memPeak.toFixed(0)} MiB of a ${memLimit.toFixed(0)} MiB limit.` : ''),
].join('\n'));
