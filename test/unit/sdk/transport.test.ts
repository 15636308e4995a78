import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Collimate, ConnectionError, ServerError, TimeoutError, ConcurrencyLimitError } from '../../../src/sdk/index.js';
import { parseSse } from '../../../src/sdk/transport.js';

const SANDBOX = {
  id: 'sbx_0123456789ab', template: 'base', state: 'running', labels: {}, created_at: '', age_secs: 0, idle_secs: 0, exec_count: 0,
  parent: null, forked_at: null, children: [], timeout_secs: 900, expires_at: '', vcpus: 1, memory_mib: 256, disk_mib: 1024,
};

type Step = (req: { method: string; url: string; headers: Headers }) => Response | Promise<Response> | 'network' | 'hang';

/** A fetch that answers from a script of steps and records every request. */
function scripted(steps: Step[]) {
  const seen: Array<{ method: string; url: string; headers: Headers }> = [];
  const f: typeof fetch = async (input, init) => {
    const req = { method: init?.method ?? 'GET', url: String(input), headers: new Headers(init?.headers) };
    seen.push(req);
    const step = steps.shift();
    if (!step) throw new Error('no more steps');
    const r = await step(req);
    if (r === 'network') throw new TypeError('fetch failed', { cause: { code: 'ECONNRESET' } });
    if (r === 'hang') {
      return new Promise<Response>((_, reject) => init?.signal?.addEventListener('abort', () => reject(new DOMException('aborted', 'AbortError'))));
    }
    return r;
  };
  return { fetch: f, seen };
}

const json = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
const unavailable = () => json(503, { error: { code: 'shutting_down', message: 'x' } }, { 'retry-after': '0' });

test('create retries network errors and 503 with one Idempotency-Key', async () => {
  const s = scripted([() => 'network', unavailable, () => json(201, SANDBOX)]);
  const c = new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s.fetch });
  const sb = await c.sandboxes.create({ template: 'base' });
  assert.equal(sb.id, SANDBOX.id);
  assert.equal(s.seen.length, 3);
  const keys = s.seen.map((r) => r.headers.get('idempotency-key'));
  assert.ok(keys[0] && keys.every((k) => k === keys[0]));
  assert.equal(s.seen[0].headers.get('authorization'), 'Bearer k');
  // A second create gets a fresh key.
  const s2 = scripted([() => json(201, SANDBOX)]);
  await new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s2.fetch }).sandboxes.create({ template: 'base' });
  assert.notEqual(s2.seen[0].headers.get('idempotency-key'), keys[0]);
});

test('create does not retry a 429: the cap is not transient', async () => {
  const s = scripted([() => json(429, { error: { code: 'concurrency_limit', message: 'full' } }, { 'retry-after': '5' })]);
  const c = new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s.fetch });
  await assert.rejects(c.sandboxes.create({ template: 'base' }), (e: unknown) => e instanceof ConcurrencyLimitError && e.retryAfter === 5);
  assert.equal(s.seen.length, 1);
});

test('GETs retry 502/503/504 and network errors; they give up after maxRetries', async () => {
  const s = scripted([() => 'network', () => json(502, {}), () => json(200, SANDBOX)]);
  const c = new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s.fetch });
  assert.equal((await c.sandboxes.get(SANDBOX.id)).id, SANDBOX.id);
  assert.equal(s.seen.length, 3);
  const s2 = scripted([unavailable, unavailable, unavailable]);
  await assert.rejects(new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s2.fetch, maxRetries: 2 }).images(), ServerError);
  assert.equal(s2.seen.length, 3);
});

test('exec, suspend, resume and delete are never retried', async () => {
  const s = scripted([() => json(200, SANDBOX), () => 'network', unavailable, unavailable, () => 'network']);
  const c = new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s.fetch });
  const sb = await c.sandboxes.get(SANDBOX.id);
  await assert.rejects(sb.exec({ command: 'true' }), ConnectionError);
  await assert.rejects(sb.suspend(), ServerError);
  await assert.rejects(sb.resume(), ServerError);
  await assert.rejects(sb.delete(), ConnectionError);
  assert.equal(s.seen.length, 5);
});

