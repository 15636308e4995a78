/**
 * Every door fuzzed (issue 31), short form: FUZZ_N (300) generated requests per door — REST, MCP,
 * E2B's control plane and envd, the web terminal, the ports proxy (doorFuzz.ts) — against a real
 * server on a real engine with two real sandboxes (the fuzzing tenant's and a victim's) besides the
 * REST lanes' own. No undocumented 5xx, every error in its door's shape, no secret in any answer;
 * afterwards the server answers /healthz, the victim's sandbox was never touched, the process's RSS
 * grew less than RSS_GROWTH_MAX_MIB from after the warm-up to the end, and once everything is
 * deleted the leak check finds nothing left.
 *
 * The seed is random unless FUZZ_SEED is set, and printed: FUZZ_SEED=<seed> replays. FUZZ_DOORS
 * (comma-separated) limits the doors. The long form is bench/fuzz-doors.ts (10,000 per door).
 *
 * Alone: flock /tmp/collimate-vm.lock node --import tsx --test test/integration/doorFuzz.test.ts
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync } from 'node:fs';
import { dirname, basename } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import type { Served } from './fixture.ts';
import { HUGE_JSON, fuzzServer, hostSecret, hostShadowLines, type FuzzServer } from './fuzzHarness.ts';
import { DOORS, HUGE_BODY, doorReport, prepareDoorTarget, runDoorFuzz, type DoorName } from './doorFuzz.ts';

const N = Number(process.env.FUZZ_N ?? 300);
const SEED = process.env.FUZZ_SEED !== undefined ? Number(process.env.FUZZ_SEED) : Math.floor(Math.random() * 2 ** 31);
const ONLY = (process.env.FUZZ_DOORS ?? '').split(',').map((d) => d.trim()).filter(Boolean) as DoorName[];
const ESCAPE_MARKER = `/tmp/collimate-doorfuzz-escape-${SEED}`;
const SECRET = hostSecret();
/** Requests per door before the RSS baseline is taken: every code path and buffer pool touched once. */
const WARM_UP = 60;
/**
 * How much the process's RSS may grow from after the warm-up to the end, after a full GC. What
 * the server may legitimately hold more of at the end than after the warm-up: V8's heap settling
 * at a larger size after peaks (old space is not returned at once: ~2× the live heap), malloc arenas
 * that keep freed buffers of the largest bodies (envd reads up to 16 MiB before refusing, 4 lanes),
 * and SQLite's page cache. 96 MiB covers these with room; a leak of one 1 KiB object per request
 * at the long form's 60,000 requests is ~60 MiB on the heap alone, which the heap bound catches.
 */
const RSS_GROWTH_MAX_MIB = Number(process.env.FUZZ_RSS_GROWTH_MAX_MIB ?? 96);
/** The V8 heap in use after a full GC may grow at most this much (a leak shows here first). */
const HEAP_GROWTH_MAX_MIB = Number(process.env.FUZZ_HEAP_GROWTH_MAX_MIB ?? 24);

// The doors are what is judged, not CPU admission: on a shared host a create refused for another
// job's load (503 host_at_capacity) would stop the run before it starts (scripts/test.sh sets the same).
process.env.COLLIMATE_HOST_CPU_PRESSURE_MAX ??= '0';
setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

let server: FuzzServer;
let engine: Engine;
let api: Served;
let base: URL;

const mib = (n: number) => Math.round((n / (1024 * 1024)) * 10) / 10;

async function settledMemory(): Promise<{ rss: number; heap: number }> {
  for (let i = 0; i < 3; i++) {
    gc();
    await new Promise((r) => setTimeout(r, 100));
  }
  const m = process.memoryUsage();
  return { rss: m.rss, heap: m.heapUsed };
}

const call = (method: string, path: string, key?: string, body?: unknown) => server.call(method, path, key, body);

before(async () => {
  server = await fuzzServer('doorfuzz', { poolSize: 2, poolMin: 1, poolMax: 3 }, SECRET);
  ({ engine, api, base } = server);
  assert.equal(HUGE_BODY, HUGE_JSON + 1);
});

after(async () => {
  await server?.close();
});

