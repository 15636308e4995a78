/**
 * Cluster mode on real microVMs: three `collimate serve --cluster` hosts, each in a network
 * namespace of its own (test/support/hostNet.ts) with its own home, sharing one throwaway
 * PostgreSQL 15 that listens on the bridge between them (test/support/postgres.ts).
 *
 * 30 creates through the three nodes land on all three hosts; exec (plain and streamed), files, a
 * port's HTTP and a port's WebSocket through a non-owning node return the owner's bytes, and another
 * tenant gets 404 through every node; fork(4) asked through a non-owner puts every child on the
 * parent's host, each continuing the parent's counter process; the web terminal works through a
 * non-owner; a Demo tenant's 50 concurrent creates through the three nodes give exactly 2, twenty
 * rounds over; one Idempotency-Key sent to all three nodes gives one sandbox; a host killed with
 * SIGKILL has its running sandboxes `lost` (within the documented bound, reported), creates go to
 * the others, its suspended sandbox answers "unavailable" until it returns, and once restarted it
 * stops the VMs of the lost sandboxes and resumes the suspended one. A host pulls a template
 * artifact's three files from a peer by digest (RAM file and disk as their data only, kept sparse,
 * each digest checked). E2B's SDK creates through one host and runs commands and files through
 * another; every host's event stream, live stats and usage cover that sandbox. No QEMU is left after.
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import Database from 'better-sqlite3';
import pg from 'pg';
import { WebSocket } from 'ws';
import { dbPathOf } from '../../src/cli/commands.ts';
import { isRunning } from '../../src/host/claims.ts';
import { killPid } from '../../src/sandboxes/runtime.ts';
import { hostNetUnavailable, makeHostNet, type HostNet } from '../support/hostNet.ts';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../support/postgres.js';
import { wsConnect } from '../support/ws.ts';
import { BlobFetcher } from '../../src/cluster/blobFetcher.ts';
import { BlobLocations } from '../../src/cluster/blobLocations.ts';
import { sha256File } from '../../src/host/hash.ts';
import { clusterCall as call, clusterKey, clusterSandboxes, removeHostHomes, startClusterHost, stopClusterHost, type ClusterHost as Host } from './clusterHosts.ts';
import { qemuProcesses, TEST_CACHE } from './fixture.js';
import { busyboxEntries, image, layer, writeLayout } from '../support/oci.ts';
import { waitListening, WS_SERVER } from './guestServers.ts';
import { e2bKeyOf } from '../../src/service/keys.js';

const skip = postgresUnavailable() ?? hostNetUnavailable() ?? false;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const CLI = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
/** The hosts' cluster timings (ms): heartbeat, lease, dead-after. */
const TIMINGS = [1000, 15_000, 20_000] as const;

