/**
 * Sandbox access tokens (src/service/accounts.ts, src/service/portUrls.ts): a token this server did
 * not make is refused by its MAC before anything is looked up; one it made is checked against the
 * sandbox's current grant (rotation) and its key (revocation).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Accounts } from '../../../src/service/accounts.js';
import { PortUrlSigner } from '../../../src/service/portUrls.js';
import { Quotas } from '../../../src/service/quotas.js';
import type { SandboxGrant, SandboxGrants } from '../../../src/service/sandboxGrants.js';
import { TIERS } from '../../../src/service/tiers.js';

const ID = 'sbx_0123456789ab';

function accounts(stored: SandboxGrant | null) {
  const lookups: string[] = [];
  const grants: SandboxGrants = {
    async get(ids) {
      lookups.push('grants');
      return new Map(stored ? ids.map((id) => [id, stored] as const) : []);
    },
    async replace() {
      throw new Error('not in this test');
    },
    async forget() {},
  };
  const keys = { findTier: async () => TIERS.pro, load: async () => {}, authenticate: () => null } as never;
  const accountKeys = { get: async (id: string) => { lookups.push(`key ${id}`); return { id, revoked_at: null } as never; } } as never;
  const placement = { tenantOf: async () => { lookups.push('tenant'); return 'acme'; } } as never;
  const signer = new PortUrlSigner(null);
  return { a: new Accounts(keys, accountKeys, signer, placement, grants, new Quotas()), signer, lookups };
}

test('a forged or altered token is refused by its MAC alone: no grant, key or tenant is looked up', async () => {
  const { a, signer, lookups } = accounts({ keyId: 'key_aaaaaaaaaaaa', generation: 3 });
  const real = signer.sandboxToken(ID, 'envd', { keyId: 'key_aaaaaaaaaaaa', generation: 3 });
  const forged = [
    'x'.repeat(43),
    `3.key_aaaaaaaaaaaa.${'A'.repeat(43)}`,
    real.replace(/^3\./, '4.'), // a later generation claimed, the MAC of the old one
    real.replace('key_aaaaaaaaaaaa', 'key_bbbbbbbbbbbb'),
    signer.sandboxToken(ID, 'traffic', { keyId: 'key_aaaaaaaaaaaa', generation: 3 }), // the traffic token is not the envd one
    signer.sandboxToken('sbx_ffffffffffff', 'envd', { keyId: 'key_aaaaaaaaaaaa', generation: 3 }), // another sandbox's
  ];
  for (const token of forged) await assert.rejects(a.sandboxScope(ID, token), (e: { code?: string }) => e.code === 'unauthorized', token);
  assert.deepEqual(lookups, [], 'nothing looked up for tokens this server did not make');
  const scope = await a.sandboxScope(ID, real);
  assert.deepEqual([scope.tenant, scope.keyId], ['acme', 'key_aaaaaaaaaaaa']);
});

test('a token of an earlier generation is refused once the grant moved on', async () => {
  const { a, signer } = accounts({ keyId: 'key_aaaaaaaaaaaa', generation: 4 });
  const old = signer.sandboxToken(ID, 'envd', { keyId: 'key_aaaaaaaaaaaa', generation: 3 });
  await assert.rejects(a.sandboxScope(ID, old), /rotated/);
  await a.sandboxScope(ID, signer.sandboxToken(ID, 'envd', { keyId: 'key_aaaaaaaaaaaa', generation: 4 }));
});
