import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Engine } from '../../src/sandboxes/engine.ts';
import type { LiveVm } from '../../src/sandboxes/runtime.ts';
import { isAlive } from '../../src/vmm/vmm.ts';
import { openEngine, testHome, assertNoLeaks, TEST_CACHE, qemuProcesses } from './fixture.ts';
import { allocatedBytes, mappingOf, privatePageBytes } from '../../src/vmm/memory.ts';
import { backingChain, jailerFor } from '../../src/vmm/jail.ts';
import { processMatches, readClaim } from '../../src/host/claims.ts';

const tenant = { tenant: 'it-lifecycle' };
let engine: Engine;
let home: string;

before(async () => {
  home = testHome('lifecycle');
  engine = await openEngine(home);
});

after(async () => {
  await assertNoLeaks(engine, home);
});

const COUNTER = '(i=0; while true; do i=$((i+1)); echo $i > /root/counter.new; mv /root/counter.new /root/counter; sleep 0.2; done) >/dev/null 2>&1 & echo $!';

async function sh(id: string, command: string, eng: Engine = engine): Promise<string> {
  const r = await eng.exec(id, { command });
  assert.equal(r.exit_code, 0, `${command}: ${r.stderr}`);
  return r.stdout.trim();
}

async function counter(id: string, eng: Engine = engine): Promise<number> {
  return Number(await sh(id, 'cat /root/counter', eng));
}

/**
 * The counter process counts on past `from`: waited for rather than timed (a step is a `sleep 0.2`
 * and two processes, which a loaded TCG host can stretch past any fixed wait), failing only if it
 * never moves.
 */
async function countsOn(id: string, eng: Engine, from: number, msg = 'the counter process counts on'): Promise<void> {
  const deadline = Date.now() + 20_000;
  let now = await counter(id, eng);
  while (now <= from && Date.now() < deadline) {
    await sleep(250);
    now = await counter(id, eng);
  }
  assert.ok(now > from, `${msg} (${from} then ${now} after 20 s)`);
}

test('live fork: every child runs the parent\'s process with its memory; files are private; identities differ', async () => {
  const parent = await engine.create({ template: 'base', labels: { run: 'fork-test' } }, tenant);
  const pid = await sh(parent.id, COUNTER);
  await sleep(1500);
  const atFork = await counter(parent.id);
  assert.ok(atFork >= 3, `counter should be running in the parent (got ${atFork})`);

  const children = await engine.fork(parent.id, { count: 3, labels: { branch: 'yes' } });
  assert.equal(children.length, 3);
  for (const c of children) {
    assert.equal(c.parent, parent.id);
    assert.ok(c.forked_at);
    assert.equal(c.state, 'running');
    assert.deepEqual(c.labels, { run: 'fork-test', branch: 'yes' });
  }
  assert.deepEqual(engine.get(parent.id).children.sort(), children.map((c) => c.id).sort());

  await sleep(1000);
  for (const c of children) {
    assert.equal(await sh(c.id, `kill -0 ${pid} && echo alive`), 'alive', 'the same process (same pid) runs in the child');
    const v = await counter(c.id);
    // Continues from the parent's value rather than starting again from zero.
    assert.ok(v >= atFork, `child counter ${v} should continue from ${atFork}`);
  }
  const parentNow = await counter(parent.id);
  assert.ok(parentNow > atFork, 'the parent keeps running');

  // Files a child writes are invisible to its siblings and to the parent.
  await sh(children[0].id, 'echo mine > /root/child0');
  for (const other of [parent.id, children[1].id, children[2].id]) {
    const r = await engine.exec(other, { command: 'cat /root/child0' });
    assert.notEqual(r.exit_code, 0);
  }

  // Fresh identity: four different random streams and boot ids.
  const ids = [parent.id, ...children.map((c) => c.id)];
  const rand = await Promise.all(ids.map((id) => sh(id, 'head -c 32 /dev/urandom | od -An -tx1 | tr -d " \\n"')));
  assert.equal(new Set(rand).size, 4, `urandom must differ: ${rand.join(' ')}`);
  const boot = await Promise.all(ids.map((id) => sh(id, 'cat /proc/sys/kernel/random/boot_id')));
  assert.equal(new Set(boot).size, 4, `boot_id must differ: ${boot.join(' ')}`);

  // The fork tree survives the parent: children keep their shared pages and disk.
  await engine.delete(parent.id);
  assert.ok((await counter(children[1].id)) > atFork);
  for (const c of children) await engine.delete(c.id);
});

test('a template\'s RAM file keeps its zero pages as holes, also after sandboxes fault them back in', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  try {
    const memPath = engine.templatePools.artifactFor(engine.repo.get(p.id)!.vmm!.artifactKey).memPath;
    const size = statSync(memPath).size;
    // The guest zeroes 96 MiB of its free memory: tmpfs gives the file a page for each hole the VMM's
    // copy-on-write mapping faults on, so the file grows though those pages stay zero.
    assert.equal(await sh(p.id, 'dd if=/dev/zero of=/dev/null bs=96M count=1 2>/dev/null && echo ok'), 'ok');
    const grown = allocatedBytes(memPath);
    await engine.sparsifyRam({ all: true });
    const dug = allocatedBytes(memPath);
    const nonZero = nonZeroBytes(memPath);
    const mib = (n: number) => `${(n / 2 ** 20).toFixed(1)} MiB`;
    assert.ok(dug <= nonZero + 4 * 2 ** 20, `${mib(dug)} allocated for ${mib(nonZero)} of non-zero pages`);
    assert.ok(grown - dug >= 16 * 2 ** 20, `the guest's writes grew the file to ${mib(grown)}; dug: ${mib(dug)}`);
    // The guest's boot wrote zeros over most of its memory; those are holes too.
    assert.ok(dug < size / 2, `${mib(dug)} of ${mib(size)} allocated`);
    // The sandbox still reads its memory right (its own pages are private copies; the rest read as zero).
    assert.equal(await sh(p.id, 'echo ok'), 'ok');
  } finally {
    await engine.delete(p.id);
  }
});

