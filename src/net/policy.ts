/**
 * Egress policies: what a sandbox may reach. Part of an environment, settable per sandbox at
 * create (never wider than the environment's), inherited by forked children. Pure: parsing,
 * normalising, the narrowing check and name matching; the host enforces them (nft.ts, resolver.ts).
 *
 * JSON forms:
 *   "none"                     no route out, DNS fails
 *   "allow"                    everything public
 *   { "deny": [...] }          everything public except these CIDRs (IPv4 "a.b.c.d/n" or bare
 *                              addresses): a denylist
 *   { "domains": [...], "cidrs": [...], "ports": [...] }
 *       domains: exact names ("api.example.com") or "*.suffix" (any name below suffix, not suffix
 *       itself); cidrs: IPv4 "a.b.c.d/n" or a bare address; ports: TCP/UDP destination ports that
 *       apply to every listed destination (empty or absent: any port). With no domains and no cidrs
 *       the ports apply to every public address.
 *
 * Always blocked, whatever the policy: link-local and metadata addresses, private, loopback,
 * multicast and reserved ranges (BLOCKED). A tenant's CIDRs may name one only where the operator
 * opened it (COLLIMATE_EGRESS_OPEN_CIDRS; link-local never); naming another is 403 egress_forbidden,
 * and the host's rules keep every unopened blocked range closed whatever a stored policy says. Never
 * reachable at all: the host's own addresses, the API server and other sandboxes. Addresses a listed
 * domain resolves to are subject to the blocked ranges too (a public name that resolves to
 * 169.254.169.254 does not open it).
 */
import { CollimateError } from '../errors.js';

export interface EgressAllowlist {
  domains: string[];
  cidrs: string[];
  ports: number[];
}

/** Every public address except these CIDRs. */
export interface EgressDenylist {
  deny: string[];
}

export type EgressPolicy = 'none' | 'allow' | EgressAllowlist | EgressDenylist;

/** What callers may pass: the allowlist's fields are optional (parseEgress fills them in). */
export type EgressInput = 'none' | 'allow' | { domains?: string[]; cidrs?: string[]; ports?: number[] } | EgressDenylist;

export const EGRESS_LIMITS = { domains: 256, cidrs: 256, ports: 64, deny: 256 } as const;

/** Whether the policy opens every public address but those it lists ("allow" or a denylist). */
export function isDenylist(p: EgressPolicy): p is EgressDenylist {
  return typeof p === 'object' && 'deny' in p;
}

/** The policy's allowlist, or null for "none", "allow" and denylists. */
export function allowlistOf(p: EgressPolicy): EgressAllowlist | null {
  return typeof p === 'object' && !isDenylist(p) ? p : null;
}

const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

function bad(field: string, msg: string): never {
  throw new CollimateError('validation_error', `${field}: ${msg}`);
}

/** A lower-case domain name or `*.suffix`; throws on anything else. */
export function parseDomain(raw: string, field = 'egress.domains'): string {
  const s = raw.trim().toLowerCase().replace(/\.$/, '');
  const wild = s.startsWith('*.');
  const name = wild ? s.slice(2) : s;
  if (name.length === 0 || name.length > 253) bad(field, `${JSON.stringify(raw.slice(0, 80))} is not a domain name`);
  const labels = name.split('.');
  if (labels.some((l) => !LABEL.test(l))) {
    bad(field, `${JSON.stringify(raw.slice(0, 80))} is not a domain name (letters, digits and '-', or "*.suffix" for every name below suffix)`);
  }
  if (wild && labels.length < 2) bad(field, `${JSON.stringify(raw)}: a wildcard needs a suffix of at least two labels, e.g. "*.example.com"`);
  return wild ? `*.${name}` : name;
}

/** IPv4 dotted quad → unsigned 32-bit integer, or null. */
export function ipv4ToInt(s: string): number | null {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(s);
  if (!m) return null;
  const parts = m.slice(1).map(Number);
  if (parts.some((p) => p > 255) || m.slice(1).some((p) => p.length > 1 && p.startsWith('0'))) return null;
  return ((parts[0] << 24) >>> 0) + (parts[1] << 16) + (parts[2] << 8) + parts[3];
}

export function intToIpv4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

export interface Cidr { base: number; bits: number }

