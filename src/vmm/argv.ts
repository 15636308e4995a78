/**
 * The only place that builds QEMU command lines. Pure: same spec, same argv (golden-tested in
 * test/unit/vmm/argv.test.ts). The device set and order must be identical for a template, its
 * checkpoint and every VMM restored from it, or migration refuses the device state.
 */

export type Accel = 'kvm' | 'tcg';

/** Every guest's MAC (identical addressing in every sandbox, see src/net/netns.ts). */
export const GUEST_MAC = '52:54:00:c0:11:02';

export interface VmDisk {
  /** virtio-blk serial the guest agent finds the disk by: `layer0`…`layerN` or `upper`. */
  serial: string;
  path: string;
  format: 'raw' | 'qcow2';
  readonly: boolean;
}

export interface VmSpec {
  qemuBinary: string;
  accel: Accel;
  vcpus: number;
  memoryMib: number;
  /** RAM backing file. share=on for a template or fork point (the file is the checkpoint's RAM);
   * share=off for a child restored from it (MAP_PRIVATE: copy-on-write, unmodified pages shared). */
  memPath: string;
  memShared: boolean;
  kernel: string;
  initrd: string;
  cmdline: string;
  disks: VmDisk[];
  qmpSocket: string;
  agentSocket: string;
  /**
   * Listening sockets the server created (root, 0600) at qmpSocket/agentSocket and passes to QEMU
   * as these inherited descriptors (`-chardev socket,fd=N,server=on`). Without them QEMU creates
   * the sockets itself at the paths.
   */
  socketFds?: { qmp: number; agent: number };
  consoleLog: string;
  /** Start paused waiting for `migrate-incoming` (restore) instead of booting. */
  incoming: boolean;
  /**
   * The NIC (virtio-net, fixed MAC). `tap`: attached to tap0 of the network namespace QEMU runs in;
   * `none`: the same device on a backend that goes nowhere (a hub port), for VMMs that never run
   * the guest on a network (bakes, fork-point receivers) but must carry the same device state.
   * Absent: no NIC (networking off). The tap runs without a virtio-net header (vnet_hdr=off), like
   * the hub port: a VMM's device state must load into a VMM on the other backend (a live fork's
   * receiver), and a header on one side only makes the state incompatible.
   */
  nic?: 'tap' | 'none';
  /** Extra `-sandbox` policy: on with obsolete/elevateprivileges/spawn/resourcecontrol denied. */
  seccomp: boolean;
  /**
   * A VMM spawned for a fork not yet made (forkReceivers.ts): its upper disk's nodes are named
   * (`upper`, `upper-file`) so the fork can give it another backing layer, and the RAM shim gets a
   * socket on descriptor 6 (REMAP_FD) to map the fork point's RAM in place of the template's.
   */
  remappable?: boolean;
}

/** The descriptor a remappable VMM's RAM shim reads its one `remap` request from. */
export const REMAP_FD = 6;

/** Kernel command line for every Collimate guest. The agent is /init in the initramfs. */
export function kernelCmdline(opts: { debug?: boolean; extra?: string[] } = {}): string {
  const args = [
    'console=ttyS0',
    opts.debug ? 'loglevel=7' : 'quiet',
    'panic=-1',
    'reboot=t',
    // The Debian cloud kernel probes legacy hardware microvm does not have; skipping it saves boot time.
    'i8042.noaux', 'i8042.nomux', 'i8042.nopnp', 'i8042.dumbkbd',
    'random.trust_cpu=on',
    'rdinit=/init',
  ];
  if (opts.debug) args.push('collimate.debug=1');
  if (opts.extra) args.push(...opts.extra);
  return args.join(' ');
}

export function qemuArgv(spec: VmSpec): string[] {
  const argv: string[] = [spec.qemuBinary];
  // No i8254 PIT: the guest keeps time with the TSC and the local APIC timer (tickless when idle),
  // while the PIT it never stops toggles its output every 27 ms in QEMU's main loop — two thirds
  // of an idle sandbox's host CPU under TCG (1.1 % of a core with it, 0.43 % without).
  argv.push('-M', 'microvm,acpi=on,isa-serial=on,rtc=on,pit=off,memory-backend=mem');
  if (spec.accel === 'kvm') {
    argv.push('-accel', 'kvm', '-cpu', 'host,-arch-capabilities');
  } else {
    // A small translation cache: the default (1 GiB) would dominate each idle sandbox's footprint.
    argv.push('-accel', 'tcg,tb-size=64', '-cpu', 'max');
  }
  argv.push('-smp', String(spec.vcpus), '-m', `${spec.memoryMib}M`);
  argv.push(
    '-object',
    `memory-backend-file,id=mem,size=${spec.memoryMib}M,mem-path=${spec.memPath},share=${spec.memShared ? 'on' : 'off'}`,
  );
  argv.push('-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot');
  if (spec.seccomp) {
    argv.push('-sandbox', 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny');
  }
  // A VMM that restores a checkpoint has the kernel in its RAM already; given -kernel and -initrd,
  // QEMU would read both files at start and keep copies of them for a reboot that never comes
  // (-no-reboot): 13.5 MiB of each idle sandbox's 53 MiB PSS.
  if (!spec.incoming) argv.push('-kernel', spec.kernel, '-initrd', spec.initrd, '-append', spec.cmdline);
  const sock = (id: 'qmp' | 'agent', path: string) =>
    `socket,id=${id},${spec.socketFds ? `fd=${spec.socketFds[id]}` : `path=${path}`},server=on,wait=off`;
  argv.push('-chardev', sock('qmp', spec.qmpSocket), '-mon', 'chardev=qmp,mode=control');
  argv.push('-chardev', `file,id=console,path=${spec.consoleLog}`, '-serial', 'chardev:console');
  argv.push(
    '-device', 'virtio-serial-device,max_ports=2',
    '-chardev', sock('agent', spec.agentSocket),
    '-device', 'virtserialport,chardev=agent,name=collimate.agent',
  );
  for (const d of spec.disks) {
    const id = `disk-${d.serial}`;
    const ro = d.readonly ? ',readonly=on' : ',discard=unmap';
    const names = spec.remappable && d.serial === 'upper' ? ',node-name=upper,file.node-name=upper-file' : '';
    argv.push('-drive', `id=${id}${names},file=${d.path},format=${d.format},if=none,cache=none,aio=threads${ro}`);
    argv.push('-device', `virtio-blk-device,drive=${id},serial=${d.serial}`);
  }
  if (spec.nic) {
    argv.push('-netdev', spec.nic === 'tap' ? 'tap,id=net0,ifname=tap0,script=no,downscript=no,vnet_hdr=off' : 'hubport,id=net0,hubid=0');
    argv.push('-device', `virtio-net-device,netdev=net0,mac=${GUEST_MAC}`);
  }
  if (spec.incoming) argv.push('-incoming', 'defer');
  return argv;
}
