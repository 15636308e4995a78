import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { isIP } from 'node:net';
import { networkInterfaces } from 'node:os';
import { Readable } from 'node:stream';
import { Agent, fetch, type Response } from 'undici';
import { CollimateError } from '../errors.js';
import { BLOCKED_RANGES, cidrOf, ipInCidr, ipv4ToInt } from '../net/policy.js';
import { ACCEPT_MANIFESTS, DIGEST_RE, MAX_MANIFEST_BYTES, digestOf, invalid, type Descriptor } from './oci.js';

/**
 * A client of the OCI distribution protocol on fetch: manifests and blobs by tag or digest, anonymous
 * access, HTTP basic credentials, and bearer tokens (a 401 with `WWW-Authenticate: Bearer realm=,
 * service=, scope=` sends it to the token endpoint, with the basic credentials if it has any). Also
 * pushes (monolithic blob uploads and manifest PUT), which tests and mirroring use.
 *
 * A pull reaches no more than a sandbox may: every connection (the registry, each redirect, the
 * token realm) is to an address outside the blocked ranges and the host's own addresses, checked
 * on the address actually connected to, and over HTTPS — except registries the operator lists as
 * private (COLLIMATE_INSECURE_REGISTRIES: its LAN's, the test suite's on loopback), which may be
 * plain HTTP at any address. Errors carry no bytes of what a registry answered.
 */

export interface ImageReference {
  /** Registry host as written (docker.io for Docker Hub). */
  registry: string;
  repository: string;
  tag?: string;
  digest?: string;
}

const DOCKER_HUB = 'docker.io';

/** Parses `[host[:port]/]name[:tag][@sha256:…]`, Docker's defaults included (docker.io, library/, latest). */
export function parseReference(ref: string): ImageReference {
  if (typeof ref !== 'string' || ref.length === 0 || ref.length > 512 || /\s/.test(ref)) throw invalid(`image reference ${JSON.stringify(String(ref).slice(0, 100))} is not valid`);
  let rest = ref;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST_RE.test(digest)) throw invalid(`image reference ${ref} has digest ${digest}; only sha256:<64 hex> is supported`);
  }
  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const colon = rest.lastIndexOf(':');
  if (colon > lastSlash) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!/^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/.test(tag)) throw invalid(`image reference ${ref} has an invalid tag ${JSON.stringify(tag)}`);
  }
  const parts = rest.split('/');
  let registry = DOCKER_HUB;
  if (parts.length > 1 && (parts[0].includes('.') || parts[0].includes(':') || parts[0] === 'localhost')) registry = parts.shift()!;
  let repository = parts.join('/');
  if (registry === DOCKER_HUB && parts.length === 1) repository = `library/${repository}`;
  if (!/^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/.test(repository)) {
    throw invalid(`image reference ${ref} has an invalid repository name ${JSON.stringify(repository)} (lower case, digits, . _ - and /)`);
  }
  if (!tag && !digest) tag = 'latest';
  return { registry, repository, tag, digest };
}

export function formatReference(r: ImageReference): string {
  return `${r.registry}/${r.repository}${r.tag ? `:${r.tag}` : ''}${r.digest ? `@${r.digest}` : ''}`;
}

export interface RegistryCredentials {
  username?: string;
  password?: string;
}

export interface RegistryClientOptions extends RegistryCredentials {
  /**
   * Registries (host, or host:port) that may be plain HTTP and at blocked addresses. Default
   * COLLIMATE_INSECURE_REGISTRIES (comma-separated); none otherwise, loopback included.
   */
  privateRegistries?: string[];
  timeoutMs?: number;
}

export interface TransferStats {
  requests: number;
  /** Body bytes of blob GETs (layers and configs). */
  blobBytes: number;
  /** Body bytes of layer blob GETs alone. */
  layerBytes: number;
  /** Body bytes of manifest GETs. */
  manifestBytes: number;
  blobGets: string[];
}

/** How many redirects one request follows (a blob GET to a CDN takes one). */
const MAX_REDIRECTS = 5;

