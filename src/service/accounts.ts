/**
 * Accounts and keys, a part of the tenant service (tenantService.ts): who acts (an API key, or a
 * sandbox's own token, turned into a Scope), the tenant's own keys, and its tier's limits.
 */
import { CollimateError, sandboxNotFound, msg, see } from '../errors.js';
import type { KeyRecord, KeyStore } from './keys.js';
import type { Placement } from './placement.js';
import type { PortUrlSigner, SandboxTokenKind } from './portUrls.js';
import { nextGeneration, type SandboxGrant, type SandboxGrants } from './sandboxGrants.js';
import type { Quotas } from './quotas.js';
import type { Tier } from './tiers.js';
import type { AccountKeys, Scope } from './types.js';

export class Accounts {
  constructor(
    /** Authenticates keys: this server's store, or a cluster host's cache of the cluster's (src/cluster/keys.ts). */
    readonly keys: KeyStore,
    private readonly accountKeys: AccountKeys,
    private readonly signer: PortUrlSigner,
    private readonly placement: Placement,
    private readonly grants: SandboxGrants,
    private readonly quotas: Quotas,
  ) {}

  private readonly keyStates = new Map<string, { revoked: boolean; at: number }>();

  /** The scope of an API key; `unauthorized` when it is missing, unknown or revoked. */
  async authenticate(key: string | undefined): Promise<Scope> {
    if (!key) throw new CollimateError('unauthorized', 'Missing API key. Send Authorization: Bearer <key> (create one with `collimate keys create`).');
    await this.keys.load(key);
    const p = this.keys.authenticate(key);
    if (!p) throw new CollimateError('unauthorized', 'Invalid or revoked API key.');
    return { tenant: p.tenant, tier: p.tier, keyId: p.keyId };
  }

  /** The scope of a tenant that no key names (a signed URL's sandbox owner): its tier as its keys have it. */
  async scopeOf(tenant: string): Promise<Scope> {
    const tier = await this.keys.findTier(tenant);
    if (!tier) throw new CollimateError('unauthorized', 'The tenant this names has no keys left.');
    return { tenant, tier };
  }

  /** The tenant's keys that are not revoked (records only; the keys themselves are never kept). */
  async ownKeys(scope: Scope): Promise<KeyRecord[]> {
    return this.accountKeys.list({ tenant: scope.tenant });
  }

