import { existsSync, mkdirSync, readFileSync, readdirSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { isRunning } from '../host/claims.js';

/**
 * One cgroup per VMM, with memory, cpu and pids limits from the sandbox's VM size.
 *
 * Two layouts are supported and chosen by detection (/proc/self/mountinfo):
 * - cgroup v2 (unified): `<mount><parent>/<name>` with memory.max, memory.swap.max, cpu.max and
 *   pids.max. The parent (default `/collimate`, at the root: v2 forbids processes in a cgroup that
 *   delegates controllers to children, so it cannot sit under the server's own cgroup) gets
 *   `+memory +cpu +pids` in its and its ancestors' cgroup.subtree_control.
 * - cgroup v1 (legacy or hybrid: controllers mounted at /sys/fs/cgroup/{memory,cpu,pids}, a v2
 *   mount without controllers beside them): one directory per controller, memory.limit_in_bytes
 *   (+ memory.memsw.limit_in_bytes where swap accounting exists), cpu.cfs_period_us /
 *   cpu.cfs_quota_us and pids.max. The parent defaults to `<the server's own cgroup>/collimate`
 *   in each hierarchy, so that limits an operator put on the server (a systemd unit, a container)
 *   keep covering its VMMs.
 * v2 is preferred when its mount has all three controllers.
 */

export type CgroupMode = 'auto' | 'v1' | 'v2' | 'off';

export type CgroupLayout =
  | { version: 2; mount: string; parent: string }
  | { version: 1; parents: { memory: string; cpu: string; pids: string } }
  | { version: 0; reason: string };

export interface CgroupLimits {
  memoryBytes: number;
  /** CFS quota per period: vcpus × 100 % is vcpus × period. */
  cpuQuotaUs: number;
  cpuPeriodUs: number;
  pidsMax: number;
}

const MIB = 1024 * 1024;
export const CPU_PERIOD_US = 100_000;

/** Limits of one VMM: guest RAM plus QEMU's own overhead, vcpus × 100 % of a CPU, a pids cap. */
export function vmmLimits(shape: { vcpus: number; memoryMib: number }, opts: { memoryOverheadMib: number; pidsMax: number }): CgroupLimits {
  return {
    memoryBytes: (shape.memoryMib + opts.memoryOverheadMib) * MIB,
    cpuQuotaUs: Math.max(1, shape.vcpus) * CPU_PERIOD_US,
    cpuPeriodUs: CPU_PERIOD_US,
    pidsMax: opts.pidsMax,
  };
}

interface Mount { root: string; mountPoint: string; fsType: string; superOpts: string[] }

export function parseMountinfo(text: string): Mount[] {
  const out: Mount[] = [];
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const [pre, post] = line.split(' - ');
    if (!post) continue;
    const f = pre.split(' ');
    const g = post.split(' ');
    out.push({ root: unescapeMount(f[3]), mountPoint: unescapeMount(f[4]), fsType: g[0], superOpts: (g[2] ?? '').split(',') });
  }
  return out;
}

function unescapeMount(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)));
}

/** `/proc/self/cgroup`: v1 lines `id:ctrl,ctrl:/path`, the v2 line `0::/path`. */
export function parseProcCgroup(text: string): { v2?: string; v1: Record<string, string> } {
  const v1: Record<string, string> = {};
  let v2: string | undefined;
  for (const line of text.split('\n')) {
    const m = /^(\d+):([^:]*):(.*)$/.exec(line.trim());
    if (!m) continue;
    if (m[1] === '0' && m[2] === '') v2 = m[3];
    else for (const c of m[2].split(',')) if (c) v1[c] = m[3];
  }
  return { v2, v1 };
}

/** The server's cgroup path relative to a mount whose root is `mountRoot` (cgroup namespaces, bind mounts). */
function relativeTo(mountRoot: string, path: string): string {
  if (mountRoot === '/' || mountRoot === '') return path;
  if (path === mountRoot) return '/';
  if (path.startsWith(mountRoot + '/')) return path.slice(mountRoot.length);
  return path;
}

/**
 * Picks the layout from the host's mounts. `readControllers` reads a v2 mount's cgroup.controllers
 * (a parameter so tests can describe a host without one).
 */
export function detectCgroups(
  mode: CgroupMode,
  input: { mountinfo: string; procCgroup: string; parent?: string; readControllers?: (mountPoint: string) => string },
): CgroupLayout {
  if (mode === 'off') return { version: 0, reason: 'COLLIMATE_CGROUPS=off' };
  const mounts = parseMountinfo(input.mountinfo);
  const own = parseProcCgroup(input.procCgroup);
  const readControllers = input.readControllers ?? ((mp: string) => { try { return readFileSync(join(mp, 'cgroup.controllers'), 'utf8'); } catch { return ''; } });
  const want = ['memory', 'cpu', 'pids'] as const;
  if (mode === 'auto' || mode === 'v2') {
    const v2 = mounts.find((m) => m.fsType === 'cgroup2' && want.every((c) => readControllers(m.mountPoint).split(/\s+/).includes(c)));
    if (v2) return { version: 2, mount: v2.mountPoint, parent: join(v2.mountPoint, input.parent ?? '/collimate') };
    if (mode === 'v2') return { version: 0, reason: 'no cgroup2 mount with the memory, cpu and pids controllers' };
  }
  const parents: Partial<Record<(typeof want)[number], string>> = {};
  for (const c of want) {
    const m = mounts.find((x) => x.fsType === 'cgroup' && x.superOpts.includes(c));
    if (!m) return { version: 0, reason: `no cgroup v1 hierarchy with the ${c} controller (and no usable cgroup v2)` };
    const ownPath = relativeTo(m.root, own.v1[c] ?? '/');
    parents[c] = join(m.mountPoint, input.parent ?? join(ownPath, 'collimate'));
  }
  return { version: 1, parents: parents as { memory: string; cpu: string; pids: string } };
}

