/**
 * Confinement of VMM processes (the jailer). Every QEMU runs
 *
 * - under a uid of its own from a range (src/host/claims.ts), with no supplementary groups, no
 *   capabilities (effective, permitted, inheritable, ambient and bounding sets empty) and
 *   no_new_privs — collimate-vmm-launch (vmmlaunch.c) does the switch just before exec;
 * - with QEMU's own seccomp filter (`-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,
 *   resourcecontrol=deny`, argv.ts);
 * - in a mount namespace whose root is a fresh tmpfs holding only /usr (read-only), a few device
 *   nodes, a /proc that shows the VMM only its own processes, its own directory, its disk chain,
 *   its RAM file, kernel, initramfs and layers — at the same paths as on the host, so QEMU's argv
 *   and the backing-file names inside qcow2 headers resolve unchanged. Another sandbox's files do
 *   not exist in that view;
 * - in a cgroup of its own with memory, cpu and pids limits from the VM size (cgroup.ts).
 *
 * Files: what the VMM writes (its top disk, its own RAM file, its console log) is chowned to its
 * uid, mode 0600; what it shares (template RAM, frozen disks, layers, kernel) is root-owned 0644;
 * the VMM directory itself is root-owned 0711, so the VMM can neither list it nor create,
 * rename or replace anything in it (the server reads and writes there as root: no symlink games).
 * QMP and agent sockets are created by the server (root, 0600) and handed to QEMU as listening
 * file descriptors (vmm.ts), so QEMU never creates a socket the server then trusts.
 *
 * The pieces that decide (the view plan, the launcher's steps) are pure functions, golden-tested in
 * test/unit/vmm/jail.test.ts.
 */
import { chmodSync, chownSync, closeSync, existsSync, linkSync, lstatSync, mkdirSync, openSync, readFileSync, readSync, readdirSync, readlinkSync, rmSync, statSync } from 'node:fs';
import { dirname, isAbsolute, join, resolve, relative } from 'node:path';
import { release as osRelease } from 'node:os';
import { REMAP_FD, type Accel } from './argv.js';
import { buildC } from './native.js';
import type { MachineShape } from './machine.js';
import { UidPool, ownStartTicks, readClaim, releaseClaim, sameOwner, type ClaimOwner } from '../host/claims.js';
import {
  createVmmCgroup, ensureParents, hostCgroups, removeVmmCgroup, sweepVmmCgroups, listVmmCgroups, vmmLimits,
  type CgroupLayout, type CgroupMode,
} from './cgroup.js';
import { run } from '../host/run.js';

export interface JailSettings {
  /** auto: confine when the server runs as root (it needs to, to switch uids); on: require it; off. */
  mode: 'auto' | 'on' | 'off';
  uidBase: number;
  uidCount: number;
  /** Host-wide state: uid claims, the mount point of each VMM's new root. */
  runDir: string;
  cgroups: CgroupMode;
  /** Absolute cgroup path of the parent (default: see cgroup.ts). */
  cgroupParent?: string;
  /** Added to guest RAM for the memory limit: QEMU itself, the TCG translation cache (64 MiB), I/O threads. */
  memoryOverheadMib: number;
  pidsMax: number;
}

/** What a VMM record keeps so that a later server can release the VMM's uid and cgroup. */
export interface JailRecord {
  uid: number;
  /** The uid's claim file (src/host/claims.ts). */
  claim: string;
  cgroups: string[];
  /** The VMM's own tun device node, when it attaches to a tap. */
  tunNode?: string;
}

export interface JailRequest {
  /** Names the cgroup; unique among this home's live VMMs (sandbox id, fork point id, bake id). */
  name: string;
  /** The VMM's directory (sockets, logs): bound into the view read-write, root-owned 0711. */
  dir: string;
  shape: MachineShape;
  accel: Accel;
  qemuBinary: string;
  memPath: string;
  memShared: boolean;
  /** The writable top disk; its backing chain is read from the qcow2 headers. */
  diskPath: string;
  consoleLog: string;
  /** The data directory's disks directory: the view shows the VMM's own links directory there. */
  disksDir: string;
  /**
   * The read-only layers the disk may sit on, from the server's own records. The chain is read from
   * qcow2 headers, which the VMM that wrote the disk controls: a backing name outside this list
   * (another tenant's disk, /etc/shadow) would otherwise be chowned, made readable and bound into
   * the view. Such a chain is refused.
   */
  trustedLayers: string[];
  /** The VMM attaches to a tap (needs /dev/net/tun in its view). */
  tun?: boolean;
  /**
   * A remappable VMM's remap directory (on the RAM files' tmpfs, root-owned 0711): bound read-only
   * into its view, named to its RAM shim with the descriptor of its remap socket (VmSpec.remappable).
   * A second one, `remap` in the VMM's directory (on the home's disk, root-owned 0711), takes files
   * that lie on the disk (a suspended sandbox's RAM image): a link can only be made on one file system.
   */
  remapDir?: string;
}