test('a template RAM file nobody has claimed or mapped for an hour is removed from tmpfs; the templates in use keep theirs', async () => {
  // What an environment deleted long ago, or a template of an earlier agent, leaves behind.
  const key = 'f0'.repeat(12);
  const root = join(TEST_CACHE, 'artifacts', key);
  mkdirSync(join(root, 'b1'), { recursive: true });
  writeFileSync(join(root, 'b1', 'artifact.json'), '{}');
  writeFileSync(join(root, 'claimed-at'), '');
  const longAgo = new Date(Date.now() - 2 * 3600_000);
  utimesSync(join(root, 'claimed-at'), longAgo, longAgo);
  const stale = join(engine.cfg.artifactRamDir, `artifact-${key}-b1.mem`);
  writeFileSync(stale, Buffer.alloc(65536, 7));
  const own = engine.templatePools.get('base')!.artifact.memPath;
  const removed = engine.collectArtifacts();
  assert.ok(removed.includes(stale) && !existsSync(stale), `removed: ${removed.join(', ')}`);
  assert.ok(existsSync(own), 'the template in use keeps its RAM file');
  const p = await engine.create({ template: 'base' }, tenant);
  assert.equal(await sh(p.id, 'echo ok'), 'ok');
  await engine.delete(p.id);
  rmSync(root, { recursive: true, force: true });
});

/** Bytes of the 4 KiB pages of a file that are not all zero. */
function nonZeroBytes(path: string): number {
  const zero = Buffer.alloc(4096);
  const data = readFileSync(path);
  let n = 0;
  for (let i = 0; i < data.length; i += 4096) if (!data.subarray(i, i + 4096).equals(zero)) n += 4096;
  return n;
}

test('a fork point costs what the parent\'s memory holds, not its size: tmpfs bytes ≤ 1.1× its backing data plus the pages the parent wrote', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  try {
    await sh(p.id, 'dd if=/dev/urandom of=/dev/shm/blob bs=1M count=24 2>/dev/null; sync; echo ok');
    const rec = engine.repo.get(p.id)!.vmm!;
    // The parent is idle now: what it holds is its backing file's data and the pages it wrote.
    const held = allocatedBytes(rec.memPath) + await privatePageBytes(rec.pid, rec.memPath, engine.cfg.cacheDir);
    const guestBytes = engine.template('base').memory_mib * 1024 * 1024;
    const [kid] = await engine.fork(p.id, { count: 1 });
    const fp = engine.repo.allForkPoints().find((f) => engine.repo.refsOf(kid.id).includes(f.id))!;
    const bytes = allocatedBytes(fp.mem_path);
    assert.ok(bytes <= 1.1 * held, `fork point ${(bytes / 2 ** 20).toFixed(1)} MiB for ${(held / 2 ** 20).toFixed(1)} MiB held by the parent`);
    assert.ok(bytes < guestBytes, `fork point ${(bytes / 2 ** 20).toFixed(1)} MiB is less than the guest's ${guestBytes / 2 ** 20} MiB`);
    assert.ok(bytes >= 24 * 2 ** 20, 'and it holds the 24 MiB the parent wrote');
    assert.equal(await sh(kid.id, 'md5sum < /dev/shm/blob'), await sh(p.id, 'md5sum < /dev/shm/blob'));
    await engine.delete(kid.id);
  } finally {
    await engine.delete(p.id);
  }
});

test('a fork point\'s RAM file lives while a running sandbox maps it: repeated forks of one parent leave none behind', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  await sh(p.id, 'dd if=/dev/urandom of=/dev/shm/blob bs=1M count=8 2>/dev/null; echo ok');
  const ramOf = (kid: string) => engine.repo.allForkPoints().find((f) => engine.repo.get(kid)!.vmm!.memPath === f.mem_path)!.mem_path;
  const files: string[] = [];
  for (let i = 0; i < 3; i++) {
    const [kid] = await engine.fork(p.id, { count: 1 });
    const ram = ramOf(kid.id);
    files.push(ram);
    assert.ok(existsSync(ram), 'the running child\'s fork point RAM file is there');
    await engine.delete(kid.id);
    await engine.settled(); // unlinked after the delete has answered
    assert.ok(!existsSync(ram), 'gone with the last sandbox that mapped it, though the parent still sits on its disk layer');
  }
  assert.ok(engine.repo.allForkPoints().length >= 3, 'the fork points themselves stay: the parent\'s disk is on their layers');
  // A suspended child holds its own RAM image: its fork point's file goes, and it resumes.
  const [kid] = await engine.fork(p.id, { count: 1 });
  const ram = ramOf(kid.id);
  await engine.suspend(kid.id);
  await engine.settled();
  assert.ok(!existsSync(ram));
  await engine.resume(kid.id);
  assert.equal(await sh(kid.id, 'md5sum < /dev/shm/blob'), await sh(p.id, 'md5sum < /dev/shm/blob'));
  for (const id of [kid.id, p.id]) await engine.delete(id);
});

