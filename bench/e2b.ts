// What the E2B front door costs next to the native API, on one real server and real VMs (issue: the
// unmodified E2B SDK). Interleaved in one run, one sandbox each, both on the busybox `base`:
//   - round trip of `true`: E2B's commands.run('true') vs our TS SDK's exec({command: 'true'});
//   - time to the first stdout byte of a streamed command (`echo x; sleep 0.2`): E2B's onStdout vs
//     our exec with onStdout (SSE).
// Usage: COLLIMATE_CACHE_DIR=/var/tmp/collimate-test-cache node --import tsx bench/e2b.ts [--runs 20]
import { rmSync } from 'node:fs';
import { Sandbox as E2bSandbox } from 'e2b';
import { Collimate } from '../src/sdk/index.ts';
import '../src/service/migrations.ts';
import { Engine } from '../src/sandboxes/engine.ts';
import { startServer } from '../src/server/assemble.ts';
import { e2bKeyOf } from '../src/service/keys.ts';
import { fmt, summary } from './stats.ts';

const arg = (name: string) => { const i = process.argv.indexOf(`--${name}`); return i > 0 ? process.argv[i + 1] : undefined; };
const RUNS = Number(arg('runs') ?? 20);
const home = `/tmp/collimate-bench-e2b-${process.pid}`;
const log = (m: string) => console.error(`[bench] ${m}`);

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 2, catalog: ['base'], progress: log });
// Assembled as `collimate serve` does, over the engine opened above (left open at stop).
const server = await startServer({ engine, service: { reconcileIntervalMs: 0 } });
const { api, tenants } = server;
try {
  const base = server.address;
  const key = tenants.keys.create({ tenant: 'bench', tier: 'pro' }).key;
  const ours = await new Collimate({ apiKey: key, baseUrl: base }).sandboxes.create({ template: 'base' });
  const theirs = await E2bSandbox.create('base', { apiKey: e2bKeyOf(key), apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd`, timeoutMs: 3_600_000 });
  const rt = { e2b: [] as number[], native: [] as number[] };
  const first = { e2b: [] as number[], native: [] as number[] };
  const time = async (fn: () => Promise<unknown>) => { const t0 = performance.now(); await fn(); return performance.now() - t0; };
  const firstByte = async (run: (onOut: () => void) => Promise<unknown>) => {
    const t0 = performance.now();
    let at = NaN;
    await run(() => { if (Number.isNaN(at)) at = performance.now() - t0; });
    return at;
  };
  // Warm both paths (connections, the guest's page cache) before measuring.
  for (let i = 0; i < 3; i++) { await ours.exec({ command: 'true' }); await theirs.commands.run('true'); }
  for (let i = 0; i < RUNS; i++) {
    rt.native.push(await time(() => ours.exec({ command: 'true' })));
    rt.e2b.push(await time(() => theirs.commands.run('true')));
    first.native.push(await firstByte((on) => ours.exec({ command: 'echo x; sleep 0.2' }, { onStdout: on })));
    first.e2b.push(await firstByte((on) => theirs.commands.run('echo x; sleep 0.2', { onStdout: on })));
  }
  const row = (name: string, a: number[], b: number[]) => {
    const s = summary(a);
    const n = summary(b);
    console.log(`| ${name} | ${fmt(s.p50)} / ${fmt(s.p99)} ms | ${fmt(n.p50)} / ${fmt(n.p99)} ms | ${(s.p50 / n.p50).toFixed(2)}× |`);
  };
  console.log(`\n${RUNS} runs each, interleaved; p50 / p99\n`);
  console.log('| measure | E2B SDK | Collimate TS SDK | E2B / native (p50) |');
  console.log('|---|---|---|---|');
  row("round trip of `true`", rt.e2b, rt.native);
  row('first stdout byte', first.e2b, first.native);
  await theirs.kill();
  await ours.delete();
} finally {
  await server.stop(1000);
  await engine.deleteAll();
  await engine.close();
  rmSync(home, { recursive: true, force: true });
}
