/**
 * Idle pause (src/sandboxes/quiesce.ts) on real VMs: a sandbox with nothing of its own running is
 * paused by the host once idle, and its next request wakes it with its wall clock set; a process
 * left running keeps it awake; fork, suspend/resume and a server restart all work on a paused one,
 * and reading its ports or disk use leaves it paused.
 * And the parent of a live fork, which is stopped while its memory is copied, keeps its clock too.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { QmpClient } from '../../src/vmm/qmp.ts';
import { vmmFiles } from '../../src/vmm/machine.ts';
import { openEngine, testHome, assertNoLeaks } from './fixture.ts';

const tenant = { tenant: 'it-idle' };
const IDLE_SECS = 2;
let engine: Engine;
let home: string;

before(async () => {
  home = testHome('idle-pause');
  engine = await openEngine(home, { idlePauseSecs: IDLE_SECS });
});

after(async () => {
  await assertNoLeaks(engine, home);
});

async function sh(id: string, command: string): Promise<string> {
  const r = await engine.exec(id, { command });
  assert.equal(r.exit_code, 0, `${command}: ${r.stderr}`);
  return r.stdout.trim();
}

/** What QEMU says of the sandbox's VM (`paused`, `running`), asked over its QMP socket while no server holds it. */
async function vmStatus(dir: string): Promise<string> {
  const qmp = await QmpClient.connect(vmmFiles(dir).qmpSocket);
  try { return (await qmp.execute<{ status: string }>('query-status')).status; } finally { qmp.close(); }
}

/**
 * The guest's CLOCK_REALTIME against the host's, to the millisecond: an exec's start time as the
 * guest's agent stamps it (EXEC_RESULT STARTED_NS) must fall between the host's clock before the
 * request and after the answer.
 */
async function clockSkewMs(id: string): Promise<number> {
  const agent = (engine as any).registry.get(id).live.agent;
  const before = Date.now();
  const out = await agent.exec({ commands: [['true']] });
  const after = Date.now();
  const guest = Number(out.result.startedNs / 1_000_000n);
  return guest < before ? guest - before : guest > after ? guest - after : 0;
}

async function until(what: string, ok: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    assert.ok(Date.now() < deadline, what);
    await sleep(100);
  }
}

test('an idle sandbox with nothing of its own running is paused; its next exec wakes it with the wall clock set', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  await sh(p.id, 'echo hello > /root/f');
  await until('paused once idle', () => engine.isIdlePaused(p.id));
  // Paused long enough that a clock left alone would be visibly behind.
  await sleep(6000);
  const hostBefore = Date.now() / 1000;
  const guest = Number(await sh(p.id, 'date +%s'));
  assert.ok(Math.abs(guest - hostBefore) < 2.5, `guest clock ${guest} vs host ${hostBefore.toFixed(1)} after ${6 + IDLE_SECS} s paused`);
  assert.equal(engine.isIdlePaused(p.id), false);
  // Left alone it would be 8 s behind; what remains is the SET_TIME message's own delivery time.
  const skew = await clockSkewMs(p.id);
  assert.ok(Math.abs(skew) <= 100, `and to within a tenth of a second: ${skew} ms`);
  assert.equal(await sh(p.id, 'cat /root/f'), 'hello', 'files and memory as they were');
  assert.equal(engine.get(p.id, tenant).state, 'running', 'clients see running throughout');
  assert.ok(engine.idlePauses().woken >= 1);
  await engine.delete(p.id);
});

test('a process an exec left running keeps the sandbox awake; once it ends the sandbox is paused', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  await sh(p.id, '(i=0; while true; do i=$((i+1)); echo $i > /root/n; sleep 0.2; done) >/dev/null 2>&1 & echo $! > /root/bg');
  await sleep((IDLE_SECS + 3) * 1000);
  assert.equal(engine.isIdlePaused(p.id), false, 'a background process keeps it running');
  const a = Number(await sh(p.id, 'cat /root/n'));
  await sleep(1000);
  assert.ok(Number(await sh(p.id, 'cat /root/n')) > a, 'and it goes on counting');
  await sh(p.id, 'kill $(cat /root/bg)');
  await until('paused once the process is gone', () => engine.isIdlePaused(p.id));
  await engine.delete(p.id);
});

