import { createHash } from 'node:crypto';
import { CollimateError } from '../errors.js';

/**
 * OCI image and Docker v2 manifest formats: media types, parsing with validation, platform selection
 * in image indexes and manifest lists, and the parts of the image config Collimate honours.
 */

export const MEDIA = {
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  dockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  ociConfig: 'application/vnd.oci.image.config.v1+json',
  dockerConfig: 'application/vnd.docker.container.image.v1+json',
  dockerLayer: 'application/vnd.docker.image.rootfs.diff.tar.gzip',
  dockerForeignLayer: 'application/vnd.docker.image.rootfs.foreign.diff.tar.gzip',
} as const;

export const MANIFEST_TYPES = [MEDIA.ociManifest, MEDIA.dockerManifest] as const;
export const INDEX_TYPES = [MEDIA.ociIndex, MEDIA.dockerList] as const;
/** What a registry is asked for: every manifest and index type Collimate reads. */
export const ACCEPT_MANIFESTS = [...MANIFEST_TYPES, ...INDEX_TYPES].join(', ');

const LAYER_TYPES = new Set<string>([
  'application/vnd.oci.image.layer.v1.tar',
  'application/vnd.oci.image.layer.v1.tar+gzip',
  'application/vnd.oci.image.layer.v1.tar+zstd',
  'application/vnd.oci.image.layer.nondistributable.v1.tar',
  'application/vnd.oci.image.layer.nondistributable.v1.tar+gzip',
  'application/vnd.oci.image.layer.nondistributable.v1.tar+zstd',
  'application/vnd.docker.image.rootfs.diff.tar',
  MEDIA.dockerLayer,
  MEDIA.dockerForeignLayer,
]);
const CONFIG_TYPES = new Set<string>([MEDIA.ociConfig, MEDIA.dockerConfig]);

export const DIGEST_RE = /^sha256:[a-f0-9]{64}$/;
/** Manifests and configs are small; anything bigger is not one. */
export const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  platform?: { os?: string; architecture?: string; variant?: string };
  annotations?: Record<string, string>;
}

export interface ImageManifest {
  mediaType: string;
  config: Descriptor;
  layers: Descriptor[];
}

export interface ImageIndex {
  mediaType: string;
  manifests: Descriptor[];
}

/** The image config fields Collimate uses. */
export interface ImageConfig {
  os?: string;
  architecture?: string;
  diffIds: string[];
  env: string[];
  workingDir?: string;
  user?: string;
  entrypoint?: string[];
  cmd?: string[];
}

export function invalid(message: string): CollimateError {
  return new CollimateError('validation_error', message);
}

