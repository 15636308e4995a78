/** GET /v1/sandboxes/{id}/execs: each sandbox's recent execs, newest first, kept in SQLite, only the tenant's own. */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { EXEC_LOG_PER_SANDBOX, execSummary } from '../../../src/service/execLog.js';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

describe('recent execs', () => {
  let f: Fixture;
  before(async () => (f = await fixture()));
  after(() => f.close());

  test('command, exit code and duration, newest first; another tenant gets 404', async () => {
    const key = f.key('acme', 'pro');
    const id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
    let r = await f.req('listExecs', { url: `/v1/sandboxes/${id}/execs`, key });
    assert.deepEqual(r.json(), { execs: [] });
    await f.req('execSandbox', { url: `/v1/sandboxes/${id}/exec`, key, body: { command: 'echo one' } });
    await f.req('execSandbox', { url: `/v1/sandboxes/${id}/exec`, key, body: { command: 'cat /missing' } });
    r = await f.req('listExecs', { url: `/v1/sandboxes/${id}/execs`, key });
    assert.equal(r.statusCode, 200);
    const execs = r.json().execs;
    assert.deepEqual(execs.map((e: { command: string; exit_code: number }) => [e.command, e.exit_code]), [['cat /missing', 1], ['echo one', 0]]);
    for (const e of execs) {
      assert.ok(Number.isInteger(e.duration_ms) && e.duration_ms >= 0);
      assert.ok(!Number.isNaN(Date.parse(e.started_at)));
      assert.equal(e.timed_out, false);
    }
    r = await f.req('listExecs', { url: `/v1/sandboxes/${id}/execs?limit=1`, key });
    assert.equal(r.json().execs.length, 1);
    assertErrorBody(await f.req('listExecs', { url: `/v1/sandboxes/${id}/execs`, key: f.key('other', 'pro') }), 'sandbox_not_found');
    assertErrorBody(await f.req('listExecs', { url: `/v1/sandboxes/${id}/execs?limit=0`, key }), 'validation_error');
    assertErrorBody(await f.req('listExecs', { url: `/v1/sandboxes/${id}/execs?limit=51`, key }), 'validation_error');
  });

  test('only the last 50 are kept, and a deleted sandbox\'s go with it', async () => {
    const key = f.key('acme', 'pro');
    const id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
    for (let i = 0; i < EXEC_LOG_PER_SANDBOX + 5; i++) await f.req('execSandbox', { url: `/v1/sandboxes/${id}/exec`, key, body: { command: `echo ${i}` } });
    const execs = (await f.req('listExecs', { url: `/v1/sandboxes/${id}/execs`, key })).json().execs;
    assert.equal(execs.length, EXEC_LOG_PER_SANDBOX);
    assert.equal(execs[0].command, `echo ${EXEC_LOG_PER_SANDBOX + 4}`);
    assert.equal(execs.at(-1).command, 'echo 5');
    const rows = () => (f.db.prepare('SELECT COUNT(*) AS n FROM api_execs WHERE sandbox = ?').get(id) as { n: number }).n;
    assert.equal(rows(), EXEC_LOG_PER_SANDBOX);
    await f.req('deleteSandbox', { url: `/v1/sandboxes/${id}`, key });
    f.svc.emit('transition', { id, tenant: 'acme', state: 'deleted', op: 'delete' });
    assert.equal(rows(), 0);
  });

  test('a summary is one line and never more than 200 characters', () => {
    assert.equal(execSummary({ command: 'echo  a\n  b' }), 'echo a b');
    assert.equal(execSummary({ code: '\n\nprint(1)\nprint(2)' }), '[code] print(1)');
    assert.equal(execSummary({ commands: [['ls', '-l'], ['true']] }), 'ls -l && true');
    const long = execSummary({ command: 'x'.repeat(500) });
    assert.equal(long.length, 200);
    assert.ok(long.endsWith('…'));
  });
});
