import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, linkSync, mkdirSync, mkdtempSync, openSync, readdirSync, renameSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LayerStore } from '../../../src/images/layerStore.ts';
import { collectLayers, recordedLayers, writeHomeLayers } from '../../../src/images/layerGc.ts';

const HOUR = 3600_000;
const hexOf = (c: string) => c.repeat(64);
const diffOf = (c: string) => `sha256:${hexOf(c)}`;

/** A layer store in a temp directory; `layer(c)` stores a layer (written two hours ago) and its by-blob entry. */
function store() {
  const base = mkdtempSync(join(tmpdir(), 'layer-gc-'));
  const s = new LayerStore(join(base, 'cache'));
  mkdirSync(s.dir, { recursive: true });
  mkdirSync(s.byBlobDir, { recursive: true });
  const layer = (c: string, ageMs = 2 * HOUR) => {
    const erofs = join(s.dir, `${hexOf(c)}.erofs`);
    const json = join(s.dir, `${hexOf(c)}.json`);
    writeFileSync(erofs, Buffer.alloc(8192, c.charCodeAt(0)));
    writeFileSync(json, JSON.stringify({ diffId: diffOf(c), size: 8192, unpackedBytes: 8192, facts: {} }));
    const blob = join(s.byBlobDir, `${'b'.repeat(63)}${c}`);
    writeFileSync(blob, `${diffOf(c)}\n`);
    const t = new Date(Date.now() - ageMs);
    utimesSync(erofs, t, t);
    utimesSync(json, t, t);
    return { erofs, json, blob };
  };
  /** A home with a database file. */
  const home = (name: string) => {
    const h = join(base, name);
    mkdirSync(h, { recursive: true });
    writeFileSync(join(h, 'collimate.db'), '');
    return h;
  };
  return { base, s, layer, home };
}

/** A record as a server that has since stopped wrote it (its process is gone). */
function stoppedServerRecord(s: LayerStore, home: string, layers: string[]): string {
  mkdirSync(s.homesDir, { recursive: true });
  const path = join(s.homesDir, `${home.replace(/\W/g, '_')}.json`);
  writeFileSync(path, JSON.stringify({ home, db: join(home, 'collimate.db'), writer: { pid: spawnSync('true').pid, startTicks: '1' }, layers, writtenAt: Date.now() }));
  return path;
}

const ids = (removed: { diffId: string }[]) => removed.map((r) => r.diffId).sort();

/** Maps the file argv[1] (PROT_READ, MAP_SHARED), closes its descriptor, says so and sleeps. */
const MAP_ONLY = [
  'import ctypes, os, sys, time',
  'libc = ctypes.CDLL(None)',
  'libc.mmap.restype = ctypes.c_void_p',
  'libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]',
  'fd = os.open(sys.argv[1], os.O_RDONLY)',
  'assert libc.mmap(None, 4096, 1, 1, fd, 0) != ctypes.c_void_p(-1).value',
  'os.close(fd)',
  'print("mapped", flush=True)',
  'time.sleep(60)',
].join('\n');