  /** A new key of the same tenant, under its current tier (a key cannot change its own tier). */
  async createOwnKey(scope: Scope, name?: string): Promise<{ key: string; record: KeyRecord }> {
    const used = (await this.accountKeys.list({ tenant: scope.tenant })).length;
    return this.quotas.within(scope, { keys: { used, adding: 1 } }, async () => {
      const { key, record } = await this.accountKeys.create({ tenant: scope.tenant, ...(name === undefined ? {} : { name }) });
      return { key, record };
    });
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

  /**
   * A sandbox's access tokens for `scope` (E2B's create and connect answer them): those already
   * issued, unless none were or the key they were issued under has been revoked — then new ones of
   * the next generation, under the caller's key.
   */
  async sandboxTokens(scope: Scope, id: string): Promise<SandboxTokens> {
    let grant = (await this.grants.get([id])).get(id) ?? null;
    while (grant === null || (grant.keyId !== null && await this.keyRevoked(grant.keyId))) {
      const was: SandboxGrant | null = grant;
      grant = await this.grants.replace(id, was, scope.keyId ?? null);
      if (grant.generation === nextGeneration(was)) break;
    }
    return this.tokensOf(id, grant);
  }

  /**
   * New tokens for a sandbox of the tenant's, under the caller's key: every token issued before
   * (and every E2B file URL signed with one) stops working on every host at once.
   */
  async rotateSandboxTokens(scope: Scope, id: string): Promise<SandboxTokens & { generation: number }> {
    await this.placement.locate(scope.tenant, id);
    for (;;) {
      const was = (await this.grants.get([id])).get(id) ?? null;
      const grant = await this.grants.replace(id, was, scope.keyId ?? null);
      if (grant.generation === nextGeneration(was)) return { ...this.tokensOf(id, grant), generation: grant.generation };
    }
  }

  private tokensOf(id: string, grant: SandboxGrant): SandboxTokens {
    return { envd: this.signer.sandboxToken(id, 'envd', grant), traffic: this.signer.sandboxToken(id, 'traffic', grant) };
  }

  /** Whether the key is revoked (or gone), from an answer at most KEY_STATE_MS old. */
  private async keyRevoked(keyId: string): Promise<boolean> {
    const now = Date.now();
    const cached = this.keyStates.get(keyId);
    if (cached && now - cached.at < KEY_STATE_MS) return cached.revoked;
    const rec = await this.accountKeys.get(keyId);
    const revoked = rec === null || rec.revoked_at !== null;
    if (this.keyStates.size >= 10_000) this.keyStates.clear();
    this.keyStates.set(keyId, { revoked, at: now });
    return revoked;
  }

  /**
   * The scope of whoever holds a sandbox's access token (E2B's envd token, or its traffic token for
   * the ports): its tenant, under the tenant's tier, acting for the key the token was issued under.
   * 401 for a wrong, rotated or revoked token and for an unknown sandbox alike, so a token-less
   * caller learns nothing about which ids exist; a token this server issued for a sandbox since
   * deleted is 404 sandbox_not_found (its holder knew the sandbox).
   */
  async sandboxScope(id: string, token: string, kind: SandboxTokenKind = 'envd'): Promise<Scope> {
    const refused = (why = 'missing or wrong') => new CollimateError('unauthorized', kind === 'envd'
      ? `The sandbox access token (X-Access-Token) is ${why}; use the envdAccessToken the latest create or connect answered.`
      : `The traffic access token is ${why}; use the trafficAccessToken the latest create or connect answered (it reaches the sandbox's ports only).`);
    if (!token || !/^sbx_[0-9a-f]{12}$/.test(id)) throw refused();
    // The MAC first: a token this server did not make costs a hash, no lookup.
    const claimed = this.signer.sandboxTokenGrant(id, token, kind);
    if (!claimed) throw refused('missing or wrong');
    const grant = (await this.grants.get([id])).get(id);
    // A token this server made for a sandbox that is gone (deleted, reaped): its holder may know that.
    if (!grant && await this.placement.tenantOf(id) === null) throw sandboxNotFound(id);
    if (!grant || grant.generation !== claimed.generation || grant.keyId !== claimed.keyId) throw refused('rotated: new tokens were issued since');
    if (grant.keyId !== null && await this.keyRevoked(grant.keyId)) throw refused('one issued under an API key since revoked');
    const tenant = await this.placement.tenantOf(id);
    if (tenant === null) throw sandboxNotFound(id);
    const tier = await this.keys.findTier(tenant);
    if (!tier) throw refused();
    return { tenant, tier, ...(grant.keyId !== null ? { keyId: grant.keyId } : {}) };
  }

  /**
   * The running sandbox whose envd access token `matches` accepts, with its scope; null if none does.
   * For E2B's signed file URLs, which name no sandbox: a signature is a hash over the token, so the
   * only way to find its sandbox is to try each running one (a hash per sandbox, cheap next to a VM).
   */
  async sandboxByToken(matches: (id: string, token: string) => boolean): Promise<{ id: string; scope: Scope } | null> {
    const ids = await this.placement.runningIds();
    const grants = await this.grants.get(ids);
    for (const [id, grant] of grants) {
      const token = this.signer.sandboxToken(id, 'envd', grant);
      if (matches(id, token)) return { id, scope: await this.sandboxScope(id, token) };
    }
    return null;
  }
}

/** How long a key's revocation may take to end the tokens issued under it on a host. */
const KEY_STATE_MS = 2000;

export interface SandboxTokens {
  /** E2B's envdAccessToken: commands and files. */
  envd: string;
  /** E2B's trafficAccessToken: the sandbox's ports only. */
  traffic: string;
}
