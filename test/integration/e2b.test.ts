/**
 * The unmodified `e2b` SDK (the newest pinned 2.x and an older 2.x) against a real server on
 * loopback and real microVMs, as a user switches: E2B_API_URL and E2B_SANDBOX_URL (passed as the
 * SDK's apiUrl/sandboxUrl options, which is what those variables set), and a key made with
 * `collimate keys create --e2b`. The template is the busybox `base` (commands run with /bin/sh).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import * as e2bNew from 'e2b';
import * as e2bOld from 'e2b-2-30';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, type Served } from './fixture.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

let engine: Engine;
let home: string;
let api: Served;
let base: string;
let key: string;

before(async () => {
  home = testHome('e2b');
  engine = await openEngine(home);
  api = await serveEngine(engine);
  base = await api.app.listen({ host: '127.0.0.1', port: 0 });
  const cli = ['--import', 'tsx', join(ROOT, 'src/cli/main.ts'), 'keys', 'create', '--tenant', 'e2b-user', '--tier', 'pro', '--e2b', '--home', home];
  const { stdout } = await promisify(execFile)(process.execPath, cli, { cwd: ROOT });
  key = stdout.trim().split('\n').pop()!;
  assert.match(key, /^e2b_[0-9a-f]{80}$/);
});

after(async () => {
  await api?.close(1000);
  await assertNoLeaks(engine, home);
});

const opts = () => ({ apiKey: key, apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd` });

async function until(what: string, check: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

test('e2b 2.51: the whole journey on real VMs', async () => {
  const { Sandbox, CommandExitError, FileNotFoundError, SandboxNotFoundError, AuthenticationError } = e2bNew;
  const sbx = await Sandbox.create('base', { ...opts(), metadata: { journey: 'e2b' }, envs: { GREETING: 'hello' }, timeoutMs: 600_000 });
  try {
    // commands.run with live output
    const out: string[] = [];
    const err: string[] = [];
    const r = await sbx.commands.run('echo "$GREETING from $(hostname -s 2>/dev/null || echo guest)"; echo warn >&2', { onStdout: (d) => void out.push(d), onStderr: (d) => void err.push(d) });
    assert.equal(r.exitCode, 0);
    assert.match(out.join(''), /^hello from /);
    assert.equal(err.join(''), 'warn\n');
    await assert.rejects(sbx.commands.run('exit 7'), (e: Error & { exitCode?: number }) => e instanceof CommandExitError && e.exitCode === 7);

    // a background command fed through stdin, then killed
    const lines: string[] = [];
    const cat = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => void lines.push(d) });
    await sbx.commands.sendStdin(cat.pid, 'line one\n');
    await until('the echo of stdin', () => lines.join('') === 'line one\n');
    // an exec runs while the background command does
    assert.equal((await sbx.commands.run('echo beside')).stdout, 'beside\n');
    assert.ok((await sbx.commands.list()).some((p) => p.pid === cat.pid));
    assert.equal(await sbx.commands.kill(cat.pid), true);
    assert.ok((await cat.wait().catch((e) => e)) instanceof CommandExitError);

    // files
    await sbx.files.write('/root/data/a.txt', 'alpha');
    assert.equal(await sbx.files.read('/root/data/a.txt'), 'alpha');
    assert.equal(await sbx.files.makeDir('/root/data/sub'), true);
    assert.deepEqual((await sbx.files.list('/root/data')).map((e) => `${e.name}:${e.type}`).sort(), ['a.txt:file', 'sub:dir']);
    await sbx.files.rename('/root/data/a.txt', '/root/data/sub/b.txt');
    assert.equal(await sbx.files.exists('/root/data/a.txt'), false);
    assert.equal(await sbx.files.exists('/root/data/sub/b.txt'), true);
    assert.equal((await sbx.commands.run('cat /root/data/sub/b.txt')).stdout, 'alpha');
    await sbx.files.remove('/root/data/sub');
    assert.equal(await sbx.files.exists('/root/data/sub'), false);
    await assert.rejects(sbx.files.read('/root/nope.txt'), (e: Error) => e instanceof FileNotFoundError);

    // a lease, then pause and connect: process memory survives
    await sbx.setTimeout(300_000);
    const info = await Sandbox.getInfo(sbx.sandboxId, opts());
    assert.ok(info.endAt.getTime() - Date.now() <= 300_000);
    await sbx.commands.run('sleep 1000 & echo $! > /root/sleeper.pid', { background: false });
    const sleeper = (await sbx.commands.run('cat /root/sleeper.pid')).stdout.trim();
    assert.equal(await sbx.pause(), true);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, opts())).state, 'paused');
    const again = await Sandbox.connect(sbx.sandboxId, opts());
    assert.equal((await again.commands.run(`kill -0 ${sleeper} && echo alive`)).stdout, 'alive\n');

    // fork: the children keep the process and the sandbox's envs
    const kids = await Sandbox.fork(sbx.sandboxId, { ...opts(), count: 2 });
    assert.equal(kids.length, 2);
    for (const kid of kids) {
      assert.ok(!(kid instanceof Error), String(kid));
      const child = kid as InstanceType<typeof Sandbox>;
      assert.equal((await child.commands.run(`kill -0 ${sleeper} && echo "$GREETING child"`)).stdout, 'hello child\n');
      await child.kill();
    }

    // list with a metadata filter
    const listed = await Sandbox.list({ ...opts(), query: { metadata: { journey: 'e2b' } } }).nextItems();
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId]);

    // errors as the SDK's classes
    await assert.rejects(Sandbox.create('base', { ...opts(), apiKey: 'e2b_' + '0'.repeat(80) }), (e: Error) => e instanceof AuthenticationError);
    await assert.rejects(Sandbox.getInfo('sbx_000000000000', opts()), (e: Error) => e instanceof SandboxNotFoundError);
  } finally {
    assert.equal(await sbx.kill(), true);
  }
  assert.equal(await Sandbox.kill(sbx.sandboxId, opts()), false);
});

test("e2b 2.51 filesystem-only pause on real VMs: the timeout pauses with only the files, connect boots it afresh on them, and pause({keepMemory: false}) does the same", async () => {
  const { Sandbox } = e2bNew;
  const sbx = await Sandbox.create('base', { ...opts(), timeoutMs: 600_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } } as never);
  try {
    await sbx.files.write('fs-only-marker.txt', 'kept');
    await sbx.commands.run('sleep 1000 >/dev/null 2>&1 & echo $! > /root/sleeper.pid');
    const bootBefore = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim();
    await sbx.setTimeout(2_000);
    await until('the timeout to pause it', async () => (await Sandbox.getInfo(sbx.sandboxId, opts())).state === 'paused', 60_000);
    await sbx.connect();
    assert.equal(await sbx.files.read('fs-only-marker.txt'), 'kept', 'its files are there');
    assert.notEqual((await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim(), bootBefore, 'booted afresh');
    assert.equal((await sbx.commands.run('kill -0 $(cat /root/sleeper.pid) 2>/dev/null && echo alive || echo gone')).stdout, 'gone\n');
    // An explicit pause that keeps only the files, resumed by connect with onResume 'reboot'.
    await sbx.commands.run('echo again >> fs-only-marker.txt');
    assert.equal(await sbx.pause({ keepMemory: false } as never), true);
    await Sandbox.connect(sbx.sandboxId, { ...opts(), onResume: 'reboot' } as never);
    assert.equal(await sbx.files.read('fs-only-marker.txt'), 'keptagain\n');
  } finally {
    await sbx.kill().catch(() => {});
  }
});

test("e2b 2.51: a command cut off by Sandbox.kill is E2B's TimeoutError saying the sandbox was killed, not a command failure", async () => {
  const sbx = await e2bNew.Sandbox.create('base', { ...opts(), timeoutMs: 600_000 });
  const cmd = await sbx.commands.run('sleep 60', { background: true });
  await sbx.kill();
  const err = await cmd.wait().catch((e: unknown) => e);
  assert.ok(err instanceof e2bNew.TimeoutError, `not a TimeoutError: ${String(err)}`);
  assert.match((err as Error).message, /sandbox was killed or reached its end of life/);
  // A command that ends on its own while the sandbox runs still ends with its exit code.
  const other = await e2bNew.Sandbox.create('base', { ...opts(), timeoutMs: 600_000 });
  await assert.rejects(other.commands.run('exit 3'), (e: Error & { exitCode?: number }) => e instanceof e2bNew.CommandExitError && e.exitCode === 3);
  await other.kill();
});

test("the sandbox log on real VMs: an E2B command and a REST exec, read through REST and E2B's logs v2", async () => {
  const sbx = await e2bNew.Sandbox.create('base', { ...opts(), timeoutMs: 300_000 });
  try {
    assert.equal((await sbx.commands.run('echo logged-by-e2b')).stdout, 'logged-by-e2b\n');
    const exec = async (command: string) => {
      const res = await fetch(`${base}/v1/sandboxes/${sbx.sandboxId}/exec`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ command }) });
      assert.equal(res.status, 200);
      return (await res.json()) as { exit_code: number };
    };
    assert.equal((await exec('echo rest-exec')).exit_code, 0);
    assert.equal((await exec('exit 3')).exit_code, 3);
    type Entry = { timestamp: string; level: string; message: string; fields: Record<string, string> };
    // The process's exit is written when the host hears of it, a moment after the command's answer.
    let rest: Entry[] = [];
    await until('the command\'s exit in the log', async () => {
      const res = await fetch(`${base}/v1/sandboxes/${sbx.sandboxId}/logs`, { headers: { authorization: `Bearer ${key}` } });
      assert.equal(res.status, 200);
      rest = ((await res.json()) as { logs: Entry[] }).logs;
      return rest.some((e) => e.fields.event === 'process' && e.fields.status === 'exited');
    });
    assert.equal(rest[0].message, 'Sandbox created');
    const e2bProcess = rest.filter((e) => e.fields.event === 'process' && e.fields.command.includes('echo logged-by-e2b'));
    assert.deepEqual(e2bProcess.map((e) => [e.level, e.fields.status ?? 'started', e.fields.exit_code ?? '']), [['info', 'started', ''], ['info', 'exited', '0']]);
    const execs = rest.filter((e) => e.fields.event === 'exec');
    assert.deepEqual(execs.map((e) => [e.level, e.fields.command, e.fields.exit_code]), [['info', 'echo rest-exec', '0'], ['warn', 'exit 3', '3']]);

    const v2 = async (query: string) => {
      const res = await fetch(`${base}/e2b/api/v2/sandboxes/${sbx.sandboxId}/logs${query}`, { headers: { 'x-api-key': key } });
      assert.equal(res.status, 200);
      return ((await res.json()) as { logs: Entry[] }).logs;
    };
    assert.deepEqual(await v2(''), rest, 'E2B reads the same log');
    assert.deepEqual((await v2('?level=warn')).map((e) => e.fields.command), ['exit 3']);
    assert.deepEqual((await v2('?search=rest-exec&direction=backward')).map((e) => e.message), [execs[0].message]);
  } finally {
    await sbx.kill();
  }
});

test("e2b 2.51 getMetrics on real VMs: the guest's disk use as df / says it, grown by a 20 MiB file at the next reading", async () => {
  const MiB = 1048576;
  const sbx = await e2bNew.Sandbox.create('base', { ...opts(), timeoutMs: 300_000 });
  try {
    // A sandbox's first read of its metrics samples it at once, its disk too.
    const [first] = await sbx.getMetrics();
    assert.ok(first.diskUsed > 0 && first.diskUsed < first.diskTotal, `${first.diskUsed} of ${first.diskTotal}`);
    const df = async () => {
      const cols = (await sbx.commands.run('df -k / | tail -n 1')).stdout.trim().split(/\s+/);
      return { total: Number(cols[1]) * 1024, used: Number(cols[2]) * 1024 };
    };
    const seen = await df();
    assert.equal(first.diskTotal, seen.total, "the size is df's");
    assert.ok(Math.abs(first.diskUsed - seen.used) < MiB, `used ${first.diskUsed}, df says ${seen.used}`);

    await sbx.commands.run('head -c 20971520 /dev/zero > /root/twenty && sync');
    const written = Date.now();
    // Read every 30 s (the samples between carry the last reading): the next one shows the file.
    let grown: Awaited<ReturnType<typeof sbx.getMetrics>>[number] | undefined;
    const deadline = Date.now() + 75_000;
    while (!grown) {
      assert.ok(Date.now() < deadline, 'no sample within 75 s shows the 20 MiB file');
      await sleep(1000);
      grown = (await sbx.getMetrics({ start: new Date(written) })).find((m) => m.diskUsed - first.diskUsed >= 20 * MiB);
    }
    const growth = grown.diskUsed - first.diskUsed;
    assert.ok(growth < 21 * MiB, `used grew by ${growth} bytes for 20 MiB written`);
    assert.equal(grown.diskTotal, first.diskTotal);
    const now = await df();
    assert.ok(Math.abs(grown.diskUsed - now.used) < MiB, `used ${grown.diskUsed}, df says ${now.used}`);
    // REST serves the same samples.
    const res = await fetch(`${base}/v1/sandboxes/${sbx.sandboxId}/metrics`, { headers: { authorization: `Bearer ${key}` } });
    const rest = (await res.json()) as { disk_period_secs: number; samples: Array<{ disk_used_bytes: number | null; disk_total_bytes: number | null }> };
    assert.equal(rest.disk_period_secs, 30);
    const last = rest.samples.at(-1)!;
    assert.equal(last.disk_total_bytes, grown.diskTotal);
    assert.ok(last.disk_used_bytes! - first.diskUsed >= 20 * MiB, `the latest REST sample says ${last.disk_used_bytes} used`);
  } finally {
    await sbx.kill();
  }
});

test('e2b 2.30: create, run, stdin, files, pause and connect', async () => {
  const { Sandbox } = e2bOld;
  const sbx = await Sandbox.create('base', { ...opts(), timeoutMs: 300_000 });
  try {
    assert.equal((await sbx.commands.run('echo old-sdk')).stdout, 'old-sdk\n');
    const seen: string[] = [];
    const cat = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => void seen.push(d) });
    await sbx.commands.sendStdin(cat.pid, 'x\n');
    await until('the echo of stdin', () => seen.join('') === 'x\n');
    await sbx.commands.kill(cat.pid);
    await sbx.files.write('/root/old.txt', 'old');
    assert.equal(await sbx.files.read('/root/old.txt'), 'old');
    assert.equal(await sbx.betaPause(), true);
    const again = await Sandbox.connect(sbx.sandboxId, opts());
    assert.equal(await again.files.read('/root/old.txt'), 'old');
  } finally {
    await sbx.kill();
  }
});
