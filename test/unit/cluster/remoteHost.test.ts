/**
 * Another host's sandboxes through RemoteHost (src/cluster/remoteHost.ts) and the peer endpoint
 * that serves them (src/api/peerRoutes.ts), over real HTTP on loopback, the serving side a tenant
 * service's own host over the fake engine: each way an operation travels (HOST_OPERATIONS) gives
 * what the host itself gives — JSON calls with Buffers and bigints, errors as the same
 * CollimateErrors, exec output as it comes, a download paced by a slow sink, an upload, a directory
 * watch until closed — and only peers are served; a placed start the host turns away is a refusal
 * the placement may place elsewhere.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import Fastify, { type FastifyInstance } from 'fastify';
import { registerPeerHost } from '../../../src/api/peerRoutes.ts';
import { RemoteHost, PEER_HOST_PATH } from '../../../src/cluster/remoteHost.ts';
import { CollimateError } from '../../../src/errors.ts';
import { isHostRefusal } from '../../../src/service/placement.ts';
import type { SandboxHost } from '../../../src/service/sandboxHost.ts';
import { TenantService } from '../../../src/service/tenantService.ts';
import { openDb } from '../../../src/store/db.ts';
import type { FileChange } from '../../../src/sandboxes/types.ts';
import { FAKE_SYSTEM_DISK_BYTES, FakeSandboxService } from '../../support/fakeSandboxService.ts';

const SECRET = 'peer-secret-for-tests';

describe('another host\'s sandboxes through RemoteHost and the peer endpoint (fake engine, real HTTP)', () => {
  let app: FastifyInstance;
  let local: SandboxHost;
  let remote: SandboxHost;
  let address = '';
  let admitting: true | string = true;
  const scope = { tenant: 'acme' };
  let engine: FakeSandboxService & { vmmUsage?: (ids: readonly string[]) => Map<string, { cpuSecs: number; rssBytes: number }> };

  before(async () => {
    engine = new FakeSandboxService();
    const tenants = new TenantService({ engine, db: openDb(':memory:'), reconcileIntervalMs: 0 });
    local = tenants.here;
    app = Fastify();
    registerPeerHost(app, {
      host: local,
      isPeer: (s) => s === SECRET,
      admit: () => (admitting === true ? { release() {} } : admitting),
      calls: { echo: (x: unknown) => x },
    });
    address = await app.listen({ host: '127.0.0.1', port: 0 });
    remote = new RemoteHost('host_b', address, SECRET).asHost();
  });

  after(async () => {
    await app.close();
  });

  test('calls answer as the host does, Buffers and bigints included; its errors come back as the same errors', async () => {
    const made = await remote.create({ template: 'base', labels: { via: 'peer' } }, scope);
    // Ages count from the moment each is read; the rest is the host's record.
    const still = ({ age_secs: _a, idle_secs: _i, remaining_secs: _r, ...rest }: Awaited<ReturnType<SandboxHost['get']>>) => rest;
    assert.deepEqual(still(await remote.get(made.id, scope)), still(await local.get(made.id, scope)));
    assert.deepEqual(made.labels, { via: 'peer' });
    const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    await remote.writeFile(made.id, '/root/all-bytes', bytes, scope);
    assert.deepEqual(await remote.readFile(made.id, '/root/all-bytes', scope), bytes);
    const stat = await remote.fsStat(made.id, '/root/all-bytes', scope);
    assert.equal(typeof stat.mtimeNs, 'bigint');
    const { mtimeNs: _m, ...rest } = stat;
    const { mtimeNs: _n, ...here } = await local.fsStat(made.id, '/root/all-bytes', scope);
    assert.deepEqual(rest, here);
    await assert.rejects(async () => remote.get('sbx_000000000000', scope), (e: unknown) => e instanceof CollimateError && e.code === 'sandbox_not_found' && e.status === 404);
    await assert.rejects(async () => remote.get(made.id, { tenant: 'globex' }), (e: unknown) => e instanceof CollimateError && e.code === 'sandbox_not_found', 'another tenant\'s, as on the host');
    await remote.delete(made.id, scope);
  });

  test('exec output arrives as it is written, then the result; the exec log and the sandbox log are kept where the sandbox runs', async () => {
    const made = await remote.create({ template: 'base' }, scope);
    const out: Buffer[] = [];
    const r = await remote.exec(made.id, { command: 'echo streamed' }, scope, { onStdout: (c) => out.push(c) });
    assert.equal(Buffer.concat(out).toString(), r.stdout);
    assert.match(r.stdout, /streamed/);
    const logged = await local.recentExecs(made.id, 10, scope);
    assert.equal(logged.length, 1);
    assert.deepEqual(await remote.recentExecs(made.id, 10, scope), logged);
    const entries = await local.logs(made.id, { search: 'echo streamed' }, scope);
    assert.equal(entries.length, 1);
    assert.deepEqual(await remote.logs(made.id, { search: 'echo streamed' }, scope), entries);
    await assert.rejects(async () => remote.logs(made.id, {}, { tenant: 'globex' }), (e: unknown) => e instanceof CollimateError && e.code === 'sandbox_not_found');
    await remote.delete(made.id, scope);
  });

  test("a sandbox's metrics are sampled on the host that runs it, its guest's disk use included", async () => {
    const made = await remote.create({ template: 'base' }, scope);
    engine.vmmUsage = (ids) => new Map(ids.map((id) => [id, { cpuSecs: 1, rssBytes: 80 * 1048576 }]));
    try {
      await remote.writeFile(made.id, '/root/one', Buffer.alloc(1048576), scope);
      const samples = await remote.metrics(made.id, undefined, undefined, scope);
      assert.deepEqual(samples, await local.metrics(made.id, undefined, undefined, scope));
      assert.equal(samples.length, 1);
      assert.deepEqual([samples[0].memoryMib, samples[0].diskUsedBytes, samples[0].diskTotalBytes], [80, FAKE_SYSTEM_DISK_BYTES + 1048576, (await local.get(made.id, scope)).disk_mib * 1048576]);
    } finally {
      delete engine.vmmUsage;
      await remote.delete(made.id, scope);
    }
  });

  test('an upload streams its bytes; a download is paced by a slow sink and arrives whole', async () => {
    const made = await remote.create({ template: 'base' }, scope);
    const big = Buffer.alloc(600 * 1024);
    for (let i = 0; i < big.length; i++) big[i] = (i * 7) & 0xff;
    async function* pieces() {
      for (let off = 0; off < big.length; off += 100_000) yield big.subarray(off, off + 100_000);
    }
    const up = await remote.uploadFile(made.id, '/root/big', pieces(), { mode: 0o600 }, scope);
    assert.equal(up.bytes, big.length);
    const got: Buffer[] = [];
    let started: { size: number; mode: number } | undefined;
    const r = await remote.downloadFile(made.id, '/root/big', {
      start: (info) => void (started = info),
      chunk: async (d) => {
        got.push(Buffer.from(d));
        await new Promise((res) => setTimeout(res, 5));
      },
    }, scope);
    assert.equal(r.size, big.length);
    assert.equal(started?.size, big.length);
    assert.ok(Buffer.concat(got).equals(big));
    await assert.rejects(remote.downloadFile(made.id, '/root/none', { chunk() {} }, scope), (e: unknown) => e instanceof CollimateError && e.code === 'file_not_found');
    await remote.delete(made.id, scope);
  });

  test('a directory watch sends changes until it is closed', async () => {
    const made = await remote.create({ template: 'base' }, scope);
    await remote.fsMkdir(made.id, '/root/w', {}, scope);
    const changes: FileChange[] = [];
    const watch = await remote.fsWatch(made.id, '/root/w', false, { onChange: (c) => changes.push(c), onEnd: () => {} }, scope);
    await remote.writeFile(made.id, '/root/w/a', Buffer.from('x'), scope);
    for (let i = 0; i < 200 && changes.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    assert.ok(changes.some((c) => c.name === 'a'), JSON.stringify(changes));
    await watch.close();
    const seen = changes.length;
    await remote.writeFile(made.id, '/root/w/b', Buffer.from('y'), scope);
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(changes.length, seen, 'nothing after close');
    await remote.delete(made.id, scope);
  });

  test('the output and exit of a process arrive through a watch, held output first; its stdin streams; the watch ends with the exit', async () => {
    const made = await remote.create({ template: 'base' }, scope);
    const cat = await remote.startProcess(made.id, { command: 'cat', stdin: true }, scope);
    assert.equal(await remote.writeProcessStdin(made.id, cat.pid, Buffer.from('held '), scope), 5);
    await new Promise((r) => setTimeout(r, 50));
    const events: Array<{ type: string; data?: Buffer }> = [];
    const unsubscribe = await remote.watchProcessOutput(made.id, cat.pid, 'start', (e) => events.push(e), scope);
    async function* typed() {
      yield Buffer.from('live');
    }
    await remote.writeProcessStdin(made.id, cat.pid, typed(), scope);
    await remote.closeProcessStdin(made.id, cat.pid, scope);
    for (let i = 0; i < 300 && !events.some((e) => e.type === 'exit'); i++) await new Promise((r) => setTimeout(r, 10));
    const text = Buffer.concat(events.filter((e) => e.type === 'output').map((e) => e.data!)).toString();
    assert.equal(text, 'held live', JSON.stringify(events));
    assert.equal(events.at(-1)?.type, 'exit', 'the exit last');
    unsubscribe();
    const done = await remote.waitProcess(made.id, cat.pid, 5, scope);
    assert.equal(done.exit_code, 0, JSON.stringify(done));
    await remote.delete(made.id, scope);
  });

  test('only peers are served, and a placed start the host cannot take is a refusal to place elsewhere', async () => {
    const res = await fetch(`${address}${PEER_HOST_PATH}/get`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ args: ['sbx_000000000000', scope] }) });
    assert.equal(res.status, 401);
    const wrong = new RemoteHost('host_b', address, 'not-the-secret').asHost();
    await assert.rejects(Promise.resolve(wrong.get('sbx_000000000000', scope)));
    admitting = 'this host runs 20 sandboxes of its capacity 20';
    try {
      const placed = new RemoteHost('host_b', address, SECRET).placed({ admit: 1 });
      await assert.rejects(placed.create({ template: 'base' }, scope), (e: unknown) => isHostRefusal(e) && /capacity 20/.test((e as Error).message));
    } finally {
      admitting = true;
    }
    const unreachable = new RemoteHost('host_c', 'http://127.0.0.1:9', SECRET).placed({ admit: 1 });
    // An unreachable host is a refusal too: a create placed there goes elsewhere.
    await assert.rejects(unreachable.create({ template: 'base' }, scope), (e: unknown) => e instanceof CollimateError && e.code === 'host_at_capacity' && isHostRefusal(e));
    assert.deepEqual(await new RemoteHost('host_b', address, SECRET).call('echo', [{ a: Buffer.from('hi') }]), { a: Buffer.from('hi') });
  });
});
