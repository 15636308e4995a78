/**
 * Layer format benchmark: a real layer (the Debian bookworm base tree, tarred) turned into a read-only
 * image two ways — the layer store's way (our tar reader unpacks it, then mkfs.erofs packs the tree)
 * and squashfs straight from the tar (sqfstar) — with build time and size for each.
 *
 *   node --import tsx bench/layerFormat.ts [layer.erofs]   (default: the cached Debian base layer)
 */
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, createReadStream, existsSync } from 'node:fs';
import { join } from 'node:path';
import { run } from '../src/host/run.ts';
import { readTar } from '../src/images/tar.ts';
import { newBudget, unpackLayer } from '../src/images/unpack.ts';
import { LAYER_MKFS_ARGS } from '../src/images/erofs.ts';

const cache = process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache';
const src = process.argv[2] ?? (() => {
  const d = readdirSync(join(cache, 'assets')).find((f) => f.startsWith('rootfs-debian-base-'));
  if (!d) throw new Error('no cached Debian base layer; run scripts/prepare.ts first');
  return join(cache, 'assets', d, 'layer.erofs');
})();

const work = mkdtempSync('/var/tmp/collimate-layer-bench-');
const mnt = join(work, 'mnt');
mkdirSync(mnt);
const mib = (n: number) => `${(n / 1048576).toFixed(1)} MiB`;
const time = async (f: () => Promise<unknown>) => { const t = performance.now(); await f(); return (performance.now() - t) / 1000; };

try {
  await run('mount', ['-t', 'erofs', '-o', 'loop,ro', src, mnt]);
  const tar = join(work, 'layer.tar');
  try {
    // Device nodes debootstrap made in /dev: images may not carry them (the guest mounts devtmpfs).
    await run('tar', ['--xattrs', '--xattrs-include=*', '--numeric-owner', '--exclude=./dev/*', '-C', mnt, '-cf', tar, '.']);
  } finally {
    await run('umount', [mnt]);
  }
  const tarBytes = statSync(tar).size;
  console.log(`layer: ${src}\n  tar ${mib(tarBytes)}`);

  const rows: { way: string; secs: number; bytes: number }[] = [];
  for (const [label, args] of [['erofs lz4hc (store default)', LAYER_MKFS_ARGS], ['erofs uncompressed', ['--quiet', '--preserve-mtime']]] as const) {
    const tree = join(work, 'tree');
    mkdirSync(tree);
    const out = join(work, 'layer.erofs');
    const unpackSecs = await time(() => unpackLayer(readTar(createReadStream(tar, { highWaterMark: 1 << 20 })), tree, newBudget(64 * 2 ** 30)));
    const mkfsSecs = await time(() => run('mkfs.erofs', [...args, out, tree], { timeoutMs: 1_800_000 }));
    rows.push({ way: `${label}: unpack ${unpackSecs.toFixed(1)} s + mkfs ${mkfsSecs.toFixed(1)} s`, secs: unpackSecs + mkfsSecs, bytes: statSync(out).size });
    rmSync(tree, { recursive: true, force: true });
    rmSync(out, { force: true });
  }
  for (const [label, args] of [['squashfs lz4hc (sqfstar)', ['-comp', 'lz4', '-Xhc']], ['squashfs gzip (sqfstar default)', []], ['squashfs zstd (sqfstar)', ['-comp', 'zstd']]] as const) {
    const out = join(work, 'layer.sqfs');
    const secs = await time(() => run('sh', ['-c', `sqfstar -quiet -no-progress ${args.join(' ')} "${out}" < "${tar}"`], { timeoutMs: 1_800_000 }));
    rows.push({ way: label, secs, bytes: statSync(out).size });
    rmSync(out, { force: true });
  }
  for (const r of rows) console.log(`  ${r.way.padEnd(58)} ${r.secs.toFixed(1).padStart(6)} s  ${mib(r.bytes).padStart(10)}`);
} finally {
  if (existsSync(mnt)) await run('umount', [mnt]).catch(() => {});
  rmSync(work, { recursive: true, force: true });
}
