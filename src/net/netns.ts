/**
 * A network per sandbox, safe for clones (Firecracker's network-for-clones pattern).
 *
 * Every sandbox VMM runs in a network namespace of its own, `clm-<home tag>-<index>`. Inside it:
 * the tap device QEMU attaches to (tap0, 172.16.0.1/30, the guest's gateway) and the namespace
 * end of a veth pair (eth0, a transit /30 from COLLIMATE_NET_TRANSIT, default 10.201.0.0/16). Every
 * guest has the same address (172.16.0.2) and MAC, so a forked child that wakes with its parent's
 * configuration collides with nothing: the namespace's NAT makes it unique on the host. The host
 * end of the veth is `clmh<index>`; indexes are claimed host-wide (several servers, concurrent test
 * files) with the same claim files as VMM uids.
 *
 * Namespaces are made ahead of time and pooled, so that neither a create (its warm VMM already
 * sits in one) nor a fork pays for them. The tap is made when a VMM is about to use it, owned by
 * the VMM's uid, so an unprivileged QEMU can attach to it and nothing else can.
 *
 * The egress policy is an nftables table inside the namespace (nft.ts), so the guest cannot change
 * it; names resolve through the policy's resolver on the host (resolver.ts), which adds what it
 * answers to the namespace's set.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ClaimPool, ownStartTicks, processMatches, readClaim, releaseClaim, type ClaimOwner } from '../host/claims.js';
import { cidrOf, intToIpv4, ipInCidr, ipv4ToInt, policyKey, type EgressPolicy } from './policy.js';
import {
  GATEWAY_IP, GUEST_PREFIX, HOST_IF_PREFIX, NS_IFNAME, TAP_MAC, TAP_NAME, dnsElements, hostRuleset, sandboxRuleset,
} from './nft.js';
import { PolicyResolver, upstreamFromResolvConf } from './resolver.js';
import { run } from '../host/run.js';

export interface NetSettings {
  /** auto: networking when the server runs as root and `ip`/`nft` exist; on: require it; off: no NIC at all. */
  mode: 'auto' | 'on' | 'off';
  /** Transit addresses between the host and the sandboxes' namespaces, one /30 each. */
  transitCidr: string;
  /** Where the per-policy resolvers forward allowed names ("ip:port"); default: the host's first nameserver. */
  dnsUpstream?: string;
  /** Host-wide state (index claims), shared with the jailer's run dir. */
  runDir: string;
  /** Blocked ranges tenants' allowlists may name (COLLIMATE_EGRESS_OPEN_CIDRS; policy.ts parseOpenCidrs). */
  openCidrs: string[];
}

/** What a VMM record keeps of its namespace, so that a later server can adopt or remove it. */
export interface NetRecord {
  index: number;
  /** `ip netns` name. */
  ns: string;
  /** The host end's address (the namespace's gateway) and the namespace end's (the proxy connects there). */
  hostIp: string;
  nsIp: string;
  /** The index's claim file. */
  claim: string;
}

export const NETNS_DIR = '/run/netns';

/** One VMM's namespace as its spawn uses it (NetManager.forVmm). */
export interface VmmNet {
  rec: NetRecord;
  netns: string;
  bound(owner: ClaimOwner): void;
  release(): Promise<void>;
}
const TOOLS = ['/usr/sbin/ip', '/usr/sbin/nft', '/usr/bin/nsenter'];

export function netAvailability(s: NetSettings): { enabled: boolean; reason: string } {
  if (s.mode === 'off') return { enabled: false, reason: 'COLLIMATE_NET=off' };
  if (typeof process.getuid === 'function' && process.getuid() !== 0) return { enabled: false, reason: 'the server does not run as root, so it cannot make network namespaces' };
  for (const t of TOOLS) if (!existsSync(t)) return { enabled: false, reason: `${t} is missing (apt-get install iproute2 nftables util-linux)` };
  if (!existsSync('/dev/net/tun')) return { enabled: false, reason: '/dev/net/tun is missing (the tun module)' };
  return { enabled: true, reason: 'root' };
}

/** Whether sandboxes get a NIC; throws when COLLIMATE_NET=on cannot be honoured. */
export function networkingOn(s: NetSettings): boolean {
  const a = netAvailability(s);
  if (!a.enabled && s.mode === 'on') throw new Error(`COLLIMATE_NET=on but networking is unavailable: ${a.reason}`);
  return a.enabled;
}