/** Starts `sh -c script` and resolves once it printed its first line. */
async function holder(script: string, ...args: string[]): Promise<ChildProcess> {
  const p = spawn('sh', ['-c', script, 'sh', ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => { p.stdout!.once('data', () => resolve()); p.once('error', reject); });
  return p;
}

describe('image layer garbage collection', () => {
  test('an old layer nobody records goes with its by-blob entry; a recorded one stays, with its entry', () => {
    const { base, s, layer, home } = store();
    try {
      const a = layer('a');
      const b = layer('b');
      stoppedServerRecord(s, home('h1'), [diffOf('b')]);
      const removed = collectLayers(s, HOUR);
      assert.deepEqual(ids(removed), [diffOf('a')]);
      assert.equal(removed[0].bytes, 8192);
      assert.ok(!existsSync(a.erofs) && !existsSync(a.json) && !existsSync(a.blob));
      assert.ok(existsSync(b.erofs) && existsSync(b.json) && existsSync(b.blob), 'a stopped server whose home exists keeps its layers');
      assert.equal(s.diffOfBlob(`sha256:${'b'.repeat(63)}b`), diffOf('b'));
      assert.deepEqual(readdirSync(s.dir).sort(), [`${hexOf('b')}.erofs`, `${hexOf('b')}.json`], 'nothing left aside');
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });

  test('a record whose home was deleted holds nothing and is removed; one this live process wrote holds without a database', () => {
    const { base, s, layer, home } = store();
    try {
      const a = layer('a');
      const c = layer('c');
      const gone = home('gone');
      const rec = stoppedServerRecord(s, gone, [diffOf('a')]);
      rmSync(gone, { recursive: true });
      writeHomeLayers(s, join(base, 'in-memory'), null, [diffOf('c')]);
      assert.deepEqual(ids(collectLayers(s, HOUR)), [diffOf('a')]);
      assert.ok(!existsSync(a.erofs) && !existsSync(rec), 'the stale record is removed');
      assert.ok(existsSync(c.erofs));
      assert.deepEqual([...recordedLayers(s)], [diffOf('c')]);
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });

  test('a layer written or reused within the grace period stays; with grace 0 it goes', () => {
    const { base, s, layer } = store();
    try {
      const young = layer('a', 60_000);
      const reused = layer('b');
      assert.equal(s.touch(diffOf('b')), true, 'a pull that reuses a layer marks it');
      assert.equal(s.touch(diffOf('f')), false, 'a layer not held cannot be marked');
      assert.deepEqual(collectLayers(s, HOUR), []);
      assert.ok(existsSync(young.erofs) && existsSync(reused.erofs));
      assert.deepEqual(ids(collectLayers(s, 0, Date.now() + 1000)), [diffOf('a'), diffOf('b')]);
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });

  test('a layer some process has open (by its path, through a hard link, or this process) or maps stays', async () => {
    const { base, s, layer } = store();
    const procs: ChildProcess[] = [];
    let fd: number | undefined;
    try {
      const opened = layer('a');
      const linked = layer('b');
      const mapped = layer('c');
      const mine = layer('d');
      const free = layer('e');
      // A VMM holds its disk layers open; in its jail it sees them under other paths.
      procs.push(await holder('exec 3<"$1"; echo open; exec sleep 60 <&3', opened.erofs));
      const view = join(base, 'jail-view');
      linkSync(linked.erofs, view);
      procs.push(await holder('exec 3<"$1"; echo open; exec sleep 60 <&3', view));
      // Mapped with its descriptor closed (Python's mmap module would keep a copy of it open).
      procs.push(await holder(`exec python3 -c '${MAP_ONLY}' "$1"`, mapped.erofs));
      fd = openSync(mine.erofs, 'r');
      assert.deepEqual(ids(collectLayers(s, 0)), [diffOf('e')]);
      for (const l of [opened, linked, mapped, mine]) assert.ok(existsSync(l.erofs) && existsSync(l.json) && existsSync(l.blob), l.erofs);
      assert.ok(!existsSync(free.erofs));
      closeSync(fd);
      fd = undefined;
      for (const p of procs.splice(0)) { p.kill('SIGKILL'); await new Promise((r) => p.once('exit', r)); }
      assert.deepEqual(ids(collectLayers(s, 0)), [diffOf('a'), diffOf('b'), diffOf('c'), diffOf('d')], 'closed: they go');
    } finally {
      if (fd !== undefined) closeSync(fd);
      for (const p of procs) p.kill('SIGKILL');
      rmSync(base, { recursive: true, force: true });
    }
  });

  test('layers a collector that died left aside: an unwanted one is removed, a recorded one is put back', () => {
    const { base, s, layer, home } = store();
    try {
      const dead = spawnSync('true').pid;
      const a = layer('a');
      const b = layer('b');
      const c = layer('c');
      for (const l of [a, b]) { renameSync(l.erofs, `${l.erofs}.gc-${dead}`); renameSync(l.json, `${l.json}.gc-${dead}`); }
      renameSync(c.json, `${c.json}.gc-${dead}`); // c's layer was already unlinked when it died
      rmSync(c.erofs);
      stoppedServerRecord(s, home('h1'), [diffOf('b')]);
      assert.deepEqual(ids(collectLayers(s, HOUR)), [diffOf('a')]);
      assert.deepEqual(readdirSync(s.dir).sort(), [`${hexOf('b')}.erofs`, `${hexOf('b')}.json`]);
      assert.equal(s.get(diffOf('b'))?.size, 8192, 'the recorded layer is served again');
      assert.ok(!existsSync(a.blob) && !existsSync(c.blob) && existsSync(b.blob));
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });

  test('a record that cannot be read stops the collection', () => {
    const { base, s, layer } = store();
    try {
      const a = layer('a');
      mkdirSync(s.homesDir, { recursive: true });
      writeFileSync(join(s.homesDir, 'torn.json'), '{"home":');
      assert.throws(() => collectLayers(s, 0), /torn\.json cannot be read/);
      assert.ok(existsSync(a.erofs));
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });
});
