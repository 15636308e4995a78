/**
 * The Debian layers behind the python, node and debian catalog images, mounted and run on the host.
 * The debian image in a real VM is tested in users.test.ts, on that file's engine.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, existsSync, readFileSync, statSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { run } from '../../src/host/run.ts';
import type { LayerAsset } from '../../src/images/guestAssets.ts';
import { ensureDebianBaseLayer, ensureRuntimeLayer, unmountAll, DEBIAN_CATALOG, NODE_DISTS } from '../../src/images/debianRootfs.ts';

/** Shared with the other integration tests: the first run builds (minutes), later runs are instant. */
const CACHE = process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache';
const progress = process.env.COLLIMATE_TEST_VERBOSE ? (m: string) => console.error(`[debian] ${m}`) : () => {};

let base: LayerAsset;
let python: LayerAsset;
let node: LayerAsset;
let debian: LayerAsset;
let scratch: string;

before(async () => {
  mkdirSync(CACHE, { recursive: true });
  const t0 = Date.now();
  base = await ensureDebianBaseLayer(CACHE, progress);
  python = await ensureRuntimeLayer(CACHE, 'python', progress);
  node = await ensureRuntimeLayer(CACHE, 'node', progress);
  debian = await ensureRuntimeLayer(CACHE, 'debian', progress);
  console.error(`[debian] layers ready in ${((Date.now() - t0) / 1000).toFixed(1)}s: base ${mib(base.path)}, python ${mib(python.path)}, node ${mib(node.path)}, debian ${mib(debian.path)}`);
  mkdirSync('/tmp/collimate-it', { recursive: true });
  scratch = mkdtempSync('/tmp/collimate-it/debian-layers-');
});

after(async () => {
  if (!scratch) return;
  try { await unmountAll(scratch); } finally { rmSync(scratch, { recursive: true, force: true }); }
});

function mib(path: string): string {
  return `${(statSync(path).size / 1048576).toFixed(1)} MiB`;
}

async function mountErofs(image: string, name: string): Promise<string> {
  const dir = join(scratch, name);
  mkdirSync(dir, { recursive: true });
  await run('mount', ['-t', 'erofs', '-o', 'loop,ro', image, dir]);
  return dir;
}

/** The guest's view: lowerdir=runtime:base with no upper dir (read-only), like the agent stacks them. */
async function mountStack(lowers: string[], name: string): Promise<string> {
  const dir = join(scratch, name);
  mkdirSync(dir, { recursive: true });
  await run('mount', ['-t', 'overlay', 'overlay', '-o', `ro,lowerdir=${lowers.join(':')}`, dir]);
  return dir;
}