export interface JailLaunch {
  uid: number;
  record: JailRecord;
  /**
   * Wraps QEMU's argv into the confined launch (collimate-vmm-launch: namespaces, mounts, uid,
   * then exec QEMU), joining the network namespace `netns` first when given.
   */
  command(argv: string[], netns?: string): { file: string; args: string[]; env: NodeJS.ProcessEnv };
  /** The spawned VMM process now holds the uid. */
  bind(owner: ClaimOwner): void;
  /** Gives the uid and cgroup back. Idempotent; only once the process is gone. */
  release(): Promise<void>;
}

// ---- pure: the view and the launch steps ---------------------------------------------------------

export interface ViewBind {
  /** Path on the host. */
  src: string;
  /** Path inside the view (absolute). */
  dst: string;
  kind: 'dir' | 'file';
  ro: boolean;
  /** A device node: bound with its mount's own flags (the rest lose device files). */
  device?: boolean;
}

export interface ViewPlan {
  /** Where the new root's tmpfs is mounted before pivot_root (a host directory, empty). */
  root: string;
  cgroupProcs: string[];
  binds: ViewBind[];
  /** Merged-/usr symlinks (`bin -> usr/bin`, …). */
  symlinks: Array<[name: string, target: string]>;
  /** proc with hidepid=2 (per-mount on Linux >= 5.8); older kernels get a read-only bind of the host's. */
  proc: 'private' | 'bind';
  uid: number;
  gid: number;
  groups: number[];
  env: Record<string, string>;
  /**
   * Transparent huge pages off for the VMM (collimate-vmm-launch --no-thp), given under TCG. QEMU
   * asks for huge pages (madvise) on its translation cache and its firmware's RAM, so with THP on
   * (`madvise`, Debian's default) each sandbox held whole 2 MiB pages of both where it used far
   * less: an idle sandbox of the base template went from 36.1 to 32.8 MiB PSS (bench/pss.ts, 10
   * sandboxes, median) with no change beyond the noise in the host CPU a busy guest costs. Under
   * KVM there is no translation cache and the guest's RAM is a tmpfs file, so nothing is asked.
   */
  noThp?: boolean;
}

/** Host files and dirs every QEMU needs: /usr read-only, the loader cache, five device nodes. */
export function systemBinds(opts: { accel: Accel; qemuBinary: string; hasLdCache: boolean }): ViewBind[] {
  const b: ViewBind[] = [{ src: '/usr', dst: '/usr', kind: 'dir', ro: true }];
  if (opts.hasLdCache) b.push({ src: '/etc/ld.so.cache', dst: '/etc/ld.so.cache', kind: 'file', ro: true });
  for (const d of ['null', 'zero', 'full', 'random', 'urandom']) b.push({ src: `/dev/${d}`, dst: `/dev/${d}`, kind: 'file', ro: false, device: true });
  if (opts.accel === 'kvm') {
    b.push({ src: '/dev/kvm', dst: '/dev/kvm', kind: 'file', ro: false, device: true });
    b.push({ src: '/sys', dst: '/sys', kind: 'dir', ro: true });
  }
  if (isAbsolute(opts.qemuBinary) && !opts.qemuBinary.startsWith('/usr/')) b.push({ src: opts.qemuBinary, dst: opts.qemuBinary, kind: 'file', ro: true });
  return b;
}

const within = (p: string, dir: string) => p === dir || p.startsWith(dir.endsWith('/') ? dir : dir + '/');

/**
 * The VMM's own binds: its directory, its disks (the links directory shown as the disks
 * directory), RAM, kernel, initramfs, layers and the RAM shim. A path inside a directory that is
 * already bound is not bound again; the disks directory is bound only if the chain uses it.
 */
