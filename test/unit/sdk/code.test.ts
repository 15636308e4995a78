/**
 * The SDKs' code cells against a real API server on the fake service, whose code port leads to a
 * stand-in for the guest's interpreter (test/support/fakeCodeServer.ts: node:vm contexts, so state
 * across cells is real): runCode as JSON and streamed, interrupting by closing the stream, contexts,
 * and the error classes. The Python half runs python/test_code.py.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { fixture, type Fixture } from '../api/helpers.js';
import { startFakeCodeServer, type FakeCodeServer } from '../../support/fakeCodeServer.js';
import { CODE_PORT } from '../../../src/guest/codeServer.js';
import { CodeUnavailableError, Collimate, Execution, InvalidStateError, NotFoundError, ValidationError, type CodeError, type CodeOutput, type Sandbox } from '../../../src/sdk/index.js';

let f: Fixture;
let base: string;
let fake: FakeCodeServer;
let client: Collimate;

before(async () => {
  f = await fixture();
  base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  fake = await startFakeCodeServer();
  f.svc.portMap.set(CODE_PORT, fake.port);
  client = new Collimate({ apiKey: f.key('sdk-code', 'pro'), baseUrl: base });
});
after(async () => {
  await f.close();
  await fake.close();
});

test('runCode as JSON: state across cells, the main value as text, printed text, an exception as a result; what it sends', async () => {
  const sb = await client.sandboxes.create({ template: 'python' });
  const first = await sb.runCode('var x = 41');
  assert.ok(first instanceof Execution);
  assert.equal(first.text, undefined, 'no main value');
  assert.match(first.context ?? '', /^[0-9a-f-]{36}$/);
  const second = await sb.runCode('print("out"); printErr("err"); display("shown"); x + 1', { env: { K: 'v' }, seed: '7', timeoutSecs: 10 });
  assert.equal(second.text, '42');
  assert.equal(second.execution_count, first.execution_count! + 1, "the context's counter");
  assert.deepEqual([second.stdout, second.stderr, second.seed, second.error, second.timed_out], ['out\n', 'err\n', '7', null, false]);
  assert.deepEqual(second.results, [
    { is_main_result: false, data: { 'text/plain': 'shown', 'text/html': '<b>shown</b>' } },
    { is_main_result: true, data: { 'text/plain': '42' } },
  ]);
  assert.equal(second.context, first.context, 'the default context carries on');
  assert.deepEqual(fake.executed.at(-1), { code: 'print("out"); printErr("err"); display("shown"); x + 1', env_vars: { K: 'v' }, seed: '7' });
  assert.equal((await sb.runCode('typeof env.K')).text, 'undefined', 'env is for its cell only');

  const raised = await sb.runCode('null.y');
  assert.equal(raised.error?.name, 'TypeError');
  assert.equal(raised.text, undefined);
  assert.equal(JSON.parse(JSON.stringify(raised)).seed, null, 'it serialises as the API sent it');
});

test('runCode streamed: the callbacks see output as it comes, then the same result', async () => {
  const sb = await client.sandboxes.create({ template: 'python' });
  const seen: string[] = [];
  const outputs: CodeOutput[] = [];
  const errors: CodeError[] = [];
  const r = await sb.runCode('print("a"); printErr("b"); display(1); print("c"); 2', {
    language: 'javascript',
    onStdout: (t) => seen.push(`out:${t}`),
    onStderr: (t) => seen.push(`err:${t}`),
    onResult: (o) => (outputs.push(o), seen.push(`result:${o.data['text/plain']}`)),
  });
  assert.deepEqual(seen, ['out:a\n', 'err:b\n', 'result:1', 'out:c\n', 'result:2']);
  assert.deepEqual(outputs, r.results);
  assert.equal(r.text, '2');
  assert.equal(fake.executed.at(-1)?.language, 'javascript');
  const raised = await sb.runCode('throw new RangeError("no")', { language: 'javascript', onError: (e) => errors.push(e) });
  assert.deepEqual(errors, [raised.error]);
  assert.equal(errors[0].value, 'no');
});

// A bound on the waits for an interrupt: a stream that is not closed would wait for ever.
const WAITS = { timeout: 60_000 };

test('aborting the signal, or a callback that throws, closes the stream and interrupts the cell', WAITS, async () => {
  const sb = await client.sandboxes.create({ template: 'python' });
  const ctrl = new AbortController();
  const interrupted = fake.interrupted();
  const running = sb.runCode('wait()', { signal: ctrl.signal });
  await fake.waiting();
  ctrl.abort();
  await assert.rejects(running, (e: unknown) => (e as Error).name === 'AbortError');
  const context = await interrupted;
  assert.equal((await sb.runCode('1')).context, context, 'the cell of its default context was interrupted');

  const again = fake.interrupted();
  await assert.rejects(sb.runCode('wait()', { onStdout: () => { throw new Error('enough'); } }), /enough/);
  assert.equal(await again, context);
});

test('contexts: create, run in one, list, restart (state gone), interrupt, remove; unknown ones are NotFoundError', async () => {
  const sb = await client.sandboxes.create({ template: 'node' });
  const ctx = await sb.createCodeContext({ language: 'javascript', cwd: '/tmp' });
  assert.deepEqual({ language: ctx.language, cwd: ctx.cwd }, { language: 'javascript', cwd: '/tmp' });
  await sb.runCode('var y = 5', { context: ctx });
  assert.equal((await sb.runCode('y * 2', { context: ctx.id })).text, '10');
  assert.equal(fake.executed.at(-1)?.context_id, ctx.id);
  assert.ok((await sb.listCodeContexts()).some((c) => c.id === ctx.id));
  assert.deepEqual(await sb.restartCodeContext(ctx), ctx);
  assert.equal((await sb.runCode('typeof y', { context: ctx })).text, 'undefined');
  assert.deepEqual(await sb.interruptCodeContext(ctx.id), ctx);
  await sb.removeCodeContext(ctx);
  assert.ok(!(await sb.listCodeContexts()).some((c) => c.id === ctx.id));
  const gone = (e: unknown) => e instanceof NotFoundError && e.code === 'context_not_found';
  await assert.rejects(sb.runCode('1', { context: ctx }), gone);
  await assert.rejects(sb.runCode('1', { context: ctx, onStdout: () => {} }), gone);
  await assert.rejects(sb.restartCodeContext(ctx), gone);
  await assert.rejects(sb.removeCodeContext(ctx.id), gone);
});

test('errors map to classes: a dead interpreter, a suspended sandbox, context with language', async () => {
  const sb: Sandbox = await client.sandboxes.create({ template: 'python' });
  const unavailable = (e: unknown) => e instanceof CodeUnavailableError && e instanceof InvalidStateError && e.code === 'code_unavailable';
  await assert.rejects(sb.runCode('die()'), unavailable);
  await assert.rejects(sb.runCode('die()', { onStdout: () => {} }), unavailable, 'an error event of the stream');
  const ctx = await sb.createCodeContext();
  await assert.rejects(sb.runCode('1', { context: ctx, language: 'python' }), ValidationError);
  await sb.suspend();
  const suspended = (e: unknown) => e instanceof InvalidStateError && !(e instanceof CodeUnavailableError);
  await assert.rejects(sb.runCode('1'), suspended);
  await assert.rejects(sb.runCode('1', { onStdout: () => {} }), suspended, 'refused before the stream starts');
});

test('the Python SDK does the same', WAITS, async () => {
  const script = fileURLToPath(new URL('./python/test_code.py', import.meta.url));
  const r = await new Promise<{ code: number; out: string }>((resolve) => {
    execFile('python3', [script], { env: { ...process.env, COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: f.key('sdk-code-py', 'pro'), PYTHONPATH: fileURLToPath(new URL('../../../sdk/python', import.meta.url)) } }, (err, stdout, stderr) =>
      resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, out: stdout + stderr }));
  });
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /code ok/);
  // Its callback that raised closed the stream: the server interrupts that cell's context.
  const stopped = /stopped context (\S+)/.exec(r.out)?.[1];
  assert.ok(stopped, r.out);
  await fake.interruptOf(stopped);
});
