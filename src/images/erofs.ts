/**
 * Building an erofs image that is the same bytes every time from the same tree, so that a layer is
 * one thing whichever host or build made it (a checkpoint taken over a layer must never be restored
 * over different bytes of it). mkfs.erofs (1.5) puts two things of its own in an image: a random
 * UUID and the build's time in the superblock. The UUID is given (`-U`, derived from the layer's
 * diff id); the build time is set to zero afterwards and the superblock's checksum recomputed. With
 * every inode extended (`-Eforce-inode-extended`) the build time is the mtime of no file: a compact
 * inode, which has none of its own, would take it. Per-file mtimes are kept (`--preserve-mtime`;
 * mkfs's own `-T` or SOURCE_DATE_EPOCH would overwrite them all, and Python checks its .pyc files
 * against them).
 */
import { createHash } from 'node:crypto';
import { closeSync, openSync, readSync, writeSync } from 'node:fs';
import { run } from '../host/run.js';

const SUPER_OFFSET = 1024;
const BLOCK = 4096;
const MAGIC = 0xe0f5e1e2;
/** Superblock fields (from its start): checksum u32 at 4, feature_compat u32 at 8, build_time u64 at 24, build_time_nsec u32 at 32, uuid at 48. */
const SB_CHECKSUM = 4;
const SB_FEATURE_COMPAT = 8;
const FEATURE_SB_CHKSUM = 0x1;
const SB_BUILD_TIME = 24;
const SB_BUILD_TIME_NSEC = 32;

export const LAYER_MKFS_ARGS = ['--quiet', '-zlz4hc', '--preserve-mtime', '-Eforce-inode-extended'];

/** A UUID that is a function of `seed` (a layer's diff id). */
export function uuidFrom(seed: string): string {
  const h = createHash('sha256').update(`collimate erofs uuid\n${seed}`).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

/** Packs `tree` into `out`, the same bytes for the same tree and seed. */
export async function buildErofs(out: string, tree: string, seed: string): Promise<void> {
  await run('mkfs.erofs', [...LAYER_MKFS_ARGS, `-U${uuidFrom(seed)}`, out, tree], { timeoutMs: 1_800_000 });
  zeroBuildTime(out);
}

const CRC32C_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[i] = c >>> 0;
  }
  return t;
})();

/** CRC-32C as the kernel's crc32c(seed, …) computes it: no final inversion. */
export function crc32c(seed: number, data: Uint8Array): number {
  let crc = seed >>> 0;
  for (const b of data) crc = (CRC32C_TABLE[(crc ^ b) & 0xff] ^ (crc >>> 8)) >>> 0;
  return crc;
}

/** Sets an erofs image's build time to zero and, when the image has one, recomputes its superblock checksum. */
export function zeroBuildTime(path: string): void {
  const fd = openSync(path, 'r+');
  try {
    const sb = Buffer.alloc(BLOCK - SUPER_OFFSET);
    if (readSync(fd, sb, 0, sb.length, SUPER_OFFSET) !== sb.length || sb.readUInt32LE(0) !== MAGIC) {
      throw new Error(`${path} is not an erofs image`);
    }
    sb.writeBigUInt64LE(0n, SB_BUILD_TIME);
    sb.writeUInt32LE(0, SB_BUILD_TIME_NSEC);
    if (sb.readUInt32LE(SB_FEATURE_COMPAT) & FEATURE_SB_CHKSUM) {
      sb.writeUInt32LE(0, SB_CHECKSUM);
      sb.writeUInt32LE(crc32c(0xffffffff, sb), SB_CHECKSUM);
    }
    writeSync(fd, sb, 0, sb.length, SUPER_OFFSET);
  } finally {
    closeSync(fd);
  }
}
