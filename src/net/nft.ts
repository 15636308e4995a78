/**
 * The nftables rulesets, as text for `nft -f`. Pure (golden-tested in test/unit/net/nft.test.ts).
 *
 * Inside each sandbox's namespace, table `ip collimate`:
 *   - the guest (172.16.0.2 on tap0) reaches the outside only through the `egress` chain, which is
 *     the policy: first the resolver (only as the target of the DNS DNAT), then the host's own
 *     addresses, the transit range and link-local (never), then the policy's CIDRs inside ranges
 *     the operator opened, then the blocked ranges, then the policy's other CIDRs (their blocked
 *     parts are closed by then) — or, for "allow" and a denylist, the denied CIDRs and then every
 *     address —, then what the policy's resolver answered
 *     (set `dns4`, filled as names resolve), else reject — fast, with an ICMP error, so a connect
 *     fails at once instead of timing out;
 *   - DNS to the gateway is DNATed to the policy's resolver on the host; with "none" there is none
 *     and the query is rejected;
 *   - the host reaches the guest's ports through the namespace's own address (DNAT to the guest),
 *     for the ports proxy; nothing else may enter;
 *   - guest traffic leaves masqueraded as the namespace's transit address.
 * The guest cannot change any of it: its routes and resolv.conf only decide what it sends.
 *
 * In the host's namespace, table `ip collimate`: forwarding between sandboxes is dropped, traffic
 * from sandboxes is masqueraded on its way out, and the only host service a sandbox may talk to is
 * the resolver address.
 */
import { BLOCKED_RANGES, NEVER_OPENED, isDenylist, openedCidrs, type EgressPolicy } from './policy.js';

export const GUEST_IP = '172.16.0.2';
export const GATEWAY_IP = '172.16.0.1';
export const GUEST_PREFIX = 30;
/** Every tap gets the same MAC: a restored guest's ARP cache names the template's gateway. */
export const TAP_MAC = '02:c0:11:00:00:01';
export const TAP_NAME = 'tap0';
export const NS_IFNAME = 'eth0';
/** Host ends of the namespaces' veth pairs are named `clmh<index>`. */
export const HOST_IF_PREFIX = 'clmh';

export interface SandboxRulesetInput {
  policy: EgressPolicy;
  /** The policy's resolver on the host; absent for "none". */
  resolver?: { ip: string; port: number };
  /** This namespace's transit addresses. */
  hostIp: string;
  nsIp: string;
  transitCidr: string;
  /** Every address of the host (all its interfaces), which no sandbox may reach. */
  hostAddrs: string[];
  /** Blocked ranges the operator lets policies name (COLLIMATE_EGRESS_OPEN_CIDRS). */
  opened?: readonly string[];
}

const set = (xs: readonly (string | number)[]) => `{ ${xs.join(', ')} }`;

function egressRules(inp: SandboxRulesetInput): string[] {
  const p = inp.policy;
  const reject = 'reject with icmp type admin-prohibited';
  const out: string[] = [];
  if (inp.resolver) {
    out.push(`ip daddr ${inp.resolver.ip} meta l4proto { tcp, udp } th dport ${inp.resolver.port} ct status dnat accept`);
  }
  if (inp.hostAddrs.length) out.push(`ip daddr ${set(inp.hostAddrs)} ${reject}`);
  out.push(`ip daddr ${inp.transitCidr} ${reject}`);
  if (p === 'none') {
    out.push(reject);
    return out;
  }
  out.push(`ip daddr ${NEVER_OPENED} ${reject}`);
  if (p === 'allow' || isDenylist(p)) {
    out.push(`ip daddr ${set(BLOCKED_RANGES)} ${reject}`);
    if (isDenylist(p)) out.push(`ip daddr ${set(p.deny)} ${reject}`);
    out.push('accept');
    return out;
  }
  const ports = p.ports.length ? ` meta l4proto { tcp, udp } th dport ${set(p.ports)}` : '';
  // A policy's CIDRs inside a range the operator opened come before the blocked ranges; the others
  // after them, so that whatever a policy names, an unopened blocked range stays closed.
  const early = openedCidrs(p, inp.opened ?? []);
  const late = p.cidrs.filter((c) => !early.includes(c));
  if (early.length) out.push(`ip daddr ${set(early)}${ports} accept`);
  out.push(`ip daddr ${set(BLOCKED_RANGES)} ${reject}`);
  if (late.length) out.push(`ip daddr ${set(late)}${ports} accept`);
  if (!p.domains.length && !p.cidrs.length) out.push(`${ports.trim()} accept`);
  else if (p.domains.length) out.push(`ip daddr @dns4${ports} accept`);
  out.push(reject);
  return out;
}

