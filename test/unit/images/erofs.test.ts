import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { test } from 'node:test';
import { crc32c } from '../../../src/images/erofs.ts';
import { LayerStore } from '../../../src/images/layerStore.ts';
import { newBudget } from '../../../src/images/unpack.ts';
import { layer, type Layer } from '../../support/oci.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function build(store: LayerStore, l: Layer, stage: string): Promise<Buffer> {
  const s = await store.build((async function* () { yield l.blob; })(), { mediaType: l.mediaType, digest: l.digest, size: l.blob.length, diffId: l.diffId }, newBudget(1 << 30), stage);
  return readFileSync(s.erofs);
}

/** A layer whose members' parents (`opt`, `opt/app`) are not in the tar, as in many real images. */
const entries = (mtime: number) => [
  { name: 'opt/app/run.py', data: 'print("hi")\n', mtime },
  { name: 'opt/app/lib/', type: 'dir' as const, mtime: 1_600_000_000 },
  { name: 'opt/app/lib/util.py', data: 'X = 1\n', mtime: 1_600_000_001 },
];

test('the same layer builds to the same erofs bytes, at another time and in another place; a changed mtime changes them', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'erofs-repro-'));
  try {
    const store = new LayerStore(join(dir, 'store'));
    const l = layer(entries(1_700_000_000));
    const first = await build(store, l, join(dir, 'a'));
    // mkfs.erofs stamps the build's second and the unpack stamps directories it makes: a later build must not differ.
    await sleep(1100);
    const second = await build(store, l, join(dir, 'b'));
    assert.ok(first.equals(second), 'two builds of one layer differ');
    // The image is valid: its superblock checksum, recomputed after the build time was zeroed, checks.
    const image = join(dir, 'a', `${l.diffId.slice(7)}.erofs`);
    const dump = await promisify(execFile)('dump.erofs', ['-s', image]);
    assert.equal(dump.stderr, '', `dump.erofs complained: ${dump.stderr}`);
    assert.match(dump.stdout, /sb_csum/, 'the image has a superblock checksum (this test checks it)');
    assert.match(dump.stdout, new RegExp(`Filesystem UUID:\\s+${(await import('../../../src/images/erofs.ts')).uuidFrom(l.diffId)}`));
    await promisify(execFile)('fsck.erofs', [image]);
    // Per-file mtimes are part of the image (Python checks .pyc files against them).
    const touched = await build(store, layer(entries(1_700_000_999)), join(dir, 'c'));
    assert.ok(!touched.equals(first), 'a file mtime was dropped from the image');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('crc32c is the Castagnoli CRC without its final inversion (the erofs superblock checksum)', () => {
  // The standard check value of CRC-32C over "123456789" is 0xE3069283, which is the inversion of the raw register.
  assert.equal((~crc32c(0xffffffff, Buffer.from('123456789')) >>> 0).toString(16), 'e3069283');
});

test("a stored layer's erofs digest is the sha256 of its bytes, recorded at build and computed once for a layer stored before", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'erofs-digest-'));
  try {
    const store = new LayerStore(join(dir, 'store'));
    const l = layer(entries(1_700_000_000));
    const staged = await store.build((async function* () { yield l.blob; })(), { mediaType: l.mediaType, digest: l.digest, size: l.blob.length, diffId: l.diffId }, newBudget(1 << 30), join(dir, 'a'));
    const bytes = readFileSync(staged.erofs);
    const want = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    assert.equal(staged.meta.erofsDigest, want);
    store.commit(staged);
    assert.equal(await store.erofsDigestOf(l.diffId), want);
    // A layer recorded before the digest was: hashed on first use and recorded.
    const json = join(store.dir, `${l.diffId.slice(7)}.json`);
    const { erofsDigest: _, ...old } = JSON.parse(readFileSync(json, 'utf8'));
    writeFileSync(json, JSON.stringify(old));
    assert.equal(await store.erofsDigestOf(l.diffId), want);
    assert.equal(JSON.parse(readFileSync(json, 'utf8')).erofsDigest, want);
    await assert.rejects(store.erofsDigestOf(`sha256:${'0'.repeat(64)}`), /not in the store/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