/** The host's layout. */
export function hostCgroups(mode: CgroupMode, parent?: string): CgroupLayout {
  let mountinfo = '';
  let procCgroup = '';
  try {
    mountinfo = readFileSync('/proc/self/mountinfo', 'utf8');
    procCgroup = readFileSync('/proc/self/cgroup', 'utf8');
  } catch {
    return { version: 0, reason: 'cannot read /proc/self/mountinfo' };
  }
  return detectCgroups(mode, { mountinfo, procCgroup, parent });
}

/** Directories of one VMM's cgroup (one for v2, one per controller for v1) and where its pid goes. */
export interface VmmCgroup {
  dirs: string[];
  procsFiles: string[];
}

function write(path: string, value: string): void {
  writeFileSync(path, value);
}

/** Creates the parents (idempotent) and enables the controllers a v2 parent delegates. */
export function ensureParents(layout: CgroupLayout): void {
  if (layout.version === 2) {
    // Every level from the mount root down to the parent must delegate the controllers to the next.
    const rel = layout.parent.slice(layout.mount.length).split('/').filter(Boolean);
    let dir = layout.mount;
    for (const part of rel) {
      enableControllers(dir);
      dir = join(dir, part);
      mkdirSync(dir, { recursive: true });
    }
    enableControllers(layout.parent);
  } else if (layout.version === 1) {
    for (const d of Object.values(layout.parents)) mkdirSync(d, { recursive: true });
  }
}

function enableControllers(dir: string): void {
  const file = join(dir, 'cgroup.subtree_control');
  const have = readFileSync(file, 'utf8').split(/\s+/);
  const missing = ['memory', 'cpu', 'pids'].filter((c) => !have.includes(c));
  if (missing.length) write(file, missing.map((c) => `+${c}`).join(' '));
}

/** Creates the VMM's cgroup with `limits`. An existing one (a VMM re-spawned under the same name) is reused. */
export function createVmmCgroup(layout: CgroupLayout, name: string, limits: CgroupLimits): VmmCgroup | null {
  if (layout.version === 0) return null;
  if (!/^[A-Za-z0-9_.-]+$/.test(name)) throw new Error(`bad cgroup name ${JSON.stringify(name)}`);
  if (layout.version === 2) {
    const dir = join(layout.parent, name);
    mkdirSync(dir, { recursive: true });
    write(join(dir, 'memory.max'), String(limits.memoryBytes));
    if (existsSync(join(dir, 'memory.swap.max'))) write(join(dir, 'memory.swap.max'), '0');
    write(join(dir, 'cpu.max'), `${limits.cpuQuotaUs} ${limits.cpuPeriodUs}`);
    write(join(dir, 'pids.max'), String(limits.pidsMax));
    return { dirs: [dir], procsFiles: [join(dir, 'cgroup.procs')] };
  }
  const mem = join(layout.parents.memory, name);
  const cpu = join(layout.parents.cpu, name);
  const pids = join(layout.parents.pids, name);
  for (const d of [mem, cpu, pids]) mkdirSync(d, { recursive: true });
  write(join(mem, 'memory.limit_in_bytes'), String(limits.memoryBytes));
  // memsw must stay >= the memory limit; setting it equal forbids swapping the VMM out.
  if (existsSync(join(mem, 'memory.memsw.limit_in_bytes'))) write(join(mem, 'memory.memsw.limit_in_bytes'), String(limits.memoryBytes));
  write(join(cpu, 'cpu.cfs_period_us'), String(limits.cpuPeriodUs));
  write(join(cpu, 'cpu.cfs_quota_us'), String(limits.cpuQuotaUs));
  write(join(pids, 'pids.max'), String(limits.pidsMax));
  return { dirs: [mem, cpu, pids], procsFiles: [mem, cpu, pids].map((d) => join(d, 'cgroup.procs')) };
}

function procsOf(dir: string): number[] {
  try {
    return readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/**
 * Removes a VMM's cgroup once its process is gone. A cgroup with a live process in it is left
 * alone (false): the VMM it belongs to is still running.
 */
export async function removeVmmCgroup(dirs: string[], timeoutMs = 3000): Promise<boolean> {
  let ok = true;
  for (const dir of dirs) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        rmdirSync(dir);
        break;
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code === 'ENOENT') break;
        // EBUSY: a task is still in it — an exiting QEMU not yet reaped (wait), or a live one (leave it).
        if (code !== 'EBUSY' || Date.now() > deadline || procsOf(dir).some(isRunning)) { ok = false; break; }
        await sleep(10);
      }
    }
  }
  return ok;
}

/** Every VMM cgroup directory under the parents whose name starts with `prefix`. */
export function listVmmCgroups(layout: CgroupLayout, prefix: string): string[] {
  const parents = layout.version === 2 ? [layout.parent] : layout.version === 1 ? Object.values(layout.parents) : [];
  const out: string[] = [];
  for (const p of parents) {
    let names: string[] = [];
    try { names = readdirSync(p); } catch { continue; }
    for (const n of names) if (n.startsWith(prefix)) out.push(join(p, n));
  }
  return out;
}

/** Removes this home's VMM cgroups that have no process left (a crash between create and spawn). */
export async function sweepVmmCgroups(layout: CgroupLayout, prefix: string): Promise<void> {
  for (const dir of listVmmCgroups(layout, prefix)) {
    // A QEMU killed as a stray is a zombie in it until its parent (init, for a dead server's VMM)
    // reaps it: removeVmmCgroup waits for that.
    if (!procsOf(dir).some(isRunning)) await removeVmmCgroup([dir]);
  }
}
