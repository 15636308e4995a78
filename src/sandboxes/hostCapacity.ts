import { readFileSync, statfsSync } from 'node:fs';
import { dirname } from 'node:path';
import { CollimateError } from '../errors.js';
import type { EngineConfig } from '../config.js';
import { uidClaims } from '../vmm/jail.js';

/**
 * What one VMM is counted as against the host's memory, beyond its template's shared pages: its
 * QEMU (~35 MiB PSS idle, more once prewarmed with an exec) and the first pages its guest writes.
 * Admission (below) and the warm pools' budget (templatePools.ts) both count VMMs at this.
 */
export const SANDBOX_FOOTPRINT_MIB = 64;

export interface HostBudget {
  /** Guest memory all running sandboxes together may have, in MiB; 0: no such cap (COLLIMATE_HOST_MEMORY_MIB). */
  memoryMib: number;
  /** Memory the host keeps available for everything else, in MiB (COLLIMATE_HOST_MEMORY_RESERVE_MIB). */
  reserveMib: number;
  /** CPU pressure (% of the last 10 s some task waited for a CPU) at which new sandboxes wait; 0: never (COLLIMATE_HOST_CPU_PRESSURE_MAX). */
  cpuPressureMax: number;
  /** Free space the RAM files' tmpfs keeps, in MiB (COLLIMATE_TMPFS_RESERVE_MIB). */
  tmpfsReserveMib: number;
  /** Free space the server's home keeps (disk layers, snapshots, the database), in MiB (COLLIMATE_DISK_RESERVE_MIB). */
  diskReserveMib: number;
}

/** Where the storage admission counts lies: the RAM files' tmpfs and the server's home. */
export interface HostPaths {
  tmpfs: string;
  disk: string;
}

/** A host-wide pool of claims each VMM takes one of (src/host/claims.ts), and how many are free. */
export interface ClaimBudget {
  resource: 'vmm_uids' | 'net_indexes';
  free: number;
  total: number;
  /** The settings that size it, for the message. */
  setting: string;
}

/** What an operation takes. */
export interface Needs {
  /** VMMs it starts: each counts SANDBOX_FOOTPRINT_MIB of host memory, a VMM uid and a network index. */
  vmms: number;
  /** Guest memory each of them has, in MiB. */
  memoryMib: number;
  /** tmpfs it writes, in MiB (a fork point's RAM file, a resumed sandbox's): at most its guest's memory. */
  tmpfsMib?: number;
  /** Disk under the home it writes, in MiB (a suspend's RAM image). */
  diskMib?: number;
}

/** How the host is read: MemAvailable in MiB, and CPU pressure (PSI `some avg10`), null where the kernel does not report it. */
export interface HostProbes {
  memAvailableMib(): number;
  cpuPressure(): number | null;
  /** MiB an unprivileged writer may still write on the filesystem holding `path`. */
  freeMib(path: string): number;
}

export const procProbes: HostProbes = {
  memAvailableMib: () => Number(/^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? 0) / 1024,
  cpuPressure: () => {
    try {
      const m = /^some avg10=([\d.]+)/m.exec(readFileSync('/proc/pressure/cpu', 'utf8'));
      return m ? Number(m[1]) : null;
    } catch {
      return null;
    }
  },
  freeMib: (path) => {
    const st = statfsSync(path);
    return Math.floor((st.bavail * st.bsize) / 2 ** 20);
  },
};

type Resource = 'memory' | 'cpu' | 'tmpfs' | 'disk' | ClaimBudget['resource'];

export interface StorageStatus {
  path: string;
  freeMib: number;
  reserveMib: number;
  /** Reserved by operations under way. */
  startingMib: number;
}

export interface CapacityStatus {
  memory: { availableMib: number; reserveMib: number; committedMib: number; limitMib: number | null; startingMib: number };
  cpu: { pressure: number | null; max: number | null };
  tmpfs: StorageStatus;
  disk: StorageStatus;
  claims: Record<ClaimBudget['resource'], { free: number; total: number }>;
  refusals: Record<Resource, number>;
}

/**
 * Admission by what the host has. Before a create, fork, resume or suspend starts it asks here;
 * the answer is a reservation (released when the operation settles) or `host_at_capacity` (503,
 * with Retry-After) naming the resource that is short and what to do, never a host pushed into
 * swapping, a full disk or tmpfs found by a failed write, or a VMM that cannot get a uid:
 *
 * - memory: MemAvailable, less what operations under way will take (SANDBOX_FOOTPRINT_MIB per VMM),
 *   must stay above the reserve after this one; and, when the operator set COLLIMATE_HOST_MEMORY_MIB,
 *   the guest memory of running and starting sandboxes must fit in it (forks and templates share
 *   pages, so this is a commitment, not a measurement);
 * - CPU: when the kernel's pressure stall information says tasks already wait for a CPU more than
 *   cpuPressureMax % of the time, a new sandbox would only slow the others down;
 * - tmpfs (the RAM files' directory) and disk (the server's home): what the operation writes, at
 *   most (a fork point's or a resumed sandbox's RAM file, a suspend's image), plus what operations
 *   under way reserved, must leave the reserve free; every operation keeps at least the reserve;
 * - VMM uids and network indexes: host-wide claims, one per VMM; an operation that starts more
 *   VMMs than are free is refused before it starts any.
 * Memory, CPU and claims are asked only of operations that start VMMs (a suspend frees them).
 *
 * The check and the reservation are one synchronous step (Node runs one request at a time), so
 * concurrent creates cannot all pass on the same reading.
 */
