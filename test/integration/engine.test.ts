import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { openEngine, testHome, assertNoLeaks, qemuProcesses } from './fixture.ts';

const tenant = { tenant: 'it-engine' };
let engine: Engine;
let home: string;

before(async () => {
  home = testHome('engine');
  engine = await openEngine(home);
});

after(async () => {
  await assertNoLeaks(engine, home);
});

test('exec: shell string, exit codes, stderr, code and commands forms, files before the command', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  assert.match(sb.id, /^sbx_[0-9a-f]{12}$/);
  assert.equal(sb.state, 'running');

  const hello = await engine.exec(sb.id, { command: 'echo hello' });
  assert.equal(hello.stdout, 'hello\n');
  assert.equal(hello.exit_code, 0);
  assert.equal(hello.timed_out, false);

  const oops = await engine.exec(sb.id, { command: 'echo oops >&2; exit 3' });
  assert.equal(oops.exit_code, 3);
  assert.equal(oops.stderr, 'oops\n');
  assert.equal(oops.stdout, '');

  const code = await engine.exec(sb.id, { code: 'x=40; echo $((x + 2))' });
  assert.equal(code.stdout, '42\n');

  const cmds = await engine.exec(sb.id, { commands: [['echo', 'one'], ['sh', '-c', 'echo two; exit 5'], ['echo', 'never']] });
  assert.equal(cmds.stdout, 'one\ntwo\n');
  assert.equal(cmds.exit_code, 5);
  assert.equal(cmds.failed_index, 1);

  const files = await engine.exec(sb.id, {
    command: 'cat /work/in.txt; ls -l /work/run.sh | cut -c1-10; /work/run.sh',
    files: [
      { path: '/work/in.txt', content: 'from a file\n' },
      { path: '/work/run.sh', content: Buffer.from('#!/bin/sh\necho script ran\n').toString('base64'), encoding: 'base64', mode: 0o755 },
    ],
  });
  assert.equal(files.stdout, 'from a file\n-rwxr-xr-x\nscript ran\n');

  const env = await engine.exec(sb.id, { command: 'echo "$GREETING from $(pwd)"; cat', env: { GREETING: 'hi' }, cwd: '/tmp', stdin: 'piped in' });
  assert.equal(env.stdout, 'hi from /tmp\npiped in');

  assert.ok(Date.parse(hello.timing.started_at) >= Date.parse(hello.timing.queued_at));
  assert.ok(Date.parse(hello.timing.finished_at) >= Date.parse(hello.timing.started_at));
  await engine.delete(sb.id);
});

test('files and background processes persist between execs', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  await engine.exec(sb.id, { command: 'echo kept > /root/state.txt; (sleep 1000 & echo $! > /root/bg.pid) ' });
  const second = await engine.exec(sb.id, { command: 'cat /root/state.txt' });
  assert.equal(second.stdout, 'kept\n');
  const third = await engine.exec(sb.id, { command: 'kill -0 $(cat /root/bg.pid) && echo alive' });
  assert.equal(third.stdout, 'alive\n');
  await engine.delete(sb.id);
});

test('20 execs submitted at once finish in submission order; execs in 4 sandboxes overlap', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  const results = await Promise.all(
    Array.from({ length: 20 }, (_, i) => engine.exec(sb.id, { command: `echo ${i} >> /root/order; echo ${i}` })),
  );
  assert.deepEqual(results.map((r) => r.stdout.trim()), Array.from({ length: 20 }, (_, i) => String(i)));
  const order = await engine.exec(sb.id, { command: 'cat /root/order' });
  assert.deepEqual(order.stdout.trim().split('\n'), Array.from({ length: 20 }, (_, i) => String(i)));
  for (let i = 1; i < results.length; i++) {
    assert.ok(Date.parse(results[i].timing.started_at) >= Date.parse(results[i - 1].timing.finished_at), 'execs in one sandbox must not overlap');
  }

  const many = await Promise.all(Array.from({ length: 4 }, () => engine.create({ template: 'base' }, tenant)));
  const runs = await Promise.all(many.map((s) => engine.exec(s.id, { command: 'sleep 2' })));
  const latestStart = Math.max(...runs.map((r) => Date.parse(r.timing.started_at)));
  const earliestEnd = Math.min(...runs.map((r) => Date.parse(r.timing.finished_at)));
  assert.ok(latestStart < earliestEnd, `execs in different sandboxes should overlap (latest start ${latestStart}, earliest end ${earliestEnd})`);
  for (const s of [sb, ...many]) await engine.delete(s.id);
});

