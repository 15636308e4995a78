/**
 * Both SDKs' lease (sandbox.setTimeout / set_timeout) against a real API server on the fake service:
 * the new end shows in the handle's info, the tier's maximum is a TierForbiddenError carrying what is
 * left, a suspended sandbox is an InvalidStateError. The Python half runs python/test_timeout.py.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { fixture, type Fixture } from '../api/helpers.js';
import { Collimate, InvalidStateError, TierForbiddenError, ValidationError } from '../../../src/sdk/index.js';

let f: Fixture;
let base: string;

before(async () => {
  f = await fixture();
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
});
after(() => f.close());

test('TypeScript SDK: setTimeout moves expires_at; past the tier maximum and while suspended it throws', async () => {
  const client = new Collimate({ baseUrl: base, apiKey: f.key('ts-lease') });
  await using sb = await client.sandboxes.create({ template: 'base', timeoutSecs: 60 });
  assert.ok(sb.info.remaining_secs !== null && sb.info.remaining_secs <= 60);
  const before = Date.now();
  assert.equal(await sb.setTimeout(600), sb);
  assert.ok(Date.parse(sb.info.expires_at) >= before + 600_000 && Date.parse(sb.info.expires_at) <= Date.now() + 600_000, sb.info.expires_at);
  assert.ok(sb.info.remaining_secs! > 599);
  assert.equal(sb.info.timeout_secs, 60);
  await sb.setTimeout(5);
  assert.ok(sb.info.remaining_secs! <= 5);

  const refused = await sb.setTimeout(901).then(() => null, (e: unknown) => e);
  assert.ok(refused instanceof TierForbiddenError, String(refused));
  assert.equal(refused.code, 'tier_forbidden');
  assert.ok(typeof refused.details.max_timeout_secs === 'number' && refused.details.max_timeout_secs > 890 && refused.details.max_timeout_secs <= 900);
  assert.equal(refused.details.max_session_secs, 900);
  await assert.rejects(sb.setTimeout(0), ValidationError);

  await sb.suspend();
  assert.equal(sb.info.remaining_secs, null);
  await assert.rejects(sb.setTimeout(60), InvalidStateError);
});

test('Python SDK: set_timeout, the same surface (python/test_timeout.py against this server)', async () => {
  const script = fileURLToPath(new URL('./python/test_timeout.py', import.meta.url));
  const env = { ...process.env, COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: f.key('py-lease') };
  const r = await promisify(execFile)('/usr/bin/python3', [script], { env, timeout: 60_000 }).catch((e) => e);
  assert.equal(r.code ?? 0, 0, `${r.stdout}\n${r.stderr}`);
  assert.match(r.stderr, /Ran 1 test[\s\S]*\nOK\s*$/);
});