export class HostCapacity {
  private startingMib = 0;
  private startingGuestMib = 0;
  private startingTmpfsMib = 0;
  private startingDiskMib = 0;
  private readonly refused: Record<Resource, number> = { memory: 0, cpu: 0, tmpfs: 0, disk: 0, vmm_uids: 0, net_indexes: 0 };

  constructor(
    private readonly budget: HostBudget,
    /** Guest memory of the running sandboxes, in MiB. */
    private readonly committedMib: () => number,
    private readonly paths: HostPaths,
    /** The claim pools VMMs take from, read when asked. */
    private readonly claims: () => ClaimBudget[] = () => [],
    private readonly probes: HostProbes = procProbes,
  ) {}

  /** Reserves what `operation` needs, or throws host_at_capacity naming the resource that is short. */
  admit(operation: string, needs: Needs): { release(): void } {
    const { vmms, memoryMib } = needs;
    const what = vmms === 0 ? 'this sandbox' : vmms === 1 ? `a ${memoryMib} MiB sandbox` : `${vmms} sandboxes of ${memoryMib} MiB`;
    const refuse = (resource: Resource, message: string, retryAfterSecs: number, details: Record<string, unknown>): never => {
      this.refused[resource]++;
      throw new CollimateError('host_at_capacity', message, { retryAfterSecs, details: { resource, ...details } });
    };
    const need = vmms * SANDBOX_FOOTPRINT_MIB;
    const guest = vmms * memoryMib;
    if (vmms > 0) {
      const pressure = this.budget.cpuPressureMax > 0 ? this.probes.cpuPressure() : null;
      if (pressure !== null && pressure >= this.budget.cpuPressureMax) {
        refuse('cpu',
          `This host's CPUs are saturated (tasks waited for a CPU ${pressure.toFixed(0)}% of the last 10 s; the limit is ` +
            `${this.budget.cpuPressureMax}%, COLLIMATE_HOST_CPU_PRESSURE_MAX), so the ${operation} of ${what} would slow every sandbox on it. ` +
            'Retry after the Retry-After delay, or suspend or delete busy sandboxes.',
          10, { pressure, limit: this.budget.cpuPressureMax });
      }
      const available = this.probes.memAvailableMib() - this.startingMib;
      if (available - need < this.budget.reserveMib) {
        refuse('memory',
          `This host has ${Math.max(0, Math.floor(available))} MiB of memory available and keeps ${this.budget.reserveMib} MiB in reserve ` +
            `(COLLIMATE_HOST_MEMORY_RESERVE_MIB); the ${operation} of ${what} needs about ${need} MiB more. ` +
            'Retry after the Retry-After delay, or suspend or delete sandboxes to free memory.',
          5, { availableMib: Math.floor(available), reserveMib: this.budget.reserveMib, needMib: need });
      }
      if (this.budget.memoryMib > 0) {
        const committed = this.committedMib() + this.startingGuestMib;
        if (committed + guest > this.budget.memoryMib) {
          refuse('memory',
            `This host's sandboxes may have ${this.budget.memoryMib} MiB of guest memory together (COLLIMATE_HOST_MEMORY_MIB) and ` +
              `${committed} MiB is in use or starting; the ${operation} of ${what} does not fit. ` +
              'Retry after the Retry-After delay, or suspend or delete sandboxes to make room.',
            5, { limitMib: this.budget.memoryMib, committedMib: committed, needMib: guest });
        }
      }
      for (const c of this.claims()) {
        if (c.free >= vmms) continue;
        const noun = c.resource === 'vmm_uids' ? 'VMM uids' : 'network indexes';
        refuse(c.resource,
          `This host has ${c.free} of its ${c.total} ${noun} free (${c.setting}); the ${operation} of ${what} needs ${vmms}. ` +
            `Delete or suspend sandboxes to free some, or widen the range (${c.setting}).`,
          5, { free: c.free, total: c.total, need: vmms });
      }
    }
    const tmpfsMib = needs.tmpfsMib ?? 0;
    const diskMib = needs.diskMib ?? 0;
    const storage = [
      { resource: 'tmpfs' as const, path: this.paths.tmpfs, need: tmpfsMib, starting: this.startingTmpfsMib, reserve: this.budget.tmpfsReserveMib,
        setting: 'COLLIMATE_TMPFS_RESERVE_MIB', noun: 'the tmpfs holding sandboxes\' RAM files', fix: 'delete sandboxes whose forks are done, or give the tmpfs more room (mount -o remount,size=…)' },
      { resource: 'disk' as const, path: this.paths.disk, need: diskMib, starting: this.startingDiskMib, reserve: this.budget.diskReserveMib,
        setting: 'COLLIMATE_DISK_RESERVE_MIB', noun: 'the disk holding sandboxes\' layers and snapshots', fix: 'delete suspended sandboxes or ones you no longer need, or free space on that filesystem' },
    ];
    for (const st of storage) {
      const free = this.freeMib(st.path) - st.starting;
      if (free - st.need < st.reserve) {
        refuse(st.resource,
          `${st.noun[0].toUpperCase()}${st.noun.slice(1)} (${st.path}) has ${Math.max(0, free)} MiB free and keeps ${st.reserve} MiB in reserve ` +
            `(${st.setting}); the ${operation} of ${what} may write ${st.need} MiB there. To make room, ${st.fix}, then retry.`,
          30, { path: st.path, freeMib: Math.max(0, free), reserveMib: st.reserve, needMib: st.need });
      }
    }
    this.startingMib += need;
    this.startingGuestMib += guest;
    this.startingTmpfsMib += tmpfsMib;
    this.startingDiskMib += diskMib;
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        this.startingMib -= need;
        this.startingGuestMib -= guest;
        this.startingTmpfsMib -= tmpfsMib;
        this.startingDiskMib -= diskMib;
      },
    };
  }

  /** Runs `op` under a reservation of what it needs; the reservation ends with it. */
  async within<T>(operation: string, needs: Needs, op: () => Promise<T>): Promise<T> {
    const r = this.admit(operation, needs);
    try {
      return await op();
    } finally {
      r.release();
    }
  }

  /**
   * `within` for queued work nobody waits on with a retry of their own (a bake): while the host is
   * short, waits the Retry-After delay and asks again (telling `onWait` why), until `waitMs` has
   * gone by; then the refusal is the answer.
   */
  async withinWaiting<T>(operation: string, needs: Needs, op: () => Promise<T>, opts: { waitMs: number; onWait?: (why: string) => void; sleep?: (ms: number) => Promise<void> }): Promise<T> {
    const deadline = Date.now() + opts.waitMs;
    const pause = opts.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
    for (;;) {
      let r: { release(): void };
      try {
        r = this.admit(operation, needs);
      } catch (e) {
        const retryMs = e instanceof CollimateError && e.code === 'host_at_capacity' ? (e.retryAfterSecs ?? 5) * 1000 : undefined;
        if (retryMs === undefined || Date.now() + retryMs > deadline) throw e;
        opts.onWait?.((e as Error).message);
        await pause(retryMs);
        continue;
      }
      try {
        return await op();
      } finally {
        r.release();
      }
    }
  }

  /** The budgets and what is used of them (/healthz, /metrics). */
  status(): CapacityStatus {
    return {
      memory: {
        availableMib: Math.floor(this.probes.memAvailableMib()), reserveMib: this.budget.reserveMib,
        committedMib: this.committedMib(), limitMib: this.budget.memoryMib > 0 ? this.budget.memoryMib : null, startingMib: this.startingMib,
      },
      cpu: { pressure: this.probes.cpuPressure(), max: this.budget.cpuPressureMax > 0 ? this.budget.cpuPressureMax : null },
      tmpfs: { path: this.paths.tmpfs, freeMib: this.freeMib(this.paths.tmpfs), reserveMib: this.budget.tmpfsReserveMib, startingMib: this.startingTmpfsMib },
      disk: { path: this.paths.disk, freeMib: this.freeMib(this.paths.disk), reserveMib: this.budget.diskReserveMib, startingMib: this.startingDiskMib },
      claims: Object.fromEntries(this.claims().map((c) => [c.resource, { free: c.free, total: c.total }])) as CapacityStatus['claims'],
      refusals: { ...this.refused },
    };
  }

  /** Free MiB where `path` lies; a path that does not exist yet is counted on its nearest existing parent. */
  private freeMib(path: string): number {
    for (let p = path; ; p = dirname(p)) {
      try {
        return this.probes.freeMib(p);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOENT' || dirname(p) === p) throw e;
      }
    }
  }
}

/**
 * The claim pools this engine's VMMs take from: VMM uids when VMMs are confined (the server runs as
 * root), network indexes when sandboxes have a network.
 */
export function claimBudgets(cfg: Pick<EngineConfig, 'jail'>, net: { indexBudget(): { free: number; total: number } } | null): ClaimBudget[] {
  const out: ClaimBudget[] = [];
  if (cfg.jail.mode !== 'off' && process.getuid?.() === 0) {
    const uids = uidClaims(cfg.jail);
    out.push({ resource: 'vmm_uids', free: uids.free(), total: uids.count, setting: 'COLLIMATE_VMM_UID_BASE, COLLIMATE_VMM_UID_COUNT' });
  }
  if (net) out.push({ resource: 'net_indexes', ...net.indexBudget(), setting: 'COLLIMATE_NET_TRANSIT' });
  return out;
}