test('fork children from VMMs spawned ahead (fork receivers) keep every guarantee: same process and memory, private files, fresh identity; they fork, suspend and resume on their own chain', async () => {
  const parent = await engine.create({ template: 'base' }, tenant);
  const pid = await sh(parent.id, COUNTER);
  await sh(parent.id, 'dd if=/dev/urandom of=/dev/shm/blob bs=1M count=8 2>/dev/null; echo disk > /root/file; sync; echo ok');
  const blob = await sh(parent.id, 'md5sum < /dev/shm/blob');
  // The first fork of this template's sandboxes asks for receivers; they are spawned after it.
  const warmup = await engine.fork(parent.id, { count: 2 });
  for (const c of warmup) await engine.delete(c.id);
  const key = engine.repo.get(parent.id)!.vmm!.artifactKey;
  const deadline = Date.now() + 60_000;
  while ((engine.forkReceiverSizes()[key]?.ready ?? 0) < 2) {
    assert.ok(Date.now() < deadline, `receivers never became ready: ${JSON.stringify(engine.forkReceiverSizes())}`);
    await sleep(100);
  }
  assert.ok(engine.forkReceiverSizes()[key].target >= 2, 'the pool keeps as many as the largest fork asked for (earlier tests forked too)');
  const phases: Array<Record<string, number>> = [];
  const onPhases = (r: { op: string; phases: Record<string, number> }) => { if (r.op === 'fork') phases.push(r.phases); };
  engine.on('phases', onPhases);
  await sleep(600);
  const atFork = await counter(parent.id);
  const kids = await engine.fork(parent.id, { count: 2 });
  engine.off('phases', onPhases);
  assert.ok(phases[0].child_claim !== undefined && phases[0].memory_remap !== undefined, `the fork took receivers: ${JSON.stringify(phases[0])}`);
  assert.equal(phases[0].child_spawn, undefined, 'no child VMM was spawned during the fork');
  for (const k of kids) {
    const rec = engine.repo.get(k.id)!.vmm!;
    const fp = engine.repo.allForkPoints().find((f) => engine.repo.refsOf(k.id).includes(f.id) && f.mem_path === rec.memPath);
    assert.ok(fp, 'the child\'s record names its fork point\'s RAM file');
    assert.ok(mappingOf(rec.pid, rec.memPath).length >= 256 * 2 ** 20, 'and its QEMU maps that file (found by inode) as its guest RAM');
    assert.equal(await sh(k.id, `kill -0 ${pid} && echo alive`), 'alive');
    assert.ok((await counter(k.id)) >= atFork, 'the counter continues from the parent\'s value');
    assert.equal(await sh(k.id, 'md5sum < /dev/shm/blob'), blob, 'the parent\'s memory');
    assert.equal(await sh(k.id, 'cat /root/file'), 'disk', 'the parent\'s disk');
  }
  await sh(kids[0].id, 'echo mine > /root/kid0; sync');
  assert.notEqual((await engine.exec(kids[1].id, { command: 'cat /root/kid0' })).exit_code, 0, 'files stay private');
  assert.notEqual((await engine.exec(parent.id, { command: 'cat /root/kid0' })).exit_code, 0);
  const boots = await Promise.all([parent.id, ...kids.map((k) => k.id)].map((id) => sh(id, 'cat /proc/sys/kernel/random/boot_id')));
  assert.equal(new Set(boots).size, 3, 'fresh identities');
  // A receiver-born child forks, suspends and resumes like any other sandbox.
  const [grand] = await engine.fork(kids[0].id, { count: 1 });
  assert.equal(await sh(grand.id, 'cat /root/kid0 /root/file'), 'mine\ndisk');
  await engine.suspend(kids[0].id);
  await engine.resume(kids[0].id);
  assert.equal(await sh(kids[0].id, `kill -0 ${pid} && cat /root/kid0 && md5sum < /dev/shm/blob`), `mine\n${blob}`);
  for (const id of [grand.id, ...kids.map((k) => k.id), parent.id]) await engine.delete(id);
});