test('a start from a snapshot retries with one Idempotency-Key; taking, restoring and deleting snapshots are never retried', async () => {
  const s = scripted([() => 'network', unavailable, () => json(201, { ...SANDBOX, from_snapshot: 'snap_0123456789abcdef' })]);
  const c = new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s.fetch });
  const sb = await c.sandboxes.fromSnapshot('snap_0123456789abcdef');
  assert.equal(sb.fromSnapshot, 'snap_0123456789abcdef');
  const keys = s.seen.map((r) => r.headers.get('idempotency-key'));
  assert.equal(keys.length, 3);
  assert.ok(keys[0] && keys.every((k) => k === keys[0]));

  const s2 = scripted([() => json(200, SANDBOX), () => 'network', unavailable, () => 'network']);
  const c2 = new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s2.fetch });
  const sb2 = await c2.sandboxes.get(SANDBOX.id);
  await assert.rejects(sb2.snapshot(), ConnectionError);
  await assert.rejects(sb2.restore('snap_0123456789abcdef'), ServerError);
  await assert.rejects(c2.snapshots.delete('snap_0123456789abcdef'), ConnectionError);
  assert.deepEqual(s2.seen.map((r) => `${r.method} ${new URL(r.url).pathname}`), [
    `GET /v1/sandboxes/${SANDBOX.id}`,
    `POST /v1/sandboxes/${SANDBOX.id}/snapshots`,
    `POST /v1/sandboxes/${SANDBOX.id}/restore`,
    'DELETE /v1/snapshots/snap_0123456789abcdef',
  ]);
});

test('a client-side timeout is a TimeoutError, not retried', async () => {
  const s = scripted([() => 'hang']);
  const c = new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s.fetch, timeoutMs: 50 });
  await assert.rejects(c.images(), (e: unknown) => e instanceof TimeoutError && e.code === 'client_timeout');
  assert.equal(s.seen.length, 1);
});

test('list walks pages with the label filter and the cursor', async () => {
  const page = (ids: string[], next: string | null) => json(200, { sandboxes: ids.map((id) => ({ ...SANDBOX, id })), next });
  const s = scripted([() => page(['sbx_000000000001', 'sbx_000000000002'], 'sbx_000000000002'), () => page(['sbx_000000000003'], null)]);
  const c = new Collimate({ apiKey: 'k', baseUrl: 'http://h', fetch: s.fetch });
  const all = await c.sandboxes.list({ labels: { run: 'r1', team: 'a b' }, state: 'running', limit: 2 }).all();
  assert.deepEqual(all.map((x) => x.id), ['sbx_000000000001', 'sbx_000000000002', 'sbx_000000000003']);
  const u1 = new URL(s.seen[0].url);
  assert.deepEqual(u1.searchParams.getAll('label'), ['run=r1', 'team=a b']);
  assert.equal(u1.searchParams.get('state'), 'running');
  assert.equal(u1.searchParams.get('after'), null);
  assert.equal(new URL(s.seen[1].url).searchParams.get('after'), 'sbx_000000000002');
});

test('parseSse: events, multi-line data, comments, CRLF, chunk boundaries anywhere', async () => {
  const text = ': ping\r\n\r\nevent: stdout\r\ndata: {"data":"aGk="}\r\n\r\nevent: result\ndata: {"a":\ndata: 1}\n\n';
  const bytes = new TextEncoder().encode(text);
  const body = new ReadableStream<Uint8Array>({
    start(ctrl) {
      for (let i = 0; i < bytes.length; i += 3) ctrl.enqueue(bytes.slice(i, i + 3));
      ctrl.close();
    },
  });
  const events = [];
  for await (const e of parseSse(body)) events.push(e);
  assert.deepEqual(events, [
    { event: 'stdout', data: '{"data":"aGk="}' },
    { event: 'result', data: '{"a":\n1}' },
  ]);
});
