/**
 * The TypeScript SDK's background processes against a real API server on the fake service: start,
 * streamed stdin (an async iterable sent as it is produced), output as events, pty resize, signal,
 * wait, and the error classes. The Python half runs python/test_processes.py.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { fixture, type Fixture } from '../api/helpers.js';
import { Collimate, InvalidStateError, NotFoundError, ValidationError, type ProcessOutputEvent } from '../../../src/sdk/index.js';

let f: Fixture;
let base: string;
let client: Collimate;

before(async () => {
  f = await fixture();
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  client = new Collimate({ apiKey: f.key('sdk-proc', 'pro'), baseUrl: base });
});
after(() => f.close());

test('start, stream stdin from an async iterable, read output events, close stdin, wait', async () => {
  const sb = await client.sandboxes.create({ template: 'base' });
  const p = await sb.processes.start({ argv: ['cat'], stdin: true, tag: 'sdk' });
  assert.equal(p.info.status, 'running');
  assert.equal(p.info.tag, 'sdk');
  const seen: ProcessOutputEvent[] = [];
  const reading = (async () => {
    for await (const ev of p.output()) seen.push(ev);
  })();
  async function* typing() {
    yield Buffer.from('one\n');
    await sleep(50);
    yield Buffer.from('two\n');
  }
  assert.equal(await p.sendStdin(typing()), 8);
  assert.equal(await p.sendStdin('three\n'), 6);
  await p.closeStdin();
  const done = await p.wait({ timeoutSecs: 10 });
  assert.equal(done.status, 'exited');
  assert.equal(done.exit_code, 0);
  await reading;
  const out = Buffer.concat(seen.flatMap((e) => (e.type === 'stdout' ? [e.data] : []))).toString();
  assert.equal(out, 'one\ntwo\nthree\n');
  assert.equal(seen.at(-1)?.type, 'exit');
  // Reattach from an offset.
  const again: string[] = [];
  for await (const ev of (await sb.processes.get(p.pid)).output({ from: 4 })) if (ev.type === 'stdout') again.push(ev.data.toString());
  assert.equal(again.join(''), 'two\nthree\n');
  assert.deepEqual((await sb.processes.list()).map((x) => x.pid), [p.pid]);
});

test('a pty process is resized and killed; errors map to classes', async () => {
  const sb = await client.sandboxes.create({ template: 'base' });
  const tty = await sb.processes.start({ argv: ['sh'], pty: { cols: 80, rows: 24 } });
  await tty.resize(100, 30);
  const events = tty.output({ from: 'start' })[Symbol.asyncIterator]();
  const first = await events.next();
  await events.return(undefined); // detaches (closes the stream); the process runs on
  assert.equal(first.value?.type === 'pty' && first.value.data.toString(), 'size 30 100\n');
  await tty.kill();
  assert.equal((await tty.wait()).signal, 9);
  await assert.rejects(tty.signal('TERM'), (e: unknown) => e instanceof InvalidStateError && e.code === 'process_exited');
  await assert.rejects(sb.processes.get(999999), (e: unknown) => e instanceof NotFoundError && e.code === 'process_not_found');
  await assert.rejects(sb.processes.start({ argv: ['no-such-program'] }), (e: unknown) => e instanceof ValidationError && e.code === 'command_not_found');
  const quiet = await sb.processes.start({ command: 'sleep 100' });
  assert.equal((await quiet.wait({ timeoutSecs: 0.1 })).status, 'running');
});

test('the Python SDK does the same', async () => {
  const script = fileURLToPath(new URL('./python/test_processes.py', import.meta.url));
  const r = await new Promise<{ code: number; out: string }>((resolve) => {
    execFile('python3', [script], { env: { ...process.env, COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: f.key('sdk-proc-py', 'pro'), PYTHONPATH: fileURLToPath(new URL('../../../sdk/python', import.meta.url)) } }, (err, stdout, stderr) =>
      resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, out: stdout + stderr }));
  });
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /processes ok/);
});
