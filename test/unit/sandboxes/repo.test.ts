import { test } from 'node:test';
import assert from 'node:assert/strict';
import { type SandboxRow, type SnapshotRow } from '../../../src/sandboxes/repo.ts';
import { freshRepo, row } from '../../support/sandboxRows.ts';

const t = freshRepo('repo');

const ids = (rows: SandboxRow[]) => rows.map((r) => r.id);

test('insert then get gives the row back, JSON columns decoded', () => {
  const r = row('sbx_a', {
    labels: { team: 'rl', 'odd"key': 'v' },
    egress: { allow: ['pypi.org'] } as unknown as SandboxRow['egress'],
    vmm: { pid: 12, startTicks: '34', dir: '/d', diskPath: '/h/disks/sbx_a-0.qcow2', memPath: '/m', memShared: false, artifactKey: 'k' },
    snapshot: { statePath: '/s/state.mig', bytes: 99, suspendedAt: 5 },
    pending_op: { op: 'fork', forkPoint: 'fp_1', startedAt: 7 },
  });
  t.repo.insert(r);
  assert.deepEqual(t.repo.get('sbx_a'), { ...r, keep_memory: 1, deleted_at: null, end_reason: null, from_snapshot: null });
  assert.equal(t.repo.get('sbx_missing'), undefined);
});

test('snapshots: listed only once ready, per tenant and source, by id; removing one drops its hold on its fork point', () => {
  const snap = (id: string, over: Partial<SnapshotRow> = {}): SnapshotRow => ({
    id, tenant: 'acme', name: null, labels: { run: '1' }, source: 'sbx_a', template: 'base', fork_point: `fp_${id}`, artifact_key: 'k',
    vcpus: 1, memory_mib: 256, disk_mib: 64, egress: 'none', on_timeout: 'delete', auto_resume: 0, public_ports: 0, port_host: null, timeout_secs: 60, bytes: 0, created_at: 1, state: 'ready', environment: null, ...over,
  });
  t.repo.insertSnapshot(snap('snap_b'));
  t.repo.insertSnapshot(snap('snap_a', { source: 'sbx_b', labels: { run: '2' } }));
  t.repo.insertSnapshot(snap('snap_c', { state: 'creating' }));
  t.repo.insertSnapshot(snap('snap_d', { tenant: 'other' }));
  t.repo.addRef('fp_snap_b', 'snap_b');
  assert.deepEqual(t.repo.snapshots('acme', {}).map((s) => s.id), ['snap_a', 'snap_b']);
  assert.deepEqual(t.repo.snapshots('acme', { source: 'sbx_a' }).map((s) => s.id), ['snap_b']);
  assert.deepEqual(t.repo.snapshots('acme', { labels: { run: '2' } }).map((s) => s.id), ['snap_a']);
  assert.deepEqual(t.repo.snapshots('acme', { after: 'snap_a' }).map((s) => s.id), ['snap_b']);
  assert.deepEqual(t.repo.unfinishedSnapshots().map((s) => s.id), ['snap_c']);
  assert.deepEqual(t.repo.snapshot('snap_b')?.labels, { run: '1' });
  t.repo.markSnapshotReady('snap_c', 42);
  assert.equal(t.repo.snapshot('snap_c')?.bytes, 42);
  assert.ok(t.repo.snapshotForkPoints().has('fp_snap_b'));
  // Promoted under a name: one snapshot per name and tenant, another tenant's names apart.
  assert.ok(t.repo.setSnapshotEnvironment('snap_b', 'warm-env'));
  assert.ok(!t.repo.setSnapshotEnvironment('snap_a', 'warm-env'), 'a name one snapshot of the tenant has');
  assert.ok(t.repo.setSnapshotEnvironment('snap_d', 'warm-env'), "another tenant's snapshot may have it");
  assert.deepEqual(t.repo.snapshots('acme', { environment: 'warm-env' }).map((s) => s.id), ['snap_b']);
  assert.deepEqual(t.repo.snapshots('acme', { environment: true }).map((s) => s.id), ['snap_b']);
  assert.ok(t.repo.setSnapshotEnvironment('snap_b', null));
  assert.deepEqual(t.repo.snapshots('acme', { environment: true }), []);
  assert.ok(t.repo.setSnapshotEnvironment('snap_a', 'warm-env'), 'free again');
  t.repo.removeSnapshot('snap_b');
  assert.equal(t.repo.snapshot('snap_b'), undefined);
  assert.deepEqual(t.repo.refsOf('snap_b'), []);
  assert.ok(!t.repo.snapshotForkPoints().has('fp_snap_b'));
});