test('a resume on a VMM spawned ahead (a fork receiver) maps its RAM image where it lies: processes, memory and files continue; the snapshot becomes a fork point of its own; it forks, suspends and resumes again', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  const pid = await sh(sb.id, COUNTER);
  await sh(sb.id, 'dd if=/dev/urandom of=/dev/shm/blob bs=1M count=8 2>/dev/null; echo disk > /root/file; sync; echo ok');
  const blob = await sh(sb.id, 'md5sum < /dev/shm/blob');
  const key = engine.repo.get(sb.id)!.vmm!.artifactKey;
  // A resume (like a fork) asks for receivers of the template; the next resume takes one.
  await engine.suspend(sb.id);
  await engine.resume(sb.id);
  const deadline = Date.now() + 60_000;
  while ((engine.forkReceiverSizes()[key]?.ready ?? 0) < 1) {
    assert.ok(Date.now() < deadline, `receivers never became ready: ${JSON.stringify(engine.forkReceiverSizes())}`);
    await sleep(100);
  }
  const before = await counter(sb.id);
  await engine.suspend(sb.id);
  const phases: Array<Record<string, number>> = [];
  const onPhases = (r: { op: string; phases: Record<string, number> }) => { if (r.op === 'resume') phases.push(r.phases); };
  engine.on('phases', onPhases);
  await engine.resume(sb.id);
  engine.off('phases', onPhases);
  assert.ok(phases[0].claim !== undefined && phases[0].memory_remap !== undefined, `the resume took a receiver: ${JSON.stringify(phases[0])}`);
  assert.equal(phases[0].spawn, undefined, 'no VMM was spawned during the resume');
  assert.equal(phases[0].memory_load, undefined, 'and its memory was not copied: the image is mapped where it lies');

  const rec = engine.repo.get(sb.id)!.vmm!;
  assert.notEqual(rec.dir, join(home, 'sandboxes', sb.id), 'it runs in the receiver\'s VMM');
  const fp = engine.repo.allForkPoints().find((f) => engine.repo.refsOf(sb.id).includes(f.id) && f.mem_path === rec.memPath);
  assert.ok(fp, 'its RAM file is a fork point of its own, which it refers to');
  assert.ok(mappingOf(rec.pid, rec.memPath).length >= 256 * 2 ** 20, 'and its QEMU maps that file as its guest RAM');
  assert.ok(backingChain(rec.diskPath).includes(fp.disk_path), 'the disk it had is a layer under its new top layer');
  assert.equal(await sh(sb.id, `kill -0 ${pid} && echo alive`), 'alive');
  assert.ok((await counter(sb.id)) >= before, 'the counter continues');
  await countsOn(sb.id, engine, await counter(sb.id));
  assert.equal(await sh(sb.id, 'md5sum < /dev/shm/blob; cat /root/file'), `${blob}\ndisk`, 'its memory and its disk');
  await engine.settled();
  assert.deepEqual(readdirSync(join(home, 'sandboxes', sb.id)).filter((f) => f.startsWith('suspend')), [], 'the snapshot is gone after the resume');

  // It writes, forks, suspends (its fork point's RAM is then mapped by nobody and goes) and resumes.
  await sh(sb.id, 'echo later > /root/later; sync');
  const [kid] = await engine.fork(sb.id, { count: 1 });
  assert.equal(await sh(kid.id, `kill -0 ${pid} && md5sum < /dev/shm/blob; cat /root/file /root/later`), `${blob}\ndisk\nlater`);
  await engine.suspend(sb.id);
  await engine.settled();
  assert.equal(existsSync(fp.mem_path), false, 'the RAM file of its fork point goes once nothing maps it');
  await engine.resume(sb.id);
  assert.equal(await sh(sb.id, `kill -0 ${pid} && md5sum < /dev/shm/blob; cat /root/file /root/later`), `${blob}\ndisk\nlater`);
  await engine.delete(kid.id);
  await engine.delete(sb.id);
  assert.equal(existsSync(rec.dir), false, 'the receiver\'s directory goes with the sandbox');
  assert.equal(engine.repo.forkPoint(fp.id), undefined, 'and its fork point');
});

test('repeated forks of one parent and forks of a child (a fork tree three deep) keep every disk chain intact', async () => {
  const root = await engine.create({ template: 'base' }, tenant);
  await sh(root.id, 'echo gen0 > /root/g0');
  const first = await engine.fork(root.id, { count: 1 });
  await sh(root.id, 'echo gen1 > /root/g1');
  const second = await engine.fork(root.id, { count: 2 });
  await sh(second[0].id, 'echo gen2 > /root/g2');
  const grand = await engine.fork(second[0].id, { count: 2 });
  const third = await engine.fork(root.id, { count: 1 });
  assert.equal(await sh(first[0].id, 'cat /root/g0; ls /root'), 'gen0\ng0');
  assert.equal(await sh(second[1].id, 'cat /root/g0 /root/g1'), 'gen0\ngen1');
  for (const g of grand) assert.equal(await sh(g.id, 'cat /root/g0 /root/g1 /root/g2'), 'gen0\ngen1\ngen2');
  assert.equal(await sh(third[0].id, 'cat /root/g0 /root/g1; ls /root/g2 2>/dev/null || echo none'), 'gen0\ngen1\nnone');
  // A suspended member of the tree resumes on its chain, and so does a fork of it.
  await engine.suspend(second[0].id);
  const fromSuspended = await engine.fork(second[0].id, { count: 1 });
  await engine.resume(second[0].id);
  assert.equal(await sh(second[0].id, 'cat /root/g2'), 'gen2');
  assert.equal(await sh(fromSuspended[0].id, 'cat /root/g2'), 'gen2');
  // Deleting the middle of the tree leaves descendants working.
  await engine.delete(second[0].id);
  await engine.delete(root.id);
  for (const g of grand) assert.equal(await sh(g.id, 'cat /root/g2'), 'gen2');
  for (const s of [...first, second[1], ...grand, ...third, ...fromSuspended]) await engine.delete(s.id);
});

