// What an idle guest costs the host, and where it spends it (issue: capacity follows demand).
// Holds N idle sandboxes of the base template for 30 s and reports, per sandbox: host CPU of its VMM
// (all threads), the guest's local-timer interrupts per second (LOC in /proc/interrupts) and its
// nohz mode (/proc/timer_list). Guest kernel arguments to try go in COLLIMATE_GUEST_KERNEL_ARGS (a
// new template is baked for them); `--sysctl key=value` is applied in each guest first. The idle
// pause is off here: this measures the guest that runs.
// Usage: COLLIMATE_GUEST_KERNEL_ARGS="tsc=reliable" node --import tsx bench/idle-cpu.ts [--sandboxes 5] [--secs 30] [--sysctl vm.stat_interval=60]
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import { Engine } from '../src/sandboxes/engine.ts';
import { percentile } from './stats.ts';

const arg = (name: string) => { const i = process.argv.indexOf(`--${name}`); return i > 0 ? process.argv[i + 1] : undefined; };
const N = Number(arg('sandboxes') ?? 5);
const SECS = Number(arg('secs') ?? 30);
const sysctl = arg('sysctl');
const home = `/tmp/collimate-bench-idle-${process.pid}`;
const tenant = { tenant: 'bench' };
const log = (m: string) => console.error(`[bench] ${m}`);

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: N, catalog: ['base'], progress: log, idlePauseSecs: 0 });
const cpuSecs = (pid: number) => readdirSync(`/proc/${pid}/task`).reduce((sum, tid) => {
  const f = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8').split(') ')[1].split(' ');
  return sum + (Number(f[11]) + Number(f[12])) / 100;
}, 0);
try {
  const ids: string[] = [];
  for (let i = 0; i < N; i++) ids.push((await engine.create({ template: 'base' }, tenant)).id);
  const sh = async (id: string, command: string) => (await engine.exec(id, { command }, tenant)).stdout.trim();
  if (sysctl) {
    const [k, v] = sysctl.split('=');
    for (const id of ids) await sh(id, `echo ${v} > /proc/sys/${k.replace(/\./g, '/')}`);
  }
  const loc = (id: string) => sh(id, "awk '/LOC/{print $2}' /proc/interrupts").then(Number);
  await new Promise((r) => setTimeout(r, 3000));
  const pids = ids.map((id) => engine.repo.get(id)!.vmm!.pid);
  const l0 = await Promise.all(ids.map(loc));
  const c0 = pids.map(cpuSecs);
  const t0 = Date.now();
  await new Promise((r) => setTimeout(r, SECS * 1000));
  const c1 = pids.map(cpuSecs);
  const secs = (Date.now() - t0) / 1000;
  const l1 = await Promise.all(ids.map(loc));
  const nohz = await sh(ids[0], "awk '/nohz_mode/{print $3; exit}' /proc/timer_list");
  const cpu = c1.map((c, i) => (c - c0[i]) / secs * 100);
  const locs = l1.map((l, i) => (l - l0[i]) / secs);
  const args = engine.cfg.guestKernelArgs.join(' ') || '(none)';
  console.log(`| ${args}${sysctl ? ` + ${sysctl}` : ''} | ${N} × ${SECS} s | ${percentile(cpu, 50).toFixed(2)} % (max ${Math.max(...cpu).toFixed(2)}) | ${percentile(locs, 50).toFixed(1)} | ${nohz} |`);
} finally {
  await engine.deleteAll();
  await engine.close();
  rmSync(home, { recursive: true, force: true });
}