test(`door fuzz: ${N} requests per door (seed ${SEED}): no undocumented 5xx, each door's error shape, no secret, RSS bounded, no leaks`, async () => {
  const doors = ONLY.length ? ONLY : [...DOORS];
  console.log(`door fuzz seed ${SEED} (replay with FUZZ_SEED=${SEED}), ${N} requests per door: ${doors.join(', ')}`);
  const keys = {
    main: api.keys.create({ tenant: 'doorfuzz', tier: 'enterprise' }).key,
    demo: api.keys.create({ tenant: 'doorfuzz-demo', tier: 'demo' }).key,
    victim: api.keys.create({ tenant: 'victim', tier: 'pro' }).key,
  };
  const target = await prepareDoorTarget(base, keys);
  console.log(`door fuzz target: sandbox ${target.sandbox} (pty ${target.ptyPid}, httpd :${target.httpPort}), victim ${target.victimSandbox}, rotation ${target.rotatedEnvdToken ? 'yes' : 'not served'}`);
  const common = { lanes: 4, doors, hostSecrets: [SECRET, ...hostShadowLines()], escapeMarker: ESCAPE_MARKER, log: (l: string) => console.log(l) };

  // Warm-up: every door once at a small volume (its own seed), then the baseline.
  const warm = await runDoorFuzz(target, { ...common, seed: (SEED ^ 0x5eed) >>> 0, requests: WARM_UP });
  const warmFailures = warm.flatMap((d) => d.failures);
  const before0 = await settledMemory();
  console.log(`door fuzz after warm-up: rss ${mib(before0.rss)} MiB, heap ${mib(before0.heap)} MiB`);

  const stats = await runDoorFuzz(target, { ...common, seed: SEED, requests: N });
  for (const s of stats) console.log(doorReport(s));
  for (const s of stats) console.log(`door ${s.door} kinds ${JSON.stringify(s.byKind)}`);
  const end = await settledMemory();
  const rssGrowth = mib(end.rss - before0.rss);
  const heapGrowth = mib(end.heap - before0.heap);
  console.log(`door fuzz memory: rss ${mib(before0.rss)} → ${mib(end.rss)} MiB (${rssGrowth >= 0 ? '+' : ''}${rssGrowth}), heap ${mib(before0.heap)} → ${mib(end.heap)} MiB (${heapGrowth >= 0 ? '+' : ''}${heapGrowth}), peak rss ${Math.max(...stats.map((s) => s.rss.peakMiB))} MiB`);

  const failures = [...warmFailures, ...stats.flatMap((s) => s.failures)];
  assert.deepEqual(failures, [], `${failures.length} failure(s):\n\n${failures.join('\n\n')}`);
  for (const s of stats) assert.ok(s.sent >= N, `door ${s.door}: only ${s.sent} of ${N} requests were sent`);

  // The server still answers; the victim's sandbox was never touched; nothing escaped to the host.
  const health = await call('GET', '/healthz');
  assert.equal(health.status, 200, health.text);
  const vs = (await call('GET', `/v1/sandboxes/${target.victimSandbox}`, keys.victim)).json as { state: string; exec_count: number; children: string[] };
  assert.equal(vs.state, 'running');
  assert.equal(vs.exec_count, 0);
  assert.deepEqual(vs.children, []);
  const own = (await call('POST', `/v1/sandboxes/${target.sandbox}/exec`, keys.main, { command: 'echo alive' })).json as { stdout: string };
  assert.equal(own.stdout, 'alive\n', 'the doors\' sandbox no longer runs commands');
  const escaped = readdirSync(dirname(ESCAPE_MARKER)).filter((f) => f.startsWith(basename(ESCAPE_MARKER)));
  assert.deepEqual(escaped, [], 'files written through a door appeared on the host');
  assert.ok(!existsSync('/tmp/doorfuzz-escape'));

  assert.ok(rssGrowth < RSS_GROWTH_MAX_MIB, `RSS grew ${rssGrowth} MiB from after the warm-up to the end (bound ${RSS_GROWTH_MAX_MIB})`);
  assert.ok(heapGrowth < HEAP_GROWTH_MAX_MIB, `the heap grew ${heapGrowth} MiB from after the warm-up to the end (bound ${HEAP_GROWTH_MAX_MIB})`);

  // Every snapshot a door took was deleted by the steps that took it (the engine's deleteAll would hide one left).
  for (const key of [keys.main, keys.demo, keys.victim]) {
    const snaps = (await call('GET', '/v1/snapshots?limit=1000', key)).json as { snapshots: Array<{ id: string; name: string | null }> };
    assert.deepEqual(snaps.snapshots.map((s) => `${s.id} ${s.name}`), [], 'snapshots left behind by the doors');
  }

  // Everything deleted through the API (the leak check runs after).
  for (const key of [keys.main, keys.demo, keys.victim]) {
    const list = (await call('GET', '/v1/sandboxes?limit=1000', key)).json as { sandboxes: Array<{ id: string }> };
    for (const s of list.sandboxes) {
      const d = await call('DELETE', `/v1/sandboxes/${s.id}`, key);
      assert.equal(d.status, 204, `delete ${s.id}: ${d.text}`);
    }
  }
  assert.deepEqual(engine.list({ limit: 1000 }).sandboxes.map((s) => s.id), [], 'sandboxes left after deleting every listed one');
  await engine.settled();
});
