/**
 * The front doors on a real server and real microVMs: the TypeScript SDK, the Python SDK, the RL SDK
 * (in-process and over HTTP), the MCP endpoint, and the docs/examples. One server (buildServer on a
 * real Engine, as `collimate serve` wires it) listens on an ephemeral 127.0.0.1 port; keys are made
 * with `collimate keys create`, as an operator would. Every test deletes what it creates, and the
 * suite ends with the leak check.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import {
  AuthenticationError,
  Collimate,
  ConcurrencyLimitError,
  ConnectionError,
  InvalidStateError,
  NotFoundError,
  TierForbiddenError,
  ValidationError,
  type ExecResult,
} from '../../src/sdk/index.ts';
import { bestOfN, connect, createLocalFleet, RUN_LABEL, treeSearch, type Sandbox as FleetSandbox } from '../../src/sdk/rl/index.ts';
import { trustedScope } from '../../src/service/types.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, createKey, EXAMPLE_OUTPUT, type Served } from './fixture.ts';

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PYTHON = '/usr/bin/python3';

let engine: Engine;
let home: string;
let api: Served;
let baseUrl: string;
let proKey: string;
let demoKey: string;
let proTenant: string;
let client: Collimate;

function env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { ...process.env, COLLIMATE_BASE_URL: baseUrl, COLLIMATE_API_KEY: proKey, COLLIMATE_DEMO_KEY: demoKey, PYTHONPATH: join(ROOT, 'sdk/python'), ...extra };
}

async function liveIds(tenantKey: string, labels: Record<string, string>): Promise<string[]> {
  return (await new Collimate({ apiKey: tenantKey, baseUrl }).sandboxes.list({ labels }).all()).map((s) => s.id);
}

before(async () => {
  home = testHome('sdk');
  // python and node for the code cells (their kernels baked warm); base for everything else.
  engine = await openEngine(home, { catalog: ['base', 'python', 'node'] });
  api = await serveEngine(engine);
  baseUrl = await api.app.listen({ host: '127.0.0.1', port: 0 });
  proTenant = 'sdk-pro';
  proKey = await createKey(home, proTenant, 'pro');
  demoKey = await createKey(home, 'sdk-demo', 'demo');
  client = new Collimate({ apiKey: proKey, baseUrl });
});

after(async () => {
  await api?.close(1000);
  await assertNoLeaks(engine, home);
});

// ---------------------------------------------------------------------------------------------
// TypeScript SDK

test('TS SDK: create, exec, streaming, files, fork, suspend, resume, delete', async () => {
  assert.ok((await client.images()).some((i) => i.id === 'base' && i.ready));
  let id: string;
  {
    await using sb = await client.sandboxes.create({ template: 'base', labels: { suite: 'ts-lifecycle' } });
    id = sb.id;
    assert.equal(sb.state, 'running');
    assert.deepEqual(sb.labels, { suite: 'ts-lifecycle' });

    const r = await sb.exec({ command: 'echo hello; echo oops >&2; exit 3' });
    assert.deepEqual([r.stdout, r.stderr, r.exit_code], ['hello\n', 'oops\n', 3]);
    const withFiles = await sb.exec({ command: 'cat /root/in.txt; cat', files: [{ path: '/root/in.txt', content: 'from-file;' }], stdin: 'from-stdin', env: { A: '1' } });
    assert.equal(withFiles.stdout, 'from-file;from-stdin');
    assert.match(withFiles.seed ?? '', /^\d+$/, 'the server reports the seed it drew');
    assert.equal((await sb.exec({ command: 'true', seed: '12345' })).seed, '12345', 'a given seed passes through');

    // Streaming callbacks get chunks while the command is still running.
    const chunks: Buffer[] = [];
    let firstChunkAt = 0;
    const r2 = await sb.exec(
      { command: 'for i in 1 2 3; do echo line$i; sleep 0.3; done; echo done >&2' },
      { onStdout: (c) => (chunks.push(c), (firstChunkAt ||= Date.now())), onStderr: (c) => chunks.push(Buffer.from(`E:${c}`)) },
    );
    const endedAt = Date.now();
    assert.equal(r2.stdout, 'line1\nline2\nline3\n');
    assert.ok(chunks.length >= 3, `expected several chunks, got ${chunks.length}`);
    assert.ok(firstChunkAt > 0 && firstChunkAt < endedAt - 400, 'the first chunk arrives well before the exec ends');
    assert.equal(Buffer.concat(chunks).toString(), 'line1\nline2\nline3\nE:done\n');

    // The iterator form: chunks, then the result.
    const events: string[] = [];
    let result: ExecResult | undefined;
    for await (const ev of sb.execStream({ command: 'echo a; echo b >&2' })) {
      if (ev.type === 'result') result = ev.result;
      else events.push(`${ev.type}:${ev.data.toString().trim()}`);
    }
    assert.deepEqual(events.sort(), ['stderr:b', 'stdout:a']);
    assert.equal(result?.exit_code, 0);

    // Files (binary-safe).
    const blob = Buffer.from(Array.from({ length: 768 }, (_, i) => i % 256));
    assert.equal((await sb.files.write('/root/data/blob.bin', blob)).size, blob.length);
    assert.ok((await sb.files.read('/root/data/blob.bin')).equals(blob));
    await sb.files.write('/root/run.sh', '#!/bin/sh\necho ran\n', { mode: 0o755 });
    assert.equal((await sb.exec({ command: '/root/run.sh' })).stdout, 'ran\n');
    await assert.rejects(sb.files.read('/root/missing'), NotFoundError);

    // Fork 2: children inherit the parent's files and a running process; writes stay private.
    await sb.exec({ command: 'echo parent-state > /root/state; (while true; do sleep 1; done) >/dev/null 2>&1 & echo $! > /root/bg.pid' });
    const kids = await sb.fork(2, { labels: { branch: 'yes' } });
    assert.equal(kids.length, 2);
    for (const [i, k] of kids.entries()) {
      assert.equal(k.parent, sb.id);
      assert.deepEqual(k.labels, { suite: 'ts-lifecycle', branch: 'yes' });
      assert.equal((await k.exec({ command: 'cat /root/state' })).stdout, 'parent-state\n');
      assert.equal((await k.exec({ command: 'kill -0 $(cat /root/bg.pid) && echo alive' })).stdout, 'alive\n');
      await k.exec({ command: `echo kid${i} > /root/state` });
    }
    assert.equal((await sb.exec({ command: 'cat /root/state' })).stdout, 'parent-state\n');
    assert.deepEqual([...(await sb.refresh()).info.children].sort(), kids.map((k) => k.id).sort());
    assert.equal((await client.sandboxes.list({ labels: { suite: 'ts-lifecycle' } }).all()).length, 3);
    // Pages: with limit 1 the iterator walks three pages.
    let pages = 0;
    for await (const page of client.sandboxes.list({ labels: { suite: 'ts-lifecycle' }, limit: 1 })) if (page.length) pages++;
    assert.equal(pages, 3);
    for (const k of kids) await k.delete();

    // Suspend / resume keep memory and processes.
    await sb.suspend();
    assert.equal(sb.state, 'suspended');
    assert.deepEqual((await client.sandboxes.list({ state: 'suspended', labels: { suite: 'ts-lifecycle' } }).all()).map((s) => s.id), [sb.id]);
    await sb.resume();
    assert.equal(sb.state, 'running');
    assert.equal((await sb.exec({ command: 'cat /root/state; kill -0 $(cat /root/bg.pid) && echo alive' })).stdout, 'parent-state\nalive\n');
  }
  // `await using` deleted it.
  await assert.rejects(client.sandboxes.get(id), NotFoundError);
});

test('fork of a suspended sandbox through every door: REST, MCP, TS SDK, Python SDK, RL — children continue its counter, it stays suspended', async () => {
  // A counter process started before the suspend; each child must find it alive and counting on
  // from where it was (a restart would begin again at 1).
  const parent = await client.sandboxes.create({ template: 'base', labels: { suite: 'fork-suspended' } });
  const children: string[] = [];
  try {
    await parent.exec({ command: '(i=0; while true; do i=$((i+1)); echo $i > /root/count.new; mv /root/count.new /root/count; sleep 0.2; done) >/dev/null 2>&1 &' });
    await new Promise((r) => setTimeout(r, 1500));
    const atSuspend = Number((await parent.exec({ command: 'cat /root/count' })).stdout);
    assert.ok(atSuspend >= 2, `the counter runs (${atSuspend})`);
    await parent.suspend();
    assert.equal(parent.state, 'suspended');

    const checkChild = async (door: string, id: string) => {
      children.push(id);
      const child = await client.sandboxes.get(id);
      assert.equal(child.state, 'running', door);
      assert.equal(child.parent, parent.id, door);
      const first = Number((await child.exec({ command: 'cat /root/count' })).stdout);
      await new Promise((r) => setTimeout(r, 1000));
      const later = Number((await child.exec({ command: 'cat /root/count' })).stdout);
      assert.ok(first >= atSuspend, `${door}: the child's counter continues from ${atSuspend} (read ${first})`);
      assert.ok(later > first, `${door}: the counter process runs in the child (${first} → ${later})`);
      const p = await client.sandboxes.get(parent.id);
      assert.equal(p.state, 'suspended', `${door}: the parent stays suspended`);
    };

    // REST
    const rest = await fetch(`${baseUrl}/v1/sandboxes/${parent.id}/fork`, { method: 'POST', headers: { authorization: `Bearer ${proKey}`, 'content-type': 'application/json' }, body: '{"count":1}' });
    assert.equal(rest.status, 201);
    await checkChild('REST', ((await rest.json()) as any).sandboxes[0].id);
    // MCP
    const { client: mcp } = await mcpClient(proKey);
    try {
      const forked = await mcp.callTool({ name: 'fork_sandbox', arguments: { sandbox_id: parent.id, count: 1 } });
      assert.ok(!forked.isError, JSON.stringify(forked.content));
      await checkChild('MCP', (forked.structuredContent as any).sandboxes[0].id);
    } finally {
      await mcp.close();
    }
    // TS SDK
    const [viaTs] = await (await client.sandboxes.get(parent.id)).fork(1);
    await checkChild('TS SDK', viaTs.id);
    // Python SDK
    const py = await run(PYTHON, ['-c', `import collimate; print(collimate.Collimate().sandboxes.get(${JSON.stringify(parent.id)}).fork(1)[0].id)`], { env: env(), timeout: 120_000 });
    await checkChild('Python SDK', py.stdout.trim());
    // RL: the in-process fleet over the same tenant service, and connect() over HTTP
    const [viaLocal] = await (await createLocalFleet(api.tenants, trustedScope(proTenant)).get(parent.id)).fork(1);
    await checkChild('RL local', viaLocal.id);
    const [viaRemote] = await (await connect({ apiKey: proKey, baseUrl }).get(parent.id)).fork(1);
    await checkChild('RL connect', viaRemote.id);
  } finally {
    for (const id of children) await (await client.sandboxes.get(id)).delete().catch(() => {});
    await parent.delete();
  }
});

test('TS SDK: code cells in the python template: state across cells, streamed output, its contexts', async () => {
  await using sb = await client.sandboxes.create({ template: 'python', labels: { suite: 'ts-code' } });
  assert.equal((await sb.runCode('x = 41')).error, null);
  const printed: string[] = [];
  const r = await sb.runCode('print("hi")\nx + 1', { onStdout: (t) => printed.push(t) });
  assert.equal(r.text, '42');
  assert.equal(printed.join(''), 'hi\n');
  assert.deepEqual(
    (await sb.listCodeContexts()).filter((c) => c.id === r.context).map((c) => c.language),
    ['python'],
    'the default context the cells ran in',
  );
  await assert.rejects(sb.runCode('1', { context: '00000000-0000-4000-8000-000000000000' }), (e: unknown) => e instanceof NotFoundError && e.code === 'context_not_found');
});

test('TS SDK: typed errors from the one code mapping', async () => {
  await assert.rejects(new Collimate({ apiKey: 'clm_' + 'x'.repeat(40), baseUrl }).images(), (e: unknown) => {
    assert.ok(e instanceof AuthenticationError);
    assert.equal(e.status, 401);
    assert.equal(e.code, 'unauthorized');
    return true;
  });
  await assert.rejects(client.sandboxes.get('sbx_000000000000'), (e: unknown) => e instanceof NotFoundError && e.code === 'sandbox_not_found');
  await assert.rejects(client.sandboxes.create({ template: 'no-such-template' }), (e: unknown) => e instanceof NotFoundError && e.code === 'template_not_found');

  const demo = new Collimate({ apiKey: demoKey, baseUrl });
  await assert.rejects(demo.sandboxes.create({ template: 'base', timeoutSecs: 100_000 }), TierForbiddenError);
  const a = await demo.sandboxes.create({ template: 'base' });
  const b = await demo.sandboxes.create({ template: 'base' });
  try {
    await assert.rejects(demo.sandboxes.create({ template: 'base' }), (e: unknown) => {
      assert.ok(e instanceof ConcurrencyLimitError, String(e));
      assert.equal(e.status, 429);
      assert.equal(typeof e.retryAfter, 'number');
      assert.ok(e.retryAfter! > 0);
      return true;
    });
    await assert.rejects(a.exec({ command: 'echo', code: 'echo' }), ValidationError);
    await b.suspend();
    await assert.rejects(b.exec({ command: 'true' }), (e: unknown) => e instanceof InvalidStateError && e.status === 409 && e.state === 'suspended');
    // The streaming path checks state before committing to a stream, so it throws the same class.
    await assert.rejects(b.exec({ command: 'true' }, { onStdout: () => {} }), InvalidStateError);
  } finally {
    await a.delete();
    await b.delete();
  }
});

test('TS SDK: create retries a lost response with the same Idempotency-Key (one sandbox); exec never retries', async () => {
  const calls: Array<{ method: string; path: string; key: string | null }> = [];
  let dropNext = new Set(['POST /v1/sandboxes', 'POST /exec']);
  const flaky: typeof fetch = async (input, init) => {
    const url = new URL(String(input));
    const key = new Headers(init?.headers).get('idempotency-key');
    const op = `${init?.method} ${url.pathname.endsWith('/exec') ? '/exec' : url.pathname}`;
    calls.push({ method: init?.method ?? 'GET', path: url.pathname, key });
    const res = await fetch(input, init);
    if (dropNext.has(op)) {
      dropNext.delete(op);
      await res.arrayBuffer();
      throw new TypeError('fetch failed', { cause: { code: 'ECONNRESET' } }); // the response was lost on the way back
    }
    return res;
  };
  const c = new Collimate({ apiKey: proKey, baseUrl, fetch: flaky });
  const sb = await c.sandboxes.create({ template: 'base', labels: { suite: 'ts-retry' } });
  try {
    const creates = calls.filter((x) => x.method === 'POST' && x.path === '/v1/sandboxes');
    assert.equal(creates.length, 2, 'the create was sent twice');
    assert.ok(creates[0].key && creates[0].key === creates[1].key, 'with the same Idempotency-Key');
    assert.deepEqual(await liveIds(proKey, { suite: 'ts-retry' }), [sb.id], 'and made one sandbox');

    await assert.rejects(sb.exec({ command: 'echo $$ >> /root/runs' }), ConnectionError);
    assert.equal(calls.filter((x) => x.path.endsWith('/exec')).length, 1, 'exec is not retried');
    assert.equal((await sb.exec({ command: 'wc -l < /root/runs' })).stdout.trim(), '1', 'and ran once');
  } finally {
    dropNext = new Set();
    await sb.delete();
  }
});

// ---------------------------------------------------------------------------------------------
// RL SDK

/** The task of the best-of-N tests: print the largest prime below /root/bound (set in the parent). */
const CANDIDATES = [
  'echo 89',
  'echo 99',
  'n=$(($(cat /root/bound)-1)); while [ $n -gt 1 ]; do i=2; p=1; while [ $((i*i)) -le $n ]; do ' +
    'if [ $((n%i)) -eq 0 ]; then p=0; break; fi; i=$((i+1)); done; [ $p = 1 ] && { echo $n; exit 0; }; n=$((n-1)); done',
  'echo 91',
];
const isPrime = (n: number) => Number.isInteger(n) && n > 1 && [...Array(Math.max(0, Math.floor(Math.sqrt(n)) - 1)).keys()].every((i) => n % (i + 2) !== 0);
const primeScore = (r: ExecResult) => (isPrime(Number(r.stdout)) ? Number(r.stdout) : -Infinity);