test('runtime layers are diffs over the Debian base: merged views have the runtimes, the base does not', async () => {
  const baseDir = await mountErofs(base.path, 'base');
  const pyDir = await mountErofs(python.path, 'python');
  const nodeDir = await mountErofs(node.path, 'node');
  const pyMerged = await mountStack([pyDir, baseDir], 'python-merged');
  const nodeMerged = await mountStack([nodeDir, baseDir], 'node-merged');

  // The base layer alone: a Debian userland, no runtimes, nothing left over from the build.
  assert.ok(existsSync(join(baseDir, 'usr/bin/bash')));
  assert.ok(existsSync(join(baseDir, 'usr/bin/apt-get')));
  assert.match(readFileSync(join(baseDir, 'etc/os-release'), 'utf8'), /bookworm/);
  assert.equal(existsSync(join(baseDir, 'usr/bin/python3')), false);
  assert.equal(existsSync(join(baseDir, 'usr/bin/node')), false);
  assert.equal(existsSync(join(baseDir, 'etc/machine-id')), false);
  assert.deepEqual((await run('ls', ['-A', join(baseDir, 'var/cache/apt/archives')])).stdout.split('\n').filter((f) => f.endsWith('.deb')), []);

  // Stacked: the runtimes are there, and the diff layer's dpkg status overrides the base's.
  assert.ok(existsSync(join(pyMerged, 'usr/bin/python3')));
  assert.ok(existsSync(join(pyMerged, 'usr/bin/pip3')));
  assert.ok(existsSync(join(pyMerged, 'usr/bin/bash')));
  assert.match(readFileSync(join(pyMerged, 'var/lib/dpkg/status'), 'utf8'), /Package: python3-venv\nStatus: install ok installed/);
  // Node.js is the official build under /usr/local, not Debian's nodejs (18, end of life).
  assert.ok(existsSync(join(nodeMerged, 'usr/local/bin/node')));
  assert.ok(existsSync(join(nodeMerged, 'usr/local/bin/npm')));
  assert.equal(existsSync(join(nodeMerged, 'usr/bin/node')), false);
  assert.equal(existsSync(join(pyMerged, 'usr/local/bin/node')), false);

  // And they run from the stacked, read-only view.
  const py = await run('chroot', [pyMerged, 'python3', '-c', 'import sys, venv, pip; print(sys.version_info[0])'], { env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' } });
  assert.equal(py.stdout, '3\n');
  const js = await run('chroot', [nodeMerged, 'node', '-e', 'console.log(1 + 1, process.version)'], { env: { PATH: '/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' } });
  assert.equal(js.stdout, `2 v${NODE_DISTS.node.version}\n`);
  const npm = await run('chroot', [nodeMerged, 'npm', '--version'], { env: { PATH: '/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', HOME: '/tmp' } });
  assert.equal(npm.stdout, `${NODE_DISTS.npm.version}\n`);

  // The diff layers hold only what the install changed, not a copy of the base: of the merged
  // view's bytes, those the diff does not carry are most of the base (a layer that copied the base
  // would carry nearly all the merged bytes itself). The python layer is far larger than the base
  // (the code interpreter's numpy, pandas, matplotlib), so a ratio of the sizes alone says nothing.
  for (const dir of [pyDir, nodeDir]) assert.equal(existsSync(join(dir, 'usr/bin/bash')), false, `${dir} duplicates the base`);
  const du = async (d: string) => Number((await run('du', ['-sb', d])).stdout.split(/\s/)[0]);
  const baseBytes = await du(baseDir);
  for (const [diff, merged] of [[pyDir, pyMerged], [nodeDir, nodeMerged]]) {
    const [diffBytes, mergedBytes] = [await du(diff), await du(merged)];
    assert.ok(mergedBytes >= baseBytes, `${merged} is smaller than its base`);
    assert.ok(mergedBytes - diffBytes >= baseBytes * 0.8,
      `${diff} carries ${diffBytes} B of a ${mergedBytes} B merged tree: less than 80% of the base's ${baseBytes} B comes from the base`);
  }
});

test('cached: a second call returns the same digest without rebuilding', async () => {
  const mtime = statSync(python.path).mtimeMs;
  const again = await ensureRuntimeLayer(CACHE, 'python', progress);
  const baseAgain = await ensureDebianBaseLayer(CACHE, progress);
  assert.equal(again.digest, python.digest);
  assert.equal(again.path, python.path);
  assert.equal(baseAgain.digest, base.digest);
  assert.equal(statSync(python.path).mtimeMs, mtime);
  assert.notEqual(python.digest, node.digest);
  assert.notEqual(debian.digest, node.digest);
});

test('DEBIAN_CATALOG: python, node and debian entries stacking [base, runtime]', async () => {
  assert.deepEqual(DEBIAN_CATALOG.map((e) => e.id), ['python', 'node', 'debian']);
  const py = DEBIAN_CATALOG[0];
  assert.deepEqual(py.interpreter, ['python3', '-c']);
  assert.deepEqual((await py.layers(CACHE, progress)).map((l) => l.digest), [base.digest, python.digest]);
  const nd = DEBIAN_CATALOG[1];
  assert.deepEqual(nd.interpreter, ['node', '-e']);
  assert.deepEqual((await nd.layers(CACHE, progress)).map((l) => l.digest), [base.digest, node.digest]);
  const deb = DEBIAN_CATALOG[2];
  assert.deepEqual(deb.interpreter, ['/bin/bash', '-c']);
  assert.deepEqual((await deb.layers(CACHE, progress)).map((l) => l.digest), [base.digest, debian.digest]);
  assert.equal(deb.layersCached?.(CACHE), true);
});

test('the debian layer carries the user account and its sudoers file, owned as the guest will see them', async () => {
  const baseDir = await mountErofs(base.path, 'base-for-debian');
  const debDir = await mountErofs(debian.path, 'debian');
  const merged = await mountStack([debDir, baseDir], 'debian-merged');
  const sudoers = join(merged, 'etc/sudoers.d/user');
  assert.equal(readFileSync(sudoers, 'utf8'), 'user ALL=(ALL:ALL) NOPASSWD: ALL\n');
  assert.deepEqual([statSync(sudoers).mode & 0o7777, statSync(sudoers).uid, statSync(sudoers).gid], [0o440, 0, 0]);
  // sudo must keep its setuid bit through the erofs layer, or no one but root can use it.
  assert.equal(statSync(join(merged, 'usr/bin/sudo')).mode & 0o4000, 0o4000);
  const home = statSync(join(merged, 'home/user'));
  assert.deepEqual([home.isDirectory(), home.uid, home.gid], [true, 1000, 1000]);
  assert.equal(statSync(join(merged, 'home/user/.bashrc')).uid, 1000);
  const env = { PATH: '/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' };
  assert.equal((await run('chroot', [merged, 'getent', 'passwd', 'user'], { env })).stdout, 'user:x:1000:1000::/home/user:/bin/bash\n');
  assert.equal((await run('chroot', [merged, 'id', 'user'], { env })).stdout, 'uid=1000(user) gid=1000(user) groups=1000(user),27(sudo)\n');
  await run('chroot', [merged, 'visudo', '-c', '-q'], { env });
  // Node.js is the node image's official build, beside Debian's python3.
  assert.ok(existsSync(join(merged, 'usr/local/bin/node')));
  assert.ok(existsSync(join(merged, 'usr/bin/python3')));
  assert.equal(existsSync(join(debDir, 'usr/bin/bash')), false, 'the debian diff duplicates the base');
});
