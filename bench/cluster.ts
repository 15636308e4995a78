/**
 * Cluster mode on real microVMs: three `collimate serve --cluster` hosts, each in a network namespace
 * of its own, one throwaway PostgreSQL 15 on the bridge between them (as test/integration/cluster.test.ts),
 * the server's default cluster timings. Measures, in one run:
 *
 * - create latency answered by the host that runs the sandbox (the entry node placed it on itself)
 *   against a create that the entry node forwarded to another host, p50/p99;
 * - exec `true` through the owner against through a non-owner, interleaved, p50/p99;
 * - PostgreSQL round trips per create: statements PostgreSQL logged (log_statement = all) during
 *   sequential creates, less the background rate (heartbeats, sweeps) measured over an idle window
 *   of the same length;
 * - blob transfer between hosts: a template artifact's RAM file pulled from a peer by the blob
 *   fetcher, as another host, digest verified: the largest as its data runs only (as hosts pull
 *   them), the smallest whole (every byte on the wire);
 * - after `kill -9` of a host: time until a survivor answers its running sandbox is lost, and until
 *   the first create through a survivor succeeds (the killed host restarted between rounds).
 *
 * Throughput from 1 to 3 hosts is not measured: the three hosts share this machine's 2 cores.
 *
 *   node --import tsx bench/cluster.ts [--runs 30] [--kills 10]
 */
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { BlobFetcher } from '../src/cluster/blobFetcher.ts';
import { BlobLocations } from '../src/cluster/blobLocations.ts';
import { makeHostNet } from '../test/support/hostNet.ts';
import { startPostgres } from '../test/support/postgres.ts';
import { clusterCall as call, clusterKey, startClusterHost, stopClusterHost, type ClusterHost } from '../test/integration/clusterHosts.ts';
import { qemuProcesses } from '../test/integration/fixture.ts';
import { fmt, summary } from './stats.ts';

const { values } = parseArgs({ options: { runs: { type: 'string', default: '30' }, kills: { type: 'string', default: '10' } } });
const RUNS = Number(values.runs);
const KILLS = Number(values.kills);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const row = (name: string, xs: number[]) => {
  const s = summary(xs);
  console.log(`| ${name} | ${s.n} | ${fmt(s.p50)} ms | ${fmt(s.p99)} ms |`);
};