test('RL: best-of-N on a real task picks the largest correct answer by its output and deletes the losers', async () => {
  const fleet = connect({ apiKey: proKey, baseUrl });
  const root = await fleet.create('base');
  try {
    assert.equal(root.info.labels[RUN_LABEL], fleet.runId);
    await root.exec({ command: 'echo 100 > /root/bound' });
    const seen: string[] = [];
    const out = await bestOfN(
      root,
      4,
      async (sb, i) => {
        seen.push(sb.id);
        assert.equal(sb.info.labels[RUN_LABEL], fleet.runId, 'forked children carry the run label');
        return sb.exec({ command: CANDIDATES[i] });
      },
      primeScore,
      { keepWinner: true },
    );
    assert.equal(out.winner.index, 2);
    assert.equal(out.winner.result.stdout, '97\n', 'the candidate that computed the answer from the inherited bound wins');
    assert.deepEqual(out.all.map((s) => s.score), [89, -Infinity, 97, -Infinity]);
    assert.equal(out.winner.sandbox?.id, seen[2]);
    for (const [i, id] of seen.entries()) {
      if (i === 2) assert.equal((await client.sandboxes.get(id)).state, 'running', 'the winner is kept');
      else await assert.rejects(client.sandboxes.get(id), NotFoundError, 'losers are deleted');
    }
    await out.winner.sandbox!.delete();

    // A failing step: every child is deleted and the error comes back.
    await assert.rejects(
      bestOfN(root, 3, async (sb, i) => { if (i === 1) throw new Error('step failed'); return sb.exec({ command: 'true' }); }, () => 0),
      /step failed/,
    );
    assert.deepEqual(await liveIds(proKey, fleet.runLabel), [root.id]);

    // Tree search: each level appends a digit; beam 1 keeps the largest; pruned and expanded nodes go.
    await root.exec({ command: 'printf 1 > /root/acc' });
    const t = await treeSearch(root, {
      expand: 2,
      depth: 2,
      beam: 1,
      step: (sb, ctx) => sb.exec({ command: `printf ${ctx.path[ctx.path.length - 1] + 1} >> /root/acc; cat /root/acc` }),
      score: (r) => Number(r.stdout),
    });
    assert.equal(t.best.result.stdout, '122');
    assert.deepEqual(t.best.path, [1, 1]);
    assert.deepEqual(t.levels.map((l) => l.map((n) => n.score)), [[11, 12], [121, 122]]);
    assert.deepEqual(await liveIds(proKey, fleet.runLabel), [root.id]);
  } finally {
    await root.delete();
  }
});

