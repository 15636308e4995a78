/**
 * The web console in a real browser (issue 16): Debian's Chromium, headless, driven by playwright-core,
 * against `collimate serve`'s /console on a real engine. Signs in with a key; sees a sandbox created
 * through the API appear within 2 s without a reload; forks it into 3 from the page and sees the tree
 * grow to 4 nodes; types into the web terminal and reads the answer on screen; uploads a file and reads
 * it back with an exec; runs python cells (a value as text, a matplotlib figure as an image, HTML
 * only inside a sandboxed frame); suspends and resumes from the page; charts a sandbox's CPU and memory as its
 * samples arrive, and keeps the history while it is suspended; a second tenant sees none of the first's
 * sandboxes; a key revoked from the keys page is signed out; an environment created from the page
 * streams its bake log until it is ready. Each test saves a screenshot under
 * COLLIMATE_TEST_OUTPUT (default test-output/console).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { ImageService } from '../../src/images/service.ts';
import { busyboxEntries, image, layer, writeLayout } from '../support/oci.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, type Served } from './fixture.ts';

// Functions given to page.evaluate / waitForFunction run in the browser, where these exist (this
// project's type check has no DOM library).
declare const window: any;
declare const document: any;
declare const sessionStorage: any;
type HTMLElement = { dataset: Record<string, string | undefined> };

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const OUTPUT = process.env.COLLIMATE_TEST_OUTPUT ?? join(ROOT, 'test-output', 'console');
/** Lifecycle work on TCG (a fork of three, a resume) takes tens of seconds on a loaded two-core host. */
const SLOW = 180_000;

let engine: Engine;
let images: ImageService;
let api: Served;
let home: string;
let base: string;
let browser: Browser;
let acmeKey: string;
let otherKey: string;
const contexts: BrowserContext[] = [];
/** What the console's pages threw, and what the browser refused under the Content-Security-Policy: none may happen. */
const pageFaults: string[] = [];

/** A REST call as a program would make it, with a tenant key. */
async function rest(method: string, path: string, key: string, body?: unknown): Promise<any> {
  const res = await fetch(new URL(path, base), {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  assert.ok(res.ok, `${method} ${path} → ${res.status} ${text}`);
  return text ? JSON.parse(text) : undefined;
}

/** A fresh browser session (its own sessionStorage) signed in with `key` by typing it and pressing Enter, on the console at `at`. */
async function signedIn(key: string, at = base): Promise<Page> {
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
  contexts.push(context);
  const page = await context.newPage();
  page.on('pageerror', (err) => pageFaults.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.type() === 'error' && /Content Security Policy/i.test(msg.text())) pageFaults.push(`CSP: ${msg.text()}`);
  });
  const pending = new Set<string>();
  const refused: string[] = [];
  const name = (r: { method(): string; url(): string }) => `${r.method()} ${new URL(r.url()).pathname}${new URL(r.url()).search}`;
  page.on('request', (r) => pending.add(name(r)));
  page.on('requestfinished', (r) => pending.delete(name(r)));
  page.on('requestfailed', (r) => (pending.delete(name(r)), refused.push(`${name(r)}: ${r.failure()?.errorText}`)));
  page.on('response', (r) => void (r.status() >= 400 && refused.push(`${name(r.request())} → ${r.status()}`)));
  current = { page, pending, refused };
  await page.goto(`${at}/console/`);
  await page.locator('#key').fill(key);
  await page.locator('#key').press('Enter');
  await page.locator('table#sandboxes').waitFor();
  return page;
}

/** Waits until a line on the terminal's screen (trimmed) matches `line`; on timeout, says what the screen shows. */
async function terminalShows(page: Page, line: RegExp, what: string): Promise<void> {
  const rows = () => page.locator('#terminal .xterm-rows > div').evaluateAll((els) => els.map((e: any) => String(e.textContent ?? '').trim()));
  try {
    await page.waitForFunction(
      (src: string) => [...document.querySelectorAll('#terminal .xterm-rows > div')].some((row: any) => new RegExp(src).test(String(row.textContent ?? '').trim())),
      line.source,
      { timeout: 60_000 },
    );
  } catch (err) {
    await shot(page, 'terminal-failed');
    assert.fail(`the terminal never showed ${what} (${line}); its screen:\n${(await rows()).filter(Boolean).join('\n')}\n${(err as Error).message}`);
  }
}

