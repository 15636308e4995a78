/**
 * Snapshots on real VMs (src/sandboxes/snapshots.ts): a moment of a sandbox with a running counter
 * process and files, kept; ten sandboxes started from it continue the counter with fresh
 * identities; a rollback returns the sandbox's files and process to the snapshot's after they
 * changed; snapshots survive a restart, and a SIGKILL while one is taken leaves it whole or absent.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { isAlive, procStartTicks } from '../../src/vmm/vmm.ts';
import { CollimateError } from '../../src/errors.ts';
import { assertNoLeaks, openEngine, serveEngine, TEST_CACHE, testHome } from './fixture.ts';

const tenant = { tenant: 'snap' };
let engine: Engine;
let home: string;
/** A fault point of the engine's that throws while set (and how often it did). */
const failing = { at: '', hits: 0 };

before(async () => {
  home = testHome('snapshots');
  engine = await openEngine(home, {
    poolSize: 1,
    faultPoint: (name) => {
      if (name !== failing.at) return;
      failing.hits++;
      throw new Error(`fault injected at ${name}`);
    },
  });
});
after(async () => {
  await assertNoLeaks(engine, home);
});

async function sh(id: string, command: string): Promise<string> {
  const r = await engine.exec(id, { command }, tenant);
  assert.equal(r.exit_code, 0, `${command}: ${r.stderr}`);
  return r.stdout.trim();
}

/**
 * A counter whose tag lives only in its process's memory: it reads /root/secret once and removes
 * it, then writes "<tag> <n>" to /root/counter five times a second. A sandbox that shows the tag
 * counting runs that process, with its memory.
 */
const COUNTER = 'head -c 6 /dev/urandom | od -An -tx1 | tr -d " \\n" > /root/secret; '
  + '(read tag < /root/secret; rm /root/secret; i=0; while true; do i=$((i+1)); echo "$tag $i" > /root/c.new; mv /root/c.new /root/counter; sleep 0.2; done) >/dev/null 2>&1 & '
  + 'sleep 0.5; cut -d" " -f1 /root/counter';

async function counter(id: string): Promise<{ tag: string; n: number }> {
  const [tag, n] = (await sh(id, 'cat /root/counter')).split(' ');
  return { tag, n: Number(n) };
}

/** The counter with tag `tag` counts on past `from` (waited for, not timed). */
async function countsOn(id: string, tag: string, from: number): Promise<number> {
  const deadline = Date.now() + 30_000;
  let c = await counter(id);
  while (c.tag === tag && c.n <= from && Date.now() < deadline) {
    await sleep(250);
    c = await counter(id);
  }
  assert.equal(c.tag, tag, `${id} runs the snapshot's counter process (its tag is only in that process's memory)`);
  assert.ok(c.n > from, `${id}: the counter counts on past ${from} (${c.n} after 30 s)`);
  return c.n;
}

function refused(code: string) {
  return (e: unknown) => e instanceof CollimateError && e.code === code;
}

