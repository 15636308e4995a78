import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertErrorBody, fixture } from './helpers.js';

test('healthz: 200 ok once the service is ready, 503 before', async () => {
  const f = await fixture();
  try {
    f.svc.ready = false;
    let r = await f.req('health', { url: '/healthz' });
    assert.equal(r.statusCode, 503);
    // What `collimate serve` answers (src/server/assemble.ts): under TCG a development host, and the fake has no VMM jail.
    const served = {
      accel: 'tcg', mode: 'development', isolation: 'QEMU does not treat TCG guest escapes as security bugs',
      confinement: { enabled: false, reason: 'engine without VMM confinement' }, network: { enabled: true },
    };
    assert.deepEqual(r.json(), { status: 'starting', templates_ready: false, ...served });
    f.svc.ready = true;
    r = await f.req('health', { url: '/healthz' });
    assert.equal(r.statusCode, 200);
    assert.deepEqual(r.json(), { status: 'ok', templates_ready: true, ...served });
  } finally {
    await f.close();
  }
});

test("metrics name no tenant or environment, unless the operator's scrape carries COLLIMATE_METRICS_TOKEN", async () => {
  const f = await fixture({ server: { metricsToken: 'operator-secret' } });
  try {
    f.svc.poolSizes = () => ({ python: 2, 'acme/app': 1, 'globex/secret-project': 3 });
    const scrape = async (authorization?: string) => (await f.req('metrics', { url: '/metrics', ...(authorization ? { headers: { authorization } } : {}) })).body;
    for (const text of [await scrape(), await scrape('Bearer wrong'), await scrape(`Bearer ${f.key('acme', 'pro')}`)]) {
      assert.match(text, /collimate_pool_size\{template="python"\} 2/);
      assert.match(text, /collimate_pool_size\{template="environments"\} 4/);
      assert.doesNotMatch(text, /acme|globex|secret-project/);
    }
    const named = await scrape('Bearer operator-secret');
    assert.match(named, /collimate_pool_size\{template="acme\/app"\} 1/);
    assert.match(named, /collimate_pool_size\{template="globex\/secret-project"\} 3/);
  } finally {
    await f.close();
  }
});

test('metrics: Prometheus text with latency histograms, sandboxes by state, pool sizes', async () => {
  const f = await fixture();
  try {
    const key = f.key('m', 'pro');
    const s = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json();
    await f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'echo' } });
    await f.req('forkSandbox', { url: `/v1/sandboxes/${s.id}/fork`, key, body: { count: 2 } });
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${s.id}/suspend`, key });
    const r = await f.req('metrics', { url: '/metrics' });
    assert.equal(r.statusCode, 200);
    assert.match(String(r.headers['content-type']), /^text\/plain; version=0\.0\.4/);
    const text = r.body;
    for (const name of ['collimate_create_seconds', 'collimate_exec_seconds', 'collimate_fork_seconds']) {
      assert.match(text, new RegExp(`# TYPE ${name} histogram`));
      assert.match(text, new RegExp(`${name}_bucket\\{[^}]*le="\\+Inf"\\} 1`));
      assert.match(text, new RegExp(`${name}_count(\\{[^}]*\\})? 1`));
    }
    assert.match(text, /collimate_sandboxes\{state="running"\} 2/);
    assert.match(text, /collimate_sandboxes\{state="suspended"\} 1/);
    assert.match(text, /collimate_pool_size\{template="python"\} 2/);
    assert.match(text, /collimate_http_requests_total\{method="POST",route="\/v1\/sandboxes",status="201"\} 1/);
    // Every sample line parses as `name{labels} value`.
    for (const line of text.split('\n').filter((l) => l && !l.startsWith('#'))) {
      assert.match(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|\+Inf|NaN)$/, line);
    }
  } finally {
    await f.close();
  }
});

test('shutdown: in-flight requests finish, new ones get 503 shutting_down, the service stays open', async () => {
  const f = await fixture({ fake: { opDelayMs: 200 } });
  const key = f.key('s', 'pro');
  const inflight = f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } });
  await new Promise((r) => setTimeout(r, 20));
  const stopping = f.api.shutdown(2000);
  const late = await f.api.app.inject({ method: 'GET', url: '/v1/sandboxes', headers: { authorization: `Bearer ${key}` } });
  assertErrorBody(late, 'shutting_down');
  assert.equal(late.headers['retry-after'], '5');
  assert.equal((await inflight).statusCode, 201, 'the in-flight create completed');
  await stopping;
  assert.equal(f.svc.closed, false, 'closing the service is the caller’s step');
  await f.close();
});

test('shutdown: requests still running after the grace period fail with 503 shutting_down', async () => {
  const f = await fixture();
  const key = f.key('s2', 'pro');
  const s = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json();
  const slow = f.req('execSandbox', { url: `/v1/sandboxes/${s.id}/exec`, key, body: { command: 'sleep 1' } });
  const stream = f.api.app.inject({ method: 'POST', url: `/v1/sandboxes/${s.id}/exec`, headers: { authorization: `Bearer ${key}`, accept: 'text/event-stream', 'content-type': 'application/json' }, payload: '{"command":"sleep 1"}' });
  await new Promise((r) => setTimeout(r, 20));
  await f.api.shutdown(100);
  // Had the shutdown waited for the exec, the exec would have finished (200) before the answer.
  assertErrorBody(await slow, 'shutting_down');
  const sse = await stream;
  assert.match(sse.body, /event: error\ndata: \{"error":\{"code":"shutting_down"/);
  await f.close();
});

test('a real listening server stops accepting connections on shutdown', async () => {
  const f = await fixture();
  const address = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  const ok = await fetch(`${address}/healthz`);
  assert.equal(ok.status, 200);
  await f.api.shutdown(100);
  await assert.rejects(fetch(`${address}/healthz`));
  await f.close();
});
