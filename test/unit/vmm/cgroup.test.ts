import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { detectCgroups, vmmLimits, createVmmCgroup, ensureParents, removeVmmCgroup, listVmmCgroups } from '../../../src/vmm/cgroup.ts';

// The project's hosts: v1 controllers, a v2 mount without controllers beside them (hybrid).
const HYBRID_MOUNTINFO = [
  '31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755',
  '32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu',
  '33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct',
  '35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory',
  '39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids',
  '41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw',
].join('\n');
const HYBRID_PROC = ['8:pids:/', '4:memory:/process_api/abc', '1:cpu:/', '0::/'].join('\n');

test('a hybrid host uses cgroup v1, under the server\'s own cgroup in each hierarchy', () => {
  const layout = detectCgroups('auto', { mountinfo: HYBRID_MOUNTINFO, procCgroup: HYBRID_PROC, readControllers: () => '' });
  assert.deepEqual(layout, {
    version: 1,
    parents: {
      memory: '/sys/fs/cgroup/memory/process_api/abc/collimate',
      cpu: '/sys/fs/cgroup/cpu/collimate',
      pids: '/sys/fs/cgroup/pids/collimate',
    },
  });
  assert.equal(detectCgroups('v2', { mountinfo: HYBRID_MOUNTINFO, procCgroup: HYBRID_PROC, readControllers: () => '' }).version, 0);
  assert.equal(detectCgroups('off', { mountinfo: HYBRID_MOUNTINFO, procCgroup: HYBRID_PROC }).version, 0);
});

test('a unified host with the controllers uses cgroup v2 at /collimate; combined v1 mounts are found', () => {
  const v2 = detectCgroups('auto', {
    mountinfo: '30 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate',
    procCgroup: '0::/user.slice/session-1.scope',
    readControllers: () => 'cpuset cpu io memory hugetlb pids rdma misc',
  });
  assert.deepEqual(v2, { version: 2, mount: '/sys/fs/cgroup', parent: '/sys/fs/cgroup/collimate' });
  const combined = detectCgroups('v1', {
    mountinfo: ['1 0 0:1 / /c/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct', '2 0 0:2 / /c/memory rw - cgroup cgroup rw,memory', '3 0 0:3 /docker/x /c/pids rw - cgroup cgroup rw,pids'].join('\n'),
    procCgroup: '3:pids:/docker/x\n2:memory:/\n1:cpu,cpuacct:/',
    parent: undefined,
  });
  assert.deepEqual(combined, { version: 1, parents: { memory: '/c/memory/collimate', cpu: '/c/cpu,cpuacct/collimate', pids: '/c/pids/collimate' } });
  const none = detectCgroups('auto', { mountinfo: '30 23 0:27 / /sys rw - sysfs sysfs rw', procCgroup: '' });
  assert.equal(none.version, 0);
});

test('limits: guest RAM plus overhead, vcpus x 100 % of a CPU, pids', () => {
  assert.deepEqual(vmmLimits({ vcpus: 2, memoryMib: 512 }, { memoryOverheadMib: 192, pidsMax: 128 }), {
    memoryBytes: 704 * 1024 * 1024, cpuQuotaUs: 200_000, cpuPeriodUs: 100_000, pidsMax: 128,
  });
});

test('v1: one directory per controller with its limit files; removal; listing by prefix', async () => {
  const root = mkdtempSync(join(tmpdir(), 'cg1-'));
  const layout = { version: 1 as const, parents: { memory: join(root, 'memory/collimate'), cpu: join(root, 'cpu/collimate'), pids: join(root, 'pids/collimate') } };
  ensureParents(layout);
  const cg = createVmmCgroup(layout, 'tag-sbx_1', vmmLimits({ vcpus: 1, memoryMib: 256 }, { memoryOverheadMib: 192, pidsMax: 128 }))!;
  assert.equal(readFileSync(join(root, 'memory/collimate/tag-sbx_1/memory.limit_in_bytes'), 'utf8'), String(448 * 1024 * 1024));
  assert.equal(readFileSync(join(root, 'cpu/collimate/tag-sbx_1/cpu.cfs_quota_us'), 'utf8'), '100000');
  assert.equal(readFileSync(join(root, 'cpu/collimate/tag-sbx_1/cpu.cfs_period_us'), 'utf8'), '100000');
  assert.equal(readFileSync(join(root, 'pids/collimate/tag-sbx_1/pids.max'), 'utf8'), '128');
  assert.deepEqual(cg.procsFiles, ['memory', 'cpu', 'pids'].map((c) => join(root, c, 'collimate/tag-sbx_1/cgroup.procs')));
  assert.deepEqual(listVmmCgroups(layout, 'tag-').length, 3);
  assert.deepEqual(listVmmCgroups(layout, 'other-'), []);
  assert.throws(() => createVmmCgroup(layout, '../escape', vmmLimits({ vcpus: 1, memoryMib: 1 }, { memoryOverheadMib: 0, pidsMax: 1 })), /bad cgroup name/);
  // A real cgroupfs removes the control files with the directory; a plain one refuses (ENOTEMPTY).
  assert.equal(await removeVmmCgroup(cg.dirs, 50), false);
});

test('v2: controllers delegated down to the parent; memory.max, cpu.max, pids.max', () => {
  const root = mkdtempSync(join(tmpdir(), 'cg2-'));
  writeFileSync(join(root, 'cgroup.subtree_control'), 'cpu memory');
  mkdirSync(join(root, 'collimate'));
  writeFileSync(join(root, 'collimate', 'cgroup.subtree_control'), '');
  const layout = { version: 2 as const, mount: root, parent: join(root, 'collimate') };
  ensureParents(layout);
  assert.equal(readFileSync(join(root, 'cgroup.subtree_control'), 'utf8'), '+pids');
  assert.equal(readFileSync(join(root, 'collimate', 'cgroup.subtree_control'), 'utf8'), '+memory +cpu +pids');
  mkdirSync(join(root, 'collimate', 'tag-sbx_2'));
  writeFileSync(join(root, 'collimate', 'tag-sbx_2', 'memory.swap.max'), 'max');
  const cg = createVmmCgroup(layout, 'tag-sbx_2', vmmLimits({ vcpus: 2, memoryMib: 256 }, { memoryOverheadMib: 64, pidsMax: 64 }))!;
  const f = (n: string) => readFileSync(join(root, 'collimate', 'tag-sbx_2', n), 'utf8');
  assert.equal(f('memory.max'), String(320 * 1024 * 1024));
  assert.equal(f('memory.swap.max'), '0');
  assert.equal(f('cpu.max'), '200000 100000');
  assert.equal(f('pids.max'), '64');
  assert.deepEqual(cg.dirs, [join(root, 'collimate', 'tag-sbx_2')]);
  assert.ok(existsSync(join(root, 'collimate', 'tag-sbx_2')));
});