test('update changes only the given fields; JSON columns can be cleared', () => {
  t.repo.insert(row('sbx_a', { pending_op: { op: 'suspend', startedAt: 1 }, labels: { a: '1' } }));
  t.repo.update('sbx_a', { state: 'suspended', snapshot: { statePath: '/s', bytes: 1, suspendedAt: 2 }, pending_op: null });
  const got = t.repo.get('sbx_a')!;
  assert.equal(got.state, 'suspended');
  assert.deepEqual(got.snapshot, { statePath: '/s', bytes: 1, suspendedAt: 2 });
  assert.equal(got.pending_op, null);
  assert.deepEqual(got.labels, { a: '1' });
  t.repo.update('sbx_a', {});
  assert.equal(t.repo.get('sbx_a')!.state, 'suspended');
});

test('list: deleted rows never show; by state, by tenant, ordered by id', () => {
  t.repo.insert(row('sbx_c'));
  t.repo.insert(row('sbx_a', { state: 'suspended' }));
  t.repo.insert(row('sbx_b', { state: 'deleted' }));
  t.repo.insert(row('sbx_d', { state: 'deleting' }));
  t.repo.insert(row('sbx_e', { tenant: 't2' }));
  assert.deepEqual(ids(t.repo.list({}, 't1')), ['sbx_a', 'sbx_c', 'sbx_d']);
  assert.deepEqual(ids(t.repo.list({})), ['sbx_a', 'sbx_c', 'sbx_d', 'sbx_e']);
  assert.deepEqual(ids(t.repo.list({ state: 'running' }, 't1')), ['sbx_c']);
  assert.deepEqual(ids(t.repo.list({ state: 'suspended' }, 't1')), ['sbx_a']);
  assert.deepEqual(ids(t.repo.list({ state: 'deleted' }, 't1')), []);
  assert.deepEqual(ids(t.repo.live()).sort(), ['sbx_a', 'sbx_c', 'sbx_d', 'sbx_e']);
});

test('list: every label given must match, keys quoted safely', () => {
  t.repo.insert(row('sbx_a', { labels: { team: 'rl', run: '1' } }));
  t.repo.insert(row('sbx_b', { labels: { team: 'rl', run: '2' } }));
  t.repo.insert(row('sbx_c', { labels: { team: 'web' } }));
  t.repo.insert(row('sbx_d', { labels: { 'a"b': 'x', 'c\\': 'y' } }));
  assert.deepEqual(ids(t.repo.list({ labels: { team: 'rl' } })), ['sbx_a', 'sbx_b']);
  assert.deepEqual(ids(t.repo.list({ labels: { team: 'rl', run: '2' } })), ['sbx_b']);
  assert.deepEqual(ids(t.repo.list({ labels: { team: 'nobody' } })), []);
  assert.deepEqual(ids(t.repo.list({ labels: { 'a"b': 'x' } })), ['sbx_d']);
  assert.deepEqual(ids(t.repo.list({ labels: { 'c\\': 'y' } })), ['sbx_d']);
});

test('list: pages of `limit` (one more row tells the caller there is a next page), continued after a cursor', () => {
  for (const id of ['sbx_1', 'sbx_2', 'sbx_3', 'sbx_4', 'sbx_5']) t.repo.insert(row(id));
  assert.deepEqual(ids(t.repo.list({ limit: 2 })), ['sbx_1', 'sbx_2', 'sbx_3']);
  assert.deepEqual(ids(t.repo.list({ limit: 2, after: 'sbx_2' })), ['sbx_3', 'sbx_4', 'sbx_5']);
  assert.deepEqual(ids(t.repo.list({ limit: 2, after: 'sbx_4' })), ['sbx_5']);
  // Out-of-range limits are clamped to 1…1000.
  assert.deepEqual(ids(t.repo.list({ limit: 0 })), ['sbx_1', 'sbx_2']);
  assert.equal(t.repo.list({ limit: 5000 }).length, 5);
});

test('countRunning counts only the tenant\'s running rows', () => {
  t.repo.insert(row('sbx_a'));
  t.repo.insert(row('sbx_b'));
  t.repo.insert(row('sbx_c', { state: 'suspended' }));
  t.repo.insert(row('sbx_d', { state: 'deleting' }));
  t.repo.insert(row('sbx_e', { state: 'deleted' }));
  t.repo.insert(row('sbx_f', { tenant: 't2' }));
  assert.equal(t.repo.countRunning('t1'), 2);
  assert.equal(t.repo.countRunning('t2'), 1);
  assert.equal(t.repo.countRunning('t3'), 0);
});

test('children: live rows whose parent is the id, by id', () => {
  t.repo.insert(row('sbx_p'));
  t.repo.insert(row('sbx_c2', { parent: 'sbx_p', forked_at: 5 }));
  t.repo.insert(row('sbx_c1', { parent: 'sbx_p', forked_at: 5 }));
  t.repo.insert(row('sbx_c3', { parent: 'sbx_p', forked_at: 5, state: 'deleted' }));
  assert.deepEqual(t.repo.children('sbx_p'), ['sbx_c1', 'sbx_c2']);
  assert.deepEqual(t.repo.children('sbx_c1'), []);
});

