import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HostCapacity, SANDBOX_FOOTPRINT_MIB, type ClaimBudget } from '../../../src/sandboxes/hostCapacity.ts';

function host(opts: {
  avail: number; pressure?: number | null; committed?: number; limit?: number; reserve?: number; cpuMax?: number;
  free?: Record<string, number>; claims?: ClaimBudget[];
}) {
  const free = opts.free ?? {};
  const probes = {
    memAvailableMib: () => opts.avail,
    cpuPressure: () => opts.pressure ?? null,
    freeMib: (p: string) => {
      if (!(p in free)) throw Object.assign(new Error(`ENOENT: ${p}`), { code: 'ENOENT' });
      return free[p];
    },
  };
  let committed = opts.committed ?? 0;
  const budget = { memoryMib: opts.limit ?? 0, reserveMib: opts.reserve ?? 512, cpuPressureMax: opts.cpuMax ?? 90, tmpfsReserveMib: 100, diskReserveMib: 1000 };
  const paths = { tmpfs: '/shm/ram', disk: '/var/home' };
  free['/shm/ram'] ??= 100_000;
  free['/var/home'] ??= 100_000;
  const cap = new HostCapacity(budget, () => committed, paths, () => opts.claims ?? [], probes);
  return { cap, free, setCommitted: (n: number) => { committed = n; } };
}

const vm = (vmms: number, memoryMib: number) => ({ vmms, memoryMib });

const refused = (fn: () => unknown, re: RegExp) => assert.throws(fn, (e: any) => e.code === 'host_at_capacity' && e.status === 503 && e.retryAfterSecs > 0 && re.test(e.message));

test('memory: admits while MemAvailable stays above the reserve, counting operations under way', () => {
  const { cap } = host({ avail: 512 + 3 * SANDBOX_FOOTPRINT_MIB });
  const a = cap.admit('create', vm(1, 256));
  const b = cap.admit('create', vm(2, 256));
  // Three footprints are taken by operations under way, though MemAvailable has not moved yet.
  refused(() => cap.admit('create', vm(1, 256)), /keeps 512 MiB in reserve .*COLLIMATE_HOST_MEMORY_RESERVE_MIB/);
  a.release();
  a.release(); // idempotent
  cap.admit('fork', vm(1, 256)).release();
  b.release();
  assert.equal(cap.status().memory.startingMib, 0);
  assert.equal(cap.status().refusals.memory, 1);
});

test('memory: the guest-memory cap counts running and starting sandboxes; 0 means no cap', () => {
  const { cap, setCommitted } = host({ avail: 100_000, limit: 1024, committed: 512 });
  const r = cap.admit('resume', vm(1, 256));
  refused(() => cap.admit('fork', vm(2, 256)), /may have 1024 MiB .*768 MiB is in use or starting.*fork of 2 sandboxes of 256 MiB/);
  r.release();
  setCommitted(768);
  cap.admit('create', vm(1, 256)).release();
  refused(() => cap.admit('create', vm(1, 512)), /COLLIMATE_HOST_MEMORY_MIB/);
  const free = host({ avail: 100_000, limit: 0, committed: 1_000_000 }).cap;
  free.admit('create', vm(64, 4096)).release();
  assert.equal(free.status().memory.limitMib, null);
});

test('CPU: refused at the pressure limit, admitted below it, never when the limit is 0 or the kernel has no PSI', () => {
  refused(() => host({ avail: 100_000, pressure: 93.5, cpuMax: 90 }).cap.admit('create', vm(1, 256)), /CPUs are saturated .*94% .*COLLIMATE_HOST_CPU_PRESSURE_MAX/);
  host({ avail: 100_000, pressure: 89.9, cpuMax: 90 }).cap.admit('create', vm(1, 256)).release();
  host({ avail: 100_000, pressure: 100, cpuMax: 0 }).cap.admit('create', vm(1, 256)).release();
  host({ avail: 100_000, pressure: null, cpuMax: 90 }).cap.admit('create', vm(1, 256)).release();
  const { cap } = host({ avail: 100_000, pressure: 99, cpuMax: 90 });
  refused(() => cap.admit('create', vm(1, 256)), /saturated/);
  assert.deepEqual(cap.status().refusals, { memory: 0, cpu: 1, tmpfs: 0, disk: 0, vmm_uids: 0, net_indexes: 0 });
  assert.deepEqual(cap.status().cpu, { pressure: 99, max: 90 });
});

test('within: the reservation ends with the operation, whether it succeeds or fails', async () => {
  const { cap } = host({ avail: 512 + SANDBOX_FOOTPRINT_MIB });
  await assert.rejects(cap.within('create', vm(1, 256), async () => {
    refused(() => cap.admit('create', vm(1, 256)), /reserve/);
    throw new Error('boom');
  }), /boom/);
  assert.equal(await cap.within('create', vm(1, 256), async () => 7), 7);
  assert.equal(cap.status().memory.startingMib, 0);
});

const refusedFor = (resource: string, fn: () => unknown, re: RegExp) =>
  assert.throws(fn, (e: any) => e.code === 'host_at_capacity' && e.status === 503 && e.details.resource === resource && re.test(e.message));

