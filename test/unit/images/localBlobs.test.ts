import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LocalBlobs, type LocalBlob } from '../../../src/images/localBlobs.ts';

test('a snapshot\'s blob is found from the engine\'s record without a scan (which may hash every new artifact)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'blobs-'));
  try {
    const path = join(dir, 'mem');
    writeFileSync(path, 'x');
    const snapshot: LocalBlob = { digest: `sha256:${'a'.repeat(64)}`, kind: 'snapshot', path, size: 1, sparse: true, of: 'snap_0000000000000001' };
    const blobs = new LocalBlobs({ snapshots: () => [snapshot] });
    let scans = 0;
    const scan = blobs.scan.bind(blobs);
    blobs.scan = () => { scans++; return scan(); };
    assert.equal(await blobs.find(snapshot.digest), snapshot);
    assert.equal(scans, 0);
    assert.equal(await blobs.find(`sha256:${'b'.repeat(64)}`), undefined);
    assert.equal(scans, 1, 'anything else is looked for by a scan');
    rmSync(path);
    assert.equal(await blobs.find(snapshot.digest), undefined, 'a file gone is not served');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
