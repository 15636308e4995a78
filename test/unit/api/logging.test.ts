import assert from 'node:assert/strict';
import { test } from 'node:test';
import pino from 'pino';
import { CollimateError } from '../../../src/errors.js';
import { loggedUrl, serverLoggerOptions } from '../../../src/api/logging.js';
import { fixture } from './helpers.js';

/** A server whose log lines (the options `collimate serve` uses) are kept, parsed, for the test. */
async function loggedFixture() {
  const lines: string[] = [];
  const f = await fixture({ fake: { events: true }, server: { logger: serverLoggerOptions('info', { write: (l: string) => void lines.push(l) }) } });
  const records = () => lines.map((l) => JSON.parse(l) as Record<string, any>);
  return { f, lines, records };
}

test('every log line is one JSON object with a level name and an ISO time', async () => {
  const { f, lines } = await loggedFixture();
  try {
    await f.req('listSandboxes', { url: '/v1/sandboxes', key: f.key('acme') });
    assert.ok(lines.length > 0);
    for (const l of lines) {
      assert.ok(l.endsWith('\n') && !l.slice(0, -1).includes('\n'), `one line: ${l}`);
      const o = JSON.parse(l);
      assert.equal(typeof o.msg, 'string');
      assert.match(o.level, /^(info|warn|error|debug)$/);
      assert.match(o.time, /^\d{4}-\d\d-\d\dT/);
    }
  } finally {
    await f.close();
  }
});

test('one line per request with its id, sandbox and tenant; the id comes back in X-Request-Id', async () => {
  const { f, records } = await loggedFixture();
  try {
    const key = f.key('acme');
    const created = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } });
    const id = created.json().id;
    const r = await f.req('execSandbox', { url: `/v1/sandboxes/${id}/exec`, key, body: { command: 'echo hi' }, headers: { 'x-request-id': 'proxy-abc.123' } });
    assert.equal(r.statusCode, 200);
    assert.equal(r.headers['x-request-id'], 'proxy-abc.123');
    const line = records().filter((o) => o.msg === 'request' && o.reqId === 'proxy-abc.123');
    assert.equal(line.length, 1, JSON.stringify(records()));
    assert.deepEqual(
      { method: line[0].method, url: line[0].url, status: line[0].status, sandbox_id: line[0].sandbox_id, tenant: line[0].tenant },
      { method: 'POST', url: `/v1/sandboxes/${id}/exec`, status: 200, sandbox_id: id, tenant: 'acme' },
    );
    assert.equal(typeof line[0].ms, 'number');
    assert.equal(line[0].aborted, undefined, 'a response sent whole is not marked aborted');
    // An id the client may not choose is replaced by a fresh one.
    const bad = await f.req('listSandboxes', { url: '/v1/sandboxes', key, headers: { 'x-request-id': 'has space "and quotes"' } });
    assert.match(String(bad.headers['x-request-id']), /^req-[0-9a-f]{16}$/);
    // Images' and templates' ids are not sandbox ids.
    await f.req('getTemplate', { url: '/v1/templates/base', key });
    assert.equal(records().find((o) => o.msg === 'request' && o.url === '/v1/templates/base')?.sandbox_id, undefined);
  } finally {
    await f.close();
  }
});

