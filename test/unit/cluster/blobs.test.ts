/**
 * Blobs between cluster hosts: each "host" here is a real HTTP server (Fastify, the blob routes of
 * src/api/blobRoutes.ts) over a real layer store and artifact directory of its own, registered in a
 * real PostgreSQL; the fetcher (src/cluster/blobFetcher.ts) pulls over loopback HTTP. Covered: HEAD,
 * GET, Range (206, suffix, 416), refusal without the peer secret, bad and unknown digests, the
 * sparse representation of a RAM file (data only on the wire, holes kept at the receiver), where
 * blobs live (published, dropped when collected), and the fetcher rejecting a peer that serves
 * other bytes or cannot be reached, then using another, with no temporary file left.
 */
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, ftruncateSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync, writeSync } from 'node:fs';
import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import Fastify, { type FastifyInstance } from 'fastify';
import type pg from 'pg';
import { registerBlobRoutes } from '../../../src/api/blobRoutes.js';
import { BlobFetcher } from '../../../src/cluster/blobFetcher.js';
import { BlobLocations, BlobPublisher } from '../../../src/cluster/blobLocations.js';
import { migrateCluster, openClusterDb } from '../../../src/cluster/db.js';
import { HostMembership } from '../../../src/cluster/hosts.js';
import { CollimateError } from '../../../src/errors.js';
import { LocalBlobs } from '../../../src/images/localBlobs.js';
import { writeArtifactManifest } from '../../../src/images/artifactManifest.js';
import { LayerStore } from '../../../src/images/layerStore.js';
import { BLOB_SIZE_HEADER, SPARSE_MEDIA_TYPE } from '../../../src/images/sparseBlob.js';
import { homePaths } from '../../../src/host/paths.js';
import { freePort } from '../../support/registry.js';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../../support/postgres.js';

const skip = postgresUnavailable() ?? false;
const SECRET = 'peer-secret-of-this-test';
const PEER = 'x-collimate-peer';
const COMPAT = { qemuVersion: '7.2.0', machine: 'microvm', cpuModel: 'max', accel: 'tcg' };
const LONG = { heartbeatMs: 1000, leaseMs: 600_000, deadAfterMs: 1_200_000 };
const MiB = 1 << 20;

const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

interface Host {
  id: string;
  address: string;
  cache: string;
  store: LayerStore;
  blobs: LocalBlobs;
  app: FastifyInstance;
}

let server: ThrowawayPostgres;
let pool: pg.Pool;
let root: string;
const hosts: Host[] = [];

async function startHost(id: string): Promise<Host> {
  const cache = join(root, id);
  const store = new LayerStore(cache);
  const blobs = new LocalBlobs({ layers: store, artifacts: { dir: homePaths(cache).artifacts, ramDir: cache } });
  const app = Fastify();
  registerBlobRoutes(app, { blobs, isPeer: (h) => h === SECRET, peerHeader: PEER });
  const address = await app.listen({ host: '127.0.0.1', port: 0 });
  await new HostMembership(pool, { id, address, capacity: 4, compat: COMPAT }, () => ({ templates: [], warmPools: {} }), LONG).register();
  const h = { id, address, cache, store, blobs, app };
  hosts.push(h);
  return h;
}

/** Puts a layer into a host's store as a pull would leave it; `claim` records another digest for its bytes (a corrupt host). */
function putLayer(h: Host, bytes: Buffer, claim?: string): { diffId: string; digest: string } {
  const diffId = sha(Buffer.concat([Buffer.from('diff:'), bytes]));
  const hex = diffId.slice(7);
  mkdirSync(h.store.dir, { recursive: true });
  writeFileSync(join(h.store.dir, `${hex}.erofs`), bytes);
  writeFileSync(join(h.store.dir, `${hex}.json`), JSON.stringify({ diffId, size: bytes.length, unpackedBytes: bytes.length, facts: {}, erofsDigest: claim ?? sha(bytes) }));
  return { diffId, digest: claim ?? sha(bytes) };
}