test('suspend frees the VMM; resume continues processes and files; fork of a suspended sandbox', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  const pid = await sh(sb.id, COUNTER);
  await sh(sb.id, 'echo persisted > /root/file');
  await sleep(800);
  const before = await counter(sb.id);
  const vmmPid = engine.repo.get(sb.id)!.vmm!.pid;

  const s = await engine.suspend(sb.id);
  assert.equal(s.state, 'suspended');
  assert.equal(engine.get(sb.id).state, 'suspended');
  assert.equal(isAlive(vmmPid), false, 'the VMM process is gone while suspended');

  await assert.rejects(engine.exec(sb.id, { command: 'true' }), (e: any) => e.code === 'invalid_state' && /suspended/.test(e.message));
  await assert.rejects(engine.suspend(sb.id), { code: 'invalid_state' });

  // Fork of a suspended sandbox restores the children from its snapshot.
  const kids = await engine.fork(sb.id, { count: 2 });
  for (const k of kids) {
    assert.equal(await sh(k.id, `kill -0 ${pid} && cat /root/file`), 'persisted');
    assert.ok((await counter(k.id)) >= before);
  }
  assert.equal(engine.get(sb.id).state, 'suspended', 'forking a suspended sandbox leaves it suspended');

  const r = await engine.resume(sb.id);
  assert.equal(r.state, 'running');
  // Its snapshot is removed once the resume has answered.
  await engine.settled();
  assert.deepEqual(readdirSync(join(home, 'sandboxes', sb.id)).filter((f) => f.startsWith('suspend')), [], 'the snapshot is gone after the resume');
  await assert.rejects(engine.resume(sb.id), (e: any) => e.code === 'invalid_state' && /running/.test(e.message));
  assert.equal(await sh(sb.id, `kill -0 ${pid} && cat /root/file`), 'persisted');
  const after1 = await counter(sb.id);
  assert.ok(after1 >= before, `counter ${after1} continues from ${before}`);
  await sleep(600);
  assert.ok((await counter(sb.id)) > after1, 'the process keeps running after resume');

  for (const k of kids) await engine.delete(k.id);
  await engine.delete(sb.id);
  await assert.rejects(engine.resume(sb.id), { code: 'sandbox_not_found' });
  await assert.rejects(engine.fork(sb.id, { count: 1 }), { code: 'sandbox_not_found' });
});

test('a snapshot from before RAM images (one migration stream) still forks and resumes', async () => {
  const p = await engine.create({ template: 'base' }, tenant);
  const pid = await sh(p.id, COUNTER);
  await sh(p.id, 'echo legacy > /root/legacy; sync');
  await sleep(600);
  const atSuspend = await counter(p.id);
  // Suspended the way earlier servers did: RAM and devices in one stream, state.mig.
  const registry = (engine as unknown as { registry: { get(id: string): { live: LiveVm } | undefined; remove(id: string): void } }).registry;
  const { live } = registry.get(p.id)!;
  const snapDir = join(home, 'sandboxes', p.id, 'suspend');
  mkdirSync(snapDir, { recursive: true });
  const statePath = join(snapDir, 'state.mig');
  await live.vmm.saveFullState(statePath, join(live.record.dir, 'migrate.sock'));
  writeFileSync(join(snapDir, 'complete'), '');
  engine.repo.update(p.id, { state: 'suspended', snapshot: { statePath, bytes: statSync(statePath).size, suspendedAt: Date.now() }, pending_op: null });
  registry.remove(p.id);
  live.agent.close();
  await live.vmm.kill();
  const [kid] = await engine.fork(p.id, { count: 1 });
  assert.equal(await sh(kid.id, `kill -0 ${pid} && cat /root/legacy`), 'legacy', 'a child of the stream snapshot runs its process and has its files');
  assert.equal(engine.get(p.id).state, 'suspended');
  await engine.resume(p.id);
  assert.equal(await sh(p.id, `kill -0 ${pid} && cat /root/legacy`), 'legacy');
  await countsOn(p.id, engine, atSuspend, 'the counter goes on from where it was');
  // A resumed sandbox runs on a RAM file of its own (share=on): a fork copies it whole, and
  // children spawned at fork time (no receivers) open it only once it has its full size.
  const max = engine.cfg.forkPoolMax;
  engine.cfg.forkPoolMax = 0;
  const spawned = await engine.fork(p.id, { count: 2 }).finally(() => { engine.cfg.forkPoolMax = max; });
  for (const c of spawned) assert.equal(await sh(c.id, `kill -0 ${pid} && cat /root/legacy`), 'legacy');
  for (const id of [kid.id, ...spawned.map((c) => c.id), p.id]) await engine.delete(id);
});

test('a sandbox whose QEMU is SIGKILLed: the exec under way fails at once saying its VM died, the sandbox is deleted with nothing left, later requests say why; the others run on', async () => {
  const [a, b] = [await engine.create({ template: 'base' }, tenant), await engine.create({ template: 'base' }, tenant)];
  const pid = engine.repo.get(a.id)!.vmm!.pid;
  const dir = engine.repo.get(a.id)!.vmm!.dir;
  const started = Date.now();
  const exec = engine.exec(a.id, { command: 'sleep 60' });
  await sleep(300);
  process.kill(pid, 'SIGKILL');
  await assert.rejects(exec, (e: any) => e.code === 'vmm_failed' && /VM died during this request: its VM exited unexpectedly .*QEMU process \d+ is gone/.test(e.message));
  assert.ok(Date.now() - started < 20_000, 'no hang until the exec timeout');
  // Deleted, and everything of it reclaimed.
  for (let i = 0; i < 100 && engine.repo.get(a.id)!.state !== 'deleted'; i++) await sleep(50);
  assert.equal(engine.repo.get(a.id)!.state, 'deleted');
  assert.ok(!existsSync(dir), 'its directory is gone');
  for (const call of [async () => engine.get(a.id, tenant), () => engine.exec(a.id, { command: 'true' }), () => engine.delete(a.id)] as Array<() => Promise<unknown>>) {
    await assert.rejects(call(), (e: any) => e.code === 'sandbox_not_found' && /no longer exists: its VM exited unexpectedly/.test(e.message));
  }
  assert.ok(!engine.list({}, tenant).sandboxes.some((s) => s.id === a.id));
  assert.equal((await engine.exec(b.id, { command: 'echo ok' })).stdout, 'ok\n', 'the other sandbox runs on');
  await engine.delete(b.id);
});

