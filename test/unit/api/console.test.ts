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

/**
 * Just enough of the DOM for the console's element builder (src/console/dom.ts) and the snapshot
 * table: elements with attributes, children, listeners and the reflected properties it uses.
 */
class FakeNode {
  parent: FakeElement | null = null;
  get textContent(): string { return ''; }
}
class FakeText extends FakeNode {
  constructor(readonly data: string) { super(); }
  override get textContent(): string { return this.data; }
}
class FakeElement extends FakeNode {
  readonly attrs = new Map<string, string>();
  children: FakeNode[] = [];
  readonly listeners = new Map<string, Array<(e: unknown) => unknown>>();
  private typed: string | undefined;
  constructor(readonly tagName: string) { super(); }
  setAttribute(k: string, v: string): void { this.attrs.set(k, v); }
  removeAttribute(k: string): void { this.attrs.delete(k); }
  getAttribute(k: string): string | null { return this.attrs.get(k) ?? null; }
  get hidden(): boolean { return this.attrs.has('hidden'); }
  set hidden(v: boolean) { if (v) this.attrs.set('hidden', ''); else this.attrs.delete('hidden'); }
  get disabled(): boolean { return this.attrs.has('disabled'); }
  set disabled(v: boolean) { if (v) this.attrs.set('disabled', ''); else this.attrs.delete('disabled'); }
  get value(): string { return this.typed ?? this.attrs.get('value') ?? ''; }
  set value(v: string) { this.typed = v; }
  override get textContent(): string { return this.children.map((c) => c.textContent).join(''); }
  set textContent(v: string) { this.replaceChildren(v); }
  append(...nodes: Array<FakeNode | string>): void {
    for (const n of nodes) {
      const node = typeof n === 'string' ? new FakeText(n) : n;
      node.parent = this;
      this.children.push(node);
    }
  }
  replaceChildren(...nodes: Array<FakeNode | string>): void {
    this.children = [];
    this.append(...nodes);
  }
  addEventListener(type: string, fn: (e: unknown) => unknown): void { this.listeners.set(type, [...(this.listeners.get(type) ?? []), fn]); }
  /** Runs the listeners and waits for what they started (the console's handlers are async). */
  async click(): Promise<void> { await Promise.all((this.listeners.get('click') ?? []).map((fn) => fn({ preventDefault() {} }))); }
  focus(): void {}
  hasClass(c: string): boolean { return (this.attrs.get('class') ?? '').split(' ').includes(c); }
  closest(sel: string): FakeElement | null {
    assert.match(sel, /^\.[\w-]+$/, 'the fake DOM knows class selectors only');
    for (let e: FakeElement | null = this; e; e = e.parent) if (e.hasClass(sel.slice(1))) return e;
    return null;
  }
  /** Every element below this one that `pred` accepts, in document order. */
  all(pred: (e: FakeElement) => boolean): FakeElement[] {
    return this.children.flatMap((c) => (c instanceof FakeElement ? [...(pred(c) ? [c] : []), ...c.all(pred)] : []));
  }
  one(pred: (e: FakeElement) => boolean, what: string): FakeElement {
    const found = this.all(pred);
    assert.equal(found.length, 1, `one ${what}`);
    return found[0];
  }
}
const byClass = (c: string) => (e: FakeElement) => e.hasClass(c);
const button = (text: string) => (e: FakeElement) => e.tagName === 'button' && e.textContent === text;

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

  test('the snapshot table: start N with links to them, roll back only after the confirm, delete, and refusals shown', async () => {
    const g = globalThis as any;
    const savedDom = { document: g.document, Node: g.Node };
    g.document = { createElement: (tag: string) => new FakeElement(tag) };
    g.Node = FakeNode;
    try {
      const { snapshotTable } = await consoleModule<{ snapshotTable(list: ConsoleSnapshot[], o: unknown): FakeElement }>('pages/snapshots.ts');
      const sb = await sandbox();
      const s = await client.takeSnapshot(sb.id, 'base-state');
      const failures: any[] = [];
      let reloads = 0;
      const render = (sandboxes: Map<string, unknown>) => snapshotTable([s], {
        sandboxes, showSource: true, fail: (e: unknown) => failures.push(e), before() {}, after: () => void reloads++,
      });

      const table = render(new Map([[sb.id, sb]]));
      const row = table.one((e) => e.getAttribute('data-snapshot') === s.id, 'row');
      assert.match(row.textContent, /base-state/);
      assert.equal(row.one((e) => e.tagName === 'a', 'source link').getAttribute('href'), `#/sandboxes/${sb.id}`);

      row.one(byClass('start-count'), 'count').value = '2';
      calls.length = 0;
      await row.one(button('Start from it'), 'start').click();
      assert.deepEqual(calls, [`POST /v1/sandboxes {"snapshot":"${s.id}","count":2}`]);
      const links = row.one(byClass('started'), 'started').all((e) => e.tagName === 'a');
      assert.equal(links.length, 2);
      assert.ok(links.every((a) => /^#\/sandboxes\/sbx_/.test(a.getAttribute('href')!)));

      const confirmBox = row.one((e) => e.hasClass('confirm') && /^Roll /.test(e.getAttribute('aria-label')!), 'roll back confirmation');
      assert.ok(confirmBox.hidden);
      assert.match(confirmBox.textContent, /discarded/);
      calls.length = 0;
      await row.one(button('Roll back…'), 'roll back').click();
      assert.equal(confirmBox.hidden, false);
      assert.deepEqual(calls, [], 'asking does not roll back');
      await row.one(button('Yes, roll back'), 'confirm').click();
      assert.deepEqual(calls, [`POST /v1/sandboxes/${sb.id}/restore {"snapshot":"${s.id}"}`]);
      assert.ok(confirmBox.hidden);
      assert.equal(reloads, 1);

      // A snapshot whose sandbox is gone: no rollback, the source marked deleted.
      const orphan = render(new Map());
      assert.equal(orphan.all(button('Roll back…')).length, 0);
      assert.match(orphan.textContent, new RegExp(`${sb.id} \\(deleted\\)`));

      await row.one(button('Yes, delete'), 'delete confirm').click();
      assert.equal(last(), `DELETE /v1/snapshots/${s.id}`);
      assert.equal(reloads, 2);
      await row.one(button('Yes, delete'), 'delete confirm').click();
      assert.equal(failures.length, 1);
      assert.equal(failures[0].code, 'snapshot_not_found');
      assert.equal(reloads, 2, 'no reload after a refusal');

      assert.match(snapshotTable([], { sandboxes: new Map(), showSource: true, fail() {}, before() {}, after() {} }).textContent, /No snapshots/);
    } finally {
      g.document = savedDom.document;
      g.Node = savedDom.Node;
    }
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
