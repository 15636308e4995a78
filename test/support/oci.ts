/**
 * Test images built from files, no Docker: tar layers written by our own tar writer (a static
 * busybox base, small diff layers), OCI manifests and configs, and the three on-disk forms a source
 * can take (OCI layout, OCI archive, `docker save` archive), plus a push to a registry.
 */
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { writeTar, type TarWriteEntry } from '../../src/images/tar.ts';
import type { RegistryClient } from '../../src/images/registry.ts';

export const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

export type Compression = 'gzip' | 'zstd' | 'none';

export interface Layer {
  blob: Buffer;
  digest: string;
  diffId: string;
  mediaType: string;
}

export function layer(entries: TarWriteEntry[], compression: Compression = 'gzip'): Layer {
  const tar = writeTar(entries);
  const blob = compression === 'gzip' ? gzipSync(tar) : compression === 'zstd' ? execFileSync('zstd', ['-q', '-c', '-3'], { input: tar }) : tar;
  const mediaType = `application/vnd.oci.image.layer.v1.tar${compression === 'none' ? '' : `+${compression}`}`;
  return { blob, digest: sha(blob), diffId: sha(tar), mediaType };
}

let baseCache: TarWriteEntry[] | undefined;

/** A static busybox with /bin/sh and every applet as symlinks, a passwd with root and app (1000). */
export function busyboxEntries(): TarWriteEntry[] {
  if (baseCache) return baseCache;
  const applets = execFileSync('/bin/busybox', ['--list-full']).toString().split('\n').map((s) => s.trim()).filter(Boolean);
  const dirs = new Set(['bin', 'sbin', 'usr', 'usr/bin', 'usr/sbin', 'etc', 'root', 'tmp', 'home', 'home/app', 'var', 'var/tmp', 'proc', 'sys', 'dev', 'run']);
  for (const a of applets) dirs.add(a.split('/').slice(0, -1).join('/'));
  const out: TarWriteEntry[] = [...dirs].filter(Boolean).sort().map((d) => ({
    name: `${d}/`, type: 'dir' as const, mode: d === 'tmp' || d === 'var/tmp' ? 0o1777 : 0o755, uid: d === 'home/app' ? 1000 : 0, gid: d === 'home/app' ? 1000 : 0,
  }));
  out.push({ name: 'bin/busybox', data: readFileSync('/bin/busybox'), mode: 0o755 });
  for (const a of applets) {
    if (a === 'bin/busybox') continue;
    const depth = a.split('/').length - 1;
    out.push({ name: a, type: 'symlink', linkname: `${'../'.repeat(depth)}bin/busybox` });
  }
  out.push(
    { name: 'etc/passwd', data: 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' },
    { name: 'etc/group', data: 'root:x:0:\napp:x:1000:\nnogroup:x:65534:\n' },
    { name: 'etc/hostname', data: 'sandbox\n' },
  );
  baseCache = out;
  return out;
}

export interface TestImage {
  layers: Layer[];
  config: Buffer;
  configDigest: string;
  manifest: Buffer;
  manifestDigest: string;
  manifestType: string;
}

export interface ConfigFields {
  Env?: string[];
  WorkingDir?: string;
  User?: string;
  Entrypoint?: string[];
  Cmd?: string[];
}

export function image(layers: Layer[], fields: ConfigFields = {}, opts: { docker?: boolean; configOverride?: (c: any) => any; manifestOverride?: (m: any) => any } = {}): TestImage {
  let cfg: any = {
    architecture: 'amd64', os: 'linux',
    config: { Env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'], ...fields },
    rootfs: { type: 'layers', diff_ids: layers.map((l) => l.diffId) },
  };
  if (opts.configOverride) cfg = opts.configOverride(cfg);
  const config = Buffer.from(JSON.stringify(cfg));
  const docker = opts.docker ?? false;
  let m: any = {
    schemaVersion: 2,
    mediaType: docker ? 'application/vnd.docker.distribution.manifest.v2+json' : 'application/vnd.oci.image.manifest.v1+json',
    config: { mediaType: docker ? 'application/vnd.docker.container.image.v1+json' : 'application/vnd.oci.image.config.v1+json', digest: sha(config), size: config.length },
    layers: layers.map((l) => ({ mediaType: docker && l.mediaType.endsWith('+gzip') ? 'application/vnd.docker.image.rootfs.diff.tar.gzip' : l.mediaType, digest: l.digest, size: l.blob.length })),
  };
  if (opts.manifestOverride) m = opts.manifestOverride(m);
  const manifest = Buffer.from(JSON.stringify(m));
  return { layers, config, configDigest: sha(config), manifest, manifestDigest: sha(manifest), manifestType: m.mediaType };
}

/** An OCI image layout directory; `index` wraps the manifest in an index naming linux/amd64 (plus an arm64 decoy). */
export function writeLayout(dir: string, img: TestImage, opts: { tag?: string; omitBlob?: string; corruptBlob?: string } = {}): string {
  const blobs = join(dir, 'blobs', 'sha256');
  mkdirSync(blobs, { recursive: true });
  writeFileSync(join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  const put = (digest: string, data: Buffer) => {
    if (digest === opts.omitBlob) return;
    writeFileSync(join(blobs, digest.slice(7)), digest === opts.corruptBlob ? Buffer.concat([data.subarray(0, data.length - 1), Buffer.from([data[data.length - 1] ^ 1])]) : data);
  };
  put(img.manifestDigest, img.manifest);
  put(img.configDigest, img.config);
  for (const l of img.layers) put(l.digest, l.blob);
  const index = {
    schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json',
    manifests: [
      { mediaType: 'application/vnd.oci.image.manifest.v1+json', digest: `sha256:${'0'.repeat(64)}`, size: 2, platform: { os: 'linux', architecture: 'arm64' } },
      { mediaType: img.manifestType, digest: img.manifestDigest, size: img.manifest.length, platform: { os: 'linux', architecture: 'amd64' }, annotations: opts.tag ? { 'org.opencontainers.image.ref.name': opts.tag } : undefined },
    ],
  };
  writeFileSync(join(dir, 'index.json'), JSON.stringify(index));
  return dir;
}

/** `docker save` (classic format): manifest.json, <hex>.json config, <n>/layer.tar uncompressed layers. */
export function dockerSaveArchive(file: string, layerEntries: TarWriteEntry[][], fields: ConfigFields = {}, tag = 'test/saved:1'): { diffIds: string[] } {
  const tars = layerEntries.map((e) => writeTar(e));
  const diffIds = tars.map(sha);
  const config = Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', config: fields, rootfs: { type: 'layers', diff_ids: diffIds } }));
  const configName = `${sha(config).slice(7)}.json`;
  const members: TarWriteEntry[] = [{ name: configName, data: config }];
  tars.forEach((t, i) => members.push({ name: `layer${i}/`, type: 'dir' }, { name: `layer${i}/layer.tar`, data: t }));
  members.push({ name: 'manifest.json', data: JSON.stringify([{ Config: configName, RepoTags: [tag], Layers: tars.map((_, i) => `layer${i}/layer.tar`) }]) });
  writeFileSync(file, writeTar(members));
  return { diffIds };
}

/** An OCI archive: the layout, tarred (what `skopeo copy oci-archive:` and buildx `type=oci` write). */
export function ociArchive(file: string, img: TestImage): void {
  const members: TarWriteEntry[] = [
    { name: 'oci-layout', data: JSON.stringify({ imageLayoutVersion: '1.0.0' }) },
    { name: 'index.json', data: JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: img.manifestType, digest: img.manifestDigest, size: img.manifest.length }] }) },
    { name: 'blobs/', type: 'dir' }, { name: 'blobs/sha256/', type: 'dir' },
    { name: `blobs/sha256/${img.manifestDigest.slice(7)}`, data: img.manifest },
    { name: `blobs/sha256/${img.configDigest.slice(7)}`, data: img.config },
    ...img.layers.map((l) => ({ name: `blobs/sha256/${l.digest.slice(7)}`, data: l.blob })),
  ];
  writeFileSync(file, writeTar(members));
}

export async function push(client: RegistryClient, tag: string, img: TestImage): Promise<void> {
  for (const l of img.layers) await client.pushBlob(l.blob);
  await client.pushBlob(img.config);
  await client.pushManifest(tag, img.manifest, img.manifestType);
}
