/**
 * A cluster host's key cache (src/cluster/keys.ts KeyCache) against a counting stand-in for the
 * cluster database: what a key that does not exist costs.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ClusterKeys, KeyCache } from '../../../src/cluster/keys.js';
import { newApiKey } from '../../../src/service/keys.js';
import { openDb } from '../../../src/store/db.js';

/** The cluster's key table as the cache sees it: every key unknown, every lookup counted. */
function counting() {
  const asked: string[] = [];
  const keys = Object.assign(Object.create(ClusterKeys.prototype) as ClusterKeys, {
    authenticate: async (key: string) => {
      asked.push(key);
      return null;
    },
  });
  return { keys, asked };
}

test('"no such key" is remembered, and made-up keys beyond the lookup budget are refused without asking the database', async () => {
  const { keys, asked } = counting();
  const cache = new KeyCache(openDb(':memory:'), keys, 0, 600_000, 5);
  const unknown = newApiKey();
  for (let i = 0; i < 10; i++) await cache.load(unknown);
  assert.equal(asked.length, 1, 'a negative answer holds (refresh 0 applies to known keys only)');
  assert.equal(cache.authenticate(unknown), null);
  // A flood of distinct made-up keys: the budget (5 here) is asked, the rest cost a hash each.
  for (let i = 0; i < 100; i++) await cache.load(newApiKey());
  assert.ok(asked.length <= 1 + 5 + 1, `asked ${asked.length} times`);
  for (let i = 0; i < 100; i++) assert.equal(cache.authenticate(newApiKey()), null);
});
