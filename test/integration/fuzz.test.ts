/**
 * Fuzzing at volume (issue 19 item 4): FUZZ_N (10,000) generated requests — valid, invalid and
 * hostile (fuzzHarness.ts) — over real sockets against a real server on a real engine. Zero 5xx
 * but the documented 502/503 codes, every error in the standard shape with a code its route
 * documents, every success as the OpenAPI document says; afterwards the server still answers
 * /healthz, the victim tenant's sandbox was never touched, nothing written through a traversing
 * path reached the host, the process's descriptors are back at their baseline once the sandboxes
 * are deleted, and the leak check finds no QEMU, file, socket, RAM file, cgroup or namespace.
 *
 * The seed is random unless FUZZ_SEED is set, and printed: FUZZ_SEED=<seed> replays a failure.
 * The long form is bench/fuzz.ts.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { dirname, basename } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import type { Served } from './fixture.ts';
import { fuzzServer, hostSecret, hostShadowLines, runFuzz, type FuzzServer } from './fuzzHarness.ts';

const N = Number(process.env.FUZZ_N ?? 10_000);
const SEED = process.env.FUZZ_SEED !== undefined ? Number(process.env.FUZZ_SEED) : Math.floor(Math.random() * 2 ** 32);
const ESCAPE_MARKER = `/tmp/collimate-fuzz-escape-${SEED}`;
const SECRET = hostSecret();

let server: FuzzServer;
let engine: Engine;
let api: Served;
let base: URL;

function fds(): Map<string, string> {
  const out = new Map<string, string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try { out.set(fd, readlinkSync(`/proc/self/fd/${fd}`)); } catch { /* closed while listing */ }
  }
  return out;
}

function countBy(xs: string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const x of xs) out[x] = (out[x] ?? 0) + 1;
  return out;
}

/**
 * What a socket descriptor is connected to, for the leak report: TCP ports, or for a unix socket its
 * path and the process holding its other end (`ss` pairs the two inodes), so that a leak names
 * whether it was a VMM's channel, a helper's pipe or nothing any more.
 */