test('delete from the suspended state removes the snapshot', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  await engine.suspend(sb.id);
  await engine.delete(sb.id);
  assert.throws(() => engine.get(sb.id), { code: 'sandbox_not_found' });
});

test('a sandbox past its maximum session duration is reaped', async () => {
  const sb = await engine.create({ template: 'base', timeoutSecs: 1 }, tenant);
  const keep = await engine.create({ template: 'base', timeoutSecs: 600 }, tenant);
  const deadline = Date.now() + 15_000;
  while (Date.now() < deadline) {
    try { engine.get(sb.id); } catch { break; }
    await sleep(200);
  }
  assert.throws(() => engine.get(sb.id), { code: 'sandbox_not_found' });
  assert.equal(engine.get(keep.id).state, 'running');
  await engine.delete(keep.id);
});

test('age, idle and exec count are tracked', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  await sh(sb.id, 'true');
  await sh(sb.id, 'true');
  await sleep(1200);
  const info = engine.get(sb.id);
  assert.equal(info.exec_count, 2);
  assert.ok(info.age_secs >= 1.2);
  assert.ok(info.idle_secs >= 1.0 && info.idle_secs <= info.age_secs);
  await engine.delete(sb.id);
});

// ---- crash safety: a separate process plays the server and is SIGKILLed at injected points -------

const worker = fileURLToPath(new URL('./crashWorker.ts', import.meta.url));

function runWorker(crashHome: string, args: string[], crashAt?: string): Promise<string> {
  return new Promise((resolve) => {
    execFile(process.execPath, ['--import', 'tsx', worker, crashHome, TEST_CACHE, ...args], {
      env: { ...process.env, ...(crashAt ? { COLLIMATE_CRASH_AT: crashAt } : {}) },
      timeout: 180_000,
    }, (_err, stdout, stderr) => {
      if (!stdout.trim() && !['fork', 'suspend', 'resume'].includes(args[0])) console.error(`crash worker ${args.join(' ')} printed nothing:\n${stderr}`);
      resolve(stdout);
    });
  });
}

/** A sandbox made by the worker's create-and-suspend resumes with its file and its counter process. */
async function resumesIntact(id: string, e: Engine): Promise<void> {
  await e.resume(id);
  assert.equal(await sh(id, 'cat /root/marker', e), 'kept');
  const c = await counter(id, e);
  await countsOn(id, e, c, 'its counter process counts on');
}

test('SIGKILL while suspended, restart, resume: intact', async () => {
  const crashHome = testHome('crash-suspended');
  const out = await runWorker(crashHome, ['create-and-suspend']);
  const { id } = JSON.parse(out.trim().split('\n').pop()!);
  let e2 = await openEngine(crashHome, { poolSize: 1 });
  try {
    assert.equal(e2.get(id).state, 'suspended');
    await resumesIntact(id, e2);
    // A snapshot a resume had set aside for removal when the server died goes at the next start.
    const aside = join(crashHome, 'sandboxes', id, 'suspend.removed-1');
    mkdirSync(aside);
    writeFileSync(join(aside, 'ram.img'), 'x');
    await e2.close();
    e2 = await openEngine(crashHome, { poolSize: 1 });
    assert.equal(existsSync(aside), false, 'the set-aside snapshot is removed by reconcile');
    assert.equal(await sh(id, 'cat /root/marker', e2), 'kept');
  } finally {
    await assertNoLeaks(e2, crashHome);
  }
});

for (const point of ['fork:before-stop', 'fork:after-disk', 'fork:after-migrate', 'fork:children-spawned', 'fork:children-restored']) {
  test(`SIGKILL inside a fork of 4 at ${point}: after restart every sandbox is wholly there or wholly gone`, async () => {
    const crashHome = testHome('crash-fork');
    const { id } = JSON.parse((await runWorker(crashHome, ['setup'])).trim().split('\n').pop()!);
    await runWorker(crashHome, ['fork', id], point);
    const e2 = await openEngine(crashHome, { poolSize: 1 });
    try {
      const all = e2.list({}, { tenant: 'crash' }).sandboxes;
      const parent = all.find((s) => s.id === id)!;
      assert.equal(parent.state, 'running');
      assert.equal(await sh(id, 'cat /root/marker', e2), 'before');
      const c = await counter(id, e2);
      await countsOn(id, e2, c, 'the parent runs on after the crash');
      const kids = all.filter((s) => s.parent === id);
      assert.equal(kids.length, 0, 'children of an unacknowledged fork are rolled back');
      // The rolled-back fork did not break the parent: it can fork again.
      const again = await e2.fork(id, { count: 2 });
      for (const k of again) assert.equal(await sh(k.id, 'cat /root/marker', e2), 'before');
    } finally {
      await assertNoLeaks(e2, crashHome);
    }
    assert.deepEqual(qemuProcesses(crashHome), []);
  });
}

