import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildAgentExec, encodeOutput, killedBySigkill, oomKilledDuring, toExecResult } from '../../../src/sandboxes/exec.ts';

const opts = { interpreter: ['python3', '-c'], defaultTimeoutSecs: 60, maxOutputBytes: 1024 };

test('the three exec forms become argv lists', () => {
  assert.deepEqual(buildAgentExec({ command: 'echo hi' }, opts).commands, [['/bin/sh', '-c', 'echo hi']]);
  assert.deepEqual(buildAgentExec({ code: 'print(1)' }, opts).commands, [['python3', '-c', 'print(1)']]);
  assert.deepEqual(buildAgentExec({ commands: [['ls'], ['pwd']] }, opts).commands, [['ls'], ['pwd']]);
});

test('exactly one form, valid argv, env names, absolute paths and bounded timeouts', () => {
  for (const bad of [{}, { command: 'a', code: 'b' }, { commands: [] }, { commands: [[]] }, { commands: [['a', 1]] }, { command: '' },
    { command: 'x', env: { 'BAD-NAME': 'v' } }, { command: 'x', cwd: 'rel' }, { command: 'x', timeout: 0 }, { command: 'x', timeout: 3601 },
    { command: 'x', files: [{ path: 'rel', content: '' }] }, { command: 'x', files: [{ path: '/a', content: '', encoding: 'hex' }] },
    { command: 'a\0b' }, { command: 'pwd', cwd: '/tmp\0/x' }]) {
    assert.throws(() => buildAgentExec(bad as any, opts), { code: 'validation_error' }, JSON.stringify(bad));
  }
});

test('defaults, files and limits', () => {
  const r = buildAgentExec({ command: 'x', env: { B: 'req' }, files: [{ path: '/f', content: Buffer.from('hi').toString('base64'), encoding: 'base64', mode: 0o700 }] },
    { ...opts, defaults: { env: { A: 'tpl', B: 'tpl' }, cwd: '/app', prefix: ['setpriv', '--reuid=1000', '--'] } });
  assert.deepEqual(r.env, { A: 'tpl', B: 'req' });
  assert.equal(r.cwd, '/app');
  assert.deepEqual(r.commands[0].slice(0, 3), ['setpriv', '--reuid=1000', '--']);
  assert.equal(r.files![0].data.toString(), 'hi');
  assert.equal(r.files![0].mode, 0o700);
  assert.equal(r.timeoutMs, 60_000);
  assert.equal(r.maxOutput, 1024);
});

test("`user`: checked, sent to the guest, and in place of the image's User (no setpriv prefix, no image HOME)", () => {
  const defaults = { env: { A: 'tpl', HOME: '/home/img' }, prefix: ['setpriv', '--reuid=1000', '--'] };
  const as = buildAgentExec({ command: 'x', user: 'user' }, { ...opts, defaults });
  assert.equal(as.user, 'user');
  assert.deepEqual(as.commands[0], ['/bin/sh', '-c', 'x']);
  assert.deepEqual(as.env, { A: 'tpl' });
  const image = buildAgentExec({ command: 'x' }, { ...opts, defaults });
  assert.equal(image.user, undefined);
  assert.deepEqual(image.commands[0].slice(0, 3), ['setpriv', '--reuid=1000', '--']);
  assert.equal(image.env!.HOME, '/home/img');
  for (const user of ['', 'a:b', 'x'.repeat(65), 'new\nline', '-dash', 7]) {
    assert.throws(() => buildAgentExec({ command: 'x', user } as any, opts), { code: 'validation_error' }, JSON.stringify(user));
  }
});

test('output that is not UTF-8 is returned as base64, never mangled', () => {
  assert.deepEqual(encodeOutput(Buffer.from('héllo')), { text: 'héllo', encoding: 'utf8' });
  assert.deepEqual(encodeOutput(Buffer.from([0xff, 0xfe, 0x00])), { text: '//4A', encoding: 'base64' });
});

test('OOM kill detection: a SIGKILLed exec is marked when the guest logged an OOM kill while it ran', () => {
  const res = (o: Partial<{ exitCode: number; signal: number; timedOut: boolean }>) => ({ exitCode: 0, timedOut: false, stdoutTruncated: false, stderrTruncated: false, failedIndex: 0, ...o });
  assert.equal(killedBySigkill(res({ exitCode: 137 })), true, 'a shell reports a SIGKILLed child as 137');
  assert.equal(killedBySigkill(res({ exitCode: 137, signal: 9 })), true);
  assert.equal(killedBySigkill(res({ exitCode: 124, timedOut: true, signal: 9 })), false, 'a timeout kill is not an OOM kill');
  assert.equal(killedBySigkill(res({ exitCode: 1 })), false);
  assert.equal(killedBySigkill({ ...res({ exitCode: 137, signal: 9 }), pidsLimited: true }), false, 'the agent killed it at the process limit');
  const probe = [
    '42.30 0.02',
    '[    3.100000] Out of memory: Killed process 12 (old) total-vm:1kB, anon-rss:1kB',
    '[   42.194268] Out of memory: Killed process 96 (tail) total-vm:184984kB, anon-rss:182884kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:392kB oom_score_adj:0',
  ].join('\n');
  assert.equal(oomKilledDuring(probe, 18_000), true);
  // Only an old OOM kill (before this exec started): a plain kill -9.
  assert.equal(oomKilledDuring(probe.split('\n').slice(0, 2).join('\n'), 5_000), false);
  assert.equal(oomKilledDuring('42.30 0.02\n', 5_000), false);
  assert.equal(oomKilledDuring('garbage', 5_000), false);
  assert.equal(oomKilledDuring('10.0 1.0\n[    9.5] Memory cgroup out of memory: Killed process 7 (x)', 1_000), true);
});

test('the process limit reaches the exec result as pids_limited with the agent\'s error text; absent otherwise', () => {
  const t = { queuedAt: 1000, startedAt: 1010, finishedAt: 1500 };
  const out = (o: object) => ({
    result: { exitCode: 137, signal: 9, timedOut: false, stdoutTruncated: false, stderrTruncated: false, failedIndex: 0, ...o },
    stdout: Buffer.alloc(0), stderr: Buffer.alloc(0),
  });
  const limited = toExecResult(out({ pidsLimited: true, errorText: 'the exec hit its process limit (1024 processes)' }), t, 7n);
  assert.equal(limited.pids_limited, true);
  assert.equal(limited.error, 'the exec hit its process limit (1024 processes)');
  assert.equal(limited.exit_code, 137);
  assert.equal(limited.signal, 9);
  const plain = toExecResult(out({}), t, 7n);
  assert.equal('pids_limited' in plain, false);
  assert.equal('error' in plain, false);
});
