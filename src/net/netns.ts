/**
 * Network namespaces for sandboxes (placeholder: filled in below).
 */

export interface NetSettings {
  /** auto: networking when the server runs as root and `ip`/`nft` exist; on: require it; off: no NIC at all. */
  mode: 'auto' | 'on' | 'off';
  /** Transit addresses between the host and the sandboxes' namespaces, one /30 each. */
  transitCidr: string;
  /** Where the per-policy resolvers forward allowed names ("ip:port"); default: the host's first nameserver. */
  dnsUpstream?: string;
  /** Host-wide state (index claims), shared with the jailer's run dir. */
  runDir: string;
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