/** The page the running test signed in last, with what it still waits for and what the server refused. */
let current: { page: Page; pending: Set<string>; refused: string[] } | undefined;
const lastPage = () => current;

/**
 * A browser test: when it fails, its error also says what the page showed, which of its requests
 * never finished and which failed, with a screenshot, so a failure on a loaded CI host explains itself.
 */
function browserTest(name: string, opts: { timeout?: number }, fn: () => Promise<void>): void {
  test(name, opts, async () => {
    current = undefined;
    try {
      await fn();
    } catch (err) {
      const last = lastPage();
      if (!last) throw err;
      const { page, pending, refused } = last;
      const shown = await page.locator('#main').innerText({ timeout: 2000 }).catch((e: Error) => `(unreadable: ${e.message})`);
      await page.screenshot({ path: join(OUTPUT, 'failed.png') }).catch(() => {});
      (err as Error).message +=
        `\n--- the page (${page.url()}) showed:\n${shown}\n--- requests never finished: ${[...pending].join(', ') || 'none'}` +
        `\n--- requests refused or failed: ${refused.join(', ') || 'none'}`;
      throw err;
    }
  });
}

async function shot(page: Page, name: string): Promise<void> {
  await page.screenshot({ path: join(OUTPUT, `${name}.png`), fullPage: false });
}

before(async () => {
  mkdirSync(OUTPUT, { recursive: true });
  await promisify(execFile)(process.execPath, ['--import', 'tsx', join(ROOT, 'scripts/build-console.ts')], { cwd: ROOT });
  home = testHome('console');
  engine = await openEngine(home, { poolSize: 2, catalog: ['base', 'python'] });
  images = new ImageService({ host: engine, db: engine.db, importDir: join(home, 'imports'), storeDir: join(home, 'store'), poolSize: 1 });
  await images.restore();
  api = await serveEngine(engine, { images });
  base = (await api.app.listen({ host: '127.0.0.1', port: 0 })).replace('localhost', '127.0.0.1');
  acmeKey = api.keys.create({ tenant: 'acme', tier: 'pro' }).key;
  otherKey = api.keys.create({ tenant: 'other', tier: 'pro' }).key;
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update'],
  });
});

after(async () => {
  for (const c of contexts) await c.close().catch(() => {});
  await browser?.close();
  await api?.close(1000);
  await images?.close();
  if (engine) await assertNoLeaks(engine, home);
  assert.deepEqual(pageFaults, [], 'the console threw or broke its CSP');
});

let sandboxId: string;

browserTest('a sandbox created through the API shows in the list within 2 s, without a reload', {}, async () => {
  const page = await signedIn(acmeKey);
  // The list is live once its event stream is open; the page shows the (empty) list first.
  await page.locator('text=0 sandboxes').waitFor();
  await page.evaluate(() => ((window as unknown as { marker: number }).marker = 1));
  const created = await rest('POST', '/v1/sandboxes', acmeKey, { template: 'base', labels: { team: 'console' } });
  sandboxId = created.id;
  const t0 = Date.now();
  await page.locator(`tr[data-sandbox="${sandboxId}"]`).waitFor({ timeout: 2000 });
  const waited = Date.now() - t0;
  assert.ok(waited <= 2000, `appeared after ${waited} ms`);
  assert.equal(await page.evaluate(() => (window as unknown as { marker?: number }).marker), 1, 'the page was not reloaded');
  const row = page.locator(`tr[data-sandbox="${sandboxId}"]`);
  assert.equal(await row.getAttribute('data-state'), 'running');
  assert.match(await row.innerText(), /team=console/);
  // Live memory from the host: the VMM of a running sandbox holds some.
  await row.locator('td.mem', { hasText: /^[1-9]\d* MiB$/ }).waitFor();
  // The state filter hides it; the label filter keeps it.
  await page.locator('#filter-state').selectOption('suspended');
  await page.locator('text=0 sandboxes').waitFor();
  await page.locator('#filter-state').selectOption('');
  await page.locator('#filter-label').fill('team=console');
  await page.locator('#filter-label').press('Enter');
  await page.locator('text=1 sandbox').waitFor();
  await shot(page, 'sandboxes-list');
});

