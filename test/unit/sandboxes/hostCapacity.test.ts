import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HostCapacity, SANDBOX_FOOTPRINT_MIB } from '../../../src/sandboxes/hostCapacity.ts';

function host(opts: { avail: number; pressure?: number | null; committed?: number; limit?: number; reserve?: number; cpuMax?: number }) {
  const probes = { memAvailableMib: () => opts.avail, cpuPressure: () => opts.pressure ?? null };
  let committed = opts.committed ?? 0;
  const cap = new HostCapacity({ memoryMib: opts.limit ?? 0, reserveMib: opts.reserve ?? 512, cpuPressureMax: opts.cpuMax ?? 90 }, () => committed, probes);
  return { cap, setCommitted: (n: number) => { committed = n; } };
}

const refused = (fn: () => unknown, re: RegExp) => assert.throws(fn, (e: any) => e.code === 'host_at_capacity' && e.status === 503 && e.retryAfterSecs > 0 && re.test(e.message));

test('memory: admits while MemAvailable stays above the reserve, counting operations under way', () => {
  const { cap } = host({ avail: 512 + 3 * SANDBOX_FOOTPRINT_MIB });
  const a = cap.admit('create', 1, 256);
  const b = cap.admit('create', 2, 256);
  // Three footprints are taken by operations under way, though MemAvailable has not moved yet.
  refused(() => cap.admit('create', 1, 256), /keeps 512 MiB in reserve .*COLLIMATE_HOST_MEMORY_RESERVE_MIB/);
  a.release();
  a.release(); // idempotent
  cap.admit('fork', 1, 256).release();
  b.release();
  assert.equal(cap.status().memory.startingMib, 0);
  assert.equal(cap.status().refusals.memory, 1);
});

test('memory: the guest-memory cap counts running and starting sandboxes; 0 means no cap', () => {
  const { cap, setCommitted } = host({ avail: 100_000, limit: 1024, committed: 512 });
  const r = cap.admit('resume', 1, 256);
  refused(() => cap.admit('fork', 2, 256), /may have 1024 MiB .*768 MiB is in use or starting.*fork of 2 sandboxes of 256 MiB/);
  r.release();
  setCommitted(768);
  cap.admit('create', 1, 256).release();
  refused(() => cap.admit('create', 1, 512), /COLLIMATE_HOST_MEMORY_MIB/);
  const free = host({ avail: 100_000, limit: 0, committed: 1_000_000 }).cap;
  free.admit('create', 64, 4096).release();
  assert.equal(free.status().memory.limitMib, null);
});

test('CPU: refused at the pressure limit, admitted below it, never when the limit is 0 or the kernel has no PSI', () => {
  refused(() => host({ avail: 100_000, pressure: 93.5, cpuMax: 90 }).cap.admit('create', 1, 256), /CPUs are saturated .*94% .*COLLIMATE_HOST_CPU_PRESSURE_MAX/);
  host({ avail: 100_000, pressure: 89.9, cpuMax: 90 }).cap.admit('create', 1, 256).release();
  host({ avail: 100_000, pressure: 100, cpuMax: 0 }).cap.admit('create', 1, 256).release();
  host({ avail: 100_000, pressure: null, cpuMax: 90 }).cap.admit('create', 1, 256).release();
  const { cap } = host({ avail: 100_000, pressure: 99, cpuMax: 90 });
  refused(() => cap.admit('create', 1, 256), /saturated/);
  assert.deepEqual(cap.status().refusals, { memory: 0, cpu: 1 });
  assert.deepEqual(cap.status().cpu, { pressure: 99, max: 90 });
});

test('within: the reservation ends with the operation, whether it succeeds or fails', async () => {
  const { cap } = host({ avail: 512 + SANDBOX_FOOTPRINT_MIB });
  await assert.rejects(cap.within('create', 1, 256, async () => {
    refused(() => cap.admit('create', 1, 256), /reserve/);
    throw new Error('boom');
  }), /boom/);
  assert.equal(await cap.within('create', 1, 256, async () => 7), 7);
  assert.equal(cap.status().memory.startingMib, 0);
});
