/**
 * The systemd unit and `collimate service install`. Nothing is installed on this machine: the unit is
 * rendered into a temporary root, and `systemctl` is a stand-in on PATH that records its arguments.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { APP_DIR, installPlan, SHIPPED_UNIT, systemdUnit, UNIT_NAME } from '../../../src/cli/service.js';

const MAIN = fileURLToPath(new URL('../../../src/cli/main.ts', import.meta.url));
const SHIPPED = new URL('../../../deploy/collimate.service', import.meta.url);

let dir: string;
before(() => (dir = mkdtempSync(join(tmpdir(), 'collimate-service-'))));
after(() => rmSync(dir, { recursive: true, force: true }));

/** A directory holding a `systemctl` that appends its arguments to `log` and exits `status`. */
function fakeSystemctl(status = 0): { bin: string; log: string } {
  const bin = mkdtempSync(join(dir, 'bin-'));
  const log = join(bin, 'calls');
  writeFileSync(join(bin, 'systemctl'), `#!/bin/sh\necho "$*" >> '${log}'\n[ ${status} -eq 0 ] || echo "Failed to connect to bus" >&2\nexit ${status}\n`);
  chmodSync(join(bin, 'systemctl'), 0o755);
  return { bin, log };
}

function cli(args: string[], env: Record<string, string> = {}) {
  return spawnSync(process.execPath, ['--import', 'tsx', MAIN, ...args], { encoding: 'utf8', env: { ...process.env, ...env }, timeout: 60_000 });
}

test('deploy/collimate.service is the unit rendered for /opt/collimate', () => {
  assert.equal(
    readFileSync(SHIPPED, 'utf8'),
    systemdUnit(SHIPPED_UNIT),
    'regenerate: node --import tsx -e "import(\'./src/cli/service.ts\').then((m) => process.stdout.write(m.systemdUnit(m.SHIPPED_UNIT)))" > deploy/collimate.service',
  );
});

test('the unit restarts on failure and stops only the server, so VMs survive a restart', () => {
  const unit = systemdUnit(SHIPPED_UNIT);
  const directives = unit.split('\n').filter((l) => /^[A-Za-z]+=/.test(l));
  for (const d of [
    'Type=exec',
    'ExecStart=/usr/bin/node /opt/collimate/bin/collimate.js serve --home /var/lib/collimate --host 127.0.0.1 --port 7070',
    // SIGTERM drains and leaves QEMU running for re-adoption; the default (control-group) would kill every VMM.
    'KillMode=process',
    'KillSignal=SIGTERM',
    'TimeoutStopSec=30',
    'Delegate=yes',
    'Restart=on-failure',
    'RestartPreventExitStatus=78',
    'EnvironmentFile=-/etc/default/collimate',
    'WantedBy=multi-user.target',
  ]) assert.ok(directives.includes(d), `${d} in\n${unit}`);
  assert.ok(!directives.some((d) => /^KillMode=(control-group|mixed)$/.test(d)));
  // The drain's grace (5 s) and the forced close (2 s) fit well within the stop timeout.
  assert.ok(Number(/^TimeoutStopSec=(\d+)$/m.exec(unit)![1]) >= 15);
});

test('ExecStart quotes what systemd would split or expand', () => {
  const unit = systemdUnit({ ...SHIPPED_UNIT, home: '/srv/my data/100%$HOME', serveArgs: ['--allow-tcg'] });
  assert.match(unit, /^ExecStart=\/usr\/bin\/node \/opt\/collimate\/bin\/collimate\.js serve --home "\/srv\/my data\/100%%\$\$HOME" --host 127\.0\.0\.1 --port 7070 --allow-tcg$/m);
});

test('install plan: write the unit, daemon-reload, enable (and start with --now); under a root only enable there', () => {
  const o = { ...SHIPPED_UNIT, enable: true, now: false };
  assert.deepEqual(installPlan(o).commands, [['daemon-reload'], ['enable', UNIT_NAME]]);
  assert.equal(installPlan(o).unitPath, '/etc/systemd/system/collimate.service');
  assert.deepEqual(installPlan({ ...o, now: true }).commands, [['daemon-reload'], ['enable', '--now', UNIT_NAME]]);
  assert.deepEqual(installPlan({ ...o, enable: false }).commands, [['daemon-reload']]);
  const rooted = installPlan({ ...o, root: '/tmp/image' });
  assert.equal(rooted.unitPath, '/tmp/image/etc/systemd/system/collimate.service');
  assert.deepEqual(rooted.commands, [['--root=/tmp/image', 'enable', UNIT_NAME]]);
});

test('collimate service install --root writes the unit into that tree and enables it there', () => {
  const root = join(dir, 'root');
  const { bin, log } = fakeSystemctl();
  const cert = join(dir, 'c.pem');
  const r = cli(['service', 'install', '--root', root, '--home', '/srv/collimate', '--port', '7443', '--tls-cert', cert, '--tls-key', join(dir, 'k.pem')], { PATH: `${bin}:${process.env.PATH}` });
  assert.equal(r.status, 0, r.stderr);
  const path = join(root, 'etc/systemd/system/collimate.service');
  assert.equal(statSync(path).mode & 0o777, 0o644);
  const unit = readFileSync(path, 'utf8');
  assert.equal(
    /^ExecStart=(.*)$/m.exec(unit)![1],
    `${process.execPath} ${join(APP_DIR, 'bin/collimate.js')} serve --home /srv/collimate --host 127.0.0.1 --port 7443 --tls-cert ${cert} --tls-key ${join(dir, 'k.pem')}`,
  );
  assert.ok(existsSync(join(APP_DIR, 'bin/collimate.js')), 'ExecStart names a file that exists');
  assert.equal(readFileSync(log, 'utf8'), `--root=${root} enable collimate.service\n`);
  assert.match(r.stdout, new RegExp(`wrote ${path}`));

  // The rendered unit is one systemd itself accepts (offline: nothing is loaded into the running manager).
  const analyze = spawnSync('systemd-analyze', ['verify', path], { encoding: 'utf8' });
  if (!analyze.error) assert.equal(analyze.status, 0, analyze.stderr);
  if (!analyze.error) assert.equal(analyze.stderr.trim(), '', analyze.stderr);
});

test('a systemctl that fails is reported with the command and where the unit is', () => {
  const root = join(dir, 'root2');
  const { bin } = fakeSystemctl(1);
  const r = cli(['service', 'install', '--root', root], { PATH: `${bin}:${process.env.PATH}` });
  assert.equal(r.status, 1);
  assert.match(r.stderr, new RegExp(`systemctl --root=${root} enable collimate\\.service failed \\(exit 1: Failed to connect to bus\\); the unit is written at ${root}/etc/systemd/system/collimate\\.service`));
});

test('bad service arguments are usage errors', () => {
  const half = cli(['service', 'install', '--root', join(dir, 'r3'), '--tls-cert', 'x.pem']);
  assert.equal(half.status, 2);
  assert.match(half.stderr, /--tls-cert and --tls-key go together/);
  const port = cli(['service', 'unit', '--port', '99999']);
  assert.equal(port.status, 2);
  assert.match(port.stderr, /--port must be a TCP port/);
  const sub = cli(['service', 'start']);
  assert.equal(sub.status, 2);
  assert.match(sub.stderr, /unknown service command start: use service install or service unit/);
  assert.ok(!existsSync(join(dir, 'r3')), 'nothing written on a usage error');
});
