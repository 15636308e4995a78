import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { checkResponse } from '../unit/api/helpers.ts';
import { openEngine, testHome, assertNoLeaks, TEST_CACHE, serveEngine, type Served } from './fixture.ts';

const run = promisify(execFile);
let engine: Engine;
let api: Served;
let home: string;
let base: string;
let proKey: string;
let demoKey: string;
let otherKey: string;

interface Res { status: number; headers: Headers; text: string; json(): any }

/** One HTTP request to the real server; the response is checked against its documented schema. */
async function call(op: string | null, method: string, path: string, key: string | null, body?: unknown, headers: Record<string, string> = {}): Promise<Res> {
  const res = await fetch(base + path, {
    method,
    headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  const out: Res = { status: res.status, headers: res.headers, text, json: () => JSON.parse(text) };
  const h: Record<string, string> = {};
  res.headers.forEach((v, k) => { h[k] = v; });
  checkResponse(op, { statusCode: res.status, headers: h, body: text, json: () => JSON.parse(text) } as any);
  return out;
}

before(async () => {
  home = testHome('api');
  engine = await openEngine(home);
  api = await serveEngine(engine, { quotas: { 'tenant:hoarder': { suspended_sandboxes: 1 } } });
  const addr = await api.app.listen({ host: '127.0.0.1', port: 0 });
  base = addr;
  proKey = api.keys.create({ tenant: 'acme', tier: 'pro' }).key;
  otherKey = api.keys.create({ tenant: 'globex', tier: 'pro' }).key;
  demoKey = api.keys.create({ tenant: 'tiny', tier: 'demo' }).key;
});

after(async () => {
  await api.close(1000);
  await assertNoLeaks(engine, home);
});

test('the spec\'s curl example works verbatim against the local server', async () => {
  const created = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base', labels: { run: 'grpo-step-14' } })).json();
  const { stdout } = await run('sh', ['-c', `curl -s ${base}/v1/sandboxes/${created.id} \\\n  -H "Authorization: Bearer $COLLIMATE_API_KEY"`], { env: { ...process.env, COLLIMATE_API_KEY: proKey } });
  const body = JSON.parse(stdout);
  assert.equal(body.id, created.id);
  assert.equal(body.template, 'base');
  assert.equal(body.state, 'running');
  assert.deepEqual(body.labels, { run: 'grpo-step-14' });
  for (const f of ['age_secs', 'idle_secs', 'exec_count']) assert.equal(typeof body[f], 'number', f);
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${created.id}`, proKey);
});

test('the whole lifecycle over HTTP, every response checked against the OpenAPI contract', async () => {
  const health = await call(null, 'GET', '/healthz', null);
  assert.equal(health.status, 200);
  const openapi = (await call(null, 'GET', '/v1/openapi.json', null)).json();
  assert.equal(openapi.openapi.slice(0, 3), '3.1');
  const tpl = (await call('listTemplates', 'GET', '/v1/templates', proKey)).json();
  assert.ok(tpl.templates.some((t: any) => t.id === 'base'));
  assert.equal((await call('getTemplate', 'GET', '/v1/templates/base', proKey)).json().id, 'base');
  assert.ok((await call('listImages', 'GET', '/v1/images', proKey)).json().images.length >= 1);

  const sb = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base' })).json();
  const ex = await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, proKey, { command: 'echo hello; echo oops >&2; exit 3' });
  assert.equal(ex.json().stdout, 'hello\n');
  assert.equal(ex.json().stderr, 'oops\n');
  assert.equal(ex.json().exit_code, 3);

  // Streaming: chunks as server-sent events, then the result.
  const sse = await fetch(`${base}/v1/sandboxes/${sb.id}/exec`, {
    method: 'POST', headers: { authorization: `Bearer ${proKey}`, 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify({ command: 'echo one; sleep 0.3; echo two' }),
  });
  assert.match(sse.headers.get('content-type') ?? '', /text\/event-stream/);
  const events = (await sse.text()).split('\n\n').filter(Boolean).map((blk) => ({
    event: blk.match(/^event: (.*)$/m)?.[1], data: blk.match(/^data: (.*)$/m)?.[1],
  })).filter((e) => e.event);
  const out = events.filter((e) => e.event === 'stdout').map((e) => Buffer.from(JSON.parse(e.data!).data, 'base64').toString()).join('');
  assert.equal(out, 'one\ntwo\n');
  assert.equal(events.at(-1)!.event, 'result');
  assert.equal(JSON.parse(events.at(-1)!.data!).stdout, 'one\ntwo\n');

  // Files on a running sandbox.
  const put = await fetch(`${base}/v1/sandboxes/${sb.id}/files?path=/root/data.bin`, { method: 'PUT', headers: { authorization: `Bearer ${proKey}`, 'content-type': 'application/octet-stream' }, body: Buffer.from([0, 1, 2, 255]) });
  assert.equal(put.status, 200);
  const got = await fetch(`${base}/v1/sandboxes/${sb.id}/files?path=/root/data.bin`, { headers: { authorization: `Bearer ${proKey}` } });
  assert.deepEqual([...Buffer.from(await got.arrayBuffer())], [0, 1, 2, 255]);
  assert.equal((await call('readFile', 'GET', `/v1/sandboxes/${sb.id}/files?path=/nope`, proKey)).status, 404);

  await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, proKey, { command: 'echo parent > /root/who' });
  const fork = await call('forkSandbox', 'POST', `/v1/sandboxes/${sb.id}/fork`, proKey, { count: 2 });
  assert.equal(fork.status, 201);
  const kids = fork.json().sandboxes;
  assert.equal(kids.length, 2);
  for (const k of kids) {
    assert.equal(k.parent, sb.id);
    assert.equal((await call('execSandbox', 'POST', `/v1/sandboxes/${k.id}/exec`, proKey, { command: 'cat /root/who' })).json().stdout, 'parent\n');
  }
  const parent = (await call('getSandbox', 'GET', `/v1/sandboxes/${sb.id}`, proKey)).json();
  assert.deepEqual([...parent.children].sort(), kids.map((k: any) => k.id).sort());

  assert.equal((await call('suspendSandbox', 'POST', `/v1/sandboxes/${sb.id}/suspend`, proKey)).json().state, 'suspended');
  const bad = await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, proKey, { command: 'true' });
  assert.equal(bad.status, 409);
  assert.equal(bad.json().error.code, 'invalid_state');
  assert.equal((await call('resumeSandbox', 'POST', `/v1/sandboxes/${sb.id}/resume`, proKey)).json().state, 'running');
  assert.equal((await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, proKey, { command: 'cat /root/who' })).json().stdout, 'parent\n');
  const listed = (await call('listSandboxes', 'GET', '/v1/sandboxes?state=running', proKey)).json();
  assert.ok(listed.sandboxes.some((s: any) => s.id === sb.id));

  for (const id of [sb.id, ...kids.map((k: any) => k.id)]) assert.equal((await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`, proKey)).status, 204);
  assert.equal((await call('getSandbox', 'GET', `/v1/sandboxes/${sb.id}`, proKey)).status, 404);
});