test('a timeout kills the exec in about its limit and the sandbox stays usable', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  const t0 = Date.now();
  const r = await engine.exec(sb.id, { command: 'sleep 60', timeout: 1 });
  const took = Date.now() - t0;
  assert.equal(r.timed_out, true);
  assert.equal(r.exit_code, 124);
  assert.ok(took < 10_000, `timeout took ${took} ms`);
  const next = await engine.exec(sb.id, { command: 'echo still here' });
  assert.equal(next.stdout, 'still here\n');
  await engine.delete(sb.id);
});

test('create is a restore, not a boot: uptime continues from the checkpoint, VMM ran -incoming with share=off RAM', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  const row = engine.repo.get(sb.id)!;
  const cmdline = readFileSync(`/proc/${row.vmm!.pid}/cmdline`, 'utf8').split('\0');
  assert.ok(cmdline.includes('-incoming'), 'VMM must be started with -incoming');
  assert.ok(cmdline.some((a) => a.startsWith('memory-backend-file') && a.includes('share=off')), 'RAM must be share=off');
  const uptime = await engine.exec(sb.id, { command: 'cut -d" " -f1 /proc/uptime' });
  const artifactUptime = engine.templatePools.get('base')!.artifact.uptimeAtCheckpointMs / 1000;
  assert.ok(Number(uptime.stdout) >= artifactUptime, `uptime ${uptime.stdout} should continue from the checkpoint's ${artifactUptime}`);
  await engine.delete(sb.id);
});

test('two sandboxes from one template share neither files nor processes, and their randomness differs', async () => {
  const [a, b] = await Promise.all([engine.create({ template: 'base' }, tenant), engine.create({ template: 'base' }, tenant)]);
  await engine.exec(a.id, { command: 'echo secret > /root/mine; sleep 1000 >/dev/null 2>&1 &' });
  const seeFile = await engine.exec(b.id, { command: 'cat /root/mine' });
  assert.notEqual(seeFile.exit_code, 0);
  const seeProc = await engine.exec(b.id, { command: 'ps | grep -c "[s]leep 1000" || true' });
  assert.equal(seeProc.stdout.trim(), '0');
  const inA = await engine.exec(a.id, { command: 'ps | grep -c "[s]leep 1000"' });
  assert.equal(inA.stdout.trim(), '1');
  const ra = await engine.exec(a.id, { command: 'head -c 32 /dev/urandom | od -An -tx1' });
  const rb = await engine.exec(b.id, { command: 'head -c 32 /dev/urandom | od -An -tx1' });
  assert.notEqual(ra.stdout, rb.stdout);
  assert.ok(ra.stdout.replace(/\s/g, '').length === 64);
  await engine.delete(a.id);
  await engine.delete(b.id);
});

test('operations on a deleted id are not found', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  await engine.delete(sb.id);
  await assert.rejects(engine.exec(sb.id, { command: 'true' }), { code: 'sandbox_not_found' });
  assert.throws(() => engine.get(sb.id), { code: 'sandbox_not_found' });
  await assert.rejects(engine.delete(sb.id), { code: 'sandbox_not_found' });
});

test('a delete of a suspended sandbox waits for the resume under way, then deletes what it resumed; a resume behind a delete is not found', async () => {
  const sb = await engine.create({ template: 'base' }, tenant);
  await engine.suspend(sb.id, tenant);
  // The resume is under way (its VMM starting on the sandbox's disk) when the delete comes: it used
  // to remove the disk under it (vmm_failed, ENOENT) or be overwritten by the resume's commit.
  const resumed = engine.resume(sb.id, tenant).then((i) => i.state, (e: { code?: string }) => e.code);
  await new Promise((r) => setTimeout(r, 30));
  await engine.delete(sb.id, tenant);
  assert.equal(await resumed, 'running', 'the resume finished first');
  assert.throws(() => engine.get(sb.id, tenant), { code: 'sandbox_not_found' });
  assert.deepEqual(qemuProcesses(sb.id), [], 'no VMM runs for the deleted sandbox');

  const other = await engine.create({ template: 'base' }, tenant);
  await engine.suspend(other.id, tenant);
  const deleted = engine.delete(other.id, tenant);
  // Being deleted (409, state deleting) or, once the delete is done, not found: never resumed.
  await assert.rejects(engine.resume(other.id, tenant), (e: { code?: string; details?: { state?: string } }) =>
    e.code === 'sandbox_not_found' || (e.code === 'invalid_state' && e.details?.state === 'deleting'));
  await deleted;
  assert.deepEqual(qemuProcesses(other.id), []);
});