test('RL: the in-process local fleet and the connect() fleet give identical output for the same script', async () => {
  const script = 'echo start; i=0; while [ $i -lt 5 ]; do echo "line $i $((i*i))"; i=$((i+1)); done; printf "no newline"; echo to-err >&2; exit 3';
  const local = createLocalFleet(api.tenants, trustedScope(proTenant));
  const remote = connect({ apiKey: proKey, baseUrl });
  const outputs: Array<{ stdout: string; stderr: string; exit: number; forked: string }> = [];
  for (const fleet of [local, remote]) {
    await using sb = await fleet.create('base', { labels: { suite: 'rl-parity' } });
    assert.equal(sb.info.labels[RUN_LABEL], fleet.runId);
    const chunks: Buffer[] = [];
    const r = await sb.exec({ command: script }, { onStdout: (c) => chunks.push(c) });
    assert.equal(Buffer.concat(chunks).toString(), r.stdout, 'streamed chunks add up to the result');
    const [kid] = await sb.fork(1);
    assert.equal(kid.info.labels[RUN_LABEL], fleet.runId);
    const forked = (await kid.exec({ command: script })).stdout;
    await kid.delete();
    outputs.push({ stdout: r.stdout, stderr: r.stderr, exit: r.exit_code, forked });
  }
  assert.equal(outputs[0].stdout, 'start\nline 0 0\nline 1 1\nline 2 4\nline 3 9\nline 4 16\nno newline');
  assert.deepEqual(outputs[0], outputs[1]);
  // Both fleets' errors are the SDK's classes.
  await assert.rejects(local.deleteById('sbx_000000000000'), NotFoundError);
  await assert.rejects(remote.deleteById('sbx_000000000000'), NotFoundError);
});