test('demo tier: the third concurrent create is 429 with Retry-After; suspending frees a slot; non-catalog templates are 403', async () => {
  const a = (await call('createSandbox', 'POST', '/v1/sandboxes', demoKey, { template: 'base' })).json();
  const b = (await call('createSandbox', 'POST', '/v1/sandboxes', demoKey, { template: 'base' })).json();
  const third = await call('createSandbox', 'POST', '/v1/sandboxes', demoKey, { template: 'base' });
  assert.equal(third.status, 429);
  assert.equal(third.json().error.code, 'concurrency_limit');
  assert.ok(Number(third.headers.get('retry-after')) > 0);
  await call('suspendSandbox', 'POST', `/v1/sandboxes/${a.id}/suspend`, demoKey);
  const c = await call('createSandbox', 'POST', '/v1/sandboxes', demoKey, { template: 'base' });
  assert.equal(c.status, 201);
  const forbidden = await call('createSandbox', 'POST', '/v1/sandboxes', demoKey, { template: 'my-own-env' });
  assert.equal(forbidden.status, 403);
  assert.equal(forbidden.json().error.code, 'template_forbidden');
  for (const id of [a.id, b.id, c.json().id]) await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`, demoKey);
});

test('quotas on real VMs: a suspend past the tenant\'s suspended_sandboxes is 429 and its VM runs on; another tenant suspends meanwhile', async () => {
  const key = api.keys.create({ tenant: 'hoarder', tier: 'pro' }).key;
  const [a, b] = await Promise.all([0, 1].map(async () => (await call('createSandbox', 'POST', '/v1/sandboxes', key, { template: 'base' })).json()));
  assert.equal((await call('suspendSandbox', 'POST', `/v1/sandboxes/${a.id}/suspend`, key)).json().state, 'suspended');
  const refused = await call('suspendSandbox', 'POST', `/v1/sandboxes/${b.id}/suspend`, key);
  assert.equal(refused.status, 429);
  assert.equal(refused.json().error.code, 'quota_exceeded');
  assert.equal(refused.json().error.quota, 'suspended_sandboxes');
  assert.equal((await call('execSandbox', 'POST', `/v1/sandboxes/${b.id}/exec`, key, { command: 'echo still here' })).json().stdout, 'still here\n');
  const limits = (await call('getLimits', 'GET', '/v1/limits', key)).json();
  assert.deepEqual(limits.quotas.suspended_sandboxes, { limit: 1, used: 1 });
  const theirs = (await call('createSandbox', 'POST', '/v1/sandboxes', otherKey, { template: 'base' })).json();
  assert.equal((await call('suspendSandbox', 'POST', `/v1/sandboxes/${theirs.id}/suspend`, otherKey)).json().state, 'suspended', 'another tenant is not held back');
  // Resumed, a sandbox no longer counts.
  assert.equal((await call('resumeSandbox', 'POST', `/v1/sandboxes/${a.id}/resume`, key)).json().state, 'running');
  assert.equal((await call('suspendSandbox', 'POST', `/v1/sandboxes/${b.id}/suspend`, key)).json().state, 'suspended');
  for (const id of [a.id, b.id]) await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`, key);
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${theirs.id}`, otherKey);
});

test('on_timeout suspend on real VMs: a session that ends is suspended with its memory, and with auto_resume an exec resumes it', async () => {
  const sb = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base', timeout_secs: 600, on_timeout: 'suspend', auto_resume: true })).json();
  assert.deepEqual([sb.on_timeout, sb.auto_resume], ['suspend', true]);
  const plain = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base', on_timeout: 'suspend' })).json();
  // A shell variable lives only in the guest's memory: it is there after the resume only if the memory was kept.
  await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, proKey, { command: 'echo kept > /dev/shm/mark; sleep 1000 & echo $! > /dev/shm/pid' });
  await call('setSandboxTimeout', 'POST', `/v1/sandboxes/${sb.id}/timeout`, proKey, { timeout_secs: 2 });
  let state = '';
  for (const deadline = Date.now() + 60_000; Date.now() < deadline && state !== 'suspended'; await sleep(250)) {
    state = (await call('getSandbox', 'GET', `/v1/sandboxes/${sb.id}`, proKey)).json().state;
  }
  assert.equal(state, 'suspended', 'the reaper suspended it instead of deleting it');
  const r = (await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, proKey, { command: 'cat /dev/shm/mark; kill -0 $(cat /dev/shm/pid) && echo alive' })).json();
  assert.equal(r.stdout, 'kept\nalive\n', 'auto_resume brought it back with its memory and processes');
  assert.equal((await call('getSandbox', 'GET', `/v1/sandboxes/${sb.id}`, proKey)).json().state, 'running');
  // Without auto_resume, a suspended sandbox stays 409 until resumed.
  await call('suspendSandbox', 'POST', `/v1/sandboxes/${plain.id}/suspend`, proKey);
  const refused = await call('execSandbox', 'POST', `/v1/sandboxes/${plain.id}/exec`, proKey, { command: 'true' });
  assert.equal(refused.status, 409);
  for (const id of [sb.id, plain.id]) await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`, proKey);
});

