/**
 * A start from a snapshot on a host that must first pull it, on real microVMs: two `collimate serve
 * --cluster` hosts in network namespaces of their own and one throwaway PostgreSQL 15 (as
 * test/integration/cluster.test.ts). Each run takes a new snapshot of a sandbox on host A that has
 * written `--mib` MiB of fresh memory and files, then, interleaved:
 *
 * - **at the origin**: a start of 1 from it, placed on A (the host holding it);
 * - **with a pull**: a start of 1 from it with A full (a reservation holds A's capacity, as
 *   placements in flight would), so it goes to B, which pulls a copy first: the start's time, and
 *   the pull's own figures as B logs them (the files' bytes, the bytes sent, its time);
 * - **from the copy**: the same again, now that B holds the copy.
 *
 * Medians and p99 over the runs; ratios against the start at the origin measured in the same run.
 *
 *   node --import tsx bench/snapshot-pull.ts [--runs 10] [--mib 32]
 */
import { readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { makeHostNet } from '../test/support/hostNet.ts';
import { startPostgres } from '../test/support/postgres.ts';
import { clusterCall as call, clusterKey, startClusterHost, stopClusterHost, type ClusterHost } from '../test/integration/clusterHosts.ts';
import { fmt, summary } from './stats.ts';

const { values } = parseArgs({ options: { runs: { type: 'string', default: '10' }, mib: { type: 'string', default: '32' } } });
const RUNS = Number(values.runs);
const MIB = Number(values.mib);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

const net = makeHostNet(2);
const server = await startPostgres({ listenOn: net.gateway });
const db = new pg.Pool({ connectionString: server.url });
db.on('error', () => {});
const hosts: ClusterHost[] = [];
try {
  const key = clusterKey(server.url, 'bench', 'pro');
  for (let i = 0; i < 2; i++) hosts.push(await startClusterHost({ cluster: server.url, capacity: 8, net, machine: i }));
  const ids = new Map<string, ClusterHost>((await db.query('SELECT id, address FROM hosts')).rows.map((r) => [r.id, hosts.find((h) => h.url === r.address)!]));
  const idOf = (h: ClusterHost) => [...ids].find(([, x]) => x === h)![0];
  const owner = async (id: string) => ids.get((await db.query('SELECT host_id FROM sandboxes WHERE id = $1', [id])).rows[0].host_id)!;
  const ok = (r: { status: number; bytes: Buffer }, status: number, what: string) => {
    if (r.status !== status) throw new Error(`${what}: ${r.status} ${r.bytes}`);
  };
  console.log(`# bench/snapshot-pull.ts — ${new Date().toISOString()}, load average ${load()} at the start, ${RUNS} runs, ${MIB} MiB written per snapshot`);
  await sleep(10_000); // warm pools settle before anything is timed

  const parent = await call(hosts[0].url, key, 'POST', '/v1/sandboxes', { template: 'base' });
  ok(parent, 201, 'create');
  const a = await owner(parent.json.id);
  const b = hosts.find((h) => h !== a)!;
  const fillA = async () => {
    const rsv = `rsv_bench${randomBytes(4).toString('hex')}`;
    await db.query(`INSERT INTO reservations (id, tenant, host_id, slots, lease_until) SELECT $1, 'filler', h.id, h.capacity, now() + interval '10 minutes' FROM hosts h WHERE h.id = $2`, [rsv, idOf(a)]);
    return () => db.query('DELETE FROM reservations WHERE id = $1', [rsv]);
  };
  const startOne = async (snap: string, where: ClusterHost): Promise<number> => {
    const t0 = performance.now();
    const r = await call(b.url, key, 'POST', '/v1/sandboxes', { snapshot: snap });
    const ms = performance.now() - t0;
    ok(r, 201, 'start from a snapshot');
    const on = await owner(r.json.id);
    if (on !== where) throw new Error(`the start went to ${on.url}, not ${where.url}`);
    ok(await call(b.url, key, 'DELETE', `/v1/sandboxes/${r.json.id}`), 204, 'delete');
    return ms;
  };
  const atOrigin: number[] = [];
  const withPull: number[] = [];
  const fromCopy: number[] = [];
  const pulls: Array<{ bytes: number; sent: number; ms: number; exportMs: number; fetchMs: number }> = [];
  for (let i = 0; i < RUNS; i++) {
    // New memory and files each run: the snapshot's RAM image and disk differ from the last.
    ok(await call(b.url, key, 'POST', `/v1/sandboxes/${parent.json.id}/exec`, { command: `head -c ${MIB}M /dev/urandom > /root/m; head -c 1M /dev/urandom > /root/f${i}` }), 200, 'exec');
    const taken = await call(b.url, key, 'POST', `/v1/sandboxes/${parent.json.id}/snapshots`, {});
    ok(taken, 201, 'snapshot');
    const snap = taken.json.id as string;
    atOrigin.push(await startOne(snap, a));
    const unfill = await fillA();
    try {
      const logged = b.stderr().length;
      withPull.push(await startOne(snap, b));
      const m = /pulled a copy of snapshot \S+ from host \S+: (\d+) bytes of files, (\d+) sent, (\d+) ms \(export (\d+) ms, fetch (\d+) ms\)/.exec(b.stderr().slice(logged));
      if (!m) throw new Error(`host B did not log its pull: ${b.stderr().slice(logged)}`);
      pulls.push({ bytes: Number(m[1]), sent: Number(m[2]), ms: Number(m[3]), exportMs: Number(m[4]), fetchMs: Number(m[5]) });
      fromCopy.push(await startOne(snap, b));
    } finally {
      await unfill();
    }
    ok(await call(b.url, key, 'DELETE', `/v1/snapshots/${snap}`), 204, 'delete the snapshot');
  }
  await call(b.url, key, 'DELETE', `/v1/sandboxes/${parent.json.id}`);

  const MiB = 1024 * 1024;
  const row = (name: string, xs: number[], unit = 'ms') => {
    const s = summary(xs);
    console.log(`| ${name} | ${s.n} | ${fmt(s.p50)} ${unit} | ${fmt(s.p99)} ${unit} |`);
  };
  console.log('\n| measure | n | p50 | p99 |\n|---|---|---|---|');
  row('start of 1 at the snapshot\'s origin', atOrigin);
  row('start of 1 on a host that pulls the snapshot first', withPull);
  row('start of 1 on that host again (its copy held)', fromCopy);
  row('the pull itself (manifest, files, copy made)', pulls.map((p) => p.ms));
  row('  of it: the origin\'s export (the manifest\'s answer)', pulls.map((p) => p.exportMs));
  row('  of it: fetching the files (digests checked)', pulls.map((p) => p.fetchMs));
  row('  of it: the rest (copy recorded, disk rebased)', pulls.map((p) => p.ms - p.exportMs - p.fetchMs));
  row('the snapshot\'s files', pulls.map((p) => p.bytes / MiB), 'MiB');
  row('bytes sent for them (holes are not)', pulls.map((p) => p.sent / MiB), 'MiB');
  const p50 = (xs: number[]) => summary(xs).p50;
  console.log(`\nwith a pull / at the origin (p50): ${(p50(withPull) / p50(atOrigin)).toFixed(2)}×; from the copy / at the origin (p50): ${(p50(fromCopy) / p50(atOrigin)).toFixed(2)}×; load average ${load()} at the end`);
} finally {
  for (const h of hosts) await stopClusterHost(h).catch(() => {});
  await db.end();
  await server.stop();
  net.close();
}
