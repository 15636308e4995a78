/**
 * collimate-vmm-launch for real (root and a C compiler needed, as for the server itself): it must
 * leave the program it runs with exactly the confinement the jail promises — the VMM's uid and gid,
 * no capabilities in any set, no_new_privs, a read-only root that holds only what was bound, shared
 * files read-only, writable directories without exec — and a failed step must stop the launch.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureLauncher, launchArgs, rootLevelDirs, systemBinds, type ViewPlan } from '../../../src/vmm/jail.ts';

const root = process.getuid?.() === 0;

test('the launcher confines what it runs: uid, capabilities, no_new_privs, the mount view and its flags', { skip: !root && 'needs root' }, async () => {
  const work = mkdtempSync(join(tmpdir(), 'vmmlaunch-'));
  try {
    const bin = await ensureLauncher(join(work, 'assets'), join(work, 'tmp'));
    const own = join(work, 'vm');
    const shared = join(work, 'shared.mem');
    const viewRoot = join(work, 'root');
    mkdirSync(own);
    mkdirSync(viewRoot);
    writeFileSync(shared, 'ram');
    const top = rootLevelDirs();
    const plan: ViewPlan = {
      root: viewRoot, cgroupProcs: [],
      binds: [
        ...systemBinds({ accel: 'tcg', qemuBinary: 'qemu-system-x86_64', hasLdCache: true }), ...top.binds,
        { src: own, dst: own, kind: 'dir', ro: false },
        { src: shared, dst: shared, kind: 'file', ro: true },
      ],
      symlinks: top.symlinks, proc: 'private', uid: 200999, gid: 200999, groups: [], env: { COLLIMATE_PROBE: 'yes' }, noThp: true,
    };
    const script = 'cat /proc/self/status; echo ---; cat /proc/self/mountinfo; echo ---; echo $COLLIMATE_PROBE; ls /; echo ---; ' +
      `echo x >> ${shared} 2>/dev/null && echo shared-writable; touch /planted 2>/dev/null && echo root-writable; true`;
    const out = execFileSync(bin, [...launchArgs(plan), '--', '/bin/sh', '-c', script], { encoding: 'utf8', env: { PATH: '/usr/bin:/bin' } });
    const [status, mountinfo, rest] = out.split('---\n');
    const field = (k: string) => new RegExp(`^${k}:[ \\t]*(.*)$`, 'm').exec(status)![1].trim();
    assert.deepEqual(field('Uid').split(/\s+/).map(Number), [200999, 200999, 200999, 200999]);
    assert.deepEqual(field('Gid').split(/\s+/).map(Number), [200999, 200999, 200999, 200999]);
    assert.equal(field('Groups'), '');
    for (const c of ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb']) assert.equal(BigInt(`0x${field(c)}`), 0n, c);
    assert.equal(field('NoNewPrivs'), '1');
    assert.equal(field('THP_enabled'), '0', 'transparent huge pages are off (--no-thp), as they stay across exec');
    const mount = (dst: string) => mountinfo.split('\n').find((l) => l.split(' ')[4] === dst)?.split(' ')[5] ?? '';
    assert.match(mount('/'), /^ro,nosuid,nodev/, 'the root is read-only');
    assert.match(mount('/usr'), /^ro,nosuid,nodev/);
    assert.match(mount(shared), /^ro,nosuid,nodev/, 'a shared file is read-only');
    assert.match(mount(own), /^rw,nosuid,nodev,noexec/, 'the VMM\'s own directory is writable, without exec');
    assert.match(mount('/proc'), /nosuid,nodev,noexec/);
    assert.ok(!mountinfo.includes(work + '/root'), 'the old root is gone');
    const lines = rest.trim().split('\n');
    assert.equal(lines[0], 'yes', 'the environment is passed on');
    assert.ok(!lines.includes('home') && !lines.includes('root') && lines.includes('usr'), `only the view: ${lines.join(' ')}`);
    assert.ok(!out.includes('shared-writable') && !out.includes('root-writable'));
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
});

test('a failed step stops the launch with its name; a root uid is refused', { skip: !root && 'needs root' }, async () => {
  const work = mkdtempSync(join(tmpdir(), 'vmmlaunch-'));
  try {
    const bin = await ensureLauncher(join(work, 'assets'), join(work, 'tmp'));
    mkdirSync(join(work, 'root'));
    const top = rootLevelDirs();
    const plan = (over: Partial<ViewPlan>): ViewPlan => ({
      root: join(work, 'root'), cgroupProcs: [], binds: [{ src: '/usr', dst: '/usr', kind: 'dir', ro: true }, ...top.binds],
      symlinks: top.symlinks, proc: 'private', uid: 200999, gid: 200999, groups: [], env: {}, ...over,
    });
    const missing = spawnSync(bin, [...launchArgs(plan({ binds: [{ src: join(work, 'absent'), dst: '/x', kind: 'dir', ro: true }] })), '--', '/bin/true'], { encoding: 'utf8' });
    assert.equal(missing.status, 126);
    assert.match(missing.stderr, /collimate-vmm-launch: bind \.\/x: No such file or directory/);
    const asRoot = spawnSync(bin, [...launchArgs(plan({ uid: 0 })), '--', '/bin/true'], { encoding: 'utf8' });
    assert.equal(asRoot.status, 126);
    assert.match(asRoot.stderr, /refusing to run a VMM as root/);
    const ok = spawnSync(bin, [...launchArgs(plan({})), '--', '/bin/true'], { encoding: 'utf8' });
    assert.equal(ok.status, 0, ok.stderr);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
});
