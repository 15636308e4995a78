/**
 * The code interpreter on real microVMs (docs/code.md): stateful kernels in the python and node
 * templates through REST — state across cells, a matplotlib figure as a PNG that decodes, an
 * exception's traceback, an interrupt of an endless loop, contexts, a seeded cell replayed — and
 * kept through suspend/resume and live fork (three children of a kernel holding a DataFrame each
 * change it their own way); the first cell of an image whose template baked no interpreter starts
 * it; an image without python3 is told so; E2B's `@e2b/code-interpreter`, unmodified, runs its
 * README example and a chart through the E2B door.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { inflateSync } from 'node:zlib';
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, type Served } from './fixture.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

let engine: Engine;
let api: Served;
let home: string;
let base: string;
let key: string;
let e2bKey: string;

async function call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; json: any; text: string }> {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json: any;
  try { json = text ? JSON.parse(text) : undefined; } catch { json = undefined; }
  return { status: res.status, json, text };
}

async function create(template: string): Promise<string> {
  const r = await call('POST', '/v1/sandboxes', { template });
  assert.equal(r.status, 201, r.text);
  return r.json.id;
}

async function run(id: string, body: Record<string, unknown>): Promise<any> {
  const r = await call('POST', `/v1/sandboxes/${id}/code`, body);
  await expectStatus(r, 200, id);
  return r.json;
}

/** The guest's state for a failure's message: the interpreter's log, with every server thread's stack appended (SIGUSR1), and its memory. */
const GUEST_STATE = 'kill -USR1 "$(cat /run/collimate/code/pid)"; sleep 1; tail -n 120 /run/collimate/code/server.log; head -n 3 /proc/meminfo';

/** GUEST_STATE of sandbox `id`, read through the REST API. */
async function guestState(id: string): Promise<string> {
  const r = await call('POST', `/v1/sandboxes/${id}/exec`, { command: GUEST_STATE, timeout: 30 });
  return `\n--- guest ---\n${r.json?.stdout ?? r.text}`;
}

/** Fails with the answer and the guest's state (read only then) unless the answer has `status`. */
async function expectStatus(r: { status: number; text: string }, status: number, id: string): Promise<void> {
  if (r.status !== status) assert.fail(`${r.status} !== ${status}: ${r.text}${await guestState(id)}`);
}

