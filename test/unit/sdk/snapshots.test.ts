/**
 * Both SDKs' snapshots against a real API server on the fake service (which keeps a snapshot's files
 * in memory): take one, start one and N sandboxes from it, roll its sandbox back in place (running
 * and suspended), get, list with filters and pages, delete, and the snapshot error classes and quota.
 * The Python half runs python/test_snapshots.py against the same server.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { fixture, type Fixture } from '../api/helpers.js';
import {
  Collimate, InvalidStateError, NotFoundError, QuotaExceededError, SnapshotMismatchError, ValidationError, type Snapshot,
} from '../../../src/sdk/index.js';

let f: Fixture;
let base: string;

before(async () => {
  f = await fixture();
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
});
after(() => f.close());

const read = async (sb: { files: { read(p: string): Promise<Buffer> } }, path: string) => (await sb.files.read(path)).toString();

test('TypeScript SDK: snapshot, start one and N from it, restore in place, get, list, delete', async () => {
  const client = new Collimate({ baseUrl: base, apiKey: f.key('ts-snap', 'pro') });
  await using sb = await client.sandboxes.create({ template: 'python', labels: { role: 'origin' } });
  assert.equal(sb.fromSnapshot, null);
  await sb.files.write('/root/state.txt', 'v1');

  const snap = await sb.snapshot({ name: 'after v1', labels: { step: '1' } });
  assert.match(snap.id, /^snap_[0-9a-f]{16}$/);
  assert.deepEqual(
    { name: snap.name, labels: snap.labels, sandbox_id: snap.sandbox_id, template: snap.template, vcpus: snap.vcpus, memory_mib: snap.memory_mib, egress: snap.egress },
    { name: 'after v1', labels: { step: '1' }, sandbox_id: sb.id, template: 'python', vcpus: sb.info.vcpus, memory_mib: sb.info.memory_mib, egress: sb.egress },
  );
  const plain = await sb.snapshot();
  assert.deepEqual([plain.name, plain.labels], [null, {}]);

  // Rolled back in place while running: same id, the snapshot's files, runs on.
  await sb.files.write('/root/state.txt', 'v2');
  assert.equal(await sb.restore(snap), sb);
  assert.deepEqual([sb.id, sb.state, sb.fromSnapshot], [sb.info.id, 'running', snap.id]);
  assert.equal(await read(sb, '/root/state.txt'), 'v1');

  // A suspended one stays suspended at it; by id as well as by object.
  await sb.files.write('/root/state.txt', 'v3');
  await sb.suspend();
  await sb.restore(plain.id);
  assert.deepEqual([sb.state, sb.fromSnapshot], ['suspended', plain.id]);
  await sb.resume();
  assert.equal(await read(sb, '/root/state.txt'), 'v1');

  // One sandbox from it: a new id with the snapshot's files and template, the labels asked for.
  await using one = await client.sandboxes.fromSnapshot(snap.id, { labels: { role: 'copy' }, timeoutSecs: 120 });
  assert.notEqual(one.id, sb.id);
  assert.deepEqual([one.state, one.template, one.fromSnapshot, one.labels, one.info.timeout_secs], ['running', 'python', snap.id, { role: 'copy' }, 120]);
  assert.equal(await read(one, '/root/state.txt'), 'v1');

  // N from it, in one request.
  const many = await client.sandboxes.manyFromSnapshot(snap, 3, { labels: { role: 'many' } });
  assert.equal(many.length, 3);
  assert.equal(new Set([sb.id, one.id, ...many.map((s) => s.id)]).size, 5, 'every start is a new sandbox');
  for (const s of many) {
    assert.deepEqual([s.state, s.fromSnapshot, s.labels], ['running', snap.id, { role: 'many' }]);
    assert.equal(await read(s, '/root/state.txt'), 'v1');
  }
  assert.deepEqual(
    (await client.sandboxes.list({ labels: { role: 'many' } }).all()).map((s) => s.id).sort(),
    many.map((s) => s.id).sort(),
  );
  await Promise.all(many.map((s) => s.delete()));
  await assert.rejects(client.sandboxes.manyFromSnapshot(snap, 0), ValidationError);

  // Get, list (filters and pages), delete.
  assert.deepEqual(await client.snapshots.get(snap.id), snap);
  const ofOne = await one.snapshot({ labels: { step: '2' } });
  const ids = (list: Snapshot[]) => list.map((s) => s.id).sort();
  assert.deepEqual(ids(await client.snapshots.list().all()), ids([snap, plain, ofOne]));
  assert.deepEqual(ids(await client.snapshots.list({ sandboxId: sb.id }).all()), ids([snap, plain]));
  assert.deepEqual(ids(await client.snapshots.list({ labels: { step: '2' } }).all()), [ofOne.id]);
  const pages: string[][] = [];
  for await (const page of client.snapshots.list({ limit: 2 })) pages.push(page.map((s) => s.id));
  assert.deepEqual(pages.map((p) => p.length), [2, 1]);
  assert.deepEqual(pages.flat().sort(), ids([snap, plain, ofOne]));

  await client.snapshots.delete(plain);
  await client.snapshots.delete(ofOne.id);
  const gone = await client.snapshots.get(plain.id).then(() => null, (e: unknown) => e);
  assert.ok(gone instanceof NotFoundError, String(gone));
  assert.equal(gone.code, 'snapshot_not_found');
  await assert.rejects(client.snapshots.delete(plain.id), NotFoundError);
  await assert.rejects(client.sandboxes.fromSnapshot(plain.id), (e: unknown) => e instanceof NotFoundError && e.code === 'snapshot_not_found');
  assert.deepEqual(ids(await client.snapshots.list().all()), [snap.id]);

  // A sandbox rolls back only to its own snapshots; other tenants see none of them.
  const mismatch = await one.restore(snap).then(() => null, (e: unknown) => e);
  assert.ok(mismatch instanceof SnapshotMismatchError && mismatch instanceof InvalidStateError, String(mismatch));
  assert.deepEqual([mismatch.code, mismatch.status], ['snapshot_mismatch', 409]);
  const other = new Collimate({ baseUrl: base, apiKey: f.key('ts-snap-other', 'pro') });
  await assert.rejects(other.snapshots.get(snap.id), NotFoundError);
  assert.deepEqual(await other.snapshots.list().all(), []);
  await client.snapshots.delete(snap);
});

test('TypeScript SDK: the snapshots quota is a QuotaExceededError naming it', async () => {
  const client = new Collimate({ baseUrl: base, apiKey: f.key('ts-snap-quota', 'demo') });
  await using sb = await client.sandboxes.create({ template: 'base' });
  for (let i = 0; i < 5; i++) await sb.snapshot();
  const refused = await sb.snapshot().then(() => null, (e: unknown) => e);
  assert.ok(refused instanceof QuotaExceededError, String(refused));
  assert.equal(refused.quota, 'snapshots');
});

test('Python SDK: the same surface, and collimate_rl.sweep of a run\'s snapshots (python/test_snapshots.py against this server)', async () => {
  const script = fileURLToPath(new URL('./python/test_snapshots.py', import.meta.url));
  const env = {
    ...process.env, COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: f.key('py-snap', 'pro'),
    OTHER_API_KEY: f.key('py-snap-other', 'pro'), DEMO_API_KEY: f.key('py-snap-quota', 'demo'),
  };
  const r = await promisify(execFile)('/usr/bin/python3', [script], { env, timeout: 60_000 }).catch((e) => e);
  assert.equal(r.code ?? 0, 0, `${r.stdout}\n${r.stderr}`);
  assert.match(r.stderr, /Ran 3 tests[\s\S]*\nOK\s*$/);
});
