// Engine benchmark (issue: engine foundation). In one run, side by side:
//   warm create (restore from the warm pool) vs a cold boot of the same template, with their ratio;
//   create → first exec result; exec round trip of `true`; PSS per idle sandbox; density.
// Usage: node --import tsx bench/engine.ts [--creates 120] [--boots 10] [--density 300]
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
const DENSITY = arg('density', 300);
const home = `/tmp/collimate-bench-engine-${process.pid}`;
const tenant = { tenant: 'bench' };
const read = (p: string) => readFileSync(p, 'utf8');
const log = (m: string) => console.error(`[bench] ${m}`);

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 4, catalog: ['base'], progress: log });
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

log(`density: idle sandboxes up to ${DENSITY} while create p99 stays within 2x of its value with one sandbox`);
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
for (const step of [25, 50, 100, 150, 200, 250, 300, 400, 500].filter((s) => s <= DENSITY)) {
  while (held.length < step) {
    await pool.waitFull(30_000);
    held.push((await engine.create({ template: 'base' }, tenant)).id);
  }
  await new Promise((r) => setTimeout(r, 2000));
  const ms = await probe();
  const row = { held: held.length, p50: percentile(ms, 50), p99: percentile(ms, 99), memAvailMiB: memAvail() };
  density.push(row);
  log(`  ${row.held} held: create p50 ${fmt(row.p50)} ms p99 ${fmt(row.p99)} ms, MemAvailable ${row.memAvailMiB.toFixed(0)} MiB`);
  if (row.p99 <= 2 * baseP99) reached = row.held;
  else break;
  if (row.memAvailMiB < 2048) break;
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
  '',
  `Density (idle sandboxes held while ${PROBE} warm creates are timed; target: p99 within 2× of ${fmt(baseP99)} ms):`,
  '',
  '| sandboxes held | create p50 | create p99 | MemAvailable |',
  '|---|---|---|---|',
  ...density.map((d) => `| ${d.held} | ${fmt(d.p50)} ms | ${fmt(d.p99)} ms | ${d.memAvailMiB.toFixed(0)} MiB |`),
  '',
  `Highest count with create p99 within 2× of the one-sandbox value: **${reached}**.`,
];
console.log(lines.join('\n'));