function describe(target: string): string {
  const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
  if (!inode) return target;
  for (const table of ['tcp', 'tcp6']) {
    let lines: string[] = [];
    try { lines = readFileSync(`/proc/net/${table}`, 'utf8').split('\n').slice(1); } catch { continue; }
    for (const l of lines) {
      const f = l.trim().split(/\s+/);
      if (f[9] !== inode) continue;
      const port = (a: string) => parseInt(a.split(':')[1], 16);
      return `${target} ${table} ${port(f[1])} → ${port(f[2])} state ${f[3]}`;
    }
  }
  const unix = unixSockets();
  const me = unix.get(inode);
  if (!me) return target;
  const peer = unix.get(me.peer);
  const processes = (owners: string) => [...owners.matchAll(/\("([^"]+)",pid=(\d+)/g)].map((m) => `${m[1]} ${m[2]}${m[2] === String(process.pid) ? ' (this process)' : ''}`).join(', ') || 'no process';
  return `${target} unix ${me.path} ${me.state}, peer ${me.peer}${peer ? ` ${peer.path} held by ${processes(peer.owners)}` : ' (gone)'}`;
}

/** Unix sockets by inode: path, state, peer inode and the processes holding each (`ss -xpna`). */
function unixSockets(): Map<string, { path: string; state: string; peer: string; owners: string }> {
  const out = new Map<string, { path: string; state: string; peer: string; owners: string }>();
  let text = '';
  try { text = execFileSync('ss', ['-xpnaH'], { encoding: 'utf8' }); } catch { return out; }
  for (const line of text.split('\n')) {
    // netid state recv-q send-q local-path local-inode peer-path peer-inode [users:(...)]
    const m = /^\S+\s+(\S+)\s+\d+\s+\d+\s+(\S+)\s+(\d+)\s+\S+\s+(\d+)\s*(.*)$/.exec(line.trim());
    if (m) out.set(m[3], { state: m[1], path: m[2] === '*' ? '(unnamed)' : m[2], peer: m[4], owners: m[5] });
  }
  return out;
}

const call = (method: string, path: string, key?: string, body?: unknown) => server.call(method, path, key, body);

before(async () => {
  // Fixed pools (two VMMs, never more or fewer) so that the descriptor count has a stable baseline.
  server = await fuzzServer('fuzz', { poolSize: 2, poolMin: 2, poolMax: 2 }, SECRET);
  ({ engine, api, base } = server);
});

after(async () => {
  await server?.close();
});

async function waitForPools(): Promise<void> {
  const deadline = Date.now() + 120_000;
  for (;;) {
    const h = (await call('GET', '/healthz')).json as { pools?: Record<string, { ready: number }> };
    if (Object.values(h.pools ?? {}).every((p) => p.ready >= 2) && engine.isReady()) return;
    if (Date.now() > deadline) throw new Error(`pools did not fill: ${JSON.stringify(h.pools)}`);
    await sleep(200);
  }
}

test(`fuzz: ${N} generated requests (seed ${SEED}) against a real engine: no undocumented 5xx, documented errors, no leaks`, async () => {
  console.log(`fuzz seed ${SEED} (replay with FUZZ_SEED=${SEED}), ${N} requests`);
  // The engine keeps VMMs ahead of forks once a template's sandboxes fork (forkReceivers.ts), as many
  // as the largest fork: one fork of 2 first, so that they are in the baseline as they will be at the end.
  const warm = api.keys.create({ tenant: 'warm-up', tier: 'enterprise' }).key;
  const parent = await call('POST', '/v1/sandboxes', warm, { template: 'base' });
  assert.equal(parent.status, 201, parent.text);
  const kids = await call('POST', `/v1/sandboxes/${parent.json.id}/fork`, warm, { count: 2 });
  assert.equal(kids.status, 201, kids.text);
  for (const id of [parent.json.id, ...kids.json.sandboxes.map((k: { id: string }) => k.id)]) assert.equal((await call('DELETE', `/v1/sandboxes/${id}`, warm)).status, 204);
  const quiet = async () => {
    await engine.settled();
    await waitForPools();
    await sleep(500);
  };
  await quiet();
  const baseline = fds();

  const main = api.keys.create({ tenant: 'fuzz', tier: 'enterprise' }).key;
  const demo = api.keys.create({ tenant: 'fuzz-demo', tier: 'demo' }).key;
  const victim = api.keys.create({ tenant: 'victim', tier: 'pro' }).key;
  const v = await call('POST', '/v1/sandboxes', victim, { template: 'base' });
  assert.equal(v.status, 201, v.text);
  const victimSandbox = v.json.id as string;

  const stats = await runFuzz(
    { base, keys: { main, demo, victim }, victimSandbox },
    { seed: SEED, requests: N, lanes: 4, log: (l) => console.log(l), hostSecrets: [SECRET, ...hostShadowLines()], escapeMarker: ESCAPE_MARKER },
  );
  console.log(`fuzz seed ${SEED}: ${stats.sent} requests in ${(stats.ms / 1000).toFixed(1)} s; statuses ${JSON.stringify(stats.byStatus)}; 5xx ${JSON.stringify(countBy(stats.fiveHundreds.map((f) => `${f.status} ${f.code} (${f.kind})`)))}`);
  console.log(`fuzz kinds ${JSON.stringify(stats.byKind)}`);
  console.log(`fuzz codes ${JSON.stringify(stats.codes)}`);
  assert.ok(stats.sent >= N, `only ${stats.sent} of ${N} requests were sent`);

  // The generator reached what it is meant to reach.
  for (const s of [200, 201, 204, 400, 401, 404, 405, 409, 413, 415, 422]) assert.ok(stats.byStatus[s], `never saw ${s}`);
  for (const c of ['validation_error', 'invalid_json', 'unauthorized', 'sandbox_not_found', 'not_found', 'method_not_allowed', 'payload_too_large', 'invalid_state', 'idempotency_key_reused']) {
    assert.ok(stats.codes[c], `never saw ${c}`);
  }

  // The server still answers, and the victim's sandbox was never touched.
  const health = await call('GET', '/healthz');
  assert.equal(health.status, 200, health.text);
  const vs = (await call('GET', `/v1/sandboxes/${victimSandbox}`, victim)).json as { state: string; exec_count: number; children: string[] };
  assert.equal(vs.state, 'running');
  assert.equal(vs.exec_count, 0);
  assert.deepEqual(vs.children, []);

  // Writes through traversing paths stayed in the guests.
  const escaped = readdirSync(dirname(ESCAPE_MARKER)).filter((f) => f.startsWith(basename(ESCAPE_MARKER)));
  assert.deepEqual(escaped, [], 'files written through the file API appeared on the host');

  // Every snapshot the lanes took was deleted by the steps that took it (the engine's deleteAll would hide one left).
  for (const key of [main, demo, victim]) {
    const snaps = (await call('GET', '/v1/snapshots?limit=1000', key)).json as { snapshots: Array<{ id: string; name: string | null }> };
    assert.deepEqual(snaps.snapshots.map((s) => `${s.id} ${s.name}`), [], 'snapshots left behind by the fuzz');
  }

  // Everything deleted through the API; then the descriptors come back to where they were.
  for (const key of [main, demo, victim]) {
    const list = (await call('GET', '/v1/sandboxes?limit=1000', key)).json as { sandboxes: Array<{ id: string }> };
    for (const s of list.sandboxes) {
      const d = await call('DELETE', `/v1/sandboxes/${s.id}`, key);
      assert.equal(d.status, 204, `delete ${s.id}: ${d.text}`);
    }
  }
  assert.deepEqual(engine.list({ limit: 1000 }).sandboxes.map((s) => s.id), [], 'sandboxes left after deleting every listed one');
  await quiet();
  const deadline = Date.now() + 30_000;
  let now = fds();
  while (now.size > baseline.size + 2 && Date.now() < deadline) {
    await sleep(250);
    now = fds();
  }
  const extra = [...now].filter(([fd, target]) => baseline.get(fd) !== target).map(([fd, target]) => `${fd} → ${describe(target)}`);
  assert.ok(now.size <= baseline.size + 2, `${now.size} descriptors open, ${baseline.size} before the fuzz; new ones:\n${extra.join('\n')}`);
  assert.ok(!existsSync(ESCAPE_MARKER));
});
