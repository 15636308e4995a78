import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, readFileSync, existsSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { launchArgs, vmmBinds, systemBinds, backingChain, untrustedLayer, uidRangeConflicts, type ViewPlan } from '../../../src/vmm/jail.ts';
import { isOwnDiskPath } from '../../../src/sandboxes/runtime.ts';
import { ClaimPool, UidPool, releaseClaim } from '../../../src/host/claims.ts';

test('vmmBinds: own dir, the links dir shown as the disks dir, shared files read-only, nothing bound twice', () => {
  const binds = vmmBinds({
    dir: '/h/sandboxes/sbx_1',
    linksDir: '/h/sandboxes/sbx_1/disks',
    disksDir: '/h/disks',
    chain: ['/h/disks/sbx_1-a.qcow2', '/h/disks/sbx_0-b.qcow2', '/c/artifacts/k/b/disk.raw'],
    memPath: '/dev/shm/c/artifact.mem',
    memOwn: false,
    readonlyFiles: ['/c/k/vmlinuz', '/c/k/initramfs.cpio', '/c/l/base.erofs', '/c/artifacts/k/b/disk.raw'],
  });
  assert.deepEqual(binds, [
    { src: '/h/sandboxes/sbx_1', dst: '/h/sandboxes/sbx_1', kind: 'dir', ro: false },
    { src: '/h/sandboxes/sbx_1/disks', dst: '/h/disks', kind: 'dir', ro: false },
    { src: '/c/artifacts/k/b/disk.raw', dst: '/c/artifacts/k/b/disk.raw', kind: 'file', ro: true },
    { src: '/dev/shm/c/artifact.mem', dst: '/dev/shm/c/artifact.mem', kind: 'file', ro: true },
    { src: '/c/k/vmlinuz', dst: '/c/k/vmlinuz', kind: 'file', ro: true },
    { src: '/c/k/initramfs.cpio', dst: '/c/k/initramfs.cpio', kind: 'file', ro: true },
    { src: '/c/l/base.erofs', dst: '/c/l/base.erofs', kind: 'file', ro: true },
  ]);
});

test('vmmBinds: a template boot writes its RAM file; its disk lives in its own dir; no disks dir', () => {
  const binds = vmmBinds({
    dir: '/c/artifacts/k/tmp-1', linksDir: '/c/artifacts/k/tmp-1/disks', disksDir: '/c/disks',
    chain: ['/c/artifacts/k/tmp-1/disk.raw'], memPath: '/dev/shm/c/artifact-k.mem', memOwn: true, readonlyFiles: [],
  });
  assert.deepEqual(binds, [
    { src: '/c/artifacts/k/tmp-1', dst: '/c/artifacts/k/tmp-1', kind: 'dir', ro: false },
    { src: '/dev/shm/c/artifact-k.mem', dst: '/dev/shm/c/artifact-k.mem', kind: 'file', ro: false },
  ]);
});

test('the launch steps are pinned: network namespace, huge pages off, cgroups, new root, binds (parents first), private proc, uid', () => {
  const plan: ViewPlan = {
    root: '/run/collimate/vmroot',
    cgroupProcs: ['/sys/fs/cgroup/memory/collimate/t-sbx_1/cgroup.procs', '/sys/fs/cgroup/pids/collimate/t-sbx_1/cgroup.procs'],
    binds: [
      ...systemBinds({ accel: 'tcg', qemuBinary: 'qemu-system-x86_64', hasLdCache: true }),
      { src: '/h/sandboxes/sbx_1', dst: '/h/sandboxes/sbx_1', kind: 'dir', ro: false },
      { src: '/h/sandboxes/sbx_1/disks', dst: '/h/disks', kind: 'dir', ro: false },
      { src: '/dev/shm/c/a.mem', dst: '/dev/shm/c/a.mem', kind: 'file', ro: true },
    ],
    symlinks: [['/bin', 'usr/bin'], ['/lib64', 'usr/lib64']],
    proc: 'private',
    uid: 200123,
    gid: 200123,
    groups: [],
    env: { LD_PRELOAD: '/c/assets/ramro/libcollimate-ramro.so', COLLIMATE_RAM_RO: '/dev/shm/c/a.mem' },
    noThp: true,
  };
  assert.deepEqual(launchArgs(plan, '/run/netns/c-1'), [
    '--netns', '/run/netns/c-1',
    '--no-thp',
    '--cgroup', '/sys/fs/cgroup/memory/collimate/t-sbx_1/cgroup.procs',
    '--cgroup', '/sys/fs/cgroup/pids/collimate/t-sbx_1/cgroup.procs',
    '--root', '/run/collimate/vmroot',
    '--mkdir', './.old', '--mkdir', './dev', '--mkdir', './dev/shm/c', '--mkdir', './etc', '--mkdir', './h/disks',
    '--mkdir', './h/sandboxes/sbx_1', '--mkdir', './proc', '--mkdir', './usr',
    '--touch', './dev/full', '--touch', './dev/null', '--touch', './dev/random', '--touch', './dev/urandom', '--touch', './dev/zero',
    '--touch', './etc/ld.so.cache', '--touch', './dev/shm/c/a.mem',
    '--symlink', 'usr/bin', './bin',
    '--symlink', 'usr/lib64', './lib64',
    '--bind', '/usr', './usr', 'ro',
    '--bind', '/dev/full', './dev/full', 'dev',
    '--bind', '/dev/null', './dev/null', 'dev',
    '--bind', '/dev/random', './dev/random', 'dev',
    '--bind', '/dev/urandom', './dev/urandom', 'dev',
    '--bind', '/dev/zero', './dev/zero', 'dev',
    '--bind', '/etc/ld.so.cache', './etc/ld.so.cache', 'ro',
    '--bind', '/h/sandboxes/sbx_1/disks', './h/disks', 'rw',
    '--bind', '/h/sandboxes/sbx_1', './h/sandboxes/sbx_1', 'rw',
    '--bind', '/dev/shm/c/a.mem', './dev/shm/c/a.mem', 'ro',
    '--proc', 'private',
    '--env', 'LD_PRELOAD=/c/assets/ramro/libcollimate-ramro.so',
    '--env', 'COLLIMATE_RAM_RO=/dev/shm/c/a.mem',
    '--uid', '200123', '--gid', '200123',
  ]);
});