/** The kernel command line word the agent configures eth0 from (src/guest/agent/net.c). */
export function guestNetArg(): string {
  return `collimate.net=172.16.0.2/${GUEST_PREFIX},${GATEWAY_IP}`;
}

const sh = async (file: string, args: string[], input?: string): Promise<string> => (await run(file, args, { input })).stdout;

const inNs = (ns: string, file: string, args: string[], input?: string) => sh('/usr/bin/nsenter', [`--net=${join(NETNS_DIR, ns)}`, '--', file, ...args], input);

/** The transit addresses of an index: index i owns the i-th /30 of the range. */
export function transitOf(transitCidr: string, index: number): { hostIp: string; nsIp: string } {
  const c = cidrOf(transitCidr);
  if (!c || c.bits > 28) throw new Error(`COLLIMATE_NET_TRANSIT ${transitCidr} must be an IPv4 CIDR of /28 or larger`);
  const base = c.base + index * 4;
  return { hostIp: intToIpv4(base + 1), nsIp: intToIpv4(base + 2) };
}

/** Index 0's first address: where the resolvers listen (on the host's loopback interface). */
export function resolverIpOf(transitCidr: string): string {
  return intToIpv4(cidrOf(transitCidr)!.base + 1);
}

function indexCount(transitCidr: string): number {
  const c = cidrOf(transitCidr)!;
  return Math.min(2 ** (32 - c.bits) / 4, 16384);
}

interface ResolverRef {
  resolver: PolicyResolver;
  users: Set<string>;
}

/** Namespaces, taps, rulesets and resolvers of one home's sandboxes. One per engine. */
export class NetManager {
  private readonly claims: ClaimPool;
  private readonly pool: NetRecord[] = [];
  private filling?: Promise<void>;
  private readonly self: ClaimOwner;
  private readonly resolvers = new Map<string, ResolverRef>();
  /** Namespace → its policy key and transit address (the resolver tells sandboxes apart by source). */
  private readonly applied = new Map<string, { key: string; rec: NetRecord }>();
  private readonly byNsIp = new Map<string, NetRecord>();
  /** Namespaces this manager made and has not released, by name: a release of an older record of the same index leaves them. */
  private readonly made = new Map<string, NetRecord>();
  private hostAddrs: string[] = [];
  private closed = false;

  /** Network indexes a new sandbox could have: unclaimed ones and this manager's pooled namespaces. */
  indexBudget(): { free: number; total: number } {
    return { free: this.claims.free() + this.pool.length, total: this.claims.count };
  }

  private constructor(readonly settings: NetSettings, readonly tag: string, private readonly upstream: string, readonly poolTarget: number) {
    const count = indexCount(settings.transitCidr);
    // Index 0 is the resolver's block.
    this.claims = new ClaimPool(join(settings.runDir, 'netidx'), 1, count - 1, { what: 'network index', resource: 'net_indexes' });
    this.self = { pid: process.pid, startTicks: ownStartTicks() };
  }

  static async open(settings: NetSettings, opts: { tag: string; poolSize?: number }): Promise<NetManager | null> {
    if (!networkingOn(settings)) return null;
    transitOf(settings.transitCidr, 0);
    const upstream = settings.dnsUpstream ?? upstreamFromResolvConf(readOr('/etc/resolv.conf'));
    const m = new NetManager(settings, opts.tag, upstream, opts.poolSize ?? 4);
    await m.setUpHost();
    return m;
  }

  status(): { enabled: true; transit: string; upstream: string } {
    return { enabled: true, transit: this.settings.transitCidr, upstream: this.upstream };
  }

  /** The host side, once per process: forwarding on, the resolver address, the host table. Idempotent. */
  private async setUpHost(): Promise<void> {
    mkdirSync(this.claims.dir, { recursive: true, mode: 0o700 });
    writeFileSync('/proc/sys/net/ipv4/ip_forward', '1');
    const rip = resolverIpOf(this.settings.transitCidr);
    // On loopback: a host address no interface routes to, which packets from the namespaces'
    // veths are delivered to locally (and the host table lets them reach nothing else).
    await sh('/usr/sbin/ip', ['addr', 'replace', `${rip}/32`, 'dev', 'lo']);
    await sh('/usr/sbin/nft', ['-f', '-'], hostRuleset({ transitCidr: this.settings.transitCidr, resolverIp: rip }));
    const transit = cidrOf(this.settings.transitCidr)!;
    // The transit range is blocked as a whole; the host's other addresses one by one.
    this.hostAddrs = (await hostAddresses()).filter((a) => !ipInCidr(ipv4ToInt(a)!, transit));
    await this.sweepHost();
  }

