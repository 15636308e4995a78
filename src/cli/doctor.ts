/**
 * `collimate doctor`: checks that this host can run `collimate serve` with the same settings (the
 * home and COLLIMATE_* of the environment), one line per check with what to fix. Each check asks
 * the code that the server itself uses (accel.ts, cgroup.ts, jail.ts, netns.ts, config.ts), so the
 * doctor and the server cannot disagree. Read-only: it creates, mounts and claims nothing.
 *
 * `fail` is a broken prerequisite (serve would not start, or sandboxes would not run); `warn` is a
 * host that works with less (TCG instead of KVM, no network, RAM files off tmpfs).
 */
import { accessSync, constants, existsSync, readFileSync, statSync, statfsSync } from 'node:fs';
import { delimiter, dirname, isAbsolute, join } from 'node:path';
import { loadConfig, type EngineConfig } from '../config.js';
import { CATALOG_DEFAULTS } from '../images/catalog.js';
import { detectAccel } from '../vmm/accel.js';
import { hostCgroups } from '../vmm/cgroup.js';
import { jailAvailability, uidClaims, uidRangeConflicts } from '../vmm/jail.js';
import { netAvailability } from '../net/netns.js';

export type Verdict = 'ok' | 'warn' | 'fail';

export interface Check {
  name: string;
  verdict: Verdict;
  /** What was found. */
  detail: string;
  /** What to do about it (warn and fail). */
  fix?: string;
}

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;
const TMPFS_MAGIC = 0x01021994;

/** The oldest Node.js the server supports (package.json engines). */
export const MIN_NODE = [20, 19] as const;

/** Free space below which the home is short whatever the reserve: layers and templates' disks. */
export const HOME_FREE_FAIL = 2 * GIB;
/** Below this, suspended sandboxes' snapshots soon fill the home. */
export const HOME_FREE_WARN = 10 * GIB;

const size = (bytes: number) => (bytes >= GIB ? `${(bytes / GIB).toFixed(1)} GiB` : `${Math.round(bytes / MIB)} MiB`);

/** The path itself if it exists, else its nearest existing ancestor (what a mkdir -p would write into). */
function existingAncestor(path: string): string {
  let p = path;
  while (!existsSync(p) && dirname(p) !== p) p = dirname(p);
  return p;
}

function freeBytes(path: string): { free: number; total: number; tmpfs: boolean } {
  const s = statfsSync(path);
  return { free: s.bavail * s.bsize, total: s.blocks * s.bsize, tmpfs: s.type === TMPFS_MAGIC };
}

/** Whether `dir` can be written, or created where it is missing. */
function writableDir(dir: string): { ok: true; note: string } | { ok: false; why: string } {
  const at = existingAncestor(dir);
  if (!statSync(at).isDirectory()) return { ok: false, why: `${at} is not a directory, so ${dir} cannot be created there` };
  try {
    accessSync(at, constants.W_OK);
  } catch (e) {
    return { ok: false, why: `${at} is not writable (${(e as NodeJS.ErrnoException).code})` };
  }
  return { ok: true, note: at === dir ? '' : ` (does not exist yet; serve creates it in ${at})` };
}

function onPath(binary: string, env: NodeJS.ProcessEnv): string | undefined {
  if (isAbsolute(binary)) return existsSync(binary) ? binary : undefined;
  for (const d of (env.PATH ?? '').split(delimiter)) if (d && existsSync(join(d, binary))) return join(d, binary);
  return undefined;
}

function nodeVersion(version: string): Check {
  const [major, minor] = version.split('.').map(Number);
  const ok = major > MIN_NODE[0] || (major === MIN_NODE[0] && minor >= MIN_NODE[1]);
  return ok
    ? { name: 'node', verdict: 'ok', detail: `Node.js ${version}` }
    : { name: 'node', verdict: 'fail', detail: `Node.js ${version}, older than ${MIN_NODE.join('.')}`, fix: 'install Node.js 20.19 or newer (22 or 24 LTS; README: "Node.js")' };
}

