import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildAgentExec, encodeOutput } from '../../../src/sandboxes/exec.ts';

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
    { command: 'a\0b' }]) {
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

test('output that is not UTF-8 is returned as base64, never mangled', () => {
  assert.deepEqual(encodeOutput(Buffer.from('héllo')), { text: 'héllo', encoding: 'utf8' });
  assert.deepEqual(encodeOutput(Buffer.from([0xff, 0xfe, 0x00])), { text: '//4A', encoding: 'base64' });
});
