/**
 * Egress policies: what a sandbox may reach. Part of an environment, settable per sandbox at
 * create (never wider than the environment's), inherited by forked children. Pure: parsing,
 * normalising, the narrowing check and name matching; the host enforces them (nft.ts, resolver.ts).
 *
 * JSON forms:
 *   "none"                     no route out, DNS fails
 *   "allow"                    everything public
 *   { "domains": [...], "cidrs": [...], "ports": [...] }
 *       domains: exact names ("api.example.com") or "*.suffix" (any name below suffix, not suffix
 *       itself); cidrs: IPv4 "a.b.c.d/n" or a bare address; ports: TCP/UDP destination ports that
 *       apply to every listed destination (empty or absent: any port). With no domains and no cidrs
 *       the ports apply to every public address.
 *
 * Always blocked, whatever the policy, unless a listed CIDR names them: link-local and metadata
 * addresses, private, loopback, multicast and reserved ranges. Never reachable at all: the host's own
 * addresses, the API server and other sandboxes. Addresses a listed domain resolves to are subject to
 * the blocked ranges too (a public name that resolves to 169.254.169.254 does not open it).
 */
import { CollimateError } from '../errors.js';

export interface EgressAllowlist {
  domains: string[];
  cidrs: string[];
  ports: number[];
}

export type EgressPolicy = 'none' | 'allow' | EgressAllowlist;

/** What callers may pass: the allowlist's fields are optional (parseEgress fills them in). */
export type EgressInput = 'none' | 'allow' | { domains?: string[]; cidrs?: string[]; ports?: number[] };

export const EGRESS_LIMITS = { domains: 256, cidrs: 256, ports: 64 } as const;

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
  if (typeof input === 'string') bad(field, `${JSON.stringify(input.slice(0, 40))} is not a policy; use "none", "allow" or { "domains": [...], "cidrs": [...], "ports": [...] }`);
  if (typeof input !== 'object' || input === null || Array.isArray(input)) bad(field, 'must be "none", "allow" or { "domains": [...], "cidrs": [...], "ports": [...] }');
  const o = input as Record<string, unknown>;
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

/** A stable key: equal policies, equal keys (one resolver per key). */
export function policyKey(p: EgressPolicy): string {
  return typeof p === 'string' ? p : JSON.stringify([p.domains, p.cidrs, p.ports]);
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
  if (p === 'allow') return true;
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
  if (child === 'allow') return 'the environment allows only its allowlist, not "allow"';
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

/** Ranges no policy reaches unless a listed CIDR names them. */
export const BLOCKED_RANGES = [
  '0.0.0.0/8', '10.0.0.0/8', '100.64.0.0/10', '127.0.0.0/8', '169.254.0.0/16', '172.16.0.0/12',
  '192.0.0.0/24', '192.168.0.0/16', '198.18.0.0/15', '224.0.0.0/4', '240.0.0.0/4',
] as const;
