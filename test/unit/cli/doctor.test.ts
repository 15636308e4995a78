/**
 * `collimate doctor` on this machine, and on prerequisites the test breaks: a home that cannot be
 * created, a home on a filesystem with no free space, a VMM uid range a user already has, a setting
 * serve would refuse. Nothing is mounted or installed: each breakage is a setting pointing elsewhere.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { run, type Io } from '../../../src/cli/commands.js';
import { detectAccel } from '../../../src/vmm/accel.js';

const MAIN = fileURLToPath(new URL('../../../src/cli/main.ts', import.meta.url));

/** The environment without the test runner's COLLIMATE_* overrides: the host's own defaults. */
const hostEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('COLLIMATE_')));

let dir: string;
// Short: a home (the cache too, by default) must leave room for the VMM sockets below it (config.ts).
before(() => (dir = mkdtempSync(join(tmpdir(), 'cd-'))));
after(() => rmSync(dir, { recursive: true, force: true }));

async function doctor(env: Record<string, string | undefined>, ...args: string[]) {
  const out: string[] = [];
  const err: string[] = [];
  const io: Io = { out: (s) => out.push(s), err: (s) => err.push(s), outBytes: () => {}, errBytes: () => {}, env: { ...hostEnv, ...env } };
  const code = await run(['doctor', ...args], io);
  const lines = out.join('').trimEnd().split('\n');
  const line = (name: string) => lines.find((l) => new RegExp(`^(ok|warn|FAIL)\\s+${name.replace(/[()]/g, '\\$&')}\\s`).test(l));
  return { code, stdout: out.join(''), stderr: err.join(''), lines, line };
}

test('on this machine: the accelerator finding is printed (TCG as a warning) and every other check passes', () => {
  const home = join(dir, 'home');
  const r = spawnSync(process.execPath, ['--import', 'tsx', MAIN, 'doctor', '--home', home], { encoding: 'utf8', env: hostEnv, timeout: 60_000 });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  const lines = r.stdout.trimEnd().split('\n');
  const accel = lines.find((l) => /^\w+\s+accelerator\s/.test(l));
  if (detectAccel(hostEnv).accel === 'tcg') {
    assert.match(accel ?? '', /^warn\s+accelerator\s+TCG \(.+\): guests run emulated .* — fix: .*kvm_intel or kvm_amd/);
  } else {
    assert.match(accel ?? '', /^ok\s+accelerator\s+KVM/);
  }
  for (const name of ['node', 'qemu', 'cgroups', 'uid range', 'nftables', 'tmpfs /dev/shm', 'RAM dir', 'free disk \\(home\\)']) {
    assert.ok(lines.some((l) => new RegExp(`^ok\\s+${name}\\s`).test(l)), `${name} passes:\n${r.stdout}`);
  }
  assert.deepEqual(lines.filter((l) => !l.startsWith('ok ') && l !== accel), [], 'nothing else warns or fails');
  assert.match(lines.find((l) => /free disk \(home\)/.test(l))!, new RegExp(`${home} \\(does not exist yet; serve creates it in ${dir}\\): [\\d.]+ GiB free`));
});

test('a home that cannot be created is named, with the fix, and the exit status is 1', async () => {
  const file = join(dir, 'a-file');
  writeFileSync(file, '');
  const r = await doctor({}, '--home', join(file, 'home'));
  assert.equal(r.code, 1);
  assert.match(r.line('home') ?? '', new RegExp(`^FAIL\\s+home\\s+${file} is not a directory, so ${file}/home cannot be created there — fix: choose a writable home`));
  assert.match(r.stderr, /1 prerequisite broken: home/);
});

test('a home on a filesystem with no free space fails the free disk check', async () => {
  // procfs has no free blocks at all: as full as a filesystem gets, without filling one.
  const r = await doctor({ COLLIMATE_HOME: '/proc/collimate-doctor-test' });
  assert.equal(r.code, 1);
  assert.match(r.line('free disk (home)') ?? '', /^FAIL\s+free disk \(home\)\s+\/proc\/collimate-doctor-test .*: 0 MiB free, less than 2\.0 GiB .* — fix: free space there, or move the home/);
  assert.match(r.stderr, /broken: free disk \(home\)/);
});