test('KVM views add /dev/kvm and a read-only /sys; the kvm group is the only group kept', () => {
  const b = systemBinds({ accel: 'kvm', qemuBinary: '/opt/qemu/bin/qemu-system-x86_64', hasLdCache: false });
  assert.ok(b.some((x) => x.dst === '/dev/kvm' && !x.ro));
  assert.ok(b.some((x) => x.dst === '/sys' && x.ro));
  assert.ok(b.some((x) => x.dst === '/opt/qemu/bin/qemu-system-x86_64' && x.ro), 'a QEMU outside /usr is bound in');
  assert.ok(!b.some((x) => x.dst === '/etc/ld.so.cache'));
  const args = launchArgs({ root: '/r', cgroupProcs: [], binds: b, symlinks: [], proc: 'bind', uid: 1, gid: 1, groups: [108], env: {} }).join(' ');
  assert.match(args, /--proc bind --uid 1 --gid 1 --group 108$/);
  assert.ok(!args.includes('--netns'), 'no network namespace unless asked');
});

test('backingChain follows qcow2 headers (absolute and relative names) and stops at a raw image', () => {
  const dir = mkdtempSync(join(tmpdir(), 'chain-'));
  const qcow2 = (path: string, backing?: string) => {
    const name = backing ? Buffer.from(backing) : Buffer.alloc(0);
    const h = Buffer.alloc(512);
    h.writeUInt32BE(0x514649fb, 0);
    h.writeUInt32BE(3, 4);
    if (backing) { h.writeBigUInt64BE(256n, 8); h.writeUInt32BE(name.length, 16); name.copy(h, 256); }
    writeFileSync(path, h);
  };
  writeFileSync(join(dir, 'base.raw'), Buffer.alloc(4096));
  qcow2(join(dir, 'mid.qcow2'), join(dir, 'base.raw'));
  qcow2(join(dir, 'top.qcow2'), 'mid.qcow2');
  assert.deepEqual(backingChain(join(dir, 'top.qcow2')), [join(dir, 'top.qcow2'), join(dir, 'mid.qcow2'), join(dir, 'base.raw')]);
  qcow2(join(dir, 'loop.qcow2'), 'loop.qcow2');
  assert.throws(() => backingChain(join(dir, 'loop.qcow2')), /loops/);
});

test('uid pool: claims are exclusive, stale claims of dead owners are reclaimed, release checks the owner', () => {
  const dir = join(mkdtempSync(join(tmpdir(), 'uids-')), 'uids');
  const self = { pid: process.pid, startTicks: readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' ')[19] };
  // Two uids only, in a range no process runs as.
  const pool = new UidPool(dir, 3_000_000_000 % 2 ** 31, 2);
  assert.equal(pool.free(), 2);
  const a = pool.claim(self);
  const b = pool.claim(self);
  assert.notEqual(a, b);
  assert.equal(pool.free(), 0);
  assert.throws(() => pool.claim(self), (e: any) => e.code === 'host_at_capacity' && e.details.resource === 'vmm_uids' && /no free VMM uid/.test(e.message));
  // Claims of another range in the same directory (another server's) are not this pool's.
  const other = new UidPool(dir, 3_000_000_000 % 2 ** 31 + 2, 5);
  other.claim(self);
  assert.equal(pool.free(), 0);
  assert.equal(other.free(), 4);
  releaseClaim(other.claimPath(other.claimed().find((u) => u !== a && u !== b)!), self);
  // A claim whose owner is gone is taken over.
  const dead = { pid: 2 ** 22 + 12345, startTicks: '1' };
  pool.bind(a, dead);
  const c = pool.claim(self);
  assert.equal(c, a);
  assert.deepEqual(pool.owner(c), self);
  // Releasing with the wrong owner leaves the claim alone.
  pool.release(b, dead);
  assert.ok(existsSync(pool.claimPath(b)));
  releaseClaim(pool.claimPath(b), self);
  assert.ok(!existsSync(pool.claimPath(b)));
  assert.deepEqual(pool.claimed(), [a]);
  pool.bind(a, dead);
  assert.equal(pool.sweepStale(), 1);
  assert.deepEqual(pool.claimed(), []);
  mkdirSync(dir, { recursive: true });
});