/** A cell run with its events streamed (SSE): read until a text shows, then to the end. */
async function streamCell(id: string, body: Record<string, unknown>): Promise<{ until(text: string): Promise<void>; rest(): Promise<string> }> {
  const res = await fetch(`${base}/v1/sandboxes/${id}/code`, {
    method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify(body),
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let sse = '';
  return {
    async until(text) {
      while (!sse.includes(text)) {
        const { value: chunk, done } = await reader.read();
        assert.ok(!done, `the stream ended before ${text}: ${sse}`);
        sse += decoder.decode(chunk, { stream: true });
      }
    },
    async rest() {
      for (;;) {
        const { value: chunk, done } = await reader.read();
        if (done) return sse;
        sse += decoder.decode(chunk, { stream: true });
      }
    },
  };
}

/** The text/plain of a cell's last value. */
async function value(id: string, code: string, extra: Record<string, unknown> = {}): Promise<string> {
  const r = await run(id, { code, ...extra });
  assert.equal(r.error, null, `${code}: ${JSON.stringify(r.error)}`);
  const main = r.results.find((o: any) => o.is_main_result);
  assert.ok(main, `${code}: no value in ${JSON.stringify(r)}`);
  return main.data['text/plain'];
}

/** Width and height from a PNG's IHDR, after checking its signature and that its image data inflates. */
function pngSize(b64: string): { width: number; height: number } {
  const png = Buffer.from(b64, 'base64');
  assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'PNG signature');
  assert.equal(png.subarray(12, 16).toString(), 'IHDR');
  const idat: Buffer[] = [];
  for (let at = 8; at < png.length;) {
    const len = png.readUInt32BE(at);
    if (png.subarray(at + 4, at + 8).toString() === 'IDAT') idat.push(png.subarray(at + 8, at + 8 + len));
    at += 12 + len;
  }
  assert.ok(inflateSync(Buffer.concat(idat)).length > 0);
  return { width: png.readUInt32BE(16), height: png.readUInt32BE(20) };
}

before(async () => {
  home = testHome('code');
  engine = await openEngine(home, { poolSize: 1, catalog: ['base', 'python', 'node', 'debian'] });
  api = await serveEngine(engine);
  base = await api.app.listen({ host: '127.0.0.1', port: 0 });
  key = api.keys.create({ tenant: 'coder', tier: 'pro' }).key;
  const cli = ['--import', 'tsx', join(ROOT, 'src/cli/main.ts'), 'keys', 'create', '--tenant', 'e2b-coder', '--tier', 'pro', '--e2b', '--home', home];
  e2bKey = (await promisify(execFile)(process.execPath, cli, { cwd: ROOT })).stdout.trim().split('\n').pop()!;
});

after(async () => {
  await api?.close(1000);
  if (engine) await assertNoLeaks(engine, home);
});

test('python: state across cells, a figure as a PNG with its chart, a traceback, an interrupt, contexts, a seeded replay', async () => {
  const id = await create('python');
  try {
    // The kernel is warm from the template: the first cell already has IPython's counter at 1.
    const first = await run(id, { code: 'x = 41' });
    assert.equal(first.error, null);
    assert.equal(first.execution_count, 1);
    assert.equal(await value(id, 'x + 1'), '42');

    const printed = await run(id, { code: 'import sys\nprint("out"); print("err", file=sys.stderr)\nx' });
    assert.equal(printed.stdout, 'out\n');
    assert.equal(printed.stderr, 'err\n');

    const fig = await run(id, { code: 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9], label="ys")\nplt.title("rise")\nplt.xlabel("t")\nplt.show()' });
    assert.equal(fig.error, null, JSON.stringify(fig.error));
    const shown = fig.results.find((o: any) => o.data['image/png']);
    assert.ok(shown, JSON.stringify(fig.results.map((o: any) => Object.keys(o.data))));
    assert.equal(shown.is_main_result, false);
    const size = pngSize(shown.data['image/png']);
    assert.ok(size.width > 100 && size.height > 100, JSON.stringify(size));
    const chart = shown.data['e2b/chart'];
    assert.equal(chart.type, 'line');
    assert.equal(chart.title, 'rise');
    assert.equal(chart.x_label, 't');
    assert.deepEqual(chart.elements[0].points, [[1, 4], [2, 1], [3, 9]]);
    assert.equal(chart.elements[0].label, 'ys');

    const html = await run(id, { code: 'import pandas as pd\ndf = pd.DataFrame({"a": [1, 2]})\ndf' });
    assert.match(html.results[0].data['text/html'], /<table/);
    // Every MIME type a display can carry comes through as the kernel sent it.
    const rich = await run(id, {
      code: [
        'from IPython.display import display, SVG, JSON, Latex, Markdown',
        'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>\'), JSON({"k": [1, 2]}), Latex(r"$\\alpha$"), Markdown("**b**"))',
      ].join('\n'),
    });
    assert.equal(rich.error, null, JSON.stringify(rich.error));
    const bundles = rich.results.map((o: any) => o.data);
    assert.match(bundles.find((d: any) => d['image/svg+xml'])?.['image/svg+xml'], /<svg/);
    assert.deepEqual(bundles.find((d: any) => d['application/json'])?.['application/json'], { k: [1, 2] });
    assert.equal(bundles.find((d: any) => d['text/latex'])?.['text/latex'], '$\\alpha$');
    assert.equal(bundles.find((d: any) => d['text/markdown'])?.['text/markdown'], '**b**');

    const failed = await run(id, { code: 'def f():\n    return 1 / 0\nf()' });
    assert.equal(failed.error.name, 'ZeroDivisionError');
    assert.equal(failed.error.value, 'division by zero');
    assert.match(failed.error.traceback, /return 1 \/ 0/);
    assert.doesNotMatch(failed.error.traceback, /\x1b\[/, 'the traceback is plain text');

    // An endless loop past its timeout is interrupted; the kernel and its state stay.
    const loop = await run(id, { code: 'while True:\n    pass', timeout_secs: 3 });
    assert.equal(loop.timed_out, true);
    assert.equal(loop.error?.name, 'KeyboardInterrupt');
    assert.equal(await value(id, 'x'), '41');

    // An interrupt by its context, while the cell streams.
    const contexts = await call('GET', `/v1/sandboxes/${id}/code/contexts`);
    assert.equal(contexts.status, 200);
    const python = contexts.json.contexts.find((c: any) => c.language === 'python');
    const streamed = await streamCell(id, { code: 'import time\nprint("started", flush=True)\nwhile True:\n    time.sleep(0.1)' });
    await streamed.until('event: stdout');
    const interrupted = await call('POST', `/v1/sandboxes/${id}/code/contexts/${python.id}/interrupt`);
    assert.equal(interrupted.status, 200, interrupted.text);
    const sse = await streamed.rest();
    assert.match(sse, /event: exception\ndata: \{"name":"KeyboardInterrupt"/);
    assert.match(sse, /event: result\ndata: \{"context":"[0-9a-f-]{36}"/);
    assert.equal(await value(id, 'x'), '41');

    // A context of its own: its own state and directory; restart empties it; delete ends it.
    const made = await call('POST', `/v1/sandboxes/${id}/code/contexts`, { language: 'python', cwd: '/tmp' });
    await expectStatus(made, 201, id);
    assert.equal(made.json.cwd, '/tmp');
    const ctx = made.json.id;
    assert.equal(await value(id, 'import os; os.getcwd()', { context: ctx }), "'/tmp'");
    const missing = await run(id, { code: 'x', context: ctx });
    assert.equal(missing.error.name, 'NameError');
    assert.equal(await value(id, 'y = 7; y', { context: ctx }), '7');
    // A restart stops even a cell deaf to interrupts: the cell ends with KernelDied.
    const deaf = await streamCell(id, { code: 'import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint("deaf", flush=True)\nwhile True:\n    time.sleep(0.1)', context: ctx });
    await deaf.until('event: stdout');
    const restarted = await call('POST', `/v1/sandboxes/${id}/code/contexts/${ctx}/restart`);
    await expectStatus(restarted, 200, id);
    assert.match(await deaf.rest(), /event: exception\ndata: \{"name":"KernelDied"/);
    assert.equal((await run(id, { code: 'y', context: ctx })).error.name, 'NameError');
    assert.equal((await call('DELETE', `/v1/sandboxes/${id}/code/contexts/${ctx}`)).status, 204);
    const gone = await call('POST', `/v1/sandboxes/${id}/code`, { code: '1', context: ctx });
    assert.equal(gone.status, 404);
    assert.equal(gone.json.error.code, 'context_not_found');
    assert.equal((await call('POST', `/v1/sandboxes/${id}/code`, { code: '1', context: ctx, language: 'python' })).status, 400);

    // A seeded cell replays: random and numpy's global generator start from the seed.
    const draw = 'import random, numpy as np\n(random.random(), float(np.random.rand()))';
    const a = await value(id, draw, { seed: '12345' });
    const b = await value(id, draw, { seed: '12345' });
    const c = await value(id, draw, { seed: '12346' });
    assert.equal(a, b);
    assert.notEqual(a, c);

    // Bad input is a clear 400 before anything runs.
    const bad = await call('POST', `/v1/sandboxes/${id}/code`, { code: 1 });
    assert.equal(bad.status, 400);
    assert.equal((await call('POST', `/v1/sandboxes/${id}/code`, { code: '1', language: 'r' })).status, 400);
    assert.equal((await call('POST', `/v1/sandboxes/${id}/code/contexts/nope/restart`)).json.error.code, 'context_not_found');
  } finally {
    await call('DELETE', `/v1/sandboxes/${id}`);
  }
});

test('kernels survive suspend/resume, each fork child goes on from its parent\'s kernel, and a snapshot keeps one', async () => {
  const id = await create('python');
  const children: string[] = [];
  try {
    assert.equal(await value(id, 'import pandas as pd\ndf = pd.DataFrame({"n": [1, 2, 3]})\nint(df.n.sum())'), '6');
    assert.equal((await call('POST', `/v1/sandboxes/${id}/suspend`)).status, 200);
    assert.equal((await call('POST', `/v1/sandboxes/${id}/resume`)).status, 200);
    assert.equal(await value(id, 'int(df.n.sum())'), '6');

    const fork = await call('POST', `/v1/sandboxes/${id}/fork`, { count: 3 });
    assert.equal(fork.status, 201, fork.text);
    children.push(...fork.json.sandboxes.map((s: any) => s.id));
    await Promise.all(children.map((child, i) => run(child, { code: `df["n"] = df["n"] * ${i + 2}` })));
    const sums = await Promise.all(children.map((child) => value(child, 'int(df.n.sum())')));
    assert.deepEqual(sums, ['12', '18', '24']);
    assert.equal(await value(id, 'int(df.n.sum())'), '6', 'the parent keeps its own');

    // A snapshot keeps the kernel too: a sandbox started from it reads the DataFrame, and a rollback
    // brings the parent's back after it changed.
    const snap = await call('POST', `/v1/sandboxes/${id}/snapshots`, { name: 'kernel' });
    assert.equal(snap.status, 201, snap.text);
    const started = await call('POST', '/v1/sandboxes', { snapshot: snap.json.id });
    assert.equal(started.status, 201, started.text);
    children.push(started.json.id);
    assert.equal(await value(started.json.id, 'int(df.n.sum())'), '6');
    await run(id, { code: 'df["n"] = 0' });
    assert.equal(await value(id, 'int(df.n.sum())'), '0');
    const rolled = await call('POST', `/v1/sandboxes/${id}/restore`, { snapshot: snap.json.id });
    assert.equal(rolled.status, 200, rolled.text);
    assert.equal(await value(id, 'int(df.n.sum())'), '6');
    assert.equal((await call('DELETE', `/v1/snapshots/${snap.json.id}`)).status, 204);
  } finally {
    for (const s of [...children, id]) await call('DELETE', `/v1/sandboxes/${s}`);
  }
});

test('javascript in the node template; a first cell starts the interpreter where the template baked none; base has none', async () => {
  const node = await create('node');
  const debian = await create('debian');
  const busybox = await create('base');
  try {
    const first = await run(node, { code: 'let total = 40; console.log("log"); total + 2' });
    assert.equal(first.error, null, JSON.stringify(first.error));
    assert.equal(first.stdout, 'log\n');
    assert.equal(first.results[0].data['text/plain'], '42');
    assert.equal(await value(node, 'total * 2'), '80');
    assert.equal(await value(node, 'const r = await Promise.resolve(5)\nr + 1'), '6');
    const thrown = await run(node, { code: 'null.x' });
    assert.equal(thrown.error.name, 'TypeError');
    assert.equal(await value(node, 'Math.random()', { seed: '99' }), await value(node, 'Math.random()', { seed: '99' }));
    const noPython = await call('POST', `/v1/sandboxes/${node}/code`, { code: '1', language: 'python' });
    assert.equal(noPython.status, 400);
    assert.match(noPython.json.error.message, /ipykernel/);

    // debian has python3 (no ipykernel) and node: its first cell starts the server, then JavaScript runs.
    // text/plain is the value's inspection, as Jupyter's is its repr: a string is quoted.
    assert.equal(await value(debian, '[1, 2, 3].map((n) => n * 2).join(",")', { language: 'javascript' }), "'2,4,6'");
    assert.equal(await value(debian, 'process.version.startsWith("v24")', { language: 'javascript' }), 'true');

    const none = await call('POST', `/v1/sandboxes/${busybox}/code`, { code: '1' });
    assert.equal(none.status, 409, none.text);
    assert.equal(none.json.error.code, 'code_unavailable');
    assert.match(none.json.error.message, /python3/);
  } finally {
    for (const s of [node, debian, busybox]) await call('DELETE', `/v1/sandboxes/${s}`);
  }
});

test('@e2b/code-interpreter 2.8, unmodified: its README example and a chart, contexts, through the E2B door', async () => {
  const opts = { apiKey: e2bKey, apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd` };
  let step = 'create';
  // e2b 2.51 leaves the timeout to the server, whose default is E2B's 15 s: on a loaded host the
  // steps below outlast it, and the reaper deleted the sandbox under a cell (a CI run, 2026-12-06).
  const sandbox = await CodeSandbox.create({ ...opts, timeoutMs: 600_000 });
  try {
    // The README's example.
    step = 'README';
    await sandbox.runCode('x = 1');
    const execution = await sandbox.runCode('x+=1; x');
    assert.equal(execution.text, '2');

    step = 'chart';
    const charted = await sandbox.runCode('import matplotlib.pyplot as plt\nplt.bar(["a", "b"], [3, 5])\nplt.title("bars")\nplt.show()');
    const result = charted.results[0];
    assert.ok(result.png && pngSize(result.png).width > 100);
    assert.equal(result.chart?.type, 'bar');
    assert.equal(result.chart?.title, 'bars');
    assert.deepEqual((result.chart as any).elements.map((e: any) => [e.label, e.value]), [['a', 3], ['b', 5]]);

    step = 'error';
    const outs: string[] = [];
    const errored = await sandbox.runCode('print("seen")\nraise ValueError("nope")', { onStdout: (m) => void outs.push(m.line) });
    assert.deepEqual(outs, ['seen\n']);
    assert.equal(errored.error?.name, 'ValueError');
    assert.equal(errored.error?.value, 'nope');

    step = 'contexts';
    const ctx = await sandbox.createCodeContext({ cwd: '/tmp' });
    assert.equal((await sandbox.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp');
    assert.ok((await sandbox.listCodeContexts()).some((c) => c.id === ctx.id));
    await sandbox.removeCodeContext(ctx);
    assert.ok(!(await sandbox.listCodeContexts()).some((c) => c.id === ctx.id));
  } catch (err) {
    // The SDK's errors show as {} in the test report: say which step and what it was.
    const e = err as Error;
    // The guest's state read through the SDK itself, as root.
    const state = await sandbox.commands.run(GUEST_STATE, { user: 'root', timeoutMs: 30_000 }).then((r) => r.stdout, (x) => String(x));
    throw new Error(`@e2b/code-interpreter, step ${step}: ${e?.name}: ${e?.message}\n--- guest ---\n${state}`, { cause: err });
  } finally {
    await sandbox.kill();
  }
});