for (const point of ['suspend:before-save', 'suspend:after-save']) {
  test(`SIGKILL inside a suspend at ${point}: the sandbox is wholly running or wholly suspended`, async () => {
    const crashHome = testHome('crash-suspend');
    const { id } = JSON.parse((await runWorker(crashHome, ['setup'])).trim().split('\n').pop()!);
    await runWorker(crashHome, ['suspend', id], point);
    const e2 = await openEngine(crashHome, { poolSize: 1 });
    try {
      const s = e2.get(id);
      if (point === 'suspend:after-save') assert.equal(s.state, 'suspended', 'a complete snapshot finishes the suspend');
      else assert.equal(s.state, 'running', 'an unfinished snapshot rolls the suspend back');
      if (s.state === 'suspended') await e2.resume(id);
      assert.equal(await sh(id, 'cat /root/marker', e2), 'before');
      const c = await counter(id, e2);
      await countsOn(id, e2, c);
    } finally {
      await assertNoLeaks(e2, crashHome);
    }
  });
}

test('SIGKILL inside a resume once its new VMM runs: after restart the sandbox is wholly suspended, that VMM stopped, and it resumes intact', async () => {
  const crashHome = testHome('crash-resume');
  const { id } = JSON.parse((await runWorker(crashHome, ['create-and-suspend'])).trim().split('\n').pop()!);
  await runWorker(crashHome, ['resume', id], 'resume:vmm-started');
  assert.equal(qemuProcesses(join(crashHome, 'sandboxes', id)).length, 1, 'the crash left the resumed VMM running');
  const e2 = await openEngine(crashHome, { poolSize: 1 });
  try {
    assert.equal(e2.get(id).state, 'suspended', 'an unacknowledged resume is rolled back');
    assert.deepEqual(qemuProcesses(join(crashHome, 'sandboxes', id)), [], 'and the VMM it started is stopped');
    await resumesIntact(id, e2);
  } finally {
    await assertNoLeaks(e2, crashHome);
  }
});

test('SIGKILL inside a resume on a receiver once it runs: after restart the sandbox is wholly suspended, nothing of the receiver is left, and it resumes intact', async () => {
  const crashHome = testHome('crash-resume-receiver');
  const { id } = JSON.parse((await runWorker(crashHome, ['create-and-suspend'])).trim().split('\n').pop()!);
  await runWorker(crashHome, ['resume-on-receiver', id], 'resume:vmm-started');
  const e2 = await openEngine(crashHome, { poolSize: 1 });
  try {
    assert.equal(e2.get(id).state, 'suspended', 'an unacknowledged resume is rolled back');
    assert.deepEqual(e2.repo.allForkPoints(), [], 'its fork point was never recorded');
    await resumesIntact(id, e2);
  } finally {
    await assertNoLeaks(e2, crashHome);
  }
});

test('SIGKILL inside a suspend of a sandbox resumed on a receiver, once the suspend is recorded: after restart the receiver\'s directory is gone and the sandbox resumes intact', async () => {
  const crashHome = testHome('crash-suspend-receiver');
  const { id } = JSON.parse((await runWorker(crashHome, ['create-and-suspend'])).trim().split('\n').pop()!);
  const out = (await runWorker(crashHome, ['suspend-after-resume-on-receiver', id], 'suspend:recorded')).trim().split('\n');
  const { receiverDir } = JSON.parse(out.find((l) => l.includes('receiverDir'))!);
  assert.notEqual(receiverDir, join(crashHome, 'sandboxes', id), 'the resume ran on a receiver');
  assert.ok(existsSync(receiverDir), 'the crash came before the suspend removed the receiver\'s directory');
  const e2 = await openEngine(crashHome, { poolSize: 1 });
  try {
    assert.equal(e2.get(id).state, 'suspended');
    assert.equal(existsSync(receiverDir), false, 'the restart removed the directory of the VMM that no longer runs');
    await resumesIntact(id, e2);
  } finally {
    await assertNoLeaks(e2, crashHome);
  }
});

test('a resume whose VMM fails while starting leaves the sandbox suspended with its snapshot, no VMM of it running, and a later resume intact', async () => {
  const failHome = testHome('resume-fails');
  let failing = false;
  const e2 = await openEngine(failHome, { poolSize: 1, faultPoint: async (name) => { if (failing && name === 'resume:vmm-starting') throw new Error('injected: the VMM could not start'); } });
  try {
    const sb = await e2.create({ template: 'base' }, tenant);
    await sh(sb.id, `echo kept > /root/marker; ${COUNTER}`, e2);
    await e2.suspend(sb.id);
    failing = true;
    await assert.rejects(e2.resume(sb.id), (e: any) => e.code === 'vmm_failed' && /injected/.test(e.message));
    failing = false;
    assert.equal(e2.get(sb.id).state, 'suspended');
    assert.ok(existsSync(join(failHome, 'sandboxes', sb.id, 'suspend', 'complete')), 'the snapshot is still there');
    assert.deepEqual(qemuProcesses(join(failHome, 'sandboxes', sb.id)), [], 'the VMM that failed to start is stopped');
    await resumesIntact(sb.id, e2);
  } finally {
    await assertNoLeaks(e2, failHome);
  }
});

