// Engine benchmark (issue: engine foundation). In one run, side by side:
//   warm create (restore from the warm pool) vs a cold boot of the same template, with their ratio;
//   create → first exec result; exec round trip of `true`; PSS per idle sandbox; host CPU per idle
//   sandbox without and with the idle pause, and what waking one costs; density with the idle pause.
// Usage: node --import tsx bench/engine.ts [--creates 120] [--boots 10] [--density 500] [--idle-pause 5]
import { readFileSync, rmSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { Engine } from '../src/sandboxes/engine.ts';
import { Vmm } from '../src/vmm/vmm.ts';
import { machineSpec, vmmFiles } from '../src/vmm/machine.ts';
import { connectAgent } from '../src/guest/connect.ts';
import { createOverlay } from '../src/sandboxes/runtime.ts';
import { summary, fmt, timed, pssMiB, percentile } from './stats.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const CREATES = arg('creates', 120);
const BOOTS = arg('boots', 10);
const DENSITY = arg('density', 500);
const IDLE_PAUSE = arg('idle-pause', 5);
const home = `/tmp/collimate-bench-engine-${process.pid}`;
const tenant = { tenant: 'bench' };
const read = (p: string) => readFileSync(p, 'utf8');
const log = (m: string) => console.error(`[bench] ${m}`);

// The idle pause is off until its part of the run (engine.cfg.idlePauseSecs is read on every pass).
// CPU admission is off: the bench means to fill the host; memory admission ends the density run.
const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 4, catalog: ['base'], progress: log, idlePauseSecs: 0 });
engine.cfg.host.cpuPressureMax = 0;
const pool = engine.templatePools.pool('base')!;
const artifact = engine.templatePools.get('base')!.artifact;

async function warmCreate(): Promise<{ ms: number; id: string }> {
  await pool.waitFull(30_000);
  const [ms, sb] = await timed(() => engine.create({ template: 'base' }, tenant));
  return { ms, id: sb.id };
}

log(`warm creates x${CREATES}`);
const createMs: number[] = [];
for (let i = 0; i < CREATES; i++) {
  const { ms, id } = await warmCreate();
  createMs.push(ms);
  await engine.delete(id);
}

log('create → first exec result');
const firstExecMs: number[] = [];
for (let i = 0; i < Math.min(CREATES, 50); i++) {
  await pool.waitFull(30_000);
  const [ms, id] = await timed(async () => {
    const sb = await engine.create({ template: 'base' }, tenant);
    await engine.exec(sb.id, { command: 'true' });
    return sb.id;
  });
  firstExecMs.push(ms);
  await engine.delete(id);
}

log('exec round trip of `true`');
const sb = await engine.create({ template: 'base' }, tenant);
const execMs: number[] = [];
for (let i = 0; i < 300; i++) execMs.push((await timed(() => engine.exec(sb.id, { command: 'true' })))[0]);
await engine.delete(sb.id);

log(`cold boots x${BOOTS}`);
const bootMs: number[] = [];
for (let i = 0; i < BOOTS; i++) {
  const dir = join(home, 'cold', String(i));
  mkdirSync(dir, { recursive: true });
  const disk = join(dir, 'disk.qcow2');
  await createOverlay(disk, artifact.diskPath, 'raw');
  const mem = join(engine.cfg.ramDir, `cold-${i}.mem`);
  const spec = machineSpec({
    qemuBinary: engine.cfg.qemuBinary, accel: engine.cfg.accel.accel, seccomp: engine.cfg.seccomp, shape: artifact.shape, dir,
    memPath: mem, memShared: false, upper: { path: disk, format: 'qcow2' }, incoming: false,
  });
  const [ms, vmm] = await timed(async () => {
    const v = await Vmm.spawn(spec, { logPath: vmmFiles(dir).qemuLog });
    const agent = await connectAgent(spec.agentSocket, 60_000);
    await agent.exec({ commands: [['true']] });
    agent.close();
    return v;
  });
  bootMs.push(ms);
  await vmm.kill();
  rmSync(dir, { recursive: true, force: true });
  rmSync(mem, { force: true });
}

log('PSS per idle sandbox (20 sandboxes, 5 s idle)');
const idle: string[] = [];
for (let i = 0; i < 20; i++) idle.push((await engine.create({ template: 'base' }, tenant)).id);
await new Promise((r) => setTimeout(r, 5000));
const pss = idle.map((id) => pssMiB(engine.repo.get(id)!.vmm!.pid, read));
for (const id of idle) await engine.delete(id);

