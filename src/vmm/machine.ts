import { join } from 'node:path';
import type { Accel, VmDisk, VmSpec } from './argv.js';

/** What a guest looks like, independent of where its files live: the artifact's recipe. */
export interface MachineShape {
  vcpus: number;
  memoryMib: number;
  kernel: string;
  initrd: string;
  cmdline: string;
  /** Read-only erofs layers, lowest first. */
  layers: string[];
  /** Has a virtio-net NIC (the template was baked with networking on); its restores must have it too. */
  nic?: boolean;
}

/** Socket and log paths of one VMM inside its own directory. */
export function vmmFiles(dir: string) {
  return {
    qmpSocket: join(dir, 'qmp.sock'),
    agentSocket: join(dir, 'agent.sock'),
    migrationSocket: join(dir, 'migrate.sock'),
    consoleLog: join(dir, 'console.log'),
    qemuLog: join(dir, 'qemu.log'),
    vmmJson: join(dir, 'vmm.json'),
  };
}

export function machineSpec(opts: {
  qemuBinary: string;
  accel: Accel;
  seccomp: boolean;
  shape: MachineShape;
  dir: string;
  memPath: string;
  memShared: boolean;
  upper: { path: string; format: 'raw' | 'qcow2' };
  incoming: boolean;
  /** Whether the NIC (if the shape has one) is attached to the namespace's tap; default: a backend that goes nowhere. */
  tap?: boolean;
  /** Spawned for a fork not yet made (VmSpec.remappable). */
  remappable?: boolean;
}): VmSpec {
  const f = vmmFiles(opts.dir);
  const disks: VmDisk[] = opts.shape.layers.map((path, i) => ({ serial: `layer${i}`, path, format: 'raw', readonly: true }));
  disks.push({ serial: 'upper', path: opts.upper.path, format: opts.upper.format, readonly: false });
  return {
    qemuBinary: opts.qemuBinary,
    accel: opts.accel,
    vcpus: opts.shape.vcpus,
    memoryMib: opts.shape.memoryMib,
    memPath: opts.memPath,
    memShared: opts.memShared,
    kernel: opts.shape.kernel,
    initrd: opts.shape.initrd,
    cmdline: opts.shape.cmdline,
    disks,
    qmpSocket: f.qmpSocket,
    agentSocket: f.agentSocket,
    consoleLog: f.consoleLog,
    incoming: opts.incoming,
    ...(opts.remappable ? { remappable: true } : {}),
    seccomp: opts.seccomp,
    ...(opts.shape.nic ? { nic: opts.tap ? 'tap' as const : 'none' as const } : {}),
  };
}
