/**
 * `collimate serve` as a systemd service: the unit (a pure function of where things are, golden-tested
 * and committed as deploy/collimate.service) and what `collimate service install` does with it.
 *
 * How the unit stops and restarts follows how the server runs its VMs:
 * - SIGTERM makes the server drain (new requests 503, in-flight ones get 5 s), close the engine
 *   and exit 0, leaving every sandbox's QEMU running; the next start re-adopts them. So only the
 *   server process is signalled (KillMode=process): systemd's default would kill every process in
 *   the unit's cgroup, QEMUs included, and a restart would lose every sandbox.
 * - QEMUs are spawned detached (a session of their own) and, when confined, moved into cgroups the
 *   server makes: under its own cgroup on cgroup v1 hosts, hence Delegate=yes so systemd leaves
 *   that subtree alone; at /collimate on cgroup v2 (cgroup.ts).
 * - Exit 78 (EX_CONFIG) is serve refusing its settings (the TCG policy): restarting cannot help.
 */
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const UNIT_NAME = 'collimate.service';

/** Where the unit lives on a host (under --root in tests and image builds). */
export const UNIT_DIR = '/etc/systemd/system';

export interface UnitOptions {
  /** Absolute path of the node binary. */
  node: string;
  /** The checkout or installed package: holds bin/collimate.js. */
  appDir: string;
  /** The server's data directory. */
  home: string;
  host: string;
  port: number;
  /** Extra `collimate serve` flags (e.g. --allow-tcg, --tls-cert FILE --tls-key FILE). */
  serveArgs?: string[];
}

/** The repository this file belongs to (what `service install` points the unit at). */
export const APP_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** What deploy/collimate.service is rendered from: a checkout in /opt/collimate, Debian paths. */
export const SHIPPED_UNIT: UnitOptions = { node: '/usr/bin/node', appDir: '/opt/collimate', home: '/var/lib/collimate', host: '127.0.0.1', port: 7070 };

/** A word of ExecStart: quoted when it holds what systemd would split or expand. */
function execWord(s: string): string {
  if (/^[A-Za-z0-9_@+=:,./-]+$/.test(s)) return s;
  return `"${s.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\$/g, '$$$$').replace(/%/g, '%%')}"`;
}

export function systemdUnit(o: UnitOptions): string {
  const exec = [o.node, join(o.appDir, 'bin/collimate.js'), 'serve', '--home', o.home, '--host', o.host, '--port', String(o.port), ...(o.serveArgs ?? [])]
    .map(execWord)
    .join(' ');
  return `# The Collimate server (collimate serve). Written by \`collimate service install\`; docs/operations.md.
# Settings: COLLIMATE_* variables in /etc/default/collimate (optional), e.g. COLLIMATE_CACHE_DIR=...

[Unit]
Description=Collimate sandbox server
Documentation=file://${join(o.appDir, 'docs/operations.md')}
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
ExecStart=${exec}
WorkingDirectory=${o.appDir}
EnvironmentFile=-/etc/default/collimate
# Runs as root: it starts each VMM under a uid of its own, in namespaces and cgroups it makes.
User=root

# SIGTERM drains requests and closes the server; the sandboxes' QEMU processes keep running and the
# next start re-adopts them. Only the server is signalled, and only it is killed after the timeout.
KillMode=process
KillSignal=SIGTERM
TimeoutStopSec=30
# The server makes cgroups for its VMMs under its own on cgroup v1 hosts: systemd leaves them alone.
Delegate=yes

Restart=on-failure
RestartSec=2
# 78: serve refused its settings (development mode under TCG); a restart would refuse again.
RestartPreventExitStatus=78

# Many sandboxes: sockets, disks and QEMU processes.
LimitNOFILE=1048576
TasksMax=infinity

# JSON log lines on stdout, start-up progress on stderr: both in the journal (journalctl -u collimate).
StandardOutput=journal
StandardError=journal
SyslogIdentifier=collimate

[Install]
WantedBy=multi-user.target
`;
}

export interface InstallPlan {
  unitPath: string;
  unit: string;
  /** systemctl argument lists, in order. */
  commands: string[][];
}

/**
 * What `service install` does: write the unit, reload systemd, enable it (and start it with `now`).
 * Under `root` (an image being built, a test) there is no running manager to reload or start: the
 * unit is enabled in that tree with `systemctl --root`.
 */
export function installPlan(o: UnitOptions & { root?: string; enable: boolean; now: boolean }): InstallPlan {
  const root = o.root ? resolve(o.root) : undefined;
  const unitPath = join(root ?? '/', UNIT_DIR, UNIT_NAME);
  const commands: string[][] = [];
  if (root) {
    if (o.enable) commands.push([`--root=${root}`, 'enable', UNIT_NAME]);
  } else {
    commands.push(['daemon-reload']);
    if (o.enable) commands.push(o.now ? ['enable', '--now', UNIT_NAME] : ['enable', UNIT_NAME]);
  }
  return { unitPath, unit: systemdUnit(o), commands };
}