export function cidrOf(s: string): Cidr | null {
  const [ip, len, ...rest] = s.split('/');
  if (rest.length) return null;
  const base = ipv4ToInt(ip);
  if (base === null) return null;
  const bits = len === undefined ? 32 : /^\d{1,2}$/.test(len) ? Number(len) : NaN;
  if (!(bits >= 0 && bits <= 32)) return null;
  const mask = bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
  return { base: (base & mask) >>> 0, bits };
}

export function cidrText(c: Cidr): string {
  return `${intToIpv4(c.base)}/${c.bits}`;
}

/** Whether `inner` lies within `outer`. */
export function cidrWithin(inner: Cidr, outer: Cidr): boolean {
  if (inner.bits < outer.bits) return false;
  const mask = outer.bits === 0 ? 0 : (0xffffffff << (32 - outer.bits)) >>> 0;
  return ((inner.base & mask) >>> 0) === outer.base;
}

export function ipInCidr(ip: number, c: Cidr): boolean {
  return cidrWithin({ base: ip, bits: 32 }, c);
}

/** A normalised CIDR ("10.0.0.0/8"); a bare address becomes /32. Host bits set are an error, not silently dropped. */
export function parseCidr(raw: string, field = 'egress.cidrs'): string {
  const s = raw.trim();
  if (s.includes(':')) bad(field, `${JSON.stringify(s.slice(0, 80))}: IPv6 is not supported (sandboxes have IPv4 only)`);
  const c = cidrOf(s);
  if (!c) bad(field, `${JSON.stringify(s.slice(0, 80))} is not an IPv4 address or CIDR like "203.0.113.0/24"`);
  if (ipv4ToInt(s.split('/')[0]) !== c.base) bad(field, `${s} has host bits set; did you mean ${cidrText(c)}?`);
  return cidrText(c);
}

function parsePort(v: unknown, field: string): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > 65535) bad(field, `${JSON.stringify(v)} is not a port (an integer 1..65535)`);
  return v;
}

const uniqSorted = <T>(xs: T[], cmp?: (a: T, b: T) => number) => [...new Set(xs)].sort(cmp);

/** Validates and normalises an egress policy from JSON. Throws validation_error with the field named. */
export function parseEgress(input: unknown, field = 'egress'): EgressPolicy {
  if (input === 'none' || input === 'allow') return input;
  if (typeof input === 'string') bad(field, `${JSON.stringify(input.slice(0, 40))} is not a policy; use "none", "allow", { "domains": [...], "cidrs": [...], "ports": [...] } or { "deny": [...] }`);
  if (typeof input !== 'object' || input === null || Array.isArray(input)) bad(field, 'must be "none", "allow", { "domains": [...], "cidrs": [...], "ports": [...] } or { "deny": [...] }');
  const o = input as Record<string, unknown>;
  if ('deny' in o) return parseDenylist(o, field);
  for (const k of Object.keys(o)) if (!['domains', 'cidrs', 'ports'].includes(k)) bad(field, `unknown key ${JSON.stringify(k)} (allowed: domains, cidrs, ports)`);
  const list = (k: 'domains' | 'cidrs' | 'ports'): unknown[] => {
    const v = o[k];
    if (v === undefined) return [];
    if (!Array.isArray(v)) bad(`${field}.${k}`, 'must be an array');
    if (v.length > EGRESS_LIMITS[k]) bad(`${field}.${k}`, `at most ${EGRESS_LIMITS[k]} entries`);
    return v;
  };
  const str = (k: string) => (v: unknown) => {
    if (typeof v !== 'string') bad(`${field}.${k}`, `${JSON.stringify(v)} is not a string`);
    return v;
  };
  const domains = uniqSorted(list('domains').map(str('domains')).map((d) => parseDomain(d, `${field}.domains`)));
  const cidrs = uniqSorted(list('cidrs').map(str('cidrs')).map((c) => parseCidr(c, `${field}.cidrs`)));
  const ports = uniqSorted(list('ports').map((p) => parsePort(p, `${field}.ports`)), (a, b) => a - b);
  if (!domains.length && !cidrs.length && !ports.length) bad(field, 'an empty allowlist allows nothing; use "none" for no egress');
  return { domains, cidrs, ports };
}

