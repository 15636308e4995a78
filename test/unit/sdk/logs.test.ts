/**
 * Both SDKs' sandbox logs against a real API server on the fake service: `sb.logs()` reads what the
 * server wrote (the create, the execs), with level, search, direction, cursor and limit, and a bad
 * value is a ValidationError. The Python half runs python/test_logs.py against the same server.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { fixture, type Fixture } from '../api/helpers.js';
import { Collimate, ValidationError } from '../../../src/sdk/index.js';

let f: Fixture;
let base: string;

before(async () => {
  f = await fixture({ fake: { events: true } });
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
});
after(() => f.close());

test('TypeScript SDK: sb.logs() with level, search, direction, cursor and limit', async () => {
  const client = new Collimate({ baseUrl: base, apiKey: f.key('ts-logs', 'pro') });
  await using sb = await client.sandboxes.create({ template: 'python' });
  await sb.exec({ command: 'echo first' });
  await sb.exec({ command: 'exit 4' });
  const all = await sb.logs();
  assert.deepEqual(all.map((e) => e.fields.event), ['lifecycle', 'exec', 'exec']);
  assert.deepEqual((await sb.logs({ level: 'warn' })).map((e) => e.fields.command), ['exit 4']);
  assert.deepEqual((await sb.logs({ search: 'echo first' })).map((e) => e.level), ['info']);
  assert.deepEqual((await sb.logs({ direction: 'backward', limit: 1 })).map((e) => e.message), [all[2].message]);
  const at = new Date(all[2].timestamp);
  assert.deepEqual((await sb.logs({ cursor: at })).map((e) => e.message), (await sb.logs({ cursor: at.getTime() })).map((e) => e.message));
  assert.ok((await sb.logs({ cursor: at })).length >= 1);
  await assert.rejects(sb.logs({ level: 'loud' as never }), (e: unknown) => e instanceof ValidationError && /level/.test((e as Error).message));
});

test('Python SDK: the same surface (python/test_logs.py against this server)', async () => {
  const script = fileURLToPath(new URL('./python/test_logs.py', import.meta.url));
  const env = { ...process.env, COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: f.key('py-logs', 'pro') };
  const r = await promisify(execFile)('/usr/bin/python3', [script], { env, timeout: 60_000 }).catch((e) => e);
  assert.equal(r.code ?? 0, 0, `${r.stdout}\n${r.stderr}`);
  assert.match(r.stderr, /Ran 1 test[\s\S]*\nOK\s*$/);
});
