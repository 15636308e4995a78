import { test } from 'node:test';
import assert from 'node:assert/strict';
import { qemuArgv, kernelCmdline } from '../../../src/vmm/argv.ts';
import { detectAccel } from '../../../src/vmm/accel.ts';
import { mkdtempSync, mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const spec = {
  qemuBinary: 'qemu-system-x86_64',
  accel: 'tcg' as const,
  vcpus: 1,
  memoryMib: 256,
  memPath: '/dev/shm/c/artifact.mem',
  memShared: false,
  kernel: '/k/vmlinuz',
  initrd: '/k/initramfs.cpio',
  cmdline: kernelCmdline(),
  disks: [
    { serial: 'layer0', path: '/l/base.erofs', format: 'raw' as const, readonly: true },
    { serial: 'upper', path: '/s/sbx_1/disk.qcow2', format: 'qcow2' as const, readonly: false },
  ],
  qmpSocket: '/s/sbx_1/qmp.sock',
  agentSocket: '/s/sbx_1/agent.sock',
  consoleLog: '/s/sbx_1/console.log',
  incoming: true,
  seccomp: true,
};

test('kernel command line is pinned', () => {
  assert.equal(
    kernelCmdline(),
    'console=ttyS0 quiet panic=-1 reboot=t i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd random.trust_cpu=on rdinit=/init',
  );
});

test('QEMU argv of a restored TCG child is pinned', () => {
  assert.equal(
    qemuArgv(spec).join(' '),
    [
      'qemu-system-x86_64',
      '-M microvm,acpi=on,isa-serial=on,rtc=on,pit=off,memory-backend=mem',
      '-accel tcg,tb-size=64 -cpu max',
      '-smp 1 -m 256M',
      '-object memory-backend-file,id=mem,size=256M,mem-path=/dev/shm/c/artifact.mem,share=off',
      '-nodefaults -no-user-config -display none -no-reboot',
      '-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
      '-chardev socket,id=qmp,path=/s/sbx_1/qmp.sock,server=on,wait=off -mon chardev=qmp,mode=control',
      '-chardev file,id=console,path=/s/sbx_1/console.log -serial chardev:console',
      '-device virtio-serial-device,max_ports=2',
      '-chardev socket,id=agent,path=/s/sbx_1/agent.sock,server=on,wait=off',
      '-device virtserialport,chardev=agent,name=collimate.agent',
      '-drive id=disk-layer0,file=/l/base.erofs,format=raw,if=none,cache=none,aio=threads,readonly=on -device virtio-blk-device,drive=disk-layer0,serial=layer0',
      '-drive id=disk-upper,file=/s/sbx_1/disk.qcow2,format=qcow2,if=none,cache=none,aio=threads,discard=unmap -device virtio-blk-device,drive=disk-upper,serial=upper',
      '-incoming defer',
    ].join(' '),
  );
});

test('with server-made sockets QEMU gets listening descriptors instead of paths', () => {
  const argv = qemuArgv({ ...spec, socketFds: { qmp: 3, agent: 4 } }).join(' ');
  assert.ok(argv.includes('-chardev socket,id=qmp,fd=3,server=on,wait=off -mon chardev=qmp,mode=control'));
  assert.ok(argv.includes('-chardev socket,id=agent,fd=4,server=on,wait=off -device virtserialport,chardev=agent,name=collimate.agent'));
  assert.ok(!argv.includes('qmp.sock') && !argv.includes('agent.sock'));
});

test('KVM argv uses the host CPU without arch-capabilities; a template is share=on and boots', () => {
  const argv = qemuArgv({ ...spec, accel: 'kvm', memShared: true, incoming: false, seccomp: false });
  assert.deepEqual(argv.slice(3, 7), ['-accel', 'kvm', '-cpu', 'host,-arch-capabilities']);
  assert.ok(argv.includes('memory-backend-file,id=mem,size=256M,mem-path=/dev/shm/c/artifact.mem,share=on'));
  assert.ok(!argv.includes('-incoming'));
  assert.ok(!argv.includes('-sandbox'));
  // A VMM that boots gets the kernel; one that restores a checkpoint does not (its RAM has it).
  assert.equal(argv[argv.indexOf('-kernel') + 1], '/k/vmlinuz');
  assert.ok(!qemuArgv(spec).includes('-kernel'));
});

test('accelerator detection: PVM means TCG, real KVM modules mean KVM, env overrides', () => {
  const host = (mods: string[], kvm: boolean) => {
    const root = mkdtempSync(join(tmpdir(), 'sysmod-'));
    for (const m of mods) mkdirSync(join(root, 'sys', m), { recursive: true });
    if (kvm) writeFileSync(join(root, 'kvm'), '');
    return { sysModule: join(root, 'sys'), devKvm: join(root, 'kvm') };
  };
  assert.equal(detectAccel({ COLLIMATE_ACCEL: 'tcg' }, host(['kvm_intel'], true)).accel, 'tcg');
  assert.equal(detectAccel({ COLLIMATE_ACCEL: 'kvm' }, host([], false)).accel, 'kvm');
  assert.throws(() => detectAccel({ COLLIMATE_ACCEL: 'hvf' }), /kvm.*tcg/);
  assert.equal(detectAccel({}, host(['kvm', 'kvm_pvm'], true)).accel, 'tcg');
  assert.equal(detectAccel({}, host(['kvm', 'kvm_intel'], true)).accel, 'kvm');
  assert.equal(detectAccel({}, host(['kvm', 'kvm_amd'], true)).accel, 'kvm');
  assert.equal(detectAccel({}, host(['kvm_intel'], false)).accel, 'tcg');
  assert.equal(detectAccel({}, host(['kvm'], true)).accel, 'tcg');
});

test('under TCG the guest is told the host TSC rate so it never calibrates against the PIT, and that the TSC is reliable', async () => {
  const { guestClockArgs } = await import('../../../src/vmm/accel.ts');
  const dir = mkdtempSync(join(tmpdir(), 'cpuinfo-'));
  const info = join(dir, 'cpuinfo');
  writeFileSync(info, 'processor\t: 0\ncpu MHz\t\t: 2596.098\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\n');
  assert.deepEqual(guestClockArgs('tcg', info), ['tsc_early_khz=2596000', 'tsc=reliable']);
  assert.deepEqual(guestClockArgs('kvm', info), []);
  writeFileSync(info, 'processor\t: 0\ncpu MHz\t\t: 2596.098\nflags\t\t: fpu tsc\n');
  assert.deepEqual(guestClockArgs('tcg', info), [], 'a TSC that is not constant has no single rate to give');
});

test('a fork receiver names its upper disk\'s nodes (to rebase it over QMP); the layers and other VMMs do not', () => {
  const argv = qemuArgv({ ...spec, remappable: true }).join(' ');
  assert.ok(argv.includes('-drive id=disk-upper,node-name=upper,file.node-name=upper-file,file=/s/sbx_1/disk.qcow2,format=qcow2,'));
  assert.ok(argv.includes('-drive id=disk-layer0,file=/l/base.erofs,'));
  assert.ok(!qemuArgv(spec).join(' ').includes('node-name'));
});