/** The sandbox namespace's table, replacing any earlier one atomically. */
export function sandboxRuleset(inp: SandboxRulesetInput): string {
  const tap = `"${TAP_NAME}"`;
  const eth = `"${NS_IFNAME}"`;
  const dnat = inp.resolver
    ? [
      `iifname ${tap} ip daddr ${GATEWAY_IP} udp dport 53 dnat to ${inp.resolver.ip}:${inp.resolver.port}`,
      `iifname ${tap} ip daddr ${GATEWAY_IP} tcp dport 53 dnat to ${inp.resolver.ip}:${inp.resolver.port}`,
    ]
    : [];
  const lines = [
    'table ip collimate {}',
    'delete table ip collimate',
    'table ip collimate {',
    '  set dns4 { type ipv4_addr; flags timeout; }',
    '  chain prerouting {',
    '    type nat hook prerouting priority dstnat; policy accept;',
    ...dnat.map((l) => `    ${l}`),
    `    iifname ${eth} ip saddr ${inp.hostIp} ip daddr ${inp.nsIp} meta l4proto tcp dnat to ${GUEST_IP}`,
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority srcnat; policy accept;',
    `    oifname ${eth} masquerade`,
    '  }',
    '  chain forward {',
    '    type filter hook forward priority filter; policy drop;',
    '    ct state established,related accept',
    '    ct state invalid drop',
    `    iifname ${eth} oifname ${tap} ip saddr ${inp.hostIp} ip daddr ${GUEST_IP} ct status dnat accept`,
    `    iifname ${tap} oifname ${eth} ip saddr ${GUEST_IP} jump egress`,
    '  }',
    '  chain egress {',
    ...egressRules(inp).map((l) => `    ${l}`),
    '  }',
    '  chain input {',
    '    type filter hook input priority filter; policy drop;',
    '    ct state established,related accept',
    '    iifname "lo" accept',
    `    iifname ${tap} reject`,
    '  }',
    '}',
  ];
  return lines.join('\n') + '\n';
}

/** Adds resolved addresses to a namespace's `dns4` set, each for `ttlSecs`. */
export function dnsElements(ips: string[], ttlSecs: number): string {
  return `add element ip collimate dns4 { ${ips.map((ip) => `${ip} timeout ${ttlSecs}s`).join(', ')} }\n`;
}

/** The host namespace's table. */
export function hostRuleset(opts: { transitCidr: string; resolverIp: string }): string {
  const h = `"${HOST_IF_PREFIX}*"`;
  return [
    'table ip collimate {}',
    'delete table ip collimate',
    'table ip collimate {',
    '  chain forward {',
    '    type filter hook forward priority filter - 10; policy accept;',
    `    iifname ${h} oifname ${h} drop`,
    `    iifname ${h} ip saddr ${opts.transitCidr} accept`,
    `    iifname ${h} drop`,
    `    oifname ${h} ct state established,related accept`,
    `    oifname ${h} drop`,
    '  }',
    '  chain input {',
    '    type filter hook input priority filter - 10; policy accept;',
    `    iifname ${h} ct state established,related accept`,
    `    iifname ${h} ip daddr ${opts.resolverIp} meta l4proto { tcp, udp } accept`,
    `    iifname ${h} drop`,
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority srcnat; policy accept;',
    `    ip saddr ${opts.transitCidr} oifname != ${h} masquerade`,
    '  }',
    '}',
  ].join('\n') + '\n';
}
