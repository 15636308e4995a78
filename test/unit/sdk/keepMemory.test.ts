/**
 * Both SDKs' suspend that keeps only the files (`keep_memory`), against the API server on the fake
 * engine: the create's default, the suspend's own choice, and `memory_kept` as the server says it.
 * The suspend itself on real VMs is in test/integration/api.test.ts.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { fixture, type Fixture } from '../api/helpers.js';
import { Collimate } from '../../../src/sdk/index.js';

let f: Fixture;
let base: string;

before(async () => {
  f = await fixture();
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
});
after(() => f.close());

test('TypeScript SDK: keepMemory at create is every suspend\'s default; suspend({keepMemory}) chooses for itself', async () => {
  const client = new Collimate({ baseUrl: base, apiKey: f.key('ts-keep', 'pro') });
  await using sb = await client.sandboxes.create({ template: 'base', keepMemory: false });
  assert.deepEqual([sb.info.keep_memory, sb.info.memory_kept], [false, null]);
  await sb.suspend();
  assert.deepEqual([sb.info.state, sb.info.memory_kept], ['suspended', false]);
  await sb.resume();
  assert.equal(sb.info.memory_kept, null);
  await sb.suspend({ keepMemory: true });
  assert.equal(sb.info.memory_kept, true);
  await using plain = await client.sandboxes.create({ template: 'base' });
  assert.equal(plain.info.keep_memory, true);
  await plain.suspend({ keepMemory: false });
  assert.equal(plain.info.memory_kept, false);
});

test('Python SDK: create(keep_memory=False) and suspend(keep_memory=) (python/test_keep_memory.py against this server)', async () => {
  const script = fileURLToPath(new URL('./python/test_keep_memory.py', import.meta.url));
  const env = { ...process.env, COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: f.key('py-keep', 'pro') };
  const r = await promisify(execFile)('/usr/bin/python3', [script], { env, timeout: 60_000 }).catch((e) => e);
  assert.equal(r.code ?? 0, 0, `${r.stdout}\n${r.stderr}`);
  assert.match(r.stderr, /Ran 1 test[\s\S]*\nOK\s*$/);
});