test('keep_memory false on real VMs: the session\'s end keeps only the files, and the resume boots the guest afresh on them; it then suspends, resumes and forks as any', async () => {
  const exec = async (id: string, command: string) => {
    const r = (await call('execSandbox', 'POST', `/v1/sandboxes/${id}/exec`, proKey, { command })).json();
    assert.equal(r.exit_code, 0, `${command}: ${r.stderr}`);
    return r.stdout as string;
  };
  const sb = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base', timeout_secs: 600, on_timeout: 'suspend', keep_memory: false })).json();
  assert.deepEqual([sb.keep_memory, sb.memory_kept], [false, null]);
  const bootBefore = (await exec(sb.id, 'echo on-disk > /root/mark; echo in-memory > /tmp/mark; sleep 1000 >/dev/null 2>&1 & echo $! > /root/pid; cat /proc/sys/kernel/random/boot_id')).trim();
  await call('setSandboxTimeout', 'POST', `/v1/sandboxes/${sb.id}/timeout`, proKey, { timeout_secs: 2 });
  let view: any = {};
  for (const deadline = Date.now() + 60_000; Date.now() < deadline && view.state !== 'suspended'; await sleep(250)) {
    view = (await call('getSandbox', 'GET', `/v1/sandboxes/${sb.id}`, proKey)).json();
  }
  assert.equal(view.state, 'suspended', 'the reaper suspended it');
  assert.equal(view.memory_kept, false, 'with only its files, as its keep_memory says');
  assert.deepEqual(readdirSync(join(home, 'sandboxes', sb.id, 'suspend')).sort(), ['complete', 'disk-only'], 'no RAM image or device state was written');
  // A fork or a snapshot is made of memory, which it no longer has: 409 saying to resume it first.
  for (const [op, path, body] of [['forkSandbox', 'fork', { count: 1 }], ['createSnapshot', 'snapshots', {}]] as const) {
    const refused = await call(op, 'POST', `/v1/sandboxes/${sb.id}/${path}`, proKey, body);
    assert.equal(refused.status, 409, refused.text);
    assert.equal(refused.json().error.code, 'invalid_state');
    assert.match(refused.json().error.message, /only its files .*Resume it/);
  }
  const resumed = (await call('resumeSandbox', 'POST', `/v1/sandboxes/${sb.id}/resume`, proKey)).json();
  assert.deepEqual([resumed.state, resumed.memory_kept], ['running', null]);
  const after = (await exec(sb.id, 'cat /root/mark; cat /tmp/mark 2>/dev/null || echo no-tmp; kill -0 $(cat /root/pid) 2>/dev/null && echo alive || echo gone; cat /proc/sys/kernel/random/boot_id')).split('\n');
  assert.deepEqual(after.slice(0, 3), ['on-disk', 'no-tmp', 'gone'], 'the disk kept, /tmp (memory) and the process not');
  assert.notEqual(after[3], bootBefore, 'a fresh boot');

  // Booted afresh, it is a sandbox like any: a suspend asked to keep the memory keeps a process, and it forks.
  await exec(sb.id, 'sleep 1000 >/dev/null 2>&1 & echo $! > /root/pid2');
  const kept = (await call('suspendSandbox', 'POST', `/v1/sandboxes/${sb.id}/suspend`, proKey, { keep_memory: true })).json();
  assert.equal(kept.memory_kept, true);
  await call('resumeSandbox', 'POST', `/v1/sandboxes/${sb.id}/resume`, proKey);
  assert.equal(await exec(sb.id, 'kill -0 $(cat /root/pid2) && echo alive'), 'alive\n');
  const [child] = (await call('forkSandbox', 'POST', `/v1/sandboxes/${sb.id}/fork`, proKey, { count: 1 })).json().sandboxes;
  assert.equal(await exec(child.id, 'cat /root/mark'), 'on-disk\n');
  assert.equal(child.keep_memory, false, 'a child keeps its parent\'s keep_memory');

  // A sandbox that keeps its memory by default keeps only its files when the suspend says so.
  const plain = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base' })).json();
  assert.equal(plain.keep_memory, true);
  assert.equal((await call('suspendSandbox', 'POST', `/v1/sandboxes/${plain.id}/suspend`, proKey, { keep_memory: false })).json().memory_kept, false);
  const bad = await call('suspendSandbox', 'POST', `/v1/sandboxes/${sb.id}/suspend`, proKey, { keep_memory: 'no' });
  assert.equal(bad.status, 400);
  for (const id of [child.id, sb.id, plain.id]) await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${id}`, proKey);
});

test('a lease on real VMs: a session set to end in 2 s is reaped then; one set past the tier maximum is refused and runs on; a suspended one is 409', async () => {
  const short = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base', timeout_secs: 600 })).json();
  const keep = (await call('createSandbox', 'POST', '/v1/sandboxes', demoKey, { template: 'base', timeout_secs: 60 })).json();

  const refused = await call('setSandboxTimeout', 'POST', `/v1/sandboxes/${keep.id}/timeout`, demoKey, { timeout_secs: 901 });
  assert.equal(refused.status, 403);
  const err = refused.json().error;
  assert.equal(err.code, 'tier_forbidden');
  assert.match(err.message, /maximum session of 900 s/);
  assert.ok(err.max_timeout_secs > 800 && err.max_timeout_secs <= 900, String(err.max_timeout_secs));
  const extended = await call('setSandboxTimeout', 'POST', `/v1/sandboxes/${keep.id}/timeout`, demoKey, { timeout_secs: 800 });
  assert.equal(extended.status, 200);
  assert.ok(extended.json().remaining_secs > 790, 'extended past its 60 s timeout');
  assert.equal(extended.json().timeout_secs, 60);

  const leased = await call('setSandboxTimeout', 'POST', `/v1/sandboxes/${short.id}/timeout`, proKey, { timeout_secs: 2 });
  assert.equal(leased.status, 200);
  const endsAt = Date.parse(leased.json().expires_at);
  assert.ok(leased.json().remaining_secs <= 2);
  assert.equal((await call('getSandbox', 'GET', `/v1/sandboxes/${short.id}`, proKey)).json().state, 'running', 'not before its end');
  // The reaper runs every second: the sandbox is gone soon after its end, 10 minutes before its timeout_secs would have ended it.
  let gone = 0;
  for (const deadline = Date.now() + 20_000; Date.now() < deadline; await sleep(200)) {
    if ((await call('getSandbox', 'GET', `/v1/sandboxes/${short.id}`, proKey)).status === 404) {
      gone = Date.now();
      break;
    }
  }
  assert.ok(gone > 0, 'reaped by the lease');
  assert.ok(gone >= endsAt, `reaped ${endsAt - gone} ms before its end`);
  assert.equal((await call('execSandbox', 'POST', `/v1/sandboxes/${short.id}/exec`, proKey, { command: 'true' })).status, 404);

  const kept = (await call('getSandbox', 'GET', `/v1/sandboxes/${keep.id}`, demoKey)).json();
  assert.equal(kept.state, 'running', 'the refused lease ended nothing');
  assert.equal((await call('execSandbox', 'POST', `/v1/sandboxes/${keep.id}/exec`, demoKey, { command: 'echo alive' })).json().stdout, 'alive\n');
  await call('suspendSandbox', 'POST', `/v1/sandboxes/${keep.id}/suspend`, demoKey);
  const suspended = await call('setSandboxTimeout', 'POST', `/v1/sandboxes/${keep.id}/timeout`, demoKey, { timeout_secs: 60 });
  assert.equal(suspended.status, 409);
  assert.equal(suspended.json().error.code, 'invalid_state');
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${keep.id}`, demoKey);
});

