/**
 * The soak's verdict (bench/soak.ts checkSoak) on made-up samples: a run whose measures stay bounded
 * and come back passes; a descriptor, a QEMU process or a RAM file that does not come back, a server
 * whose RSS climbs, a failed operation or a run that did no work each fail it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { checkSoak, soakTable, type Counts, type Sample, type SoakResult } from '../../../bench/soak.ts';

const counts = (): Counts => ({ waves: 10, create: 10, exec: 80, fork: 10, children: 40, suspend: 25, resume: 25, delete: 50, retries_503: 1 });

function run(change: (s: Sample, i: number, n: number) => Partial<Sample> = () => ({}), extra: Partial<SoakResult> = {}): SoakResult {
  const n = 20;
  const samples: Sample[] = Array.from({ length: n }, (_, i) => {
    const waves = i > 0 && i < n - 2;
    const s: Sample = {
      t: i * 10, phase: i === 0 ? 'start' : waves ? 'waves' : 'settle',
      rssMiB: waves ? 160 : 145, fds: waves ? 80 : 36, ramMiB: waves ? 400 : i === 0 ? 0 : 88.5, sparesMiB: i === 0 ? 0 : 88.5, spares: i === 0 ? 0 : 1,
      artifactRamMiB: 1155, qemu: waves ? 18 : 3, dbKiB: 128 + i * 400,
    };
    return { ...s, ...change(s, i, n) };
  });
  return { home: '/tmp/x', minutes: 3, samples, counts: { ts: counts(), py: counts() }, errors: [], leftOver: 0, afterStop: { qemu: 0, ramFiles: [] }, ...extra };
}

test('a run whose measures stay bounded and come back passes, and its table has start, peak and end', () => {
  assert.deepEqual(checkSoak(run()), []);
  assert.match(soakTable(run()), /\| server open fds \| 36 \| 80 \| 36 \|/);
});

test('what did not come back, grew or failed is named', () => {
  const last = (f: (s: Sample) => Partial<Sample>) => run((s, i, n) => (i === n - 1 ? f(s) : {}));
  assert.match(checkSoak(last(() => ({ fds: 41 }))).join('\n'), /server open fds: end 41 not back within 40/);
  assert.match(checkSoak(last(() => ({ qemu: 4 }))).join('\n'), /QEMU processes: end 4 not back within 3/);
  assert.match(checkSoak(last((s) => ({ ramMiB: s.ramMiB + 50 }))).join('\n'), /RAM dir tmpfs/);
  assert.match(checkSoak(last(() => ({ spares: 2 }))).join('\n'), /2 spare fork seeds/);
  assert.match(checkSoak(run((s, i) => (s.phase === 'waves' ? { rssMiB: 150 + i * 8 } : {}))).join('\n'), /server RSS grew/);
  assert.match(checkSoak(run(undefined, { errors: ['py wave 3: ServerError: vmm_failed'] })).join('\n'), /vmm_failed/);
  assert.match(checkSoak(run(undefined, { afterStop: { qemu: 1, ramFiles: ['fp-1.mem'] } })).join('\n'), /1 QEMU processes[\s\S]*fp-1\.mem/);
  assert.match(checkSoak(run(undefined, { leftOver: 2 })).join('\n'), /2 sandboxes still listed/);
  const idle = run(undefined, { counts: { ts: { ...counts(), waves: 0, fork: 0 }, py: counts() } });
  assert.match(checkSoak(idle).join('\n'), /ts: no wave completed[\s\S]*ts: no fork/);
  const undeleted = run(undefined, { counts: { ts: { ...counts(), delete: 49 }, py: counts() } });
  assert.match(checkSoak(undeleted).join('\n'), /ts: 50 sandboxes made, 49 deleted/);
});