test('a snapshot of a running sandbox; 10 sandboxes from it continue its counter process with fresh identities; the source runs on', async () => {
  const src = await engine.create({ template: 'base' }, tenant);
  const tag = await sh(src.id, COUNTER);
  await sh(src.id, 'echo kept > /root/file; sync');
  const before = (await counter(src.id)).n;
  const snap = await engine.createSnapshot(src.id, { name: 'mid-episode', labels: { run: 'a' } }, tenant);
  assert.match(snap.id, /^snap_/);
  assert.equal(snap.sandbox_id, src.id);
  assert.equal(snap.template, 'base');
  assert.equal(snap.name, 'mid-episode');
  assert.ok(snap.size_bytes > 0, 'its size is what its files take');
  // The source runs on, and moves away from the snapshot.
  const atSnap = await countsOn(src.id, tag, before);
  await sh(src.id, 'echo changed > /root/file; sync');

  const kids = await engine.startFromSnapshot(snap.id, { count: 10, labels: { from: 'snap' } }, tenant);
  assert.equal(kids.length, 10);
  for (const k of kids) {
    assert.equal(k.from_snapshot, snap.id);
    assert.equal(k.labels.from, 'snap');
    assert.equal(k.state, 'running');
  }
  const ids = kids.map((k) => k.id);
  for (const id of ids) {
    assert.equal(await sh(id, 'cat /root/file'), 'kept', 'the snapshot\'s files, not what the source wrote after');
    const c = await counter(id);
    assert.equal(c.tag, tag);
    assert.ok(c.n >= before, `the counter continues from the snapshot (${c.n} ≥ ${before})`);
    await countsOn(id, tag, c.n);
  }
  const rand = await Promise.all([src.id, ...ids].map((id) => sh(id, 'head -c 32 /dev/urandom | od -An -tx1 | tr -d " \\n"')));
  assert.equal(new Set(rand).size, 11, 'every sandbox from the snapshot has its own random stream');
  const boots = await Promise.all([src.id, ...ids].map((id) => sh(id, 'cat /proc/sys/kernel/random/boot_id')));
  assert.equal(new Set(boots).size, 11, 'and its own boot id');
  // Listed, inspected; another tenant sees none of it.
  assert.deepEqual(engine.listSnapshots({}, tenant).snapshots.map((s) => s.id), [snap.id]);
  assert.deepEqual(engine.listSnapshots({ labels: { run: 'b' } }, tenant).snapshots, []);
  assert.equal(engine.getSnapshot(snap.id, tenant).size_bytes, snap.size_bytes);
  assert.throws(() => engine.getSnapshot(snap.id, { tenant: 'other' }), refused('snapshot_not_found'));
  await assert.rejects(engine.startFromSnapshot(snap.id, { count: 1 }, { tenant: 'other' }), refused('snapshot_not_found'));
  await assert.rejects(engine.startFromSnapshot(snap.id, { count: 0 }, tenant), refused('validation_error'));

  // Deleted while sandboxes run from it: they run on; its files go with the last of them.
  engine.deleteSnapshot(snap.id, tenant);
  assert.throws(() => engine.getSnapshot(snap.id, tenant), refused('snapshot_not_found'));
  await countsOn(ids[0], tag, atSnap);
  for (const id of ids) await engine.delete(id, tenant);
  await engine.delete(src.id, tenant);
  assert.deepEqual(readdirSync(join(home, 'forkpoints')), [], 'nothing of the snapshot is left once nothing depends on it');
});

test('a snapshot started again gets warm capacity: its pool restores VMMs ahead, the next start claims them, and they are sandboxes of their own; deleting it destroys the pool', async () => {
  const src = await engine.create({ template: 'base' }, tenant);
  const tag = await sh(src.id, COUNTER);
  const snap = await engine.createSnapshot(src.id, {}, tenant);
  const key = `snapshot:${snap.id}`;
  const first = await engine.startFromSnapshot(snap.id, { count: 1 }, tenant);
  assert.equal(engine.poolStatus()[key], undefined, 'started once, a snapshot has no pool');
  const second = await engine.startFromSnapshot(snap.id, { count: 2 }, tenant);
  assert.deepEqual([engine.poolStatus()[key]?.hits, engine.poolStatus()[key]?.misses], [0, 2], 'started again: a pool, sized by what was asked of it');
  const deadline = Date.now() + 180_000;
  while ((engine.poolStatus()[key]?.ready ?? 0) < 2 && Date.now() < deadline) await sleep(250);
  assert.equal(engine.poolStatus()[key]?.ready, 2, `the pool restored two VMMs ahead: ${JSON.stringify(engine.poolStatus()[key])}`);
  const warm = await engine.startFromSnapshot(snap.id, { count: 2, labels: { warm: 'yes' } }, tenant);
  assert.equal(engine.poolStatus()[key]?.hits, 2, 'the start was served from the pool');
  for (const k of warm) {
    assert.equal(k.from_snapshot, snap.id);
    assert.equal(k.labels.warm, 'yes');
    const c = await counter(k.id);
    assert.equal(c.tag, tag, 'a pooled sandbox runs the snapshot\'s counter process');
    await countsOn(k.id, tag, c.n);
  }
  await sh(warm[0].id, 'echo mine > /root/own; sync');
  assert.equal(await sh(warm[1].id, 'cat /root/own 2>/dev/null || echo none'), 'none', 'each has a disk of its own');
  const all = [src, ...first, ...second, ...warm].map((s) => s.id);
  const boots = await Promise.all(all.map((id) => sh(id, 'cat /proc/sys/kernel/random/boot_id')));
  assert.equal(new Set(boots).size, all.length, 'each claimed sandbox has a fresh identity');
  const rand = await Promise.all(all.map((id) => sh(id, 'head -c 32 /dev/urandom | od -An -tx1 | tr -d " \\n"')));
  assert.equal(new Set(rand).size, all.length, 'and its own random stream');
  engine.deleteSnapshot(snap.id, tenant);
  assert.equal(engine.poolStatus()[key], undefined, 'the snapshot\'s pool goes with it');
  for (const id of all) await engine.delete(id, tenant);
});

