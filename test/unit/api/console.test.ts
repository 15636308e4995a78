/**
 * /console serves the bundle's three files with the console's Content-Security-Policy, and nothing
 * else; the bundle builds with the snapshot controls in it; the console's API client reaches the
 * snapshot routes (run against the server, with fetch routed into it).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';
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

/**
 * The console's own modules are browser code outside the root type-check (src/console has its own
 * tsconfig, with the DOM), so they are imported by URL and typed here as far as these tests use them.
 */
interface ConsoleSandbox { id: string; parent: string | null; from_snapshot: string | null }
interface ConsoleSnapshot { id: string; name: string | null; sandbox_id: string; size_bytes: number }
interface ConsoleClient {
  allSnapshots(sandboxId?: string): Promise<ConsoleSnapshot[]>;
  takeSnapshot(sandboxId: string, name?: string): Promise<ConsoleSnapshot>;
  startFromSnapshot(snapshotId: string, count?: number): Promise<ConsoleSandbox[]>;
  rollBack(sandboxId: string, snapshotId: string): Promise<ConsoleSandbox>;
  deleteSnapshot(snapshotId: string): Promise<void>;
}
const CONSOLE_SRC = fileURLToPath(new URL('../../../src/console/', import.meta.url));
const consoleModule = async <T>(file: string): Promise<T> => (await import(new URL(`../../../src/console/${file}`, import.meta.url).href)) as T;

describe('console bundle', () => {
  test('builds from src/console with the snapshot controls and their routes in it', async () => {
    const out = await build({ entryPoints: [join(CONSOLE_SRC, 'app.ts')], bundle: true, format: 'esm', target: 'es2022', minify: true, write: false, logLevel: 'silent' });
    const js = out.outputFiles[0].text;
    for (const s of ['/v1/snapshots', '/snapshots`', '/restore`', 'take-snapshot', 'Take snapshot', 'Start from it', 'Roll back', 'Its current memory, processes and files are discarded', 'Started from snapshot', 'Source sandbox', 'h-snapshots']) {
      assert.ok(js.includes(s), `the bundle lacks ${JSON.stringify(s)}`);
    }
  });

  test('bytes() prints snapshot sizes in binary units', async () => {
    const { bytes } = await consoleModule<{ bytes(n: number): string }>('dom.ts');
    assert.deepEqual([0, 512, 1536, 3.25 * 2 ** 20, 200 * 2 ** 20, 1.5 * 2 ** 30].map(bytes), ['0 B', '512 B', '1.5 KiB', '3.3 MiB', '200 MiB', '1.5 GiB']);
  });
});

describe('console API client: snapshots', () => {
  let f: Fixture;
  let client: ConsoleClient;
  const calls: string[] = [];
  const saved = { fetch: globalThis.fetch, sessionStorage: (globalThis as any).sessionStorage };
  before(async () => {
    f = await fixture();
    const key = f.key('acme', 'pro');
    (globalThis as any).sessionStorage = { getItem: () => key, setItem() {}, removeItem() {} };
    // The browser's fetch, answered by the server in-process: method, path, headers and body as the console sends them.
    globalThis.fetch = (async (input: string, init: RequestInit = {}) => {
      const method = init.method ?? 'GET';
      calls.push(`${method} ${input}${init.body ? ' ' + String(init.body) : ''}`);
      const r = await f.api.app.inject({ method: method as any, url: input, headers: init.headers as Record<string, string>, payload: init.body as string | undefined });
      return new Response(r.statusCode === 204 ? null : r.rawPayload, { status: r.statusCode, headers: { 'content-type': String(r.headers['content-type'] ?? '') } });
    }) as typeof fetch;
    client = await consoleModule<ConsoleClient>('api.ts');
  });
  after(async () => {
    globalThis.fetch = saved.fetch;
    (globalThis as any).sessionStorage = saved.sessionStorage;
    await f.close();
  });

  const sandbox = async () => (await f.req('createSandbox', { url: '/v1/sandboxes', key: f.key('acme', 'pro'), body: { template: 'base' } })).json();
  const last = () => calls[calls.length - 1];

  test('take, list (all, or one sandbox\'s), start 1 and N from one, roll back, delete', async () => {
    const sb = await sandbox();
    const other = await sandbox();
    const named = await client.takeSnapshot(sb.id, 'after-setup');
    assert.equal(last(), `POST /v1/sandboxes/${sb.id}/snapshots {"name":"after-setup"}`);
    assert.equal(named.name, 'after-setup');
    assert.equal(named.sandbox_id, sb.id);
    const unnamed = await client.takeSnapshot(sb.id);
    assert.equal(unnamed.name, null);
    const ofOther = await client.takeSnapshot(other.id);

    assert.deepEqual((await client.allSnapshots(sb.id)).map((s) => s.id).sort(), [named.id, unnamed.id].sort());
    assert.equal(last(), `GET /v1/snapshots?limit=1000&sandbox_id=${sb.id}`);
    assert.deepEqual((await client.allSnapshots()).map((s) => s.id).sort(), [named.id, unnamed.id, ofOther.id].sort());

    const [one, ...none] = await client.startFromSnapshot(named.id);
    assert.deepEqual(none, []);
    assert.equal(one.from_snapshot, named.id);
    assert.equal(one.parent, null);
    const three = await client.startFromSnapshot(named.id, 3);
    assert.equal(last(), `POST /v1/sandboxes {"snapshot":"${named.id}","count":3}`);
    assert.equal(new Set(three.map((s) => s.id)).size, 3);
    assert.ok(three.every((s) => s.from_snapshot === named.id && s.id !== one.id));

    const back = await client.rollBack(sb.id, unnamed.id);
    assert.equal(last(), `POST /v1/sandboxes/${sb.id}/restore {"snapshot":"${unnamed.id}"}`);
    assert.equal(back.id, sb.id);
    assert.equal(back.from_snapshot, unnamed.id);

    await client.deleteSnapshot(unnamed.id);
    assert.equal(last(), `DELETE /v1/snapshots/${unnamed.id}`);
    assert.deepEqual((await client.allSnapshots(sb.id)).map((s) => s.id), [named.id]);
  });

  test('refusals reach the page as the API\'s code and message', async () => {
    const sb = await sandbox();
    const other = await sandbox();
    const s = await client.takeSnapshot(sb.id);
    await assert.rejects(client.rollBack(other.id, s.id), (e: any) => e.status === 409 && e.code === 'snapshot_mismatch' && e.message.length > 0);
    await client.deleteSnapshot(s.id);
    await assert.rejects(client.deleteSnapshot(s.id), (e: any) => e.status === 404 && e.code === 'snapshot_not_found');
    await assert.rejects(client.startFromSnapshot(s.id), (e: any) => e.code === 'snapshot_not_found');
  });
});
