/**
 * A device-state stream for restoring a guest whose RAM is already in its memory file: what QEMU's
 * `xen-save-devices-state` writes (every device section, no RAM, no configuration) behind the
 * opening of a checkpoint made with x-ignore-shared for the same machine (magic, configuration and
 * the RAM section that only names the RAM blocks). `migrate-incoming` loads the result like a
 * checkpoint: the RAM section moves no page, the device sections restore the devices.
 */
const QEMU_VM_FILE_MAGIC = 0x5145564d;
const QEMU_VM_SECTION_FULL = 0x04;

/**
 * `checkpoint`: a device-state stream of the same machine shape (the artifact's or a fork point's);
 * `devices`: xen-save-devices-state output. The devices' first section header is found in the
 * checkpoint, and everything before it is the opening the devices go behind.
 */
export function spliceDeviceState(checkpoint: Buffer, devices: Buffer): Buffer {
  if (devices.length < 8 || devices.readUInt32BE(0) !== QEMU_VM_FILE_MAGIC) throw new Error('device state: not a QEMU migration stream');
  if (checkpoint.length < 8 || checkpoint.readUInt32BE(0) !== QEMU_VM_FILE_MAGIC) throw new Error('checkpoint: not a QEMU migration stream');
  const body = devices.subarray(8);
  if (body[0] !== QEMU_VM_SECTION_FULL) throw new Error(`device state: expected a full section first, found type ${body[0]}`);
  // type, section id (be32), id string (length byte + bytes), instance id (be32), version (be32)
  const headerLen = 1 + 4 + 1 + body[5] + 4 + 4;
  const at = checkpoint.indexOf(body.subarray(0, headerLen), 8);
  if (at < 0) throw new Error(`checkpoint has no section ${JSON.stringify(body.subarray(6, 6 + body[5]).toString())}: a different machine`);
  return Buffer.concat([checkpoint.subarray(0, at), body]);
}
