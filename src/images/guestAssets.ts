import { mkdirSync, readdirSync, existsSync, copyFileSync, writeFileSync, symlinkSync, readFileSync, chmodSync, statSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { homePaths } from '../host/paths.js';
import { sha256Hex, sha256File } from '../host/hash.js';
import { run } from '../host/run.js';
import { buildOnce } from '../host/buildOnce.js';

/**
 * Guest assets the project builds itself from Debian packages: the kernel (linux-image-cloud-amd64,
 * downloaded and unpacked, never installed on the host), an initramfs holding the guest agent and the
 * kernel modules it loads, and the `base` root filesystem (busybox) as an erofs layer. Each is cached
 * content-addressed under the data directory and rebuilt only when an input changes.
 */

export interface KernelAsset {
  version: string; // e.g. 6.1.0-57-cloud-amd64
  debSha256: string;
  root: string; // unpacked package
  vmlinuz: string;
}

/** Modules the agent needs, loaded in dependency order. Everything else (ext4, …) is built in. */
export const GUEST_MODULES = ['virtio_mmio', 'virtio_blk', 'virtio_console', 'erofs', 'overlay', 'virtio_net'] as const;

/** Bump when the way an asset is built changes, so caches keyed on inputs are rebuilt. */
const INITRAMFS_RECIPE = 'initramfs-v1';
const BASE_ROOTFS_RECIPE = 'base-rootfs-v1';

export type Progress = (msg: string) => void;

async function aptField(pkg: string, field: string): Promise<string> {
  const { stdout } = await run('apt-cache', ['show', '--no-all-versions', pkg]);
  const m = stdout.match(new RegExp(`^${field}: (.+)$`, 'm'));
  if (!m) throw new Error(`apt-cache show ${pkg} has no ${field}; run scripts/setup.sh (apt-get update) first`);
  return m[1].trim();
}

export async function ensureKernel(home: string, progress: Progress = () => {}): Promise<KernelAsset> {
  const paths = homePaths(home);
  const { stdout } = await run('apt-cache', ['depends', 'linux-image-cloud-amd64']);
  const pkg = stdout.match(/Depends: (linux-image-[0-9][^\s]*)/)?.[1];
  if (!pkg) throw new Error('cannot resolve linux-image-cloud-amd64 to a kernel package; run scripts/setup.sh first');
  const debSha256 = await aptField(pkg, 'SHA256');
  const version = pkg.replace(/^linux-image-/, '');
  const dir = join(paths.assets, `kernel-${debSha256.slice(0, 16)}`);
  await buildOnce(dir, paths.tmp, async (tmp) => {
    progress(`downloading kernel package ${pkg}`);
    await run('apt-get', ['download', '-q', pkg], { cwd: tmp });
    const deb = readdirSync(tmp).find((f) => f.endsWith('.deb'));
    if (!deb) throw new Error(`apt-get download ${pkg} produced no .deb`);
    const got = await sha256File(join(tmp, deb));
    if (got !== debSha256) throw new Error(`kernel package digest mismatch: ${got} != ${debSha256}`);
    progress(`unpacking ${deb}`);
    await run('dpkg-deb', ['-x', join(tmp, deb), join(tmp, 'root')]);
    await run('depmod', ['-b', join(tmp, 'root'), version]);
    writeFileSync(join(tmp, 'kernel.json'), JSON.stringify({ version, pkg, debSha256 }));
    // buildOnce renames tmp itself into place; keep the .deb out of the cache.
    await run('rm', ['-f', join(tmp, deb)]);
  });
  return { version, debSha256, root: join(dir, 'root'), vmlinuz: join(dir, 'root', 'boot', `vmlinuz-${version}`) };
}

/** Module files in load order for GUEST_MODULES, from modprobe's own dependency resolution. */
export async function moduleLoadOrder(kernel: KernelAsset): Promise<string[]> {
  const order: string[] = [];
  for (const mod of GUEST_MODULES) {
    const { stdout } = await run('modprobe', ['-d', kernel.root, '-S', kernel.version, '--show-depends', mod]);
    for (const line of stdout.split('\n')) {
      const m = line.match(/^insmod (\S+)/);
      if (!m) continue;
      const rel = m[1].startsWith(kernel.root) ? m[1].slice(kernel.root.length) : m[1];
      if (!order.includes(rel)) order.push(rel);
    }
  }
  return order;
}

export interface InitramfsAsset { path: string; digest: string; modules: string[] }

/** A file the initramfs carries besides the agent and the modules, e.g. the seed library. */
export interface InitramfsFile {
  /** Absolute path inside the initramfs, e.g. /lib/collimate/libcollimate-seed.so. */
  path: string;
  /** The file on the host. */
  source: string;
  mode: number;
}

/** Where the agent expects the seed library in the initramfs (SEED_LIBRARY_INITRAMFS_PATH in agent.h). */
export const SEED_LIBRARY_INITRAMFS_PATH = '/lib/collimate/libcollimate-seed.so';

export async function ensureInitramfs(home: string, kernel: KernelAsset, agentBinary: string, progress: Progress = () => {}, files: InitramfsFile[] = []): Promise<InitramfsAsset> {
  const paths = homePaths(home);
  const modules = await moduleLoadOrder(kernel);
  const agentSha = await sha256File(agentBinary);
  for (const f of files) if (!f.path.startsWith('/') || f.path.split('/').includes('..')) throw new Error(`initramfs file path must be absolute: ${f.path}`);
  const fileParts = await Promise.all(files.map(async (f) => `${f.path}\0${f.mode.toString(8)}\0${await sha256File(f.source)}`));
  const digest = sha256Hex(INITRAMFS_RECIPE, kernel.debSha256, agentSha, modules.join('\n'), ...fileParts);
  const dir = join(paths.assets, `initramfs-${digest.slice(0, 16)}`);
  await buildOnce(dir, paths.tmp, async (tmp) => {
    progress('building initramfs');
    const stage = join(tmp, 'stage');
    for (const d of ['dev', 'proc', 'sys', 'run', 'newroot', 'lib/modules', 'tmp']) mkdirSync(join(stage, d), { recursive: true });
    copyFileSync(agentBinary, join(stage, 'init'));
    chmodSync(join(stage, 'init'), 0o755);
    for (const rel of modules) {
      mkdirSync(dirname(join(stage, rel)), { recursive: true });
      copyFileSync(join(kernel.root, rel), join(stage, rel));
    }
    writeFileSync(join(stage, 'lib/modules/collimate.order'), modules.join('\n') + '\n');
    for (const f of files) {
      const target = join(stage, f.path.slice(1));
      mkdirSync(dirname(target), { recursive: true });
      copyFileSync(f.source, target);
      chmodSync(target, f.mode);
    }
    // Uncompressed newc: decompressing under TCG costs more boot time than the extra bytes.
    await run('sh', ['-c', `cd "${stage}" && find . -print0 | LC_ALL=C sort -z | cpio --quiet --null -o -H newc --owner=0:0 > "${join(tmp, 'initramfs.cpio')}"`]);
    await run('rm', ['-rf', stage]);
  });
  return { path: join(dir, 'initramfs.cpio'), digest, modules };
}

export interface LayerAsset { path: string; digest: string }

/** The `base` catalog rootfs: busybox-static and a minimal /etc, as one read-only erofs layer. */
export async function ensureBaseRootfs(home: string, progress: Progress = () => {}): Promise<LayerAsset> {
  const paths = homePaths(home);
  const busybox = '/bin/busybox';
  if (!existsSync(busybox)) throw new Error('busybox-static is not installed; run scripts/setup.sh');
  const bbSha = await sha256File(busybox);
  const digest = sha256Hex(BASE_ROOTFS_RECIPE, bbSha);
  const dir = join(paths.assets, `rootfs-base-${digest.slice(0, 16)}`);
  await buildOnce(dir, paths.tmp, async (tmp) => {
    progress('building base rootfs (busybox)');
    const root = join(tmp, 'root');
    for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'root', 'tmp', 'proc', 'sys', 'dev', 'run', 'var/tmp', 'home', 'mnt']) {
      mkdirSync(join(root, d), { recursive: true });
    }
    chmodSync(join(root, 'tmp'), 0o1777);
    copyFileSync(busybox, join(root, 'bin/busybox'));
    chmodSync(join(root, 'bin/busybox'), 0o755);
    const { stdout } = await run(busybox, ['--list-full']);
    for (const applet of stdout.split('\n').map((s) => s.trim()).filter(Boolean)) {
      const target = join(root, applet);
      if (applet === 'bin/busybox' || existsSync(target)) continue;
      mkdirSync(dirname(target), { recursive: true });
      const depth = applet.split('/').length - 1;
      symlinkSync(`${'../'.repeat(depth)}bin/busybox`, target);
    }
    writeFileSync(join(root, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n');
    writeFileSync(join(root, 'etc/group'), 'root:x:0:\nnogroup:x:65534:\n');
    writeFileSync(join(root, 'etc/hostname'), 'sandbox\n');
    writeFileSync(join(root, 'etc/hosts'), '127.0.0.1 localhost sandbox\n::1 localhost\n');
    writeFileSync(join(root, 'etc/os-release'), 'NAME="Collimate base"\nID=collimate-base\n');
    await run('mkfs.erofs', ['--quiet', '-T0', '--all-root', join(tmp, 'layer.erofs'), root]);
    await run('rm', ['-rf', root]);
  });
  return { path: join(dir, 'layer.erofs'), digest };
}

export function fileSize(path: string): number {
  return statSync(path).size;
}

export function readJson<T>(path: string): T {
  return JSON.parse(readFileSync(path, 'utf8')) as T;
}
