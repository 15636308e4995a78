import { readFileSync } from 'node:fs';
import { CollimateError } from '../errors.js';

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
}

/** How the host is read: MemAvailable in MiB, and CPU pressure (PSI `some avg10`), null where the kernel does not report it. */
export interface HostProbes {
  memAvailableMib(): number;
  cpuPressure(): number | null;
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
};

export interface CapacityStatus {
  memory: { availableMib: number; reserveMib: number; committedMib: number; limitMib: number | null; startingMib: number };
  cpu: { pressure: number | null; max: number | null };
  refusals: Record<'memory' | 'cpu', number>;
}

/**
 * Admission by what the host has. Before a create, fork or resume starts a VMM it asks here; the
 * answer is a reservation (released when the operation settles) or `host_at_capacity` (503, with
 * Retry-After), never a host pushed into swapping or a CPU queue that slows every sandbox on it:
 *
 * - memory: MemAvailable, less what operations under way will take (SANDBOX_FOOTPRINT_MIB each), must
 *   stay above the reserve after this one; and, when the operator set COLLIMATE_HOST_MEMORY_MIB, the
 *   guest memory of running and starting sandboxes must fit in it (forks and templates share pages,
 *   so this is a commitment, not a measurement);
 * - CPU: when the kernel's pressure stall information says tasks already wait for a CPU more than
 *   cpuPressureMax % of the time, a new sandbox would only slow the others down.
 *
 * The check and the reservation are one synchronous step (Node runs one request at a time), so
 * concurrent creates cannot all pass on the same reading.
 */
export class HostCapacity {
  private startingMib = 0;
  private startingGuestMib = 0;
  private readonly refused = { memory: 0, cpu: 0 };

  constructor(
    private readonly budget: HostBudget,
    /** Guest memory of the running sandboxes, in MiB. */
    private readonly committedMib: () => number,
    private readonly probes: HostProbes = procProbes,
  ) {}

  /** Reserves room for `count` sandboxes of `memoryMib` each for `operation`, or throws host_at_capacity. */
  admit(operation: string, count: number, memoryMib: number): { release(): void } {
    const what = count === 1 ? `a ${memoryMib} MiB sandbox` : `${count} sandboxes of ${memoryMib} MiB`;
    const pressure = this.budget.cpuPressureMax > 0 ? this.probes.cpuPressure() : null;
    if (pressure !== null && pressure >= this.budget.cpuPressureMax) {
      this.refused.cpu++;
      throw new CollimateError(
        'host_at_capacity',
        `This host's CPUs are saturated (tasks waited for a CPU ${pressure.toFixed(0)}% of the last 10 s; the limit is ` +
          `${this.budget.cpuPressureMax}%, COLLIMATE_HOST_CPU_PRESSURE_MAX), so the ${operation} of ${what} would slow every sandbox on it. ` +
          'Retry after the Retry-After delay, or suspend or delete busy sandboxes.',
        { retryAfterSecs: 10, details: { resource: 'cpu', pressure, limit: this.budget.cpuPressureMax } },
      );
    }
    const need = count * SANDBOX_FOOTPRINT_MIB;
    const available = this.probes.memAvailableMib() - this.startingMib;
    if (available - need < this.budget.reserveMib) {
      this.refused.memory++;
      throw new CollimateError(
        'host_at_capacity',
        `This host has ${Math.max(0, Math.floor(available))} MiB of memory available and keeps ${this.budget.reserveMib} MiB in reserve ` +
          `(COLLIMATE_HOST_MEMORY_RESERVE_MIB); the ${operation} of ${what} needs about ${need} MiB more. ` +
          'Retry after the Retry-After delay, or suspend or delete sandboxes to free memory.',
        { retryAfterSecs: 5, details: { resource: 'memory', availableMib: Math.floor(available), reserveMib: this.budget.reserveMib, needMib: need } },
      );
    }
    const guest = count * memoryMib;
    if (this.budget.memoryMib > 0) {
      const committed = this.committedMib() + this.startingGuestMib;
      if (committed + guest > this.budget.memoryMib) {
        this.refused.memory++;
        throw new CollimateError(
          'host_at_capacity',
          `This host's sandboxes may have ${this.budget.memoryMib} MiB of guest memory together (COLLIMATE_HOST_MEMORY_MIB) and ` +
            `${committed} MiB is in use or starting; the ${operation} of ${what} does not fit. ` +
            'Retry after the Retry-After delay, or suspend or delete sandboxes to make room.',
          { retryAfterSecs: 5, details: { resource: 'memory', limitMib: this.budget.memoryMib, committedMib: committed, needMib: guest } },
        );
      }
    }
    this.startingMib += need;
    this.startingGuestMib += guest;
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        this.startingMib -= need;
        this.startingGuestMib -= guest;
      },
    };
  }

  /** Runs `op` under a reservation for `count` sandboxes of `memoryMib`; the reservation ends with it. */
  async within<T>(operation: string, count: number, memoryMib: number, op: () => Promise<T>): Promise<T> {
    const r = this.admit(operation, count, memoryMib);
    try {
      return await op();
    } finally {
      r.release();
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
      refusals: { ...this.refused },
    };
  }
}
