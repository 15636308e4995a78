/**
 * The tier table: the only place plan limits live. Tiers gate concurrency, session length and whether
 * you may bring your own images — never isolation or performance (every sandbox is the same microVM).
 */
export type TierName = 'demo' | 'pro' | 'enterprise';

export interface Tier {
  /** `trusted`: the process holding the engine itself (trustedScope in tenantService.ts), never a key's tier. */
  name: TierName | 'trusted';
  /** Concurrent running sandboxes (suspended ones do not count); null = no cap. */
  maxRunning: number | null;
  /** May create from non-catalog templates (environments baked from your own images). */
  ownImages: boolean;
  /** Upper bound for timeout_secs. */
  maxSessionSecs: number;
  /** timeout_secs when the request omits it; null: the server's default (COLLIMATE_SESSION_SECS). */
  defaultSessionSecs: number | null;
  /** Largest VM an environment may ask for (vcpus, memory_mib). */
  maxVcpus: number;
  maxMemoryMib: number;
}

const MIN = 60;
const HOUR = 60 * MIN;
const DAY = 24 * HOUR;

export const TIERS: Record<TierName, Tier> = {
  demo: { name: 'demo', maxRunning: 2, ownImages: false, maxSessionSecs: 15 * MIN, defaultSessionSecs: 15 * MIN, maxVcpus: 1, maxMemoryMib: 512 },
  pro: { name: 'pro', maxRunning: null, ownImages: true, maxSessionSecs: DAY, defaultSessionSecs: HOUR, maxVcpus: 4, maxMemoryMib: 8192 },
  enterprise: { name: 'enterprise', maxRunning: null, ownImages: true, maxSessionSecs: 7 * DAY, defaultSessionSecs: HOUR, maxVcpus: 16, maxMemoryMib: 65536 },
};

/** No caps: for a process that holds the engine in-process (the local RL fleet), not for API keys. */
export const TRUSTED_TIER: Tier = {
  name: 'trusted', maxRunning: null, ownImages: true, maxSessionSecs: Number.MAX_SAFE_INTEGER, defaultSessionSecs: null, maxVcpus: Number.MAX_SAFE_INTEGER, maxMemoryMib: Number.MAX_SAFE_INTEGER,
};

export const TIER_NAMES = Object.keys(TIERS) as TierName[];

export function isTierName(s: string): s is TierName {
  return Object.prototype.hasOwnProperty.call(TIERS, s);
}
