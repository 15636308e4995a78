/**
 * The cluster's side of snapshots across hosts (src/cluster/snapshotPull.ts) with a fake engine and
 * fake peers: a pull asks the origin for the manifest and fetches each file from the origin first,
 * then from hosts whose copies hold the same bytes; nothing moves for a snapshot held here; a delete
 * asks every peer to drop its copy; the sweep drops exactly the copies whose alive origin no longer
 * has the snapshot. The pull itself on real VMs is in test/integration/cluster.test.ts.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CollimateError, snapshotNotFound } from '../../../src/errors.js';
import type { BlobHolder } from '../../../src/cluster/blobLocations.js';
import { SnapshotPuller } from '../../../src/cluster/snapshotPull.js';
import type { SnapshotCopyEngine, SnapshotFile, SnapshotManifest } from '../../../src/sandboxes/snapshotCopies.js';

const file = (name: SnapshotFile['name'], n: number): SnapshotFile => ({ name, digest: `sha256:${String(n).repeat(64)}`, size: 1000 * n, sparse: name !== 'device.state' });
const manifest = (id: string): SnapshotManifest => ({
  snapshot: {
    id, tenant: 'acme', name: null, labels: {}, source: 'sbx_1', template: 'base', artifact_key: 'a1', vcpus: 1, memory_mib: 256, disk_mib: 0,
    egress: 'none' as never, on_timeout: null, auto_resume: 0, public_ports: 0, port_host: null, timeout_secs: 300, bytes: 0, created_at: 0,
  },
  files: [file('device.state', 1), file('ram.img', 2), file('disk.qcow2', 3)],
});

function setup() {
  const held = new Map<string, string | null>([['snap_own', null], ['snap_kept', 'h1'], ['snap_gone', 'h1'], ['snap_away', 'h9']]);
  const calls: string[] = [];
  const fetched: Array<{ digest: string; from: string[] }> = [];
  const engine: SnapshotCopyEngine = {
    exportOut: async () => { throw new Error('not the origin'); },
    async importIn(m, origin, pull) {
      for (const f of m.files) await pull(f, `/tmp/x/${f.name}`);
      held.set(m.snapshot.id, origin);
      return true;
    },
    holds: (id) => held.has(id),
    drop: (id) => held.get(id) ? held.delete(id) : false,
    copies: () => [...held].filter(([, o]) => o).map(([id, origin]) => ({ id, tenant: 'acme', origin: origin! })),
    blobs: () => [],
  };
  const peer = (hostId: string) => ({
    async call(op: string, args: unknown[]) {
      calls.push(`${hostId} ${op} ${JSON.stringify(args)}`);
      if (op === 'exportSnapshot') return manifest(args[1] as string);
      if (op === 'getSnapshot' && args[0] === 'snap_gone') throw snapshotNotFound('snap_gone');
      if (op === 'getSnapshot' && hostId === 'h1') return {};
      if (op === 'dropSnapshotCopy' && hostId === 'h3') throw new CollimateError('host_at_capacity', 'not answering');
      return true;
    },
  });
  const locations = { holders: async (digest: string): Promise<BlobHolder[]> => (digest === file('ram.img', 2).digest ? [{ hostId: 'h2', address: 'http://h2', size: 2000 }, { hostId: 'h1', address: 'http://h1', size: 2000 }] : []) };
  const fetcher = {
    async fetchFrom(holders: BlobHolder[], digest: string) {
      fetched.push({ digest, from: holders.map((h) => h.hostId) });
      return { digest, hostId: holders[0].hostId, size: 0, transferred: 10, failures: [] };
    },
  };
  const published: number[] = [];
  const puller = new SnapshotPuller(peer as never, 'h0', engine, fetcher, locations, async () => [{ id: 'h1', address: 'http://h1' }, { id: 'h2', address: 'http://h2' }, { id: 'h3', address: 'http://h3' }],
    () => {}, () => published.push(1));
  return { held, calls, fetched, puller, published };
}

test('a pull asks the origin for the manifest, fetches each file from the origin first and then from other holders of its bytes, and says what moved', async () => {
  const t = setup();
  const r = await t.puller.ensure({ tenant: 'acme', id: 'snap_new', origin: { hostId: 'h1', address: 'http://h1' } });
  assert.ok(r);
  assert.deepEqual([r.snapshot, r.bytes, r.transferred], ['snap_new', 6000, 30]);
  assert.ok(r.exportMs + r.fetchMs <= r.ms, 'the parts are within the whole');
  assert.deepEqual(t.calls, ['h1 exportSnapshot ["acme","snap_new"]']);
  assert.deepEqual(t.fetched.map((f) => f.from), [['h1'], ['h1', 'h2'], ['h1']], 'the origin first, then another holder of the same bytes, never twice');
  assert.equal(t.held.get('snap_new'), 'h1');
  assert.equal(t.published.length, 1, 'the host publishes what it holds now');
  assert.deepEqual(t.puller.pulls.map((p) => p.snapshot), ['snap_new']);
});

test('nothing moves for a snapshot this host holds, its own or a copy', async () => {
  const t = setup();
  for (const id of ['snap_own', 'snap_kept']) assert.equal(await t.puller.ensure({ tenant: 'acme', id, origin: { hostId: 'h1', address: 'http://h1' } }), null);
  assert.deepEqual(t.calls, []);
  assert.deepEqual(t.fetched, []);
});

test('a delete drops the copy here and asks every peer to drop theirs, one that does not answer left to its sweep', async () => {
  const t = setup();
  await t.puller.dropEverywhere('snap_kept');
  assert.equal(t.held.has('snap_kept'), false);
  assert.deepEqual(t.calls.map((c) => c.split(' ').slice(0, 2).join(' ')), ['h1 dropSnapshotCopy', 'h2 dropSnapshotCopy', 'h3 dropSnapshotCopy']);
});

test('the sweep drops exactly the copies whose alive origin no longer has the snapshot; an own snapshot and a copy whose origin is away stay', async () => {
  const t = setup();
  await t.puller.reconcile();
  assert.deepEqual([...t.held.keys()].sort(), ['snap_away', 'snap_kept', 'snap_own']);
  assert.ok(!t.calls.some((c) => c.startsWith('h9')), 'an origin that is not alive is not asked');
  assert.equal(t.published.length, 1);
});
