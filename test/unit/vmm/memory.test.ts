import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, truncateSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { allocatedBytes, copyPrivatePages, fillFromImage, preallocPrivatePages, privatePageBytes, seedFromBacking } from '../../../src/vmm/memory.ts';

const PAGE = 4096;
const PAGES = 2048; // an 8 MiB "guest"

/**
 * A process that maps `file` copy-on-write (as a share=off VMM maps its backing RAM file), reads
 * some pages, writes others, and waits: the pages it wrote are its own, the ones it read are not.
 */
async function guestProcess(file: string, writes: number[], reads: number[]) {
  const script = `
import mmap, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
for p in ${JSON.stringify(reads)}: m[p * 4096]
for p in ${JSON.stringify(writes)}: m[p * 4096:(p + 1) * 4096] = bytes([p % 251 + 1]) * 4096
print("ready", flush=True)
sys.stdin.read()
`;
  const child = spawn('python3', ['-c', script, file], { stdio: ['pipe', 'pipe', 'inherit'] });
  await once(child.stdout!, 'data');
  return child;
}

test('the pages a process wrote in its private mapping of a file: counted, preallocated and copied, nothing else', async () => {
  const dir = mkdtempSync('/dev/shm/copypages-'); // tmpfs, where RAM files live
  const backing = join(dir, 'backing.mem');
  const dest = join(dir, 'fork.mem');
  closeSync(openSync(backing, 'w'));
  truncateSync(backing, PAGES * PAGE);
  // The backing file: data in pages 0–15 and 600, holes elsewhere.
  const fd = openSync(backing, 'r+');
  writeSync(fd, Buffer.alloc(16 * PAGE, 0x11), 0, 16 * PAGE, 0);
  writeSync(fd, Buffer.alloc(PAGE, 0x22), 0, PAGE, 600 * PAGE);
  closeSync(fd);
  // Written: over the backing's data (3, 600), over holes (100–103, 1500, 2047); read only: 5, 700.
  const writes = [3, 100, 101, 102, 103, 600, 1500, 2047];
  const child = await guestProcess(backing, writes, [5, 700]);
  try {
    const cache = join(dir, 'cache');
    assert.equal(await privatePageBytes(child.pid!, backing, cache), writes.length * PAGE);

    await seedFromBacking(backing, dest, PAGES * PAGE);
    const seeded = allocatedBytes(dest);
    assert.equal(await preallocPrivatePages(child.pid!, backing, dest, cache), writes.length * PAGE);
    // The written pages over holes (100–103, 1500, 2047) now have blocks; the content is still the backing's.
    assert.equal(allocatedBytes(dest) - seeded, 6 * PAGE);
    assert.deepEqual(readFileSync(dest), readFileSync(backing));

    assert.equal(await copyPrivatePages(child.pid!, backing, dest, cache), writes.length * PAGE);
    const want = readFileSync(backing);
    for (const p of writes) want.fill(p % 251 + 1, p * PAGE, (p + 1) * PAGE);
    const got = readFileSync(dest);
    assert.ok(got.equals(want), 'the copy is the process\'s view of its memory');
    assert.equal(allocatedBytes(dest), seeded + 6 * PAGE, 'no page it did not write was added');
    // The backing file is untouched.
    assert.equal(readFileSync(backing)[3 * PAGE], 0x11);
  } finally {
    child.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('copying from a process that does not map the file says so', async () => {
  const dir = mkdtempSync('/dev/shm/copypages-');
  try {
    const f = join(dir, 'x.mem');
    closeSync(openSync(f, 'w'));
    truncateSync(f, PAGE);
    await assert.rejects(privatePageBytes(process.pid, f, join(dir, 'cache')), /does not map/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a RAM image fills a RAM file in place: its data at the same offsets, nothing written where it has holes, the size kept', async () => {
  const dir = mkdtempSync('/var/tmp/copypages-'); // images live on disk, RAM files on tmpfs
  const ram = mkdtempSync('/dev/shm/copypages-');
  try {
    const image = join(dir, 'ram.img');
    const mem = join(ram, 'x.mem');
    closeSync(openSync(image, 'w'));
    truncateSync(image, PAGES * PAGE);
    const fd = openSync(image, 'r+');
    writeSync(fd, Buffer.alloc(300 * PAGE, 0x44), 0, 300 * PAGE, 10 * PAGE);
    writeSync(fd, Buffer.alloc(PAGE, 0x55), 0, PAGE, (PAGES - 1) * PAGE);
    closeSync(fd);
    // The RAM file already has its size (a VMM maps it) and, for the test, a mark where the image has holes.
    writeFileSync(mem, Buffer.alloc(PAGES * PAGE, 0x33));
    assert.equal(await fillFromImage(image, mem, join(dir, 'cache')), 301 * PAGE);
    const got = readFileSync(mem);
    assert.equal(got.length, PAGES * PAGE);
    assert.equal(got[0], 0x33, 'a hole of the image is not written');
    assert.equal(got[10 * PAGE], 0x44);
    assert.equal(got[310 * PAGE - 1], 0x44);
    assert.equal(got[310 * PAGE], 0x33);
    assert.equal(got[PAGES * PAGE - 1], 0x55);
    await assert.rejects(fillFromImage(join(dir, 'missing.img'), mem, join(dir, 'cache')), /missing\.img/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
    rmSync(ram, { recursive: true, force: true });
  }
});
