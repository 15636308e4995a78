/**
 * An artifact's key and manifest do not depend on where a host keeps its files: two hosts with
 * the same contents in differently named caches and layer stores compute one key, and a copy of a
 * build directory (its RAM file in the other host's RAM directory) loads there with that host's
 * paths, without a bake. Other layer bytes give another key.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { artifactKey, bakeKey, ensureArtifact, type ShapeDigests } from '../../../src/images/bake.js';
import type { Artifact } from '../../../src/images/artifactManifest.js';
import { readArtifactManifest, writeArtifactManifest } from '../../../src/images/artifactManifest.js';
import { LayerStore } from '../../../src/images/layerStore.js';
import { builtFileSha256 } from '../../../src/host/hash.js';
import type { MachineShape } from '../../../src/vmm/machine.js';

const base = mkdtempSync(join(tmpdir(), 'artifact-key-'));
after(() => rmSync(base, { recursive: true, force: true }));

const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
const KERNEL = Buffer.from('kernel bytes');
const INITRD = Buffer.from('initramfs bytes');
const LAYERS = [Buffer.from('erofs layer one'), Buffer.from('erofs layer two')];

/** A host's cache (and a layer store elsewhere, as a test home's is) holding `layers`; its shape and digests as bakeRecipe makes them. */
async function host(name: string, layers: Buffer[]): Promise<{ cache: string; ramDir: string; shape: MachineShape; digests: ShapeDigests }> {
  const cache = join(base, name, 'cache');
  const ramDir = join(base, name, 'ram');
  mkdirSync(join(cache, 'assets'), { recursive: true });
  mkdirSync(ramDir, { recursive: true });
  writeFileSync(join(cache, 'assets', 'vmlinuz'), KERNEL);
  writeFileSync(join(cache, 'assets', 'initramfs.cpio'), INITRD);
  const store = new LayerStore(join(cache, 'store'));
  mkdirSync(store.dir, { recursive: true });
  const diffIds = layers.map((bytes, i) => {
    const diffId = sha(Buffer.from(`diff ${i}`)); // the same tar on both hosts; only the built bytes may differ
    const hex = diffId.slice(7);
    writeFileSync(join(store.dir, `${hex}.erofs`), bytes);
    writeFileSync(join(store.dir, `${hex}.json`), JSON.stringify({ diffId, size: bytes.length, unpackedBytes: bytes.length, facts: {} }));
    return diffId;
  });
  const shape: MachineShape = {
    vcpus: 1, memoryMib: 256, kernel: join(cache, 'assets', 'vmlinuz'), initrd: join(cache, 'assets', 'initramfs.cpio'),
    cmdline: 'console=hvc0', layers: diffIds.map((d) => store.get(d)!.path), nic: true,
  };
  const digests = { kernel: sha(KERNEL), initrd: sha(INITRD), layers: await Promise.all(diffIds.map((d) => store.erofsDigestOf(d))) };
  return { cache, ramDir, shape, digests };
}

const READY = { command: 'pip install -r /app/requirements.txt', env: { A: '1' } };

test('the key is the same for the same contents in other directories, and differs for other layer bytes or configuration', async () => {
  const a = await host('a', LAYERS);
  const b = await host('b', LAYERS);
  assert.notEqual(a.shape.layers[0], b.shape.layers[0], 'the hosts keep their layers in different places');
  const keyA = bakeKey(a.shape, 2048, a.digests, READY, 'allow');
  assert.equal(bakeKey(b.shape, 2048, b.digests, READY, 'allow'), keyA, 'one key on both hosts');

  const c = await host('c', [LAYERS[0], Buffer.from('erofs layer twO')]);
  assert.notEqual(bakeKey(c.shape, 2048, c.digests, READY, 'allow'), keyA, 'one byte of a layer differs: another key');
  assert.notEqual(bakeKey(b.shape, 2048, { ...b.digests, layers: [...b.digests.layers].reverse() }, READY, 'allow'), keyA, 'layers in another order');
  assert.notEqual(bakeKey({ ...b.shape, memoryMib: 512 }, 2048, b.digests, READY, 'allow'), keyA, 'another memory size');
  assert.notEqual(bakeKey({ ...b.shape, cmdline: 'console=ttyS0' }, 2048, b.digests, READY, 'allow'), keyA, 'another kernel command line');
  assert.notEqual(bakeKey(b.shape, 4096, b.digests, READY, 'allow'), keyA, 'another disk size');
  assert.notEqual(bakeKey(b.shape, 2048, b.digests, { ...READY, command: 'true' }, 'allow'), keyA, 'other ready steps');
  assert.notEqual(bakeKey(b.shape, 2048, b.digests, READY, 'none'), keyA, 'another egress policy for the ready steps');
  assert.notEqual(bakeKey(b.shape, 2048, { ...b.digests, kernel: sha(Buffer.from('other kernel')) }, READY, 'allow'), keyA, 'another kernel');
  assert.throws(() => artifactKey(a.shape, 2048, { ...a.digests, layers: a.digests.layers.slice(1) }), /2 layers but 1 layer digests/,
    'a layer without a digest is refused, never hashed by its path');
});

