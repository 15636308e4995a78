// A fresh sandbox's first command against its second (the same command, now translated by TCG),
// on E2B's `base` (our `debian`): an exec of `bash -l -c true` as `user` (seeded, as every exec is,
// so without ASLR), and E2B's `commands.run('true')`, which starts the same as a background
// process (unseeded: with ASLR, so its user-space code is translated afresh at every start under
// TCG). Each run claims a sandbox from a settled warm pool, as a create does.
// Usage: COLLIMATE_CACHE_DIR=/var/tmp/collimate-test-cache COLLIMATE_HOST_CPU_PRESSURE_MAX=0 node --import tsx bench/first-command.ts [--runs 10]
import { rmSync } from 'node:fs';
import { loadavg } from 'node:os';
import { Sandbox as E2bSandbox } from 'e2b';
import '../src/service/migrations.ts';
import { Engine } from '../src/sandboxes/engine.ts';
import { startServer } from '../src/server/assemble.ts';
import { e2bKeyOf } from '../src/service/keys.ts';
import { fmt, summary } from './stats.ts';

const i = process.argv.indexOf('--runs');
const RUNS = i > 0 ? Number(process.argv[i + 1]) : 10;
const home = `/tmp/collimate-bench-first-${process.pid}`;
const loadAtStart = loadavg()[0];
const startedAt = new Date().toISOString();

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 2, catalog: ['debian'] });
const server = await startServer({ engine, service: { reconcileIntervalMs: 0 } });
const first: number[] = [];
const second: number[] = [];
const execFirst: number[] = [];
const execSecond: number[] = [];
try {
  const base = server.address;
  const key = server.tenants.keys.create({ tenant: 'bench', tier: 'pro' }).key;
  const opts = { apiKey: e2bKeyOf(key), apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd` };
  const time = async (fn: () => Promise<unknown>) => { const t0 = performance.now(); await fn(); return performance.now() - t0; };
  for (let r = 0; r < RUNS; r++) {
    // The pool refilled and nothing else running, as for a create on a quiet host.
    await engine.settled();
    await new Promise((res) => setTimeout(res, 3000));
    const login = { commands: [['/bin/bash', '-l', '-c', 'true']], user: 'user' };
    const tenant = { tenant: 'bench' };
    const native = await engine.create({ template: 'debian' }, tenant);
    execFirst.push(await time(() => engine.exec(native.id, login, tenant)));
    execSecond.push(await time(() => engine.exec(native.id, login, tenant)));
    await engine.delete(native.id, tenant);
    await engine.settled();
    await new Promise((res) => setTimeout(res, 3000));
    const sandbox = await E2bSandbox.create('base', opts);
    first.push(await time(() => sandbox.commands.run('true')));
    second.push(await time(() => sandbox.commands.run('true')));
    await sandbox.kill();
  }
} finally {
  await server.stop(1000);
  await engine.deleteAll();
  await engine.close();
  rmSync(home, { recursive: true, force: true });
}
const median = (xs: number[]) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const rows = (name: string, a: number[], b: number[]) => {
  const f = summary(a);
  const s = summary(b);
  return [
    `| ${name}: first in a fresh sandbox | ${f.n} | ${fmt(f.p50)} ms | ${fmt(f.p99)} ms |`,
    `| ${name}: second in it | ${s.n} | ${fmt(s.p50)} ms | ${fmt(s.p99)} ms |`,
    `| ${name}: **first / second** (per run, median) | | **${median(a.map((x, k) => x / b[k])).toFixed(2)}×** | |`,
  ];
};
console.log([
  `## A fresh sandbox's first login shell — \`bench/first-command.ts --runs ${RUNS}\` (accel ${engine.cfg.accel.accel}; ${startedAt}; E2B's base = our debian; load average ${loadAtStart.toFixed(1)} at the start, ${loadavg()[0].toFixed(1)} at the end)`,
  '',
  '| `bash -l -c true` as `user` | n | p50 | p99 |', '|---|---|---|---|',
  ...rows('exec (seeded)', execFirst, execSecond),
  ...rows("E2B's `commands.run('true')` (unseeded)", first, second),
].join('\n'));
