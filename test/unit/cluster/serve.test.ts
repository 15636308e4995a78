/**
 * `collimate serve --cluster`: three real server processes on loopback ports sharing one throwaway
 * PostgreSQL, each with the in-memory fake engine (no VMs; test/integration/cluster.test.ts does the
 * same on real microVMs). Keys made once with `keys create --cluster` work on every host, creates
 * spread, requests about a sandbox reach its owner through any node with the same bytes, the Demo cap
 * holds across nodes, and another tenant sees nothing anywhere.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { WebSocket, WebSocketServer } from 'ws';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../../support/postgres.js';
import { startFakeHost, stopFakeHost, type FakeHost } from '../../support/serveProcess.ts';
import { call } from '../../support/doors.ts';
import { e2bKeyOf } from '../../../src/service/keys.js';

const BIN = fileURLToPath(new URL('../../../bin/collimate.js', import.meta.url));
const FAKE_ENGINE = fileURLToPath(new URL('../../support/fakeEngine.ts', import.meta.url));
const skip = postgresUnavailable() ?? false;

type Host = FakeHost;

function startHost(cluster: string, capacity: number, env: Record<string, string> = {}, home = mkdtempSync(join(tmpdir(), 'collimate-cluster-host-'))): Promise<Host> {
  return startFakeHost(['--cluster', cluster, '--advertise', '$URL', '--capacity', String(capacity)], home, env);
}

const stopHost = stopFakeHost;

async function until<T>(what: string, probe: () => Promise<T | undefined | false>, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v) return v;
    assert.ok(Date.now() < deadline, `timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function keyFor(cluster: string, tenant: string, tier = 'demo'): string {
  const r = spawnSync(process.execPath, [BIN, 'keys', 'create', '--tenant', tenant, '--tier', tier, '--cluster', cluster], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /valid on every host of the cluster/);
  return r.stdout.trimEnd().split('\n').pop()!;
}

describe('collimate serve --cluster (three hosts, fake engines, real PostgreSQL)', { skip }, () => {
  let server: ThrowawayPostgres;
  let cluster: string;
  let db: pg.Pool;
  const hosts: Host[] = [];
  let pro = '';
  let demo = '';
  let other = '';
  /** Host URL → host id. */
  const idOf = new Map<string, string>();

  before(async () => {
    server = await startPostgres();
    cluster = server.url;
    pro = keyFor(cluster, 'pro1', 'pro');
    demo = keyFor(cluster, 'demo1', 'demo');
    other = keyFor(cluster, 'other', 'pro');
    hosts.push(...(await Promise.all([startHost(cluster, 20), startHost(cluster, 20), startHost(cluster, 0)])));
    db = new pg.Pool({ connectionString: cluster });
    db.on('error', () => {}); // an idle client's connection ending with the server is no failure
    for (const r of (await db.query('SELECT id, address FROM hosts')).rows) idOf.set(r.address, r.id);
  });

  after(async () => {
    await Promise.all(hosts.map((h) => stopHost(h)));
    await db?.end();
    await server?.stop();
  });

  const ownerOf = async (id: string) => (await db.query('SELECT host_id FROM sandboxes WHERE id = $1', [id])).rows[0]?.host_id as string | undefined;

  test('the blob API of a serving host answers only peers: no key and a tenant key are 401, the peer secret reaches it', async () => {
    const secret = (await db.query(`SELECT value FROM cluster_settings WHERE name = 'peer_secret'`)).rows[0].value as string;
    const path = `/cluster/blobs/sha256:${'ab'.repeat(32)}`;
    for (const h of hosts) {
      const anon = await fetch(h.url + path);
      assert.equal(anon.status, 401);
      assert.equal(((await anon.json()) as any).error.code, 'unauthorized');
      assert.equal((await call(h.url, pro, 'GET', path)).status, 401);
      assert.equal((await call(h.url, pro, 'HEAD', path)).status, 401);
      // A fake engine holds no blob: the peer gets as far as "not here".
      const peer = await call(h.url, pro, 'GET', path, undefined, { 'x-collimate-peer': secret });
      assert.equal(peer.status, 404);
      assert.equal(peer.json.error.code, 'not_found');
    }
  });

  test('creates through every node spread over the VM hosts, never the API-only one, and list everywhere', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 12; i++) {
      const r = await call(hosts[i % 3].url, pro, 'POST', '/v1/sandboxes', { template: 'base', labels: { batch: 'spread' } });
      assert.equal(r.status, 201, r.bytes.toString());
      ids.push(r.json.id);
    }
    const owners = await Promise.all(ids.map(ownerOf));
    const apiOnly = idOf.get(hosts[2].url);
    for (const h of hosts) {
      const health = (await (await fetch(`${h.url}/healthz`)).json()) as { cluster: { host_id: string; address: string; capacity: number; lease: boolean } };
      // Whether the lease holds at this instant depends on the last heartbeat: only its presence is checked.
      assert.equal(typeof health.cluster.lease, 'boolean');
      assert.deepEqual({ ...health.cluster, lease: undefined }, { host_id: idOf.get(h.url), address: h.url, capacity: h === hosts[2] ? 0 : 20, lease: undefined });
    }
    assert.ok(owners.every((o) => o && o !== apiOnly), 'nothing on the API-only node');
    assert.equal(new Set(owners).size, 2, `both VM hosts got some: ${owners.join(' ')}`);
    for (const h of hosts) {
      const l = await call(h.url, pro, 'GET', '/v1/sandboxes?label=batch%3Dspread&limit=5');
      assert.equal(l.status, 200);
      assert.equal(l.json.sandboxes.length, 5);
      const all = await call(h.url, pro, 'GET', '/v1/sandboxes?label=batch%3Dspread');
      assert.deepEqual(all.json.sandboxes.map((s: { id: string }) => s.id).sort(), [...ids].sort(), `${h.url} lists all 12`);
      assert.deepEqual((await call(h.url, other, 'GET', '/v1/sandboxes')).json.sandboxes, [], 'another tenant lists none');
    }
  });

  test('exec, streamed exec and files through a non-owning node give the owner\'s bytes; another tenant gets 404 everywhere', async () => {
    const c = await call(hosts[2].url, pro, 'POST', '/v1/sandboxes', { template: 'base' });
    assert.equal(c.status, 201);
    const id = c.json.id as string;
    const owner = await ownerOf(id);
    const ownerUrl = hosts.find((h) => idOf.get(h.url) === owner)!.url;
    const others = hosts.filter((h) => h.url !== ownerUrl).map((h) => h.url);
    const binary = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    const exec = { commands: [['printf-bytes', binary.toString('hex')]] };
    const direct = await call(ownerUrl, pro, 'POST', `/v1/sandboxes/${id}/exec`, exec);
    assert.equal(direct.status, 200);
    for (const via of others) {
      const r = await call(via, pro, 'POST', `/v1/sandboxes/${id}/exec`, exec);
      assert.equal(r.status, 200);
      assert.equal(r.json.stdout, direct.json.stdout);
      assert.deepEqual(Buffer.from(r.json.stdout, r.json.stdout_encoding === 'base64' ? 'base64' : 'utf8'), Buffer.from(direct.json.stdout, direct.json.stdout_encoding === 'base64' ? 'base64' : 'utf8'));
      // The SSE stream, event by event (the result's timings aside).
      const sse = (s: Buffer) => s.toString('utf8').split('\n\n').filter((e) => !/^event: result/m.test(e));
      const d = await call(ownerUrl, pro, 'POST', `/v1/sandboxes/${id}/exec`, exec, { accept: 'text/event-stream' });
      const p = await call(via, pro, 'POST', `/v1/sandboxes/${id}/exec`, exec, { accept: 'text/event-stream' });
      assert.equal(p.headers.get('content-type'), d.headers.get('content-type'));
      assert.deepEqual(sse(p.bytes), sse(d.bytes));
      // A file written through one node reads back byte for byte through every node.
      const up = await call(via, pro, 'PUT', `/v1/sandboxes/${id}/files?path=/root/blob.bin`, binary, { 'content-type': 'application/octet-stream' });
      assert.ok(up.status === 200 || up.status === 201 || up.status === 204, `upload ${up.status} ${up.bytes}`);
      for (const h of hosts) {
        const down = await call(h.url, pro, 'GET', `/v1/sandboxes/${id}/files?path=/root/blob.bin`);
        assert.equal(down.status, 200);
        assert.deepEqual(down.bytes, binary);
      }
    }
    for (const h of hosts) {
      const r = await call(h.url, other, 'POST', `/v1/sandboxes/${id}/exec`, exec);
      assert.equal(r.status, 404);
      assert.equal(r.json.error.code, 'sandbox_not_found');
      assert.equal((await call(h.url, other, 'GET', `/v1/sandboxes/${id}`)).status, 404);
      assert.equal((await call(h.url, other, 'DELETE', `/v1/sandboxes/${id}`)).status, 404);
    }
    // A fork lands on the parent's host; a delete through another node removes it everywhere.
    const f = await call(others[0], pro, 'POST', `/v1/sandboxes/${id}/fork`, { count: 2 });
    assert.equal(f.status, 201, f.bytes.toString());
    for (const child of f.json.sandboxes) assert.equal(await ownerOf(child.id), owner);
    assert.equal((await call(others[1], pro, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
    assert.equal(await ownerOf(id), undefined);
    for (const h of hosts) assert.equal((await call(h.url, pro, 'GET', `/v1/sandboxes/${id}`)).status, 404);
  });

  test('WebSockets (a sandbox port, the web terminal) through a non-owning node are tunnelled to the owner, bytes unchanged; another tenant is refused', async () => {
    // The fake engine's sandbox ports are this machine's ports: an echo server stands in for one.
    const echo = new WebSocketServer({ host: '127.0.0.1', port: 0 });
    await new Promise((r) => echo.once('listening', r));
    echo.on('connection', (ws) => ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary })));
    const port = (echo.address() as { port: number }).port;
    try {
      const c = await call(hosts[0].url, pro, 'POST', '/v1/sandboxes', { template: 'python' });
      const id = c.json.id as string;
      const owner = await ownerOf(id);
      const ownerUrl = hosts.find((h) => idOf.get(h.url) === owner)?.url;
      const open = (base: string, key: string) =>
        new Promise<WebSocket>((resolve, reject) => {
          const ws = new WebSocket(`${base.replace('http', 'ws')}/v1/sandboxes/${id}/ports/${port}/`, { headers: { authorization: `Bearer ${key}` } });
          ws.once('open', () => resolve(ws));
          ws.once('unexpected-response', (_req, res) => reject(Object.assign(new Error(`refused ${res.statusCode}`), { status: res.statusCode })));
          ws.once('error', reject);
        });
      const payload = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 31) % 256));
      for (const h of hosts) {
        const ws = await open(h.url, pro);
        const back = new Promise<Buffer>((r) => ws.once('message', (d) => r(d as Buffer)));
        ws.send(payload);
        assert.deepEqual(await back, payload, `echo through ${h.url === ownerUrl ? 'the owner' : 'a non-owner'}`);
        ws.close();
        await assert.rejects(open(h.url, other), (e: { status?: number }) => e.status === 404, `another tenant through ${h.url}`);
      }
      // The web terminal (its key in the subprotocol) through the API-only node, onto the owner's PTY.
      const pid = (await call(hosts[2].url, pro, 'POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh'], pty: { cols: 80, rows: 24 } })).json.pid;
      const term = await new Promise<WebSocket>((resolve, reject) => {
        const ws = new WebSocket(`${hosts[2].url.replace('http', 'ws')}/v1/sandboxes/${id}/processes/${pid}/terminal`, ['collimate.terminal', `bearer.${pro}`]);
        ws.once('open', () => resolve(ws));
        ws.once('error', reject);
      });
      assert.equal(term.protocol, 'collimate.terminal');
      const seen = new Promise<void>((resolve) => {
        let out = '';
        term.on('message', (d: Buffer, binary: boolean) => {
          if (binary && (out += d.toString()).includes('over-the-tunnel')) resolve();
        });
      });
      term.send(Buffer.from('over-the-tunnel\n'));
      await seen;
      term.close();
      assert.equal((await call(hosts[1].url, pro, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
    } finally {
      await new Promise((r) => echo.close(r));
    }
  });

  test('a Demo tenant firing 50 concurrent creates through three nodes gets exactly 2, round after round', async () => {
    for (let round = 0; round < 3; round++) {
      const rs = await Promise.all(Array.from({ length: 50 }, (_, i) => call(hosts[i % 3].url, demo, 'POST', '/v1/sandboxes', { template: 'base' })));
      const created = rs.filter((r) => r.status === 201);
      const refused = rs.filter((r) => r.status === 429 && r.json.error.code === 'concurrency_limit');
      assert.equal(created.length, 2, `round ${round}: ${rs.map((r) => r.status).join(',')}`);
      assert.equal(refused.length, 48);
      for (const h of hosts) {
        const limits = await call(h.url, demo, 'GET', '/v1/limits');
        assert.equal(limits.json.running, 2, `${h.url} counts the tenant's sandboxes on every host`);
        assert.equal(limits.json.max_running, 2);
      }
      for (const c of created) assert.equal((await call(hosts[(round + 1) % 3].url, demo, 'DELETE', `/v1/sandboxes/${c.json.id}`)).status, 204);
    }
  });

  test('one Idempotency-Key sent to three nodes yields one sandbox', async () => {
    const rs = await Promise.all(hosts.map((h) => call(h.url, pro, 'POST', '/v1/sandboxes', { template: 'base', labels: { idem: 'x' } }, { 'idempotency-key': 'cluster-key-1' })));
    assert.ok(rs.every((r) => r.status === 201), rs.map((r) => r.bytes.toString()).join('\n'));
    assert.equal(new Set(rs.map((r) => r.json.id)).size, 1);
    const listed = await call(hosts[0].url, pro, 'GET', '/v1/sandboxes?label=idem%3Dx');
    assert.equal(listed.json.sandboxes.length, 1);
    const reused = await call(hosts[1].url, pro, 'POST', '/v1/sandboxes', { template: 'base' }, { 'idempotency-key': 'cluster-key-1' });
    assert.equal(reused.status, 422);
    assert.equal(reused.json.error.code, 'idempotency_key_reused');
  });

  test('keys: a key made through one node works on every node; a revoked key stops working on every node', async () => {
    const made = await call(hosts[1].url, pro, 'POST', '/v1/keys', { name: 'made-via-node' });
    assert.equal(made.status, 201);
    for (const h of hosts) assert.equal((await call(h.url, made.json.key, 'GET', '/v1/sandboxes')).status, 200);
    const listed = await call(hosts[2].url, pro, 'GET', '/v1/keys');
    assert.ok(listed.json.keys.some((k: { id: string }) => k.id === made.json.record.id));
    assert.equal((await call(hosts[0].url, other, 'DELETE', `/v1/keys/${made.json.record.id}`)).status, 404, "another tenant's key is not found");
    assert.equal((await call(hosts[0].url, pro, 'DELETE', `/v1/keys/${made.json.record.id}`)).status, 204);
    // Every node learns the revocation within its key cache's refresh (2 s): poll, with a deadline.
    for (const h of hosts) {
      const deadline = Date.now() + 15_000;
      while ((await call(h.url, made.json.key, 'GET', '/v1/sandboxes')).status !== 401) {
        assert.ok(Date.now() < deadline, `${h.url} still accepts a revoked key`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  });

  /** One MCP tool call (stateless Streamable HTTP): the JSON-RPC result, whether the answer came as JSON or SSE. */
  async function mcp(base: string, key: string, name: string, args: Record<string, unknown>): Promise<{ isError?: boolean; text: string; value: any }> {
    const r = await call(base, key, 'POST', '/mcp', { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name, arguments: args } }, { accept: 'application/json, text/event-stream' });
    assert.equal(r.status, 200, r.bytes.toString());
    const text = r.bytes.toString('utf8');
    const msg = r.json ?? JSON.parse(text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).pop()!);
    assert.equal(msg.id, 7);
    const result = msg.result as { isError?: boolean; content: Array<{ text: string }> };
    let value: any = null;
    try {
      value = JSON.parse(result.content[0].text);
    } catch { /* an error's text */ }
    return { isError: result.isError, text: result.content[0].text, value };
  }

  test('MCP on every host: a create is placed by the cluster, exec and files reach the owner through any node, list and delete work everywhere', async () => {
    const made = await mcp(hosts[2].url, pro, 'create_sandbox', { template: 'base', labels: { door: 'mcp' } });
    assert.ok(!made.isError, made.text);
    const id = made.value.id as string;
    const owner = await ownerOf(id);
    assert.ok(owner && owner !== idOf.get(hosts[2].url), 'placed on a VM host, not the API-only node it arrived at');
    const ownerUrl = hosts.find((h) => idOf.get(h.url) === owner)!.url;
    const others = hosts.filter((h) => h.url !== ownerUrl);
    const direct = await mcp(ownerUrl, pro, 'exec', { sandbox_id: id, commands: [['printf-bytes', '00ff41']] });
    for (const h of others) {
      const r = await mcp(h.url, pro, 'exec', { sandbox_id: id, command: 'echo through-' + h.url.slice(-5) });
      assert.ok(!r.isError, r.text);
      assert.equal(r.value.stdout, `through-${h.url.slice(-5)}\n`);
      const b = await mcp(h.url, pro, 'exec', { sandbox_id: id, commands: [['printf-bytes', '00ff41']] });
      const bytes = (v: any) => ({ stdout: v.stdout, stdout_encoding: v.stdout_encoding, stderr: v.stderr, exit_code: v.exit_code });
      assert.deepEqual(bytes(b.value), bytes(direct.value), 'the owner\'s answer, byte for byte');
      assert.equal(b.value.stdout, Buffer.from([0, 0xff, 0x41]).toString('base64'));
      const exposed = await mcp(h.url, pro, 'expose_port', { sandbox_id: id, port: 8000 });
      assert.ok(exposed.value.url.startsWith(`${h.url}/v1/p/`), `a URL on the host the client reached: ${exposed.value.url}`);
      const listed = await mcp(h.url, pro, 'list_sandboxes', { labels: { door: 'mcp' } });
      assert.deepEqual(listed.value.sandboxes.map((x: { id: string }) => x.id), [id]);
      const missing = await mcp(h.url, other, 'get_sandbox', { sandbox_id: id });
      assert.ok(missing.isError);
      assert.match(missing.text, /^sandbox_not_found/, 'another tenant gets not found through every node');
    }
    const fork = await mcp(others[0].url, pro, 'fork_sandbox', { sandbox_id: id, count: 2 });
    assert.ok(!fork.isError, fork.text);
    for (const child of fork.value.sandboxes) {
      assert.equal(await ownerOf(child.id), owner, 'children on the parent\'s host');
      assert.ok(!(await mcp(others[1].url, pro, 'delete_sandbox', { sandbox_id: child.id })).isError);
    }
    assert.ok(!(await mcp(others[1].url, pro, 'delete_sandbox', { sandbox_id: id })).isError);
    assert.equal(await ownerOf(id), undefined);
    for (const h of hosts) assert.match((await mcp(h.url, pro, 'fork_sandbox', { sandbox_id: id })).text, /^sandbox_not_found/, 'a fork of a deleted sandbox, anywhere');
    // A foreign browser origin is refused by the endpoint's gate before anything is routed.
    const foreign = await call(hosts[2].url, pro, 'POST', '/mcp', { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'list_sandboxes', arguments: {} } }, { accept: 'application/json, text/event-stream', origin: 'https://evil.example' });
    assert.equal(foreign.status, 403);
    assert.equal(foreign.json.error.code, 'origin_forbidden');
  });

  test('the Demo cap of 2 holds across nodes through MCP and E2B\'s API too', async () => {
    const e2bDemo = e2bKeyOf(demo);
    const rs = await Promise.all(Array.from({ length: 24 }, async (_, i) => {
      const base = hosts[i % 3].url;
      if (i % 2 === 0) {
        const r = await mcp(base, demo, 'create_sandbox', { template: 'base' });
        return { ok: !r.isError, id: r.value?.id as string | undefined, refused: /^concurrency_limit/.test(r.text) };
      }
      const r = await call(base, '', 'POST', '/e2b/api/sandboxes', { templateID: 'base' }, { 'x-api-key': e2bDemo, authorization: '' });
      return { ok: r.status === 201, id: r.json?.sandboxID as string | undefined, refused: r.status === 429 && r.json?.error_code === 'concurrency_limit' };
    }));
    const made = rs.filter((r) => r.ok);
    assert.equal(made.length, 2, JSON.stringify(rs));
    assert.equal(rs.filter((r) => r.refused).length, 22, 'every other create refused with concurrency_limit');
    for (const m of made) assert.equal((await call(hosts[2].url, demo, 'DELETE', `/v1/sandboxes/${m.id}`)).status, 204);
  });

  test('E2B\'s SDK: a sandbox created through one host is reached through another (envd files, list, timeout, kill)', async () => {
    const { Sandbox } = await import('e2b');
    const key = e2bKeyOf(pro);
    const opts = (base: string) => ({ apiKey: key, apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd` });
    const sbx = await Sandbox.create('base', { ...opts(hosts[2].url), metadata: { door: 'e2b' }, envs: { GREETING: 'hi' }, timeoutMs: 600_000 });
    const owner = await ownerOf(sbx.sandboxId);
    assert.ok(owner && owner !== idOf.get(hosts[2].url));
    const ownerUrl = hosts.find((h) => idOf.get(h.url) === owner)!.url;
    const via = hosts.find((h) => h.url !== ownerUrl && h !== hosts[2])!.url;
    // Connected through another host: its envd calls go there and are proxied to the owner.
    const there = await Sandbox.connect(sbx.sandboxId, opts(via));
    await there.files.write('/root/note.txt', 'written-through-a-peer');
    assert.equal(await sbx.files.read('/root/note.txt'), 'written-through-a-peer');
    assert.equal(await there.files.read('/root/note.txt'), 'written-through-a-peer');
    assert.equal(await there.files.exists('/root/nope'), false);
    // Signed file URLs name no sandbox: every host finds the one they were made for.
    const up = await there.uploadUrl('/root/signed.txt');
    const put = await fetch(up, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: 'signed bytes' });
    assert.equal(put.status, 200, await put.clone().text());
    const down = new URL(await there.downloadUrl('/root/signed.txt', { useSignatureExpiration: 60 }));
    for (const h of hosts) {
      assert.equal(await (await fetch(`${h.url}${down.pathname}${down.search}`)).text(), 'signed bytes', `a signed download through ${h.url}`);
      assert.equal((await fetch(`${h.url}${down.pathname}${down.search.replace('signed.txt', 'other.txt')}`)).status, 401, 'an altered one is refused');
    }
    for (const h of hosts) {
      const listed = await Sandbox.list({ ...opts(h.url), query: { metadata: { door: 'e2b' } } }).nextItems();
      assert.deepEqual(listed.map((x) => x.sandboxId), [sbx.sandboxId], `listed through ${h.url}`);
    }
    // With every VM host full, connecting to a running sandbox (which the SDK does on each connect) still works.
    const fillers: string[] = [];
    for (;;) {
      const r = await call(hosts[2].url, pro, 'POST', '/v1/sandboxes', { template: 'base' });
      if (r.status !== 201) {
        assert.equal(r.status, 503, r.bytes.toString());
        break;
      }
      fillers.push(r.json.id);
      assert.ok(fillers.length <= 40, 'the hosts fill up');
    }
    assert.equal((await Sandbox.connect(sbx.sandboxId, opts(via))).sandboxId, sbx.sandboxId);
    for (const id of fillers) assert.equal((await call(hosts[2].url, pro, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
    await there.setTimeout(300_000);
    const info = await Sandbox.getInfo(sbx.sandboxId, opts(hosts[2].url));
    assert.deepEqual(info.metadata, { door: 'e2b' });
    // Another tenant's key reaches nothing, through any host.
    await assert.rejects(Sandbox.connect(sbx.sandboxId, { ...opts(via), apiKey: e2bKeyOf(other) }));
    await there.kill();
    assert.equal(await ownerOf(sbx.sandboxId), undefined);
  });

  test('signed port URLs and E2B\'s traffic token reach another host\'s sandbox port, over HTTP and WebSocket', async () => {
    const echo = new WebSocketServer({ host: '127.0.0.1', port: 0 });
    await new Promise((r) => echo.once('listening', r));
    echo.on('connection', (ws) => ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary })));
    const { createServer } = await import('node:http');
    const web = createServer((req, res) => res.end(`port says ${req.url}`));
    await new Promise<void>((r) => web.listen(0, '127.0.0.1', r));
    try {
      const wsPort = (echo.address() as { port: number }).port;
      const httpPort = (web.address() as { port: number }).port;
      const c = await call(hosts[0].url, pro, 'POST', '/v1/sandboxes', { template: 'base' });
      const id = c.json.id as string;
      const signed = await call(hosts[1].url, pro, 'POST', `/v1/sandboxes/${id}/port-urls`, { port: httpPort });
      assert.equal(signed.status, 201, signed.bytes.toString());
      const path = new URL(signed.json.url, 'http://x').pathname;
      for (const h of hosts) {
        const r = await fetch(`${h.url}${path}hello?x=1`);
        assert.equal(r.status, 200, `signed URL through ${h.url}`);
        assert.equal(await r.text(), 'port says /hello?x=1');
        const forged = await fetch(`${h.url}/v1/p/${'A'.repeat(86)}/`);
        assert.equal(forged.status, 401);
      }
      const signedWs = await call(hosts[2].url, pro, 'POST', `/v1/sandboxes/${id}/port-urls`, { port: wsPort });
      const wsPath = new URL(signedWs.json.url, 'http://x').pathname;
      // E2B's getHost: the sandbox's traffic token (from connect) as e2b-traffic-access-token, no key.
      const token = (await call(hosts[0].url, '', 'POST', `/e2b/api/sandboxes/${id}/connect`, { timeout: 300 }, { 'x-api-key': e2bKeyOf(pro), authorization: '' })).json.trafficAccessToken as string;
      for (const h of hosts) {
        const viaToken = await fetch(`${h.url}/v1/sandboxes/${id}/ports/${httpPort}/t`, { headers: { 'e2b-traffic-access-token': token } });
        assert.equal(await viaToken.text(), 'port says /t', `traffic token through ${h.url}`);
        for (const url of [`${h.url.replace('http', 'ws')}${wsPath}`]) {
          const ws = await new Promise<WebSocket>((resolve, reject) => {
            const w = new WebSocket(url);
            w.once('open', () => resolve(w));
            w.once('error', reject);
          });
          const back = new Promise<Buffer>((r) => ws.once('message', (d) => r(d as Buffer)));
          ws.send(Buffer.from('signed-ws'));
          assert.equal((await back).toString(), 'signed-ws');
          ws.close();
        }
      }
      assert.equal((await call(hosts[2].url, pro, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
      for (const h of hosts) assert.equal((await fetch(`${h.url}${path}`)).status, 404, 'the URL ends with its sandbox');
    } finally {
      await new Promise((r) => echo.close(r));
      await new Promise((r) => web.close(r));
    }
  });

  test('usage, live stats and the event stream through any node cover every host', async () => {
    const events: Array<{ sandbox_id: string; op: string; state: string }> = [];
    const ctl = new AbortController();
    const res = await fetch(`${hosts[2].url}/v1/events`, { headers: { authorization: `Bearer ${pro}` }, signal: ctl.signal });
    assert.equal(res.status, 200);
    const reading = (async () => {
      let buf = '';
      try {
        for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
          buf += Buffer.from(chunk).toString('utf8');
          for (let k; (k = buf.indexOf('\n\n')) >= 0; buf = buf.slice(k + 2)) {
            const data = /^data: (.*)$/m.exec(buf.slice(0, k));
            if (/^event: sandbox$/m.test(buf.slice(0, k)) && data) events.push(JSON.parse(data[1]));
          }
        }
      } catch { /* aborted */ }
    })();
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) {
      const r = await call(hosts[i % 2].url, pro, 'POST', '/v1/sandboxes', { template: 'base', labels: { batch: 'views' } });
      assert.equal(r.status, 201);
      ids.push(r.json.id);
    }
    const owners = new Set(await Promise.all(ids.map(ownerOf)));
    assert.equal(owners.size, 2, 'the sandboxes are on both VM hosts');
    // Stats through the API-only node: a reading of each of the tenant's running sandboxes, wherever it runs.
    const stats = await call(hosts[2].url, pro, 'GET', '/v1/stats');
    assert.equal(stats.status, 200);
    const seen = new Map(stats.json.sandboxes.map((s: { id: string; memory_mib: number }) => [s.id, s.memory_mib]));
    for (const id of ids) assert.equal(seen.get(id), 64, `a reading of ${id}`);
    assert.deepEqual((await call(hosts[2].url, other, 'GET', '/v1/stats')).json.sandboxes, [], 'another tenant sees none');
    // Events: every create, then every delete, whichever host ran it.
    await until('a create event of each sandbox', async () => ids.every((id) => events.some((e) => e.sandbox_id === id && e.op === 'create')));
    for (const id of ids.slice(0, 3)) assert.equal((await call(hosts[0].url, pro, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
    await until('a delete event of each deleted sandbox', async () => ids.slice(0, 3).every((id) => events.some((e) => e.sandbox_id === id && e.op === 'delete' && e.state === 'deleted')));
    assert.equal(events.filter((e) => e.sandbox_id === ids[0] && e.op === 'create').length, 1, 'each event once');
    ctl.abort();
    await reading;
    // Usage through every node: the sandboxes of both hosts, deleted ones included, per day too.
    for (const h of hosts) {
      const u = await until(`usage of all six through ${h.url}`, async () => {
        const r = await call(h.url, pro, 'GET', '/v1/usage?per=day');
        return ids.every((id) => r.json.sandboxes.some((s: { id: string }) => s.id === id)) ? r : undefined;
      });
      assert.equal(u.status, 200);
      const mine = u.json.sandboxes.filter((s: { id: string }) => ids.includes(s.id));
      assert.ok(mine.every((s: { running_secs: number }) => s.running_secs > 0));
      const dayRunning = u.json.days.reduce((n: number, d: { totals: { running_secs: number } }) => n + d.totals.running_secs, 0);
      assert.ok(Math.abs(dayRunning - u.json.totals.running_secs) < 0.01, 'the days add up to the totals');
      assert.ok(!(await call(h.url, other, 'GET', '/v1/usage')).json.sandboxes.some((s: { id: string }) => ids.includes(s.id)), 'another tenant sees none');
    }
    const bad = await call(hosts[2].url, pro, 'GET', '/v1/usage?from=2026-02-01&to=2026-01-01');
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.code, 'validation_error');
    for (const id of ids.slice(3)) await call(hosts[1].url, pro, 'DELETE', `/v1/sandboxes/${id}`);
  });

  test('environments: listed and shown through every host from the cluster database; one name per tenant; unready is template_not_ready; a dead maker\'s log and delete answer 503', async () => {
    const maker = idOf.get(hosts[0].url)!;
    const view = (name: string, state: string) => JSON.stringify({ name, image: `sha256:${'1'.repeat(64)}`, state, error: null, progress: null, log_tail: '', description: '', interpreter: ['/bin/sh', '-c'], ready_command: null, ready_probe: null, secret_names: [], vcpus: 1, memory_mib: 256, egress: 'allow', created_at: new Date(1).toISOString(), updated_at: new Date(1).toISOString() });
    await db.query(`INSERT INTO hosts (id, address, capacity, qemu_version, machine, cpu_model, accel, compat, state, epoch, heartbeat_at, lease_until, registered_at)
      VALUES ('host_gone', 'http://127.0.0.1:9', 4, 'x', 'microvm', 'max', 'tcg', 'x', 'dead', 2, now(), now(), now())`);
    await db.query(`INSERT INTO environments (tenant, name, host_id, generation, state, compat, view) VALUES
      ('pro1', 'web', $1, 1, 'baking', 'c', $2), ('pro1', 'orphan', 'host_gone', 2, 'ready', 'x', $3)`, [maker, view('web', 'baking'), view('orphan', 'ready')]);
    try {
      for (const h of hosts) {
        const listed = await call(h.url, pro, 'GET', '/v1/environments');
        assert.equal(listed.status, 200);
        assert.deepEqual(listed.json.environments.map((e: { name: string }) => e.name), ['web', 'orphan'], `through ${h.url}`);
        assert.deepEqual((await call(h.url, other, 'GET', '/v1/environments')).json.environments, [], 'not another tenant\'s');
        assert.equal((await call(h.url, other, 'GET', '/v1/environments/web')).status, 404);
        const created = await call(h.url, pro, 'POST', '/v1/sandboxes', { template: 'web' });
        assert.equal(created.status, 503);
        assert.equal(created.json.error.code, 'template_not_ready');
        assert.match(created.json.error.message, /Environment web is baking/);
      }
      for (const h of hosts.slice(1)) {
        const got = await call(h.url, pro, 'GET', '/v1/environments/web');
        assert.equal(got.status, 200);
        assert.equal(got.json.state, 'baking');
        const taken = await call(h.url, pro, 'POST', '/v1/environments', { name: 'web', image: 'x' });
        assert.equal(taken.status, 409);
        assert.equal(taken.json.error.code, 'conflict');
      }
      const del = await call(hosts[1].url, pro, 'DELETE', '/v1/environments/orphan');
      assert.equal(del.status, 503);
      assert.equal(del.json.error.code, 'host_at_capacity');
      assert.equal(del.json.error.resource, 'cluster_host');
      assert.equal((await call(hosts[2].url, pro, 'GET', '/v1/environments/orphan/log')).status, 503);
    } finally {
      await db.query(`DELETE FROM environments WHERE tenant = 'pro1'`);
      await db.query(`DELETE FROM hosts WHERE id = 'host_gone'`);
    }
  });

  test('bad cluster flags are refused with a message saying what to pass', () => {
    const run = (...args: string[]) => spawnSync(process.execPath, [BIN, 'serve', ...args], { encoding: 'utf8', env: { ...process.env, COLLIMATE_ENGINE_MODULE: FAKE_ENGINE } });
    const noAdvertise = run('--cluster', cluster);
    assert.equal(noAdvertise.status, 2, noAdvertise.stderr);
    assert.match(noAdvertise.stderr, /--cluster needs --advertise http:\/\/ADDR:PORT/);
    assert.match(run('--cluster', 'mysql://x/y', '--advertise', 'http://127.0.0.1:1').stderr, /--cluster must be a PostgreSQL URL/);
    assert.match(run('--cluster', cluster, '--advertise', 'http://127.0.0.1').stderr, /--advertise must be http:\/\/ADDR:PORT/);
    assert.match(run('--cluster', cluster, '--advertise', 'http://127.0.0.1:9', '--capacity=1.5').stderr, /--capacity must be a whole number/);
    assert.match(run('--advertise', 'http://127.0.0.1:9').stderr, /belong to cluster mode/);
  });
});

/**
 * A describe block's own throwaway PostgreSQL and pool, and the hosts its tests start (pushed onto
 * `hosts`): all stopped after the block.
 */
function clusterFixture(): { get(): { server: ThrowawayPostgres; db: pg.Pool; hosts: Host[] } } {
  let server: ThrowawayPostgres | undefined;
  let db: pg.Pool | undefined;
  const hosts: Host[] = [];
  before(async () => {
    server = await startPostgres();
    db = new pg.Pool({ connectionString: server.url });
    db.on('error', () => {}); // an idle client's connection ending with the server is no failure
  });
  after(async () => {
    await Promise.all(hosts.map((h) => stopHost(h)));
    await db?.end();
    await server?.stop();
  });
  return { get: () => ({ server: server!, db: db!, hosts }) };
}

describe('a cluster host killed with SIGKILL (fake engines, real PostgreSQL)', { skip }, () => {
  const f = clusterFixture();

  test('its running sandboxes become lost and stop counting, creates go elsewhere, and on restart it drops them', async (t) => {
    const { server, db, hosts } = f.get();
    const cluster = server.url;
    const key = keyFor(cluster, 'pro2', 'pro');
    const demoKey = keyFor(cluster, 'demo2', 'demo');
    // Short timings (heartbeat 250 ms, lease 4 s, dead after 5 s) so the test waits seconds, not
    // minutes, with room for the survivor's heartbeats to be late on a loaded machine.
    const env = { COLLIMATE_CLUSTER_TIMINGS: '250,4000,5000' };
    const [h1, h2] = await Promise.all([startHost(cluster, 5, env), startHost(cluster, 5, env)]);
    hosts.push(h1, h2);
    const ids = new Map<string, string>(); // sandbox → host id
    const h2id = (await db.query('SELECT id FROM hosts WHERE address = $1', [h2.url])).rows[0].id as string;
    let onH2: string | undefined;
    for (let i = 0; i < 10 && !onH2; i++) {
      const r = await call(h1.url, key, 'POST', '/v1/sandboxes', { template: 'base' });
      assert.equal(r.status, 201, r.bytes.toString());
      const owner = (await db.query('SELECT host_id FROM sandboxes WHERE id = $1', [r.json.id])).rows[0].host_id;
      ids.set(r.json.id, owner);
      if (owner === h2id) onH2 = r.json.id;
    }
    assert.ok(onH2, 'a sandbox landed on h2');
    // The Demo tenant fills its cap of 2 (wherever placement puts them).
    const demoIds: string[] = [];
    for (;;) {
      const r = await call(h1.url, demoKey, 'POST', '/v1/sandboxes', { template: 'base' });
      assert.equal(r.status, 201);
      demoIds.push(r.json.id);
      if (demoIds.length === 2) break;
    }
    assert.equal((await call(h1.url, demoKey, 'POST', '/v1/sandboxes', { template: 'base' })).status, 429);

    // h1's event stream, open before the kill: the sweep's `lost` comes through it.
    const lostEvents: string[] = [];
    const ctl = new AbortController();
    const stream = await fetch(`${h1.url}/v1/events`, { headers: { authorization: `Bearer ${key}` }, signal: ctl.signal });
    const reading = (async () => {
      try {
        for await (const chunk of stream.body as unknown as AsyncIterable<Uint8Array>) {
          for (const m of Buffer.from(chunk).toString('utf8').matchAll(/^data: (\{.*\})$/gm)) {
            const e = JSON.parse(m[1]);
            if (e.op === 'lost') lostEvents.push(e.sandbox_id);
          }
        }
      } catch { /* aborted */ }
    })();
    // Usage of h2's sandbox, pushed by h2 before it dies.
    await until('h2 to push its usage', async () => (await call(h1.url, key, 'GET', '/v1/usage')).json.sandboxes.some((s: { id: string }) => s.id === onH2));

    const killedAt = Date.now();
    h2.child.kill('SIGKILL');
    await new Promise((r) => h2.child.once('exit', r));
    const lost = await until('h2\'s sandbox to be reported lost through h1', async () => {
      const r = await call(h1.url, key, 'GET', `/v1/sandboxes/${onH2}`);
      return r.status === 404 && /marked it lost/.test(r.json.error.message) ? r : undefined;
    });
    assert.equal(lost.json.error.code, 'sandbox_not_found');
    // Reported, not asserted: the bound is dead-after (5 s here) plus a sweep period; a loaded machine stretches it.
    t.diagnostic(`kill to lost (as seen through h1): ${Date.now() - killedAt} ms with dead-after 5000 ms`);
    const listed = await call(h1.url, key, 'GET', '/v1/sandboxes');
    assert.ok(!listed.json.sandboxes.some((s: { id: string }) => s.id === onH2), 'a lost sandbox is not listed');
    await until('a lost event of h2\'s sandbox through h1', async () => lostEvents.includes(onH2!));
    ctl.abort();
    await reading;
    // Its usage still counts through the survivor, up to the dead host's last heartbeat: it stops growing.
    const u1 = (await call(h1.url, key, 'GET', '/v1/usage')).json.sandboxes.find((s: { id: string }) => s.id === onH2);
    assert.ok(u1 && u1.running_secs > 0, 'a dead host\'s sandbox keeps its usage');
    await new Promise((r) => setTimeout(r, 1100));
    const u2 = (await call(h1.url, key, 'GET', '/v1/usage')).json.sandboxes.find((s: { id: string }) => s.id === onH2);
    assert.equal(u2.running_secs, u1.running_secs, 'and no more accrues once its host is dead');
    // Creates go to h1 (the only host alive), and lost sandboxes no longer count against the Demo cap.
    const again = await until('a create after the kill', async () => {
      const r = await call(h1.url, key, 'POST', '/v1/sandboxes', { template: 'base' });
      return r.status === 201 ? r : undefined;
    });
    assert.notEqual((await db.query('SELECT host_id FROM sandboxes WHERE id = $1', [again.json.id])).rows[0].host_id, h2id);
    const demoOnH2 = (await db.query(`SELECT count(*)::int AS n FROM sandboxes WHERE id = ANY($1) AND host_id = $2`, [demoIds, h2id])).rows[0].n as number;
    const demoAgain = await call(h1.url, demoKey, 'POST', '/v1/sandboxes', { template: 'base' });
    assert.equal(demoAgain.status, demoOnH2 > 0 ? 201 : 429, `the Demo tenant had ${demoOnH2} sandbox(es) on h2`);

    // h2 restarts under the same home: it rejoins as itself and drops what the cluster marked lost.
    const back = await startHost(cluster, 5, env, h2.home);
    hosts.splice(hosts.indexOf(h2), 1, back);
    const rows = await db.query(`SELECT id, state FROM sandboxes WHERE host_id = $1`, [h2id]);
    assert.deepEqual(rows.rows.filter((r) => r.state === 'lost'), [], 'no lost row left for the rejoined host');
    assert.equal((await db.query('SELECT state FROM hosts WHERE id = $1', [h2id])).rows[0].state, 'alive');
  });
});

describe('the cluster database unreachable (fake engines)', { skip }, () => {
  const f = clusterFixture();

  test('a host still serves its own running sandboxes for what leaves their state as it is; the rest answers 503 cluster_database', async () => {
    const { server, db, hosts } = f.get();
    const key = keyFor(server.url, 'outage', 'pro');
    hosts.push(...await Promise.all([startHost(server.url, 5), startHost(server.url, 5)]));
    const c = await call(hosts[0].url, key, 'POST', '/v1/sandboxes', { template: 'base' });
    assert.equal(c.status, 201, c.bytes.toString());
    const id = c.json.id as string;
    const ownerId = (await db.query('SELECT host_id FROM sandboxes WHERE id = $1', [id])).rows[0].host_id as string;
    const ownerUrl = (await db.query('SELECT address FROM hosts WHERE id = $1', [ownerId])).rows[0].address as string;
    const owner = hosts.find((h) => h.url === ownerUrl)!;
    const other = hosts.find((h) => h !== owner)!;
    // Each host has seen the key (its cache keeps it through the outage).
    for (const h of hosts) assert.equal((await call(h.url, key, 'GET', `/v1/sandboxes/${id}`)).status, 200);
    await server.stop();

    const exec = await call(owner.url, key, 'POST', `/v1/sandboxes/${id}/exec`, { command: 'echo still-here' }).catch((e: Error & { cause?: unknown }) => {
      throw new Error(`exec through the owner: ${e.message} (${String(e.cause)}); the owner ${owner.child.exitCode === null && owner.child.signalCode === null ? 'runs' : `exited ${owner.child.exitCode ?? owner.child.signalCode}`}; its log:\n${owner.stderr().slice(-3000)}`);
    });
    assert.equal(exec.status, 200, exec.bytes.toString());
    assert.equal(exec.json.stdout, 'still-here\n');
    assert.equal((await call(owner.url, key, 'GET', `/v1/sandboxes/${id}`)).json.id, id);
    for (const [via, method, path] of [
      [other, 'POST', `/v1/sandboxes/${id}/exec`],
      [owner, 'DELETE', `/v1/sandboxes/${id}`],
      [owner, 'POST', `/v1/sandboxes/${id}/suspend`],
      [owner, 'POST', `/v1/sandboxes/${id}/fork`],
    ] as const) {
      const r = await call(via.url, key, method, path, method === 'POST' ? (path.endsWith('/exec') ? { command: 'true' } : {}) : undefined);
      assert.equal(r.status, 503, `${method} ${path} through ${via === owner ? 'the owner' : 'another host'}: ${r.bytes}`);
      assert.equal(r.json.error.code, 'host_at_capacity');
      assert.equal(r.json.error.resource, 'cluster_database');
    }
  });
});