  /**
   * Namespaces of any home on this host whose claim is stale (their server and VMM are gone) or
   * missing: a crashed server's pool, say. Claims are made before namespaces and dropped after.
   */
  private async sweepHost(): Promise<void> {
    let names: string[] = [];
    try { names = readdirSync(NETNS_DIR); } catch { /* none yet */ }
    for (const ns of names) {
      const m = /^clm-[0-9a-f]+-(\d+)$/.exec(ns);
      if (!m) continue;
      const claim = join(this.claims.dir, m[1]);
      const owner = readClaim(claim);
      if (owner && processMatches(owner)) continue;
      // A claim being written right now has no owner yet; one older than a minute is abandoned.
      if (!owner && existsSync(claim) && Date.now() - statSync(claim).mtimeMs < 60_000) continue;
      await this.removeStale(ns, Number(m[1]));
    }
    this.claims.sweepStale();
  }

  /** Keeps `poolTarget` namespaces ready. */
  refill(): void {
    if (this.closed || this.filling || this.pool.length >= this.poolTarget) return;
    this.filling = (async () => {
      try {
        while (!this.closed && this.pool.length < this.poolTarget) this.pool.push(await this.make());
      } catch { /* the next acquire makes its own and reports the error */ }
    })().finally(() => { this.filling = undefined; });
  }

  /** A namespace for a VMM about to be spawned, owned by this process until `bind`. */
  async acquire(): Promise<NetRecord> {
    if (this.closed) throw new Error('networking is shutting down');
    const rec = this.pool.shift() ?? (await this.make());
    this.refill();
    return rec;
  }

