/**
 * envd's multipart upload (src/e2b/envd.ts POST /files) given a body that is not multipart as
 * declared: the door fuzz (test/integration/doorFuzz.ts) sent one cut after its first boundary, and
 * the parser's error reached the client as a 500 internal_error.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { e2bKeyOf } from '../../../src/service/keys.js';
import { fixture, type Fixture } from '../api/helpers.js';

let f: Fixture;
let base: string;
let headers: Record<string, string>;

before(async () => {
  f = await fixture();
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  const key = f.key('uploader', 'pro');
  const id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
  const connected = await fetch(`${base}/e2b/api/sandboxes/${id}/connect`, { method: 'POST', headers: { 'x-api-key': e2bKeyOf(key), 'content-type': 'application/json' }, body: '{}' });
  headers = { 'e2b-sandbox-id': id, 'x-access-token': ((await connected.json()) as { envdAccessToken: string }).envdAccessToken };
});
after(() => f.close());

test('a malformed multipart upload is 400 in envd\'s shape, not an internal error', async () => {
  for (const body of ['--b\r\nbroken', '--b\r\nContent-Disposition: form-data; name="file"; filename="/tmp/x"\r\n\r\nno closing boundary', 'no multipart at all']) {
    const res = await fetch(`${base}/e2b/envd/files`, { method: 'POST', headers: { ...headers, 'content-type': 'multipart/form-data; boundary=b' }, body });
    const answer = (await res.json()) as { code: number; message: string };
    assert.equal(res.status, 400, `${JSON.stringify(body)}: ${JSON.stringify(answer)}`);
    assert.equal(answer.code, 400);
    assert.match(answer.message, /multipart/);
  }
});