/** A built artifact whose RAM file is `memSize` bytes of holes but for `dataPages` pages of data. */
function putArtifact(h: Host, key: string, memSize: number, dataPages: number[]): { mem: string; memBytes: Buffer } {
  const build = join(homePaths(h.cache).artifacts, key, 'b1');
  mkdirSync(build, { recursive: true });
  const mem = join(h.cache, `artifact-${key.slice(0, 24)}-b1.mem`);
  writeFileSync(mem, '');
  const memBytes = Buffer.alloc(memSize);
  const fd = openSync(mem, 'r+');
  ftruncateSync(fd, memSize);
  for (const p of dataPages) {
    const page = randomBytes(4096);
    page.copy(memBytes, p * 4096);
    writeSync(fd, page, 0, 4096, p * 4096);
  }
  closeSync(fd);
  writeFileSync(join(build, 'device.state'), randomBytes(5000));
  writeFileSync(join(build, 'disk.raw'), Buffer.alloc(64 * 1024));
  const shape = { vcpus: 1, memoryMib: memSize / 2 ** 20, kernel: join(h.cache, 'vmlinuz'), initrd: join(h.cache, 'initrd'), cmdline: '', layers: [] };
  writeArtifactManifest({ key, dir: build, shape, diskMib: 1, memPath: mem, devStatePath: join(build, 'device.state'), diskPath: join(build, 'disk.raw'), uptimeAtCheckpointMs: 0, bakedAt: '' });
  return { mem, memBytes };
}