function accelerator(env: NodeJS.ProcessEnv, cfg: EngineConfig): Check[] {
  const out: Check[] = [];
  const a = detectAccel(env);
  if (a.accel === 'kvm') {
    out.push(existsSync('/dev/kvm')
      ? { name: 'accelerator', verdict: 'ok', detail: `KVM (${a.reason})` }
      : { name: 'accelerator', verdict: 'fail', detail: `KVM chosen (${a.reason}) but /dev/kvm is missing`, fix: 'load kvm_intel or kvm_amd, or unset COLLIMATE_ACCEL to use TCG' });
  } else {
    out.push({
      name: 'accelerator',
      verdict: 'warn',
      detail: `TCG (${a.reason}): guests run emulated and are not a security boundary; serve runs in development mode (one tenant, loopback only, unless --allow-tcg)`,
      fix: 'for production, run on a host with hardware virtualization (kvm_intel or kvm_amd loaded)',
    });
  }
  const qemu = onPath(cfg.qemuBinary, env);
  out.push(qemu
    ? { name: 'qemu', verdict: 'ok', detail: qemu }
    : { name: 'qemu', verdict: 'fail', detail: `${cfg.qemuBinary} not found${isAbsolute(cfg.qemuBinary) ? '' : ' on PATH'}`, fix: 'apt-get install --no-install-recommends qemu-system-x86 (or set COLLIMATE_QEMU)' });
  return out;
}

function confinement(cfg: EngineConfig): Check[] {
  const j = cfg.jail;
  const avail = jailAvailability(j);
  if (!avail.enabled) {
    const check: Check = j.mode === 'on'
      ? { name: 'confinement', verdict: 'fail', detail: `COLLIMATE_JAIL=on but VMMs cannot be confined: ${avail.reason}`, fix: 'run the server as root, or set COLLIMATE_JAIL=auto' }
      : { name: 'confinement', verdict: 'warn', detail: `VMMs run unconfined (${avail.reason}): no uid of their own, no cgroup limits`, fix: 'run the server as root (the systemd unit does)' };
    return [check];
  }
  const out: Check[] = [];
  // cgroups: memory, cpu and pids limits per VMM.
  if (j.cgroups === 'off') {
    out.push({ name: 'cgroups', verdict: 'warn', detail: 'COLLIMATE_CGROUPS=off: VMMs have no memory, CPU or pids limits', fix: 'unset COLLIMATE_CGROUPS' });
  } else {
    const layout = hostCgroups(j.cgroups, j.cgroupParent);
    if (layout.version === 2) out.push({ name: 'cgroups', verdict: 'ok', detail: `cgroup v2 at ${layout.mount} (memory, cpu, pids); VMMs under ${layout.parent}` });
    else if (layout.version === 1) out.push({ name: 'cgroups', verdict: 'ok', detail: `cgroup v1 (hybrid) with memory, cpu and pids; VMMs under ${layout.parents.memory}` });
    else {
      out.push(j.cgroups === 'auto'
        ? { name: 'cgroups', verdict: 'warn', detail: `no usable cgroups (${layout.reason}): VMMs run without memory, CPU or pids limits`, fix: 'mount cgroup2 with the memory, cpu and pids controllers (systemd does by default)' }
        : { name: 'cgroups', verdict: 'fail', detail: `COLLIMATE_CGROUPS=${j.cgroups} but ${layout.reason}`, fix: 'set COLLIMATE_CGROUPS=auto, or mount that hierarchy' });
    }
  }
  // The VMM uid range: valid, and no user or delegated range inside it.
  const range = `${j.uidBase}…${j.uidBase + j.uidCount - 1}`;
  const moveIt = 'move the range with COLLIMATE_VMM_UID_BASE / COLLIMATE_VMM_UID_COUNT';
  let free: number;
  try {
    free = uidClaims(j).free();
  } catch (e) {
    out.push({ name: 'uid range', verdict: 'fail', detail: `${(e as Error).message} (uids must be at least 1000 and below 2^31)`, fix: moveIt });
    return out;
  }
  const read = (p: string) => { try { return readFileSync(p, 'utf8'); } catch { return ''; } };
  const conflicts = uidRangeConflicts({ passwd: read('/etc/passwd'), subuid: read('/etc/subuid'), subgid: read('/etc/subgid') }, j.uidBase, j.uidCount);
  out.push(conflicts.length
    ? { name: 'uid range', verdict: 'fail', detail: `VMM uids ${range} are also used by ${conflicts.join(', ')}`, fix: moveIt }
    : free === 0
      ? { name: 'uid range', verdict: 'fail', detail: `VMM uids ${range}: every one is claimed (${join(j.runDir, 'uids')}), so no VMM can start`, fix: `${moveIt} to a larger range, or stop what holds them` }
      : { name: 'uid range', verdict: 'ok', detail: `VMM uids ${range}, ${free} free: no user or subordinate range uses them` });
  return out;
}