export function vmmBinds(opts: {
  dir: string; linksDir: string; disksDir: string; chain: string[]; memPath: string; memOwn: boolean;
  readonlyFiles: string[];
}): ViewBind[] {
  const out: ViewBind[] = [{ src: opts.dir, dst: opts.dir, kind: 'dir', ro: false }];
  if (opts.chain.some((p) => dirname(p) === opts.disksDir)) out.push({ src: opts.linksDir, dst: opts.disksDir, kind: 'dir', ro: false });
  const files: ViewBind[] = [
    ...opts.chain.map((p, i) => ({ src: p, dst: p, kind: 'file' as const, ro: i > 0 })),
    { src: opts.memPath, dst: opts.memPath, kind: 'file', ro: !opts.memOwn },
    ...opts.readonlyFiles.map((p) => ({ src: p, dst: p, kind: 'file' as const, ro: true })),
  ];
  for (const f of files) {
    if (out.some((b) => b.kind === 'dir' && within(f.dst, b.dst))) continue;
    if (out.some((b) => b.dst === f.dst)) continue;
    out.push(f);
  }
  return out;
}

/**
 * The steps collimate-vmm-launch (vmmlaunch.c) takes as root in the VMM's new mount namespace
 * before it becomes QEMU: join the cgroups, build the new root, bind what the VMM may see (parents
 * before children), mount /proc; it then pivots into the root, drops to the VMM's uid and execs
 * the argv after `--`. One process instead of a shell running ~25 programs.
 */
export function launchArgs(p: ViewPlan, netns?: string): string[] {
  const rel = (abs: string) => `.${abs}`;
  const args: string[] = [];
  if (netns) args.push('--netns', netns);
  if (p.noThp) args.push('--no-thp');
  for (const f of p.cgroupProcs) args.push('--cgroup', f);
  args.push('--root', p.root);
  const binds = [...p.binds].sort((a, b) => a.dst.split('/').length - b.dst.split('/').length || a.dst.localeCompare(b.dst));
  const dirs = new Set<string>(['/proc', '/.old']);
  const files: string[] = [];
  for (const b of binds) {
    if (b.kind === 'dir') dirs.add(b.dst);
    else { dirs.add(dirname(b.dst)); files.push(b.dst); }
  }
  for (const d of [...dirs].filter((d) => d !== '/').sort()) args.push('--mkdir', rel(d));
  for (const f of files) args.push('--touch', rel(f));
  for (const [name, target] of p.symlinks) args.push('--symlink', target, rel(name));
  // Device nodes keep their mount's flags; everything else loses setuid and device files, and what
  // the VMM may write loses exec too.
  for (const b of binds) args.push('--bind', b.src, rel(b.dst), b.device ? 'dev' : b.ro ? 'ro' : 'rw');
  args.push('--proc', p.proc);
  for (const [k, v] of Object.entries(p.env)) args.push('--env', `${k}=${v}`);
  args.push('--uid', String(p.uid), '--gid', String(p.gid));
  for (const g of p.groups) args.push('--group', String(g));
  return args;
}

// ---- the disk chain ------------------------------------------------------------------------------

/**
 * A disk and every backing file below it, top first, read from the qcow2 headers (a raw image has
 * no backing file). Relative backing names are relative to the image's directory, as in QEMU.
 */
export function backingChain(top: string, maxDepth = 256): string[] {
  const chain: string[] = [];
  let cur: string | undefined = top;
  while (cur) {
    if (chain.includes(cur) || chain.length >= maxDepth) throw new Error(`backing chain of ${top} loops or is too deep`);
    chain.push(cur);
    cur = qcow2Backing(cur);
  }
  return chain;
}

function qcow2Backing(path: string): string | undefined {
  const fd = openSync(path, 'r');
  try {
    const h = Buffer.alloc(20);
    if (readSync(fd, h, 0, 20, 0) < 20 || h.readUInt32BE(0) !== 0x514649fb) return undefined;
    const off = Number(h.readBigUInt64BE(8));
    const len = h.readUInt32BE(16);
    if (off === 0 || len === 0) return undefined;
    if (len > 4096) throw new Error(`${path}: backing file name too long`);
    const name = Buffer.alloc(len);
    readSync(fd, name, 0, len, off);
    const s = name.toString('utf8');
    return isAbsolute(s) ? s : resolve(dirname(path), s);
  } finally {
    closeSync(fd);
  }
}

/** The first layer below the top of `chain` that is not in `trusted`, if any. */
export function untrustedLayer(chain: string[], trusted: string[]): string | undefined {
  const ok = new Set(trusted);
  return chain.slice(1).find((p) => !ok.has(p));
}