export function digestOf(bytes: Buffer): string {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

export function checkDigest(d: unknown, what: string): string {
  if (typeof d !== 'string') throw invalid(`${what} has no digest`);
  if (!DIGEST_RE.test(d)) {
    throw invalid(`${what} has digest ${JSON.stringify(d.slice(0, 80))}; only sha256 digests (sha256:<64 hex>) are supported`);
  }
  return d;
}

function descriptor(v: any, what: string): Descriptor {
  if (!v || typeof v !== 'object') throw invalid(`${what} is not a descriptor object`);
  if (typeof v.mediaType !== 'string') throw invalid(`${what} has no mediaType`);
  checkDigest(v.digest, what);
  if (!Number.isSafeInteger(v.size) || v.size < 0) throw invalid(`${what} has no valid size`);
  return { mediaType: v.mediaType, digest: v.digest, size: v.size, platform: v.platform, annotations: v.annotations };
}

function parseJson(bytes: Buffer, what: string): any {
  if (bytes.length > MAX_MANIFEST_BYTES) throw invalid(`${what} is ${bytes.length} bytes; at most ${MAX_MANIFEST_BYTES} are accepted`);
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch (e) {
    // Not JSON.parse's message: it quotes the document's first bytes (an HTML page, a secret).
    throw invalid(`${what} is not valid JSON`);
  }
}

/**
 * A manifest or an index. `contentType` is what the registry said (or a descriptor's mediaType); the
 * document's own mediaType must agree with it when both are there.
 */
export function parseManifestOrIndex(bytes: Buffer, contentType: string | undefined, what: string): { kind: 'manifest'; manifest: ImageManifest } | { kind: 'index'; index: ImageIndex } {
  const doc = parseJson(bytes, what);
  if (!doc || typeof doc !== 'object') throw invalid(`${what} is not a JSON object`);
  const ct = contentType?.split(';')[0].trim();
  const declared: string | undefined = typeof doc.mediaType === 'string' ? doc.mediaType : undefined;
  if (doc.schemaVersion === 1) throw invalid(`${what} is a Docker schema 1 manifest, which is not supported; push the image with a current client (schema 2 or OCI)`);
  if (doc.schemaVersion !== 2) throw invalid(`${what} has schemaVersion ${JSON.stringify(doc.schemaVersion)}; 2 is required`);
  let type = declared ?? (ct && ct !== 'application/json' && ct !== 'application/octet-stream' ? ct : undefined);
  if (declared && ct && ct !== declared && ct !== 'application/json' && ct !== 'application/octet-stream') {
    throw invalid(`${what} is served as ${ct} but declares mediaType ${declared}`);
  }
  // OCI allows mediaType to be absent: tell the two kinds apart by their fields.
  if (!type) type = Array.isArray(doc.manifests) ? MEDIA.ociIndex : MEDIA.ociManifest;
  if ((INDEX_TYPES as readonly string[]).includes(type)) {
    if (!Array.isArray(doc.manifests)) throw invalid(`${what} is an index without manifests`);
    return { kind: 'index', index: { mediaType: type, manifests: doc.manifests.map((m: unknown, i: number) => descriptor(m, `${what} manifests[${i}]`)) } };
  }
  if (!(MANIFEST_TYPES as readonly string[]).includes(type)) {
    throw invalid(`${what} has media type ${JSON.stringify(type)}, which is not an image manifest or index (expected one of ${ACCEPT_MANIFESTS})`);
  }
  const config = descriptor(doc.config, `${what} config`);
  if (!CONFIG_TYPES.has(config.mediaType)) {
    throw invalid(`${what} config has media type ${JSON.stringify(config.mediaType)}; this is not a container image (expected ${[...CONFIG_TYPES].join(' or ')})`);
  }
  if (!Array.isArray(doc.layers)) throw invalid(`${what} has no layers`);
  const layers = doc.layers.map((l: unknown, i: number) => descriptor(l, `${what} layers[${i}]`));
  for (const [i, l] of layers.entries()) {
    if (!LAYER_TYPES.has(l.mediaType)) throw invalid(`${what} layers[${i}] has media type ${JSON.stringify(l.mediaType)}, which is not a tar layer`);
  }
  if (layers.length === 0) throw invalid(`${what} has no layers`);
  if (layers.length > 60) throw invalid(`${what} has ${layers.length} layers; at most 60 are supported (squash the image)`);
  return { kind: 'manifest', manifest: { mediaType: type, config, layers } };
}

/** The linux/amd64 entry of an index (the only platform the microVMs run). */
export function pickPlatform(index: ImageIndex, what: string): Descriptor {
  const candidates = index.manifests.filter((m) => (m.platform?.os ?? 'linux') === 'linux' && (m.platform?.architecture ?? 'amd64') === 'amd64' && [...MANIFEST_TYPES, ...INDEX_TYPES].includes(m.mediaType as any));
  // Attestation manifests (unknown/unknown in buildx indexes) carry platform os "unknown" and drop out above.
  const exact = candidates.find((m) => m.platform?.os === 'linux' && m.platform?.architecture === 'amd64');
  const pick = exact ?? candidates[0];
  if (!pick) {
    const have = index.manifests.map((m) => `${m.platform?.os ?? '?'}/${m.platform?.architecture ?? '?'}`).join(', ');
    throw invalid(`${what} has no linux/amd64 image (it has ${have || 'nothing'})`);
  }
  return pick;
}

const strList = (v: unknown, what: string): string[] | undefined => {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((s) => typeof s === 'string')) throw invalid(`image config ${what} must be a list of strings`);
  return v;
};

export function parseConfig(bytes: Buffer, layerCount: number): ImageConfig {
  const doc = parseJson(bytes, 'image config');
  if (!doc || typeof doc !== 'object') throw invalid('image config is not a JSON object');
  if (doc.os !== undefined && doc.os !== 'linux') throw invalid(`image is for ${doc.os}; only linux images run here`);
  if (doc.architecture !== undefined && doc.architecture !== 'amd64') throw invalid(`image is for ${doc.architecture}; only amd64 images run here`);
  const rootfs = doc.rootfs;
  if (!rootfs || rootfs.type !== 'layers' || !Array.isArray(rootfs.diff_ids)) throw invalid('image config has no rootfs.diff_ids');
  const diffIds = rootfs.diff_ids.map((d: unknown, i: number) => checkDigest(d, `image config rootfs.diff_ids[${i}]`));
  if (diffIds.length !== layerCount) throw invalid(`image config lists ${diffIds.length} diff_ids for ${layerCount} layers`);
  const c = doc.config ?? {};
  return {
    os: doc.os,
    architecture: doc.architecture,
    diffIds,
    env: strList(c.Env, 'Env') ?? [],
    workingDir: typeof c.WorkingDir === 'string' && c.WorkingDir !== '' ? c.WorkingDir : undefined,
    user: typeof c.User === 'string' && c.User !== '' ? c.User : undefined,
    entrypoint: strList(c.Entrypoint, 'Entrypoint'),
    cmd: strList(c.Cmd, 'Cmd'),
  };
}
