/**
 * E2B's control plane (the REST API the `e2b` SDK calls at E2B_API_URL), translated onto the tenant
 * service: mounted at /e2b/api. Only translation lives here — every call is the same TenantService
 * call the native API makes, under the same key and tier.
 *
 * Mapping: templateID ↔ our template id; metadata ↔ labels; paused ↔ suspended; `timeout` (seconds
 * from now) ↔ a lease (POST /v1/sandboxes/{id}/timeout); envVars are kept beside the sandbox and
 * applied by envd (sandboxEnv.ts). Snapshots are ours under our ids (`snap_…`): E2B's snapshot id
 * is the template a sandbox is created from, so a create or a template delete whose templateID is a
 * snapshot id is one of the snapshot. Errors take E2B's shape, `{ code: <HTTP status>, message }`.
 * Auth: `X-API-Key` with a Collimate key, in either shape (`clm_…` or the `e2b_<hex>` form the SDK
 * checks for; `collimate keys create --e2b`).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { CollimateError } from '../errors.js';
import type { SandboxLogEntry } from '../service/sandboxLog.js';
import type { TenantService } from '../service/tenantService.js';
import type { Scope } from '../service/types.js';
import { bearerKey } from '../service/keys.js';
import { forkCountProblem, type SandboxInfo, type SandboxTransition, type SnapshotDeleted, type SnapshotInfo } from '../sandboxes/types.js';
import { cidrOf, cidrText, cidrWithin, parseCidr, type EgressInput } from '../net/policy.js';
import { CreateSnapshotRequest, Labels, LOG_READ_MAX, SandboxLogsQuery, SNAPSHOT_ID_RE } from '../wire/schemas.js';
import { parseWith, toClientError } from '../wire/errors.js';
import { parseJsonObject } from '../wire/jsonBody.js';
import { keyFirst } from '../wire/keyFirst.js';
import { envVarsProblem, type SandboxEnvs } from './sandboxEnv.js';
import { e2bNames } from './names.js';

export const E2B_API_PREFIX = '/e2b/api';
/** The envd version we answer with: the SDK turns off what a lower version lacks (see envd.ts). */
export const ENVD_VERSION = '0.6.4';
/** E2B's default when a create gives no timeout. */
const DEFAULT_TIMEOUT_SECS = 15;

export interface E2bControlPlaneOptions {
  tenants: TenantService;
  env: SandboxEnvs;
}

/** E2B's error body: the HTTP status as `code`, and our stable code beside it as `error_code`. */
export function sendE2bError(reply: FastifyReply, err: CollimateError): void {
  if (reply.sent || reply.raw.headersSent) return;
  reply.headers(err.headers());
  reply.code(err.status).type('application/json; charset=utf-8').send({ code: err.status, message: err.text(e2bNames), error_code: err.code });
}

function bad(message: string): CollimateError {
  return new CollimateError('validation_error', message);
}

/** E2B's SDK sends JSON objects; any Content-Type is taken, as E2B's API does. */
function jsonBody(req: FastifyRequest): Record<string, unknown> {
  return parseJsonObject(req.body);
}

/** A field that is true, false, or absent (undefined or null); anything else is E2B's 400. */
function optionalBoolean(body: Record<string, unknown>, field: string): boolean | undefined {
  const v = body[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw bad(`${field} must be true or false.`);
  return v;
}

function optionalSeconds(body: Record<string, unknown>, field: string): number | undefined {
  const v = body[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw bad(`${field} must be a whole number of seconds, 0 or more.`);
  return v;
}

function metadataOf(body: Record<string, unknown>): Record<string, string> | undefined {
  if (body.metadata === undefined || body.metadata === null) return undefined;
  const parsed = Labels.safeParse(body.metadata);
  if (!parsed.success) throw bad(`metadata becomes the sandbox's labels: ${parsed.error.issues.map((i) => `${i.path.join('.') || 'metadata'}: ${i.message}`).join('; ')}.`);
  return parsed.data;
}

const e2bState = (s: SandboxInfo['state']) => (s === 'suspended' ? 'paused' : s);

/**
 * E2B's network config (create's `network`, `PUT /sandboxes/{id}/network`) as a Collimate egress
 * policy. E2B allows everything unless told to deny; `allowOut` wins over `denyOut`. As Collimate
 * policies: everything (no deny: "allow"), nothing (deny all, allow nothing: "none"), only
 * `allowOut` (deny all, allow those CIDRs, addresses and domains: an allowlist), or everything but
 * some addresses (a denylist, less the addresses `allowOut` names). What none of these says — a
 * domain denied, or allowed inside a denied range — header rules and egress proxies are refused,
 * saying how.
 */
export function egressOfNetwork(raw: unknown, noInternet = false): EgressInput {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw bad('network must be an object: {allowOut, denyOut, allow_internet_access}.');
  const n = raw as Record<string, unknown>;
  const list = (field: 'allowOut' | 'denyOut'): string[] => {
    const v = n[field];
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v) || v.some((x) => typeof x !== 'string')) throw bad(`network.${field} must be a list of strings.`);
    return v as string[];
  };
  if (n.rules !== undefined && n.rules !== null && Object.keys(n.rules as object).length > 0) throw bad('network.rules (header transforms) are not supported by Collimate; send the headers from the program in the sandbox.');
  if (n.egressProxy !== undefined && n.egressProxy !== null) throw bad('network.egressProxy is not supported by Collimate.');
  const allow = list('allowOut');
  const deny = list('denyOut');
  const denyAll = noInternet || n.allow_internet_access === false || deny.some((d) => d === '0.0.0.0/0' || d === '::/0');
  const isAddress = (s: string) => /^[0-9.]+(\/\d+)?$/.test(s) || s.includes(':');
  if (!denyAll) return deny.length ? denylistOf(deny, allow, isAddress) : 'allow';
  if (allow.length === 0) return 'none';
  const cidrs = allow.filter(isAddress).map((s) => (s.includes('/') ? s : s.includes(':') ? `${s}/128` : `${s}/32`));
  const domains = allow.filter((s) => !isAddress(s));
  return { cidrs, domains };
}