test('fork points: references keep them; unreferenced ones are listed for removal; removing one drops the references it held', () => {
  t.repo.addForkPoint('fp_1', '/fp/1', '/m/fp_1.mem', '/d/1.qcow2');
  t.repo.addForkPoint('fp_2', '/fp/2', '/m/fp_2.mem', '/d/2.qcow2');
  assert.equal(t.repo.forkPoint('fp_1')!.ready, 0);
  t.repo.markForkPointReady('fp_1');
  assert.equal(t.repo.forkPoint('fp_1')!.ready, 1);
  assert.equal(t.repo.forkPoint('fp_9'), undefined);
  // sbx_a sits on fp_1; fp_2's disk is backed by fp_1's; sbx_b sits on fp_2 (and so on fp_1).
  t.repo.addRef('fp_1', 'sbx_a');
  t.repo.addRef('fp_1', 'fp_2');
  t.repo.addRef('fp_2', 'sbx_b');
  t.repo.addRef('fp_1', 'sbx_b');
  t.repo.addRef('fp_1', 'sbx_b'); // idempotent
  assert.deepEqual(t.repo.refsOf('sbx_b').sort(), ['fp_1', 'fp_2']);
  assert.deepEqual(t.repo.unreferencedForkPoints(), []);
  t.repo.dropRefs('sbx_b');
  assert.deepEqual(t.repo.refsOf('sbx_b'), []);
  assert.deepEqual(t.repo.unreferencedForkPoints().map((f) => f.id), ['fp_2']);
  t.repo.removeForkPoint('fp_2');
  assert.equal(t.repo.forkPoint('fp_2'), undefined);
  // fp_2's own reference on fp_1 went with it; sbx_a still holds fp_1.
  assert.deepEqual(t.repo.unreferencedForkPoints(), []);
  t.repo.dropRefs('sbx_a');
  assert.deepEqual(t.repo.unreferencedForkPoints(), [{ id: 'fp_1', dir: '/fp/1', mem_path: '/m/fp_1.mem', disk_path: '/d/1.qcow2' }]);
  assert.deepEqual(t.repo.allForkPoints().map((f) => f.id), ['fp_1']);
});

test('tx: a throw rolls back every write in it', () => {
  t.repo.insert(row('sbx_a'));
  assert.throws(() => t.repo.tx(() => {
    t.repo.update('sbx_a', { state: 'deleted' });
    t.repo.addRef('fp_1', 'sbx_a');
    throw new Error('boom');
  }), /boom/);
  assert.equal(t.repo.get('sbx_a')!.state, 'running');
  assert.deepEqual(t.repo.refsOf('sbx_a'), []);
});

test('the states nothing writes are refused by a new database', () => {
  for (const state of ['creating', 'suspending', 'resuming', 'bogus']) {
    assert.throws(() => t.repo.insert(row(`sbx_${state}`, { state: state as SandboxRow['state'] })), /CHECK constraint/, state);
  }
});

test('a sandbox that ended other than by a delete keeps why', () => {
  t.repo.insert(row('sbx_a'));
  t.repo.insert(row('sbx_b'));
  t.repo.markDeleted('sbx_a', 10, 'its VM exited unexpectedly');
  t.repo.markDeleted('sbx_b', 11);
  assert.equal(t.repo.get('sbx_a')!.end_reason, 'its VM exited unexpectedly');
  assert.equal(t.repo.get('sbx_a')!.state, 'deleted');
  assert.equal(t.repo.get('sbx_b')!.end_reason, null);
});

test('rows of sandboxes deleted before the retention are pruned; newer ones, live ones and one still holding a fork point stay', () => {
  t.repo.insert(row('sbx_old', { last_active: 5 }));
  t.repo.insert(row('sbx_lost', { last_active: 5 }));
  t.repo.insert(row('sbx_new', { last_active: 5 }));
  t.repo.insert(row('sbx_live', { last_active: 5 }));
  t.repo.insert(row('sbx_held', { last_active: 5 }));
  t.repo.markDeleted('sbx_old', 10);
  t.repo.markDeleted('sbx_lost', undefined, 'its VM exited unexpectedly');
  t.repo.markDeleted('sbx_new', 500);
  t.repo.markDeleted('sbx_held', 10);
  // A ref written after the delete (it cannot be, but the prune must not orphan one).
  t.repo.addForkPoint('fp_x', '/f', '/m', '/d');
  t.repo.addRef('fp_x', 'sbx_held');
  assert.equal(t.repo.pruneDeleted(100), 2);
  for (const gone of ['sbx_old', 'sbx_lost']) assert.equal(t.repo.get(gone), undefined, gone);
  for (const kept of ['sbx_new', 'sbx_live', 'sbx_held']) assert.ok(t.repo.get(kept), kept);
  assert.equal(t.repo.pruneDeleted(100), 0);
});
