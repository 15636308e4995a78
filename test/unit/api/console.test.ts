/** /console serves the bundle's three files with the console's Content-Security-Policy, and nothing else. */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { CONSOLE_CSP } from '../../../src/api/console.js';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

describe('console', () => {
  let f: Fixture;
  let missing: Fixture;
  before(async () => {
    const dir = mkdtempSync(join(tmpdir(), 'collimate-console-'));
    writeFileSync(join(dir, 'index.html'), '<!doctype html><script type="module" src="/console/console.js"></script>');
    writeFileSync(join(dir, 'console.js'), 'console.log(1)');
    writeFileSync(join(dir, 'console.css'), 'body{}');
    f = await fixture({ server: { consoleDir: dir } });
    missing = await fixture({ server: { consoleDir: join(dir, 'absent') } });
  });
  after(async () => {
    await f.close();
    await missing.close();
  });

  test('index, script and styles with the CSP; /console redirects to /console/', async () => {
    const r = await f.api.app.inject({ url: '/console' });
    assert.equal(r.statusCode, 302);
    assert.equal(r.headers.location, '/console/');
    for (const [url, type] of [['/console/', 'text/html'], ['/console/console.js', 'text/javascript'], ['/console/console.css', 'text/css']]) {
      const res = await f.api.app.inject({ url });
      assert.equal(res.statusCode, 200, url);
      assert.match(String(res.headers['content-type']), new RegExp(`^${type}`));
      assert.equal(res.headers['content-security-policy'], CONSOLE_CSP);
      assert.equal(res.headers['x-content-type-options'], 'nosniff');
    }
    assert.match(CONSOLE_CSP, /script-src 'self'(;|$)/, 'no inline or remote script');
  });

  test('no other file, no traversal, and the API keeps its own headers', async () => {
    for (const url of ['/console/../package.json', '/console/%2e%2e%2fpackage.json', '/console/console.js.LEGAL.txt', '/console/x/y']) {
      const res = await f.api.app.inject({ url });
      assert.equal(res.statusCode, 404, url);
      assertErrorBody(res, 'not_found');
    }
    const api = await f.api.app.inject({ url: '/healthz' });
    assert.equal(api.headers['content-security-policy'], undefined);
  });

  test('an unbuilt console says how to build it', async () => {
    const res = await missing.api.app.inject({ url: '/console/' });
    assertErrorBody(res, 'not_found');
    assert.match(res.json().error.message, /setup\.sh/);
  });
});