// ---- the RAM shim --------------------------------------------------------------------------------

export const SHIM_NAME = 'libcollimate-ramro.so';
export const LAUNCHER_NAME = 'collimate-vmm-launch';

/** Builds libcollimate-ramro.so (ramro.c), cached under `assetsDir`: root's, 0644. */
export async function ensureRamShim(assetsDir: string, tmpRoot: string): Promise<string> {
  const lib = await buildC(assetsDir, tmpRoot, { tag: 'ramro', source: 'ramro.c', out: SHIM_NAME, flags: ['-shared', '-fPIC'], libs: ['-ldl'] });
  sealShared(lib);
  return lib;
}

/** Builds collimate-vmm-launch (vmmlaunch.c), cached under `assetsDir`: root's, 0755. */
export async function ensureLauncher(assetsDir: string, tmpRoot: string): Promise<string> {
  const bin = await buildC(assetsDir, tmpRoot, { tag: 'vmmlaunch', source: 'vmmlaunch.c', out: LAUNCHER_NAME, flags: [] });
  chownSync(bin, 0, 0);
  chmodSync(bin, 0o755);
  return bin;
}

// ---- file ownership ------------------------------------------------------------------------------

/** A shared read-only file: root-owned, 0644 (readable by every VMM uid, writable by none). */
export function sealShared(path: string): void {
  const st = statSync(path);
  if (st.uid !== 0 || st.gid !== 0) chownSync(path, 0, 0);
  if ((st.mode & 0o7777) !== 0o644) chmodSync(path, 0o644);
}

/** A file only this VMM may read and write. */
function own(path: string, uid: number): void {
  if (!existsSync(path)) closeSync(openSync(path, 'a', 0o600));
  chownSync(path, uid, uid);
  chmodSync(path, 0o600);
}

/** A root-owned directory the VMM may traverse but not list or change. */
/** A remappable VMM's second remap directory, for files on the home's disk (JailRequest.remapDir). */
export function diskRemapDir(vmmDir: string): string {
  return join(vmmDir, 'remap');
}

function rootDir(path: string): void {
  mkdirSync(path, { recursive: true });
  const st = lstatSync(path);
  if (!st.isDirectory()) throw new Error(`${path} is not a directory`);
  if (st.uid !== 0 || st.gid !== 0) chownSync(path, 0, 0);
  chmodSync(path, 0o711);
}

// ---- the jailer ----------------------------------------------------------------------------------

export interface JailStatus {
  enabled: boolean;
  reason: string;
  cgroups: 'v1' | 'v2' | 'none';
  cgroupsReason?: string;
}

/** Decides whether VMMs are confined on this host, and confines them. One per engine. */
export class Jailer {
  readonly uids: UidPool;
  private shim?: string;
  private launcher?: string;

  private constructor(
    readonly settings: JailSettings,
    readonly layout: CgroupLayout,
    /** Prefix of this home's cgroup names. */
    readonly tag: string,
    private readonly shimDirs: { assets: string; tmp: string },
  ) {
    this.uids = uidClaims(settings);
  }

  /** Null when confinement is off (by setting, or `auto` on a server not running as root). */
  static async open(settings: JailSettings, opts: { tag: string; assetsDir: string; tmpDir: string }): Promise<Jailer | null> {
    const st = jailAvailability(settings);
    if (!st.enabled) {
      if (settings.mode === 'on') throw new Error(`COLLIMATE_JAIL=on but VMMs cannot be confined here: ${st.reason}`);
      return null;
    }
    const conflicts = uidRangeConflicts({ passwd: readOr('/etc/passwd'), subuid: readOr('/etc/subuid'), subgid: readOr('/etc/subgid') }, settings.uidBase, settings.uidCount);
    if (conflicts.length) {
      throw new Error(
        `the VMM uid range ${settings.uidBase}…${settings.uidBase + settings.uidCount - 1} is also used by ${conflicts.join(', ')}: ` +
        'processes of that user could run as a VMM\'s uid. Move the range with COLLIMATE_VMM_UID_BASE / COLLIMATE_VMM_UID_COUNT.',
      );
    }
    const layout = settings.cgroups === 'off' ? { version: 0 as const, reason: 'COLLIMATE_CGROUPS=off' } : hostCgroups(settings.cgroups, settings.cgroupParent);
    if (layout.version !== 0) ensureParents(layout);
    mkdirSync(join(settings.runDir, 'vmroot'), { recursive: true, mode: 0o755 });
    const j = new Jailer(settings, layout, opts.tag, { assets: opts.assetsDir, tmp: opts.tmpDir });
    mkdirSync(j.uids.dir, { recursive: true, mode: 0o700 });
    j.uids.sweepStale();
    sweepTunNodes(j.uids);
    j.shim = await ensureRamShim(opts.assetsDir, opts.tmpDir);
    j.launcher = await ensureLauncher(opts.assetsDir, opts.tmpDir);
    return j;
  }

