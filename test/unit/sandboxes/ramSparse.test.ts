import { test } from 'node:test';
import assert from 'node:assert/strict';
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { RamSparsifier } from '../../../src/sandboxes/ramSparse.ts';
import { allocatedBytes, digHoles } from '../../../src/vmm/memory.ts';

const MiB = 2 ** 20;

/** Writes `mib` MiB of zeros at `atMib` (what a VMM's faults on holes do to a tmpfs file). */
function fill(path: string, atMib: number, mib: number, byte = 0): void {
  const fd = openSync(path, 'r+');
  writeSync(fd, Buffer.alloc(mib * MiB, byte), 0, mib * MiB, atMib * MiB);
  closeSync(fd);
}

test('a watched RAM file is dug again once it grew by the limit since first seen; its data stays', async () => {
  const dir = mkdtempSync('/dev/shm/ramsparse-'); // tmpfs, where RAM files live
  try {
    const f = join(dir, 'a.mem');
    closeSync(openSync(f, 'w'));
    fill(f, 0, 4, 7); // 4 MiB of data
    fill(f, 127, 1); // size 128 MiB; limit max(16, 128/32) = 16 MiB
    const files = [f];
    const s = new RamSparsifier(() => files, (p) => digHoles(p, join(dir, 'cache')));
    assert.equal(await s.sweep(), 0, 'first seen: recorded, not dug');
    fill(f, 10, 8);
    assert.equal(await s.sweep(), 0, '8 MiB of growth is under the limit');
    assert.ok(allocatedBytes(f) >= 12 * MiB);
    fill(f, 30, 10);
    assert.equal(await s.sweep(), 1, '18 MiB of growth: dug');
    assert.ok(allocatedBytes(f) <= 4 * MiB + 64 * 1024, `${allocatedBytes(f)} bytes left`);
    fill(f, 50, 2);
    assert.equal(await s.sweep({ all: true }), 1, 'all digs regardless');
    assert.ok(allocatedBytes(f) <= 4 * MiB + 64 * 1024);
    // The data is untouched.
    const { readFileSync } = await import('node:fs');
    const data = readFileSync(f);
    assert.ok(data.subarray(0, 4 * MiB).every((b) => b === 7));
    // A file that went away (its fork point collected) is skipped, and forgotten.
    rmSync(f);
    assert.equal(await s.sweep({ all: true }), 0);
    files.length = 0;
    assert.equal(await s.sweep({ all: true }), 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