function network(cfg: EngineConfig): Check {
  const a = netAvailability(cfg.net);
  if (a.enabled) return { name: 'nftables', verdict: 'ok', detail: 'nft, ip, nsenter and /dev/net/tun present: sandboxes get a network with egress policies' };
  if (cfg.net.mode === 'off') return { name: 'nftables', verdict: 'ok', detail: 'networking off (COLLIMATE_NET=off): sandboxes have no network' };
  const fix = 'apt-get install nftables iproute2 util-linux; modprobe tun; run the server as root';
  return cfg.net.mode === 'on'
    ? { name: 'nftables', verdict: 'fail', detail: `COLLIMATE_NET=on but ${a.reason}`, fix }
    : { name: 'nftables', verdict: 'warn', detail: `sandboxes get no network: ${a.reason}`, fix };
}

function ramDirs(cfg: EngineConfig): Check[] {
  const guestMib = cfg.catalogMemoryMib ?? CATALOG_DEFAULTS.memoryMib;
  // One template's RAM file and one fork point of it, written through, above the reserve admission
  // keeps (COLLIMATE_TMPFS_RESERVE_MIB): with less, the first fork is refused.
  const need = (2 * guestMib + cfg.host.tmpfsReserveMib) * MIB;
  const out: Check[] = [];
  const dirs = [...new Set(['/dev/shm', cfg.ramDir, cfg.artifactRamDir])];
  for (const dir of dirs) {
    const at = existingAncestor(dir);
    const name = dir === '/dev/shm' ? 'tmpfs /dev/shm' : `RAM dir ${dir}`;
    const fs = freeBytes(at);
    const where = `${size(fs.free)} free of ${size(fs.total)}${at === dir ? '' : ` (in ${at})`}`;
    const grow = dir === '/dev/shm' ? 'grow it (mount -o remount,size=50% /dev/shm, or fstab)' : 'point COLLIMATE_RAM_DIR at a tmpfs with room';
    if (!fs.tmpfs) {
      out.push({ name, verdict: dir === '/dev/shm' ? 'fail' : 'warn', detail: `not tmpfs (${where}): RAM files of templates and fork points on disk make forks many times slower`, fix: dir === '/dev/shm' ? 'mount a tmpfs on /dev/shm' : 'set COLLIMATE_RAM_DIR to a directory on tmpfs (e.g. under /dev/shm)' });
    } else if (fs.free < need) {
      out.push({ name, verdict: 'fail', detail: `${where}: less than ${size(need)} (a ${guestMib} MiB template, one fork point and the ${cfg.host.tmpfsReserveMib} MiB reserve of COLLIMATE_TMPFS_RESERVE_MIB)`, fix: grow });
    } else if (fs.free < 2 * GIB) {
      out.push({ name, verdict: 'warn', detail: `${where}: templates and fork points will run out of room soon`, fix: grow });
    } else {
      out.push({ name, verdict: 'ok', detail: `tmpfs, ${where}` });
    }
  }
  return out;
}