test('RL: a trainer killed with SIGKILL mid-run leaves sandboxes; sweep(runId) deletes every one', async () => {
  const runId = `crash-${Date.now().toString(36)}`;
  const trainer = spawn(PYTHON, [join(ROOT, 'test/integration/python/trainer.py')], { env: env({ RUN_ID: runId }), stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  trainer.stdout.on('data', (d) => (out += d));
  trainer.stderr.on('data', (d) => (err += d));
  const exited = once(trainer, 'exit');
  const deadline = Date.now() + 120_000;
  // Kill it right after it announces step 3: its third fork is in flight.
  while (!/^step 3$/m.test(out)) {
    assert.ok(Date.now() < deadline && trainer.exitCode === null, `trainer did not get to step 3: ${out}\n${err}`);
    await sleep(20);
  }
  trainer.kill('SIGKILL');
  const [code, signal] = await exited;
  assert.equal(signal, 'SIGKILL', `trainer exited with ${code}`);

  const left = await liveIds(proKey, { [RUN_LABEL]: runId });
  assert.ok(left.length >= 5, `the dead trainer left its root and forks behind (${left.length})`);
  const fleet = connect({ apiKey: proKey, baseUrl, runId });
  const deleted = await fleet.sweep();
  assert.ok(deleted >= left.length, `swept ${deleted} of at least ${left.length}`);
  await sleep(1000);
  assert.deepEqual(await liveIds(proKey, { [RUN_LABEL]: runId }), [], 'nothing with the run label is left');
});

test('RL (Python): connect() keeps one persistent connection for sequential calls', async () => {
  let connections = 0;
  const count = () => connections++;
  api.app.server.on('connection', count);
  try {
    const { stdout } = await run(PYTHON, [join(ROOT, 'test/integration/python/rl_keepalive.py')], { env: env(), timeout: 120_000 });
    assert.match(stdout, /connections_opened 1/);
  } finally {
    api.app.server.off('connection', count);
  }
  assert.equal(connections, 1, 'the server saw exactly one TCP connection for create, 10 execs, fork, delete, sweep');
});

// ---------------------------------------------------------------------------------------------
// Python SDK

test('Python SDK: lifecycle, streaming, typed errors, code cells, best-of-N, tree search, map, sweep (unittest)', async () => {
  const r = await run(PYTHON, [join(ROOT, 'test/integration/python/test_sdk.py')], { env: env(), timeout: 300_000 }).catch((e) => e);
  const output = `${r.stdout}\n${r.stderr}`;
  assert.equal(r.code ?? 0, 0, output);
  assert.match(r.stderr, /Ran 5 tests/, output);
  assert.match(r.stderr, /\nOK\s*$/, output);
});

// ---------------------------------------------------------------------------------------------
// MCP

async function mcpClient(key: string): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const transport = new StreamableHTTPClientTransport(new URL('/mcp', baseUrl), { requestInit: { headers: { authorization: `Bearer ${key}` } } });
  const c = new Client({ name: 'collimate-it', version: '1.0.0' });
  await c.connect(transport);
  return { client: c, transport };
}

function text(r: any): string {
  return (r.content as Array<{ type: string; text: string }>).map((c) => c.text).join('\n');
}

test('MCP: the official client lists the tools and drives create → exec → fork → delete', async () => {
  const { client: mcp, transport } = await mcpClient(proKey);
  try {
    assert.equal(transport.protocolVersion, '2025-11-25');
    const tools = (await mcp.listTools()).tools;
    assert.deepEqual(
      tools.map((t) => t.name).sort(),
      [
        'create_code_context', 'create_sandbox', 'delete_code_context', 'delete_sandbox', 'delete_snapshot', 'exec', 'expose_port', 'fork_sandbox',
        'get_sandbox', 'list_code_contexts', 'list_directory', 'list_images', 'list_processes', 'list_sandboxes', 'list_snapshots', 'make_directory',
        'path_exists', 'promote_snapshot', 'read_file', 'read_process_output', 'remove_path', 'rename_path', 'restart_code_context',
        'restore_sandbox', 'resume_sandbox', 'run_code', 'send_process_input', 'set_sandbox_timeout', 'signal_process', 'snapshot_sandbox',
        'start_from_snapshot', 'start_process', 'stat_path', 'suspend_sandbox', 'wait_process', 'watch_directory', 'write_file',
      ],
    );
    for (const t of tools) {
      assert.ok((t.description ?? '').length > 60, `${t.name} has a description an agent can act on`);
      assert.equal(t.inputSchema.type, 'object');
    }
    assert.ok((tools.find((t) => t.name === 'exec')!.inputSchema.required as string[]).includes('sandbox_id'));

    const images = await mcp.callTool({ name: 'list_images', arguments: {} });
    assert.ok((images.structuredContent as any).images.some((i: any) => i.id === 'base'));

    const created = await mcp.callTool({ name: 'create_sandbox', arguments: { template: 'base', labels: { suite: 'mcp' } } });
    assert.ok(!created.isError, text(created));
    const sb = created.structuredContent as any;
    assert.equal(sb.state, 'running');
    assert.deepEqual(JSON.parse(text(created)), sb, 'the text content is the same JSON');

    const ex = await mcp.callTool({ name: 'exec', arguments: { sandbox_id: sb.id, command: 'echo 42 > /root/answer; cat /root/answer; exit 2' } });
    assert.equal((ex.structuredContent as any).stdout, '42\n');
    assert.equal((ex.structuredContent as any).exit_code, 2);
    const seeded = await mcp.callTool({ name: 'exec', arguments: { sandbox_id: sb.id, command: 'true', seed: '777' } });
    assert.equal((seeded.structuredContent as any).seed, '777');
    assert.ok(!ex.isError, 'a failing command is a result, not a tool error');

    const w = await mcp.callTool({ name: 'write_file', arguments: { sandbox_id: sb.id, path: '/root/bin.dat', content: Buffer.from([0, 255, 1]).toString('base64'), encoding: 'base64' } });
    assert.equal((w.structuredContent as any).size, 3);
    const rf = await mcp.callTool({ name: 'read_file', arguments: { sandbox_id: sb.id, path: '/root/bin.dat' } });
    assert.deepEqual(rf.structuredContent, { path: '/root/bin.dat', size: 3, encoding: 'base64', content: 'AP8B' });

    const forked = await mcp.callTool({ name: 'fork_sandbox', arguments: { sandbox_id: sb.id, count: 2 } });
    const children = (forked.structuredContent as any).sandboxes as any[];
    assert.equal(children.length, 2);
    for (const c of children) {
      assert.equal(c.parent, sb.id);
      const r = await mcp.callTool({ name: 'read_file', arguments: { sandbox_id: c.id, path: '/root/answer' } });
      assert.equal((r.structuredContent as any).content, '42\n', 'children keep the parent state');
    }
    const listed = await mcp.callTool({ name: 'list_sandboxes', arguments: { labels: { suite: 'mcp' } } });
    assert.equal((listed.structuredContent as any).sandboxes.length, 3);

    // Suspended: exec is refused with the API code in the text, not a crash.
    await mcp.callTool({ name: 'suspend_sandbox', arguments: { sandbox_id: sb.id } });
    const refused = await mcp.callTool({ name: 'exec', arguments: { sandbox_id: sb.id, command: 'true' } });
    assert.equal(refused.isError, true);
    assert.match(text(refused), /^invalid_state: /);
    const resumed = await mcp.callTool({ name: 'resume_sandbox', arguments: { sandbox_id: sb.id } });
    assert.equal((resumed.structuredContent as any).state, 'running');

    for (const s of [...children, sb]) {
      const d = await mcp.callTool({ name: 'delete_sandbox', arguments: { sandbox_id: s.id } });
      assert.deepEqual(d.structuredContent, { id: s.id, deleted: true });
    }
    const gone = await mcp.callTool({ name: 'get_sandbox', arguments: { sandbox_id: sb.id } });
    assert.equal(gone.isError, true);
    assert.match(text(gone), /^sandbox_not_found: /);
    assert.deepEqual(await liveIds(proKey, { suite: 'mcp' }), []);
  } finally {
    await mcp.close();
  }
});

test('MCP: bad key → 401, foreign Origin → 403, invalid arguments → isError, demo tier cap shared with REST', async () => {
  await assert.rejects(mcpClient('clm_' + 'y'.repeat(40)), (e: unknown) => {
    assert.ok(e instanceof StreamableHTTPError || /401/.test(String(e)), String(e));
    if (e instanceof StreamableHTTPError) assert.equal(e.code, 401);
    return true;
  });
  const init = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } };
  const post = (headers: Record<string, string>) =>
    fetch(`${baseUrl}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${proKey}`, ...headers }, body: JSON.stringify(init) });
  const evil = await post({ origin: 'http://evil.example' });
  assert.equal(evil.status, 403);
  assert.equal(((await evil.json()) as any).error.code, 'origin_forbidden');
  const local = await post({ origin: 'http://localhost:5173' });
  assert.equal(local.status, 200);
  await local.body?.cancel();
  const noKey = await fetch(`${baseUrl}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(init) });
  assert.equal(noKey.status, 401);
  assert.match(noKey.headers.get('www-authenticate') ?? '', /^Bearer/);

  const { client: mcp } = await mcpClient(demoKey);
  const demo = new Collimate({ apiKey: demoKey, baseUrl });
  const viaRest = await demo.sandboxes.create({ template: 'base' });
  let viaMcp: string | undefined;
  try {
    const bad = await mcp.callTool({ name: 'exec', arguments: { sandbox_id: 42, command: 'true' } });
    assert.equal(bad.isError, true);
    assert.match(text(bad), /sandbox_id/);
    const neither = await mcp.callTool({ name: 'exec', arguments: { sandbox_id: viaRest.id } });
    assert.equal(neither.isError, true);
    assert.match(text(neither), /^validation_error: .*exactly one of command, code, commands/);
    const tooLong = await mcp.callTool({ name: 'create_sandbox', arguments: { template: 'base', timeout_secs: 100_000 } });
    assert.match(text(tooLong), /^tier_forbidden: /);

    const second = await mcp.callTool({ name: 'create_sandbox', arguments: { template: 'base' } });
    assert.ok(!second.isError, text(second));
    viaMcp = (second.structuredContent as any).id;
    const third = await mcp.callTool({ name: 'create_sandbox', arguments: { template: 'base' } });
    assert.equal(third.isError, true);
    assert.match(text(third), /^concurrency_limit: .*allows 2 running sandboxes/);
    const fork = await mcp.callTool({ name: 'fork_sandbox', arguments: { sandbox_id: viaMcp, count: 1 } });
    assert.match(text(fork), /^concurrency_limit: /);
    // And REST sees the MCP-created sandbox against the same cap.
    await assert.rejects(demo.sandboxes.create({ template: 'base' }), ConcurrencyLimitError);
  } finally {
    await viaRest.delete();
    if (viaMcp) await mcp.callTool({ name: 'delete_sandbox', arguments: { sandbox_id: viaMcp } });
    await mcp.close();
  }
});

// ---------------------------------------------------------------------------------------------
// Docs

test('docs/examples run green against the server', async () => {
  const tsx = [process.execPath, '--import', 'tsx'];
  const expectations: Array<[string, string[]]> = [
    ['quickstart.ts', tsx],
    ['quickstart.py', [PYTHON]],
    ['best_of_n.ts', tsx],
    ['best_of_n.py', [PYTHON]],
    ['mcp_client.ts', tsx],
  ];
  for (const [file, cmd] of expectations) {
    // The TypeScript examples import @collimate/sdk as a user's would; their tsconfig maps it to sdk/typescript's sources.
    const exampleEnv = env({ TSX_TSCONFIG_PATH: join(ROOT, 'docs/examples/tsconfig.json') });
    const r = await run(cmd[0], [...cmd.slice(1), join(ROOT, 'docs/examples', file)], { cwd: ROOT, env: exampleEnv, timeout: 180_000 }).catch((e) => e);
    const output = `${r.stdout}\n${r.stderr}`;
    assert.equal(r.code ?? 0, 0, `${file} failed:\n${output}`);
    for (const p of EXAMPLE_OUTPUT[file]) assert.match(r.stdout, p, `${file}:\n${output}`);
  }
  assert.deepEqual(await liveIds(proKey, { example: 'quickstart' }), [], 'the examples clean up after themselves');
});
