/** The sandbox log's store (src/service/sandboxLog.ts): reads by cursor, direction, level and search; the retention bound; forgetting. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import '../../../src/service/migrations.js';
import { execLine, failureLine, processExitLine, SandboxLog, transitionLine } from '../../../src/service/sandboxLog.js';
import { CollimateError } from '../../../src/errors.js';
import { openDb } from '../../../src/store/db.js';
import { LOG_KEPT_PER_SANDBOX } from '../../../src/wire/schemas.js';
import type { ProcessInfo } from '../../../src/sandboxes/types.js';

const T0 = Date.parse('2026-12-05T10:00:00Z');

function store(): { log: SandboxLog; at: (ms: number) => void; count: (id: string) => number } {
  const db = openDb(':memory:');
  let clock = T0;
  return {
    log: new SandboxLog(db, () => clock),
    at: (ms) => void (clock = ms),
    count: (id) => (db.prepare('SELECT COUNT(*) AS n FROM api_sandbox_logs WHERE sandbox = ?').get(id) as { n: number }).n,
  };
}

describe('sandbox log store', () => {
  test('reads forward from the cursor (inclusive), backward from it, by least level and case-sensitive search, within the limit', () => {
    const { log, at } = store();
    const lines = [
      { level: 'info', message: 'Sandbox created' },
      { level: 'debug', message: 'a detail' },
      { level: 'warn', message: 'Exec exited 1 in 3 ms: false' },
      { level: 'error', message: 'Exec timed out after 9 ms: sleep 9' },
      { level: 'info', message: 'Exec exited 0 in 1 ms: echo 100%_done' },
    ] as const;
    lines.forEach((l, i) => {
      at(T0 + i * 1000);
      log.add('acme', 'sbx_a', { ...l, fields: { n: String(i) } });
    });
    const messages = (q: Parameters<SandboxLog['read']>[2]) => log.read('acme', 'sbx_a', q).map((e) => e.message);
    assert.deepEqual(messages({}), lines.map((l) => l.message), 'oldest first by default');
    const first = log.read('acme', 'sbx_a')[0];
    assert.deepEqual(first, { timestamp: new Date(T0).toISOString(), level: 'info', message: 'Sandbox created', fields: { n: '0' } });
    assert.deepEqual(messages({ cursorMs: T0 + 2000 }).length, 3, 'the cursor is inclusive');
    assert.deepEqual(messages({ cursorMs: T0 + 2001 }).length, 2);
    assert.deepEqual(messages({ direction: 'backward', limit: 2 }), [lines[4].message, lines[3].message], 'newest first');
    assert.deepEqual(messages({ direction: 'backward', cursorMs: T0 + 1000 }), [lines[1].message, lines[0].message]);
    assert.deepEqual(messages({ level: 'warn' }), [lines[2].message, lines[3].message]);
    assert.deepEqual(messages({ level: 'info' }).length, 4, 'debug is below info');
    assert.deepEqual(messages({ level: 'debug' }).length, 5);
    assert.deepEqual(messages({ search: 'Exec' }).length, 3);
    assert.deepEqual(messages({ search: 'exec' }), [], 'case-sensitive');
    assert.deepEqual(messages({ search: '%_' }), [lines[4].message], 'no LIKE patterns');
    assert.deepEqual(messages({ search: 'Exec', level: 'warn', direction: 'backward', limit: 1 }), [lines[3].message]);
    assert.deepEqual(log.read('other', 'sbx_a'), [], "another tenant's read of the id finds nothing");
  });

  test(`keeps the last ${LOG_KEPT_PER_SANDBOX} entries of each sandbox; forget removes one sandbox's`, () => {
    const { log, count } = store();
    for (let i = 0; i < LOG_KEPT_PER_SANDBOX + 7; i++) log.add('acme', 'sbx_a', { level: 'info', message: `entry ${i}`, fields: {} });
    log.add('acme', 'sbx_b', { level: 'info', message: 'other sandbox', fields: {} });
    assert.equal(count('sbx_a'), LOG_KEPT_PER_SANDBOX);
    const kept = log.read('acme', 'sbx_a');
    assert.equal(kept.length, LOG_KEPT_PER_SANDBOX);
    assert.equal(kept[0].message, 'entry 7', 'the oldest went first');
    assert.equal(kept.at(-1)!.message, `entry ${LOG_KEPT_PER_SANDBOX + 6}`);
    log.forget('sbx_a');
    assert.equal(count('sbx_a'), 0);
    assert.equal(count('sbx_b'), 1);
  });

  test('what is written: levels by outcome, no stdin or env, refusals not written, deletions not written', () => {
    const ok = execLine({ command: 'echo hi', stdin: 'SECRET-STDIN', env: { TOKEN: 'SECRET-ENV' } }, 12.4, { exit_code: 0, timed_out: false });
    assert.equal(ok.level, 'info');
    assert.equal(ok.message, 'Exec exited 0 in 12 ms: echo hi');
    assert.deepEqual(ok.fields, { event: 'exec', command: 'echo hi', exit_code: '0', duration_ms: '12', timed_out: 'false' });
    assert.ok(!JSON.stringify(ok).includes('SECRET'));
    assert.equal(execLine({ command: 'false' }, 1, { exit_code: 1, timed_out: false }).level, 'warn');
    assert.equal(execLine({ command: 'sleep 9' }, 1000, { exit_code: 124, timed_out: true }).level, 'error');
    assert.equal(execLine({ command: 'eat' }, 1, { exit_code: 137, timed_out: false, signal: 9, oom_killed: true }).level, 'error');
    assert.equal(failureLine('Exec', 'x', new CollimateError('invalid_state', 'not running')), undefined, 'a refusal is the caller\'s answer only');
    assert.equal(failureLine('Exec', 'x', new CollimateError('sandbox_not_found', 'no')), undefined);
    assert.equal(failureLine('Exec', 'x', new CollimateError('agent_unavailable', 'The guest agent did not answer'))?.level, 'error');
    assert.equal(transitionLine({ id: 'sbx_a', tenant: 'acme', state: 'deleted', op: 'lost', reason: 'VMM exited' }), undefined);
    assert.equal(transitionLine({ id: 'sbx_a', tenant: 'acme', state: 'suspended', op: 'suspend', snapshotBytes: 3 * 1024 * 1024 })?.message, 'Sandbox suspended (snapshot of 3 MiB)');
    const p = { pid: 7, tag: 'srv', pty: false, status: 'exited', exit_code: 0, signal: null } as ProcessInfo;
    assert.equal(processExitLine('python3 -m http.server', p).level, 'info');
    assert.equal(processExitLine('python3 -m http.server', { ...p, exit_code: null, signal: 15 }).message, 'Process 7 was killed by signal 15: python3 -m http.server');
    assert.equal(processExitLine('x', { ...p, status: 'lost', exit_code: null }).level, 'warn');
  });
});