describe('cluster mode on real microVMs: three hosts in network namespaces, one PostgreSQL', { skip }, () => {
  let net: HostNet;
  let server: ThrowawayPostgres;
  let db: pg.Pool;
  const hosts: Host[] = [];
  let demo = '';
  let beta = '';
  let gamma = '';
  const owned: Array<{ id: string; key: string }> = [];
  const hostOf = new Map<string, Host>();
  /** Directories a test made outside the hosts' homes (removed once the hosts are stopped). */
  const scratch: string[] = [];

  before(async () => {
    net = makeHostNet(3);
    server = await startPostgres({ listenOn: net.gateway });
    demo = clusterKey(server.url, 'demo-tenant', 'demo');
    beta = clusterKey(server.url, 'beta', 'pro');
    gamma = clusterKey(server.url, 'gamma', 'pro');
    // One at a time: hosts warming their pools at once would only slow each other down.
    for (let i = 0; i < 3; i++) hosts.push(await startClusterHost({ cluster: server.url, capacity: 14, net, machine: i, timings: TIMINGS.join(',') }));
    db = new pg.Pool({ connectionString: server.url });
    db.on('error', () => {});
    for (const r of (await db.query('SELECT id, address FROM hosts')).rows) hostOf.set(r.id, hosts.find((h) => h.url === r.address)!);
    assert.equal(hostOf.size, 3);
  });

  after(async () => {
    const alive = hosts.find((h) => h.child.exitCode === null && h.child.signalCode === null);
    if (alive) for (const s of owned) await call(alive.url, s.key, 'DELETE', `/v1/sandboxes/${s.id}`).catch(() => {});
    for (const h of hosts) await stopClusterHost(h);
    // A host the test killed and did not restart (it failed first) left its VMs running.
    for (const h of hosts) if (h.child.signalCode === 'SIGKILL') for (const pid of qemuProcesses(h.home)) await killPid(pid);
    await db?.end();
    await server?.stop();
    net?.close();
    await removeHostHomes(hosts);
    for (const d of scratch) rmSync(d, { recursive: true, force: true });
  });

  const { ownerOf, create, remove } = clusterSandboxes(() => db, hostOf, owned);
  /** Runs `f` over `items`, `width` at a time. */
  const inBatches = async <T, R>(items: T[], width: number, f: (x: T, i: number) => Promise<R>): Promise<R[]> => {
    const out: R[] = [];
    for (let i = 0; i < items.length; i += width) out.push(...await Promise.all(items.slice(i, i + width).map((x, j) => f(x, i + j))));
    return out;
  };

  test('30 creates through the three nodes land on all three hosts', async () => {
    const ids = await inBatches(Array.from({ length: 30 }), 5, (_, i) => create(hosts[i % 3], beta));
    const perHost = new Map<Host, number>();
    for (const id of ids) {
      const h = await ownerOf(id);
      perHost.set(h, (perHost.get(h) ?? 0) + 1);
    }
    assert.equal(perHost.size, 3, `every host holds sandboxes: ${[...perHost.values()].join(', ')}`);
    const listed = await call(hosts[2].url, beta, 'GET', '/v1/sandboxes?limit=100');
    assert.deepEqual(listed.json.sandboxes.map((s: { id: string }) => s.id).sort(), [...ids].sort(), 'any node lists every host\'s sandboxes');
    await inBatches(ids, 5, (id, i) => remove(hosts[(i + 1) % 3], beta, id));
  });

  test('exec, streamed exec, files, a port and a port\'s WebSocket through a non-owner give the owner\'s bytes; another tenant gets 404 through every node', async () => {
    const id = await create(hosts[0], beta, { template: 'node' });
    const owner = await ownerOf(id);
    const others = hosts.filter((h) => h !== owner);
    // Output with every byte value and more than a pipe's worth of lines.
    const exec = { command: "printf '\\000\\001\\177\\200\\377'; seq 1 20000; echo to-stderr >&2; exit 3" };
    const direct = await call(owner.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, exec);
    assert.equal(direct.status, 200, direct.bytes.toString());
    assert.equal(direct.json.exit_code, 3);
    const sse = (b: Buffer) => b.toString('utf8').split('\n\n').filter((e) => e && !/^event: result/m.test(e));
    // Chunking of the output into events may differ run to run; the bytes they carry may not.
    const data = (events: string[], name: string) =>
      Buffer.concat(events.filter((e) => new RegExp(`^event: ${name}$`, 'm').test(e)).map((e) => Buffer.from(JSON.parse(/^data: (.*)$/m.exec(e)![1]).data, 'base64')));
    const dStream = await call(owner.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, exec, { accept: 'text/event-stream' });
    for (const other of others) {
      const via = await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, exec);
      assert.equal(via.status, 200, via.bytes.toString());
      for (const field of ['stdout', 'stderr', 'exit_code', 'stdout_encoding', 'stderr_encoding']) assert.deepEqual(via.json[field], direct.json[field], field);
      const vStream = await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, exec, { accept: 'text/event-stream' });
      assert.equal(vStream.headers.get('content-type'), dStream.headers.get('content-type'));
      assert.deepEqual(data(sse(vStream.bytes), 'stdout'), data(sse(dStream.bytes), 'stdout'));
      assert.deepEqual(data(sse(vStream.bytes), 'stderr'), data(sse(dStream.bytes), 'stderr'));
    }

    const blob = Buffer.from(Array.from({ length: 300_000 }, (_, i) => (i * 7919) % 256));
    const up = await call(others[0].url, beta, 'PUT', `/v1/sandboxes/${id}/files?path=/root/blob.bin`, blob, { 'content-type': 'application/octet-stream' });
    assert.ok(up.status >= 200 && up.status < 300, `upload: ${up.status} ${up.bytes}`);
    for (const h of hosts) {
      const down = await call(h.url, beta, 'GET', `/v1/sandboxes/${id}/files?path=/root/blob.bin`);
      assert.equal(down.status, 200);
      assert.deepEqual(down.bytes, blob, `download through ${h.url}`);
    }
    const sum = await call(owner.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, { command: 'sha256sum /root/blob.bin' });
    assert.match(sum.json.stdout, new RegExp(createHash('sha256').update(blob).digest('hex')));

    // A port: plain HTTP and a WebSocket, through every node.
    const start = await call(others[1].url, beta, 'POST', `/v1/sandboxes/${id}/exec`, {
      command: `(nohup node /root/ws.js >/root/ws.log 2>&1 &) && ${waitListening(9000)}; echo started`,
      files: [{ path: '/root/ws.js', content: WS_SERVER }],
    });
    assert.match(start.json.stdout, /started/);
    for (const h of hosts) {
      const plain = await call(h.url, beta, 'GET', `/v1/sandboxes/${id}/ports/9000/x?y=1`);
      assert.equal(plain.bytes.toString(), 'plain /x?y=1', `a port's HTTP through ${h.url}`);
      const ws = await wsConnect(`${h.url}/v1/sandboxes/${id}/ports/9000/chat`, { authorization: `Bearer ${beta}` });
      ws.send(`hello via ${h.url}`);
      // The echo says KEY-LEAKED if the key reached the guest's server.
      assert.equal(await ws.next(), `echo:hello via ${h.url}`);
      ws.close();
    }

    // Code cells (the JavaScript kernel warm in `node`): one kernel's state, through every node.
    const defined = await call(others[0].url, beta, 'POST', `/v1/sandboxes/${id}/code`, { code: 'var seen = []; seen.length' });
    assert.equal(defined.status, 200, defined.bytes.toString());
    for (const [i, h] of hosts.entries()) {
      const cell = await call(h.url, beta, 'POST', `/v1/sandboxes/${id}/code`, { code: `seen.push(${i}); seen.join(",")` });
      assert.equal(cell.status, 200, `a cell through ${h.url}: ${cell.bytes.toString()}`);
      assert.equal(cell.json.results[0].data['text/plain'], `'${[...Array(i + 1).keys()].join(',')}'`);
    }

    for (const h of hosts) {
      for (const [method, path] of [['GET', `/v1/sandboxes/${id}`], ['POST', `/v1/sandboxes/${id}/exec`], ['GET', `/v1/sandboxes/${id}/ports/9000/x`], ['DELETE', `/v1/sandboxes/${id}`]] as const) {
        const r = await call(h.url, gamma, method, path, method === 'POST' ? exec : undefined);
        assert.equal(r.status, 404, `${method} ${path} by another tenant through ${h.url}`);
        assert.equal(r.json.error.code, 'sandbox_not_found');
      }
    }
    await remove(others[0], beta, id);
  });

  test('fork(4) asked through a non-owner puts every child on the parent\'s host, each continuing the parent\'s counter; the web terminal works through a non-owner', async () => {
    const id = await create(hosts[1], beta);
    const owner = await ownerOf(id);
    const other = hosts.find((h) => h !== owner)!;
    // Each count is renamed into place: a read never meets the file truncated and empty (which read as 0).
    const counter = 'i=0; while true; do i=$((i+1)); echo $i > /root/c.new; mv /root/c.new /root/c; sleep 0.2; done';
    assert.equal((await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/processes`, { command: counter })).status, 201);
    const read = async (sid: string) => Number((await call(other.url, beta, 'POST', `/v1/sandboxes/${sid}/exec`, { command: 'cat /root/c 2>/dev/null || echo 0' })).json.stdout.trim());
    const moved = async (sid: string, past: number) => {
      const deadline = Date.now() + 30_000;
      for (;;) {
        const v = await read(sid);
        if (v > past) return v;
        assert.ok(Date.now() < deadline, `the counter of ${sid} did not move past ${past} in 30 s`);
        await sleep(100);
      }
    };
    const atFork = await moved(id, 0);
    const f = await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/fork`, { count: 4 });
    assert.equal(f.status, 201, f.bytes.toString());
    const children = (f.json.sandboxes as Array<{ id: string }>).map((c) => c.id);
    assert.equal(children.length, 4);
    for (const child of children) {
      owned.push({ id: child, key: beta });
      assert.equal(await ownerOf(child), owner, 'a child is on its parent\'s host');
      // It kept the parent's memory (the count went on from where it was), and it runs.
      assert.ok((await read(child)) >= atFork, 'the child continues the parent\'s count');
      await moved(child, await read(child));
    }

    // The web terminal through the non-owner: its key in the subprotocol, a PTY on the owner.
    const pid = (await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh'], pty: { cols: 80, rows: 24 } })).json.pid;
    const term = await new Promise<WebSocket>((resolve, reject) => {
      const ws = new WebSocket(`${other.url.replace('http', 'ws')}/v1/sandboxes/${id}/processes/${pid}/terminal`, ['collimate.terminal', `bearer.${beta}`]);
      ws.once('open', () => resolve(ws));
      ws.once('error', reject);
    });
    const answered = new Promise<void>((resolve) => {
      let out = '';
      term.on('message', (d: Buffer, binary: boolean) => {
        if (binary && (out += d.toString()).includes('42')) resolve();
      });
    });
    term.send(Buffer.from('echo $((6*7))\n'));
    await answered;
    term.close();

    for (const s of [id, ...children]) await remove(other, beta, s);
  });

  test('a Demo tenant firing 50 concurrent creates through the three nodes gets exactly 2, twenty rounds over', async () => {
    for (let round = 0; round < 20; round++) {
      const rs = await Promise.all(Array.from({ length: 50 }, (_, i) => call(hosts[(i + round) % 3].url, demo, 'POST', '/v1/sandboxes', { template: 'base' })));
      const created = rs.filter((r) => r.status === 201);
      for (const c of created) owned.push({ id: c.json.id, key: demo });
      assert.equal(created.length, 2, `round ${round}: ${rs.map((r) => `${r.status} ${r.json?.error?.code ?? ''}`).join(', ')}`);
      const others = rs.filter((r) => r.status !== 201 && !(r.status === 429 && r.json?.error?.code === 'concurrency_limit'));
      assert.deepEqual(others.map((r) => `${r.status} ${r.json?.error?.code ?? ''} ${r.json?.error?.message ?? r.bytes.toString().slice(0, 200)}`), [], `round ${round}: every other create is 429 concurrency_limit`);
      for (const c of created) await remove(hosts[(round + 1) % 3], demo, c.json.id);
    }
  });

  test('one Idempotency-Key sent to all three nodes at once yields one sandbox', async () => {
    const rs = await Promise.all(hosts.map((h) => call(h.url, beta, 'POST', '/v1/sandboxes', { template: 'base', labels: { idem: 'once' } }, { 'idempotency-key': 'cluster-vm-key-1' })));
    assert.ok(rs.every((r) => r.status === 201), rs.map((r) => r.bytes.toString()).join('\n'));
    const ids = new Set(rs.map((r) => r.json.id as string));
    assert.equal(ids.size, 1);
    assert.equal(rs.filter((r) => r.headers.get('idempotent-replayed') === 'true').length, 2, 'two of the three answers are replays');
    const [id] = ids;
    owned.push({ id, key: beta });
    const listed = await call(hosts[1].url, beta, 'GET', '/v1/sandboxes?label=idem%3Donce');
    assert.deepEqual(listed.json.sandboxes.map((s: { id: string }) => s.id), [id]);
    await remove(hosts[2], beta, id);
  });

  /** Whether a live process claims the artifact `key` in the shared cache (src/images/artifactGc.ts), so it is not collected. */
  const claimedNow = (key: string) => {
    try {
      // An artifact's directory is named by the first 24 hex digits of its key (src/images/bake.ts).
      return readdirSync(join(TEST_CACHE, 'artifacts', key.slice(0, 24), 'users')).some((f) => isRunning(Number(f.split('-')[0])));
    } catch {
      return false;
    }
  };

  test('a host pulls a template artifact\'s files from its peer by digest: the RAM file and disk as data only, kept sparse, each verified', async () => {
    const [a, b] = [...hostOf.keys()];
    // The hosts share the test's cache, so the third holds the same blobs: the pull comes from A or it.
    const secret = (await db.query(`SELECT value FROM cluster_settings WHERE name = 'peer_secret'`)).rows[0].value as string;
    // Each host publishes what it holds in the background after it starts (hashing artifact files once).
    let files: Array<{ digest: string; kind: string; size: number; of: string }> = [];
    const deadline = Date.now() + 600_000;
    while (files.length < 3) {
      assert.ok(Date.now() < deadline, 'host A published no whole artifact');
      await sleep(500);
      const r = await db.query(`SELECT digest, kind, size, of FROM blob_locations WHERE host_id = $1 AND kind LIKE 'artifact-%' ORDER BY of, kind`, [a]);
      const byKey = new Map<string, typeof files>();
      for (const x of r.rows) byKey.set(x.of, [...(byKey.get(x.of) ?? []), { ...x, size: Number(x.size) }]);
      // One some process uses (claims): the shared cache also lists artifacts of older bakes, whose
      // RAM files another test's server may collect between this choice and the pull.
      files = [...byKey.values()].find((g) => g.length === 3 && claimedNow(g[0].of)) ?? [];
    }
    const dir = mkdtempSync(join(tmpdir(), 'collimate-cluster-pull-'));
    try {
      // As host B: its own copies are excluded, so every byte comes from host A over HTTP.
      const fetcher = new BlobFetcher(new BlobLocations(db), { hostId: b, secret: () => secret, peerHeader: 'x-collimate-peer' });
      const moved: string[] = [];
      for (const f of files) {
        const dest = join(dir, f.kind);
        const got = await fetcher.fetch(f.digest, dest, { sparse: f.kind !== 'artifact-state' });
        assert.notEqual(got.hostId, b);
        assert.equal(got.size, f.size);
        assert.equal(statSync(dest).size, f.size);
        assert.equal(`sha256:${await sha256File(dest)}`, f.digest);
        const allocated = statSync(dest).blocks * 512;
        if (f.kind === 'artifact-state') assert.equal(got.transferred, f.size);
        else {
          // Holes are not sent: fewer bytes than the file's size cross (how many depends on what the
          // template's guest held when it was baked: a code interpreter's node guest fills more than half).
          assert.ok(got.transferred < f.size, `${f.kind}: ${got.transferred} of ${f.size} bytes sent`);
          assert.ok(allocated <= got.transferred + (1 << 20), `${f.kind}: the copy keeps its holes (${allocated} bytes allocated)`);
        }
        moved.push(`${f.kind} ${f.size} bytes, ${got.transferred} sent, ${allocated} allocated`);
      }
      assert.deepEqual(readdirSync(dir).sort(), ['artifact-disk', 'artifact-mem', 'artifact-state']);
      console.log(`artifact ${files[0].of.slice(0, 12)} pulled from a peer: ${moved.join('; ')}`);
      // The blob API itself answers tenants' keys with 401 on a real host.
      assert.equal((await call(hostOf.get(a)!.url, beta, 'GET', `/cluster/blobs/${files[0].digest}`)).status, 401);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('E2B\'s SDK through a non-owner (commands with the create\'s envs, files), and events, stats and usage of every host through each', async () => {
    const { Sandbox } = await import('e2b');
    // Both hosts' event streams are open before the create: each must carry it, whichever host runs it.
    const streams = hosts.map((h) => {
      const events: Array<{ sandbox_id: string; op: string }> = [];
      const ctl = new AbortController();
      let opened!: () => void;
      const open = new Promise<void>((r) => (opened = r));
      const done = (async () => {
        const res = await fetch(`${h.url}/v1/events`, { headers: { authorization: `Bearer ${beta}` }, signal: ctl.signal });
        for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
          opened(); // the server's first comment: the stream is in place
          for (const m of Buffer.from(chunk).toString('utf8').matchAll(/^data: (\{.*\})$/gm)) events.push(JSON.parse(m[1]));
        }
      })().catch(() => {});
      return { events, open, stop: async () => { ctl.abort(); await done; } };
    });
    await Promise.all(streams.map((s) => s.open));
    const key = e2bKeyOf(beta);
    const opts = (base: string) => ({ apiKey: key, apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd`, requestTimeoutMs: 300_000 });
    const sbx = await Sandbox.create('base', { ...opts(hosts[0].url), envs: { GREETING: 'hello-cluster' }, timeoutMs: 600_000 });
    owned.push({ id: sbx.sandboxId, key: beta });
    const owner = await ownerOf(sbx.sandboxId);
    const via = hosts.find((h) => h !== owner)!;
    const there = await Sandbox.connect(sbx.sandboxId, opts(via.url));
    const r = await there.commands.run('echo "$GREETING from $(cat /proc/sys/kernel/hostname 2>/dev/null || echo guest)"');
    assert.match(r.stdout, /^hello-cluster from /, 'the envs given at create apply on the owner, reached through the non-owner');
    await there.files.write('/root/e2b.txt', 'through-the-peer');
    assert.equal(await sbx.files.read('/root/e2b.txt'), 'through-the-peer');
    const stats = await call(via.url, beta, 'GET', '/v1/stats');
    assert.ok(stats.json.sandboxes.some((s: { id: string; memory_mib: number }) => s.id === sbx.sandboxId && s.memory_mib > 0), 'live stats of the owner\'s VM through the non-owner');
    await there.kill();
    owned.splice(owned.findIndex((o) => o.id === sbx.sandboxId), 1);
    for (const [i, s] of streams.entries()) {
      const deadline = Date.now() + 30_000;
      while (!(['create', 'delete'] as const).every((op) => s.events.some((e) => e.sandbox_id === sbx.sandboxId && e.op === op))) {
        assert.ok(Date.now() < deadline, `host ${i} streamed the create and the delete: ${JSON.stringify(s.events)}`);
        await sleep(100);
      }
      await s.stop();
    }
    for (const h of hosts) {
      const deadline = Date.now() + 30_000;
      for (;;) {
        const u = await call(h.url, beta, 'GET', '/v1/usage');
        const row = u.json.sandboxes.find((x: { id: string }) => x.id === sbx.sandboxId);
        if (row) {
          assert.ok(row.running_secs > 0 && row.vcpu_secs > 0);
          break;
        }
        assert.ok(Date.now() < deadline, `usage of the sandbox through ${h.url}`);
        await sleep(200);
      }
    }
  });

  test('a suspended sandbox moved to another host (collimate cluster move) resumes there through a third with its processes and files; a drain moves the rest; the source keeps nothing of them', async () => {
    const idOf = (h: Host) => [...hostOf.entries()].find(([, x]) => x === h)![0];
    const cli = (...args: string[]) => {
      const r = spawnSync(process.execPath, ['--import', 'tsx', CLI, 'cluster', ...args, '--cluster', server.url], { encoding: 'utf8' });
      return { status: r.status, out: r.stdout, err: r.stderr, json: (() => { try { return JSON.parse(r.stdout); } catch { return null; } })() };
    };
    const id = await create(hosts[0], beta);
    const source = await ownerOf(id);
    const [target, third] = hosts.filter((h) => h !== source);
    const exec = async (via: Host, sid: string, command: string) => {
      const r = await call(via.url, beta, 'POST', `/v1/sandboxes/${sid}/exec`, { command });
      assert.equal(r.status, 200, r.bytes.toString());
      return r.json as { stdout: string; exit_code: number };
    };
    // A file below a fork point's layer and one above it: the disk that moves is a chain.
    await exec(third, id, 'echo under-the-fork > /root/a');
    // Each count is renamed into place: a read never meets the file truncated and empty (which read as 0).
    const counter = 'i=0; while true; do i=$((i+1)); echo $i > /root/c.new; mv /root/c.new /root/c; sleep 0.2; done';
    const proc = await call(third.url, beta, 'POST', `/v1/sandboxes/${id}/processes`, { command: counter });
    assert.equal(proc.status, 201, proc.bytes.toString());
    const f = await call(third.url, beta, 'POST', `/v1/sandboxes/${id}/fork`, { count: 1 });
    assert.equal(f.status, 201, f.bytes.toString());
    const child = f.json.sandboxes[0].id as string;
    owned.push({ id: child, key: beta });
    const big = (await exec(third, id, 'head -c 300000 /dev/urandom > /root/big && sha256sum /root/big')).stdout;
    const count = async (via: Host) => Number((await exec(via, id, 'cat /root/c')).stdout.trim());
    while ((await count(third)) < 2) await sleep(100);
    const atSuspend = await count(third);

    // Running: refused, suspend it first. An unknown id, and the host it is on, refused too.
    const running = cli('move', id, '--to', idOf(target));
    assert.equal(running.status, 1);
    assert.match(running.err, /invalid_state: .*Suspend it first/, running.err);
    assert.match(cli('move', 'sbx_000000000000').err, /sandbox_not_found/);
    // Operators only: a tenant's key on the hosts' move endpoint is refused like none.
    const asTenant = await call(source.url, beta, 'POST', '/cluster/moves', { sandbox: id });
    assert.equal(asTenant.status, 401, asTenant.bytes.toString());
    const sus = await call(third.url, beta, 'POST', `/v1/sandboxes/${id}/suspend`);
    assert.equal(sus.status, 200, sus.bytes.toString());
    assert.match(cli('move', id, '--to', idOf(source)).err, /validation_error: .*already/);

    const moved = cli('move', id, '--to', idOf(target));
    assert.equal(moved.status, 0, moved.err + moved.out);
    assert.equal(moved.json.from, idOf(source));
    assert.equal(moved.json.to, idOf(target));
    assert.ok(moved.json.transferred < moved.json.bytes, `holes are not sent: ${moved.out}`);
    process.stderr.write(`# moved a suspended sandbox: ${moved.json.bytes} bytes of files, ${moved.json.transferred} sent, ${moved.json.ms} ms\n`);
    assert.equal(await ownerOf(id), target);
    assert.equal((await db.query('SELECT state FROM sandboxes WHERE id = $1', [id])).rows[0].state, 'suspended');
    const listed = await call(third.url, beta, 'GET', `/v1/sandboxes/${id}`);
    assert.equal(listed.json.state, 'suspended', listed.bytes.toString());

    // The source keeps nothing of it: no directory, no disk layer, its row deleted saying where it went.
    const leftovers = (h: Host, sid: string) => [
      ...readdirSync(join(h.home, 'sandboxes')).filter((n) => n === sid),
      ...readdirSync(join(h.home, 'disks')).filter((n) => n.startsWith(`${sid}-`)),
    ];
    const journal = new Database(dbPathOf(source.home), { readonly: true, fileMustExist: true });
    const row = journal.prepare('SELECT state, end_reason FROM sandboxes WHERE id = ?').get(id) as { state: string; end_reason: string };
    const refs = journal.prepare('SELECT owner FROM fork_point_refs').all() as Array<{ owner: string }>;
    const fpDisks = (journal.prepare('SELECT disk_path FROM fork_points').all() as Array<{ disk_path: string }>).map((r) => basename(r.disk_path));
    journal.close();
    assert.equal(row.state, 'deleted');
    assert.match(row.end_reason, new RegExp(`moved to cluster host ${idOf(target)}`));
    // The fork point under both stays, held by the child alone; nothing else of the moved one is left.
    assert.deepEqual(refs.map((r) => r.owner), [child], 'the fork point is held by the child, no longer by the moved sandbox');
    assert.equal(fpDisks.length, 1);
    assert.deepEqual(leftovers(source, id).filter((n) => !fpDisks.includes(n)), []);

    // Resumed through the third host: the same process goes on counting, the files are intact.
    const res = await call(third.url, beta, 'POST', `/v1/sandboxes/${id}/resume`);
    assert.equal(res.status, 200, res.bytes.toString());
    assert.equal(await ownerOf(id), target);
    assert.equal((await exec(third, id, 'cat /root/a')).stdout, 'under-the-fork\n');
    assert.equal((await exec(third, id, 'sha256sum /root/big')).stdout, big);
    assert.equal((await exec(third, id, `kill -0 ${proc.json.pid} && echo alive`)).stdout, 'alive\n', 'the counter process (same pid) runs on');
    const after = await count(third);
    assert.ok(after >= atSuspend, `the count goes on from ${atSuspend} (read ${after})`);
    const deadline = Date.now() + 30_000;
    while ((await count(third)) <= after) {
      assert.ok(Date.now() < deadline, 'the counter moved on after the resume');
      await sleep(100);
    }

    // A drain of the source: its suspended sandboxes go, running ones stay (counted).
    await exec(third, child, 'echo child > /root/d');
    assert.equal((await call(third.url, beta, 'POST', `/v1/sandboxes/${child}/suspend`)).status, 200);
    const drained = cli('drain', '--host', idOf(source));
    assert.equal(drained.status, 0, drained.err + drained.out);
    assert.deepEqual(drained.json.moved.map((m: { id: string }) => m.id), [child]);
    assert.equal(drained.json.failed.length, 0);
    assert.equal(typeof drained.json.running, 'number', 'running sandboxes stay, counted');
    assert.notEqual(await ownerOf(child), source);
    assert.equal((await call(third.url, beta, 'POST', `/v1/sandboxes/${child}/resume`)).status, 200);
    assert.equal((await exec(third, child, 'cat /root/d /root/a')).stdout, 'child\nunder-the-fork\n');
    // Neither sandbox left a file on the source, and no fork point: both held the one they shared.
    assert.deepEqual(leftovers(source, child), []);
    assert.deepEqual(readdirSync(join(source.home, 'forkpoints')), [], 'the fork point went with its last holder');

    // A move racing a resume: whichever wins, the sandbox has one owner, runs there, and no other
    // host keeps a file of it (a receiver's pending copy is removed when the move fails).
    assert.equal((await call(third.url, beta, 'POST', `/v1/sandboxes/${id}/suspend`)).status, 200);
    const racingMove = new Promise<{ status: number | null; err: string }>((resolve) => {
      const p = spawn(process.execPath, ['--import', 'tsx', CLI, 'cluster', 'move', id, '--cluster', server.url], { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      p.stderr!.on('data', (d) => { err += d; });
      p.on('exit', (status) => resolve({ status, err }));
    });
    let [mv, rs] = await Promise.all([racingMove, call(third.url, beta, 'POST', `/v1/sandboxes/${id}/resume`)]);
    if (mv.status !== 0) assert.match(mv.err, /invalid_state|conflict/, `a move that lost to the resume says why: ${mv.err}`);
    if (rs.status !== 200) {
      // The resume reached the old owner just as the move committed: it says where the sandbox went.
      assert.equal(mv.status, 0, `${rs.status} ${rs.bytes}`);
      assert.match(rs.json.error.message, /moved to cluster host/, rs.bytes.toString());
      rs = await call(third.url, beta, 'POST', `/v1/sandboxes/${id}/resume`);
    }
    assert.equal(rs.status, 200, rs.bytes.toString());
    process.stderr.write(`# a move racing a resume: move exit ${mv.status}, the sandbox on ${(await db.query('SELECT host_id FROM sandboxes WHERE id = $1', [id])).rows[0].host_id}\n`);
    assert.equal((await exec(third, id, 'cat /root/a')).stdout, 'under-the-fork\n');
    const owner = await ownerOf(id);
    for (const h of hosts) if (h !== owner) assert.deepEqual(leftovers(h, id), [], `no copy of it on ${h.home}`);

    for (const s of [id, child]) await remove(third, beta, s);
    for (const h of hosts) assert.deepEqual([...leftovers(h, id), ...leftovers(h, child)], [], `nothing of them left on ${h.home}`);
  });

  test('an environment baked on one host is created through another on a host that lacks it: that host pulls only the layers it lacks and the artifact, and the sandbox runs', async () => {
    const ids = [...hostOf.keys()];
    const [maker, puller, entry] = ids.map((id) => hostOf.get(id)!);
    // The hosts share the test's cache (layers, artifacts, RAM files); the puller gets a cache of its
    // own, hard-linked from it (the catalog's assets and artifacts, so it bakes nothing) but without
    // any image layer, and restarts on it.
    const cache = mkdtempSync(join(dirname(TEST_CACHE), 'cce-')); // short: VMM sockets go below it (config.ts)
    const ram = mkdtempSync('/dev/shm/collimate-cluster-envs-');
    scratch.push(cache, ram);
    execFileSync('cp', ['-al', join(TEST_CACHE, 'assets'), join(TEST_CACHE, 'artifacts'), cache]);
    execFileSync('cp', ['-al', `/dev/shm/collimate-${createHash('sha256').update(TEST_CACHE).digest('hex').slice(0, 12)}/.`, ram]);
    await stopClusterHost(puller);
    const restarted = await startClusterHost({ cluster: server.url, capacity: 14, net, machine: puller.machine, home: puller.home, timings: TIMINGS.join(','), env: { COLLIMATE_CACHE_DIR: cache, COLLIMATE_RAM_DIR: ram } });
    hosts[hosts.indexOf(puller)] = restarted;
    hostOf.set(ids[1], restarted);

    // One base layer (busybox) under a variant layer of this run's own bytes.
    const marker = randomBytes(8).toString('hex');
    const base = layer(busyboxEntries(), 'gzip');
    const variant = layer([{ name: 'opt/', type: 'dir' }, { name: 'opt/app/', type: 'dir' }, { name: 'opt/app/marker', data: `${marker}\n` }, { name: 'opt/app/filler', data: randomBytes(300_000) }], 'gzip');
    const pullImage = async (h: Host, name: string, img: ReturnType<typeof image>) => {
      const dir = join(h.home, 'imports', name);
      mkdirSync(dirname(dir), { recursive: true });
      const r = await call(h.url, beta, 'POST', '/v1/images', { source: { kind: 'oci-layout', path: writeLayout(dir, img) } });
      assert.equal(r.status, 202, r.bytes.toString());
      for (let state = r.json.state; state === 'pulling'; state = (await call(h.url, beta, 'GET', `/v1/images/${r.json.id}`)).json.state) await sleep(200);
      assert.equal((await call(h.url, beta, 'GET', `/v1/images/${r.json.id}`)).json.state, 'ready');
    };
    // The puller holds the base layer already (an image on that base was pulled there).
    await pullImage(restarted, 'base', image([base], {}));
    const variantImage = image([base, variant], { Env: ['PATH=/bin:/usr/bin', 'GREETING=hi'] });
    await pullImage(maker, 'variant', variantImage);

    const name = `env-${marker}`;
    const made = await call(maker.url, beta, 'POST', '/v1/environments', { name, image: variantImage.manifestDigest, ready_command: `echo ${marker} > /root/baked`, secrets: { API_TOKEN: `tok-${marker}` } });
    assert.equal(made.status, 202, made.bytes.toString());
    // Listed and shown through every host while it bakes and once ready (from the cluster database).
    const deadline = Date.now() + 600_000;
    for (;;) {
      const got = await call(entry.url, beta, 'GET', `/v1/environments/${name}`);
      assert.equal(got.status, 200, got.bytes.toString());
      if (got.json.state === 'ready') break;
      assert.notEqual(got.json.state, 'failed', got.json.error);
      assert.ok(Date.now() < deadline, 'the environment was not baked in 10 minutes');
      await sleep(500);
    }
    for (const h of [maker, restarted, entry]) {
      const listed = await call(h.url, beta, 'GET', '/v1/environments');
      assert.ok(listed.json.environments.some((e: { name: string; state: string }) => e.name === name && e.state === 'ready'), `listed through ${h.url}`);
      assert.ok(!(await call(h.url, gamma, 'GET', '/v1/environments')).json.environments.some((e: { name: string }) => e.name === name), 'not another tenant\'s');
    }
    assert.equal((await call(entry.url, beta, 'POST', '/v1/environments', { name, image: variantImage.manifestDigest })).status, 409, 'its name is taken cluster-wide');

    // Steer placement off the host that made it (and off the entry): their capacity is reserved.
    await db.query(`INSERT INTO reservations (id, tenant, host_id, slots, lease_until) SELECT 'rsv_env_fill_' || id, 'test-fill', id, 14, now() + interval '10 minutes' FROM hosts WHERE id = ANY($1)`, [[ids[0], ids[2]]]);
    let id: string;
    try {
      id = await create(entry, beta, { template: name });
    } finally {
      await db.query(`DELETE FROM reservations WHERE tenant = 'test-fill'`);
    }
    assert.equal(await ownerOf(id), restarted, 'created on the host that lacked it');
    const out = await call(entry.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, { command: 'cat /opt/app/marker /root/baked; echo "$API_TOKEN $GREETING"' });
    assert.equal(out.status, 200, out.bytes.toString());
    assert.equal(out.json.stdout, `${marker}\n${marker}\ntok-${marker} hi\n`, 'its image, its bake and its secret');

    // What moved: the variant layer (the base was held) and the artifact's files, by digest.
    const line = /pulled environment beta\/env-[0-9a-f]+ from peers: (\{.*\})/.exec(restarted.stderr());
    assert.ok(line, `the puller reported its pull: ${restarted.stderr().slice(-2000)}`);
    const report = JSON.parse(line[1]);
    assert.deepEqual(report.layersHeld, [base.diffId], 'the base layer it had was not fetched');
    assert.deepEqual(report.layersPulled, [variant.diffId]);
    assert.equal(report.artifactPulled, true);
    const layerSize = Number((await db.query(`SELECT size FROM blob_locations WHERE host_id = $1 AND kind = 'layer' AND of = $2`, [ids[0], variant.diffId])).rows[0].size);
    assert.equal(report.layerBytes, layerSize, 'layer bytes moved: the variant layer\'s erofs bytes');
    const artifact = (await db.query(`SELECT kind, size FROM blob_locations WHERE host_id = $1 AND of = $2`, [ids[0], report.artifactKey])).rows;
    const artifactSize = artifact.reduce((n, r) => n + Number(r.size), 0);
    assert.ok(report.artifactBytes < artifactSize / 2, `the artifact moved as data: ${report.artifactBytes} of ${artifactSize} bytes`);
    console.log(`environment pulled by another host: layer ${report.layerBytes} bytes (base layer held), artifact ${report.artifactBytes} bytes sent of ${artifactSize}`);

    // This run's artifact goes with the hosts (the shared cache would keep it until a collector's grace ran out).
    const sharedRam = `/dev/shm/collimate-${createHash('sha256').update(TEST_CACHE).digest('hex').slice(0, 12)}`;
    scratch.push(join(TEST_CACHE, 'artifacts', report.artifactKey.slice(0, 24)), ...readdirSync(sharedRam).filter((f) => f.startsWith(`artifact-${report.artifactKey.slice(0, 24)}-`)).map((f) => join(sharedRam, f)));
    await remove(entry, beta, id);
    // Deleted through the host that pulled it: the host that made it deletes it, and it is gone everywhere.
    assert.equal((await call(restarted.url, beta, 'DELETE', `/v1/environments/${name}`)).status, 204);
    for (const h of [maker, restarted, entry]) assert.equal((await call(h.url, beta, 'GET', `/v1/environments/${name}`)).status, 404);
  });

  test('a host killed with SIGKILL: its running sandboxes are lost, creates go elsewhere, its suspended one waits for it; restarted, it stops the lost VMs and resumes the suspended one', async () => {
    // Sandboxes until the victim (the host of the first) holds two running and one to suspend.
    const byHost = new Map<Host, string[]>();
    while (![...byHost.values()].some((l) => l.length >= 3)) {
      const id = await create(hosts[byHost.size % 3], beta);
      const h = await ownerOf(id);
      byHost.set(h, [...(byHost.get(h) ?? []), id]);
    }
    const [victim, [suspended, ...running]] = [...byHost.entries()].find(([, l]) => l.length >= 3)!;
    const survivors = hosts.filter((h) => h !== victim);
    assert.equal((await call(survivors[0].url, beta, 'POST', `/v1/sandboxes/${suspended}/exec`, { command: 'echo kept > /root/kept' })).status, 200);
    const sus = await call(survivors[0].url, beta, 'POST', `/v1/sandboxes/${suspended}/suspend`);
    assert.equal(sus.status, 200, sus.bytes.toString());
    // The VMM pids of the running ones, from the victim's own journal.
    const journal = new Database(dbPathOf(victim.home), { readonly: true, fileMustExist: true });
    const pids = running.map((id) => JSON.parse((journal.prepare('SELECT vmm FROM sandboxes WHERE id = ?').get(id) as { vmm: string }).vmm).pid as number);
    journal.close();
    assert.ok(pids.every((p) => isRunning(p)));

    const killedAt = Date.now();
    await stopClusterHost(victim, 'SIGKILL');
    // Lost through a survivor: 404 saying the host stopped answering.
    for (const id of running) {
      for (;;) {
        const r = await call(survivors[1].url, beta, 'GET', `/v1/sandboxes/${id}`);
        if (r.status === 404) {
          assert.match(r.json.error.message, /stopped answering/);
          break;
        }
        assert.equal(r.status, 503, `before it is declared lost, the sandbox's host is unavailable: ${r.bytes}`);
        // Far beyond the bound (dead-after plus a heartbeat): the sweep never came.
        assert.ok(Date.now() - killedAt < 3 * (TIMINGS[2] + TIMINGS[0]), `${id} was not declared lost`);
        await sleep(250);
      }
    }
    const lostAfterMs = Date.now() - killedAt;
    process.stderr.write(`# host killed with SIGKILL: its sandboxes lost after ${lostAfterMs} ms (dead-after ${TIMINGS[2]} ms, heartbeat ${TIMINGS[0]} ms)\n`);
    const listed = await call(survivors[0].url, beta, 'GET', '/v1/sandboxes?limit=100');
    for (const id of running) assert.ok(!listed.json.sandboxes.some((s: { id: string }) => s.id === id), 'a lost sandbox is not listed');
    const sAns = await call(survivors[0].url, beta, 'GET', `/v1/sandboxes/${suspended}`);
    assert.equal(sAns.status, 503, `a suspended sandbox on a dead host is unavailable until it returns: ${sAns.bytes}`);
    assert.equal(sAns.json.error.resource, 'cluster_host', sAns.bytes.toString());
    for (let i = 0; i < 3; i++) {
      const id = await create(survivors[i % 2], beta);
      assert.notEqual(await ownerOf(id), victim, 'creates go to the live hosts');
      await remove(survivors[0], beta, id);
    }

    // The VMs kept running without their server; restarted as itself (on the cache it had: the
    // environments test moved one host to a cache of its own), the host stops them.
    const back = await startClusterHost({ cluster: server.url, capacity: 14, net, machine: victim.machine, home: victim.home, timings: TIMINGS.join(','), env: victim.env });
    hosts[hosts.indexOf(victim)] = back;
    for (const [hid, h] of hostOf) if (h === victim) hostOf.set(hid, back);
    const deadline = Date.now() + 60_000;
    while (pids.some((p) => isRunning(p))) {
      assert.ok(Date.now() < deadline, 'the restarted host stopped the VMs of its lost sandboxes');
      await sleep(200);
    }
    for (const id of running) {
      owned.splice(owned.findIndex((o) => o.id === id), 1);
      assert.equal((await call(back.url, beta, 'GET', `/v1/sandboxes/${id}`)).status, 404, 'the host itself no longer has it');
    }
    const resumed = await call(survivors[1].url, beta, 'POST', `/v1/sandboxes/${suspended}/resume`);
    assert.equal(resumed.status, 200, resumed.bytes.toString());
    assert.equal((await call(survivors[0].url, beta, 'POST', `/v1/sandboxes/${suspended}/exec`, { command: 'cat /root/kept' })).json.stdout, 'kept\n');
    await remove(survivors[0], beta, suspended);
    for (const l of byHost.values()) for (const id of l) if (owned.some((o) => o.id === id)) await remove(survivors[1], beta, id);
  });
});
