/**
 * GET /v1/sandboxes/{id}/logs over the fake engine (with its transition events): what happens to a
 * sandbox is written as it happens — lifecycle, execs, background processes, the reaper, failures —
 * read back by cursor, direction, level and search; bad queries are validation_error; only the
 * tenant's own; gone with the sandbox.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { CollimateError } from '../../../src/errors.js';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

interface Entry { timestamp: string; level: string; message: string; fields: Record<string, string> }

describe('sandbox logs over REST', () => {
  let f: Fixture;
  let key: string;
  before(async () => {
    f = await fixture({ fake: { events: true } });
    key = f.key('acme', 'pro');
  });
  after(() => f.close());

  const create = async () => (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id as string;
  const logs = async (id: string, query = '', k = key): Promise<Entry[]> => {
    const r = await f.req('getSandboxLogs', { url: `/v1/sandboxes/${id}/logs${query}`, key: k });
    assert.equal(r.statusCode, 200, r.body);
    return r.json().logs;
  };
  const exec = (id: string, body: object) => f.req('execSandbox', { url: `/v1/sandboxes/${id}/exec`, key, body, allow5xx: true });

  test('lifecycle, execs, background processes, the fork and the reaper are written as they happen, oldest first', async () => {
    const id = await create();
    await exec(id, { command: 'echo hello', env: { TOKEN: 'SECRET-ENV' }, stdin: 'SECRET-STDIN' });
    await exec(id, { command: 'exit 3' });
    const started = await f.req('startProcess', { url: `/v1/sandboxes/${id}/processes`, key, body: { command: 'echo from-background', tag: 'bg', env: { K: 'SECRET-ENV' } } });
    assert.equal(started.statusCode, 201, started.body);
    const pid = started.json().pid;
    const child = (await f.req('forkSandbox', { url: `/v1/sandboxes/${id}/fork`, key, body: { count: 1 } })).json().sandboxes[0].id;
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${id}/suspend`, key });
    f.svc.emit('reaped', { id, tenant: 'acme', action: 'suspend' });
    await f.req('resumeSandbox', { url: `/v1/sandboxes/${id}/resume`, key });

    const all = await logs(id);
    const byEvent = (event: string) => all.filter((e) => e.fields.event === event);
    assert.deepEqual(byEvent('lifecycle').map((e) => e.fields.op), ['create', 'fork', 'suspend', 'resume']);
    assert.equal(all[0].message, 'Sandbox created');
    const execs = byEvent('exec');
    assert.deepEqual(execs.map((e) => [e.level, e.fields.command, e.fields.exit_code]), [['info', 'echo hello', '0'], ['warn', 'exit 3', '3']]);
    assert.match(execs[0].message, /^Exec exited 0 in \d+ ms: echo hello$/);
    assert.ok(Number(execs[0].fields.duration_ms) >= 0);
    const processes = byEvent('process');
    assert.deepEqual(processes.map((e) => [e.fields.pid, e.fields.tag, e.fields.status ?? 'started']), [[String(pid), 'bg', 'started'], [String(pid), 'bg', 'exited']]);
    assert.equal(processes[1].message, `Process ${pid} exited 0: echo from-background`);
    assert.deepEqual(byEvent('reaper').map((e) => e.message), ['Session timed out: the sandbox was suspended']);
    assert.match(all.find((e) => e.fields.op === 'fork')!.message, new RegExp(`Forked into 1: ${child}`));
    assert.ok(!JSON.stringify(all).includes('SECRET'), 'no stdin or env value is written');
    const times = all.map((e) => Date.parse(e.timestamp));
    assert.deepEqual(times, [...times].sort((a, b) => a - b));
    // The child has its own log, from its start.
    assert.deepEqual((await logs(child)).map((e) => e.fields.op), ['fork']);
  });

  test('level, search, direction, cursor and limit', async () => {
    const id = await create();
    await exec(id, { command: 'echo one' });
    await sleep(5);
    await exec(id, { command: 'exit 1' });
    await sleep(5);
    await exec(id, { command: 'echo two' });
    const all = await logs(id);
    assert.equal(all.length, 4);
    assert.deepEqual((await logs(id, '?level=warn')).map((e) => e.fields.command), ['exit 1']);
    assert.deepEqual((await logs(id, '?level=error')), []);
    assert.deepEqual((await logs(id, '?search=echo')).map((e) => e.fields.command), ['echo one', 'echo two']);
    assert.deepEqual((await logs(id, '?search=ECHO')), [], 'search is case-sensitive');
    assert.deepEqual((await logs(id, '?direction=backward&limit=2')).map((e) => e.message), [all[3].message, all[2].message]);
    const cursor = Date.parse(all[2].timestamp);
    assert.deepEqual((await logs(id, `?cursor=${cursor}`)).map((e) => e.message), [all[2].message, all[3].message], 'forward from the cursor, inclusive');
    assert.deepEqual((await logs(id, `?cursor=${cursor - 1}&direction=backward&search=echo`)).map((e) => e.fields.command), ['echo one']);
    assert.deepEqual((await logs(id, '?limit=1')).map((e) => e.message), [all[0].message]);
  });

  test('bad queries are 400 validation_error naming the field', async () => {
    const id = await create();
    for (const [q, field] of [
      ['level=fatal', 'level'], ['direction=up', 'direction'], ['limit=0', 'limit'], ['limit=1001', 'limit'], ['limit=2.5', 'limit'],
      ['cursor=-1', 'cursor'], ['cursor=yesterday', 'cursor'], [`search=${'x'.repeat(257)}`, 'search'], ['since=0', 'since'],
    ] as const) {
      const r = await f.req('getSandboxLogs', { url: `/v1/sandboxes/${id}/logs?${q}`, key });
      assertErrorBody(r, 'validation_error');
      assert.match(r.json().error.message, new RegExp(`query\\.${field}|${field}`), `${q}: ${r.body}`);
    }
  });

  test("only the tenant's own: another tenant gets 404 and writes nothing to it", async () => {
    const id = await create();
    const other = f.key('globex', 'pro');
    assertErrorBody(await f.req('getSandboxLogs', { url: `/v1/sandboxes/${id}/logs`, key: other }), 'sandbox_not_found');
    assertErrorBody(await f.req('execSandbox', { url: `/v1/sandboxes/${id}/exec`, key: other, body: { command: 'echo stolen' } }), 'sandbox_not_found');
    assertErrorBody(await f.req('startProcess', { url: `/v1/sandboxes/${id}/processes`, key: other, body: { command: 'echo stolen' } }), 'sandbox_not_found');
    assertErrorBody(await f.req('getSandboxLogs', { url: '/v1/sandboxes/sbx_000000000000/logs', key }), 'sandbox_not_found');
    assert.deepEqual((await logs(id)).map((e) => e.message), ['Sandbox created']);
    const rows = f.db.prepare("SELECT COUNT(*) AS n FROM api_sandbox_logs WHERE tenant = 'globex'").get() as { n: number };
    assert.equal(rows.n, 0);
  });

  test('a failure of the guest is written as an error; a refusal is not', async () => {
    const id = await create();
    const exec0 = f.svc.exec.bind(f.svc);
    f.svc.exec = async () => { throw new CollimateError('agent_unavailable', 'The guest agent did not answer (test).'); };
    try {
      assertErrorBody(await exec(id, { command: 'echo lost' }), 'agent_unavailable');
    } finally {
      f.svc.exec = exec0;
    }
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${id}/suspend`, key });
    assertErrorBody(await exec(id, { command: 'echo refused' }), 'invalid_state');
    const errors = await logs(id, '?level=error');
    assert.deepEqual(errors.map((e) => [e.message, e.fields.error_code]), [['Exec failed (agent_unavailable): echo lost', 'agent_unavailable']]);
    assert.ok(!(await logs(id, '?search=refused')).length);
  });

  test('deleting the sandbox removes its entries', async () => {
    const id = await create();
    await exec(id, { command: 'echo x' });
    const rows = () => (f.db.prepare('SELECT COUNT(*) AS n FROM api_sandbox_logs WHERE sandbox = ?').get(id) as { n: number }).n;
    assert.equal(rows(), 2);
    await f.req('deleteSandbox', { url: `/v1/sandboxes/${id}`, key });
    assert.equal(rows(), 0);
    assertErrorBody(await f.req('getSandboxLogs', { url: `/v1/sandboxes/${id}/logs`, key }), 'sandbox_not_found');
  });
});