browserTest('forking into 3 from the page grows the lineage tree to 4 nodes', { timeout: SLOW }, async () => {
  const page = await signedIn(acmeKey);
  await page.goto(`${base}/console/#/sandboxes/${sandboxId}`);
  await page.locator(`#lineage [data-tree-node="${sandboxId}"]`).waitFor();
  assert.equal(await page.locator('#lineage [data-tree-node]').count(), 1);
  await page.locator('#fork-count').fill('3');
  await page.locator('#fork').click();
  await page.waitForFunction(() => document.querySelectorAll('#lineage [data-tree-node]').length === 4, null, { timeout: SLOW });
  const children = (await rest('GET', `/v1/sandboxes/${sandboxId}`, acmeKey)).children as string[];
  assert.equal(children.length, 3);
  for (const c of children) assert.equal(await page.locator(`#lineage [data-tree-node="${sandboxId}"] ul [data-tree-node="${c}"]`).count(), 1, `${c} under its parent`);
  await shot(page, 'fork-tree');
  // Click through the tree: a child's page shows the same whole tree, itself marked current.
  await page.locator(`#lineage a[href="#/sandboxes/${children[0]}"]`).click();
  await page.locator(`#lineage a[aria-current="page"][href="#/sandboxes/${children[0]}"]`).waitFor();
  assert.equal(await page.locator('#lineage [data-tree-node]').count(), 4);
  for (const c of children) await rest('DELETE', `/v1/sandboxes/${c}`, acmeKey);
});