function disk(cfg: EngineConfig): Check[] {
  const out: Check[] = [];
  // The first suspend needs its guest's RAM above the reserve admission keeps (COLLIMATE_DISK_RESERVE_MIB).
  const guestMib = cfg.catalogMemoryMib ?? CATALOG_DEFAULTS.memoryMib;
  const failBelow = Math.max(HOME_FREE_FAIL, (cfg.host.diskReserveMib + guestMib) * MIB);
  const dirs: Array<[string, string]> = [['home', cfg.home], ...(cfg.cacheDir !== cfg.home ? [['cache', cfg.cacheDir] as [string, string]] : [])];
  for (const [label, dir] of dirs) {
    const w = writableDir(dir);
    if (!w.ok) {
      out.push({ name: label, verdict: 'fail', detail: w.why, fix: `choose a writable ${label === 'home' ? 'home (--home or COLLIMATE_HOME)' : 'cache (COLLIMATE_CACHE_DIR)'}` });
      continue;
    }
    const at = existingAncestor(dir);
    const fs = freeBytes(at);
    const detail = `${dir}${w.note}: ${size(fs.free)} free`;
    const fix = `free space there, or move the ${label === 'home' ? 'home (--home or COLLIMATE_HOME)' : 'cache (COLLIMATE_CACHE_DIR)'} to a larger filesystem`;
    const short = label === 'home' ? failBelow : HOME_FREE_FAIL;
    if (fs.free < short) out.push({ name: `free disk (${label})`, verdict: 'fail', detail: `${detail}, less than ${size(short)} (layers, template disks, suspended sandboxes${label === 'home' ? `; ${cfg.host.diskReserveMib} MiB stay free by COLLIMATE_DISK_RESERVE_MIB` : ''})`, fix });
    else if (fs.free < HOME_FREE_WARN) out.push({ name: `free disk (${label})`, verdict: 'warn', detail: `${detail}, less than ${size(HOME_FREE_WARN)}: suspended sandboxes will fill it`, fix });
    else out.push({ name: `free disk (${label})`, verdict: 'ok', detail });
  }
  return out;
}

/** Every check, for the server's home `home` and the settings `env` gives it. */
export function doctorChecks(home: string, env: NodeJS.ProcessEnv): Check[] {
  const checks: Check[] = [nodeVersion(process.versions.node)];
  let cfg: EngineConfig;
  try {
    cfg = loadConfig({ home }, env);
  } catch (e) {
    // A setting serve would refuse: nothing else can be checked with it.
    return [...checks, { name: 'settings', verdict: 'fail', detail: (e as Error).message, fix: 'correct that environment variable (docs/operations.md lists them)' }];
  }
  const steps: Array<[string, () => Check | Check[]]> = [
    ['accelerator', () => accelerator(env, cfg)],
    ['confinement', () => confinement(cfg)],
    ['nftables', () => network(cfg)],
    ['tmpfs', () => ramDirs(cfg)],
    ['free disk', () => disk(cfg)],
  ];
  for (const [name, step] of steps) {
    try {
      checks.push(...[step()].flat());
    } catch (e) {
      checks.push({ name, verdict: 'fail', detail: `could not check: ${(e as Error).message}`, fix: 'fix what the message names, then run collimate doctor again' });
    }
  }
  return checks;
}

/** One line per check: `ok`, `warn` or `FAIL`, the check, what was found and what to fix. */
export function formatChecks(checks: Check[]): string {
  const width = Math.max(...checks.map((c) => c.name.length));
  return checks
    .map((c) => `${(c.verdict === 'fail' ? 'FAIL' : c.verdict).padEnd(4)}  ${c.name.padEnd(width)}  ${c.detail}${c.fix ? ` — fix: ${c.fix}` : ''}\n`)
    .join('');
}