  private async make(): Promise<NetRecord> {
    const index = this.claims.claim(this.self);
    const ns = `clm-${this.tag}-${index}`;
    const { hostIp, nsIp } = transitOf(this.settings.transitCidr, index);
    const host = `${HOST_IF_PREFIX}${index}`;
    const rec: NetRecord = { index, ns, hostIp, nsIp, claim: join(this.claims.dir, String(index)) };
    try {
      // A stale claim may have left its namespace or veth behind.
      await removeIndex(index);
      await sh('/usr/sbin/ip', ['netns', 'add', ns]);
      await sh('/usr/sbin/ip', ['-b', '-'], [
        `link add ${host} type veth peer name ${NS_IFNAME} netns ${ns}`,
        `addr add ${hostIp}/30 dev ${host}`,
        `link set ${host} up`,
      ].join('\n') + '\n');
      await sh('/usr/sbin/ip', ['-n', ns, '-b', '-'], [
        'link set lo up',
        `addr add ${nsIp}/30 dev ${NS_IFNAME}`,
        `link set ${NS_IFNAME} up`,
        `route add default via ${hostIp}`,
      ].join('\n') + '\n');
      await inNs(ns, '/usr/sbin/sysctl', ['-q', '-w', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.disable_ipv6=1']);
      // Until a policy is applied, nothing gets in or out.
      await inNs(ns, '/usr/sbin/nft', ['-f', '-'], sandboxRuleset({ policy: 'none', hostIp, nsIp, transitCidr: this.settings.transitCidr, hostAddrs: this.hostAddrs }));
      this.made.set(ns, rec);
      return rec;
    } catch (e) {
      await removeIndex(index).catch(() => {});
      this.claims.release(index, this.self);
      throw e;
    }
  }

  /** Makes the tap a VMM attaches to: owned by its uid (undefined: QEMU runs as root). */
  async attachTap(rec: NetRecord, uid?: number): Promise<void> {
    const owner = uid === undefined ? '' : ` user ${uid} group ${uid}`;
    await sh('/usr/sbin/ip', ['-n', rec.ns, '-b', '-'], [
      `tuntap add dev ${TAP_NAME} mode tap${owner}`,
      `link set ${TAP_NAME} address ${TAP_MAC}`,
      `addr add ${GATEWAY_IP}/${30} dev ${TAP_NAME}`,
      `link set ${TAP_NAME} up`,
    ].join('\n') + '\n');
  }

  /** The spawned VMM now holds the namespace: it outlives a crash of this server with it. */
  bind(rec: NetRecord, owner: ClaimOwner): void {
    this.claims.bind(rec.index, owner);
  }

  /**
   * Running one VMM in `rec`: what Vmm.spawn needs (the namespace path, and `release` once the
   * process is gone), `bound` for its onSpawned (the claim passes to the VMM), and `release` also
   * for a spawn that failed (before or after the VMM existed).
   */
  forVmm(rec: NetRecord): VmmNet {
    let owner: ClaimOwner | undefined;
    return {
      rec,
      netns: join(NETNS_DIR, rec.ns),
      bound: (o) => { owner = o; this.bind(rec, o); },
      release: () => this.release(rec, owner),
    };
  }

  /** Enforces `policy` in the namespace (replacing what was there) and points its DNS at the policy's resolver. */
  async apply(rec: NetRecord, policy: EgressPolicy): Promise<void> {
    const key = policyKey(policy);
    const prev = this.applied.get(rec.ns);
    // Already in place (a fork receiver made ready with the policy its next fork's parent has).
    if (prev && prev.key === key && prev.rec.nsIp === rec.nsIp) return;
    let resolver: PolicyResolver | undefined;
    if (policy !== 'none') {
      let ref = this.resolvers.get(key);
      if (!ref) {
        ref = {
          resolver: await PolicyResolver.start({
            policy, bindIp: resolverIpOf(this.settings.transitCidr), upstream: this.upstream,
            onAnswer: (src, ips, ttl) => this.allowAnswers(src, ips, ttl),
            knows: (src) => this.byNsIp.has(src),
          }),
          users: new Set(),
        };
        this.resolvers.set(key, ref);
      }
      ref.users.add(rec.ns);
      resolver = ref.resolver;
    }
    try {
      await inNs(rec.ns, '/usr/sbin/nft', ['-f', '-'], sandboxRuleset({
        policy, hostIp: rec.hostIp, nsIp: rec.nsIp, transitCidr: this.settings.transitCidr, hostAddrs: this.hostAddrs, opened: this.settings.openCidrs,
        resolver: resolver ? { ip: resolver.ip, port: resolver.port } : undefined,
      }));
    } catch (e) {
      if (prev?.key !== key) await this.dropResolver(key, rec.ns);
      throw e;
    }
    if (prev && prev.key !== key) await this.dropResolver(prev.key, rec.ns);
    this.applied.set(rec.ns, { key, rec });
    this.byNsIp.set(rec.nsIp, rec);
  }

  private async dropResolver(key: string, ns: string): Promise<void> {
    const ref = this.resolvers.get(key);
    if (!ref) return;
    ref.users.delete(ns);
    if (ref.users.size === 0) {
      this.resolvers.delete(key);
      await ref.resolver.close();
    }
  }

  /** The resolver answered `ips` to the sandbox whose namespace address is `src`: let it reach them. */
  private async allowAnswers(src: string, ips: string[], ttlSecs: number): Promise<void> {
    const rec = this.byNsIp.get(src);
    if (!rec || !ips.length) return;
    await inNs(rec.ns, '/usr/sbin/nft', ['-f', '-'], dnsElements(ips, Math.max(60, Math.min(ttlSecs, 86_400))));
  }

  /** Removes the namespace (its veth and tap go with it), its resolver reference and its claim. */
  async release(rec: NetRecord, owner?: ClaimOwner): Promise<void> {
    if (this.made.get(rec.ns) === rec) this.made.delete(rec.ns);
    const a = this.applied.get(rec.ns);
    this.applied.delete(rec.ns);
    if (this.byNsIp.get(rec.nsIp)?.ns === rec.ns) this.byNsIp.delete(rec.nsIp);
    if (a) await this.dropResolver(a.key, rec.ns);
    // The claim passed to the VMM, which is gone, so the index may have been claimed again since —
    // by another server, which removed this namespace as it made its own, or by this one, whose new
    // namespace has this very name. Only what is ours again goes; what someone else holds is theirs.
    if (this.claims.takeOver(rec.index, this.self)) {
      await removeIndex(rec.index);
      releaseClaim(rec.claim, this.self);
    } else if (this.made.get(rec.ns) === undefined) {
      // Not taken over (its VMM is still exiting, or another server holds the index now and has
      // removed this namespace already): this name is still this record's.
      await sh('/usr/sbin/ip', ['netns', 'del', rec.ns]).catch(() => {});
    }
    // Else this manager has made the index's namespace anew since (the claim went stale when the
    // VMM exited, and a create or fork took it): the name is the newer record's, and stays.
    if (owner) releaseClaim(rec.claim, owner);
  }

  /**
   * A namespace whose index's claim is stale or missing: the claim is taken over first (else
   * another server claiming the index meanwhile would lose the namespace it makes), then what the
   * index names is removed and the claim let go. Left for a later sweep when that fails.
   */
  private async removeStale(ns: string, index: number): Promise<void> {
    if (!this.claims.takeOver(index, this.self)) return;
    try {
      await removeIndex(index);
    } finally {
      releaseClaim(join(this.claims.dir, String(index)), this.self);
    }
  }

  /** This home's namespaces that exist now (leak checks). */
  namespaces(): string[] {
    return homeNamespaces(this.tag);
  }

  /** Resolver policies with a socket open (leak checks). */
  resolverCount(): number {
    return this.resolvers.size;
  }

  /**
   * Removes this home's namespaces that are not `keep` and whose claim's owner is gone (after a
   * crash: reconcile has adopted what lives and stopped the rest).
   */
  async sweep(keep: Set<string>): Promise<void> {
    for (const ns of this.namespaces()) {
      if (keep.has(ns) || this.pool.some((p) => p.ns === ns)) continue;
      const index = Number(ns.slice(ns.lastIndexOf('-') + 1));
      const claim = join(this.claims.dir, String(index));
      const owner = readClaim(claim);
      // Held by a live VMM, or by this process (pooled, being made, or about to get its VMM): kept.
      if (owner && processMatches(owner)) continue;
      // A claim being written right now has no owner yet.
      if (!owner && existsSync(claim) && Date.now() - statSync(claim).mtimeMs < 60_000) continue;
      await this.removeStale(ns, index);
    }
    this.claims.sweepStale();
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.filling;
    for (const rec of this.pool.splice(0)) await this.release(rec).catch(() => {});
    for (const [, ref] of this.resolvers) await ref.resolver.close();
    this.resolvers.clear();
  }
}

/** This home's namespace names. */
export function homeNamespaces(tag: string): string[] {
  try {
    return readdirSync(NETNS_DIR).filter((n) => n.startsWith(`clm-${tag}-`));
  } catch {
    return [];
  }
}

/**
 * What an index names: the host end of its veth (it goes with the namespace, unless a process still
 * holds the namespace) and every home's namespace with that index. The caller holds the index's claim.
 */
async function removeIndex(index: number): Promise<void> {
  const host = `${HOST_IF_PREFIX}${index}`;
  if (existsSync(`/sys/class/net/${host}`)) await sh('/usr/sbin/ip', ['link', 'del', host]).catch(() => {});
  for (const ns of (() => { try { return readdirSync(NETNS_DIR); } catch { return []; } })()) {
    if (/^clm-[0-9a-f]+-\d+$/.test(ns) && ns.endsWith(`-${index}`)) await sh('/usr/sbin/ip', ['netns', 'del', ns]).catch(() => {});
  }
}

/** Every IPv4 address of the host's own interfaces. */
async function hostAddresses(): Promise<string[]> {
  const out = await sh('/usr/sbin/ip', ['-j', '-4', 'addr', 'show']);
  const addrs = new Set<string>();
  for (const link of JSON.parse(out) as Array<{ addr_info?: Array<{ local?: string }> }>) {
    for (const a of link.addr_info ?? []) if (a.local) addrs.add(a.local);
  }
  return [...addrs].sort();
}

function readOr(path: string): string {
  try { return readFileSync(path, 'utf8'); } catch { return ''; }
}


const managers = new Map<string, Promise<NetManager | null>>();

/** The network manager of an engine configuration (one per home and settings; built once per process). */
export function netFor(cfg: { net: NetSettings; homeTag: string }): Promise<NetManager | null> {
  const key = JSON.stringify([cfg.net, cfg.homeTag]);
  let m = managers.get(key);
  if (!m) {
    m = NetManager.open(cfg.net, { tag: cfg.homeTag });
    managers.set(key, m);
    m.catch(() => managers.delete(key));
  }
  return m;
}

/** Forgets the manager of a configuration once its engine closed it. */
export function forgetNet(cfg: { net: NetSettings; homeTag: string }): void {
  managers.delete(JSON.stringify([cfg.net, cfg.homeTag]));
}