browserTest('the web terminal runs a shell: echo $((6*7)) prints 42 on screen', { timeout: SLOW }, async () => {
  const page = await signedIn(acmeKey);
  await page.goto(`${base}/console/#/sandboxes/${sandboxId}`);
  await page.locator('#state').waitFor();
  const sockets: string[] = [];
  page.on('websocket', (ws) => sockets.push(ws.url()));
  await page.locator('#open-terminal').click();
  await page.locator('#terminal .xterm-rows').waitFor();
  // The shell's prompt first, so that what is typed is read by the shell.
  await terminalShows(page, /[#$>]$/, 'a prompt');
  await page.locator('#terminal .xterm-helper-textarea').focus();
  await page.keyboard.type('echo $((6*7))');
  await page.keyboard.press('Enter');
  await terminalShows(page, /^42$/, 'the answer');
  // Over the terminal WebSocket, with the key out of its URL (it goes as a subprotocol).
  assert.equal(sockets.length, 1, String(sockets));
  assert.match(sockets[0], /^ws:\/\/127\.0\.0\.1:\d+\/v1\/sandboxes\/sbx_[0-9a-f]{12}\/processes\/\d+\/terminal$/);
  assert.ok(!sockets[0].includes(acmeKey.slice(4)));
  await shot(page, 'terminal');
  await page.locator('#open-terminal').click(); // closes it: the shell is hung up
});

browserTest('a file uploaded from the page reads back through an exec', { timeout: SLOW }, async () => {
  const page = await signedIn(acmeKey);
  await page.goto(`${base}/console/#/sandboxes/${sandboxId}`);
  await page.locator('#files table').waitFor();
  const content = `uploaded from the console ${Date.now()}\n`;
  await page.locator('#upload').setInputFiles({ name: 'hello.txt', mimeType: 'text/plain', buffer: Buffer.from(content) });
  await page.locator('#files tr[data-file="hello.txt"]').waitFor({ timeout: 60_000 });
  await page.locator('#exec-command').fill('cat /root/hello.txt');
  await page.locator('#exec-command').press('Enter');
  await page.waitForFunction(() => (document.querySelector('#exec-output') as HTMLElement | null)?.dataset.exit === '0', null, { timeout: 60_000 });
  assert.equal(await page.locator('#exec-output').textContent(), content);
  // The server's record of it: command, exit code, duration.
  const recorded = page.locator('#execs tr', { hasText: 'cat /root/hello.txt' });
  await recorded.waitFor();
  assert.match(await recorded.innerText(), /^cat \/root\/hello\.txt\s+0\s+\d+ ms/);
  // And the API agrees, byte for byte.
  const r = await rest('POST', `/v1/sandboxes/${sandboxId}/exec`, acmeKey, { command: 'cat /root/hello.txt' });
  assert.equal(r.stdout, content);
  await shot(page, 'files');
});

browserTest("python cells: a value as text, a matplotlib figure as an image, HTML only in a frame sandboxed from the console's origin", { timeout: SLOW }, async () => {
  const py = (await rest('POST', '/v1/sandboxes', acmeKey, { template: 'python' })).id;
  try {
    const page = await signedIn(acmeKey);
    await page.goto(`${base}/console/#/sandboxes/${py}`);
    await page.locator('#state', { hasText: 'running' }).waitFor();
    assert.equal(await page.locator('#code-language').inputValue(), 'python');
    /** Runs a cell with Ctrl+Enter and waits for its end: the submit marks the outputs running before the key press returns. */
    const cell = async (code: string) => {
      await page.locator('#code-input').fill(code);
      await page.locator('#code-input').press('Control+Enter');
      await page.waitForFunction(() => (document.querySelector('#code-outputs') as HTMLElement | null)?.dataset.state !== 'running', null, { timeout: SLOW });
      const outputs = page.locator('#code-outputs');
      assert.equal(await outputs.getAttribute('data-state'), 'done', `${code}: ${await outputs.innerText()} ${await page.locator('#main p.error').allInnerTexts()}`);
      return Number(await outputs.getAttribute('data-count'));
    };

    const first = await cell('1+1');
    assert.ok(first >= 1, `execution count ${first}`);
    assert.equal(await page.locator('#code-count').textContent(), `In [${first}]:`);
    assert.match(await page.locator('#code-outputs .code-output').innerText(), new RegExp(`^Out\\[${first}\\]:\\s+2$`));

    assert.equal(await cell('import matplotlib.pyplot as plt; plt.plot([1,2]); plt.show()'), first + 1, 'the same kernel counts on');
    const img = page.locator('#code-outputs img.code-image');
    assert.match((await img.getAttribute('src')) ?? '', /^data:image\/png;base64,iVBORw0KGgo/);
    // Decoded by the browser: a figure-sized bitmap.
    await page.waitForFunction(() => (document.querySelector('#code-outputs img.code-image') as any)?.naturalWidth > 100, null, { timeout: 10_000 });
    await shot(page, 'code-plot');

    await cell(`from IPython.display import HTML; HTML('<b id="from-cell">bold</b><script>parent.document.title = "pwned"</script>')`);
    const frame = page.locator('#code-outputs iframe.code-html');
    assert.equal(await frame.getAttribute('sandbox'), '', 'a frame with no permissions');
    assert.equal(await page.frameLocator('#code-outputs iframe.code-html').locator('#from-cell').textContent(), 'bold');
    assert.equal(await page.locator('#from-cell').count(), 0, "the cell's markup is not in the console's document");
    assert.notEqual(await page.title(), 'pwned', "the cell's script did not run");
  } finally {
    await rest('DELETE', `/v1/sandboxes/${py}`, acmeKey);
  }
});

browserTest('suspend and resume from the page', { timeout: SLOW }, async () => {
  const page = await signedIn(acmeKey);
  await page.goto(`${base}/console/#/sandboxes/${sandboxId}`);
  await page.locator('#suspend').click();
  await page.locator('#state', { hasText: 'suspended' }).waitFor({ timeout: SLOW });
  assert.equal((await rest('GET', `/v1/sandboxes/${sandboxId}`, acmeKey)).state, 'suspended');
  await shot(page, 'suspended');
  await page.locator('#resume').click();
  await page.locator('#state', { hasText: 'running' }).waitFor({ timeout: SLOW });
  const r = await rest('POST', `/v1/sandboxes/${sandboxId}/exec`, acmeKey, { command: 'cat /root/hello.txt' });
  assert.match(r.stdout, /uploaded from the console/, 'the file survived suspend and resume');
  // Files only: the page says so, and the resume boots it afresh with the file there.
  await page.locator('#suspend-files').click();
  await page.locator('#state', { hasText: 'files only' }).waitFor({ timeout: SLOW });
  assert.equal((await rest('GET', `/v1/sandboxes/${sandboxId}`, acmeKey)).memory_kept, false);
  await page.locator('#resume').click();
  await page.locator('#state', { hasText: 'running' }).waitFor({ timeout: SLOW });
  const again = await rest('POST', `/v1/sandboxes/${sandboxId}/exec`, acmeKey, { command: 'cat /root/hello.txt' });
  assert.match(again.stdout, /uploaded from the console/, 'the file survived a files-only suspend');
  // Its time extended from the page: the session now ends about 20 minutes from now.
  await page.locator('#extend-secs').fill('1200');
  await page.locator('#extend').click();
  await page.locator('#details dd', { hasText: /^in 19m|^in 20m/ }).waitFor();
  const remaining = (await rest('GET', `/v1/sandboxes/${sandboxId}`, acmeKey)).remaining_secs;
  assert.ok(remaining > 1100 && remaining <= 1200, `remaining ${remaining}`);
});

browserTest("the metrics section charts CPU, memory and disk as samples arrive, and keeps the history while suspended", { timeout: SLOW }, async () => {
  const page = await signedIn(acmeKey);
  await page.goto(`${base}/console/#/sandboxes/${sandboxId}`);
  await page.locator('#state', { hasText: 'running' }).waitFor();
  const samples = () => page.evaluate(() => Number((document.querySelector('#metrics-body') as HTMLElement | null)?.dataset.samples ?? 0));
  // The server samples every 5 s while it runs and the page asks as often, so the count grows without a reload.
  await page.waitForFunction(() => Number((document.querySelector('#metrics-body') as HTMLElement | null)?.dataset.samples ?? 0) >= 2, null, { timeout: 60_000 });
  const seen = await samples();
  await page.waitForFunction((n: number) => Number((document.querySelector('#metrics-body') as HTMLElement | null)?.dataset.samples ?? 0) > n, seen, { timeout: 60_000 });

  for (const id of ['chart-cpu', 'chart-memory', 'chart-disk']) {
    const chart = page.locator(`svg#${id}`);
    // A drawn series: a line through joined samples, or a dot for one left alone (its neighbours missing or far apart).
    const d = (await chart.locator('path.series').getAttribute('d')) ?? '';
    const dots = await chart.locator('circle.series-dot').count();
    assert.ok(/^M\d+(\.\d)?,\d+(\.\d)?L/.test(d) || dots > 0, `${id} draws no series: d=${JSON.stringify(d)}, ${dots} dots`);
    // Every drawn point lies inside the 560 × 200 viewBox.
    for (const [x, y] of [...d.matchAll(/[ML]([\d.]+),([\d.]+)/g)].map((m) => [Number(m[1]), Number(m[2])])) assert.ok(x >= 0 && x <= 560 && y >= 0 && y <= 200, `${id}: ${x},${y}`);
    assert.equal(await chart.getAttribute('role'), 'img');
    assert.match((await chart.getAttribute('aria-label')) ?? '', /\d+ samples: latest .+, peak .+/);
    assert.ok((await chart.locator('text.x-label').count()) >= 1, `${id} has time labels`);
    assert.ok((await chart.locator('text.y-label').count()) >= 2, `${id} has value labels`);
  }
  // The latest values, as text: the memory of a sample the API served (read after the page, so it has them all), the allotment, a CPU percentage.
  const cell = (metric: string, col: number) => page.locator(`#metrics-latest tr[data-metric="${metric}"] td`).nth(col).innerText();
  const memory = await cell('memory', 0);
  const sandbox = await rest('GET', `/v1/sandboxes/${sandboxId}`, acmeKey);
  const served: Array<{ memory_mib: number; disk_used_bytes: number | null; disk_total_bytes: number | null }> = (await rest('GET', `/v1/sandboxes/${sandboxId}/metrics`, acmeKey)).samples;
  assert.ok(served.length >= (await samples()), 'the page shows no more samples than the API has');
  const mib = (n: number) => (n < 1024 ? `${n} MiB` : n < 10240 ? `${(n / 1024).toFixed(1)} GiB` : `${Math.round(n / 1024)} GiB`);
  assert.ok(served.some((s) => s.memory_mib > 0 && mib(s.memory_mib) === memory), `memory shows ${JSON.stringify(memory)}, not a sample's`);
  assert.equal(await cell('memory', 2), mib(sandbox.memory_mib));
  assert.match(await cell('cpu', 0), /^(\d+(\.\d)? %|—)$/);
  assert.match(await cell('cpu', 1), /^\d+(\.\d)? %$/);
  // Disk as the guest's df says it, in the page's units (src/console/dom.ts bytes).
  const bytes = (n: number) => { let i = 0; for (; n >= 1024 && i < 4; i++) n /= 1024; return i === 0 ? `${n} B` : `${n < 10 ? n.toFixed(1) : Math.round(n)} ${['B', 'KiB', 'MiB', 'GiB', 'TiB'][i]}`; };
  const disk = await cell('disk', 0);
  assert.ok(served.some((s) => s.disk_used_bytes !== null && s.disk_used_bytes > 0 && bytes(s.disk_used_bytes) === disk), `disk shows ${JSON.stringify(disk)}, not a sample's`);
  const size = served.findLast((s) => s.disk_total_bytes !== null)!.disk_total_bytes!;
  assert.ok(size <= sandbox.disk_mib * 1048576, `a root file system of ${size} bytes on a ${sandbox.disk_mib} MiB disk`);
  assert.equal(await cell('disk', 2), bytes(size));
  await shot(page, 'metrics');

  // Suspended: no samples are taken, the history stays on the page.
  await rest('POST', `/v1/sandboxes/${sandboxId}/suspend`, acmeKey);
  await page.locator('#metrics-paused').waitFor({ timeout: SLOW });
  const kept = await samples();
  assert.ok(kept >= seen + 1, `the history is kept: ${kept} samples`);
  assert.ok(((await page.locator('svg#chart-memory path.series').getAttribute('d')) ?? '') !== '' || (await page.locator('svg#chart-memory circle.series-dot').count()) > 0);
  await shot(page, 'metrics-suspended');
  await rest('POST', `/v1/sandboxes/${sandboxId}/resume`, acmeKey);
  await page.locator('#state', { hasText: 'running' }).waitFor({ timeout: SLOW });
  // Running again, it asks again: new samples join the history.
  await page.waitForFunction((n: number) => Number((document.querySelector('#metrics-body') as HTMLElement | null)?.dataset.samples ?? 0) > n, kept, { timeout: 60_000 });
});

browserTest('a server in the sandbox shows among its ports, with a signed URL that needs no key', { timeout: SLOW }, async () => {
  await rest('POST', `/v1/sandboxes/${sandboxId}/exec`, acmeKey, { command: 'mkdir -p /root/www && echo served-by-busybox > /root/www/index.html' });
  await rest('POST', `/v1/sandboxes/${sandboxId}/processes`, acmeKey, { argv: ['busybox', 'httpd', '-f', '-p', '8000', '-h', '/root/www'] });
  const page = await signedIn(acmeKey);
  await page.goto(`${base}/console/#/sandboxes/${sandboxId}`);
  // The page reads the ports when it loads the sandbox: reload it until the server listens.
  const deadline = Date.now() + 60_000;
  while (!(await page.locator('#ports li', { hasText: '8000/tcp' }).count())) {
    assert.ok(Date.now() < deadline, 'port 8000 never showed');
    await page.reload();
    await page.locator('#state').waitFor();
  }
  await page.locator('#ports li', { hasText: '8000/tcp' }).locator('button').click();
  const link = page.locator('#ports a[href*="/v1/p/"]');
  await link.waitFor();
  const href = (await link.getAttribute('href'))!;
  const res = await fetch(href);
  assert.equal(res.status, 200);
  assert.equal(await res.text(), 'served-by-busybox\n');
  await shot(page, 'ports');
});

browserTest("a sandbox's page cannot read the console's key, open the console to read it, or register a service worker on the console's origin", { timeout: SLOW }, async () => {
  // The attack a sandbox's owner (or anyone who controls its web server) could mount on whoever opens its signed URL.
  const attack = `<!doctype html><body><script>
window.attack = (async () => {
  const r = {};
  try { r.storage = String(sessionStorage.getItem('collimate.key')); } catch (e) { r.storage = 'blocked: ' + e.name; }
  try { await navigator.serviceWorker.register('sw.js'); r.sw = 'registered at ' + location.origin; } catch (e) { r.sw = 'blocked: ' + e.name; }
  try {
    const w = window.open('/console/');
    await new Promise((ok) => setTimeout(ok, 2000));
    r.popup = w ? String(w.sessionStorage.getItem('collimate.key')) : 'blocked: no window';
    w && w.close();
  } catch (e) { r.popup = 'blocked: ' + e.name; }
  return r;
})();
</script></body>`;
  await rest('POST', `/v1/sandboxes/${sandboxId}/exec`, acmeKey, {
    command: `cat > /root/www/attack.html <<'EOF'\n${attack}\nEOF\necho "self.addEventListener('fetch', () => {});" > /root/www/sw.js`,
  });
  const { url } = await rest('POST', `/v1/sandboxes/${sandboxId}/port-urls`, acmeKey, { port: 8000 });
  const stolen = async (page: Page, where: string) => {
    assert.equal(await page.evaluate(() => sessionStorage.getItem('collimate.key')), acmeKey, 'the console holds the key in this tab');
    await page.goto(`${where}${url}attack.html`);
    const got = await page.evaluate(() => (window as unknown as { attack: Promise<Record<string, string>> }).attack);
    for (const [what, v] of Object.entries(got)) assert.ok(!v.includes(acmeKey), `${what}: the page read the key (${where})`);
    return got;
  };

  // The console addressed as localhost: the signed URL takes the browser to the port's own origin.
  const local = base.replace('127.0.0.1', 'localhost');
  const onLocalhost = await signedIn(acmeKey, local);
  const own = await stolen(onLocalhost, local);
  assert.equal(new URL(onLocalhost.url()).hostname, `8000-${sandboxId}.localhost`);
  assert.equal(own.storage, 'null', "its origin's storage is its own");

  // Addressed by IP there is no origin per port: the page is answered on the console's origin, where it runs in an opaque origin.
  const onIp = await signedIn(acmeKey);
  const shared = await stolen(onIp, base);
  for (const [what, v] of Object.entries(shared)) assert.match(v, /^blocked: /, `${what} on the console's origin: ${v}`);

  for (const [page, at] of [[onLocalhost, local], [onIp, base]] as const) {
    await page.goto(`${at}/console/`);
    assert.equal(await page.evaluate(async () => (await (globalThis as any).navigator.serviceWorker.getRegistrations()).length), 0, `no service worker on the console's origin ${at}`);
  }
});

browserTest('usage shows the tier, its cap and concurrency, and a chart per day', {}, async () => {
  const page = await signedIn(acmeKey);
  await page.locator('nav a[href="#/usage"]').click();
  const limits = await rest('GET', '/v1/limits', acmeKey);
  await page.locator('#limits dd', { hasText: `${limits.running} of no cap` }).waitFor();
  assert.match(await page.locator('#limits').innerText(), /Tier\s+pro/);
  await page.locator('#chart-days canvas').waitFor();
  await page.locator('#per-template tr', { hasText: 'base' }).waitFor();
  await page.locator('#chart-templates canvas').waitFor();
  await shot(page, 'usage');
});

browserTest('delete from the page is confirmed first', {}, async () => {
  const doomed = (await rest('POST', '/v1/sandboxes', acmeKey, { template: 'base' })).id;
  const page = await signedIn(acmeKey);
  await page.goto(`${base}/console/#/sandboxes/${doomed}`);
  await page.locator('#delete').click();
  assert.equal((await rest('GET', `/v1/sandboxes/${doomed}`, acmeKey)).state, 'running', 'not deleted before the confirmation');
  await page.locator('#delete-confirm').click();
  await page.locator('table#sandboxes').waitFor();
  await page.locator(`tr[data-sandbox="${doomed}"]`).waitFor({ state: 'detached' });
  const res = await fetch(new URL(`/v1/sandboxes/${doomed}`, base), { headers: { authorization: `Bearer ${acmeKey}` } });
  assert.equal(res.status, 404);
});

browserTest("a second tenant's key never shows the first tenant's sandboxes", {}, async () => {
  const page = await signedIn(otherKey);
  await page.locator('text=0 sandboxes').waitFor();
  assert.equal(await page.locator('tr[data-sandbox]').count(), 0);
  // A change to acme's sandbox reaches acme's stream only: the other list stays empty.
  await rest('POST', `/v1/sandboxes/${sandboxId}/timeout`, acmeKey, { timeout_secs: 1200 });
  const created = await rest('POST', '/v1/sandboxes', otherKey, { template: 'base' });
  await page.locator(`tr[data-sandbox="${created.id}"]`).waitFor({ timeout: 2000 });
  assert.deepEqual(await page.locator('tr[data-sandbox]').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-sandbox'))), [created.id]);
  // Asking for acme's sandbox by id is as if it did not exist.
  await page.goto(`${base}/console/#/sandboxes/${sandboxId}`);
  await page.locator('text=This sandbox no longer exists.').waitFor();
  assert.equal(await page.locator(`#lineage [data-tree-node="${sandboxId}"]`).count(), 0);
  await shot(page, 'other-tenant');
  await rest('DELETE', `/v1/sandboxes/${created.id}`, otherKey);
});

browserTest('a key revoked from the keys page is signed out', {}, async () => {
  const second = await rest('POST', '/v1/keys', acmeKey, { name: 'browser' });
  const page = await signedIn(second.key);
  await page.locator('nav a[href="#/keys"]').click();
  await page.locator(`tr[data-key="${second.record.id}"]`).waitFor();
  await page.locator(`button[data-revoke="${second.record.id}"]`).click();
  await page.locator(`button[data-revoke-confirm="${second.record.id}"]`).click();
  await page.locator('form.signin').waitFor();
  assert.match(await page.locator('form.signin').innerText(), /refused/);
  assert.equal(await page.evaluate(() => sessionStorage.length), 0, 'the key is gone from the session');
  await shot(page, 'signed-out');
  // Revoked for programs too, and the first key still works.
  const res = await fetch(new URL('/v1/sandboxes', base), { headers: { authorization: `Bearer ${second.key}` } });
  assert.equal(res.status, 401);
  await rest('DELETE', `/v1/sandboxes/${sandboxId}`, acmeKey);
});

browserTest('an environment created from the page streams its bake log until it is ready', { timeout: 600_000 }, async () => {
  // An image of the tenant's own (a busybox layer), registered through the API as a program would.
  const marker = `${Date.now()}-${process.pid}`;
  const img = image([layer([...busyboxEntries(), { name: 'etc/console-marker', data: `console ${marker}\n` }], 'gzip')], { Env: ['PATH=/usr/sbin:/usr/bin:/sbin:/bin'] });
  const registered = await rest('POST', '/v1/images', acmeKey, { source: { kind: 'oci-layout', path: writeLayout(join(home, 'imports', 'console'), img) } });
  const deadline = Date.now() + 300_000;
  while ((await rest('GET', `/v1/images/${registered.id}`, acmeKey)).state === 'pulling') {
    assert.ok(Date.now() < deadline, 'the image was not registered within 5 minutes');
    await new Promise((r) => setTimeout(r, 250));
  }
  assert.equal((await rest('GET', `/v1/images/${registered.id}`, acmeKey)).state, 'ready');

  const page = await signedIn(acmeKey);
  await page.locator('nav a[href="#/templates"]').click();
  await page.locator(`#env-image option[value="${registered.id}"]`).waitFor({ state: 'attached' });
  await page.locator('#env-name').fill('console-env');
  await page.locator('#env-image').selectOption(registered.id);
  await page.locator('#env-ready').fill('echo ready-from-the-console; cat /etc/console-marker');
  await page.locator('#env-egress').selectOption('none');
  await page.locator('#env-secrets').fill('API_TOKEN=never-shown-again');
  await page.locator('#create-environment button[type="submit"]').click();
  // The log grows on the page while it bakes, and the stream ends with the bake.
  await page.locator('#bake-log', { hasText: 'ready-from-the-console' }).waitFor({ timeout: 540_000 });
  await page.waitForFunction(() => (document.querySelector('#bake-log') as HTMLElement | null)?.dataset.state !== undefined, null, { timeout: 540_000 });
  assert.equal(await page.locator('#bake-log').getAttribute('data-state'), 'ready', await page.locator('#bake-log').textContent() ?? '');
  assert.match(await page.locator('#bake-log').textContent() ?? '', new RegExp(`console ${marker}`));
  assert.equal(await page.locator('#env-secrets').inputValue(), '', 'the secret left the form with the request');
  const env = await rest('GET', '/v1/environments/console-env', acmeKey);
  assert.deepEqual(env.secret_names, ['API_TOKEN']);
  assert.equal(env.egress, 'none');
  assert.ok(!(await page.content()).includes('never-shown-again'), 'the secret value is not on the page');
  await page.locator('tr[data-environment="console-env"]', { hasText: 'ready' }).waitFor();
  await shot(page, 'environment-baked');
  await rest('DELETE', '/v1/environments/console-env', acmeKey);
  await rest('DELETE', `/v1/images/${registered.id}`, acmeKey);
});