function parseDenylist(o: Record<string, unknown>, field: string): EgressDenylist {
  const other = Object.keys(o).find((k) => k !== 'deny');
  if (other) bad(field, `a denylist { "deny": [...] } has no other keys (${JSON.stringify(other)}): it allows every public address but those listed; for an allowlist use { "domains", "cidrs", "ports" } alone`);
  const v = o.deny;
  if (!Array.isArray(v)) bad(`${field}.deny`, 'must be an array of IPv4 CIDRs or addresses');
  if (v.length > EGRESS_LIMITS.deny) bad(`${field}.deny`, `at most ${EGRESS_LIMITS.deny} entries`);
  if (!v.length) bad(`${field}.deny`, 'an empty denylist denies nothing; use "allow" for every public address');
  const deny = uniqSorted(v.map((c: unknown) => {
    if (typeof c !== 'string') bad(`${field}.deny`, `${JSON.stringify(c)} is not a string`);
    return parseCidr(c, `${field}.deny`);
  }));
  return { deny };
}

/** A stable key: equal policies, equal keys (one resolver per key). */
export function policyKey(p: EgressPolicy): string {
  if (typeof p === 'string') return p;
  return isDenylist(p) ? JSON.stringify(['deny', p.deny]) : JSON.stringify([p.domains, p.cidrs, p.ports]);
}

/** Whether `name` (lower-case, no trailing dot) matches a domain rule. */
export function domainMatches(rule: string, name: string): boolean {
  if (rule.startsWith('*.')) return name.endsWith(rule.slice(1)) && name.length > rule.length - 1;
  return name === rule;
}

/**
 * Whether the policy's resolver answers `name`: "allow" and destination-free allowlists answer
 * every name; an allowlist with destinations only its domains; "none" nothing.
 */
export function resolvesName(p: EgressPolicy, name: string): boolean {
  if (p === 'none') return false;
  if (p === 'allow' || isDenylist(p)) return true;
  if (!p.domains.length && !p.cidrs.length) return true;
  const n = name.toLowerCase().replace(/\.$/, '');
  return p.domains.some((d) => domainMatches(d, n));
}

/** Whether every name `child` matches is matched by `parent`. */
function domainCovered(child: string, parent: string): boolean {
  if (!parent.startsWith('*.')) return child === parent;
  // "*.b" covers "x.b" and "*.x.b"; also "*.b" itself.
  const body = child.startsWith('*.') ? child.slice(2) : child;
  return body === parent.slice(2) ? child.startsWith('*.') : domainMatches(parent, body);
}

/**
 * Why `child` is wider than `parent`, or null when it is the same or narrower. A sandbox's policy
 * may only narrow its environment's.
 */
export function widening(child: EgressPolicy, parent: EgressPolicy): string | null {
  if (parent === 'allow' || child === 'none') return null;
  if (parent === 'none') return 'the environment allows no egress ("none")';
  if (isDenylist(parent)) {
    if (child === 'allow') return `the environment denies ${parent.deny.join(', ')}, so "allow" is wider; deny at least those`;
    if (!isDenylist(child)) return `the environment allows every public address but ${parent.deny.join(', ')}; a sandbox may narrow it to a denylist that denies at least those, or "none"`;
    const mine = child.deny.map((c) => cidrOf(c)!);
    const missed = parent.deny.find((d) => !mine.some((m) => cidrWithin(cidrOf(d)!, m)));
    return missed ? `the environment denies ${missed}, which the sandbox's denylist does not` : null;
  }
  if (child === 'allow') return 'the environment allows only its allowlist, not "allow"';
  if (isDenylist(child)) return 'the environment allows only its allowlist, and a denylist allows every public address but those it lists';
  const parentAny = !parent.domains.length && !parent.cidrs.length;
  if (!parentAny) {
    if (!child.domains.length && !child.cidrs.length) return 'the allowlist names no destinations (every address), but the environment allows only its own';
    const d = child.domains.find((c) => !parent.domains.some((p) => domainCovered(c, p)));
    if (d) return `domain ${d} is not allowed by the environment`;
    const pc = parent.cidrs.map((c) => cidrOf(c)!);
    const c = child.cidrs.find((x) => !pc.some((p) => cidrWithin(cidrOf(x)!, p)));
    if (c) return `CIDR ${c} is not within the environment's CIDRs`;
  }
  if (parent.ports.length) {
    if (!child.ports.length) return `the environment allows only ports ${parent.ports.join(', ')}`;
    const p = child.ports.find((x) => !parent.ports.includes(x));
    if (p !== undefined) return `port ${p} is not allowed by the environment`;
  }
  return null;
}