log('host CPU per idle sandbox (20 sandboxes, 60 s), without and with the idle pause; exec on a paused sandbox');
const cpuTicks = (pid: number) => {
  let t = 0;
  for (const line of read(`/proc/${pid}/stat`).split(') ').slice(1)) { const f = line.split(' '); t += Number(f[11]) + Number(f[12]); }
  return t / 100;
};
const idleCpu = async (): Promise<number> => {
  const pids = idle.map((id) => engine.repo.get(id)!.vmm!.pid);
  const c0 = pids.map(cpuTicks);
  const t0 = Date.now();
  await new Promise((r) => setTimeout(r, 60_000));
  const secs = (Date.now() - t0) / 1000;
  const per = pids.map((pid, i) => (cpuTicks(pid) - c0[i]) / secs * 60);
  return per.reduce((a, b) => a + b, 0) / per.length;
};
idle.length = 0;
for (let i = 0; i < 20; i++) idle.push((await engine.create({ template: 'base' }, tenant)).id);
for (const id of idle) await engine.exec(id, { command: 'true' });
await new Promise((r) => setTimeout(r, 5000));
const cpuAwake = await idleCpu();
engine.cfg.idlePauseSecs = IDLE_PAUSE;
const allPaused = async (ids: string[]) => {
  const deadline = Date.now() + 60_000 + ids.length * 200;
  while (ids.some((id) => !engine.isIdlePaused(id)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  return ids.filter((id) => engine.isIdlePaused(id)).length;
};
const pausedCount = await allPaused(idle);
const cpuPaused = await idleCpu();
const wakeMs: number[] = [];
const awakeMs: number[] = [];
for (const id of idle) {
  wakeMs.push((await timed(() => engine.exec(id, { command: 'true' })))[0]);
  awakeMs.push((await timed(() => engine.exec(id, { command: 'true' })))[0]);
}
for (const id of idle) await engine.delete(id);

log(`density: idle sandboxes (paused after ${IDLE_PAUSE} s idle) up to ${DENSITY} while create p99 stays within 2x of its value with one sandbox`);
const density: Array<{ held: number; p50: number; p99: number; memAvailMiB: number }> = [];
const held: string[] = [];
const PROBE = 40;
const probe = async () => {
  const ms: number[] = [];
  for (let i = 0; i < PROBE; i++) {
    const r = await warmCreate();
    ms.push(r.ms);
    await engine.delete(r.id);
  }
  return ms;
};
const memAvail = () => Number(read('/proc/meminfo').match(/^MemAvailable:\s+(\d+)/m)![1]) / 1024;
held.push((await engine.create({ template: 'base' }, tenant)).id);
const base = await probe();
const baseP99 = percentile(base, 99);
density.push({ held: 1, p50: percentile(base, 50), p99: baseP99, memAvailMiB: memAvail() });
let reached = 1;
let stop = '';
for (const step of [25, 50, 100, 150, 200, 250, 300, 400, 500].filter((s) => s <= DENSITY)) {
  let refused = '';
  while (held.length < step && !refused) {
    await pool.waitFull(30_000);
    try {
      held.push((await engine.create({ template: 'base' }, tenant)).id);
    } catch (e) {
      if ((e as { code?: string }).code !== 'host_at_capacity') throw e;
      refused = (e as Error).message;
    }
  }
  if (refused) { log(`  admission refused at ${held.length}: ${refused}`); stop = `admission refused the create after ${held.length} (${refused})`; break; }
  await allPaused(held);
  await new Promise((r) => setTimeout(r, 2000));
  const ms = await probe();
  const row = { held: held.length, p50: percentile(ms, 50), p99: percentile(ms, 99), memAvailMiB: memAvail() };
  density.push(row);
  log(`  ${row.held} held: create p50 ${fmt(row.p50)} ms p99 ${fmt(row.p99)} ms, MemAvailable ${row.memAvailMiB.toFixed(0)} MiB`);
  if (row.p99 <= 2 * baseP99) reached = row.held;
  else { stop = `create p99 past 2× at ${row.held}`; break; }
  if (row.memAvailMiB < 2048) { stop = `MemAvailable under 2 GiB at ${row.held}`; break; }
}
for (const id of held) await engine.delete(id);
await engine.close();
rmSync(home, { recursive: true, force: true });

const c = summary(createMs);
const b = summary(bootMs);
const f = summary(firstExecMs);
const e = summary(execMs);
const p = summary(pss);
const lines = [
  `## Engine (accel ${engine.cfg.accel.accel}; ${new Date().toISOString().slice(0, 10)})`,
  '',
  '| measure | n | p50 | p99 |',
  '|---|---|---|---|',
  `| warm create (claim a pool VMM restored from the checkpoint and paused) | ${c.n} | ${fmt(c.p50)} ms | ${fmt(c.p99)} ms |`,
  `| cold boot of the same template to first exec | ${b.n} | ${fmt(b.p50)} ms | ${fmt(b.p99)} ms |`,
  `| **cold boot / warm create (p50)** | | **${(b.p50 / c.p50).toFixed(0)}×** | |`,
  `| create → first exec result | ${f.n} | ${fmt(f.p50)} ms | ${fmt(f.p99)} ms |`,
  `| exec round trip of \`true\` | ${e.n} | ${fmt(e.p50)} ms | ${fmt(e.p99)} ms |`,
  `| PSS per idle sandbox | ${p.n} | ${p.p50.toFixed(1)} MiB | ${p.p99.toFixed(1)} MiB |`,
  `| exec \`true\` on a sandbox paused for idling (wakes it) | ${wakeMs.length} | ${fmt(percentile(wakeMs, 50))} ms | ${fmt(percentile(wakeMs, 99))} ms |`,
  `| the next exec \`true\` (awake) | ${awakeMs.length} | ${fmt(percentile(awakeMs, 50))} ms | ${fmt(percentile(awakeMs, 99))} ms |`,
  '',
  `Host CPU per idle sandbox (20 sandboxes, 60 s each way, same run): **${cpuAwake.toFixed(3)} CPU-s per minute** awake ` +
    `(${(cpuAwake / 60 * 100).toFixed(2)} % of a core); paused after ${IDLE_PAUSE} s idle (${pausedCount} of 20 paused): **${cpuPaused.toFixed(3)} CPU-s per minute**.`,
  '',
  `Density (idle sandboxes held while ${PROBE} warm creates are timed; target: p99 within 2× of ${fmt(baseP99)} ms):`,
  '',
  '| sandboxes held | create p50 | create p99 | MemAvailable |',
  '|---|---|---|---|',
  ...density.map((d) => `| ${d.held} | ${fmt(d.p50)} ms | ${fmt(d.p99)} ms | ${d.memAvailMiB.toFixed(0)} MiB |`),
  '',
  `Highest count with create p99 within 2× of the one-sandbox value: **${reached}**${stop ? ` (stopped: ${stop})` : ` (the last step, ${DENSITY})`}.`,
];
console.log(lines.join('\n'));