test('tenant isolation: another tenant gets 404 for every id on every endpoint and never sees it listed', async () => {
  const mine = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base' })).json();
  const probes: Array<[string, string, string, unknown?]> = [
    ['getSandbox', 'GET', `/v1/sandboxes/${mine.id}`],
    ['execSandbox', 'POST', `/v1/sandboxes/${mine.id}/exec`, { command: 'true' }],
    ['forkSandbox', 'POST', `/v1/sandboxes/${mine.id}/fork`, { count: 1 }],
    ['suspendSandbox', 'POST', `/v1/sandboxes/${mine.id}/suspend`],
    ['resumeSandbox', 'POST', `/v1/sandboxes/${mine.id}/resume`],
    ['setSandboxTimeout', 'POST', `/v1/sandboxes/${mine.id}/timeout`, { timeout_secs: 1 }],
    ['readFile', 'GET', `/v1/sandboxes/${mine.id}/files?path=/etc/hostname`],
    ['deleteSandbox', 'DELETE', `/v1/sandboxes/${mine.id}`],
  ];
  for (const [op, method, path, body] of probes) {
    const r = await call(op, method, path, otherKey, body);
    assert.equal(r.status, 404, `${method} ${path} as another tenant: ${r.status} ${r.text}`);
  }
  const theirs = (await call('listSandboxes', 'GET', '/v1/sandboxes', otherKey)).json();
  assert.ok(!theirs.sandboxes.some((s: any) => s.id === mine.id));
  assert.equal((await call('getSandbox', 'GET', `/v1/sandboxes/${mine.id}`, proKey)).json().state, 'running', 'untouched by the other tenant');
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${mine.id}`, proKey);
});

test('bad input gets the right 4xx and code; 1,000 generated requests against the real engine never get a 5xx', async () => {
  assert.equal((await call(null, 'GET', '/v1/sandboxes', null)).status, 401);
  assert.equal((await call(null, 'GET', '/v1/sandboxes', 'clm_bogus')).status, 401);
  const unknown = await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base', colour: 'red' });
  assert.equal(unknown.status, 400);
  assert.equal(unknown.json().error.code, 'validation_error');
  assert.equal((await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 42 })).status, 400);
  const malformed = await call('createSandbox', 'POST', '/v1/sandboxes', proKey, '{"template": ');
  assert.equal(malformed.status, 400);
  assert.equal(malformed.json().error.code, 'invalid_json');
  assert.equal((await call('getSandbox', 'GET', '/v1/sandboxes/not-an-id', proKey)).status, 404);
  const huge = await call('createSandbox', 'POST', '/v1/sandboxes', proKey, JSON.stringify({ template: 'base', labels: { x: 'y'.repeat(20 * 1024 * 1024) } }));
  assert.equal(huge.status, 413);

  const sb = (await call('createSandbox', 'POST', '/v1/sandboxes', proKey, { template: 'base' })).json();
  let seed = 12345;
  const rnd = (n: number) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const pick = <T>(xs: T[]) => xs[rnd(xs.length)];
  const values = [null, 0, -1, 1e12, '', 'x', 'base', true, [], {}, [[1]], ['a'], { a: 1 }, 'sbx_000000000000', '../../etc/passwd'];
  const fields = ['command', 'code', 'commands', 'files', 'env', 'cwd', 'stdin', 'timeout', 'count', 'labels', 'template', 'bogus'];
  for (let i = 0; i < 1000; i++) {
    const body: Record<string, unknown> = {};
    for (let j = rnd(3); j >= 0; j--) body[pick(fields)] = pick(values);
    const target = pick([sb.id, 'sbx_ffffffffffff', 'garbage']);
    const [method, path] = pick([
      ['POST', `/v1/sandboxes/${target}/exec`], ['POST', `/v1/sandboxes/${target}/fork`], ['POST', '/v1/sandboxes'],
      ['GET', `/v1/sandboxes?state=${pick(['running', 'x', ''])}&limit=${pick(['0', '5', 'abc'])}`], ['GET', `/v1/sandboxes/${target}/files?path=${pick(['', 'rel', '/etc/hostname', '/nope'])}`],
      ['PATCH', `/v1/sandboxes/${target}`], ['GET', `/v1/templates/${pick(['base', 'nope', '%00'])}`],
    ]);
    const res = await fetch(base + path, {
      method, headers: { authorization: `Bearer ${proKey}`, 'content-type': 'application/json' },
      body: method === 'GET' ? undefined : rnd(10) === 0 ? '{not json' : JSON.stringify(body),
    });
    const text = await res.text();
    assert.ok(res.status < 500, `${method} ${path} ${JSON.stringify(body)} → ${res.status} ${text}`);
    if (res.status >= 400) assert.ok(JSON.parse(text).error.code, text);
    if (res.status === 201 && path === '/v1/sandboxes') await fetch(`${base}/v1/sandboxes/${JSON.parse(text).id}`, { method: 'DELETE', headers: { authorization: `Bearer ${proKey}` } });
    if (res.status === 201 && path.endsWith('/fork')) {
      for (const k of JSON.parse(text).sandboxes) await fetch(`${base}/v1/sandboxes/${k.id}`, { method: 'DELETE', headers: { authorization: `Bearer ${proKey}` } });
    }
  }
  assert.equal((await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, proKey, { command: 'echo ok' })).json().stdout, 'ok\n');
  await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${sb.id}`, proKey);
});

