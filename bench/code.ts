// Code interpreter benchmark (issue 34), through the REST API on loopback, as a client sees it:
//   runCode('1+1') round trip in a warm kernel against an exec of the same in the same sandbox
//   (`python3 -c 'print(1+1)'`, a fresh interpreter per exec) — target ≤ 1.5× the exec;
//   the first runCode in a fresh sandbox (a create from the python template's warm pool, then its
//   first cell) against a warm one — target ≤ 2× — right after the create (the pool's refill then
//   competes for the two cores) and once the pool has refilled;
//   fork(1) of a sandbox whose kernel holds a loaded DataFrame against fork(1) of a `base` sandbox
//   (the plain guest), and the child's first cell after it.
// Runs alternate the measures, so load on the host falls on all of them alike.
// Usage: COLLIMATE_CACHE_DIR=/var/tmp/collimate-test-cache COLLIMATE_HOST_CPU_PRESSURE_MAX=0 node --import tsx bench/code.ts [--runs 10]
import { rmSync } from 'node:fs';
import { loadavg } from 'node:os';
import { Engine } from '../src/sandboxes/engine.ts';
import { startServer } from '../src/server/assemble.ts';
import { summary, fmt, timed } from './stats.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const RUNS = arg('runs', 10);
const home = `/tmp/clm-bcode-${process.pid}`;
const log = (m: string) => console.error(`[bench] ${m}`);
const loadAtStart = loadavg()[0];
const startedAt = new Date().toISOString();

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 2, catalog: ['base', 'python'], progress: log });
const server = await startServer({ engine, listen: false, service: { reconcileIntervalMs: 0 } });
const base = await server.api.app.listen({ host: '127.0.0.1', port: 0 });
const key = server.api.keys.create({ tenant: 'bench', tier: 'pro' }).key;

async function call(method: string, path: string, body?: unknown): Promise<any> {
  const res = await fetch(base + path, {
    method, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : undefined;
}
const create = async (template: string) => (await call('POST', '/v1/sandboxes', { template })).id as string;
const cell = async (id: string, code: string) => {
  const r = await call('POST', `/v1/sandboxes/${id}/code`, { code });
  if (r.error) throw new Error(`${code}: ${r.error.name}: ${r.error.value}`);
  return r;
};
const exec = async (id: string, command: string) => {
  const r = await call('POST', `/v1/sandboxes/${id}/exec`, { command });
  if (r.exit_code !== 0) throw new Error(`${command}: ${r.stderr}`);
  return r;
};
/** The pools refilled and nothing else in the background, so each measure starts alike. */
async function settle(): Promise<void> {
  const deadline = Date.now() + 120_000;
  while (Object.values(engine.poolStatus()).some((p) => p.ready < p.target) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  await engine.settled();
}

const m = {
  cell: [] as number[], exec: [] as number[], first: [] as number[], second: [] as number[], firstSettled: [] as number[],
  forkKernel: [] as number[], forkPlain: [] as number[], childCell: [] as number[],
};
const warm = await create('python');
const plain = await create('base');
await cell(warm, 'import pandas as pd\ndf = pd.DataFrame({"n": range(100_000)})\nint(df.n.sum())');
for (let i = 0; i < 3; i++) { await cell(warm, '1+1'); await exec(warm, "python3 -c 'print(1+1)'"); }

for (let run = 0; run < RUNS; run++) {
  await settle();
  for (let i = 0; i < 3; i++) {
    m.cell.push((await timed(() => cell(warm, '1+1')))[0]);
    m.exec.push((await timed(() => exec(warm, "python3 -c 'print(1+1)'")))[0]);
  }
  await settle();
  const fresh = await create('python');
  m.first.push((await timed(() => cell(fresh, '1+1')))[0]);
  m.second.push((await timed(() => cell(fresh, '1+1')))[0]);
  await call('DELETE', `/v1/sandboxes/${fresh}`);
  await settle();
  // The same once the pool has refilled behind the create: on two cores the refill's restore and
  // warm-up compete with the first cells above, which is the host's load, not the sandbox's cost.
  const quiet = await create('python');
  await settle();
  m.firstSettled.push((await timed(() => cell(quiet, '1+1')))[0]);
  await call('DELETE', `/v1/sandboxes/${quiet}`);
  await settle();
  const [tk, kids] = await timed(() => call('POST', `/v1/sandboxes/${warm}/fork`, { count: 1 }));
  m.forkKernel.push(tk);
  const child = kids.sandboxes[0].id as string;
  m.childCell.push((await timed(() => cell(child, 'int(df.n.sum())')))[0]);
  await call('DELETE', `/v1/sandboxes/${child}`);
  await settle();
  const [tp, plainKids] = await timed(() => call('POST', `/v1/sandboxes/${plain}/fork`, { count: 1 }));
  m.forkPlain.push(tp);
  await call('DELETE', `/v1/sandboxes/${plainKids.sandboxes[0].id}`);
  log(`run ${run + 1}/${RUNS}: cell ${fmt(m.cell.at(-1)!)} exec ${fmt(m.exec.at(-1)!)} first ${fmt(m.first.at(-1)!)} fork ${fmt(tk)} / ${fmt(tp)} ms`);
}

const s = Object.fromEntries(Object.entries(m).map(([k, v]) => [k, summary(v)])) as Record<keyof typeof m, ReturnType<typeof summary>>;
const row = (name: string, x: ReturnType<typeof summary>, note = '') => `| ${name} | ${x.n} | ${fmt(x.p50)} | ${fmt(x.p99)} | ${note} |`;
console.log(`\n### Code interpreter (bench/code.ts), ${startedAt}, load ${loadAtStart.toFixed(1)} → ${loadavg()[0].toFixed(1)}, accel ${engine.accel}\n`);
console.log('| measure | n | p50 ms | p99 ms | |');
console.log('|---|---|---|---|---|');
console.log(row("runCode('1+1'), warm kernel", s.cell, `${(s.cell.p50 / s.exec.p50).toFixed(2)}× the exec (target ≤ 1.5×)`));
console.log(row("exec python3 -c 'print(1+1)'", s.exec));
console.log(row('first runCode in a fresh sandbox, right after its create', s.first, `${(s.first.p50 / s.cell.p50).toFixed(2)}× a warm one (the pool's refill runs beside it)`));
console.log(row('its second runCode', s.second));
console.log(row('first runCode in a fresh sandbox, the pool refilled', s.firstSettled, `${(s.firstSettled.p50 / s.cell.p50).toFixed(2)}× a warm one (target ≤ 2×)`));
console.log(row('fork(1) of a sandbox with a live kernel (100k-row DataFrame)', s.forkKernel, `${(s.forkKernel.p50 / s.forkPlain.p50).toFixed(2)}× the plain guest's`));
console.log(row('fork(1) of a base sandbox (plain guest)', s.forkPlain));
console.log(row("the fork child's first cell (reads the DataFrame)", s.childCell));

for (const id of [warm, plain]) await call('DELETE', `/v1/sandboxes/${id}`);
await server.stop(1000);
await engine.close();
rmSync(home, { recursive: true, force: true });
