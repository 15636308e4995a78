/**
 * Accounts and keys, a part of the tenant service (tenantService.ts): who acts (an API key, or a
 * sandbox's own token, turned into a Scope), the tenant's own keys, and its tier's limits.
 */
import { CollimateError, sandboxNotFound, msg, see } from '../errors.js';
import type { KeyRecord, KeyStore } from './keys.js';
import type { Placement } from './placement.js';
import type { PortUrlSigner, SandboxTokenKind } from './portUrls.js';
import type { Tier } from './tiers.js';
import type { AccountKeys, Scope } from './types.js';

export class Accounts {
  constructor(
    /** Authenticates keys: this server's store, or a cluster host's cache of the cluster's (src/cluster/keys.ts). */
    readonly keys: KeyStore,
    private readonly accountKeys: AccountKeys,
    private readonly signer: PortUrlSigner,
    private readonly placement: Placement,
  ) {}

  /** The scope of an API key; `unauthorized` when it is missing, unknown or revoked. */
  async authenticate(key: string | undefined): Promise<Scope> {
    if (!key) throw new CollimateError('unauthorized', 'Missing API key. Send Authorization: Bearer <key> (create one with `collimate keys create`).');
    await this.keys.load(key);
    const p = this.keys.authenticate(key);
    if (!p) throw new CollimateError('unauthorized', 'Invalid or revoked API key.');
    return { tenant: p.tenant, tier: p.tier };
  }

  /** The tenant's keys that are not revoked (records only; the keys themselves are never kept). */
  async ownKeys(scope: Scope): Promise<KeyRecord[]> {
    return this.accountKeys.list({ tenant: scope.tenant });
  }

  /** A new key of the same tenant, under its current tier (a key cannot change its own tier). */
  async createOwnKey(scope: Scope, name?: string): Promise<{ key: string; record: KeyRecord }> {
    const { key, record } = await this.accountKeys.create({ tenant: scope.tenant, ...(name === undefined ? {} : { name }) });
    return { key, record };
  }

  /** Revokes one of the tenant's keys by id; another tenant's key is as unknown as one that never was. */
  async revokeOwnKey(scope: Scope, keyId: string): Promise<void> {
    const rec = await this.accountKeys.get(keyId);
    if (!rec || rec.tenant !== scope.tenant || rec.revoked_at !== null) {
      throw new CollimateError('not_found', msg`No key ${JSON.stringify(keyId.slice(0, 100))} of yours; list them${see('listKeys')}.`);
    }
    await this.accountKeys.revoke(keyId);
  }

  /** The tier's limits and how many of the tenant's sandboxes run now. */
  async limits(scope: Scope): Promise<{ tier: Tier; running: number }> {
    return { tier: scope.tier, running: await this.placement.running(scope.tenant) };
  }

  /** The catalog, which every tier may create from. */
  /**
   * The scope of whoever holds a sandbox's access token (E2B's envd token, PortUrlSigner.sandboxToken):
   * its tenant, under the tenant's tier. 401 for a wrong token or an unknown sandbox alike, so a
   * token-less caller learns nothing about which ids exist.
   */
  async sandboxScope(id: string, token: string, kind: SandboxTokenKind = 'envd'): Promise<Scope> {
    const refused = () => new CollimateError('unauthorized', kind === 'envd'
      ? 'The sandbox access token (X-Access-Token) is missing or wrong; use the envdAccessToken the create or connect answered.'
      : "The traffic access token is missing or wrong; use the trafficAccessToken the create or connect answered (it reaches the sandbox's ports only).");
    if (!token || !/^sbx_[0-9a-f]{12}$/.test(id) || !this.signer.verifySandboxToken(id, token, kind)) throw refused();
    const tenant = await this.placement.tenantOf(id);
    if (tenant === null) throw sandboxNotFound(id);
    const tier = await this.keys.findTier(tenant);
    if (!tier) throw refused();
    return { tenant, tier };
  }

  /**
   * The running sandbox whose access token `matches` accepts, with its scope; null if none does.
   * For E2B's signed file URLs, which name no sandbox: a signature is a hash over the token, so the
   * only way to find its sandbox is to try each running one (a hash per sandbox, cheap next to a VM).
   */
  async sandboxByToken(matches: (id: string, token: string) => boolean): Promise<{ id: string; scope: Scope } | null> {
    for (const id of await this.placement.runningIds()) {
      const token = this.signer.sandboxToken(id);
      if (matches(id, token)) return { id, scope: await this.sandboxScope(id, token) };
    }
    return null;
  }
}