test('a copy of a build directory loads on a host with other directories, found by ensureArtifact without a bake', async () => {
  const a = await host('copy-a', LAYERS);
  const b = await host('copy-b', LAYERS);
  const key = bakeKey(a.shape, 64, a.digests);
  const build = join(a.cache, 'artifacts', key.slice(0, 24), 'b1');
  mkdirSync(build, { recursive: true });
  const memName = `artifact-${key.slice(0, 24)}-b1.mem`;
  writeFileSync(join(a.ramDir, memName), Buffer.alloc(8192, 7));
  writeFileSync(join(build, 'device.state'), 'device state');
  writeFileSync(join(build, 'disk.raw'), Buffer.alloc(4096, 1));
  const baked: Artifact = {
    key, dir: build, shape: a.shape, diskMib: 64, memPath: join(a.ramDir, memName), devStatePath: join(build, 'device.state'),
    diskPath: join(build, 'disk.raw'), uptimeAtCheckpointMs: 1234, bakedAt: '2026-12-04T00:00:00.000Z',
  };
  writeArtifactManifest(baked);
  assert.deepEqual(readArtifactManifest(build, a.ramDir), baked, 'read back on its own host: the same artifact');
  assert.ok(!readFileSync(join(build, 'artifact.json'), 'utf8').includes(a.cache), 'the manifest names no directory of its host');

  // The other host: the build directory copied into its cache, the RAM file into its RAM dir.
  const copy = join(b.cache, 'artifacts', key.slice(0, 24), 'b1');
  cpSync(build, copy, { recursive: true });
  cpSync(join(a.ramDir, memName), join(b.ramDir, memName));
  rmSync(join(base, 'copy-a'), { recursive: true, force: true }); // nothing of the first host is left to lean on
  const loaded = readArtifactManifest(copy, b.ramDir);
  assert.equal(loaded.memPath, join(b.ramDir, memName));
  assert.equal(loaded.devStatePath, join(copy, 'device.state'));
  assert.equal(loaded.diskPath, join(copy, 'disk.raw'));
  assert.equal(loaded.dir, copy);
  assert.equal(loaded.shape.kernel, join(b.cache, 'assets', 'vmlinuz'), 'a cache of the usual layout: its own kernel');
  assert.equal(loaded.uptimeAtCheckpointMs, 1234);

  // Found under the key this host computes; a bake would fail here (no QEMU binary of that name).
  const found = await ensureArtifact(
    { home: b.cache, ramDir: b.ramDir, qemuBinary: '/nonexistent/qemu', accel: 'tcg', seccomp: false }, b.shape, 64, b.digests,
  );
  assert.equal(found.key, key);
  assert.equal(found.memPath, join(b.ramDir, memName));
  assert.equal(found.diskPath, join(copy, 'disk.raw'));
  assert.deepEqual(found.shape, b.shape, 'with this host\'s shape');
  assert.ok(existsSync(join(b.cache, 'artifacts', key.slice(0, 24), 'users')), 'claimed, as a baked one is');

  // A copy put under another key's directory is not taken for that key's artifact: a bake starts (and is stopped at its first step).
  const bigger = { ...b.shape, memoryMib: 512 };
  cpSync(copy, join(b.cache, 'artifacts', bakeKey(bigger, 64, b.digests).slice(0, 24), 'b1'), { recursive: true });
  const stopBake = (m: string) => { throw new Error(m); };
  await assert.rejects(
    ensureArtifact({ home: b.cache, ramDir: b.ramDir, qemuBinary: '/nonexistent/qemu', accel: 'tcg', seccomp: false, progress: stopBake }, bigger, 64, b.digests),
    /baking artifact/,
  );
});

test('a manifest written before the portable format (absolute paths) is still read as it was', () => {
  const dir = join(base, 'legacy');
  mkdirSync(dir, { recursive: true });
  const old = {
    key: 'k'.repeat(64), dir, diskMib: 64, memPath: '/dev/shm/collimate-x/artifact-k-b1.mem', devStatePath: join(dir, 'device.state'),
    diskPath: join(dir, 'disk.raw'), uptimeAtCheckpointMs: 5, bakedAt: 'then',
    shape: { vcpus: 1, memoryMib: 256, kernel: '/old/cache/vmlinuz', initrd: '/old/cache/initrd', cmdline: '', layers: ['/old/cache/l.erofs'] },
  };
  writeFileSync(join(dir, 'artifact.json'), JSON.stringify(old));
  assert.deepEqual(readArtifactManifest(dir, '/elsewhere'), old);
  writeFileSync(join(dir, 'artifact.json'), JSON.stringify({ ...old, format: 9 }));
  assert.throws(() => readArtifactManifest(dir, '/elsewhere'), /not an artifact manifest this version reads/);
});

test('a catalog layer is keyed by its bytes, hashed once and recorded beside it', async () => {
  const dir = join(base, 'catalog-layer');
  mkdirSync(dir, { recursive: true });
  const layer = join(dir, 'layer.erofs');
  writeFileSync(layer, LAYERS[0]);
  assert.equal(`sha256:${await builtFileSha256(layer)}`, sha(LAYERS[0]));
  assert.equal(readFileSync(`${layer}.sha256`, 'utf8'), `${sha(LAYERS[0]).slice(7)} ${LAYERS[0].length}\n`, 'recorded with its size');
  writeFileSync(`${layer}.sha256`, `${'0'.repeat(64)} ${LAYERS[0].length}\n`);
  assert.equal(await builtFileSha256(layer), '0'.repeat(64), 'read from the record, not hashed again');
  const rebuilt = Buffer.from('a rebuilt layer, of another size');
  writeFileSync(layer, rebuilt);
  assert.equal(`sha256:${await builtFileSha256(layer)}`, sha(rebuilt), 'another size than recorded: hashed again');
});
