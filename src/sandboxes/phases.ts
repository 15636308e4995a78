import { performance } from 'node:perf_hooks';

/**
 * Per-phase timings of one lifecycle operation, so the next bottleneck is visible: the engine emits a
 * `phases` event with a PhaseReport when a create, fork, suspend or resume succeeds; the tenant
 * service turns them into the `collimate_lifecycle_phase_seconds` histogram and bench/lifecycle.ts
 * into its phase table.
 *
 * Phases (milliseconds; a phase run by several children at once records the slowest):
 * - create: `pool_take`, `egress_apply`, `claim` (cont of a prewarmed VMM) or `device_state_load`,
 *   `agent_connect`, `agent_ack`.
 * - fork: `stop`, `disk_freeze`, `recv_spawn`, `memory_capture` (running parent) or `memory_load`
 *   (suspended parent), `parent_paused` (stop → cont), `device_state_save`, `recv_teardown`,
 *   `child_spawn`, `device_state_load`, `agent_connect`, `agent_ack`, `commit`.
 * - suspend: `save` (RAM and devices), `fsync`, `teardown`.
 * - resume: `spawn` (with `egress_apply` inside it, alongside QEMU's start), `memory_load` (alongside
 *   the spawn), `device_state_load`, `agent_connect`, `agent_ack`, `commit`; the snapshot is removed
 *   after the answer.
 * - restore (a rollback of a running sandbox): `stop`, then onto a VMM of the snapshot's pool
 *   `egress_apply`, `claim`, `agent_ack`; without one (or when its claim fails) `prepare` (a suspend
 *   directory and disk layer); then `switch` (the row), `cleanup` (the old layers; the old VMM is
 *   killed after the answer) and `gc`. A rollback without a pool VMM is then resumed, which reports
 *   its own phases.
 *
 * Beside the wall times, CPU time (milliseconds, summed, never the slowest): `server`, the server
 * process's own over the operation, and for a fork `children_vmm`, what the children's VMMs spent
 * from their claim (or spawn) to their acknowledgement. On a host with few cores the CPU a fork of N
 * children needs, not the wall time of any one phase, is what bounds it.
 */
export type LifecycleOp = 'create' | 'fork' | 'suspend' | 'resume' | 'start_from_snapshot' | 'restore';

export interface PhaseReport {
  op: LifecycleOp;
  /** The sandbox created, forked, suspended or resumed (the parent, for a fork). */
  id: string;
  phases: Record<string, number>;
  /** CPU time in milliseconds, summed (see above). */
  cpuMs: Record<string, number>;
  totalMs: number;
}

export class Phases {
  private readonly startedAt = performance.now();
  private readonly ms: Record<string, number> = {};
  private readonly cpuAtStart = process.cpuUsage();
  private readonly cpu: Record<string, number> = {};

  constructor(readonly op: LifecycleOp) {}

  /** Runs `fn` and records how long it took under `name`. */
  async time<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.record(name, performance.now() - t0);
    }
  }

  /** Records `ms` under `name`; of several (parallel children) the longest stays. */
  record(name: string, ms: number): void {
    this.ms[name] = Math.max(this.ms[name] ?? 0, ms);
  }

  /** Milliseconds since `since` (a performance.now() reading), recorded under `name`. */
  since(name: string, since: number): void {
    this.record(name, performance.now() - since);
  }

  /** Adds `ms` of CPU time under `name`: of several (parallel children) the sum stays. */
  addCpu(name: string, ms: number): void {
    this.cpu[name] = (this.cpu[name] ?? 0) + ms;
  }

  report(id: string): PhaseReport {
    const server = process.cpuUsage(this.cpuAtStart);
    return {
      op: this.op, id, phases: { ...this.ms },
      cpuMs: { ...this.cpu, server: (server.user + server.system) / 1000 },
      totalMs: performance.now() - this.startedAt,
    };
  }
}