  status(): JailStatus {
    return {
      enabled: true,
      reason: 'per-VMM uid, no capabilities, no_new_privs, seccomp, private mount view',
      cgroups: this.layout.version === 2 ? 'v2' : this.layout.version === 1 ? 'v1' : 'none',
      ...(this.layout.version === 0 ? { cgroupsReason: this.layout.reason } : {}),
    };
  }

  /** This home's VMM cgroup directories that exist now (leak checks). */
  cgroupDirs(): string[] {
    return listVmmCgroups(this.layout, `${this.tag}-`);
  }

  /** Removes this home's cgroups that no process is in (left by a crash between create and spawn). */
  async sweep(): Promise<void> {
    if (this.layout.version !== 0) await sweepVmmCgroups(this.layout, `${this.tag}-`);
    // Claims and tun nodes of VMMs stopped since the start's sweep (strays reconcile killed).
    this.uids.sweepStale();
    sweepTunNodes(this.uids);
  }

  /**
   * Claims a uid, sets file ownership, links the disk chain, creates the cgroup and returns the
   * launch. Precondition: the VMM's directory, top disk and (for a shared RAM file) the RAM file exist.
   */
  async prepare(req: JailRequest): Promise<JailLaunch> {
    const self: ClaimOwner = { pid: process.pid, startTicks: ownStartTicks() };
    const uid = this.uids.claim(self);
    let cgroup: { dirs: string[]; procsFiles: string[] } | null = null;
    let tun: string | undefined;
    try {
      const chain = backingChain(req.diskPath);
      const bad = untrustedLayer(chain, req.trustedLayers);
      if (bad) throw new Error(`the disk chain of ${req.diskPath} names ${bad}, which is not one of its layers; refusing to start a VMM on it`);
      const memOwn = req.memShared || !existsSync(req.memPath);
      // The remap is done by the RAM shim, which a VMM writing its own RAM file does not load.
      if (req.remapDir && memOwn) throw new Error('only a VMM on a shared RAM file (share=off) can be remapped');
      if (req.remapDir) {
        rootDir(req.remapDir);
        rootDir(diskRemapDir(req.dir));
      }
      rootDir(req.dir);
      const linksDir = join(req.dir, 'disks');
      rmSync(linksDir, { recursive: true, force: true });
      if (chain.some((p) => dirname(p) === req.disksDir)) {
        rootDir(linksDir);
        for (const p of chain) if (dirname(p) === req.disksDir) linkSync(p, join(linksDir, relative(req.disksDir, p)));
      }
      own(req.diskPath, uid);
      for (const p of chain.slice(1)) sealShared(p);
      own(req.consoleLog, uid);
      if (memOwn) own(req.memPath, uid);
      else sealShared(req.memPath);
      const readonlyFiles = [req.shape.kernel, req.shape.initrd, ...req.shape.layers, this.shim!];
      for (const f of readonlyFiles) sealShared(f);
      cgroup = createVmmCgroup(this.layout, `${this.tag}-${req.name}`, vmmLimits(req.shape, this.settings));
      if (req.tun) tun = await tunNode(uid);
      const kvmGid = req.accel === 'kvm' && existsSync('/dev/kvm') ? statSync('/dev/kvm').gid : undefined;
      const top = rootLevelDirs();
      const plan: ViewPlan = {
        root: join(this.settings.runDir, 'vmroot'),
        cgroupProcs: cgroup?.procsFiles ?? [],
        binds: [
          ...systemBinds({ accel: req.accel, qemuBinary: req.qemuBinary, hasLdCache: existsSync('/etc/ld.so.cache') }),
          ...top.binds,
          ...vmmBinds({ dir: req.dir, linksDir, disksDir: req.disksDir, chain, memPath: req.memPath, memOwn, readonlyFiles }),
        ],
        symlinks: top.symlinks,
        proc: kernelAtLeast(5, 8) ? 'private' : 'bind',
        uid,
        gid: uid,
        groups: kvmGid !== undefined && kvmGid !== 0 ? [kvmGid] : [],
        env: memOwn ? {} : { LD_PRELOAD: this.shim!, COLLIMATE_RAM_RO: req.memPath },
        noThp: req.accel === 'tcg',
      };
      // The VMM's own tun node (see tunNode) as /dev/net/tun; the tap in its network namespace is
      // owned by its uid too, so that is the one tap it can attach to.
      if (tun) plan.binds.push({ src: tun, dst: '/dev/net/tun', kind: 'file', ro: false, device: true });
      if (req.remapDir) {
        plan.binds.push({ src: req.remapDir, dst: req.remapDir, kind: 'dir', ro: true });
        Object.assign(plan.env, { COLLIMATE_REMAP_FD: String(REMAP_FD), COLLIMATE_REMAP_DIR: `${req.remapDir}:${diskRemapDir(req.dir)}` });
      }
      let bound: ClaimOwner = self;
      let released = false;
      const record: JailRecord = { uid, claim: this.uids.claimPath(uid), cgroups: cgroup?.dirs ?? [], ...(tun ? { tunNode: tun } : {}) };
      return {
        uid,
        record,
        command: (argv, netns) => ({
          file: this.launcher!,
          args: [...launchArgs(plan, netns), '--', ...argv],
          env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
        }),
        bind: (owner) => { this.uids.bind(uid, owner); bound = owner; },
        release: async () => {
          if (released) return;
          released = true;
          await releaseJail(record, bound);
        },
      };
    } catch (e) {
      if (tun) rmSync(tun, { force: true });
      if (cgroup) await removeVmmCgroup(cgroup.dirs, 200);
      this.uids.release(uid, self);
      throw e;
    }
  }

