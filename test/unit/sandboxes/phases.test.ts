import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { Phases } from '../../../src/sandboxes/phases.ts';
import { fixture } from '../api/helpers.ts';

test('Phases: timed phases, the slowest of parallel ones, a total that spans them', async () => {
  const p = new Phases('fork');
  // What the phase may take is bounded by the wall time around it, not by a fixed figure a loaded
  // machine can exceed.
  const t0 = performance.now();
  await p.time('stop', () => sleep(20));
  const stopWall = performance.now() - t0;
  await Promise.all([p.time('agent_ack', () => sleep(10)), p.time('agent_ack', () => sleep(40))]);
  await assert.rejects(p.time('recv_spawn', async () => { await sleep(5); throw new Error('boom'); }), /boom/);
  const r = p.report('sbx_000000000001');
  assert.equal(r.op, 'fork');
  assert.equal(r.id, 'sbx_000000000001');
  assert.ok(r.phases.stop >= 19 && r.phases.stop <= stopWall, `stop ${r.phases.stop} within its ${stopWall} ms`);
  assert.ok(r.phases.agent_ack >= 39, `the slowest child counts (${r.phases.agent_ack})`);
  assert.ok(r.phases.recv_spawn >= 4, 'a failed phase is still timed');
  assert.ok(r.totalMs >= r.phases.stop + r.phases.agent_ack);
});

test('CPU time is summed over children, and the server\'s own is measured over the operation', () => {
  const p = new Phases('fork');
  p.addCpu('children_vmm', 30);
  p.addCpu('children_vmm', 45);
  const spinUntil = process.cpuUsage().user + 20_000;
  while (process.cpuUsage().user < spinUntil) { /* 20 ms of the server's own CPU */ }
  const r = p.report('sbx_000000000001');
  assert.equal(r.cpuMs.children_vmm, 75, 'summed, not the largest');
  assert.ok(r.cpuMs.server >= 20, `the server's CPU over the operation (${r.cpuMs.server} ms)`);
  assert.equal(r.phases.children_vmm, undefined, 'CPU time is not a phase of the histogram');
});

test('the engine\'s phase reports become the collimate_lifecycle_phase_seconds histogram', async () => {
  const f = await fixture({ fake: { events: true } });
  try {
    f.svc.emit('phases', { op: 'fork', id: 'sbx_000000000001', phases: { stop: 3, memory_capture: 250 }, cpuMs: { server: 12 }, totalMs: 400 });
    const text = (await f.req('metrics', { url: '/metrics' })).body;
    assert.match(text, /collimate_lifecycle_phase_seconds_count\{op="fork",phase="memory_capture"\} 1/);
    assert.match(text, /collimate_lifecycle_phase_seconds_sum\{op="fork",phase="memory_capture"\} 0\.25\b/);
    assert.match(text, /collimate_lifecycle_phase_seconds_count\{op="fork",phase="total"\} 1/);
  } finally {
    await f.close();
  }
});