test('a snapshot promoted to an environment: a create with its name, through the REST door, starts a sandbox from it with its files and running process', async () => {
  const api = await serveEngine(engine);
  try {
    const key = api.keys.create({ tenant: tenant.tenant, tier: 'pro' }).key;
    const call = (method: 'GET' | 'POST', url: string, payload?: unknown) => api.app.inject({ method, url, headers: { authorization: `Bearer ${key}` }, ...(payload === undefined ? {} : { payload: payload as object }) });
    const src = await engine.create({ template: 'base' }, tenant);
    const tag = await sh(src.id, COUNTER);
    await sh(src.id, 'echo prepared > /root/state; sync');
    const snap = await engine.createSnapshot(src.id, {}, tenant);
    const promoted = await call('POST', `/v1/snapshots/${snap.id}/promote`, { environment: 'prepared-env' });
    assert.equal(promoted.statusCode, 200, promoted.body);
    const listed = (await call('GET', '/v1/templates')).json().templates.find((t: { id: string }) => t.id === 'prepared-env');
    assert.deepEqual([listed?.kind, listed?.snapshot_id], ['snapshot', snap.id]);
    const made = await call('POST', '/v1/sandboxes', { template: 'prepared-env' });
    assert.equal(made.statusCode, 201, made.body);
    const id = made.json().id as string;
    assert.equal(made.json().from_snapshot, snap.id);
    assert.equal(await sh(id, 'cat /root/state'), 'prepared', "the snapshot's files");
    const c = await counter(id);
    assert.equal(c.tag, tag, "and its running process");
    await countsOn(id, tag, c.n);
    assert.notEqual(await sh(id, 'cat /proc/sys/kernel/random/boot_id'), await sh(src.id, 'cat /proc/sys/kernel/random/boot_id'), 'a fresh identity');
    engine.deleteSnapshot(snap.id, tenant);
    assert.equal((await call('POST', '/v1/sandboxes', { template: 'prepared-env' })).json().error.code, 'template_not_found', 'the name goes with the snapshot');
    for (const s of [id, src.id]) await engine.delete(s, tenant);
  } finally {
    await api.close();
  }
});