// ---- a real `collimate serve` process, SIGKILLed ----------------------------------------------

const cli = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

function startServe(serveHome: string, port: number): Promise<ChildProcess> {
  const child = spawn(process.execPath, ['--import', 'tsx', cli, 'serve', '--home', serveHome, '--port', String(port)], {
    env: { ...process.env, COLLIMATE_CACHE_DIR: TEST_CACHE, COLLIMATE_POOL_SIZE: '1', COLLIMATE_LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  child.stderr!.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    const deadline = Date.now() + 180_000;
    const poll = async () => {
      if (child.exitCode !== null) return reject(new Error(`serve exited: ${err}`));
      try {
        const r = await fetch(`http://127.0.0.1:${port}/healthz`);
        if (r.status === 200) return resolve(child);
      } catch { /* not listening yet */ }
      if (Date.now() > deadline) return reject(new Error(`serve did not become healthy: ${err}`));
      setTimeout(poll, 200);
    };
    void poll();
  });
}

test('SIGKILL the server holding 5 running and 2 suspended sandboxes; after restart all 7 are listed and the running ones take execs', async () => {
  const serveHome = testHome('api-serve');
  const port = 20000 + Math.floor(Math.random() * 20000);
  const { stdout } = await run(process.execPath, ['--import', 'tsx', cli, 'keys', 'create', '--tenant', 'crashy', '--tier', 'pro', '--home', serveHome]);
  const key = stdout.trim().split('\n').pop()!;
  const h = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  let server = await startServe(serveHome, port);
  const url = `http://127.0.0.1:${port}`;
  const ids: string[] = [];
  for (let i = 0; i < 7; i++) {
    const r = await fetch(`${url}/v1/sandboxes`, { method: 'POST', headers: h, body: JSON.stringify({ template: 'base', labels: { i: String(i) } }) });
    assert.equal(r.status, 201);
    const id = ((await r.json()) as any).id;
    ids.push(id);
    await fetch(`${url}/v1/sandboxes/${id}/exec`, { method: 'POST', headers: h, body: JSON.stringify({ command: `echo ${i} > /root/i` }) });
  }
  for (const id of ids.slice(5)) assert.equal((await fetch(`${url}/v1/sandboxes/${id}/suspend`, { method: 'POST', headers: h })).status, 200);
  server.kill('SIGKILL');
  await new Promise((r) => server.once('exit', r));
  server = await startServe(serveHome, port);
  try {
    const list = (await (await fetch(`${url}/v1/sandboxes?limit=100`, { headers: h })).json()) as any;
    const states = Object.fromEntries(list.sandboxes.map((s: any) => [s.id, s.state]));
    assert.deepEqual(Object.keys(states).sort(), [...ids].sort());
    for (const id of ids.slice(0, 5)) assert.equal(states[id], 'running');
    for (const id of ids.slice(5)) assert.equal(states[id], 'suspended');
    for (const [i, id] of ids.slice(0, 5).entries()) {
      const r = (await (await fetch(`${url}/v1/sandboxes/${id}/exec`, { method: "POST", headers: h, body: JSON.stringify({ command: "cat /root/i" }) })).json()) as any;
      assert.equal(r.stdout, `${i}\n`);
    }
    for (const id of ids) assert.equal((await fetch(`${url}/v1/sandboxes/${id}`, { method: 'DELETE', headers: h })).status, 204);
  } finally {
    server.kill('SIGTERM');
    await new Promise((r) => server.once('exit', r));
  }
  await sleep(200);
  const e2 = await openEngine(serveHome, { poolSize: 0 });
  await assertNoLeaks(e2, serveHome);
});
