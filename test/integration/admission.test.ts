/**
 * Admission by what the host has (src/sandboxes/hostCapacity.ts), over HTTP on real VMs: sandboxes
 * are held until the host's budget refuses a create, a fork and a resume with 503 host_at_capacity
 * and Retry-After; once some are deleted, creates succeed again. And a create that arrives while
 * the host's CPUs are saturated (real PSI readings, two busy-loop guests) is refused the same way.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import '../../src/service/migrations.ts';
import { loadConfig } from '../../src/config.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { procProbes } from '../../src/sandboxes/hostCapacity.ts';
import { checkResponse } from '../unit/api/helpers.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, type Served } from './fixture.ts';

let engine: Engine;
let api: Served;
let home: string;
let base: string;
let key: string;

/** Room for three 256 MiB sandboxes. */
const LIMIT_MIB = 768;

before(async () => {
  home = testHome('admission');
  engine = await openEngine(home, { host: { ...loadConfig({ home }).host, memoryMib: LIMIT_MIB, cpuPressureMax: 0 } });
  api = await serveEngine(engine, { logger: false, health: () => ({ ready: engine.isReady(), accel: engine.accel, capacity: engine.capacity() }) });
  base = await api.app.listen({ host: '127.0.0.1', port: 0 });
  key = api.keys.create({ tenant: 'acme', tier: 'enterprise' }).key;
});

after(async () => {
  await api.close(1000);
  await assertNoLeaks(engine, home);
});

async function call(op: string | null, method: string, path: string, body?: unknown): Promise<{ status: number; headers: Headers; json: any }> {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  const h: Record<string, string> = {};
  res.headers.forEach((v, k) => { h[k] = v; });
  // Every answer, the refusals included, is what the OpenAPI document says.
  checkResponse(op, { statusCode: res.status, headers: h, body: text, json: () => JSON.parse(text) } as any);
  return { status: res.status, headers: res.headers, json: text ? JSON.parse(text) : null };
}

function assertRefused(r: { status: number; headers: Headers; json: any }, resource: string, mentions: RegExp): void {
  assert.equal(r.status, 503, JSON.stringify(r.json));
  assert.equal(r.json.error.code, 'host_at_capacity');
  assert.match(r.json.error.message, mentions);
  assert.ok(Number(r.headers.get('retry-after')) > 0, 'a Retry-After delay');
}

test('sandboxes are held until the host budget refuses create, fork and resume with host_at_capacity; after deletes, creates succeed again', async () => {
  const held: string[] = [];
  for (let i = 0; i < 3; i++) {
    const r = await call('createSandbox', 'POST', '/v1/sandboxes', { template: 'base' });
    assert.equal(r.status, 201, JSON.stringify(r.json));
    held.push(r.json.id);
  }
  const health = await call('health', 'GET', '/healthz');
  assert.equal(health.json.capacity.memory.committed_mib, LIMIT_MIB);
  assert.equal(health.json.capacity.memory.limit_mib, LIMIT_MIB);

  assertRefused(await call('createSandbox', 'POST', '/v1/sandboxes', { template: 'base' }), 'memory', /COLLIMATE_HOST_MEMORY_MIB/);
  assertRefused(await call('forkSandbox', 'POST', `/v1/sandboxes/${held[0]}/fork`, { count: 1 }), 'memory', /fork of a 256 MiB sandbox/);
  // A refusal leaves nothing behind: the same three sandboxes, all running and answering.
  const list = (await call('listSandboxes', 'GET', '/v1/sandboxes')).json;
  assert.deepEqual(list.sandboxes.map((s: any) => s.id).sort(), [...held].sort());

  // Suspend one (it frees its share), take the room with a new one, and the resume must wait.
  assert.equal((await call('suspendSandbox', 'POST', `/v1/sandboxes/${held[2]}/suspend`, {})).status, 200);
  const filler = await call('createSandbox', 'POST', '/v1/sandboxes', { template: 'base' });
  assert.equal(filler.status, 201);
  assertRefused(await call('resumeSandbox', 'POST', `/v1/sandboxes/${held[2]}/resume`, {}), 'memory', /resume of a 256 MiB sandbox/);
  assert.equal((await call('getSandbox', 'GET', `/v1/sandboxes/${held[2]}`)).json.state, 'suspended', 'still suspended, intact');
  const refusals = (await call('health', 'GET', '/healthz')).json.capacity.refusals.memory;
  assert.equal(refusals, 3);

  // Deletes make room: the resume and a create succeed, and every sandbox runs.
  for (const id of [held[0], filler.json.id]) assert.equal((await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
  assert.equal((await call('resumeSandbox', 'POST', `/v1/sandboxes/${held[2]}/resume`, {})).status, 200);
  const again = await call('createSandbox', 'POST', '/v1/sandboxes', { template: 'base' });
  assert.equal(again.status, 201);
  for (const id of [held[1], held[2], again.json.id]) {
    const r = await call('execSandbox', 'POST', `/v1/sandboxes/${id}/exec`, { command: 'echo ok' });
    assert.equal(r.json.stdout, 'ok\n');
    await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`);
  }
});

test('a create that arrives while the host\'s CPUs are saturated (PSI, two busy-loop guests) is refused with host_at_capacity', async () => {
  if (procProbes.cpuPressure() === null) return assert.fail('this kernel reports no CPU pressure (/proc/pressure/cpu)');
  // Two guests spinning on the two cores: every other runnable task now waits.
  const busy: string[] = [];
  for (let i = 0; i < 2; i++) {
    const id = (await engine.create({ template: 'base' }, { tenant: 'acme' })).id;
    await engine.exec(id, { command: '(while :; do :; done) >/dev/null 2>&1 & echo started' });
    busy.push(id);
  }
  const limit = 5;
  const deadline = Date.now() + 60_000;
  while ((procProbes.cpuPressure() ?? 0) < limit + 1) {
    assert.ok(Date.now() < deadline, `CPU pressure stayed at ${procProbes.cpuPressure()}% with two busy guests`);
    await sleep(500);
  }
  const home2 = testHome('admission-cpu');
  const strict = await openEngine(home2, { poolSize: 0, host: { ...loadConfig({ home: home2 }).host, cpuPressureMax: limit } });
  try {
    await assert.rejects(strict.create({ template: 'base' }, { tenant: 'acme' }), (e: any) => {
      assert.equal(e.code, 'host_at_capacity');
      assert.equal(e.status, 503);
      assert.ok(e.retryAfterSecs > 0);
      assert.match(e.message, /CPUs are saturated .*COLLIMATE_HOST_CPU_PRESSURE_MAX/);
      return true;
    });
    assert.equal(strict.capacity().refusals.cpu, 1);
    assert.equal(strict.repo.live().length, 0, 'nothing half-made');
  } finally {
    await assertNoLeaks(strict, home2);
    for (const id of busy) await engine.delete(id);
  }
});