test('rollback in place: the sandbox\'s files and counter process return to the snapshot\'s after they changed; queued requests fail saying so; another sandbox\'s snapshot is refused', async () => {
  const src = await engine.create({ template: 'base' }, tenant);
  const tag = await sh(src.id, COUNTER);
  await sh(src.id, 'echo kept > /root/file; sync');
  const snap = await engine.createSnapshot(src.id, {}, tenant);
  // Everything changes: the counter process is killed, its file and ours overwritten.
  await sh(src.id, 'pkill -f "mv /root/c.new" ; kill $(pgrep -f "read tag") 2>/dev/null; sleep 0.3; echo "gone 999999" > /root/counter; echo changed > /root/file; sync');
  assert.equal(await sh(src.id, 'cat /root/file'), 'changed');

  const rolling = engine.restore(src.id, snap.id, tenant);
  const queued = engine.exec(src.id, { command: 'echo queued' }, tenant).then(() => null, (e: unknown) => e);
  const back = await rolling;
  assert.ok(refused('sandbox_restored')(await queued), `a request queued behind the rollback fails saying why: ${String(await queued)}`);
  assert.equal(back.id, src.id);
  assert.equal(back.state, 'running');
  assert.equal(back.from_snapshot, snap.id);
  assert.equal(await sh(src.id, 'cat /root/file'), 'kept');
  const c = await counter(src.id);
  assert.equal(c.tag, tag, 'the snapshot\'s counter process runs again');
  assert.ok(c.n < 999999);
  await countsOn(src.id, tag, c.n);

  // Rolled back again, from suspended: it stays suspended, at the snapshot's moment.
  await sh(src.id, 'echo again > /root/file; sync');
  await engine.suspend(src.id, tenant);
  const still = await engine.restore(src.id, snap.id, tenant);
  assert.equal(still.state, 'suspended');
  await engine.resume(src.id, tenant);
  assert.equal(await sh(src.id, 'cat /root/file'), 'kept');
  assert.equal((await counter(src.id)).tag, tag);

  const other = await engine.create({ template: 'base' }, tenant);
  await assert.rejects(engine.restore(other.id, snap.id, tenant), refused('snapshot_mismatch'));
  await assert.rejects(engine.restore(src.id, 'snap_0000000000000000', tenant), refused('snapshot_not_found'));
  await engine.delete(other.id, tenant);
  // A snapshot of a suspended sandbox, started from.
  await engine.suspend(src.id, tenant);
  const ofSuspended = await engine.createSnapshot(src.id, {}, tenant);
  const [kid] = await engine.startFromSnapshot(ofSuspended.id, { count: 1 }, tenant);
  assert.equal(await sh(kid.id, 'cat /root/file'), 'kept');
  await countsOn(kid.id, tag, (await counter(kid.id)).n);
  assert.equal(engine.get(src.id, tenant).state, 'suspended', 'the suspended sandbox stays suspended');
  await engine.resume(src.id, tenant);
  assert.equal(await sh(src.id, 'cat /root/file'), 'kept');
  await engine.delete(kid.id, tenant);
  await engine.delete(src.id, tenant);
  // The snapshots outlive the sandbox they were taken of; a start from them still works.
  const [late] = await engine.startFromSnapshot(snap.id, { count: 1 }, tenant);
  assert.equal(await sh(late.id, 'cat /root/file'), 'kept');
  await engine.delete(late.id, tenant);
  engine.deleteSnapshot(snap.id, tenant);
  engine.deleteSnapshot(ofSuspended.id, tenant);
});