test('taking over a claim: a missing or stale one becomes ours, our own stays ours, a live owner keeps it', () => {
  const dir = join(mkdtempSync(join(tmpdir(), 'claims-')), 'netidx');
  const self = { pid: process.pid, startTicks: readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' ')[19] };
  const pool = new ClaimPool(dir, 1, 8);
  mkdirSync(dir, { recursive: true });
  assert.equal(pool.takeOver(3, self), true, 'a missing claim is made');
  assert.deepEqual(pool.owner(3), self);
  assert.equal(pool.takeOver(3, self), true, 'our own claim stays ours');
  pool.bind(4, { pid: 2 ** 22 + 12345, startTicks: '1' });
  assert.equal(pool.takeOver(4, self), true, 'a dead owner\'s claim is taken over');
  assert.deepEqual(pool.owner(4), self);
  const parent = { pid: process.ppid, startTicks: readFileSync(`/proc/${process.ppid}/stat`, 'utf8').split(') ')[1].split(' ')[19] };
  pool.bind(5, parent);
  assert.equal(pool.takeOver(5, self), false, 'a live owner keeps its claim');
  assert.deepEqual(pool.owner(5), parent);
  // While another server holds the pool's lock, nothing is taken over.
  mkdirSync(join(dir, '.reclaim.lock'));
  assert.equal(pool.takeOver(6, self), false);
  assert.equal(pool.owner(6), null);
});

test('a backing chain naming a file the server did not record is refused (a VMM can write its qcow2 header)', () => {
  const trusted = ['/h/disks/sbx_000000000001-0000000a.qcow2', '/c/artifacts/k/b/disk.raw'];
  assert.equal(untrustedLayer(['/h/disks/top.qcow2', ...trusted], trusted), undefined);
  assert.equal(untrustedLayer(['/h/disks/top.qcow2', '/etc/shadow'], trusted), '/etc/shadow');
  assert.equal(untrustedLayer(['/h/disks/top.qcow2', '/h/disks/sbx_000000000009-0000000b.qcow2'], trusted), '/h/disks/sbx_000000000009-0000000b.qcow2', 'another sandbox\'s disk');
  assert.equal(untrustedLayer(['/h/c/disk.raw'], []), undefined, 'a raw disk has no chain');
});

test('a top-disk path reported by QEMU is believed only if it is one of ours', () => {
  const dir = mkdtempSync(join(tmpdir(), 'disks-'));
  const good = join(dir, 'sbx_0123456789ab-89abcdef.qcow2');
  writeFileSync(good, '');
  assert.equal(isOwnDiskPath(dir, good), true);
  assert.equal(isOwnDiskPath(dir, '/etc/passwd'), false);
  assert.equal(isOwnDiskPath(dir, join(dir, 'sbx_0123456789ab-00000000.qcow2')), false, 'missing');
  assert.equal(isOwnDiskPath(dir, join(dir, '..', 'x', 'sbx_0123456789ab-89abcdef.qcow2')), false);
  assert.equal(isOwnDiskPath(dir, join(dir, 'evil.qcow2')), false);
});

test('the VMM uid range must not overlap a user or a delegated subordinate range', () => {
  const passwd = 'root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\nodd:x:200007:200007::/:/bin/false\n';
  // Debian gives each user 65536 subordinate ids from 100000: the second user's range reaches 231071.
  const subuid = 'alice:100000:65536\nbob:165536:65536\n';
  assert.deepEqual(uidRangeConflicts({ passwd, subuid, subgid: '' }, 200000, 65536), [
    'user odd (uid 200007) in /etc/passwd',
    'bob:165536:65536 in /etc/subuid',
  ]);
  assert.deepEqual(uidRangeConflicts({ passwd: 'root:x:0:0::/:/bin/sh', subuid: 'alice:100000:65536', subgid: 'alice:100000:65536' }, 200000, 65536), []);
  assert.deepEqual(uidRangeConflicts({ passwd: '', subuid: '', subgid: 'x:265535:1' }, 200000, 65536), ['x:265535:1 in /etc/subgid']);
});