test('one line per lifecycle transition, with the sandbox and tenant', async () => {
  const { f, records } = await loggedFixture();
  try {
    const key = f.key('acme', 'pro');
    const id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json().id;
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${id}/suspend`, key });
    await f.req('resumeSandbox', { url: `/v1/sandboxes/${id}/resume`, key });
    const children = (await f.req('forkSandbox', { url: `/v1/sandboxes/${id}/fork`, key, body: { count: 2 } })).json().sandboxes.map((s: any) => s.id);
    await f.req('deleteSandbox', { url: `/v1/sandboxes/${id}`, key });
    const t = records().filter((o) => o.msg === 'sandbox transition').map((o) => [o.sandbox_id, o.op, o.state, o.tenant, o.event]);
    assert.deepEqual(t, [
      [id, 'create', 'running', 'acme', 'transition'],
      [id, 'suspend', 'suspended', 'acme', 'transition'],
      [id, 'resume', 'running', 'acme', 'transition'],
      ...children.map((c: string) => [c, 'fork', 'running', 'acme', 'transition']),
      [id, 'delete', 'deleted', 'acme', 'transition'],
    ]);
  } finally {
    await f.close();
  }
});

test('one line per lifecycle phase report, with wall times and CPU times', async () => {
  const { f, records } = await loggedFixture();
  try {
    f.svc.emit('phases', { op: 'fork', id: 'sbx_000000000001', phases: { stop: 3.04, agent_ack: 40 }, cpuMs: { server: 12.34, children_vmm: 70 }, totalMs: 400 });
    const line = records().find((o) => o.msg === 'lifecycle phases');
    assert.ok(line, 'a lifecycle phases line');
    assert.deepEqual([line.sandbox_id, line.op, line.total_ms], ['sbx_000000000001', 'fork', 400]);
    assert.deepEqual(line.phases_ms, { stop: 3, agent_ack: 40 });
    assert.deepEqual(line.cpu_ms, { server: 12.3, children_vmm: 70 });
  } finally {
    await f.close();
  }
});

test('the internal cause is logged with the request id while the client gets only the message', async () => {
  const { f, records } = await loggedFixture();
  try {
    const key = f.key('acme');
    const id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json().id;
    f.svc.exec = async () => { throw new Error('qmp socket /run/x/qmp.sock closed: ECONNRESET'); };
    const r = await f.req('execSandbox', { url: `/v1/sandboxes/${id}/exec`, key, body: { command: 'true' }, allow5xx: true });
    assert.equal(r.statusCode, 500);
    const reqId = String(r.headers['x-request-id']);
    assert.equal(r.json().error.code, 'internal_error');
    assert.ok(r.json().error.message.includes(`request ${reqId}`), r.body);
    assert.doesNotMatch(r.body, /qmp|ECONNRESET/);
    const err = records().find((o) => o.level === 'error' && o.reqId === reqId);
    assert.ok(err, JSON.stringify(records()));
    assert.equal(err.sandbox_id, id);
    assert.equal(err.tenant, 'acme');
    assert.match(err.err.message, /qmp socket .* closed: ECONNRESET/);
    assert.match(err.err.stack, /Error: qmp socket/);

    // A service error the client sees as a message keeps its cause in the log.
    f.svc.exec = async () => { throw new CollimateError('vmm_failed', 'The exec failed inside the VMM; retry.', { cause: new Error('QMP: migration status failed') }); };
    const r2 = await f.req('execSandbox', { url: `/v1/sandboxes/${id}/exec`, key, body: { command: 'true' }, allow5xx: true });
    assert.equal(r2.json().error.code, 'vmm_failed');
    assert.doesNotMatch(r2.body, /migration status/);
    const err2 = records().find((o) => o.level === 'error' && o.reqId === r2.headers['x-request-id']);
    assert.match(err2?.err.message ?? '', /retry\.: QMP: migration status failed/);
  } finally {
    await f.close();
  }
});

test('signed port-URL tokens never reach the log', () => {
  assert.equal(loggedUrl('/v1/p/eyJhbGciOi.sig/index.html?x=1'), '/v1/p/<token>/index.html?x=1');
  assert.equal(loggedUrl('/v1/p/tok'), '/v1/p/<token>');
  // E2B's file signatures and a signed URL's token on a port's own origin are credentials too.
  assert.equal(loggedUrl('/e2b/envd/files?path=/a&signature=v1_abc&signature_expiration=9&username=user'), '/e2b/envd/files?path=/a&signature=<redacted>&signature_expiration=9&username=user');
  assert.equal(loggedUrl('/v1/sandboxes/sbx_1/ports/80/__collimate/signed?token=AbC-_&next=%2F'), '/v1/sandboxes/sbx_1/ports/80/__collimate/signed?token=<redacted>&next=%2F');
  assert.equal(loggedUrl('/v1/sandboxes/sbx_0123456789ab/ports/80/'), '/v1/sandboxes/sbx_0123456789ab/ports/80/');
});

test('a refusal the client is told to retry is a warning naming what was short, not an error with a stack', async () => {
  const { toClientError } = await import('../../../src/wire/errors.js');
  // The server's own logger: its methods need their `this` (a detached one threw, and every 503 became a 500).
  const lines: any[] = [];
  const log = pino({ level: 'info' }, { write: (s: string) => { lines.push(JSON.parse(s)); } });
  const refused = new CollimateError('host_at_capacity', 'The tmpfs holding sandboxes\' RAM files has 12 MiB free.', { retryAfterSecs: 30, details: { resource: 'tmpfs' } });
  assert.equal(toClientError(refused, log), refused);
  assert.deepEqual(lines.map((l) => [l.level, l.code, l.details?.resource, 'err' in l]), [[40, 'host_at_capacity', 'tmpfs', false]]);
  lines.length = 0;
  toClientError(new CollimateError('vmm_failed', 'The fork failed inside the VMM: boom.'), log);
  assert.deepEqual(lines.map((l) => [l.level, 'err' in l]), [[50, true]], 'a fault is still an error with its cause');
});