test("rollback onto the snapshot's warm pool: a VMM restored ahead becomes the sandbox (same id), with the snapshot's files and process; it suspends, resumes and forks as any", async () => {
  const src = await engine.create({ template: 'base' }, tenant);
  const tag = await sh(src.id, COUNTER);
  await sh(src.id, 'echo kept > /root/file; sync');
  const snap = await engine.createSnapshot(src.id, {}, tenant);
  const key = `snapshot:${snap.id}`;
  // Used twice (a start, then a rollback): its pool forms.
  for (const k of await engine.startFromSnapshot(snap.id, { count: 1 }, tenant)) await engine.delete(k.id, tenant);
  await sh(src.id, 'echo changed > /root/file; sync');
  await engine.restore(src.id, snap.id, tenant);
  assert.equal(await sh(src.id, 'cat /root/file'), 'kept');
  const deadline = Date.now() + 180_000;
  while ((engine.poolStatus()[key]?.ready ?? 0) < 1 && Date.now() < deadline) await sleep(250);
  const hits = engine.poolStatus()[key]?.hits ?? 0;
  assert.ok((engine.poolStatus()[key]?.ready ?? 0) >= 1, `the pool restored a VMM ahead: ${JSON.stringify(engine.poolStatus()[key])}`);

  await sh(src.id, 'pkill -f "mv /root/c.new" ; kill $(pgrep -f "read tag") 2>/dev/null; sleep 0.3; echo "gone 999999" > /root/counter; echo changed > /root/file; sync');
  const old = engine.repo.get(src.id)!.vmm!;
  const back = await engine.restore(src.id, snap.id, tenant);
  assert.equal(engine.poolStatus()[key]?.hits, hits + 1, 'the rollback claimed the pool\'s VMM');
  assert.deepEqual([back.id, back.state, back.from_snapshot], [src.id, 'running', snap.id]);
  assert.equal(await sh(src.id, 'cat /root/file'), 'kept');
  const c = await counter(src.id);
  assert.equal(c.tag, tag, 'the snapshot\'s counter process runs again');
  await countsOn(src.id, tag, c.n);
  // Onto the pool's VMM nothing of a suspend is made, and the old VMM and its files go after the answer.
  await engine.settled();
  const own = join(home, 'sandboxes', src.id);
  assert.deepEqual(existsSync(own) ? readdirSync(own).filter((f) => f.startsWith('suspend')) : [], [], 'no suspend image is left');
  const held = new Set([engine.repo.get(src.id)!.vmm!.diskPath, ...engine.repo.allForkPoints().map((f) => f.disk_path)]);
  const layers = readdirSync(join(home, 'disks')).map((f) => join(home, 'disks', f));
  assert.deepEqual(layers.filter((p) => (p.includes(`/${src.id}-`) || p === old.diskPath) && !held.has(p)), [], 'no layer of the sandbox is left that nothing holds');
  assert.equal(isAlive(old.pid) && procStartTicks(old.pid) === old.startTicks, false, `its old VMM (pid ${old.pid}) is gone`);
  if (old.dir !== own) assert.equal(existsSync(old.dir), false, 'the directory of the pool VMM it ran in went with it');

  // A pool VMM that fails its claim: the rollback goes the usual way (a suspend image, resumed).
  await sh(src.id, 'echo changed > /root/file; sync');
  while ((engine.poolStatus()[key]?.ready ?? 0) < 1 && Date.now() < deadline + 180_000) await sleep(250);
  assert.ok((engine.poolStatus()[key]?.ready ?? 0) >= 1, `the pool restored a VMM ahead again: ${JSON.stringify(engine.poolStatus()[key])}`);
  failing.at = 'restore:pool-claim';
  const fellBack = await engine.restore(src.id, snap.id, tenant).finally(() => { failing.at = ''; });
  assert.equal(failing.hits, 1, 'the claim was tried, and failed');
  assert.deepEqual([fellBack.id, fellBack.state, fellBack.from_snapshot], [src.id, 'running', snap.id]);
  assert.equal(await sh(src.id, 'cat /root/file'), 'kept');
  await countsOn(src.id, tag, (await counter(src.id)).n);
  // A sandbox on a pooled VMM lives on as any: suspended and resumed, forked.
  await engine.suspend(src.id, tenant);
  await engine.resume(src.id, tenant);
  await countsOn(src.id, tag, (await counter(src.id)).n);
  const [child] = await engine.fork(src.id, { count: 1 }, tenant);
  assert.equal(await sh(child.id, 'cat /root/file'), 'kept');
  await engine.delete(child.id, tenant);
  await engine.delete(src.id, tenant);
  engine.deleteSnapshot(snap.id, tenant);
});

