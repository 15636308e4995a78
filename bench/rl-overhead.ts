// RL SDK per-exec overhead: the in-process local fleet (service call, no HTTP) vs connect() (the TS SDK
// over HTTP to a real server in this process) vs the Python collimate_rl.connect() (one keep-alive
// connection), all on the SAME sandbox in the same run, interleaved so drift hits every path alike.
// Each sample is the wall time of one `exec({command: 'true'})`; the guest's own time (timing.run_ms)
// is reported too, so the front-door overhead is the difference.
// Usage: node --import tsx bench/rl-overhead.ts [--execs 100] [--warmup 10]
import { execFile } from 'node:child_process';
import { rmSync } from 'node:fs';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import '../src/service/migrations.ts';
import { startServer } from '../src/server/assemble.ts';
import { trustedScope } from '../src/service/types.ts';
import { Engine } from '../src/sandboxes/engine.ts';
import { connect, createLocalFleet, type Sandbox } from '../src/sdk/rl/index.ts';
import { fmt, percentile } from './stats.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const EXECS = arg('execs', 100);
const WARMUP = arg('warmup', 10);
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const home = `/tmp/collimate-bench-rl-${process.pid}`;
const log = (m: string) => console.error(`[bench] ${m}`);

const engine = await Engine.open({
  home,
  cacheDir: process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache',
  poolSize: 1,
  catalog: ['base'],
  progress: log,
});
// Assembled as `collimate serve` does, over the engine opened above (left open at stop).
const server = await startServer({ engine, service: { reconcileIntervalMs: 0 } });
const { api, tenants } = server;
const baseUrl = server.address;
const tenant = 'bench-rl';
const key = api.keys.create({ tenant, tier: 'pro' }).key;

const local = createLocalFleet(tenants, trustedScope(tenant));
const remote = connect({ apiKey: key, baseUrl });
const sb = await local.create('base');
const viaLocal: Sandbox = sb;
const viaHttp: Sandbox = await remote.get(sb.id);

interface Sample {
  wall: number;
  guest: number;
}
const samples: Record<'local' | 'http', Sample[]> = { local: [], http: [] };

async function once(s: Sandbox): Promise<Sample> {
  const t0 = performance.now();
  const r = await s.exec({ command: 'true' });
  const wall = performance.now() - t0;
  if (r.exit_code !== 0) throw new Error(`true exited ${r.exit_code}`);
  return { wall, guest: r.timing.run_ms };
}

try {
  log(`warm-up x${WARMUP} per path`);
  for (let i = 0; i < WARMUP; i++) {
    await once(viaLocal);
    await once(viaHttp);
  }
  log(`measuring x${EXECS} per path, interleaved`);
  for (let i = 0; i < EXECS; i++) {
    const order = i % 2 === 0 ? (['local', 'http'] as const) : (['http', 'local'] as const);
    for (const path of order) samples[path].push(await once(path === 'local' ? viaLocal : viaHttp));
  }

  // Python: collimate_rl.connect() on the same sandbox (after the TS runs; same server, same VM).
  log(`python collimate_rl x${EXECS}`);
  const py = `
import json, sys, time
sys.path.insert(0, ${JSON.stringify(`${ROOT}sdk/python`)})
import collimate_rl as rl
f = rl.connect(${JSON.stringify(baseUrl)}, ${JSON.stringify(key)})
sb = f.get(${JSON.stringify(sb.id)})
out = []
for i in range(${WARMUP} + ${EXECS}):
    t0 = time.perf_counter()
    r = sb.exec("true")
    wall = (time.perf_counter() - t0) * 1000
    if i >= ${WARMUP}:
        out.append([wall, r.timing.run_ms])
print(json.dumps({"samples": out, "connections": f.client.http.connections_opened}))
`;
  const { stdout } = await promisify(execFile)('/usr/bin/python3', ['-c', py], { timeout: 600_000 });
  const pyOut = JSON.parse(stdout) as { samples: Array<[number, number]>; connections: number };
  const python = pyOut.samples.map(([wall, guest]) => ({ wall, guest }));

  const rows: Array<[string, Sample[]]> = [
    ['local fleet (in-process)', samples.local],
    ['connect() (TS SDK over HTTP)', samples.http],
    [`collimate_rl.connect() (Python, ${pyOut.connections} connection)`, python],
  ];
  const p50Local = percentile(samples.local.map((s) => s.wall), 50);
  console.log(`\nPer-exec wall time of \`true\`, ${EXECS} execs per path on one sandbox (accel ${engine.accel}); ms.\n`);
  console.log('| path | p50 | p99 | min | guest run_ms p50 | overhead vs local (p50) |');
  console.log('|---|---:|---:|---:|---:|---:|');
  for (const [name, s] of rows) {
    const wall = s.map((x) => x.wall);
    const p50 = percentile(wall, 50);
    const over = name.startsWith('local') ? '—' : `+${fmt(p50 - p50Local)}`;
    console.log(`| ${name} | ${fmt(p50)} | ${fmt(percentile(wall, 99))} | ${fmt(Math.min(...wall))} | ${fmt(percentile(s.map((x) => x.guest), 50))} | ${over} |`);
  }
} finally {
  await sb.delete().catch(() => {});
  await server.stop(500);
  await engine.deleteAll();
  await engine.close();
  rmSync(home, { recursive: true, force: true });
}
process.exit(0);