/**
 * E2B's port settings of a create's `network`: `allowPublicTraffic` (its ports answer without the
 * traffic token: public_ports) and `maskRequestHost` (the Host its servers see, `${PORT}` replaced:
 * port_host, checked by the service).
 */
export function portAccessOfNetwork(raw: unknown): { publicPorts?: boolean; portHost?: string } {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return {};
  const n = raw as Record<string, unknown>;
  const out: { publicPorts?: boolean; portHost?: string } = {};
  if (n.allowPublicTraffic !== undefined && n.allowPublicTraffic !== null) {
    if (typeof n.allowPublicTraffic !== 'boolean') throw bad('network.allowPublicTraffic must be a boolean.');
    out.publicPorts = n.allowPublicTraffic;
  }
  if (n.maskRequestHost !== undefined && n.maskRequestHost !== null) {
    if (typeof n.maskRequestHost !== 'string') throw bad('network.maskRequestHost must be a string, e.g. "localhost:${PORT}".');
    out.portHost = n.maskRequestHost;
  }
  return out;
}

/** `denyOut` of some addresses as a denylist, less what `allowOut` names (E2B: allow wins). */
function denylistOf(deny: string[], allow: string[], isAddress: (s: string) => boolean): EgressInput {
  const named = deny.find((d) => !isAddress(d));
  if (named) throw bad(`network.denyOut: ${JSON.stringify(named.slice(0, 80))} is a name; Collimate denies addresses and CIDRs (a name's addresses can change under it). Deny its addresses, or deny 0.0.0.0/0 and list in allowOut what the sandbox may reach.`);
  const allowedName = allow.find((a) => !isAddress(a));
  if (allowedName) throw bad(`network.allowOut: ${JSON.stringify(allowedName.slice(0, 80))} next to a denyOut of some addresses is not supported (every name is reachable then unless its addresses are denied). Leave it out, or deny 0.0.0.0/0 and list in allowOut everything the sandbox may reach.`);
  const field = (f: string) => (s: string) => cidrOf(parseCidr(s, f))!; // parseCidr refuses what is not one (validation_error)
  const allowed = allow.map(field('network.allowOut'));
  const kept = deny.map(field('network.denyOut')).filter((d) => !allowed.some((a) => cidrWithin(d, a)));
  const inside = allowed.find((a) => kept.some((d) => cidrWithin(a, d)));
  if (inside) throw bad(`network.allowOut: ${cidrText(inside)} lies inside a denied range; Collimate cannot open an address inside a denied one. Deny the ranges around it instead, or deny 0.0.0.0/0 and list in allowOut what the sandbox may reach.`);
  return kept.length ? { deny: kept.map(cidrText) } : 'allow';
}

/**
 * E2B's lifecycle at create: `autoPause` (the SDK's `lifecycle.onTimeout: 'pause'`) suspends the
 * sandbox when its timeout ends instead of deleting it; `autoResume.enabled` resumes it on a request
 * that needs it running. `autoPauseMemory: false` (`keepMemory: false`) makes that pause keep only
 * the filesystem (our keep_memory false): the resume boots it afresh. As on E2B, it needs autoPause
 * and cannot go with autoResume (traffic that woke it would find its servers gone).
 */
function lifecycleOf(body: Record<string, unknown>): { onTimeout?: 'delete' | 'suspend'; autoResume?: boolean; keepMemory?: boolean } {
  const autoPause = optionalBoolean(body, 'autoPause');
  const keepMemory = optionalBoolean(body, 'autoPauseMemory') === false ? false : undefined;
  const resume = body.autoResume as { enabled?: unknown } | undefined | null;
  if (resume !== undefined && resume !== null && (typeof resume !== 'object' || (resume.enabled !== undefined && typeof resume.enabled !== 'boolean'))) throw bad('autoResume must be {"enabled": true|false}.');
  const autoResume = resume?.enabled === true;
  if (autoResume && autoPause !== true) throw bad("autoResume needs autoPause (the SDK's lifecycle.onTimeout: 'pause').");
  if (keepMemory === false && autoPause !== true) throw bad("autoPauseMemory: false needs autoPause (the SDK's lifecycle.onTimeout: {action: 'pause', keepMemory: false}).");
  if (keepMemory === false && autoResume) throw bad('autoPauseMemory: false cannot go with autoResume: a pause that keeps only the filesystem is resumed by connect, which boots the sandbox afresh.');
  return {
    ...(autoPause === true ? { onTimeout: 'suspend' as const } : autoPause === false ? { onTimeout: 'delete' as const } : {}),
    ...(autoResume ? { autoResume } : {}), ...(keepMemory === false ? { keepMemory } : {}),
  };
}

