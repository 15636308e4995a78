/**
 * Cluster mode on real microVMs: two `collimate serve --cluster` hosts on loopback ports, each with
 * its own home, sharing one throwaway PostgreSQL 15 (test/support/postgres.ts). Creates spread over
 * both hosts; exec (plain and streamed) and files through the non-owning host return the owner's
 * bytes; a fork asked through the non-owner keeps its children on the parent's host, continuing its
 * counter; the web terminal works through the non-owner; a Demo tenant's 50 concurrent creates
 * through both hosts give exactly 2; another tenant gets 404 through every host. E2B's SDK creates
 * through one host and runs commands and files through the other; both hosts' event streams, live
 * stats and usage cover the sandbox wherever it runs. Every sandbox is deleted and both hosts stopped: no QEMU is left.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { WebSocket } from 'ws';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../support/postgres.js';
import { qemuProcesses, TEST_CACHE, testHome } from './fixture.js';
import { freePort } from '../support/registry.ts';
import { e2bKeyOf } from '../../src/service/keys.js';

const cli = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const skip = postgresUnavailable() ?? false;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Host {
  url: string;
  home: string;
  child: ChildProcess;
  stderr: () => string;
}

async function startHost(cluster: string, capacity: number): Promise<Host> {
  const home = testHome('cluster-host');
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', cli, 'serve', '--home', home, '--port', String(port), '--allow-tcg', '--cluster', cluster, '--advertise', url, '--capacity', String(capacity)],
    {
      env: { ...process.env, COLLIMATE_CACHE_DIR: TEST_CACHE, COLLIMATE_POOL_SIZE: '1', COLLIMATE_POOL_MAX: '1', COLLIMATE_LOG_LEVEL: 'warn',
        // No host dies in this test: leases with room for heartbeats a loaded machine delays (the unit tests cover death).
        COLLIMATE_CLUSTER_TIMINGS: '1000,15000,20000' },
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  process.once('exit', () => child.kill('SIGKILL'));
  let stderr = '';
  child.stderr!.on('data', (d) => { stderr += d; });
  const deadline = Date.now() + 600_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`serve exited: ${stderr}`);
    try {
      if ((await fetch(`${url}/healthz`)).status === 200) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) throw new Error(`serve did not become healthy: ${stderr}`);
    await sleep(200);
  }
  return { url, home, child, stderr: () => stderr };
}

function keyFor(cluster: string, tenant: string, tier: string): string {
  const r = spawnSync(process.execPath, ['--import', 'tsx', cli, 'keys', 'create', '--tenant', tenant, '--tier', tier, '--cluster', cluster], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trimEnd().split('\n').pop()!;
}

async function call(base: string, key: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
    body: body === undefined ? undefined : Buffer.isBuffer(body) ? body : JSON.stringify(body),
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  let json: any = null;
  try { json = JSON.parse(bytes.toString('utf8')); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, bytes, json };
}

describe('cluster mode on real microVMs: two hosts, one PostgreSQL', { skip }, () => {
  let server: ThrowawayPostgres;
  let db: pg.Pool;
  const hosts: Host[] = [];
  let beta = '';
  let alpha = '';
  let gamma = '';
  const owned: Array<{ id: string; key: string }> = [];
  const hostOf = new Map<string, Host>();

  before(async () => {
    server = await startPostgres();
    alpha = keyFor(server.url, 'alpha', 'demo');
    beta = keyFor(server.url, 'beta', 'pro');
    gamma = keyFor(server.url, 'gamma', 'pro');
    // One at a time: two hosts warming their pools at once would only slow each other down.
    hosts.push(await startHost(server.url, 3));
    hosts.push(await startHost(server.url, 3));
    db = new pg.Pool({ connectionString: server.url });
    db.on('error', () => {});
    for (const r of (await db.query('SELECT id, address FROM hosts')).rows) hostOf.set(r.id, hosts.find((h) => h.url === r.address)!);
  });

  after(async () => {
    for (const s of owned) await call(hosts[0].url, s.key, 'DELETE', `/v1/sandboxes/${s.id}`).catch(() => {});
    for (const h of hosts) {
      if (h.child.exitCode === null) {
        const exited = new Promise((r) => h.child.once('exit', r));
        h.child.kill('SIGTERM');
        await exited;
      }
    }
    await db?.end();
    await server?.stop();
    for (const h of hosts) {
      const deadline = Date.now() + 10_000;
      while (qemuProcesses(h.home).length > 0 && Date.now() < deadline) await sleep(50);
      assert.deepEqual(qemuProcesses(h.home), [], `no QEMU of ${h.home} left`);
      rmSync(h.home, { recursive: true, force: true });
    }
  });

  const ownerOf = async (id: string): Promise<Host> => hostOf.get((await db.query('SELECT host_id FROM sandboxes WHERE id = $1', [id])).rows[0].host_id)!;

  test('creates through both hosts land on both; exec, streamed exec and files through the non-owner give the owner\'s bytes; another tenant gets 404 everywhere', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const r = await call(hosts[i % 2].url, beta, 'POST', '/v1/sandboxes', { template: 'base' });
      assert.equal(r.status, 201, r.bytes.toString());
      ids.push(r.json.id);
      owned.push({ id: r.json.id, key: beta });
    }
    const owners = await Promise.all(ids.map(ownerOf));
    assert.equal(new Set(owners).size, 2, 'both hosts hold sandboxes');

    const id = ids[0];
    const owner = owners[0];
    const other = hosts.find((h) => h !== owner)!;
    // Output with every byte value and more than a pipe's worth of lines.
    const exec = { command: "printf '\\000\\001\\177\\200\\377'; seq 1 20000; echo to-stderr >&2; exit 3" };
    const direct = await call(owner.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, exec);
    const via = await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, exec);
    assert.equal(direct.status, 200, direct.bytes.toString());
    assert.equal(via.status, 200, via.bytes.toString());
    for (const field of ['stdout', 'stderr', 'exit_code', 'stdout_encoding', 'stderr_encoding']) assert.deepEqual(via.json[field], direct.json[field], field);
    assert.equal(direct.json.exit_code, 3);
    const sse = (b: Buffer) => b.toString('utf8').split('\n\n').filter((e) => e && !/^event: result/m.test(e));
    const dStream = await call(owner.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, exec, { accept: 'text/event-stream' });
    const vStream = await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, exec, { accept: 'text/event-stream' });
    assert.equal(vStream.headers.get('content-type'), dStream.headers.get('content-type'));
    // Chunking of the output into events may differ run to run; the bytes they carry may not.
    const data = (events: string[], name: string) =>
      Buffer.concat(events.filter((e) => new RegExp(`^event: ${name}$`, 'm').test(e)).map((e) => Buffer.from(JSON.parse(/^data: (.*)$/m.exec(e)![1]).data, 'base64')));
    assert.deepEqual(data(sse(vStream.bytes), 'stdout'), data(sse(dStream.bytes), 'stdout'));
    assert.deepEqual(data(sse(vStream.bytes), 'stderr'), data(sse(dStream.bytes), 'stderr'));

    const blob = Buffer.from(Array.from({ length: 300_000 }, (_, i) => (i * 7919) % 256));
    const up = await call(other.url, beta, 'PUT', `/v1/sandboxes/${id}/files?path=/root/blob.bin`, blob, { 'content-type': 'application/octet-stream' });
    assert.ok(up.status >= 200 && up.status < 300, `upload: ${up.status} ${up.bytes}`);
    for (const h of hosts) {
      const down = await call(h.url, beta, 'GET', `/v1/sandboxes/${id}/files?path=/root/blob.bin`);
      assert.equal(down.status, 200);
      assert.deepEqual(down.bytes, blob, `download through ${h.url}`);
    }
    const sum = await call(owner.url, beta, 'POST', `/v1/sandboxes/${id}/exec`, { command: 'sha256sum /root/blob.bin' });
    assert.match(sum.json.stdout, new RegExp((await import('node:crypto')).createHash('sha256').update(blob).digest('hex')));

    for (const h of hosts) {
      for (const [method, path] of [['GET', `/v1/sandboxes/${id}`], ['POST', `/v1/sandboxes/${id}/exec`], ['DELETE', `/v1/sandboxes/${id}`]] as const) {
        const r = await call(h.url, gamma, method, path, method === 'POST' ? exec : undefined);
        assert.equal(r.status, 404, `${method} ${path} by another tenant through ${h.url}`);
        assert.equal(r.json.error.code, 'sandbox_not_found');
      }
    }
    for (const s of ids) {
      assert.equal((await call(other.url, beta, 'DELETE', `/v1/sandboxes/${s}`)).status, 204);
      owned.splice(owned.findIndex((o) => o.id === s), 1);
    }
  });

  test('a fork asked through the non-owner puts its children on the parent\'s host, each continuing the parent\'s counter; the web terminal works through the non-owner', async () => {
    const c = await call(hosts[0].url, beta, 'POST', '/v1/sandboxes', { template: 'base' });
    assert.equal(c.status, 201, c.bytes.toString());
    const id = c.json.id as string;
    owned.push({ id, key: beta });
    const owner = await ownerOf(id);
    const other = hosts.find((h) => h !== owner)!;
    const counter = "i=0; while true; do i=$((i+1)); echo $i > /root/c; sleep 0.2; done";
    assert.equal((await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/processes`, { command: counter })).status, 201);
    const read = async (sid: string) => Number((await call(other.url, beta, 'POST', `/v1/sandboxes/${sid}/exec`, { command: 'cat /root/c 2>/dev/null || echo 0' })).json.stdout.trim());
    const moved = async (sid: string, past: number) => {
      const deadline = Date.now() + 20_000;
      for (;;) {
        const v = await read(sid);
        if (v > past) return v;
        assert.ok(Date.now() < deadline, `the counter of ${sid} did not move past ${past} in 20 s`);
        await sleep(100);
      }
    };
    const atFork = await moved(id, 0);
    const f = await call(other.url, beta, 'POST', `/v1/sandboxes/${id}/fork`, { count: 2 });
    assert.equal(f.status, 201, f.bytes.toString());
    for (const child of f.json.sandboxes as Array<{ id: string }>) {
      owned.push({ id: child.id, key: beta });
      assert.equal(await ownerOf(child.id), owner, 'a child is on its parent\'s host');
      // It kept the parent's memory (the count went on from where it was), and it runs.
      assert.ok((await read(child.id)) >= atFork, 'the child continues the parent\'s count');
      await moved(child.id, await read(child.id));
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

    for (const s of [id, ...f.json.sandboxes.map((x: { id: string }) => x.id)]) {
      assert.equal((await call(other.url, beta, 'DELETE', `/v1/sandboxes/${s}`)).status, 204);
      owned.splice(owned.findIndex((o) => o.id === s), 1);
    }
  });

  test('E2B\'s SDK through the non-owner (commands with the create\'s envs, files), and events, stats and usage of both hosts through each', async () => {
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

  test('a Demo tenant firing 50 concurrent creates through both hosts gets exactly 2', async () => {
    const rs = await Promise.all(Array.from({ length: 50 }, (_, i) => call(hosts[i % 2].url, alpha, 'POST', '/v1/sandboxes', { template: 'base' })));
    const created = rs.filter((r) => r.status === 201);
    for (const c of created) owned.push({ id: c.json.id, key: alpha });
    assert.equal(created.length, 2, rs.map((r) => `${r.status} ${r.json?.error?.code ?? ''}`).join(', '));
    assert.equal(rs.filter((r) => r.status === 429 && r.json.error.code === 'concurrency_limit').length, 48);
    for (const c of created) {
      assert.equal((await call(hosts[1].url, alpha, 'DELETE', `/v1/sandboxes/${c.json.id}`)).status, 204);
      owned.splice(owned.findIndex((o) => o.id === c.json.id), 1);
    }
  });
});