  /**
   * Shows a new disk file to a running VMM (the new top layer a live fork puts over its disk):
   * owned by the VMM's uid and linked into its disks view.
   */
  exposeDisk(rec: JailRecord, vmmDir: string, disksDir: string, path: string): void {
    if (dirname(path) !== disksDir) throw new Error(`${path} is not in ${disksDir}`);
    own(path, rec.uid);
    const link = join(vmmDir, 'disks', relative(disksDir, path));
    rmSync(link, { force: true });
    linkSync(path, link);
  }
}

/**
 * Shows read-only disk layers to a VMM started before they existed (a fork receiver taking a fork
 * point's layer): the ones in the disks directory are linked into its disks view, root-owned 0644.
 * Layers elsewhere (the artifact's disk) were bound into its view when it started.
 */
export function exposeLayers(vmmDir: string, disksDir: string, layers: string[]): void {
  for (const p of layers) {
    if (dirname(p) !== disksDir) continue;
    sealShared(p);
    const link = join(vmmDir, 'disks', relative(disksDir, p));
    if (!existsSync(link)) linkSync(p, link);
  }
}

/**
 * Releases a recorded VMM's uid (if `owner`, the VMM process, still holds the claim) and removes
 * its cgroup. Needs no configuration: a server that restarted with other settings can still clean up.
 */
export async function releaseJail(rec: JailRecord, owner: ClaimOwner): Promise<void> {
  // The uid's claim goes stale the moment its VMM dies, and a spawn may take the uid over before
  // this runs: the tun node is then that VMM's, made anew, and stays (the crash campaign saw a
  // resume fail on 'chown tun-<uid>: ENOENT').
  const holder = readClaim(rec.claim);
  const ours = !holder || sameOwner(holder, owner);
  if (ours && rec.tunNode && rec.tunNode.startsWith(`${TUN_DIR}/`)) rmSync(rec.tunNode, { force: true });
  await removeVmmCgroup(rec.cgroups);
  releaseClaim(rec.claim, owner);
}

/** Where per-VMM tun nodes live: on devtmpfs, the one filesystem here that honours device nodes. */
export const TUN_DIR = '/dev/collimate';

/**
 * A tun device node (10,200, like /dev/net/tun) owned by `uid`, mode 0600. The host's /dev/net/tun
 * may be root-only; this one only that VMM can open, and it can attach only to a tap owned by it.
 */