/**
 * Ranges no policy reaches unless the operator opened them (COLLIMATE_EGRESS_OPEN_CIDRS), each with
 * what is there, for the error that refuses a tenant naming one.
 */
export const BLOCKED = {
  '0.0.0.0/8': 'this network',
  '10.0.0.0/8': 'private addresses (the operator\'s network, cluster peers, databases)',
  '100.64.0.0/10': 'carrier-grade NAT',
  '127.0.0.0/8': 'loopback',
  '169.254.0.0/16': 'link-local (cloud metadata services)',
  '172.16.0.0/12': 'private addresses (the operator\'s network, cluster peers, databases)',
  '192.0.0.0/24': 'IETF protocol assignments',
  '192.168.0.0/16': 'private addresses (the operator\'s network, cluster peers, databases)',
  '198.18.0.0/15': 'benchmarking',
  '224.0.0.0/4': 'multicast',
  '240.0.0.0/4': 'reserved',
} as const;
export const BLOCKED_RANGES = Object.keys(BLOCKED) as Array<keyof typeof BLOCKED>;

/** Link-local: cloud metadata (169.254.169.254) lives here; no configuration opens it. */
export const NEVER_OPENED = '169.254.0.0/16';

const overlap = (a: Cidr, b: Cidr) => cidrWithin(a, b) || cidrWithin(b, a);

/**
 * The operator's list of blocked ranges tenants may name in an allowlist (COLLIMATE_EGRESS_OPEN_CIDRS,
 * comma- or space-separated CIDRs, e.g. "10.20.0.0/16" for a package mirror on the LAN). Link-local
 * cannot be opened.
 */
export function parseOpenCidrs(text: string | undefined, field = 'COLLIMATE_EGRESS_OPEN_CIDRS'): string[] {
  const list = (text ?? '').split(/[\s,]+/).filter(Boolean).map((c) => parseCidr(c, field));
  const never = cidrOf(NEVER_OPENED)!;
  const bad = list.find((c) => overlap(cidrOf(c)!, never));
  if (bad) throw new CollimateError('validation_error', `${field}: ${bad} overlaps ${NEVER_OPENED} (link-local, cloud metadata), which is never opened to sandboxes`);
  return uniqSorted(list);
}

/**
 * The policy's CIDRs that reach into a blocked range, each within a range the operator opened
 * (`opened`): the egress chain accepts these before it rejects the blocked ranges, every other CIDR
 * only after (so its blocked part stays blocked).
 */
export function openedCidrs(p: EgressPolicy, opened: readonly string[]): string[] {
  if (typeof p === 'string' || isDenylist(p)) return [];
  const blocked = BLOCKED_RANGES.map((r) => cidrOf(r)!);
  const open = opened.map((c) => cidrOf(c)!);
  return p.cidrs.filter((c) => {
    const x = cidrOf(c)!;
    return blocked.some((b) => overlap(x, b)) && open.some((o) => cidrWithin(x, o));
  });
}

/**
 * Refuses a tenant's policy (an environment's, a sandbox's) that names a blocked range the operator
 * did not open: 403 egress_forbidden saying which range and why.
 */
export function assertTenantEgress(p: EgressPolicy, opened: readonly string[]): void {
  // A denylist opens nothing a blocked range holds: it only closes more.
  if (typeof p === 'string' || isDenylist(p)) return;
  const open = opened.map((c) => cidrOf(c)!);
  for (const c of p.cidrs) {
    const x = cidrOf(c)!;
    if (open.some((o) => cidrWithin(x, o))) continue;
    const hit = BLOCKED_RANGES.find((r) => overlap(x, cidrOf(r)!));
    if (!hit) continue;
    const how = hit === NEVER_OPENED
      ? 'it is never opened to sandboxes'
      : 'sandboxes reach it only where the server\'s operator opened it (COLLIMATE_EGRESS_OPEN_CIDRS)';
    throw new CollimateError('egress_forbidden', `egress.cidrs: ${c} reaches into ${hit}, ${BLOCKED[hit]}; ${how}. Name public addresses only${x.bits < 8 ? ', or use "allow" for every public address' : ''}.`, { details: { cidr: c, blocked: hit } });
  }
}