/** The operator's private registries (COLLIMATE_INSECURE_REGISTRIES). */
export function privateRegistriesFromEnv(env: NodeJS.ProcessEnv = process.env): string[] {
  return (env.COLLIMATE_INSECURE_REGISTRIES ?? '').split(',').map((s) => s.trim().toLowerCase()).filter(Boolean);
}

/** Whether `url`'s host is listed: an entry without a port names every port of its host. */
function listedIn(url: URL, list: readonly string[]): boolean {
  const host = url.hostname.toLowerCase();
  const port = url.port || (url.protocol === 'http:' ? '80' : '443');
  return list.some((e) => e === host || e === `${host}:${port}` || e === url.host.toLowerCase());
}

/** Why a pull may not connect to `address` (null when it may): the ranges sandboxes cannot reach, and this host. */
export function blockedAddress(address: string): string | null {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  const v4 = mapped ? mapped[1] : isIP(address) === 4 ? address : undefined;
  if (v4) {
    const n = ipv4ToInt(v4)!;
    const range = BLOCKED_RANGES.find((r) => ipInCidr(n, cidrOf(r)!));
    if (range) return `the blocked range ${range}`;
  }
  if (Object.values(networkInterfaces()).flat().some((a) => a?.address === (v4 ?? address))) return 'an address of this host';
  if (v4) return null;
  // IPv6: global unicast only (2000::/3), not loopback, link-local, unique-local or multicast.
  return /^[23]/.test(address) ? null : 'a non-global IPv6 address';
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/** dns.lookup for the connections of a pull: a name that resolves into a blocked address fails to connect. */
function guardedLookup(hostname: string, options: { all?: boolean; family?: number }, callback: LookupCallback): void {
  dnsLookup(hostname, { family: options.family ?? 0, all: true }, (err, addrs) => {
    if (err) return callback(err, []);
    const bad = addrs.map((a) => [a.address, blockedAddress(a.address)] as const).find(([, why]) => why);
    if (bad) return callback(Object.assign(new Error(`${hostname} resolves to ${bad[0]}, ${bad[1]}, which pulls do not reach unless the operator lists the registry in COLLIMATE_INSECURE_REGISTRIES`), { code: 'EBLOCKED' }), []);
    if (options.all) callback(null, addrs);
    else callback(null, addrs[0].address, addrs[0].family);
  });
}

/** Connections of pulls from registries that are not listed: each address checked as it is connected to. */
const guarded = new Agent({ connect: { lookup: guardedLookup as never } });
/** Connections to listed registries. */
const open = new Agent();

function pullFailed(message: string, cause?: unknown): CollimateError {
  return new CollimateError('image_pull_failed', message, cause === undefined ? {} : { cause });
}

interface Challenge { scheme: string; params: Record<string, string> }

export function parseChallenge(h: string | null): Challenge | null {
  if (!h) return null;
  const m = /^\s*(\w+)\s*(.*)$/s.exec(h);
  if (!m) return null;
  const params: Record<string, string> = {};
  for (const p of m[2].matchAll(/(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))/g)) params[p[1].toLowerCase()] = (p[2] ?? p[3]).replace(/\\(.)/g, '$1');
  return { scheme: m[1].toLowerCase(), params };
}

export class RegistryClient {
  readonly ref: ImageReference;
  readonly stats: TransferStats = { requests: 0, blobBytes: 0, layerBytes: 0, manifestBytes: 0, blobGets: [] };
  private readonly base: string;
  private readonly timeoutMs: number;
  private readonly privateRegistries: string[];
  private authorization?: string;
  private readonly tokens = new Map<string, string>();

  constructor(ref: ImageReference, private readonly opts: RegistryClientOptions = {}) {
    this.ref = ref;
    const host = ref.registry === DOCKER_HUB ? 'registry-1.docker.io' : ref.registry;
    this.privateRegistries = opts.privateRegistries ?? privateRegistriesFromEnv();
    const insecure = listedIn(new URL(`http://${host}`), this.privateRegistries);
    this.base = `${insecure ? 'http' : 'https'}://${host}`;
    this.timeoutMs = opts.timeoutMs ?? 300_000;
  }

