/**
 * E2B's snapshot calls on the E2B door, driven by the unmodified `e2b` SDK (the newest pinned 2.x and
 * an older 2.x) over a real loopback listener, on the fake sandbox service (whose snapshots copy the
 * sandbox's files): createSnapshot, listSnapshots, Sandbox.create(snapshotId) and deleteSnapshot.
 * Files are written and read through envd, served on the same listener.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import * as e2bNew from 'e2b';
import * as e2bOld from 'e2b-2-30';
import { e2bKeyOf } from '../../../src/service/keys.js';
import { SandboxEnvStore } from '../../../src/e2b/sandboxEnv.js';
import { e2bNames } from '../../../src/e2b/names.js';
import { snapshotNotFound } from '../../../src/errors.js';
import { openDb } from '../../../src/store/db.js';
import { FakeSandboxService } from '../../support/fakeSandboxService.js';
import { serverOn } from '../api/helpers.js';
import type { ApiServer } from '../../../src/api/server.js';

let dir: string;
let api: ApiServer;
let svc: FakeSandboxService;
let base: string;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'collimate-e2b-snap-'));
  const db = openDb(join(dir, 'collimate.db'));
  svc = new FakeSandboxService({ events: true });
  api = await serverOn(svc, db);
  await api.app.listen({ host: '127.0.0.1', port: 0 });
  base = `http://127.0.0.1:${(api.app.server.address() as AddressInfo).port}`;
});

after(async () => {
  await api.shutdown(100);
  rmSync(dir, { recursive: true, force: true });
});

let tenants = 0;
/** SDK options under a tenant of its own, so its lists hold only what the test made; `key` is its Collimate key, for the other doors. */
function freshTenant() {
  const key = api.keys.create({ tenant: `snap-${++tenants}`, tier: 'pro' }).key;
  return { apiKey: e2bKeyOf(key), apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd`, key };
}

/** One MCP tool call on /mcp (stateless Streamable HTTP): the tool result, whether it came as JSON or SSE. */
async function mcpTool(key: string, name: string, args: Record<string, unknown>): Promise<{ isError?: boolean; content: Array<{ text: string }> }> {
  const res = await fetch(`${base}/mcp`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name, arguments: args } }),
  });
  const text = await res.text();
  assert.equal(res.status, 200, text);
  const msg = res.headers.get('content-type')?.startsWith('text/event-stream') ? JSON.parse(text.split('\n').filter((l) => l.startsWith('data: ')).pop()!.slice(6)) : JSON.parse(text);
  return msg.result;
}

const envOf = (id: string) => new SandboxEnvStore(api.tenants.db).get(id);
const byId = (ids: string[]) => [...ids].sort();

// The older SDK's types differ in details these calls do not touch.
for (const [version, sdk] of [['2.51', e2bNew], ['2.30', e2bOld as unknown as typeof e2bNew]] as const) {
  describe(`e2b ${version} snapshots`, () => {
    it('createSnapshot (instance and static) answers our snapshot id and the name; the sandbox goes on running', async () => {
      const opts = freshTenant();
      const sbx = await sdk.Sandbox.create('python', opts);
      const unnamed = await sbx.createSnapshot();
      assert.match(unnamed.snapshotId, /^snap_[0-9a-f]{16}$/);
      assert.deepEqual(unnamed.names, []);
      assert.equal(svc.getSnapshot(unnamed.snapshotId).sandbox_id, sbx.sandboxId);
      assert.equal(svc.get(sbx.sandboxId).state, 'running');
      const named = await sdk.Sandbox.createSnapshot(sbx.sandboxId, { ...opts, name: 'my-snap' });
      assert.notEqual(named.snapshotId, unnamed.snapshotId);
      assert.deepEqual(named.names, ['my-snap']);
      assert.equal(svc.getSnapshot(named.snapshotId).name, 'my-snap');
      await assert.rejects(sdk.Sandbox.createSnapshot('sbx_000000000000', opts), (e: Error) => e.name === 'SandboxNotFoundError');
      await sbx.kill();
    });

    it("Sandbox.create(snapshotId) starts a sandbox with the snapshot's files and envs, each an independent copy", async () => {
      const opts = freshTenant();
      const sbx = await sdk.Sandbox.create('python', { ...opts, envs: { FROM: 'source' }, lifecycle: { onTimeout: 'pause' } } as never);
      await sbx.files.makeDir('/home/user/app');
      await sbx.files.write('/home/user/app/a.txt', 'at the snapshot');
      const snap = await sbx.createSnapshot();
      await sbx.files.write('/home/user/app/a.txt', 'after the snapshot');
      await sbx.kill();

      const one = await sdk.Sandbox.create(snap.snapshotId, { ...opts, metadata: { copy: 'one' }, envs: { OWN: '1' }, timeoutMs: 120_000 });
      const two = await sdk.Sandbox.create(snap.snapshotId, opts);
      assert.equal(await one.files.read('/home/user/app/a.txt'), 'at the snapshot');
      assert.equal(await one.files.exists('/home/user/app'), true);
      await one.files.write('/home/user/app/a.txt', 'changed in one');
      assert.equal(await two.files.read('/home/user/app/a.txt'), 'at the snapshot');

      const info = svc.get(one.sandboxId);
      assert.equal(info.from_snapshot, snap.snapshotId);
      assert.deepEqual(info.labels, { copy: 'one' });
      // E2B's create defaults hold, not the source's lifecycle (it paused at its timeout).
      assert.equal(info.on_timeout, 'delete');
      const endsIn = (await sdk.Sandbox.getInfo(one.sandboxId, opts)).endAt.getTime() - Date.now();
      assert.ok(endsIn > 100_000 && endsIn <= 120_000, `ends in ${endsIn} ms`);
      // The envs the source had, under the create's own.
      assert.deepEqual(envOf(one.sandboxId), { FROM: 'source', OWN: '1' });
      assert.deepEqual(envOf(two.sandboxId), { FROM: 'source' });
      for (const s of [one, two]) await s.kill();
    });

    it('listSnapshots: all of the tenant, or of one sandbox', async () => {
      const opts = freshTenant();
      const a = await sdk.Sandbox.create('python', opts);
      const b = await sdk.Sandbox.create('python', opts);
      const ofA = [(await a.createSnapshot()).snapshotId, (await a.createSnapshot({ name: 'x' })).snapshotId];
      const ofB = [(await b.createSnapshot()).snapshotId];
      const all = sdk.Sandbox.listSnapshots(opts);
      assert.deepEqual((await all.nextItems()).map((s) => s.snapshotId), byId([...ofA, ...ofB]));
      assert.equal(all.hasNext, false);
      const listed = await a.listSnapshots().nextItems();
      assert.deepEqual(listed.map((s) => s.snapshotId), byId(ofA));
      assert.deepEqual(listed.find((s) => s.snapshotId === ofA[1])!.names, ['x']);
      assert.deepEqual((await sdk.Sandbox.listSnapshots({ ...opts, sandboxId: b.sandboxId }).nextItems()).map((s) => s.snapshotId), ofB);
      for (const s of [a, b]) await s.kill();
    });

    it('listSnapshots pages of a small limit with x-next-token, in id order', async () => {
      const opts = freshTenant();
      const sbx = await sdk.Sandbox.create('python', opts);
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) ids.push((await sbx.createSnapshot()).snapshotId);
      const paginator = sdk.Sandbox.listSnapshots({ ...opts, limit: 2 });
      const pages: string[][] = [];
      while (paginator.hasNext) pages.push((await paginator.nextItems()).map((s) => s.snapshotId));
      const sorted = byId(ids);
      assert.deepEqual(pages, [sorted.slice(0, 2), sorted.slice(2, 4), sorted.slice(4)]);
      await sbx.kill();
    });

    it('deleteSnapshot: true, then false; the snapshot is gone, and so are its envs', async () => {
      const opts = freshTenant();
      const sbx = await sdk.Sandbox.create('python', { ...opts, envs: { KEEP: 'me' } });
      const snap = await sbx.createSnapshot();
      assert.deepEqual(envOf(snap.snapshotId), { KEEP: 'me' });
      assert.equal(await sdk.Sandbox.deleteSnapshot(snap.snapshotId, opts), true);
      assert.throws(() => svc.getSnapshot(snap.snapshotId), /No snapshot/);
      assert.deepEqual(envOf(snap.snapshotId), {});
      assert.equal(await sdk.Sandbox.deleteSnapshot(snap.snapshotId, opts), false);
      await assert.rejects(sdk.Sandbox.create(snap.snapshotId, opts), (e: Error) => e instanceof sdk.SandboxError && /No snapshot/.test(e.message));
      await sbx.kill();
    });

    it('a snapshot deleted through REST or MCP takes its envs too (the row E2B keeps for the sandboxes started from it)', async () => {
      const opts = freshTenant();
      const sbx = await sdk.Sandbox.create('python', { ...opts, envs: { KEEP: 'me' } });
      const viaRest = await sbx.createSnapshot();
      const viaMcp = await sbx.createSnapshot();
      assert.deepEqual(envOf(viaRest.snapshotId), { KEEP: 'me' });
      assert.deepEqual(envOf(viaMcp.snapshotId), { KEEP: 'me' });
      const del = await fetch(`${base}/v1/snapshots/${viaRest.snapshotId}`, { method: 'DELETE', headers: { authorization: `Bearer ${opts.key}` } });
      assert.equal(del.status, 204, await del.text());
      assert.deepEqual(envOf(viaRest.snapshotId), {});
      assert.deepEqual(envOf(viaMcp.snapshotId), { KEEP: 'me' }, 'only the deleted snapshot\'s envs go');
      const tool = await mcpTool(opts.key, 'delete_snapshot', { snapshot_id: viaMcp.snapshotId });
      assert.ok(!tool.isError, tool.content[0].text);
      assert.deepEqual(envOf(viaMcp.snapshotId), {});
      // Gone for E2B as well: not listed, not deleted again, not started from.
      assert.deepEqual((await sdk.Sandbox.listSnapshots({ ...opts, sandboxId: sbx.sandboxId }).nextItems()).map((s) => s.snapshotId), []);
      assert.equal(await sdk.Sandbox.deleteSnapshot(viaRest.snapshotId, opts), false);
      await assert.rejects(sdk.Sandbox.create(viaMcp.snapshotId, opts), (e: Error) => e instanceof sdk.SandboxError && /No snapshot/.test(e.message));
      assert.deepEqual(envOf(sbx.sandboxId), { KEEP: 'me' }, 'the sandbox keeps its own');
      await sbx.kill();
    });

    it("another tenant's snapshot is not found: not listed, not started, not deleted", async () => {
      const mine = freshTenant();
      const theirs = freshTenant();
      const sbx = await sdk.Sandbox.create('python', mine);
      const snap = await sbx.createSnapshot();
      assert.deepEqual(await sdk.Sandbox.listSnapshots(theirs).nextItems(), []);
      await assert.rejects(sdk.Sandbox.create(snap.snapshotId, theirs), /No snapshot/);
      assert.equal(await sdk.Sandbox.deleteSnapshot(snap.snapshotId, theirs), false);
      assert.equal(svc.getSnapshot(snap.snapshotId).id, snap.snapshotId);
      await sbx.kill();
    });
  });
}

describe('e2b 2.51 listSnapshots by name', () => {
  it('finds a name with any tag, a name:tag with that tag (default when none was given), and a snapshot id; an unknown name is empty', async () => {
    const opts = freshTenant();
    const a = await e2bNew.Sandbox.create('python', opts);
    const b = await e2bNew.Sandbox.create('python', opts);
    const plain = (await a.createSnapshot({ name: 'snap-filter' })).snapshotId;
    const tagged = (await b.createSnapshot({ name: 'snap-filter:v2' })).snapshotId;
    const other = (await a.createSnapshot({ name: 'snap-filter-other' })).snapshotId;
    const unnamed = (await a.createSnapshot()).snapshotId;
    const named = async (name: string, sandboxId?: string) => (await e2bNew.Sandbox.listSnapshots({ ...opts, name, ...(sandboxId ? { sandboxId } : {}) }).nextItems()).map((s) => s.snapshotId);
    assert.deepEqual(await named('snap-filter'), byId([plain, tagged]));
    assert.deepEqual(await named('snap-filter:default'), [plain]);
    assert.deepEqual(await named('snap-filter:v2'), [tagged]);
    assert.deepEqual(await named('snap-filter-other'), [other]);
    assert.deepEqual(await named('snap-filter', a.sandboxId), [plain]);
    assert.deepEqual(await named(unnamed), [unnamed]);
    assert.deepEqual(await named('snap-filter-does-not-exist'), []);
    const page = await e2bNew.Sandbox.listSnapshots({ ...opts, name: 'snap-filter', limit: 1 });
    assert.deepEqual(await page.nextItems().then((items) => items.map((s) => s.snapshotId)), byId([plain, tagged]).slice(0, 1));
    assert.deepEqual(await page.nextItems().then((items) => items.map((s) => s.snapshotId)), byId([plain, tagged]).slice(1));
    assert.equal(page.hasNext, false);
    for (const s of [a, b]) await s.kill();
  });
});

describe('E2B snapshot requests the SDK never sends', () => {
  it('refuses a limit over 100, a nextToken this server did not give and a name that is too long, in E2B\'s error shape', async () => {
    const opts = freshTenant();
    const get = (q: string) => fetch(`${opts.apiUrl}/snapshots?${q}`, { headers: { 'x-api-key': opts.apiKey } });
    for (const [q, words] of [['limit=101', /limit must be a whole number from 1 to 100/], ['limit=0', /limit/], ['nextToken=garbage', /nextToken/]] as const) {
      const res = await get(q);
      assert.equal(res.status, 400, q);
      const body = (await res.json()) as { code: number; message: string };
      assert.equal(body.code, 400);
      assert.match(body.message, words);
    }
    const full = await get('limit=100');
    assert.equal(full.status, 200);
    assert.deepEqual(await full.json(), []);
    assert.equal(full.headers.get('x-next-token'), null);
    const sbx = await e2bNew.Sandbox.create('python', opts);
    await assert.rejects(sbx.createSnapshot({ name: 'n'.repeat(129) }), /400: name/);
    await sbx.kill();
  });

  it('DELETE /templates/{id} of a template is still not served (404, E2B\'s shape); of a snapshot id it deletes', async () => {
    const opts = freshTenant();
    const del = (id: string) => api.app.inject({ method: 'DELETE', url: `/e2b/api/templates/${encodeURIComponent(id)}`, headers: { 'x-api-key': opts.apiKey } });
    const template = await del('python');
    assert.equal(template.statusCode, 404);
    assert.equal(template.json().code, 404);
    assert.match(template.json().message, /DELETE \/templates\/python is not served/);
    const sbx = await e2bNew.Sandbox.create('python', opts);
    const snap = await sbx.createSnapshot();
    const deleted = await del(snap.snapshotId);
    assert.equal(deleted.statusCode, 204);
    const again = await del(snap.snapshotId);
    assert.equal(again.statusCode, 404);
    assert.deepEqual([again.json().code, again.json().error_code], [404, 'snapshot_not_found']);
    await sbx.kill();
  });

  it("names the SDK's snapshot calls in the service's messages", () => {
    assert.equal(snapshotNotFound('snap_0000000000000000').text(e2bNames), 'No snapshot with id snap_0000000000000000. List yours with Sandbox.listSnapshots().');
  });
});
