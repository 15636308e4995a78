/**
 * Admission by what the host has (src/sandboxes/hostCapacity.ts), over HTTP on real VMs: sandboxes
 * are held until the host's budget refuses a create, a fork and a resume with 503 host_at_capacity
 * and Retry-After; once some are deleted, creates succeed again. And a create that arrives while
 * the host's CPUs are saturated (real PSI readings, two busy-loop guests) is refused the same way.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { mkdirSync, rmSync, statfsSync } from 'node:fs';
import { join } from 'node:path';
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
  api = await serveEngine(engine);
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

const sh = promisify(execFile);

/** A tmpfs of `mib` MiB mounted for a test at a new directory: a filesystem the test can fill. */
async function smallFs(name: string, mib: number): Promise<{ dir: string; unmount(): Promise<void> }> {
  const dir = testHome(name);
  await sh('mount', ['-t', 'tmpfs', '-o', `size=${mib}m,mode=0755`, 'tmpfs', dir]);
  return { dir, unmount: async () => { await sh('umount', [dir]); rmSync(dir, { recursive: true, force: true }); } };
}

/** Fills the filesystem holding `dir` until about `leaveMib` MiB are free; the filler's path. */
async function fillUntil(dir: string, leaveMib: number): Promise<string> {
  const st = statfsSync(dir);
  const freeMib = Math.floor((st.bavail * st.bsize) / 2 ** 20);
  const filler = join(dir, 'filler');
  await sh('fallocate', ['-l', `${freeMib - leaveMib}M`, filler]);
  return filler;
}

const refusedFor = (resource: string, mentions: RegExp) => (e: any) => {
  assert.equal(e.code, 'host_at_capacity', e.message);
  assert.equal(e.status, 503);
  assert.ok(e.retryAfterSecs > 0);
  assert.equal(e.details.resource, resource);
  assert.match(e.message, mentions);
  return true;
};

test('tmpfs and disk are budgeted: a fork that could fill the RAM files\' tmpfs and a suspend that could fill the home\'s disk are refused naming them; once there is room again both work', async () => {
  const ram = await smallFs('budget-ram', 768);
  const disk = await smallFs('budget-home', 1024);
  const home3 = join(disk.dir, 'home');
  mkdirSync(home3);
  const eng = await openEngine(home3, {
    ramDir: join(ram.dir, 'ram'), poolSize: 0, forkPoolMax: 0,
    host: { ...loadConfig({ home: home3 }).host, cpuPressureMax: 0, tmpfsReserveMib: 64, diskReserveMib: 64 },
  });
  try {
    const s = await eng.create({ template: 'base' }, { tenant: 'acme' });
    await eng.exec(s.id, { command: 'echo kept > /root/f' });
    const mem = eng.repo.get(s.id)!.memory_mib;

    // The RAM files' tmpfs with less free than a fork point may need plus the reserve.
    let filler = await fillUntil(ram.dir, mem);
    await assert.rejects(eng.fork(s.id, { count: 1 }), refusedFor('tmpfs', new RegExp(`tmpfs holding sandboxes' RAM files \\(${ram.dir}/ram\\) has \\d+ MiB free .*COLLIMATE_TMPFS_RESERVE_MIB`)));
    assert.deepEqual(eng.repo.live().map((r) => r.id), [s.id], 'nothing half-made');
    rmSync(filler);
    const [kid] = await eng.fork(s.id, { count: 1 });
    assert.equal((await eng.exec(kid.id, { command: 'cat /root/f' })).stdout, 'kept\n');
    await eng.delete(kid.id);

    // The home's disk with less free than the sandbox's RAM image plus the reserve.
    filler = await fillUntil(disk.dir, mem);
    await assert.rejects(eng.suspend(s.id), refusedFor('disk', new RegExp(`disk holding sandboxes' layers and snapshots \\(${home3}\\) has \\d+ MiB free .*COLLIMATE_DISK_RESERVE_MIB.*delete suspended sandboxes`)));
    assert.equal(eng.repo.get(s.id)!.state, 'running', 'the refused suspend left it running');
    assert.equal((await eng.exec(s.id, { command: 'cat /root/f' })).stdout, 'kept\n');
    rmSync(filler);
    await eng.suspend(s.id);
    await eng.resume(s.id);
    assert.equal((await eng.exec(s.id, { command: 'cat /root/f' })).stdout, 'kept\n');
    const c = eng.capacity();
    assert.equal(c.refusals.tmpfs, 1);
    assert.equal(c.refusals.disk, 1);
    assert.equal(c.tmpfs.path, join(ram.dir, 'ram'));
    assert.ok(c.disk.freeMib > mem);
  } finally {
    await assertNoLeaks(eng, home3);
    await ram.unmount();
    await disk.unmount();
  }
});

test('VMM uids are budgeted: with every uid of the range taken a create is refused naming them; a delete makes room', async () => {
  const home4 = testHome('budget-uids');
  // A range of three uids of its own (no other server or test file uses it).
  const jail = { ...loadConfig({ home: home4 }).jail, uidBase: 410_000, uidCount: 3 };
  const eng = await openEngine(home4, { jail, poolSize: 0, poolMax: 0, prewarmPool: false, forkPoolMax: 0, host: { ...loadConfig({ home: home4 }).host, cpuPressureMax: 0 } });
  try {
    if (eng.capacity().claims.vmm_uids === undefined) return assert.fail('VMMs are not confined here (the server must run as root)');
    const held: string[] = [];
    for (let i = 0; i < 3; i++) held.push((await eng.create({ template: 'base' }, { tenant: 'acme' })).id);
    assert.deepEqual(eng.capacity().claims.vmm_uids, { free: 0, total: 3 });
    await assert.rejects(eng.create({ template: 'base' }, { tenant: 'acme' }), refusedFor('vmm_uids', /0 of its 3 VMM uids free \(COLLIMATE_VMM_UID_BASE, COLLIMATE_VMM_UID_COUNT\)/));
    await assert.rejects(eng.fork(held[0], { count: 1 }), refusedFor('vmm_uids', /fork of a \d+ MiB sandbox needs 1/));
    assert.equal(eng.repo.live().length, 3, 'nothing half-made');
    await eng.delete(held[0]);
    const again = await eng.create({ template: 'base' }, { tenant: 'acme' });
    assert.equal((await eng.exec(again.id, { command: 'echo ok' })).stdout, 'ok\n');
    assert.equal(eng.capacity().refusals.vmm_uids, 2);
  } finally {
    await assertNoLeaks(eng, home4);
  }
});