function get(h: Host, path: string, headers: Record<string, string> = {}, method = 'GET'): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = request(`${h.address}${path}`, { method, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

const peer = { [PEER]: SECRET };
const fetcherFor = (self: string) => new BlobFetcher(new BlobLocations(pool), { hostId: self, secret: () => SECRET, peerHeader: PEER });
const partFiles = (dir: string) => readdirSync(dir).filter((f) => f.includes('.part-'));

describe('blobs between cluster hosts', { skip }, () => {
  let a: Host, b: Host, c: Host;
  let layer: { diffId: string; digest: string; bytes: Buffer };

  before(async () => {
    server = await startPostgres();
    pool = openClusterDb({ url: server.createDatabase('blobs'), max: 10 });
    await migrateCluster(pool);
    root = mkdtempSync(join(tmpdir(), 'collimate-blobs-'));
    a = await startHost('host_a');
    b = await startHost('host_b');
    c = await startHost('host_c');
    const bytes = randomBytes(300 * 1024);
    layer = { ...putLayer(a, bytes), bytes };
  });

  after(async () => {
    for (const h of hosts) await h.app.close();
    await pool?.end();
    await server?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  test('HEAD and GET serve a layer by the digest of its bytes', async () => {
    const head = await get(a, `/cluster/blobs/${layer.digest}`, peer, 'HEAD');
    assert.equal(head.status, 200);
    assert.equal(head.headers['content-length'], String(layer.bytes.length));
    assert.equal(head.headers['docker-content-digest'], layer.digest);
    assert.equal(head.headers['accept-ranges'], 'bytes');
    assert.equal(head.body.length, 0);
    const full = await get(a, `/cluster/blobs/${layer.digest}`, peer);
    assert.equal(full.status, 200);
    assert.ok(full.body.equals(layer.bytes));
  });

  test('Range: a span, an open end and a suffix answer 206; past the end answers 416', async () => {
    const size = layer.bytes.length;
    const span = await get(a, `/cluster/blobs/${layer.digest}`, { ...peer, range: 'bytes=100-1123' });
    assert.equal(span.status, 206);
    assert.equal(span.headers['content-range'], `bytes 100-1123/${size}`);
    assert.ok(span.body.equals(layer.bytes.subarray(100, 1124)));
    const open = await get(a, `/cluster/blobs/${layer.digest}`, { ...peer, range: `bytes=${size - 10}-` });
    assert.equal(open.status, 206);
    assert.ok(open.body.equals(layer.bytes.subarray(size - 10)));
    const suffix = await get(a, `/cluster/blobs/${layer.digest}`, { ...peer, range: 'bytes=-7' });
    assert.equal(suffix.status, 206);
    assert.equal(suffix.headers['content-range'], `bytes ${size - 7}-${size - 1}/${size}`);
    assert.ok(suffix.body.equals(layer.bytes.subarray(size - 7)));
    const headRange = await get(a, `/cluster/blobs/${layer.digest}`, { ...peer, range: 'bytes=0-9' }, 'HEAD');
    assert.equal(headRange.status, 206);
    assert.equal(headRange.headers['content-length'], '10');
    const past = await get(a, `/cluster/blobs/${layer.digest}`, { ...peer, range: `bytes=${size}-` });
    assert.equal(past.status, 416);
    assert.equal(past.headers['content-range'], `bytes */${size}`);
    assert.equal(JSON.parse(past.body.toString()).error.code, 'range_not_satisfiable');
    // A Range this API does not take (several ranges) is ignored: the whole blob.
    const multi = await get(a, `/cluster/blobs/${layer.digest}`, { ...peer, range: 'bytes=0-1,5-6' });
    assert.equal(multi.status, 200);
    assert.equal(multi.body.length, size);
  });

  test('without the peer secret nothing is served: no header, a wrong one, a tenant key', async () => {
    const refused: Array<Record<string, string>> = [{}, { [PEER]: 'not-the-secret' }, { authorization: 'Bearer ck_live_0123456789abcdef' }];
    for (const headers of refused) {
      for (const method of ['GET', 'HEAD']) {
        const r = await get(a, `/cluster/blobs/${layer.digest}`, headers, method);
        assert.equal(r.status, 401, `${method} with ${JSON.stringify(headers)}`);
        if (method === 'GET') {
          assert.equal(JSON.parse(r.body.toString()).error.code, 'unauthorized');
          assert.ok(!r.body.includes(layer.bytes.subarray(0, 32)));
        }
      }
    }
  });

  test('a malformed digest is 400 validation_error, an unknown one 404 not_found', async () => {
    const bad = await get(a, '/cluster/blobs/sha256:XYZ', peer);
    assert.equal(bad.status, 400);
    assert.equal(JSON.parse(bad.body.toString()).error.code, 'validation_error');
    const unknown = await get(a, `/cluster/blobs/sha256:${'0'.repeat(64)}`, peer);
    assert.equal(unknown.status, 404);
    assert.equal(JSON.parse(unknown.body.toString()).error.code, 'not_found');
  });

  test('where blobs live: published with their kind, dropped once the host no longer holds them', async () => {
    const locations = new BlobLocations(pool);
    const extra = putLayer(a, randomBytes(4096));
    await locations.publish(a.id, await a.blobs.scan());
    assert.deepEqual((await locations.holders(extra.digest)).map((h) => h.hostId), [a.id]);
    assert.deepEqual((await locations.holders(extra.digest, a.id)).map((h) => h.hostId), []);
    const row = (await pool.query(`SELECT kind, size FROM blob_locations WHERE digest = $1`, [extra.digest])).rows[0];
    assert.deepEqual(row, { kind: 'layer', size: '4096' });
    // Collected (as layerGc.ts removes a layer): the next publication drops its row, keeps the others.
    rmSync(join(a.store.dir, `${extra.diffId.slice(7)}.erofs`));
    rmSync(join(a.store.dir, `${extra.diffId.slice(7)}.json`));
    assert.deepEqual(await locations.publish(a.id, await a.blobs.scan()), { added: 0, dropped: 1 });
    assert.deepEqual(await locations.holders(extra.digest), []);
    assert.deepEqual((await locations.holders(layer.digest)).map((h) => h.hostId), [a.id]);
  });

  test('a RAM file travels as its data runs only, and arrives sparse with its digest verified', async () => {
    const { memBytes } = putArtifact(a, 'f'.repeat(64), 32 * MiB, [0, 1, 2, 1000, 8191]);
    const published = await a.blobs.scan();
    await new BlobLocations(pool).publish(a.id, published);
    const mem = published.find((p) => p.kind === 'artifact-mem')!;
    assert.equal(mem.digest, sha(memBytes));
    assert.deepEqual(published.filter((p) => p.of === 'f'.repeat(64)).map((p) => p.kind).sort(), ['artifact-disk', 'artifact-mem', 'artifact-state']);
    const sparse = await get(a, `/cluster/blobs/${mem.digest}`, { ...peer, accept: SPARSE_MEDIA_TYPE });
    assert.equal(sparse.status, 200);
    assert.equal(sparse.headers['content-type'], SPARSE_MEDIA_TYPE);
    assert.equal(sparse.headers[BLOB_SIZE_HEADER], String(32 * MiB));
    // Three runs (pages 0-2, 1000, 8191) with their 12-byte heads.
    assert.equal(sparse.body.length, 5 * 4096 + 3 * 12);
    // Without asking for it, the plain bytes (a Range too).
    const plain = await get(a, `/cluster/blobs/${mem.digest}`, { ...peer, range: 'bytes=4096000-4100095' });
    assert.ok(plain.body.equals(memBytes.subarray(4096000, 4100096)));

    const dest = join(c.cache, 'pulled.mem');
    mkdirSync(c.cache, { recursive: true });
    const got = await fetcherFor(c.id).fetch(mem.digest, dest, { sparse: true });
    assert.equal(got.hostId, a.id);
    assert.equal(got.size, 32 * MiB);
    assert.equal(got.transferred, 5 * 4096 + 3 * 12);
    assert.ok(readFileSync(dest).equals(memBytes));
    assert.ok(statSync(dest).blocks * 512 <= 64 * 4096, `the copy keeps its holes (${statSync(dest).blocks * 512} bytes allocated)`);
    assert.deepEqual(partFiles(c.cache), []);
  });

  test('the fetcher rejects a peer that serves other bytes, or cannot be reached, and uses another', async () => {
    const locations = new BlobLocations(pool);
    mkdirSync(c.cache, { recursive: true });
    // b claims the layer's digest for other bytes (a corrupt store).
    putLayer(b, randomBytes(layer.bytes.length), layer.digest);
    await locations.publish(b.id, await b.blobs.scan());
    await pool.query(`DELETE FROM blob_locations WHERE host_id = $1`, [a.id]);
    const dest = join(c.cache, 'layer.erofs');
    // Only the corrupt host holds it: refused, nothing written.
    await assert.rejects(fetcherFor(c.id).fetch(layer.digest, dest), (e: unknown) => {
      assert.ok(e instanceof CollimateError && e.code === 'image_pull_failed', String(e));
      assert.match((e as Error).message, new RegExp(`${b.id}: it served bytes whose sha256 is sha256:`));
      return true;
    });
    assert.deepEqual(readdirSync(c.cache).filter((f) => f.startsWith('layer.erofs')), []);

    // A host that holds it but cannot be reached, the corrupt one and the good one.
    const gone = await freePort();
    await pool.query(`INSERT INTO hosts (id, address, capacity, qemu_version, machine, cpu_model, accel, compat, state, epoch, heartbeat_at, lease_until, registered_at)
      SELECT 'host_gone', $1, capacity, qemu_version, machine, cpu_model, accel, compat, 'alive', 1, now(), now(), now() FROM hosts WHERE id = $2`, [`http://127.0.0.1:${gone}`, a.id]);
    await locations.publish('host_gone', [{ digest: layer.digest, kind: 'layer', path: '', size: layer.bytes.length, sparse: false, of: layer.diffId }]);
    await locations.publish(a.id, await a.blobs.scan());
    const failed = new Set<string>();
    for (let i = 0; i < 20; i++) {
      rmSync(dest, { force: true });
      const got = await fetcherFor(c.id).fetch(layer.digest, dest);
      assert.equal(got.hostId, a.id);
      assert.equal(got.transferred, layer.bytes.length);
      assert.ok(readFileSync(dest).equals(layer.bytes));
      for (const f of got.failures) {
        failed.add(f.hostId);
        if (f.hostId === b.id) assert.match(f.reason, /served bytes whose sha256 is/);
        if (f.hostId === 'host_gone') assert.match(f.reason, /could not be reached/);
      }
      assert.deepEqual(partFiles(c.cache), []);
    }
    // Holders are tried in random order: over 20 pulls both bad hosts came before the good one.
    assert.deepEqual([...failed].sort(), [b.id, 'host_gone']);
    // A dead host is never asked.
    await pool.query(`UPDATE hosts SET state = 'dead' WHERE id IN ($1, 'host_gone')`, [b.id]);
    assert.deepEqual((await locations.holders(layer.digest, c.id)).map((h) => h.hostId), [a.id]);
  });

  test('a peer that sends a malformed sparse body or cuts a body off is rejected, and nothing is left behind', async () => {
    const locations = new BlobLocations(pool);
    const { memBytes } = putArtifact(a, 'e'.repeat(64), 4 * MiB, [3, 4, 700]);
    const mem = (await a.blobs.scan()).find((x) => x.of === 'e'.repeat(64) && x.kind === 'artifact-mem')!;
    // A hostile host: its answer for the digest depends on what the test sets.
    let answer: 'frames-past-end' | 'frames-backwards' | 'cut-sparse' | 'cut-plain' = 'frames-past-end';
    const evil = createServer((req, res) => {
      const frame = (at: number, len: number) => Buffer.concat([Buffer.from([0, 0, 0, 0, (at >>> 24) & 255, (at >>> 16) & 255, (at >>> 8) & 255, at & 255, (len >>> 24) & 255, (len >>> 16) & 255, (len >>> 8) & 255, len & 255]), Buffer.alloc(len, 7)]);
      const sparse = { 'content-type': SPARSE_MEDIA_TYPE, [BLOB_SIZE_HEADER]: String(mem.size) };
      if (answer === 'frames-past-end') { res.writeHead(200, sparse); res.end(frame(mem.size - 100, 4096)); }
      else if (answer === 'frames-backwards') { res.writeHead(200, sparse); res.end(Buffer.concat([frame(8192, 4096), frame(0, 4096)])); }
      else if (answer === 'cut-sparse') { res.writeHead(200, sparse); res.end(frame(0, 4096).subarray(0, 2000)); }
      else { res.writeHead(200, { 'content-type': 'application/octet-stream', [BLOB_SIZE_HEADER]: String(mem.size), 'content-length': String(mem.size) }); res.write(Buffer.alloc(1000)); setTimeout(() => res.destroy(), 20); }
    });
    await new Promise<void>((r) => evil.listen(0, '127.0.0.1', r));
    try {
      const evilUrl = `http://127.0.0.1:${(evil.address() as AddressInfo).port}`;
      await pool.query(`INSERT INTO hosts (id, address, capacity, qemu_version, machine, cpu_model, accel, compat, state, epoch, heartbeat_at, lease_until, registered_at)
        SELECT 'host_evil', $1, capacity, qemu_version, machine, cpu_model, accel, compat, 'alive', 1, now(), now(), now() FROM hosts WHERE id = $2`, [evilUrl, a.id]);
      await locations.publish('host_evil', [mem]);
      await pool.query(`DELETE FROM blob_locations WHERE host_id = $1`, [a.id]);
      const dest = join(c.cache, 'evil.mem');
      for (const [kind, reason] of [['frames-past-end', /does not fit/], ['frames-backwards', /does not fit/], ['cut-sparse', /ended inside a frame/], ['cut-plain', /cut the body off|bytes of a|aborted/]] as const) {
        answer = kind;
        await assert.rejects(fetcherFor(c.id).fetch(mem.digest, dest, { sparse: kind !== 'cut-plain' }), (e: unknown) => {
          assert.ok(e instanceof CollimateError && e.code === 'image_pull_failed', `${kind}: ${String(e)}`);
          assert.match((e as Error).message, reason, kind);
          return true;
        });
        assert.deepEqual(readdirSync(c.cache).filter((f) => f.startsWith('evil.mem')), [], `${kind}: nothing left behind`);
      }
      // With a good holder beside it, the pull succeeds (whichever is asked first).
      await locations.publish(a.id, await a.blobs.scan());
      const got = await fetcherFor(c.id).fetch(mem.digest, dest, { sparse: true });
      assert.equal(got.hostId, a.id);
      assert.ok(readFileSync(dest).equals(memBytes));
      assert.deepEqual(partFiles(c.cache), []);
    } finally {
      await pool.query(`UPDATE hosts SET state = 'dead' WHERE id = 'host_evil'`);
      await new Promise((r) => evil.close(r));
    }
  });

  test('a publisher stopped during its first scan publishes nothing and never ticks again', async () => {
    let scans = 0;
    const digest = `sha256:${'2'.repeat(64)}`;
    const slow = { scan: async () => { scans++; await new Promise((r) => setTimeout(r, 200)); return [{ digest, kind: 'layer', path: '/x', size: 1, sparse: false, of: digest }]; } } as unknown as LocalBlobs;
    const publisher = new BlobPublisher(new BlobLocations(pool), a.id, slow, () => {}, 50);
    const started = publisher.start();
    publisher.stop();
    await started;
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(scans, 1);
    assert.deepEqual((await pool.query(`SELECT 1 FROM blob_locations WHERE digest = $1`, [digest])).rows, []);
  });

  test('no holder: image_pull_failed saying so', async () => {
    await assert.rejects(fetcherFor(c.id).fetch(`sha256:${'1'.repeat(64)}`, join(c.cache, 'x')), /no alive host holds it/);
    await assert.rejects(fetcherFor(c.id).fetch('sha256:nope', join(c.cache, 'x')), (e: unknown) => e instanceof CollimateError && e.code === 'validation_error');
  });
});