const net = makeHostNet(3);
const server = await startPostgres({ listenOn: net.gateway });
const db = new pg.Pool({ connectionString: server.url });
db.on('error', () => {});
const hosts: ClusterHost[] = [];
try {
  const key = clusterKey(server.url, 'bench', 'pro');
  for (let i = 0; i < 3; i++) hosts.push(await startClusterHost({ cluster: server.url, capacity: 16, net, machine: i, timings: null }));
  const hostIds = new Map<string, number>((await db.query('SELECT id, address FROM hosts')).rows.map((r) => [r.id, hosts.findIndex((h) => h.url === r.address)]));
  const owner = async (id: string) => hosts[hostIds.get((await db.query('SELECT host_id FROM sandboxes WHERE id = $1', [id])).rows[0].host_id)!];
  const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ')[0];
  console.log(`# bench/cluster.ts — ${new Date().toISOString()}, load average ${load()} at the start`);
  // Warm pools settle before anything is timed.
  await sleep(10_000);

  // ---- create: answered by the entry node itself vs forwarded -----------------------------------
  const local: number[] = [];
  const forwarded: number[] = [];
  for (let i = 0; local.length < RUNS || forwarded.length < RUNS; i++) {
    const via = hosts[i % 3];
    const t0 = performance.now();
    const r = await call(via.url, key, 'POST', '/v1/sandboxes', { template: 'base' });
    const ms = performance.now() - t0;
    if (r.status !== 201) throw new Error(`create: ${r.status} ${r.bytes}`);
    const o = await owner(r.json.id);
    (o === via ? local : forwarded).push(ms);
    await call(via.url, key, 'DELETE', `/v1/sandboxes/${r.json.id}`);
    // Let the pools refill, as a create arriving later would find them.
    await sleep(300);
    if (i > RUNS * 20) throw new Error('placement never put enough creates on their entry node');
  }

  // ---- exec through the owner vs a non-owner ----------------------------------------------------
  const sb = await call(hosts[0].url, key, 'POST', '/v1/sandboxes', { template: 'base' });
  const o = await owner(sb.json.id);
  const other = hosts.find((h) => h !== o)!;
  const viaOwner: number[] = [];
  const viaOther: number[] = [];
  for (let i = 0; i < RUNS * 2; i++) {
    for (const [h, out] of [[o, viaOwner], [other, viaOther]] as const) {
      const t0 = performance.now();
      const r = await call(h.url, key, 'POST', `/v1/sandboxes/${sb.json.id}/exec`, { command: 'true' });
      if (r.status !== 200) throw new Error(`exec: ${r.status} ${r.bytes}`);
      out.push(performance.now() - t0);
    }
  }
  await call(o.url, key, 'DELETE', `/v1/sandboxes/${sb.json.id}`);

  console.log('\n| measure | n | p50 | p99 |\n|---|---|---|---|');
  row('create, answered by the entry node (it placed the sandbox on itself)', local);
  row('create, forwarded by the entry node to the owner', forwarded);
  row('exec `true` through the owner', viaOwner);
  row('exec `true` through a non-owner', viaOther);
  console.log(`\ncreate forwarded / local (p50): ${(summary(forwarded).p50 / summary(local).p50).toFixed(2)}×; exec through a non-owner / owner (p50): ${(summary(viaOther).p50 / summary(viaOwner).p50).toFixed(2)}×`);

  // ---- PostgreSQL round trips per create --------------------------------------------------------
  await db.query(`ALTER SYSTEM SET log_statement = 'all'`);
  await db.query(`ALTER SYSTEM SET log_line_prefix = '%m %a '`);
  await db.query('SELECT pg_reload_conf()');
  await sleep(1000);
  const log = join(server.dir, 'server.log');
  const statementsSince = (offset: number) =>
    readFileSync(log).subarray(offset).toString('utf8').split('\n').filter((l) => / collimate (LOG: {2}statement|LOG: {2}execute)/.test(l)).length;
  const N = 10;
  let at = statSync(log).size;
  let t0 = performance.now();
  const made: string[] = [];
  for (let i = 0; i < N; i++) {
    const r = await call(hosts[i % 3].url, key, 'POST', '/v1/sandboxes', { template: 'base' });
    if (r.status !== 201) throw new Error(`create: ${r.status} ${r.bytes}`);
    made.push(r.json.id);
  }
  const window = performance.now() - t0;
  await sleep(500); // the directory's writes of the last create land
  const during = statementsSince(at);
  at = statSync(log).size;
  await sleep(window);
  const idle = statementsSince(at);
  await db.query('ALTER SYSTEM RESET log_statement');
  await db.query('SELECT pg_reload_conf()');
  for (const id of made) await call(hosts[0].url, key, 'DELETE', `/v1/sandboxes/${id}`);
  console.log(`\nPostgreSQL statements per create: ${((during - idle) / N).toFixed(1)} (${during} logged over ${N} sequential creates in ${(window / 1000).toFixed(1)} s, ${idle} in an idle window as long: heartbeats, sweeps)`);

  // ---- blob transfer between hosts ---------------------------------------------------------------
  {
    const [a, b] = [...hostIds.keys()];
    const secret = (await db.query(`SELECT value FROM cluster_settings WHERE name = 'peer_secret'`)).rows[0].value as string;
    // Hosts publish what they hold in the background after they start (hashing artifact files once).
    const pick = async (order: 'DESC' | 'ASC') => {
      for (const deadline = Date.now() + 600_000; Date.now() < deadline; await sleep(500)) {
        const r = await db.query(`SELECT digest, size FROM blob_locations WHERE host_id = $1 AND kind = 'artifact-mem' ORDER BY size ${order} LIMIT 1`, [a]);
        if (r.rows[0]) return { digest: r.rows[0].digest as string, size: Number(r.rows[0].size) };
      }
      throw new Error(`host ${a} published no template RAM file`);
    };
    // As host B: its own copies are excluded, so every byte comes from a peer over HTTP.
    const fetcher = new BlobFetcher(new BlobLocations(db), { hostId: b, secret: () => secret, peerHeader: 'x-collimate-peer' });
    const dir = mkdtempSync(join(tmpdir(), 'collimate-bench-blobs-'));
    try {
      console.log('\n| blob pulled from a peer (as another host; digest verified before commit) | n | size | sent | p50 | p99 | data rate (p50) |\n|---|---|---|---|---|---|---|');
      // The largest RAM file as its data runs (how peers pull it), the smallest whole (a plain body: the wire's rate).
      for (const [order, sparse] of [['DESC', true], ['ASC', false]] as const) {
        const blob = await pick(order);
        const ms: number[] = [];
        let sent = 0;
        for (let i = 0; i < RUNS / 3; i++) {
          const dest = join(dir, `${order}-${i}`);
          const t0 = performance.now();
          const got = await fetcher.fetch(blob.digest, dest, { sparse });
          ms.push(performance.now() - t0);
          sent = got.transferred;
          rmSync(dest, { force: true });
        }
        const s = summary(ms);
        const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
        console.log(`| ${sparse ? 'a template RAM file, its data runs only' : 'a template RAM file, whole (holes sent as zeros)'} | ${s.n} | ${mb(blob.size)} | ${mb(sent)} | ${fmt(s.p50)} ms | ${fmt(s.p99)} ms | ${(sent / 1e6 / (s.p50 / 1000)).toFixed(0)} MB/s |`);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }

  // ---- kill -9 a host -------------------------------------------------------------------------
  const toLost: number[] = [];
  const toCreate: number[] = [];
  for (let k = 0; k < KILLS; k++) {
    const victimIndex = 2;
    const victim = hosts[victimIndex];
    // A running sandbox on the victim.
    let onVictim = '';
    const extra: string[] = [];
    while (!onVictim) {
      const r = await call(victim.url, key, 'POST', '/v1/sandboxes', { template: 'base' });
      if (r.status !== 201) throw new Error(`create: ${r.status} ${r.bytes}`);
      if ((await owner(r.json.id)) === victim) onVictim = r.json.id;
      else extra.push(r.json.id);
    }
    for (const id of extra) await call(hosts[0].url, key, 'DELETE', `/v1/sandboxes/${id}`);
    const killedAt = performance.now();
    await stopClusterHost(victim, 'SIGKILL');
    const created = (async () => {
      for (;;) {
        const r = await call(hosts[k % 2].url, key, 'POST', '/v1/sandboxes', { template: 'base' });
        if (r.status === 201) {
          toCreate.push(performance.now() - killedAt);
          await call(hosts[0].url, key, 'DELETE', `/v1/sandboxes/${r.json.id}`);
          return;
        }
        await sleep(100);
      }
    })();
    for (;;) {
      const r = await call(hosts[(k + 1) % 2].url, key, 'GET', `/v1/sandboxes/${onVictim}`);
      if (r.status === 404) break;
      await sleep(100);
    }
    toLost.push(performance.now() - killedAt);
    await created;
    // Back as itself: it stops the lost sandbox's VM and takes creates again.
    hosts[victimIndex] = await startClusterHost({ cluster: server.url, capacity: 16, net, machine: victimIndex, home: victim.home, timings: null });
    while ((await db.query(`SELECT 1 FROM hosts WHERE address = $1 AND state = 'alive' AND lease_until > now()`, [victim.url])).rowCount === 0) await sleep(200);
    await sleep(3000);
  }
  console.log('\n| after kill -9 of a host (defaults: heartbeat 2 s, lease 10 s, dead after 15 s) | n | p50 | p99 |\n|---|---|---|---|');
  row('until a survivor answers its running sandbox is lost', toLost);
  row('until the first create through a survivor succeeds', toCreate);
  console.log(`\nload average ${load()} at the end`);
} finally {
  for (const h of hosts) await stopClusterHost(h).catch(() => {});
  await db.end();
  await server.stop();
  net.close();
  for (const h of hosts) {
    const deadline = Date.now() + 10_000;
    while (qemuProcesses(h.home).length > 0 && Date.now() < deadline) await sleep(100);
    rmSync(h.home, { recursive: true, force: true });
  }
}
