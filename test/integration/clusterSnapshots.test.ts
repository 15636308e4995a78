/**
 * Snapshots across the hosts of a cluster on real microVMs: three `collimate serve --cluster` hosts,
 * each in a network namespace of its own, sharing one throwaway PostgreSQL 15 on the bridge between
 * them (as cluster.test.ts, in a file of its own so each stays within the suite's per-file time).
 *
 * A start of 3 from a snapshot whose host has room for one puts one there and two on another host,
 * which pulls the snapshot by digest (holes not sent); each continues the snapshot's counter with a
 * fresh identity; the copy is not listed as the tenant's; later starts go to hosts holding it; a fork
 * of 3 whose host has room for one spills the same way, each child the sandbox's; deleting the
 * snapshot drops the copies while the sandboxes started from them run on. No QEMU is left after.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import Database from 'better-sqlite3';
import pg from 'pg';
import { dbPathOf } from '../../src/cli/commands.ts';
import { hostNetUnavailable, makeHostNet, type HostNet } from '../support/hostNet.ts';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../support/postgres.js';
import { clusterCall as call, clusterKey, clusterSandboxes, removeHostHomes, startClusterHost, stopClusterHost, type ClusterHost as Host } from './clusterHosts.ts';

const skip = postgresUnavailable() ?? hostNetUnavailable() ?? false;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('snapshots across cluster hosts on real microVMs: three hosts in network namespaces, one PostgreSQL', { skip }, () => {
  let net: HostNet;
  let server: ThrowawayPostgres;
  let db: pg.Pool;
  const hosts: Host[] = [];
  let beta = '';
  const owned: Array<{ id: string; key: string }> = [];
  const hostOf = new Map<string, Host>();

  before(async () => {
    net = makeHostNet(3);
    server = await startPostgres({ listenOn: net.gateway });
    beta = clusterKey(server.url, 'beta', 'pro');
    for (let i = 0; i < 3; i++) hosts.push(await startClusterHost({ cluster: server.url, capacity: 14, net, machine: i }));
    db = new pg.Pool({ connectionString: server.url });
    db.on('error', () => {});
    for (const r of (await db.query('SELECT id, address FROM hosts')).rows) hostOf.set(r.id, hosts.find((h) => h.url === r.address)!);
    assert.equal(hostOf.size, 3);
  });

  after(async () => {
    for (const s of owned) await call(hosts[0].url, s.key, 'DELETE', `/v1/sandboxes/${s.id}`).catch(() => {});
    for (const h of hosts) await stopClusterHost(h);
    await db?.end();
    await server?.stop();
    net?.close();
    await removeHostHomes(hosts);
  });

  const { ownerOf, create, remove } = clusterSandboxes(() => db, hostOf, owned);

  test('a start of 3 from a snapshot whose host has room for 1 spills onto a host that pulls the snapshot by digest; each continues its counter with its own identity; a later start prefers the holders; a fork too wide for its host spills too; the copies go with the snapshot', async () => {
    const idOf = (h: Host) => [...hostOf.entries()].find(([, x]) => x === h)![0];
    const exec = async (via: Host, sid: string, command: string) => {
      const r = await call(via.url, beta, 'POST', `/v1/sandboxes/${sid}/exec`, { command });
      assert.equal(r.status, 200, r.bytes.toString());
      return r.json as { stdout: string; exit_code: number };
    };
    const id = await create(hosts[0], beta);
    const origin = await ownerOf(id);
    const via = hosts.find((h) => h !== origin)!;
    await exec(via, id, 'echo kept > /root/f');
    const counter = 'i=0; while true; do i=$((i+1)); echo $i > /root/c.new; mv /root/c.new /root/c; sleep 0.2; done';
    assert.equal((await call(via.url, beta, 'POST', `/v1/sandboxes/${id}/processes`, { command: counter })).status, 201);
    const count = async (sid: string) => Number((await exec(via, sid, 'cat /root/c')).stdout.trim());
    while ((await count(id)) < 2) await sleep(100);
    const taken = await call(via.url, beta, 'POST', `/v1/sandboxes/${id}/snapshots`, { name: 'spill' });
    assert.equal(taken.status, 201, taken.bytes.toString());
    const snap = taken.json.id as string;
    const atSnapshot = await count(id);

    // The origin keeps room for one: a reservation holds the rest of its capacity, as placements in flight would.
    const fill = async (host: Host, leave: number) => {
      const r = await db.query(`SELECT h.capacity - (SELECT count(*) FROM sandboxes s WHERE s.host_id = h.id AND s.state = 'running')
        - (SELECT coalesce(sum(slots), 0) FROM reservations r WHERE r.host_id = h.id AND r.lease_until > now()) AS free FROM hosts h WHERE h.id = $1`, [idOf(host)]);
      const rsv = `rsv_fill${randomBytes(4).toString('hex')}`;
      await db.query(`INSERT INTO reservations (id, tenant, host_id, slots, lease_until) VALUES ($1, 'filler', $2, $3, now() + interval '10 minutes')`, [rsv, idOf(host), Number(r.rows[0].free) - leave]);
      return () => db.query('DELETE FROM reservations WHERE id = $1', [rsv]);
    };
    const unfill = await fill(origin, 1);
    const started = await call(via.url, beta, 'POST', '/v1/sandboxes', { snapshot: snap, count: 3 });
    await unfill();
    assert.equal(started.status, 201, started.bytes.toString());
    const kids = (started.json.sandboxes as Array<{ id: string }>).map((k) => k.id);
    for (const k of kids) owned.push({ id: k, key: beta });
    assert.equal(kids.length, 3);
    const placed = await Promise.all(kids.map(ownerOf));
    assert.equal(placed.filter((h) => h === origin).length, 1, 'the origin takes what it has room for');
    const puller = placed.find((h) => h !== origin)!;
    assert.equal(placed.filter((h) => h === puller).length, 2, 'the rest go to one other host, which has room for both');
    for (const k of kids) {
      assert.equal((await exec(via, k, 'cat /root/f')).stdout, 'kept\n', `${k} has the snapshot's files`);
      const from = await count(k);
      assert.ok(from >= atSnapshot, `${k} continues the count from the snapshot's ${atSnapshot} (read ${from})`);
      const deadline = Date.now() + 30_000;
      while ((await count(k)) <= from) {
        assert.ok(Date.now() < deadline, `${k}'s counter moves on`);
        await sleep(100);
      }
    }
    const boots = await Promise.all([id, ...kids].map(async (k) => (await exec(via, k, 'cat /proc/sys/kernel/random/boot_id')).stdout));
    assert.equal(new Set(boots).size, 4, 'each a fresh identity');
    // The pulling host holds a copy (not listed as the tenant's: the snapshot is its origin's), pulled as data only.
    const pulled = /pulled a copy of snapshot (\S+) from host (\S+): (\d+) bytes of files, (\d+) sent, (\d+) ms/.exec(puller.stderr());
    assert.ok(pulled, `the puller says what it pulled: ${puller.stderr().slice(-2000)}`);
    assert.equal(pulled[1], snap);
    assert.equal(pulled[2], idOf(origin));
    assert.ok(Number(pulled[4]) < Number(pulled[3]), 'holes are not sent');
    process.stderr.write(`# pulled a snapshot to start from it: ${pulled[3]} bytes of files, ${pulled[4]} sent, ${pulled[5]} ms\n`);
    const copyRows = () => {
      const j = new Database(dbPathOf(puller.home), { readonly: true, fileMustExist: true });
      try {
        return j.prepare('SELECT id, origin FROM snapshots').all() as Array<{ id: string; origin: string | null }>;
      } finally {
        j.close();
      }
    };
    assert.deepEqual(copyRows(), [{ id: snap, origin: idOf(origin) }]);
    const listed = await call(puller.url, beta, 'GET', '/v1/snapshots');
    assert.deepEqual(listed.json.snapshots.map((x: { id: string }) => x.id).filter((x: string) => x === snap), [snap], 'listed once, through any host');

    // Placement prefers the hosts that hold it: the third host, which has not pulled it, is not chosen.
    const third = hosts.find((h) => h !== origin && h !== puller)!;
    const published = Date.now() + 60_000;
    while ((await db.query(`SELECT 1 FROM blob_locations WHERE kind = 'snapshot' AND of = $1 AND host_id = $2`, [snap, idOf(puller)])).rowCount === 0) {
      assert.ok(Date.now() < published, 'the copy is published');
      await sleep(200);
    }
    for (let i = 0; i < 2; i++) {
      const one = await call(third.url, beta, 'POST', '/v1/sandboxes', { snapshot: snap });
      assert.equal(one.status, 201, one.bytes.toString());
      owned.push({ id: one.json.id, key: beta });
      assert.notEqual(await ownerOf(one.json.id), third, 'a start goes to a host holding the snapshot');
      await remove(via, beta, one.json.id);
    }

    // A fork of 3 whose host has room for 1: the rest spill onto others, each the sandbox's child with its files.
    const unfillAgain = await fill(origin, 1);
    const forked = await call(via.url, beta, 'POST', `/v1/sandboxes/${id}/fork`, { count: 3 });
    await unfillAgain();
    assert.equal(forked.status, 201, forked.bytes.toString());
    const children = forked.json.sandboxes as Array<{ id: string }>;
    for (const c of children) owned.push({ id: c.id, key: beta });
    assert.equal(children.length, 3);
    const forkPlaced = await Promise.all(children.map((c) => ownerOf(c.id)));
    assert.equal(forkPlaced.filter((h) => h === origin).length, 1, 'the parent\'s host takes what it has room for');
    for (const c of children) {
      const info = await call(via.url, beta, 'GET', `/v1/sandboxes/${c.id}`);
      assert.equal(info.json.parent, id, `${c.id} is the sandbox's child`);
      assert.equal((await exec(via, c.id, 'cat /root/f')).stdout, 'kept\n');
    }
    // The fork's own snapshot went with it: only the tenant's one is listed.
    const after = await call(via.url, beta, 'GET', '/v1/snapshots');
    assert.deepEqual(after.json.snapshots.map((x: { id: string }) => x.id), [snap]);

    // Deleting the snapshot drops the copies; the sandboxes started from them run on.
    assert.equal((await call(via.url, beta, 'DELETE', `/v1/snapshots/${snap}`)).status, 204);
    assert.deepEqual(copyRows(), [], 'the copy went with the snapshot');
    for (const k of kids) assert.equal((await exec(via, k, 'cat /root/f')).stdout, 'kept\n', `${k} runs on`);
    for (const s of [id, ...kids, ...children.map((c) => c.id)]) await remove(via, beta, s);
  });
});