test('a paused sandbox forks, suspends and resumes, and is deleted', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  await sh(p.id, 'echo parent > /root/who');
  await until('paused', () => engine.isIdlePaused(p.id));
  const [child] = await engine.fork(p.id, { count: 1 }, tenant);
  assert.equal(await sh(child.id, 'cat /root/who'), 'parent');
  await until('the parent paused again', () => engine.isIdlePaused(p.id));
  await engine.suspend(p.id, tenant);
  await engine.resume(p.id, tenant);
  assert.equal(await sh(p.id, 'cat /root/who'), 'parent');
  await until('the child paused', () => engine.isIdlePaused(child.id));
  await engine.delete(child.id);
  assert.throws(() => engine.get(child.id, tenant), (e: any) => e.code === 'sandbox_not_found');
  await engine.delete(p.id);
});

test('listing a paused sandbox\'s ports or sampling its disk use does not wake it; a connection to one of its ports does', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  await sh(p.id, 'true');
  assert.ok((await engine.guestDiskUsage([p.id])).get(p.id), 'a running one is read');
  await until('paused', () => engine.isIdlePaused(p.id));
  assert.deepEqual(await engine.openPorts(p.id, tenant), [], 'it runs nothing of its own, so it listens on nothing');
  assert.equal((await engine.guestDiskUsage([p.id])).size, 0, 'a paused one is not asked (its disk stands still)');
  assert.equal(engine.isIdlePaused(p.id), true, 'still paused');
  engine.portTarget(p.id, 8080, tenant);
  await until('woken by the connection', () => !engine.isIdlePaused(p.id), 5000);
  await engine.delete(p.id);
});

test('a server that stops while a sandbox is paused: the next one adopts it running, with its clock set', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  await sh(p.id, 'echo kept > /root/k');
  await until('paused', () => engine.isIdlePaused(p.id));
  const dir = engine.repo.get(p.id)!.vmm!.dir;
  await engine.close();
  assert.equal(await vmStatus(dir), 'paused', 'left paused by the server that stopped');
  await sleep(5000);
  engine = await openEngine(home, { idlePauseSecs: 0 });
  assert.equal(engine.isIdlePaused(p.id), false);
  const guest = Number(await sh(p.id, 'date +%s'));
  assert.ok(Math.abs(guest - Date.now() / 1000) < 2.5, `guest clock ${guest} after being adopted`);
  assert.equal(await sh(p.id, 'cat /root/k'), 'kept');
  await engine.delete(p.id);
});

test('the parent of a live fork keeps its wall clock: it is set again once the parent runs on', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  let paused = 0;
  const onPhases = (r: { op: string; id: string; phases: Record<string, number> }) => { if (r.op === 'fork' && r.id === p.id) paused += r.phases.parent_paused ?? 0; };
  engine.on('phases', onPhases);
  try {
    // Forks until the parent has been stopped 100 ms in all: a clock left alone is that far behind.
    const children = [];
    while (paused < 100 && children.length < 20) children.push(...await engine.fork(p.id, { count: 1 }, tenant));
    assert.ok(paused >= 100, `the parent was stopped ${paused.toFixed(0)} ms by ${children.length} forks`);
    // What remains is each SET_TIME message's delivery time, a fraction of the pause it makes up for.
    const skew = await clockSkewMs(p.id);
    assert.ok(Math.abs(skew) <= paused / 4, `the parent's clock is ${skew} ms off after being stopped ${paused.toFixed(0)} ms by ${children.length} forks`);
    for (const c of children) await engine.delete(c.id);
  } finally {
    engine.off('phases', onPhases);
    await engine.delete(p.id);
  }
});