test('a parent deleted while its fork is under way: the fork fails saying it is gone, and nothing of the fork is left; the engine forks again', async () => {
  const delHome = testHome('fork-parent-deleted');
  let parent = '';
  // The delete lands after the fork recorded its fork point and before it made its RAM file, so
  // the delete's collection removes the fork point first and the fork makes files for it after.
  const e2: Engine = await openEngine(delHome, { poolSize: 1, faultPoint: async (name) => { if (parent && name === 'fork:before-seed') await e2.delete(parent); } });
  try {
    const sb = await e2.create({ template: 'base' }, tenant);
    parent = sb.id;
    await assert.rejects(e2.fork(sb.id, { count: 2 }), (e: any) => e.code === 'sandbox_not_found');
    parent = '';
    assert.deepEqual(readdirSync(e2.cfg.ramDir).filter((f) => f.startsWith('fp_')), [], 'no fork point RAM file is left');
    assert.deepEqual(readdirSync(join(delHome, 'forkpoints')), [], 'no fork point directory is left');
    const again = await e2.create({ template: 'base' }, tenant);
    const [child] = await e2.fork(again.id, { count: 1 });
    assert.equal(await sh(child.id, 'echo forked', e2), 'forked');
  } finally {
    await assertNoLeaks(e2, delHome);
  }
});

test('a parent deleted once its fork has restored the children: the children are whole, and their fork point stays for them (suspend and fork them)', async () => {
  const delHome = testHome('fork-parent-deleted-late');
  let parent = '';
  // The parent goes after its memory was captured, while the children's restores are done but not
  // yet committed: nothing the children need may go with it (CI's crash campaign once saw a child's
  // suspend and a fork of another fail on their fork point's missing RAM file).
  const e2: Engine = await openEngine(delHome, { poolSize: 1, faultPoint: async (name) => { if (parent && name === 'fork:children-restored') await e2.delete(parent); } });
  try {
    const sb = await e2.create({ template: 'base' }, tenant);
    assert.equal(await sh(sb.id, 'echo before > /root/mark && cat /root/mark', e2), 'before');
    parent = sb.id;
    const [a, b] = await e2.fork(sb.id, { count: 2 });
    parent = '';
    assert.throws(() => e2.get(sb.id), (e: any) => e.code === 'sandbox_not_found', 'the parent is gone');
    for (const c of [a, b]) assert.equal(await sh(c.id, 'cat /root/mark', e2), 'before');
    assert.equal(readdirSync(e2.cfg.ramDir).filter((f) => f.startsWith('fp_')).length, 1, 'the children\'s fork point keeps its RAM file');
    // What failed in CI: a child's suspend copies that file, a fork of the other seeds from it.
    await e2.suspend(a.id);
    await e2.resume(a.id);
    assert.equal(await sh(a.id, 'cat /root/mark', e2), 'before');
    const [grandchild] = await e2.fork(b.id, { count: 1 });
    assert.equal(await sh(grandchild.id, 'cat /root/mark', e2), 'before');
  } finally {
    await assertNoLeaks(e2, delHome);
  }
});

test('a VMM of a home that no record names (a record torn by the crash) is stopped at the next start', async () => {
  const crashHome = testHome('crash-torn');
  const { id } = JSON.parse((await runWorker(crashHome, ['create-and-suspend'])).trim().split('\n').pop()!);
  await runWorker(crashHome, ['resume', id], 'resume:vmm-started');
  const dir = join(crashHome, 'sandboxes', id);
  assert.equal(qemuProcesses(dir).length, 1, 'the crash left the resumed VMM running');
  const strayUid = statSync(`/proc/${qemuProcesses(dir)[0]}`).uid;
  // As if the crash had come while its record was being written.
  writeFileSync(join(dir, 'vmm.json'), '');
  const e2 = await openEngine(crashHome, { poolSize: 1 });
  try {
    assert.deepEqual(qemuProcesses(dir), [], 'the VMM nothing accounts for is stopped');
    // And what it held goes with it, though no record said what that was.
    const jailer = await jailerFor(e2.cfg);
    if (jailer) {
      assert.deepEqual(jailer.cgroupDirs().filter((d) => d.includes(id)), [], 'its cgroups are removed');
      const owner = readClaim(join(e2.cfg.jail.runDir, 'uids', String(strayUid)));
      assert.ok(!owner || processMatches(owner), `its uid ${strayUid} is not left claimed by a process that is gone`);
    }
    assert.equal(e2.get(id).state, 'suspended');
    await resumesIntact(id, e2);
  } finally {
    await assertNoLeaks(e2, crashHome);
  }
});

test('SIGKILL mid-bake: the bake VMM left running is stopped by the next start, its build directory and RAM file removed', async () => {
  const crashHome = testHome('crash-bake');
  const out = await runWorker(crashHome, ['bake', `${process.pid}-${Date.now()}`]);
  const { buildDir } = JSON.parse(out.trim().split('\n').pop()!);
  assert.ok(buildDir && existsSync(buildDir), `the worker reported its bake's build directory (${out})`);
  const left = qemuProcesses(buildDir);
  assert.equal(left.length, 1, 'the bake VMM outlived the process that ran the bake');
  const record = JSON.parse(readFileSync(join(buildDir, 'vmm.json'), 'utf8'));
  assert.equal(record.pid, left[0], 'and its build directory records it');
  const e2 = await openEngine(crashHome, { poolSize: 1 });
  try {
    assert.deepEqual(qemuProcesses(buildDir), [], 'the next start stopped it');
    assert.ok(!isAlive(left[0]));
    assert.ok(!existsSync(buildDir), 'its build directory is gone');
    assert.ok(!existsSync(record.memPath), 'and its RAM file');
    for (const d of record.jail?.cgroups ?? []) assert.ok(!existsSync(d), `and its cgroup ${d}`);
  } finally {
    await assertNoLeaks(e2, crashHome);
  }
});
