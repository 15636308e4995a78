// Isolation on real microVMs: every VMM process confined (uid, capabilities, no_new_privs, seccomp,
// cgroup limits, a mount view without other sandboxes' files), a hostile sandbox that fork-bombs,
// exhausts its memory, fills its disk and floods stdout while its neighbour keeps working, and the
// accelerator policy of `collimate serve`. Timings are measured in bench/noisy-neighbour.ts, not here.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { readFileSync, readdirSync, statSync, existsSync, readlinkSync } from 'node:fs';
import { join, basename, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { isAlive } from '../../src/vmm/vmm.ts';
import { homePaths } from '../../src/host/paths.ts';
import { jailerFor } from '../../src/vmm/jail.ts';
import { loadConfig } from '../../src/config.ts';
import { EXIT_TCG_REFUSED } from '../../src/cli/commands.ts';
import { openEngine, testHome, assertNoLeaks, qemuProcesses, TEST_CACHE } from './fixture.ts';

const tenant = { tenant: 'it-isolation' };
let engine: Engine;
let home: string;

before(async () => {
  home = testHome('isolation');
  engine = await openEngine(home);
});

after(async () => {
  await assertNoLeaks(engine, home);
});

function status(pid: number): Record<string, string> {
  const out: Record<string, string> = {};
  for (const l of readFileSync(`/proc/${pid}/status`, 'utf8').split('\n')) {
    const i = l.indexOf(':');
    if (i > 0) out[l.slice(0, i)] = l.slice(i + 1).trim();
  }
  return out;
}

/** Runs `sh -c cmd` inside the VMM's mount namespace, as root or as the VMM's own uid. */
function inView(pid: number, cmd: string, asUid?: number): { code: number; out: string } {
  const who = asUid === undefined ? [] : ['-S', String(asUid), '-G', String(asUid)];
  const r = spawnSync('nsenter', ['-t', String(pid), '-m', ...who, '--', '/bin/sh', '-c', cmd], { encoding: 'utf8' });
  return { code: r.status ?? -1, out: (r.stdout + r.stderr).trim() };
}

const readInt = (p: string) => Number(readFileSync(p, 'utf8').trim());

test('confinement audit: every VMM has its own uid, no capabilities, no_new_privs, seccomp, cgroup limits and a view of only its own files', async (t) => {
  if (!(await jailerFor(engine.cfg))) return t.skip('VMMs are not confined on this host (the server must run as root)');
  const a = await engine.create({ template: 'base' }, tenant);
  const b = await engine.create({ template: 'base' }, tenant);
  const recA = engine.repo.get(a.id)!.vmm!;
  const recB = engine.repo.get(b.id)!.vmm!;
  const shape = engine.get(a.id);
  const limits = engine.cfg.jail;
  const uids = new Set<number>();
  for (const [id, rec] of [[a.id, recA], [b.id, recB]] as const) {
    const st = status(rec.pid);
    const [ruid, euid, suid, fsuid] = st.Uid.split(/\s+/).map(Number);
    assert.ok(euid !== 0 && ruid === euid && suid === euid && fsuid === euid, `${id}: uid ${st.Uid}`);
    assert.ok(!st.Gid.split(/\s+/).map(Number).includes(0), `${id}: gid ${st.Gid}`);
    assert.equal(st.Groups, '', `${id}: no supplementary groups`);
    for (const c of ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb']) assert.equal(BigInt(`0x${st[c]}`), 0n, `${id}: ${c} ${st[c]}`);
    assert.equal(st.NoNewPrivs, '1', `${id}: no_new_privs`);
    assert.equal(st.Seccomp, '2', `${id}: seccomp filter mode`);
    // Under TCG no transparent huge pages: QEMU's madvise would give each sandbox whole 2 MiB pages
    // of its translation cache and firmware RAM (jail.ts, ViewPlan.noThp).
    if (engine.cfg.accel.accel === 'tcg') {
      assert.equal(st.THP_enabled, '0', `${id}: transparent huge pages off`);
      assert.match(readFileSync(`/proc/${rec.pid}/smaps_rollup`, 'utf8'), /^AnonHugePages:\s+0 kB$/m, `${id}: no huge page mapped`);
    }
    assert.equal(euid, rec.jail!.uid);
    uids.add(euid);

    // Its cgroup: the limits configured from the VM size, and the process in it.
    const cg = rec.jail!.cgroups;
    assert.ok(cg.length > 0, 'a cgroup was made');
    const memBytes = (shape.memory_mib + limits.memoryOverheadMib) * 1024 * 1024;
    if (cg.length === 1) {
      assert.equal(readInt(join(cg[0], 'memory.max')), memBytes);
      assert.equal(readFileSync(join(cg[0], 'cpu.max'), 'utf8').trim(), `${shape.vcpus * 100_000} 100000`);
      assert.equal(readInt(join(cg[0], 'pids.max')), limits.pidsMax);
    } else {
      const [mem, cpu, pids] = cg;
      assert.equal(readInt(join(mem, 'memory.limit_in_bytes')), memBytes);
      assert.equal(readInt(join(cpu, 'cpu.cfs_quota_us')), shape.vcpus * readInt(join(cpu, 'cpu.cfs_period_us')));
      assert.equal(readInt(join(pids, 'pids.max')), limits.pidsMax);
    }
    for (const d of cg) assert.ok(readFileSync(join(d, 'cgroup.procs'), 'utf8').split('\n').includes(String(rec.pid)), `${rec.pid} is in ${d}`);

    // Sockets: made by the server, root's, 0600. The VMM's own files: its uid, 0600. Shared ones: root's, 0644.
    for (const s of ['qmp.sock', 'agent.sock']) {
      const ss = statSync(join(rec.dir, s));
      assert.ok(ss.isSocket() && ss.uid === 0 && (ss.mode & 0o777) === 0o600, `${s}: uid ${ss.uid} mode ${(ss.mode & 0o777).toString(8)}`);
    }
    const dir = statSync(rec.dir);
    assert.ok(dir.uid === 0 && (dir.mode & 0o777) === 0o711, 'the VMM dir is root-owned 0711');
    const top = statSync(rec.diskPath);
    assert.ok(top.uid === euid && (top.mode & 0o777) === 0o600, 'the top disk is the VMM\'s own');
    const ram = statSync(rec.memPath);
    assert.ok(ram.uid === 0 && (ram.mode & 0o777) === 0o644, 'the template RAM file is root-owned and read-only to VMMs');
    // ...and QEMU holds it open read-only (the ramro shim), though it maps it copy-on-write.
    const fds = readdirSync(`/proc/${rec.pid}/fd`).filter((fd) => { try { return readlinkSync(`/proc/${rec.pid}/fd/${fd}`) === rec.memPath; } catch { return false; } });
    assert.ok(fds.length >= 1, 'QEMU has the RAM file open');
    for (const fd of fds) {
      const flags = parseInt(/flags:\s+(\d+)/.exec(readFileSync(`/proc/${rec.pid}/fdinfo/${fd}`, 'utf8'))![1], 8);
      assert.equal(flags & 3, 0, 'O_RDONLY');
    }
  }
  assert.equal(uids.size, 2, 'the two VMMs run under different uids');

  // The mount view of A: its own dir and disks, no trace of B.
  const sbx = homePaths(home).sandboxes;
  const view = (cmd: string) => inView(recA.pid, cmd);
  assert.equal(view(`ls ${sbx}`).out, a.id, 'only its own sandbox directory exists');
  assert.notEqual(view(`test -e ${recB.dir}`).code, 0, 'B\'s directory does not exist in A\'s view');
  assert.notEqual(view(`test -e ${recB.diskPath}`).code, 0, 'B\'s disk does not exist in A\'s view');
  assert.deepEqual(view(`ls ${homePaths(home).disks}`).out.split('\n').sort(), [basename(recA.diskPath)]);
  assert.notEqual(view(`test -e ${join(home, 'collimate.db')}`).code, 0, 'the database is not in the view');
  assert.deepEqual(view(`ls ${dirname(recA.memPath)}`).out.split('\n'), [basename(recA.memPath)], 'only its RAM file in the RAM directory');
  assert.deepEqual(view('ls /').out.split('\n').sort().filter((x) => !['bin', 'lib', 'lib64', 'sbin'].includes(x)).filter((x) => !home.startsWith(`/${x}`) && !TEST_CACHE.startsWith(`/${x}`)),
    ['dev', 'etc', 'proc', 'usr'], 'the root holds /usr, /etc (the loader cache), /dev, /proc and the data paths');
  // As the VMM's uid: /proc shows only its own processes; shared files are not writable; sockets not its own.
  const uidA = recA.jail!.uid;
  const procs = inView(recA.pid, 'ls /proc | grep -E "^[0-9]+$"', uidA).out.split('\n');
  assert.ok(procs.includes(String(recA.pid)) && !procs.includes(String(recB.pid)), `hidepid: ${procs.join(' ')}`);
  assert.notEqual(inView(recA.pid, `echo x >> ${recA.memPath}`, uidA).code, 0, 'the template RAM file cannot be written');
  assert.notEqual(inView(recA.pid, `touch ${recA.dir}/planted`, uidA).code, 0, 'nothing can be created in its directory');
  assert.notEqual(inView(recA.pid, `cat ${join(recA.dir, 'vmm.json')}`, uidA).code, 0, 'the server\'s record is not readable');
  assert.equal(inView(recA.pid, `test -w ${recA.diskPath} && echo writable`, uidA).out, 'writable', 'its own disk is writable');

  // The sandbox still works, and a live fork of it is confined the same way.
  assert.equal((await engine.exec(a.id, { command: 'echo ok' })).stdout, 'ok\n');
  const [child] = await engine.fork(a.id, { count: 1 });
  const recC = engine.repo.get(child.id)!.vmm!;
  assert.notEqual(status(recC.pid).Uid.split(/\s+/)[1], '0');
  assert.notEqual(recC.jail!.uid, uidA);
  assert.equal(inView(recC.pid, `ls ${sbx}`).out, child.id);
  assert.equal((await engine.exec(child.id, { command: 'echo child' })).stdout, 'child\n');
  for (const id of [a.id, b.id, child.id]) await engine.delete(id);
  for (const rec of [recA, recB, recC]) for (const d of rec.jail!.cgroups) assert.ok(!existsSync(d), `cgroup ${d} removed with its VMM`);
});

test('noisy neighbour: A fork-bombs, exhausts its memory, fills its disk and floods stdout; every outcome is reported, A stays usable and B keeps working', async () => {
  const a = await engine.create({ template: 'base' }, tenant);
  const b = await engine.create({ template: 'base' }, tenant);
  const recA = engine.repo.get(a.id)!.vmm!;
  for (let i = 0; i < 5; i++) assert.equal((await engine.exec(b.id, { command: 'true' })).exit_code, 0);

  // B runs `true` over and over while A misbehaves; every one of them must succeed.
  let stop = false;
  const bResults: number[] = [];
  const bLoop = (async () => {
    while (!stop) {
      const r = await engine.exec(b.id, { command: 'true', timeout: 120 });
      bResults.push(r.exit_code);
    }
  })();
  const rss0 = process.memoryUsage().rss;

  try {
    // 1. Fork bombs. The guest agent runs each exec in a guest cgroup of its own with a process limit
    // (pids.max), above them all in CPU weight: the bomb hits the limit, the agent kills the whole
    // tree at once and says so, and the sandbox stays usable.
    const t0 = Date.now();
    const bomb = await engine.exec(a.id, { command: 'bomb() { bomb | bomb & }; bomb; sleep 30', timeout: 120 });
    const bombMs = Date.now() - t0;
    assert.equal(bomb.pids_limited, true, JSON.stringify(bomb).slice(0, 500));
    assert.match(bomb.error ?? '', /hit its process limit \(\d+ processes/);
    assert.equal(bomb.timed_out, false, 'the agent ended it, not the timeout');
    assert.equal(bomb.exit_code, 137, 'its processes were SIGKILLed');
    assert.equal(bomb.oom_killed, undefined);
    assert.ok(bombMs < 30_000, `the bomb was stopped before its own sleep ended (${bombMs} ms)`);
    const after = await engine.exec(a.id, { command: 'echo usable; ls -d /sys/fs/cgroup/execs/exec-* | wc -l', timeout: 60 });
    assert.equal(after.stdout.split('\n')[0], 'usable');
    assert.equal(after.pids_limited, undefined);
    // The classic form backgrounds itself, so its exec returns at once (exit 0); the agent keeps
    // watching the exec's cgroup and kills the tree when it reaches the limit, then removes the cgroup.
    const classic = await engine.exec(a.id, { command: 'f(){ f|f& };f', timeout: 60 });
    assert.equal(classic.exit_code, 0, JSON.stringify(classic).slice(0, 500));
    let left = '';
    for (const deadline = Date.now() + 120_000; Date.now() < deadline; await sleep(500)) {
      left = (await engine.exec(a.id, { command: 'ls -d /sys/fs/cgroup/execs/exec-* | wc -l; dmesg | grep -c "fork rejected by pids controller"', timeout: 60 })).stdout;
      if (left.split('\n')[0] === '1') break;
    }
    assert.equal(left.split('\n')[0], '1', 'only the running exec\'s cgroup is left: the background bomb was killed and its cgroup removed');
    assert.ok(Number(left.split('\n')[1]) >= 2, `both bombs hit their limit (dmesg: ${left})`);
    // The host side never saw more than QEMU's own threads.
    const cgA = recA.jail?.cgroups ?? [];
    const pidsDir = cgA.find((d) => d.includes('/pids/')) ?? cgA[0];
    if (pidsDir) assert.ok(readInt(join(pidsDir, 'pids.current')) <= engine.cfg.jail.pidsMax);
    // Background processes an exec starts on purpose still survive it.
    await engine.exec(a.id, { command: '(sleep 1000 & echo $! > /root/bg.pid)' });
    assert.equal((await engine.exec(a.id, { command: 'kill -0 $(cat /root/bg.pid) && echo alive' })).stdout, 'alive\n');

    // 2. A memory hog beyond the guest's RAM: the guest OOM killer ends it, and the result says so.
    // (A plain kill -9 first: a SIGKILL alone is not reported as an OOM kill.)
    const kill9 = await engine.exec(a.id, { command: 'sh -c "kill -9 \\$\\$"' });
    assert.equal(kill9.exit_code, 137);
    assert.equal(kill9.oom_killed, undefined);
    const hog = await engine.exec(a.id, { command: 'head -c 600m /dev/zero | tail', timeout: 300 });
    assert.equal(hog.exit_code, 137, JSON.stringify(hog).slice(0, 500));
    assert.equal(hog.oom_killed, true);
    assert.match(hog.stderr, /Killed/);
    assert.ok(isAlive(recA.pid), 'the VMM itself was not killed (the guest, not the host, ran out of memory)');

    // 3. A disk fill: ENOSPC inside the guest, reported with the command's own exit code and message.
    const fill = await engine.exec(a.id, { command: 'dd if=/dev/zero of=/root/fill bs=1M', timeout: 600 });
    assert.equal(fill.exit_code, 1, JSON.stringify(fill).slice(0, 500));
    assert.match(fill.stderr, /No space left on device/);
    // The writable layer is a fixed-size disk: the host file stays within it.
    const diskMib = engine.get(a.id).disk_mib;
    assert.ok(statSync(engine.repo.get(a.id)!.vmm!.diskPath).size <= (diskMib + 64) * 1024 * 1024, 'the qcow2 stays within the disk size');
    assert.equal((await engine.exec(a.id, { command: 'rm /root/fill && echo freed' })).stdout, 'freed\n');

    // 4. 1 GB of stdout, and endless output: truncated at the cap, the server's memory stays bounded.
    const flood = await engine.exec(a.id, { command: 'head -c 1000000000 /dev/zero', timeout: 600 });
    assert.equal(flood.exit_code, 0);
    assert.equal(flood.stdout_truncated, true);
    assert.equal(Buffer.byteLength(flood.stdout), engine.cfg.maxOutputBytes);
    const endless = await engine.exec(a.id, { command: 'yes', timeout: 10 });
    assert.equal(endless.timed_out, true);
    assert.equal(endless.stdout_truncated, true);
    assert.ok(Buffer.byteLength(endless.stdout) <= engine.cfg.maxOutputBytes);
    const grown = process.memoryUsage().rss - rss0;
    assert.ok(grown < 256 * 1024 * 1024, `server RSS grew by ${(grown / 1048576).toFixed(0)} MiB over a 1 GB flood`);
  } finally {
    stop = true;
    await bLoop;
  }
  assert.ok(bResults.length > 0);
  assert.deepEqual([...new Set(bResults)], [0], 'every exec of B succeeded meanwhile');
  assert.ok(engine.isReady(), 'the server is healthy');
  assert.equal((await engine.exec(a.id, { command: 'echo still-usable' })).stdout, 'still-usable\n');
  await engine.delete(a.id);
  await engine.delete(b.id);
});

// ---- the accelerator policy of `collimate serve` (this host has no usable KVM) ----------------

const cli = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const serveEnv = { ...process.env, COLLIMATE_ACCEL: 'tcg', COLLIMATE_CACHE_DIR: TEST_CACHE, COLLIMATE_POOL_SIZE: '1', COLLIMATE_LOG_LEVEL: 'warn' };

test('under TCG, serve refuses a multi-tenant or non-loopback server without --allow-tcg, saying why and how; with it, it starts in development mode', async () => {
  const serveHome = testHome('isolation-serve');
  const refusedHost = spawnSync(process.execPath, ['--import', 'tsx', cli, 'serve', '--host', '0.0.0.0', '--port', '0', '--home', serveHome], { encoding: 'utf8', env: serveEnv, timeout: 120_000 });
  assert.equal(refusedHost.status, EXIT_TCG_REFUSED, refusedHost.stderr);
  assert.match(refusedHost.stderr, /refusing to serve: --host 0\.0\.0\.0 listens beyond loopback/);
  assert.match(refusedHost.stderr, /only KVM-accelerated guests as a security boundary/);
  assert.match(refusedHost.stderr, /https:\/\/www\.qemu\.org\/docs\/master\/system\/security\.html/);
  assert.match(refusedHost.stderr, /kvm_intel or kvm_amd.*--allow-tcg|--allow-tcg/s);
  for (const t of ['alpha', 'beta']) execFileSync(process.execPath, ['--import', 'tsx', cli, 'keys', 'create', '--tenant', t, '--home', serveHome], { env: serveEnv, stdio: 'ignore' });
  const refusedTenants = spawnSync(process.execPath, ['--import', 'tsx', cli, 'serve', '--port', '0', '--home', serveHome], { encoding: 'utf8', env: serveEnv, timeout: 120_000 });
  assert.equal(refusedTenants.status, EXIT_TCG_REFUSED, refusedTenants.stderr);
  assert.match(refusedTenants.stderr, /the keys table has 2 tenants/);
  assert.deepEqual(qemuProcesses(serveHome), [], 'a refused server spawned nothing');

  const port = 20000 + Math.floor(Math.random() * 20000);
  const child = spawn(process.execPath, ['--import', 'tsx', cli, 'serve', '--port', String(port), '--home', serveHome, '--allow-tcg'], { env: serveEnv, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d) => { stderr += d; });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  try {
    let health: any;
    const deadline = Date.now() + 300_000;
    while (!health) {
      assert.equal(child.exitCode, null, `serve exited: ${stderr}`);
      assert.ok(Date.now() < deadline, `serve did not become healthy: ${stderr}`);
      try {
        const r = await fetch(`http://127.0.0.1:${port}/healthz`);
        if (r.status === 200) health = await r.json();
      } catch { /* not listening yet */ }
      if (!health) await sleep(200);
    }
    assert.match(stderr, /DEVELOPMENT MODE: accelerator TCG/);
    assert.equal(health.mode, 'development');
    assert.equal(health.accel, 'tcg');
    assert.equal(health.isolation, 'QEMU does not treat TCG guest escapes as security bugs');
    if (process.getuid?.() === 0) {
      assert.equal(health.confinement.enabled, true);
      assert.match(health.confinement.cgroups, /^v[12]$/);
    }
  } finally {
    child.kill('SIGTERM');
  }
  assert.equal(await exited, 0, stderr);
  const deadline = Date.now() + 5000;
  while (qemuProcesses(serveHome).length > 0 && Date.now() < deadline) await sleep(50);
  assert.deepEqual(qemuProcesses(serveHome), [], 'the warm pool went with the server');
  const jailer = await jailerFor(loadConfig({ home: serveHome, cacheDir: TEST_CACHE }));
  assert.deepEqual(jailer?.cgroupDirs() ?? [], [], 'no cgroup left');
});