test('tmpfs and disk: what an operation may write, and what operations under way reserved, leave the reserve free', () => {
  const { cap, free } = host({ avail: 100_000, free: { '/shm/ram': 100 + 600, '/var/home': 1000 + 300 } });
  const fork = cap.admit('fork', { vmms: 1, memoryMib: 512, tmpfsMib: 512 });
  // 700 MiB free, 512 reserved by the fork under way: another fork point's 512 would eat into the reserve.
  refusedFor('tmpfs', () => cap.admit('fork', { vmms: 1, memoryMib: 512, tmpfsMib: 512 }),
    /tmpfs holding sandboxes' RAM files \(\/shm\/ram\) has 188 MiB free and keeps 100 MiB in reserve \(COLLIMATE_TMPFS_RESERVE_MIB\); the fork of a 512 MiB sandbox may write 512 MiB/);
  fork.release();
  cap.admit('resume', { vmms: 1, memoryMib: 512, tmpfsMib: 512 }).release();
  // A suspend writes its image to the home's disk; it starts no VMM, so memory is not asked.
  refusedFor('disk', () => cap.admit('suspend', { vmms: 0, memoryMib: 0, diskMib: 512 }), /disk holding sandboxes' layers and snapshots \(\/var\/home\) has 1300 MiB free .*COLLIMATE_DISK_RESERVE_MIB\); the suspend of this sandbox may write 512 MiB.*delete suspended sandboxes/);
  free['/var/home'] = 1000 + 600;
  cap.admit('suspend', { vmms: 0, memoryMib: 0, diskMib: 512 }).release();
  // Every operation keeps at least the reserve, whatever it writes.
  free['/var/home'] = 999;
  refusedFor('disk', () => cap.admit('create', vm(1, 256)), /has 999 MiB free/);
  const s = cap.status();
  assert.deepEqual(s.disk, { path: '/var/home', freeMib: 999, reserveMib: 1000, startingMib: 0 });
  assert.equal(s.refusals.tmpfs, 1);
  assert.equal(s.refusals.disk, 2);
});

test('a suspend is not refused for memory or CPU: it frees them', () => {
  const { cap } = host({ avail: 0, pressure: 100 });
  cap.admit('suspend', { vmms: 0, memoryMib: 0, diskMib: 256 }).release();
});

test('storage under a directory that does not exist yet is counted on its nearest parent', () => {
  const free: Record<string, number> = { '/var/home': 100_000 };
  const paths = { tmpfs: '/shm/ram/not/yet', disk: '/var/home' };
  const c = new HostCapacity({ memoryMib: 0, reserveMib: 0, cpuPressureMax: 0, tmpfsReserveMib: 100, diskReserveMib: 100 }, () => 0, paths, () => [],
    { memAvailableMib: () => 100_000, cpuPressure: () => null, freeMib: (p) => { if (!(p in free)) throw Object.assign(new Error('x'), { code: 'ENOENT' }); return free[p]; } });
  free['/shm/ram'] = 150;
  refusedFor('tmpfs', () => c.admit('fork', { vmms: 1, memoryMib: 256, tmpfsMib: 256 }), /\/shm\/ram\/not\/yet\) has 150 MiB free/);
});

test('claims: an operation that starts more VMMs than uids or network indexes are free is refused, naming the setting', () => {
  const claims: ClaimBudget[] = [
    { resource: 'vmm_uids', free: 3, total: 8, setting: 'COLLIMATE_VMM_UID_BASE, COLLIMATE_VMM_UID_COUNT' },
    { resource: 'net_indexes', free: 16, total: 16, setting: 'COLLIMATE_NET_TRANSIT' },
  ];
  const { cap } = host({ avail: 100_000, claims });
  cap.admit('fork', vm(3, 256)).release();
  refusedFor('vmm_uids', () => cap.admit('fork', vm(4, 256)), /3 of its 8 VMM uids free \(COLLIMATE_VMM_UID_BASE, COLLIMATE_VMM_UID_COUNT\); the fork of 4 sandboxes of 256 MiB needs 4/);
  claims[0].free = 100;
  claims[1].free = 0;
  refusedFor('net_indexes', () => cap.admit('create', vm(1, 256)), /0 of its 16 network indexes free \(COLLIMATE_NET_TRANSIT\)/);
  // A suspend starts no VMM.
  cap.admit('suspend', { vmms: 0, memoryMib: 0, diskMib: 1 }).release();
  assert.deepEqual(cap.status().claims, { vmm_uids: { free: 100, total: 8 }, net_indexes: { free: 0, total: 16 } });
});

test('queued work waits for room: a bake on a full tmpfs waits, says why, and runs once there is room; past its wait it gets the refusal', async () => {
  const { cap, free } = host({ avail: 100_000 });
  free['/shm/ram'] = 150; // 50 MiB over the reserve: a 256 MiB RAM file does not fit
  const waits: string[] = [];
  let slept = 0;
  const ran = await cap.withinWaiting('bake', { vmms: 1, memoryMib: 256, tmpfsMib: 256 }, async () => 'baked', {
    waitMs: 600_000,
    onWait: (why) => waits.push(why),
    sleep: async (ms) => {
      slept += ms;
      if (waits.length === 2) free['/shm/ram'] = 10_000; // room is made (a RAM file collected) during the second wait
    },
  });
  assert.equal(ran, 'baked');
  assert.equal(waits.length, 2);
  assert.match(waits[0], /tmpfs.*150 MiB free/);
  assert.ok(slept > 0);
  assert.equal(cap.status().tmpfs.startingMib, 0, 'its reservation ended with it');

  free['/shm/ram'] = 150;
  let calls = 0;
  await assert.rejects(
    cap.withinWaiting('bake', { vmms: 1, memoryMib: 256, tmpfsMib: 256 }, async () => { calls++; }, { waitMs: 1000, sleep: async () => {} }),
    (e: any) => e.code === 'host_at_capacity' && e.details.resource === 'tmpfs',
  );
  assert.equal(calls, 0, 'refused work never ran');
  // Any other failure of the work is not waited on.
  await assert.rejects(cap.withinWaiting('bake', { vmms: 0, memoryMib: 0 }, async () => { throw new Error('boom'); }, { waitMs: 600_000 }), /boom/);
});