/** A sandbox as E2B's list and get show it. */
export function e2bListed(info: SandboxInfo): Record<string, unknown> {
  return {
    templateID: info.template,
    sandboxID: info.id,
    clientID: 'collimate',
    startedAt: info.session_started_at,
    endAt: info.expires_at,
    cpuCount: info.vcpus,
    memoryMB: info.memory_mib,
    diskSizeMB: info.disk_mib,
    metadata: info.labels,
    state: e2bState(info.state),
    envdVersion: ENVD_VERSION,
    lifecycle: { onTimeout: info.on_timeout === 'suspend' ? 'pause' : 'kill', autoResume: info.auto_resume },
  };
}

/** Where a page of E2B's list starts: after this sandbox in the list's order (nextToken, opaque to the SDK). */
interface ListCursor {
  startedAt: string;
  id: string;
}

/** E2B's list query (GET /sandboxes, /v2/sandboxes): what to read, what is filtered after, the order and the page. */
export function e2bListQuery(query: Record<string, unknown>, runningOnly: boolean): {
  filter: { state?: 'running' | 'suspended'; labels?: Record<string, string> };
  keep: (s: SandboxInfo) => boolean;
  order: 'asc' | 'desc';
  limit: number;
  after?: ListCursor;
} {
  const labels: Record<string, string> = {};
  if (typeof query.metadata === 'string' && query.metadata !== '') {
    for (const [k, v] of new URLSearchParams(query.metadata)) labels[k] = v;
  }
  let states = String(query.state ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (runningOnly) states = ['running'];
  for (const s of states) if (s !== 'running' && s !== 'paused') throw bad(`state must be running or paused (got ${s.slice(0, 40)}).`);
  const state = states.length === 1 ? (states[0] === 'paused' ? 'suspended' : 'running') : undefined;
  let limit = DEFAULT_LIST_LIMIT;
  if (query.limit !== undefined) {
    limit = Number(query.limit);
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw bad('limit must be a whole number from 1 to 1000.');
  }
  const order = query.order === undefined || query.order === '' ? 'desc' : query.order;
  if (order !== 'asc' && order !== 'desc') throw bad('order must be asc or desc (by start time; desc, newest first, when not given).');
  const after = typeof query.nextToken === 'string' && query.nextToken !== '' ? cursorOf(query.nextToken) : undefined;
  const template = typeof query.template === 'string' && query.template !== '' ? query.template : undefined;
  const startedAfter = typeof query.startedAfter === 'string' ? Date.parse(query.startedAfter) : NaN;
  return {
    filter: { ...(state ? { state } : {}), ...(Object.keys(labels).length ? { labels } : {}) },
    keep: (s) => s.state !== 'deleted' && (template === undefined || s.template === template) && (Number.isNaN(startedAfter) || Date.parse(s.session_started_at) >= startedAfter),
    order,
    limit,
    ...(after ? { after } : {}),
  };
}

/** E2B's list pages hold 100 sandboxes unless the SDK asks for another size. */
const DEFAULT_LIST_LIMIT = 100;

function cursorOf(token: string): ListCursor {
  try {
    const [startedAt, id] = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as unknown[];
    if (typeof startedAt === 'string' && typeof id === 'string') return { startedAt, id };
  } catch {
    // reported below
  }
  throw bad('nextToken is not one this server gave: pass the x-next-token of the previous page as it was.');
}

function tokenOf(s: SandboxInfo): string {
  return Buffer.from(JSON.stringify([s.session_started_at, s.id])).toString('base64url');
}

/** E2B's order: by start time (then id, for sandboxes started in the same millisecond), newest first unless asc. */
function listOrder(order: 'asc' | 'desc'): (a: { startedAt: string; id: string }, b: { startedAt: string; id: string }) => number {
  const sign = order === 'asc' ? 1 : -1;
  return (a, b) => sign * (a.startedAt < b.startedAt ? -1 : a.startedAt > b.startedAt ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}

/** E2B's snapshot as its SDK reads it: our id as `snapshotID` (opaque to the SDK), the name given at its creation as `names`. */
export function e2bSnapshot(s: SnapshotInfo): { snapshotID: string; names: string[] } {
  return { snapshotID: s.id, names: s.name === null ? [] : [s.name] };
}

/** The name of E2B's snapshot create (`{}` or `{name}`); an empty one is none, as the SDK sends it. */
function snapshotNameOf(body: Record<string, unknown>): string | undefined {
  if (body.name === undefined || body.name === null || body.name === '') return undefined;
  const parsed = CreateSnapshotRequest.safeParse({ name: body.name });
  if (!parsed.success) throw bad(`name: ${parsed.error.issues.map((i) => i.message).join('; ')}.`);
  return parsed.data.name;
}

/** E2B's `name[:tag]`: the tag is what follows the last `:` (a namespace `team/` stays in the name). */
function nameAndTag(name: string): { name: string; tag?: string } {
  const i = name.lastIndexOf(':');
  return i > 0 && !name.slice(i + 1).includes('/') ? { name: name.slice(0, i), tag: name.slice(i + 1) } : { name };
}

/**
 * E2B's `name` filter of the snapshot list: a snapshot id, or a name. A name without a tag matches
 * that name with any tag, one with a tag only that tag; a name given without a tag has E2B's
 * `default` one.
 */
function snapshotNamed(filter: string): (s: SnapshotInfo) => boolean {
  if (SNAPSHOT_ID_RE.test(filter)) return (s) => s.id === filter;
  const want = nameAndTag(filter);
  return (s) => {
    if (s.name === null) return false;
    const have = nameAndTag(s.name);
    return have.name === want.name && (want.tag === undefined || (have.tag ?? 'default') === want.tag);
  };
}

/** E2B's snapshot pages hold 100 unless the SDK asks for fewer; 100 is also its most. */
const SNAPSHOT_LIST_LIMIT = 100;

/** E2B's snapshot list query (GET /snapshots): whose, which names, the page and where it starts (nextToken: the last id of the page before). */
export function e2bSnapshotQuery(query: Record<string, unknown>): { sandboxId?: string; keep: (s: SnapshotInfo) => boolean; limit: number; after?: string } {
  let limit = SNAPSHOT_LIST_LIMIT;
  if (query.limit !== undefined) {
    limit = Number(query.limit);
    if (!Number.isInteger(limit) || limit < 1 || limit > SNAPSHOT_LIST_LIMIT) throw bad(`limit must be a whole number from 1 to ${SNAPSHOT_LIST_LIMIT}.`);
  }
  const token = typeof query.nextToken === 'string' && query.nextToken !== '' ? query.nextToken : undefined;
  if (token !== undefined && !SNAPSHOT_ID_RE.test(token)) throw bad('nextToken is not one this server gave: pass the x-next-token of the previous page as it was.');
  const sandboxId = typeof query.sandboxID === 'string' && query.sandboxID !== '' ? query.sandboxID : undefined;
  const name = typeof query.name === 'string' && query.name !== '' ? query.name : undefined;
  return { ...(sandboxId ? { sandboxId } : {}), keep: name === undefined ? () => true : snapshotNamed(name), limit, ...(token ? { after: token } : {}) };
}

/**
 * E2B's v2 log query: ours (the same names, levels and meanings), with E2B's limit of 0 (none)
 * allowed; other names are ignored, as E2B's API ignores them.
 */
const E2bLogsQuery = z.object({ ...SandboxLogsQuery.shape, limit: z.coerce.number().int().min(0).max(LOG_READ_MAX).optional() });
/** E2B's v1 (deprecated) log query: from `start` (ms), at most `limit` (E2B sets no most; we keep LOG_READ_MAX). */
const E2bLogsV1Query = z.object({ start: z.coerce.number().int().min(0).optional(), limit: z.coerce.number().int().min(0).optional() });

/**
 * A log entry as v1's `logs` line: a JSON object, which E2B's CLI (`e2b sandbox logs`) parses,
 * reading its `level` and `logger`.
 */
function e2bLogLine(e: SandboxLogEntry): { timestamp: string; line: string } {
  return { timestamp: e.timestamp, line: JSON.stringify({ ...e.fields, logger: 'collimate', level: e.level, message: e.message }) };
}

/**
 * E2B's template names that mean one of ours: E2B's `base` (the SDK's default) is a Debian image with
 * a `user` account, bash, python3, node, git, curl and sudo, which is our `debian`, not our busybox `base`.
 * `code-interpreter-v1` (the default of `@e2b/code-interpreter`) is our `python`, whose code
 * interpreter serves E2B's protocol on port 49999 (docs/code.md).
 */
export const E2B_TEMPLATES: Record<string, string> = { base: 'debian', 'code-interpreter-v1': 'python' };

export class E2bControlPlane {
  constructor(private readonly opts: E2bControlPlaneOptions) {}

  private get tenants(): TenantService {
    return this.opts.tenants;
  }

  /** The `Sandbox` answer of create, connect, resume and fork: what the SDK needs to reach envd. */
  async sandboxAnswer(scope: Scope, info: SandboxInfo): Promise<Record<string, unknown>> {
    const tokens = await this.tenants.accounts.sandboxTokens(scope, info.id);
    return {
      templateID: info.template,
      sandboxID: info.id,
      clientID: 'collimate',
      envdVersion: ENVD_VERSION,
      envdAccessToken: tokens.envd,
      // getHost(port) URLs reach the ports proxy by Host; this token (header e2b-traffic-access-token) admits them.
      trafficAccessToken: tokens.traffic,
      domain: null,
    };
  }

  private async detail(scope: Scope, info: SandboxInfo): Promise<Record<string, unknown>> {
    // network: what of E2B's network settings the sandbox keeps beside its egress (public ports, the Host its servers see).
    const network = { allowPublicTraffic: info.public_ports ?? false, ...(info.port_host ? { maskRequestHost: info.port_host } : {}) };
    return { ...e2bListed(info), network, envdAccessToken: (await this.tenants.accounts.sandboxTokens(scope, info.id)).envd, domain: null };
  }

  /** A lease of `secs` from now, unless the session already runs at least that long. */
  private async extendTo(scope: Scope, info: SandboxInfo, secs: number | undefined, onlyLonger: boolean): Promise<SandboxInfo> {
    if (secs === undefined || info.state !== 'running') return info;
    if (onlyLonger && info.remaining_secs !== null && info.remaining_secs >= secs) return info;
    return this.tenants.sandboxes.setTimeout(scope, info.id, Math.max(1, secs));
  }

  /** Our template for E2B's name: E2B_TEMPLATES' where this server offers it (a server started with a smaller catalog may not). */
  private templateFor(scope: Scope, named: string): string {
    const ours = E2B_TEMPLATES[named];
    return ours && this.tenants.templates.catalog(scope).some((t) => t.id === ours) ? ours : named;
  }

  async create(scope: Scope, body: Record<string, unknown>): Promise<[number, unknown]> {
    const named = body.templateID;
    if (typeof named !== 'string' || named === '') throw bad('templateID is required: the id of a template (GET /v1/templates).');
    const lifecycle = lifecycleOf(body);
    if (body.mcp !== undefined && body.mcp !== null) throw bad('mcp (the MCP gateway) is not supported by Collimate.');
    if (Array.isArray(body.volumeMounts) && body.volumeMounts.length > 0) throw bad('volumeMounts are not supported by Collimate.');
    const network = body.network !== undefined && body.network !== null ? egressOfNetwork(body.network, body.allow_internet_access === false) : undefined;
    const envProblem = envVarsProblem(body.envVars);
    if (envProblem) throw bad(envProblem);
    const labels = metadataOf(body);
    const timeoutSecs = optionalSeconds(body, 'timeout') ?? DEFAULT_TIMEOUT_SECS;
    const egress = network ?? (body.allow_internet_access === false ? ('none' as const) : undefined);
    const ports = portAccessOfNetwork(body.network);
    const common = { ...(labels ? { labels } : {}), timeoutSecs: Math.max(1, timeoutSecs), ...(egress ? { egress } : {}), ...ports };
    const fromSnapshot = SNAPSHOT_ID_RE.test(named);
    // From a snapshot, E2B's defaults hold (deleted at its timeout), not those of the sandbox it was taken of.
    const info = fromSnapshot
      ? (await this.tenants.sandboxes.startFromSnapshot(scope, { snapshot: named, count: 1, ...common, onTimeout: lifecycle.onTimeout ?? 'delete', autoResume: lifecycle.autoResume ?? false, keepMemory: lifecycle.keepMemory ?? true }))[0]
      : await this.tenants.sandboxes.create(scope, { template: this.templateFor(scope, named), ...common, ...lifecycle });
    // A sandbox from a snapshot has the envVars its envd held then (as E2B's, whose envd is in the snapshot's memory), under the create's own.
    const env = { ...(fromSnapshot ? await this.opts.env.get(named) : {}), ...((body.envVars ?? {}) as Record<string, string>) };
    try {
      await this.opts.env.set(info.id, env);
    } catch (err) {
      await this.tenants.sandboxes.delete(scope, info.id).catch(() => undefined);
      throw err;
    }
    return [201, await this.sandboxAnswer(scope, info)];
  }

  /**
   * A page of E2B's list, in E2B's order (by start time, newest first unless `order=asc`): the
   * tenant's sandboxes are read whole (pages of 1000 by id, as the service keeps them), sorted, and
   * cut after the cursor.
   */
  async list(scope: Scope, query: Record<string, unknown>, runningOnly: boolean): Promise<{ items: unknown[]; next: string | null }> {
    const q = e2bListQuery(query, runningOnly);
    const all: SandboxInfo[] = [];
    let after: string | undefined;
    do {
      const page = await this.tenants.sandboxes.list(scope, { ...q.filter, limit: 1000, ...(after ? { after } : {}) });
      all.push(...page.sandboxes.filter(q.keep));
      after = page.next ?? undefined;
    } while (after);
    const compare = listOrder(q.order);
    const key = (s: SandboxInfo) => ({ startedAt: s.session_started_at, id: s.id });
    const sorted = all.sort((a, b) => compare(key(a), key(b)));
    const from = q.after ? sorted.filter((s) => compare(key(s), q.after!) > 0) : sorted;
    const items = from.slice(0, q.limit);
    return { items: items.map(e2bListed), next: from.length > q.limit ? tokenOf(items[items.length - 1]) : null };
  }

  async get(scope: Scope, id: string): Promise<unknown> {
    return this.detail(scope, await this.tenants.sandboxes.get(scope, id));
  }

  async kill(scope: Scope, id: string): Promise<void> {
    await this.tenants.sandboxes.delete(scope, id);
    await this.opts.env.forget(id);
  }

  async setTimeout(scope: Scope, id: string, body: Record<string, unknown>): Promise<void> {
    const secs = optionalSeconds(body, 'timeout');
    if (secs === undefined) throw bad('timeout is required: seconds from now until the sandbox is deleted.');
    await this.tenants.sandboxes.setTimeout(scope, id, Math.max(1, secs));
  }

  /** `{memory: false}` (the SDK's `pause({keepMemory: false})`) keeps only the filesystem; absent, the memory too (E2B's default, whatever the create said). */
  async pause(scope: Scope, id: string, body: Record<string, unknown>): Promise<void> {
    const memory = optionalBoolean(body, 'memory');
    const info = await this.tenants.sandboxes.get(scope, id);
    if (info.state === 'suspended') throw new CollimateError('invalid_state', `Sandbox ${id} is already paused.`);
    await this.tenants.sandboxes.suspend(scope, id, { keepMemory: memory !== false });
  }

  /**
   * connect: 200 if it was running (its timeout only ever lengthened), 201 once resumed. `memory:
   * false` (the SDK's `onResume: 'reboot'`) asks for a boot from the disk: what a sandbox paused with
   * only its filesystem gets anyway; one paused with its memory is refused (its disk alone is not
   * a consistent state to boot: the guest's unwritten pages are in its memory image).
   */
  async connect(scope: Scope, id: string, body: Record<string, unknown>): Promise<[number, unknown]> {
    const secs = optionalSeconds(body, 'timeout');
    const memory = optionalBoolean(body, 'memory');
    const info = await this.tenants.sandboxes.get(scope, id);
    if (info.state === 'running') return [200, await this.sandboxAnswer(scope, await this.extendTo(scope, info, secs, true))];
    if (memory === false && info.memory_kept !== false) {
      throw bad(`Sandbox ${id} was paused with its memory; Collimate resumes it only as it was (onResume 'restore', the default). To reboot on resume, pause with keepMemory: false.`);
    }
    const resumed = await this.tenants.sandboxes.resume(scope, id);
    return [201, await this.sandboxAnswer(scope, await this.extendTo(scope, resumed, secs, false))];
  }

  async resume(scope: Scope, id: string, body: Record<string, unknown>): Promise<[number, unknown]> {
    const secs = optionalSeconds(body, 'timeout');
    const info = await this.tenants.sandboxes.get(scope, id);
    if (info.state === 'running') throw new CollimateError('invalid_state', `Sandbox ${id} is already running.`);
    const resumed = await this.tenants.sandboxes.resume(scope, id);
    return [201, await this.sandboxAnswer(scope, await this.extendTo(scope, resumed, secs, false))];
  }

  /** All children are made in one live fork (one fork point), so they succeed or fail together. */
  async fork(scope: Scope, id: string, body: Record<string, unknown>): Promise<[number, unknown]> {
    const count = body.count === undefined || body.count === null ? 1 : body.count;
    const countProblem = forkCountProblem(count);
    if (countProblem) throw bad(countProblem);
    const secs = optionalSeconds(body, 'timeout') ?? DEFAULT_TIMEOUT_SECS;
    const env = await this.opts.env.get(id);
    const children = await this.tenants.sandboxes.fork(scope, id, { count: count as number });
    const results = await Promise.all(children.map(async (child) => {
      try {
        await this.opts.env.set(child.id, env);
        return { sandbox: await this.sandboxAnswer(scope, await this.tenants.sandboxes.setTimeout(scope, child.id, Math.max(1, secs))) };
      } catch (err) {
        const e = toClientError(err);
        return { error: { code: e.status, message: e.text(e2bNames), error_code: e.code } };
      }
    }));
    return [201, results];
  }

  /**
   * The sandbox's samples (sandboxMetrics.ts: every 5 s while it runs) within [start, end], unix
   * seconds, E2B's time range, in E2B's shape: CPU share, VMM resident memory, and the root file
   * system's use and size as `df /` says it (what E2B's envd reports; read every 30 s). A sample
   * without a disk reading (an older guest) says 0 used of the sandbox's disk size.
   */
  async metrics(scope: Scope, id: string, query: Record<string, unknown> = {}): Promise<unknown[]> {
    const bound = (name: 'start' | 'end') => {
      const v = query[name];
      if (v === undefined || v === '') return undefined;
      const n = Number(v);
      if (!Number.isInteger(n) || n < 0) throw bad(`${name} must be unix seconds.`);
      return n;
    };
    const start = bound('start');
    const end = bound('end');
    const info = await this.tenants.sandboxes.get(scope, id);
    // The query's seconds are rounded: a sample up to 10 s past `end` still belongs to the range.
    const samples = await this.tenants.sandboxes.metrics(scope, id, start === undefined ? undefined : start * 1000, end === undefined ? undefined : (end + 10) * 1000);
    const entry = (atMs: number, cpuPercent: number | null, memoryMib: number, diskUsedBytes: number | null = null, diskTotalBytes: number | null = null) => ({
      timestamp: new Date(atMs).toISOString(),
      timestampUnix: Math.floor(atMs / 1000),
      cpuCount: info.vcpus,
      // E2B's share of all the sandbox's CPUs; ours counts 100 per busy vCPU.
      cpuUsedPct: cpuPercent === null ? 0 : Math.round((cpuPercent / info.vcpus) * 100) / 100,
      memUsed: memoryMib * 1024 * 1024,
      memTotal: info.memory_mib * 1024 * 1024,
      memCache: 0,
      diskUsed: diskUsedBytes ?? 0,
      diskTotal: diskTotalBytes ?? info.disk_mib * 1024 * 1024,
    });
    if (samples.length > 0) return samples.map((s) => entry(s.atMs, s.cpuPercent, s.memoryMib, s.diskUsedBytes, s.diskTotalBytes));
    // A host that cannot read its VMMs' use (no samples): the sizes, now, if now is in the range.
    const nowMs = Date.now();
    if ((start !== undefined && nowMs / 1000 < start) || (end !== undefined && nowMs / 1000 > end + 10)) return [];
    return [entry(nowMs, null, 0)];
  }

  /**
   * E2B's logs v2: the sandbox's log (src/service/sandboxLog.ts) as E2B's SandboxLogEntry, which has
   * our entry's shape; the levels are E2B's four. `cursor` (ms), `direction`, `level` (the least
   * severe), `limit` and `search` (case-sensitive) mean what they mean on GET /v1/sandboxes/{id}/logs.
   */
  async logs(scope: Scope, id: string, query: Record<string, unknown>): Promise<{ logs: SandboxLogEntry[] }> {
    const q = parseWith(E2bLogsQuery, query, 'query', '');
    const logs = await this.tenants.sandboxes.logs(scope, id, { cursorMs: q.cursor, direction: q.direction, level: q.level, search: q.search, limit: q.limit });
    return { logs };
  }

  /** E2B's logs v1 (deprecated): the entries from `start` on, oldest first, as JSON lines (`logs`) and as entries (`logEntries`). */
  async logsV1(scope: Scope, id: string, query: Record<string, unknown>): Promise<{ logs: Array<{ timestamp: string; line: string }>; logEntries: SandboxLogEntry[] }> {
    const q = parseWith(E2bLogsV1Query, query, 'query', '');
    const entries = await this.tenants.sandboxes.logs(scope, id, { cursorMs: q.start, limit: Math.min(q.limit ?? LOG_READ_MAX, LOG_READ_MAX) });
    return { logs: entries.map(e2bLogLine), logEntries: entries };
  }

  /**
   * A snapshot of a running or suspended sandbox, which goes on as it was (as E2B's). Its envVars are
   * kept under the snapshot's id for the sandboxes started from it.
   */
  async createSnapshot(scope: Scope, id: string, body: Record<string, unknown>): Promise<[number, unknown]> {
    const name = snapshotNameOf(body);
    const snap = await this.tenants.sandboxes.createSnapshot(scope, id, name === undefined ? {} : { name });
    try {
      await this.opts.env.set(snap.id, await this.opts.env.get(id));
    } catch (err) {
      await this.tenants.sandboxes.deleteSnapshot(scope, snap.id).catch(() => undefined);
      throw err;
    }
    return [201, e2bSnapshot(snap)];
  }

  /**
   * A page of the tenant's snapshots in our order, by id (E2B's is newest first): the service's pages
   * are read from the cursor until the page is full, filtered by name here.
   */
  async listSnapshots(scope: Scope, query: Record<string, unknown>): Promise<{ items: unknown[]; next: string | null }> {
    const q = e2bSnapshotQuery(query);
    const kept: SnapshotInfo[] = [];
    let after = q.after;
    do {
      const page = await this.tenants.sandboxes.listSnapshots(scope, { ...(q.sandboxId ? { sandboxId: q.sandboxId } : {}), limit: 1000, ...(after ? { after } : {}) });
      kept.push(...page.snapshots.filter(q.keep));
      after = page.next ?? undefined;
    } while (after && kept.length <= q.limit);
    const items = kept.slice(0, q.limit);
    return { items: items.map(e2bSnapshot), next: kept.length > q.limit ? items[items.length - 1].id : null };
  }

  /**
   * E2B deletes a snapshot as the template it is; templates are not deleted through this door. Its
   * envVars are forgotten here and on the engine's `snapshotDeleted` (whichever door deleted it).
   */
  async deleteTemplate(scope: Scope, templateId: string): Promise<void> {
    if (!SNAPSHOT_ID_RE.test(templateId)) throw notServed('DELETE', `/templates/${templateId}`);
    await this.tenants.sandboxes.deleteSnapshot(scope, templateId);
    await this.opts.env.forget(templateId);
  }
}

function notServed(method: string, path: string): CollimateError {
  return new CollimateError('not_found', `${method} ${path.slice(0, 200)} is not served by Collimate's E2B API; docs/e2b.md lists what is.`);
}

type Handler = (scope: Scope, req: FastifyRequest, reply: FastifyReply) => Promise<unknown> | unknown;

export function registerE2bControlPlane(app: FastifyInstance, opts: E2bControlPlaneOptions): E2bControlPlane {
  const plane = new E2bControlPlane(opts);
  const { tenants } = opts;
  // A sandbox deleted by any front door, the reaper or its VM's death takes its envVars with it.
  const engine = tenants.engine;
  const onTransition = (ev: SandboxTransition) => {
    if (ev.op === 'delete' || ev.op === 'lost') void Promise.resolve(opts.env.forget(ev.id)).catch((err) => app.log.warn({ err, sandbox: ev.id }, 'forgetting a deleted sandbox\'s envVars failed'));
  };
  // A snapshot deleted by any door (REST, MCP, the console, the RL SDK) takes the envVars kept for the sandboxes started from it.
  const onSnapshotDeleted = (ev: SnapshotDeleted) => {
    void Promise.resolve(opts.env.forget(ev.id)).catch((err) => app.log.warn({ err, snapshot: ev.id }, 'forgetting a deleted snapshot\'s envVars failed'));
  };
  engine.on?.('transition', onTransition);
  engine.on?.('snapshotDeleted', onSnapshotDeleted);
  app.addHook('onClose', async () => {
    engine.off?.('transition', onTransition);
    engine.off?.('snapshotDeleted', onSnapshotDeleted);
  });
  const id = (req: FastifyRequest) => (req.params as { id: string }).id;
  const query = (req: FastifyRequest) => (req.query ?? {}) as Record<string, unknown>;

  // The key (X-API-Key, or a bearer) is checked before the body is read (wire/keyFirst.ts).
  const keys = keyFirst(
    (req: FastifyRequest) => {
      const header = req.headers['x-api-key'];
      return tenants.accounts.authenticate((Array.isArray(header) ? header[0] : header) ?? bearerKey(req.headers.authorization));
    },
    (req: FastifyRequest, reply: FastifyReply, err) => sendE2bError(reply, toClientError(err, req.log, req.id)),
  );
  const route = (method: 'GET' | 'POST' | 'PUT' | 'DELETE', path: string, handle: Handler) => {
    app.route({
      method,
      url: E2B_API_PREFIX + path,
      onRequest: keys.onRequest,
      handler: async (req, reply) => {
        try {
          const scope = keys.scopeOf(req);
          const out = await handle(scope, req, reply);
          if (reply.sent) return;
          if (out === undefined) return reply.code(204).send();
          if (Array.isArray(out) && out.length === 2 && typeof out[0] === 'number') return reply.code(out[0]).send(out[1]);
          return reply.code(200).send(out);
        } catch (err) {
          sendE2bError(reply, toClientError(err, req.log, req.id));
        }
      },
    });
  };

  const create: Handler = (scope, req) => plane.create(scope, jsonBody(req));
  route('POST', '/sandboxes', create);
  route('POST', '/v2/sandboxes', create);
  const list = (runningOnly: boolean): Handler => async (scope, req, reply) => {
    const page = await plane.list(scope, query(req), runningOnly);
    if (page.next) reply.header('x-next-token', page.next);
    return page.items;
  };
  route('GET', '/sandboxes', list(true));
  route('GET', '/v2/sandboxes', list(false));
  route('GET', '/sandboxes/:id', (scope, req) => plane.get(scope, id(req)));
  route('DELETE', '/sandboxes/:id', (scope, req) => plane.kill(scope, id(req)));
  route('POST', '/sandboxes/:id/timeout', (scope, req) => plane.setTimeout(scope, id(req), jsonBody(req)));
  route('POST', '/sandboxes/:id/pause', (scope, req) => plane.pause(scope, id(req), jsonBody(req)));
  route('POST', '/sandboxes/:id/connect', (scope, req) => plane.connect(scope, id(req), jsonBody(req)));
  route('POST', '/v2/sandboxes/:id/connect', (scope, req) => plane.connect(scope, id(req), jsonBody(req)));
  route('POST', '/sandboxes/:id/resume', (scope, req) => plane.resume(scope, id(req), jsonBody(req)));
  route('POST', '/sandboxes/:id/fork', (scope, req) => plane.fork(scope, id(req), jsonBody(req)));
  route('GET', '/sandboxes/:id/metrics', (scope, req) => plane.metrics(scope, id(req), query(req)));
  route('GET', '/sandboxes/:id/logs', (scope, req) => plane.logsV1(scope, id(req), query(req)));
  route('GET', '/v2/sandboxes/:id/logs', (scope, req) => plane.logs(scope, id(req), query(req)));
  route('PUT', '/sandboxes/:id/network', async (scope, req) => {
    const body = jsonBody(req) ?? {};
    if (Object.keys(portAccessOfNetwork(body)).length) throw bad('allowPublicTraffic and maskRequestHost are set when the sandbox is created (Sandbox.create({network})); an update changes only its egress.');
    await tenants.sandboxes.setEgress(scope, id(req), egressOfNetwork(body));
  });
  route('POST', '/sandboxes/:id/snapshots', (scope, req) => plane.createSnapshot(scope, id(req), jsonBody(req)));
  route('GET', '/snapshots', async (scope, req, reply) => {
    const page = await plane.listSnapshots(scope, query(req));
    if (page.next) reply.header('x-next-token', page.next);
    return page.items;
  });
  route('DELETE', '/templates/:id', (scope, req) => plane.deleteTemplate(scope, id(req)));
  // Anything else under E2B's API is answered in E2B's error shape, so the SDK can print it.
  app.all(`${E2B_API_PREFIX}/*`, async (req, reply) => {
    sendE2bError(reply, notServed(req.method, req.url.split('?')[0].slice(E2B_API_PREFIX.length)));
  });
  return plane;
}