async function tunNode(uid: number): Promise<string> {
  mkdirSync(TUN_DIR, { recursive: true, mode: 0o755 });
  const path = join(TUN_DIR, `tun-${uid}`);
  rmSync(path, { force: true });
  await run('mknod', ['-m', '600', path, 'c', '10', '200']);
  chownSync(path, uid, uid);
  return path;
}

/** Tun nodes whose uid nobody claims any more (a VMM that died with no server to release it). */
function sweepTunNodes(uids: UidPool): void {
  let names: string[] = [];
  try { names = readdirSync(TUN_DIR); } catch { return; }
  const claimed = new Set(uids.claimed());
  for (const n of names) {
    const m = /^tun-(\d+)$/.exec(n);
    if (m && !claimed.has(Number(m[1]))) rmSync(join(TUN_DIR, n), { force: true });
  }
}

const jailers = new Map<string, Promise<Jailer | null>>();

/** The host-wide claims of VMM uids in `settings`' range (one directory for every server on the host). */
export function uidClaims(settings: Pick<JailSettings, 'runDir' | 'uidBase' | 'uidCount'>): UidPool {
  return new UidPool(join(settings.runDir, 'uids'), settings.uidBase, settings.uidCount);
}

/** The jailer of an engine configuration (one per home and settings; built once per process). */
export function jailerFor(cfg: { jail: JailSettings; homeTag: string; cacheDir: string }): Promise<Jailer | null> {
  const key = JSON.stringify([cfg.jail, cfg.homeTag, cfg.cacheDir]);
  let j = jailers.get(key);
  if (!j) {
    j = Jailer.open(cfg.jail, { tag: cfg.homeTag, assetsDir: join(cfg.cacheDir, 'assets'), tmpDir: join(cfg.cacheDir, 'tmp') });
    jailers.set(key, j);
    j.catch(() => jailers.delete(key));
  }
  return j;
}

/**
 * Users and delegated ranges (/etc/passwd, /etc/subuid, /etc/subgid) that overlap the VMM uid range:
 * a process of such a user (or of its user namespaces) could run as a VMM's uid and ptrace it.
 */
export function uidRangeConflicts(files: { passwd: string; subuid: string; subgid: string }, base: number, count: number): string[] {
  const end = base + count;
  const out: string[] = [];
  for (const l of files.passwd.split('\n')) {
    const f = l.split(':');
    const uid = Number(f[2]);
    if (f.length > 3 && Number.isInteger(uid) && uid >= base && uid < end) out.push(`user ${f[0]} (uid ${uid}) in /etc/passwd`);
  }
  for (const [name, text] of [['/etc/subuid', files.subuid], ['/etc/subgid', files.subgid]] as const) {
    for (const l of text.split('\n')) {
      const f = l.split(':');
      const start = Number(f[1]);
      const n = Number(f[2]);
      if (f.length === 3 && Number.isInteger(start) && Number.isInteger(n) && start < end && start + n > base) out.push(`${f[0]}:${start}:${n} in ${name}`);
    }
  }
  return out;
}

function readOr(path: string): string {
  try { return readFileSync(path, 'utf8'); } catch { return ''; }
}

/** Whether this process can confine VMMs at all. */
export function jailAvailability(settings: JailSettings): { enabled: boolean; reason: string } {
  if (settings.mode === 'off') return { enabled: false, reason: 'COLLIMATE_JAIL=off' };
  if (typeof process.getuid === 'function' && process.getuid() !== 0) return { enabled: false, reason: 'the server does not run as root, so it cannot start QEMU under other uids' };
  return { enabled: true, reason: 'root' };
}

/** /bin, /lib, … : replicated as symlinks on a merged-/usr host, bound read-only otherwise. */
export function rootLevelDirs(): { symlinks: Array<[string, string]>; binds: ViewBind[] } {
  const symlinks: Array<[string, string]> = [];
  const binds: ViewBind[] = [];
  for (const name of ['/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32']) {
    try {
      const st = lstatSync(name);
      if (st.isSymbolicLink()) symlinks.push([name, readlinkSync(name)]);
      else if (st.isDirectory()) binds.push({ src: name, dst: name, kind: 'dir', ro: true });
    } catch { /* absent */ }
  }
  return { symlinks, binds };
}

function kernelAtLeast(major: number, minor: number): boolean {
  const m = /^(\d+)\.(\d+)/.exec(osRelease());
  if (!m) return false;
  return Number(m[1]) > major || (Number(m[1]) === major && Number(m[2]) >= minor);
}