test('a snapshot survives a server restart: listed, started from, rolled back to', async () => {
  // The restart is this file's engine closed and opened again on its home (after() checks the
  // restarted one for leaks): a home of its own would cost an engine and a warm pool more.
  const src = await engine.create({ template: 'base' }, tenant);
  const tag = await sh(src.id, COUNTER);
  await sh(src.id, 'echo kept > /root/file; sync');
  const snap = await engine.createSnapshot(src.id, { name: 'kept' }, tenant);
  await engine.close();
  engine = await openEngine(home, { poolSize: 1 });
  assert.deepEqual(engine.listSnapshots({}, tenant).snapshots.map((s) => [s.id, s.name]), [[snap.id, 'kept']]);
  const [kid] = await engine.startFromSnapshot(snap.id, { count: 1 }, tenant);
  assert.equal(await sh(kid.id, 'cat /root/file'), 'kept');
  await countsOn(kid.id, tag, (await counter(kid.id)).n);
  await sh(src.id, 'echo changed > /root/file; sync');
  await engine.restore(src.id, snap.id, tenant);
  assert.equal(await sh(src.id, 'cat /root/file'), 'kept');
  for (const id of [kid.id, src.id]) await engine.delete(id, tenant);
  engine.deleteSnapshot(snap.id, tenant);
});

// ---- a server SIGKILLed while it takes a snapshot ------------------------------------------------

const worker = fileURLToPath(new URL('./crashWorker.ts', import.meta.url));

function runWorker(crashHome: string, args: string[], crashAt?: string): Promise<string> {
  return new Promise((resolve) => {
    execFile(process.execPath, ['--import', 'tsx', worker, crashHome, TEST_CACHE, ...args], {
      env: { ...process.env, ...(crashAt ? { COLLIMATE_CRASH_AT: crashAt } : {}) },
      timeout: 180_000,
    }, (_err, stdout) => resolve(stdout));
  });
}

// The points a fork's own crash tests do not cover for a snapshot: its sandbox stopped with its
// memory captured into an image nobody holds yet, and its files whole but not yet recorded as such.
for (const point of ['fork:after-migrate', 'snapshot:before-ready']) {
  test(`SIGKILL while a snapshot is taken, at ${point}: after restart it is whole or absent, and the sandbox runs on`, async () => {
    const crashHome = testHome('crash-snapshot');
    const { id } = JSON.parse((await runWorker(crashHome, ['setup'])).trim().split('\n').pop()!);
    await runWorker(crashHome, ['snapshot', id], point);
    const e2 = await openEngine(crashHome, { poolSize: 1 });
    try {
      assert.equal(e2.get(id).state, 'running');
      assert.equal((await e2.exec(id, { command: 'cat /root/marker' })).stdout.trim(), 'before');
      const snaps = e2.listSnapshots({}, { tenant: 'crash' }).snapshots;
      assert.deepEqual(snaps, [], 'a snapshot the crash caught before it was whole is gone');
      // Nothing of it is left beyond the fork point the sandbox's disk sits on: its RAM image goes
      // (removed in the background once the restart collected it).
      const images = () => readdirSync(join(crashHome, 'forkpoints')).filter((d) => existsSync(join(crashHome, 'forkpoints', d, 'ram.img')));
      for (let i = 0; i < 100 && images().length > 0; i++) await sleep(100);
      assert.deepEqual(images(), [], 'no RAM image of the cut-off snapshot is left');
      // The sandbox can be snapshotted again, and that snapshot is whole.
      const snap = await e2.createSnapshot(id, {}, { tenant: 'crash' });
      const [kid] = await e2.startFromSnapshot(snap.id, { count: 1 }, { tenant: 'crash' });
      assert.equal((await e2.exec(kid.id, { command: 'cat /root/marker' })).stdout.trim(), 'before');
    } finally {
      await assertNoLeaks(e2, crashHome);
    }
  });
}