test('a VMM uid range that a user already has fails, naming the user', async () => {
  // nobody (65534) is in every Debian /etc/passwd.
  const r = await doctor({ COLLIMATE_VMM_UID_BASE: '65000', COLLIMATE_VMM_UID_COUNT: '1000' }, '--home', join(dir, 'h2'));
  if (process.getuid?.() !== 0) return; // confinement (and its uid range) needs root; the line says so
  assert.equal(r.code, 1);
  assert.match(r.line('uid range') ?? '', /^FAIL\s+uid range\s+VMM uids 65000…65999 are also used by user nobody \(uid 65534\) in \/etc\/passwd — fix: move the range with COLLIMATE_VMM_UID_BASE/);
  const bad = await doctor({ COLLIMATE_VMM_UID_BASE: '10' }, '--home', join(dir, 'h3'));
  assert.equal(bad.code, 1);
  assert.match(bad.line('uid range') ?? '', /^FAIL\s+uid range\s+bad VMM uid range 10\+65536/);
});

test('a VMM uid range with every uid claimed fails; the free count is shown otherwise', async () => {
  if (process.getuid?.() !== 0) return;
  const runDir = join(dir, 'run');
  mkdirSync(join(runDir, 'uids'), { recursive: true });
  for (const uid of [300000, 300001, 300002]) writeFileSync(join(runDir, 'uids', String(uid)), '{}');
  const env = { COLLIMATE_RUN_DIR: runDir, COLLIMATE_VMM_UID_BASE: '300000', COLLIMATE_VMM_UID_COUNT: '3' };
  const full = await doctor(env, '--home', join(dir, 'h6'));
  assert.equal(full.code, 1);
  assert.match(full.line('uid range') ?? '', /^FAIL\s+uid range\s+VMM uids 300000…300002: every one is claimed \(.*\/run\/uids\), so no VMM can start — fix:/);
  rmSync(join(runDir, 'uids', '300001'));
  assert.match((await doctor(env, '--home', join(dir, 'h6'))).line('uid range') ?? '', /^ok\s+uid range\s+VMM uids 300000…300002, 1 free/);
});

test('free space below what admission keeps in reserve fails, naming the setting', async () => {
  const r = await doctor({ COLLIMATE_DISK_RESERVE_MIB: String(64 * 1024 * 1024) }, '--home', join(dir, 'h7'));
  assert.equal(r.code, 1);
  assert.match(r.line('free disk (home)') ?? '', /^FAIL\s+free disk \(home\)\s+.*less than [\d.]+ GiB \(.*67108864 MiB stay free by COLLIMATE_DISK_RESERVE_MIB\)/);
  const t = await doctor({ COLLIMATE_TMPFS_RESERVE_MIB: String(64 * 1024 * 1024) }, '--home', join(dir, 'h7'));
  assert.equal(t.code, 1);
  assert.match(t.line('tmpfs /dev/shm') ?? '', /^FAIL\s+tmpfs \/dev\/shm\s+.*the 67108864 MiB reserve of COLLIMATE_TMPFS_RESERVE_MIB\) — fix: grow it/);
});

test('a setting serve would refuse fails first, naming it', async () => {
  const r = await doctor({ COLLIMATE_ACCEL: 'fast' }, '--home', join(dir, 'h4'));
  assert.equal(r.code, 1);
  assert.match(r.line('settings') ?? '', /^FAIL\s+settings\s+COLLIMATE_ACCEL must be "kvm" or "tcg", not "fast" — fix:/);
});

test('--json gives the same checks as objects', async () => {
  const r = await doctor({}, '--home', join(dir, 'h5'), '--json');
  const checks = JSON.parse(r.stdout) as Array<{ name: string; verdict: string; detail: string }>;
  assert.ok(checks.length >= 9);
  for (const c of checks) assert.match(c.verdict, /^(ok|warn|fail)$/);
  assert.ok(checks.some((c) => c.name === 'accelerator'));
});
