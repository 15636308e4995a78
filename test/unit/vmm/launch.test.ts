import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, statSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { launchVmm, type LaunchRequest, type SpawnVmm } from '../../../src/vmm/launch.ts';
import { machineSpec } from '../../../src/vmm/machine.ts';
import type { JailLaunch, JailRecord, JailRequest } from '../../../src/vmm/jail.ts';
import type { NetRecord, VmmNet } from '../../../src/net/netns.ts';
import type { Vmm } from '../../../src/vmm/vmm.ts';

const shape = { vcpus: 1, memoryMib: 256, kernel: '/k/vmlinuz', initrd: '/k/initrd', cmdline: 'console=ttyS0', layers: ['/l/base.erofs'], nic: true };
const netRec: NetRecord = { index: 7, ns: 'clm-t-7', hostIp: '10.201.0.29', nsIp: '10.201.0.30', claim: '/run/c/netidx/7' };
const jailRec: JailRecord = { uid: 200123, claim: '/run/c/uids/200123', cgroups: ['/sys/fs/cgroup/c/x'] };

interface TestRecord { pid: number; startTicks: string; jail?: JailRecord; net?: NetRecord; label: string }

/** A launch against fakes that log what happens, in order. */
function fixture(opts: { jail?: boolean; net?: boolean; failAt?: 'prepare' | 'attachTap' | 'onNetwork' | 'spawn' | 'afterSpawned' } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'launch-'));
  const log: string[] = [];
  const fail = (at: string) => { if (opts.failAt === at) throw new Error(`${at} failed`); };
  let prepared: JailRequest | undefined;
  let spawnOpts: Parameters<SpawnVmm>[1] | undefined;
  const jailLaunch: JailLaunch = {
    uid: jailRec.uid, record: jailRec,
    command: () => { throw new Error('not used'); },
    bind: () => {},
    release: async () => { log.push('jail.release'); },
  };
  const vmmNet: VmmNet = {
    rec: netRec, netns: `/run/netns/${netRec.ns}`,
    bound: (o) => { log.push(`net.bound ${o.pid}/${o.startTicks}`); },
    release: async () => { log.push('net.release'); },
  };
  const record: TestRecord = { pid: 0, startTicks: '', label: 'sbx_1' };
  const spec = machineSpec({
    qemuBinary: '/usr/bin/qemu-system-x86_64', accel: 'tcg', seccomp: true, shape, dir, memPath: '/dev/shm/x.mem', memShared: false,
    upper: { path: '/h/disks/sbx_1-0a0b0c0d.qcow2', format: 'qcow2' }, incoming: true, tap: !!opts.net,
  });
  const req: LaunchRequest<TestRecord> = {
    spec, dir,
    jailer: opts.jail ? { prepare: async (r) => { log.push('jail.prepare'); prepared = r; fail('prepare'); return jailLaunch; } } : null,
    jail: { name: 'sbx_1', shape, diskPath: '/h/disks/sbx_1-0a0b0c0d.qcow2', disksDir: '/h/disks', trustedLayers: ['/a/disk.raw'] },
    net: opts.net
      ? {
        acquire: async () => { log.push('net.acquire'); return netRec; },
        forVmm: () => vmmNet,
        attachTap: async (rec, uid) => { log.push(`net.attachTap ${rec.ns} ${uid}`); fail('attachTap'); },
      }
      : null,
    record,
    onNetwork: async (rec) => { log.push(`onNetwork ${rec.ns}`); record.net = rec; fail('onNetwork'); },
  };
  const fakeVmm = { pid: 4242 } as unknown as Vmm;
  const spawn = (async (_spec, o) => {
    spawnOpts = o;
    log.push('spawn');
    fail('spawn');
    o.onSpawned?.(4242, '987654');
    fail('afterSpawned');
    return fakeVmm;
  }) as SpawnVmm;
  return { dir, log, req, spawn, fakeVmm, record, prepared: () => prepared, spawnOpts: () => spawnOpts };
}

test('launchVmm: namespace, jail, tap (owned by the jail uid), network hook, spawn — in that order; the record is written 0600 at spawn', async () => {
  const f = fixture({ jail: true, net: true });
  const vmm = await launchVmm(f.req, f.spawn);
  assert.equal(vmm, f.fakeVmm);
  assert.deepEqual(f.log, ['net.acquire', 'jail.prepare', `net.attachTap ${netRec.ns} ${jailRec.uid}`, `onNetwork ${netRec.ns}`, 'spawn', 'net.bound 4242/987654']);
  // The jail request: what the caller gave plus what the spec already says.
  assert.deepEqual(f.prepared(), {
    name: 'sbx_1', shape, diskPath: '/h/disks/sbx_1-0a0b0c0d.qcow2', disksDir: '/h/disks', trustedLayers: ['/a/disk.raw'],
    dir: f.dir, accel: 'tcg', qemuBinary: '/usr/bin/qemu-system-x86_64', memPath: '/dev/shm/x.mem', memShared: false,
    consoleLog: join(f.dir, 'console.log'), tun: true,
  });
  const o = f.spawnOpts()!;
  assert.equal(o.logPath, join(f.dir, 'qemu.log'));
  assert.equal(o.netns, `/run/netns/${netRec.ns}`);
  assert.equal(o.jail?.uid, jailRec.uid);
  assert.equal(typeof o.release, 'function');
  const file = join(f.dir, 'vmm.json');
  assert.deepEqual(JSON.parse(readFileSync(file, 'utf8')), { pid: 4242, startTicks: '987654', label: 'sbx_1', jail: jailRec, net: netRec });
  assert.equal(statSync(file).mode & 0o777, 0o600);
});

test('launchVmm: a record left in the directory by an earlier VMM is rewritten and made 0600', async () => {
  const f = fixture({ jail: true });
  writeFileSync(join(f.dir, 'vmm.json'), '{"pid":1}');
  chmodSync(join(f.dir, 'vmm.json'), 0o644);
  await launchVmm(f.req, f.spawn);
  assert.equal(statSync(join(f.dir, 'vmm.json')).mode & 0o777, 0o600);
  assert.equal(JSON.parse(readFileSync(join(f.dir, 'vmm.json'), 'utf8')).pid, 4242);
});

test('launchVmm: without jailer or network the VMM runs unconfined, outside any namespace, with no network hook', async () => {
  const f = fixture();
  await launchVmm(f.req, f.spawn);
  assert.deepEqual(f.log, ['spawn']);
  const o = f.spawnOpts()!;
  assert.equal(o.jail, undefined);
  assert.equal(o.netns, undefined);
  assert.equal(o.release, undefined);
  assert.deepEqual(JSON.parse(readFileSync(join(f.dir, 'vmm.json'), 'utf8')), { pid: 4242, startTicks: '987654', label: 'sbx_1' });
});

for (const failAt of ['prepare', 'attachTap', 'onNetwork', 'spawn', 'afterSpawned'] as const) {
  test(`launchVmm: a failure at ${failAt} gives back what was taken and rethrows`, async () => {
    const f = fixture({ jail: true, net: true, failAt });
    await assert.rejects(launchVmm(f.req, f.spawn), new RegExp(`${failAt} failed`));
    const released = f.log.filter((l) => l.endsWith('.release'));
    // The jail is only released if it was made.
    assert.deepEqual(released, failAt === 'prepare' ? ['net.release'] : ['jail.release', 'net.release']);
  });
}
