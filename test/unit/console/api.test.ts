/**
 * The console's API client (src/console/api.ts) outside a browser: a read that the browser dropped
 * before any answer (ERR_NETWORK_CHANGED surfaces as a TypeError from fetch) is sent again; a write
 * never is, and an answer (even an error) is never repeated.
 */
import assert from 'node:assert/strict';
import { afterEach, beforeEach, test } from 'node:test';

/** The module, loaded by a path the type checker does not follow: it is browser code (the console's own tsconfig checks it, with the DOM's types). */
const load = (): Promise<{ api: (method: string, path: string, body?: unknown) => Promise<unknown> }> => import(String(new URL('../../../src/console/api.ts', import.meta.url)));
const realFetch = globalThis.fetch;
let calls: Array<{ url: string; method: string }> = [];
let failures = 0;

beforeEach(() => {
  calls = [];
  (globalThis as { sessionStorage?: unknown }).sessionStorage = { getItem: () => 'clm_test', setItem: () => {}, removeItem: () => {} };
  globalThis.fetch = (async (url: string, init: RequestInit = {}) => {
    calls.push({ url, method: init.method ?? 'GET' });
    if (failures > 0) {
      failures--;
      throw new TypeError('Failed to fetch');
    }
    return new Response(JSON.stringify({ ok: true }), { status: 200, headers: { 'content-type': 'application/json' } });
  }) as typeof fetch;
});
afterEach(() => {
  globalThis.fetch = realFetch;
  failures = 0;
});

test('a read dropped before any answer is sent again, up to twice', async () => {
  const { api } = await load();
  failures = 2;
  assert.deepEqual(await api('GET', '/v1/sandboxes?limit=1000'), { ok: true });
  assert.equal(calls.length, 3);
  failures = 3;
  await assert.rejects(api('GET', '/v1/sandboxes'), /Failed to fetch/);
  assert.equal(calls.length, 6, 'three tries, then the failure stands');
});

test('a write is never sent again', async () => {
  const { api } = await load();
  failures = 1;
  await assert.rejects(api('POST', '/v1/sandboxes/sbx_000000000000/fork', { count: 3 }), /Failed to fetch/);
  assert.deepEqual(calls.map((c) => c.method), ['POST']);
});