  /**
   * One HTTP exchange on the pull's rules: HTTPS and a public address unless the host is a listed
   * private registry; redirects followed here, each hop checked the same way, with the credentials
   * kept for the host they were given for.
   */
  private async fetchChecked(url: URL, init: { method: string; headers: Record<string, string>; body?: Buffer; timeoutMs: number }, what: string): Promise<Response> {
    let at = url;
    let headers = init.headers;
    for (let hop = 0; ; hop++) {
      const listed = listedIn(at, this.privateRegistries);
      if (!listed && at.protocol !== 'https:') {
        throw pullFailed(`${what} of ${this.ref.registry} leads to plain ${at.protocol.replace(':', '').toUpperCase()} at ${at.host}; pulls use HTTPS unless the operator lists the registry in COLLIMATE_INSECURE_REGISTRIES`);
      }
      const literal = at.hostname.replace(/^\[|\]$/g, '');
      const why = !listed && isIP(literal) ? blockedAddress(literal) : null;
      if (why) throw pullFailed(`${what} of ${this.ref.registry} leads to ${at.host}, ${why}, which pulls do not reach unless the operator lists the registry in COLLIMATE_INSECURE_REGISTRIES`);
      let res: Response;
      try {
        res = await fetch(at, { method: init.method, headers, body: init.body, redirect: 'manual', signal: AbortSignal.timeout(init.timeoutMs), dispatcher: listed ? open : guarded });
      } catch (e) {
        const cause = (e as Error).cause as Error | undefined;
        throw pullFailed(`cannot reach ${what} of ${this.ref.registry} (${cause?.message ?? (e as Error).message})`, e);
      }
      this.stats.requests++;
      const location = res.status >= 300 && res.status < 400 ? res.headers.get('location') : null;
      if (!location) return res;
      await res.body?.cancel();
      if (hop >= MAX_REDIRECTS) throw pullFailed(`${what} of ${this.ref.registry} redirects more than ${MAX_REDIRECTS} times`);
      let next: URL;
      try { next = new URL(location, at); } catch { throw pullFailed(`${what} of ${this.ref.registry} redirects to an invalid location`); }
      // Credentials are the registry's: a redirect to another host (a CDN's signed URL) goes without them.
      if (next.host !== at.host) headers = Object.fromEntries(Object.entries(headers).filter(([k]) => k.toLowerCase() !== 'authorization'));
      at = next;
    }
  }

  private get basic(): string | undefined {
    if (this.opts.username === undefined && this.opts.password === undefined) return undefined;
    return `Basic ${Buffer.from(`${this.opts.username ?? ''}:${this.opts.password ?? ''}`).toString('base64')}`;
  }

  private async token(ch: Challenge, scope: string): Promise<string> {
    const realm = ch.params.realm;
    if (!realm) throw pullFailed(`registry ${this.ref.registry} asked for a bearer token without a realm`);
    const want = ch.params.scope ?? scope;
    const key = `${realm} ${ch.params.service ?? ''} ${want}`;
    const cached = this.tokens.get(key);
    if (cached) return cached;
    let url: URL;
    try { url = new URL(realm); } catch { throw pullFailed(`registry ${this.ref.registry} names an invalid token realm`); }
    if (ch.params.service) url.searchParams.set('service', ch.params.service);
    for (const s of want.split(' ').filter(Boolean)) url.searchParams.append('scope', s);
    const headers: Record<string, string> = {};
    if (this.basic) headers.authorization = this.basic;
    const res = await this.fetchChecked(url, { method: 'GET', headers, timeoutMs: 60_000 }, 'the token service');
    if (res.status === 401 || res.status === 403) {
      await res.body?.cancel();
      throw pullFailed(`the token service of ${this.ref.registry} refused the credentials${this.basic ? '' : ' (none were given: pass username and password)'}`);
    }
    if (!res.ok) {
      await res.body?.cancel();
      throw pullFailed(`the token service of ${this.ref.registry} answered ${res.status}`);
    }
    const body = (await res.json().catch(() => ({}))) as { token?: string; access_token?: string };
    const tok = body.token ?? body.access_token;
    if (!tok) throw pullFailed(`the token service of ${this.ref.registry} returned no token`);
    this.tokens.set(key, tok);
    return tok;
  }

