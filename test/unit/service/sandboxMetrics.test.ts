/**
 * The metrics sampler (src/service/sandboxMetrics.ts) on the fake service, whose guests' disk use is
 * a base system plus the files written to them: CPU and memory every sample, disk every 30 s (the
 * samples between carry the last reading), null where the guest cannot tell.
 */
import assert from 'node:assert/strict';
import { beforeEach, describe, test } from 'node:test';
import { DISK_SAMPLE_MS, SAMPLE_MS, SandboxMetrics } from '../../../src/service/sandboxMetrics.js';
import type { GuestDiskUsage } from '../../../src/sandboxes/types.js';
import { FAKE_SYSTEM_DISK_BYTES, FakeSandboxService } from '../../support/fakeSandboxService.js';

const MiB = 1048576;
const scope = { tenant: 'acme' };

/** The fake with the engine's host-side reading: 64 MiB resident, a CPU second more per reading. */
class SampledFake extends FakeSandboxService {
  private cpu = 0;
  vmmUsage(ids: readonly string[]): Map<string, { cpuSecs: number; rssBytes: number }> {
    this.cpu++;
    return new Map(ids.map((id) => [id, { cpuSecs: this.cpu, rssBytes: 64 * MiB }]));
  }
}

let now: number;
let svc: SampledFake;
let metrics: SandboxMetrics;

beforeEach(() => {
  now = 1_000_000;
  svc = new SampledFake({ now: () => now });
  metrics = new SandboxMetrics(svc, () => now);
});

const disk = async (id: string) => (await metrics.of(id)).map((s) => [s.diskUsedBytes, s.diskTotalBytes]);

describe('disk use in the samples', () => {
  test('read with the first sample and every 30 s after; the samples between carry the last reading', async () => {
    const id = (await svc.create({ template: 'python' }, scope)).id;
    const total = svc.get(id).disk_mib * MiB;
    await metrics.sample();
    assert.deepEqual(await disk(id), [[FAKE_SYSTEM_DISK_BYTES, total]]);
    await svc.writeFile(id, '/root/twenty', Buffer.alloc(20 * MiB));
    for (let t = SAMPLE_MS; t < DISK_SAMPLE_MS; t += SAMPLE_MS) {
      now += SAMPLE_MS;
      await metrics.sample();
    }
    assert.equal(svc.diskAsked.length, 1, 'asked once in 30 s');
    now += SAMPLE_MS;
    await metrics.sample();
    assert.equal(svc.diskAsked.length, 2);
    const all = await metrics.of(id);
    assert.equal(all.length, DISK_SAMPLE_MS / SAMPLE_MS + 1);
    assert.ok(all.slice(0, -1).every((s) => s.diskUsedBytes === FAKE_SYSTEM_DISK_BYTES), 'the 20 MiB file shows only once read');
    assert.deepEqual([all.at(-1)!.diskUsedBytes, all.at(-1)!.diskTotalBytes], [FAKE_SYSTEM_DISK_BYTES + 20 * MiB, total]);
    assert.ok(all.every((s) => s.memoryMib === 64), 'CPU and memory are sampled every time still');
  });

  test('a sandbox sampled for the first time by a read of its metrics has its disk read before the answer', async () => {
    const id = (await svc.create({ template: 'python' }, scope)).id;
    const samples = await metrics.of(id, undefined, undefined, true);
    assert.equal(samples.length, 1);
    assert.equal(samples[0].diskUsedBytes, FAKE_SYSTEM_DISK_BYTES);
  });

  test('a guest that cannot tell (an older agent) has null disk figures; its CPU and memory are sampled', async () => {
    const id = (await svc.create({ template: 'python' }, scope)).id;
    svc.diskUnreadable.add(id);
    await metrics.sample();
    const [s] = await metrics.of(id);
    assert.deepEqual([s.diskUsedBytes, s.diskTotalBytes, s.memoryMib], [null, null, 64]);
    // Asked again a period later, not at every sample.
    now += SAMPLE_MS;
    await metrics.sample();
    assert.equal(svc.diskAsked.length, 1);
  });

  test('an engine that cannot read disks: null disk figures', async () => {
    const id = (await svc.create({ template: 'python' }, scope)).id;
    const engine = Object.assign(Object.create(svc) as SampledFake, { guestDiskUsage: undefined });
    const m = new SandboxMetrics(engine, () => now);
    await m.sample();
    assert.deepEqual((await m.of(id)).map((s) => s.diskUsedBytes), [null]);
  });

  test('a reading under way is not asked for again; one that lands after the delete is dropped', async () => {
    const id = (await svc.create({ template: 'python' }, scope)).id;
    let asked = 0;
    let answer!: (m: Map<string, GuestDiskUsage>) => void;
    svc.guestDiskUsage = () => {
      asked++;
      return new Promise((resolve) => (answer = resolve));
    };
    const first = metrics.sample();
    now += DISK_SAMPLE_MS;
    void metrics.sample();
    assert.equal(asked, 1, 'still under way: not asked again');
    metrics.forget(id);
    answer(new Map([[id, { totalBytes: 100 * MiB, usedBytes: 10 * MiB }]]));
    await first;
    assert.deepEqual(await metrics.of(id), [], 'nothing of it is kept');
  });

  test("a paused guest's missing reading leaves the last one in the samples", async () => {
    const id = (await svc.create({ template: 'python' }, scope)).id;
    await metrics.sample();
    await svc.writeFile(id, '/root/five', Buffer.alloc(5 * MiB));
    // As the engine leaves out a sandbox the idle pause stopped.
    svc.diskUnreadable.add(id);
    now += DISK_SAMPLE_MS;
    await metrics.sample();
    assert.deepEqual((await disk(id)).map(([used]) => used), [FAKE_SYSTEM_DISK_BYTES, FAKE_SYSTEM_DISK_BYTES]);
    svc.diskUnreadable.delete(id);
    now += DISK_SAMPLE_MS;
    await metrics.sample();
    assert.equal((await metrics.of(id)).at(-1)!.diskUsedBytes, FAKE_SYSTEM_DISK_BYTES + 5 * MiB);
  });
});