  /** One request with the auth dance: a 401 gets one retry with basic credentials or a bearer token. */
  async request(method: string, pathOrUrl: string, init: { headers?: Record<string, string>; body?: Buffer; push?: boolean } = {}): Promise<Response> {
    const url = new URL(/^https?:\/\//.test(pathOrUrl) ? pathOrUrl : `${this.base}${pathOrUrl}`);
    const scope = `repository:${this.ref.repository}:${init.push ? 'pull,push' : 'pull'}`;
    for (let attempt = 0; ; attempt++) {
      const headers: Record<string, string> = { ...(init.headers ?? {}) };
      if (this.authorization) headers.authorization = this.authorization;
      const res = await this.fetchChecked(url, { method, headers, body: init.body, timeoutMs: this.timeoutMs }, 'the registry');
      if (res.status !== 401 || attempt > 0) {
        if (res.status === 401) {
          await res.body?.cancel();
          throw pullFailed(`registry ${this.ref.registry} refused access to ${this.ref.repository}${this.basic ? ': check the username and password' : ': it needs credentials (username, password)'}`);
        }
        return res;
      }
      const ch = parseChallenge(res.headers.get('www-authenticate'));
      await res.body?.cancel();
      if (ch?.scheme === 'bearer') {
        this.authorization = `Bearer ${await this.token(ch, scope)}`;
      } else if (ch?.scheme === 'basic') {
        if (!this.basic) throw pullFailed(`registry ${this.ref.registry} needs credentials for ${this.ref.repository} (username, password)`);
        this.authorization = this.basic;
      } else {
        throw pullFailed(`registry ${this.ref.registry} answered 401 without a usable WWW-Authenticate challenge`);
      }
    }
  }

  private async failure(res: Response, what: string): Promise<CollimateError> {
    const text = (await res.text().catch(() => '')).slice(0, 4096);
    // Only a registry error code (UPPER_SNAKE) is named; no other byte of the answer goes into the message.
    let code = '';
    try {
      const c = JSON.parse(text).errors?.[0]?.code;
      if (typeof c === 'string' && /^[A-Z_]{1,40}$/.test(c)) code = c;
    } catch { /* not JSON */ }
    if (res.status === 404 || code === 'MANIFEST_UNKNOWN' || code === 'NAME_UNKNOWN' || code === 'BLOB_UNKNOWN') {
      return new CollimateError(what.startsWith('manifest') ? 'image_not_found' : 'image_pull_failed', `${what} not found in ${formatReference({ ...this.ref, tag: undefined, digest: undefined })}${code ? ` (${code})` : ''}`);
    }
    return pullFailed(`registry ${this.ref.registry} answered ${res.status} for ${what}${code ? ` (${code})` : ''}`);
  }

  /** A manifest or index by tag or digest, verified against the digest it was asked by (or that the registry reports). */
  async getManifest(reference: string): Promise<{ bytes: Buffer; mediaType?: string; digest: string }> {
    const res = await this.request('GET', `/v2/${this.ref.repository}/manifests/${reference}`, { headers: { accept: ACCEPT_MANIFESTS } });
    if (!res.ok) throw await this.failure(res, `manifest ${reference}`);
    const bytes = await readLimited(res, MAX_MANIFEST_BYTES, `manifest ${reference}`);
    this.stats.manifestBytes += bytes.length;
    const digest = digestOf(bytes);
    const expected = reference.startsWith('sha256:') ? reference : res.headers.get('docker-content-digest') ?? undefined;
    if (expected && expected !== digest) throw invalid(`manifest ${reference} from ${this.ref.registry} has digest ${digest}, not ${expected}: it was corrupted or tampered with`);
    return { bytes, mediaType: res.headers.get('content-type') ?? undefined, digest };
  }

  /** A small blob (a config), read whole and verified. */
  async getBlobBytes(desc: Descriptor, limit = MAX_MANIFEST_BYTES): Promise<Buffer> {
    if (desc.size > limit) throw invalid(`blob ${desc.digest} is ${desc.size} bytes; at most ${limit} are accepted here`);
    const res = await this.request('GET', `/v2/${this.ref.repository}/blobs/${desc.digest}`);
    if (!res.ok) throw await this.failure(res, `blob ${desc.digest}`);
    const bytes = await readLimited(res, limit, `blob ${desc.digest}`);
    this.stats.blobBytes += bytes.length;
    this.stats.blobGets.push(desc.digest);
    if (digestOf(bytes) !== desc.digest) throw invalid(`blob ${desc.digest} from ${this.ref.registry} does not match its digest (got ${digestOf(bytes)})`);
    return bytes;
  }

  /** A blob's bytes as a stream; the caller verifies digest and size (see LayerStore). */
  async getBlobStream(desc: Descriptor): Promise<AsyncIterable<Buffer>> {
    const res = await this.request('GET', `/v2/${this.ref.repository}/blobs/${desc.digest}`);
    if (!res.ok) throw await this.failure(res, `blob ${desc.digest}`);
    if (!res.body) throw pullFailed(`registry ${this.ref.registry} sent no body for blob ${desc.digest}`);
    this.stats.blobGets.push(desc.digest);
    const stats = this.stats;
    const src = Readable.fromWeb(res.body as any);
    return (async function* () {
      for await (const c of src) {
        stats.blobBytes += (c as Buffer).length;
        stats.layerBytes += (c as Buffer).length;
        yield c as Buffer;
      }
    })();
  }

  /** Whether the repository holds the blob (a HEAD: proves access without moving its bytes). */
  async hasBlob(digest: string): Promise<boolean> {
    const res = await this.request('HEAD', `/v2/${this.ref.repository}/blobs/${digest}`);
    await res.body?.cancel();
    if (res.status === 404) return false;
    if (!res.ok) throw pullFailed(`registry ${this.ref.registry} answered ${res.status} for HEAD blob ${digest}`);
    const reported = res.headers.get('docker-content-digest');
    return !reported || reported === digest;
  }

  /** Monolithic upload (POST then PUT with the digest); skipped when the registry already has it. */
  async pushBlob(data: Buffer): Promise<string> {
    const digest = digestOf(data);
    const head = await this.request('HEAD', `/v2/${this.ref.repository}/blobs/${digest}`, { push: true });
    await head.body?.cancel();
    if (head.ok) return digest;
    const start = await this.request('POST', `/v2/${this.ref.repository}/blobs/uploads/`, { push: true });
    await start.body?.cancel();
    const loc = start.headers.get('location');
    if (start.status !== 202 || !loc) throw pullFailed(`registry ${this.ref.registry} answered ${start.status} to a blob upload`);
    const url = new URL(loc, this.base);
    url.searchParams.set('digest', digest);
    const put = await this.request('PUT', url.toString(), { body: data, push: true, headers: { 'content-type': 'application/octet-stream' } });
    if (put.status !== 201) throw await this.failure(put, `the upload of ${digest}`);
    await put.body?.cancel();
    return digest;
  }

  async pushManifest(reference: string, bytes: Buffer, mediaType: string): Promise<string> {
    const res = await this.request('PUT', `/v2/${this.ref.repository}/manifests/${reference}`, { body: bytes, push: true, headers: { 'content-type': mediaType } });
    if (res.status !== 201) throw await this.failure(res, 'the manifest push');
    await res.body?.cancel();
    return digestOf(bytes);
  }
}

async function readLimited(res: Response, limit: number, what: string): Promise<Buffer> {
  const len = Number(res.headers.get('content-length') ?? NaN);
  if (len > limit) { await res.body?.cancel(); throw invalid(`${what} is ${len} bytes; at most ${limit} are accepted`); }
  const chunks: Buffer[] = [];
  let n = 0;
  if (res.body) {
    for await (const c of Readable.fromWeb(res.body as any)) {
      n += (c as Buffer).length;
      if (n > limit) throw invalid(`${what} is more than ${limit} bytes`);
      chunks.push(c as Buffer);
    }
  }
  return Buffer.concat(chunks);
}
