/**
 * The code interpreter's host side (src/service/code.ts) against the real guest server
 * (src/guest/code/server.py) run on this host, with its JavaScript kernel on this host's Node.js:
 * the protocol between them — a first cell that starts the server (once, however many ask), state
 * across cells, streamed output, a timeout's interrupt, a client that goes away, errors named as the
 * API names them, a server that dies mid-cell. The sandbox is faked: its port route points at the
 * server's loopback port, and its exec starts the server as the start script would in a guest.
 * (Python kernels need ipykernel, which only the guest image has: test/integration/code.test.ts.)
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { CodeInterpreter } from '../../../src/service/code.ts';
import { warmCodeInterpreter } from '../../../src/guest/codeServer.ts';
import type { Sandboxes } from '../../../src/service/sandboxes.ts';
import { CollimateError } from '../../../src/errors.ts';
import type { Scope } from '../../../src/service/types.ts';

const SOURCE = fileURLToPath(new URL('../../../src/guest/code/', import.meta.url));
const scope = { tenant: 't' } as Scope;
const ID = 'sbx_0123456789ab';

let dir: string;
let port: number;
let server: ChildProcess | undefined;
let execs = 0;
let execAnswer: { exit_code: number; stderr: string } | undefined;

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const p = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return p;
}

/** Starts server.py as the start script does in a guest, and waits for its `ready`. */
async function startServer(): Promise<void> {
  rmSync(join(dir, 'ready'), { force: true });
  server = spawn('python3', [join(dir, 'server.py')], { env: { ...process.env, COLLIMATE_CODE_PORT: String(port), HOME: dir }, stdio: 'ignore' });
  for (let i = 0; !existsSync(join(dir, 'ready')); i++) {
    if (i > 300) throw new Error('server.py did not become ready');
    await sleep(50);
  }
}

/** Kills the server and the kernels it left (a JavaScript kernel in a busy loop never reads that its stdin closed). */
async function stopServer(): Promise<void> {
  if (server && server.exitCode === null) {
    const gone = new Promise((r) => server!.once('exit', r));
    server.kill('SIGKILL');
    await gone;
  }
  await new Promise((r) => spawn('pkill', ['-KILL', '-f', join(dir, 'kernel.js')]).once('exit', r));
}

const sandboxes = {
  portTarget: async () => ({ sandboxId: ID, tenant: 't', port, target: { host: '127.0.0.1', port } }),
  exec: async () => {
    execs++;
    if (execAnswer) return { ...execAnswer, stdout: '', timed_out: false };
    await startServer();
    return { exit_code: 0, stdout: '', stderr: '', timed_out: false };
  },
} as unknown as Sandboxes;
const code = new CodeInterpreter(sandboxes, { interruptGraceMs: 1000 });

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'code-server-'));
  for (const f of ['server.py', 'kernel.js', 'python_setup.py']) copyFileSync(join(SOURCE, f), join(dir, f));
  port = await freePort();
});

after(async () => {
  await stopServer();
  rmSync(dir, { recursive: true, force: true });
});

test('the first cells start the server once, then state carries across cells', async () => {
  const [a, b] = await Promise.all([
    code.run(scope, ID, { code: 'var total = 40; total', language: 'javascript' }),
    code.run(scope, ID, { code: '1 + 1', language: 'javascript' }),
  ]);
  assert.equal(execs, 1, 'one start for both cells');
  assert.equal(a.error, null);
  assert.deepEqual(a.results, [{ is_main_result: true, data: { 'text/plain': '40' } }]);
  assert.equal(b.results[0].data['text/plain'], '2');
  const c = await code.run(scope, ID, { code: 'total + 2', language: 'javascript' });
  assert.equal(c.results[0].data['text/plain'], '42');
  assert.equal(c.context, a.context);
  assert.match(String(c.context), /^[0-9a-f-]{36}$/);
  assert.equal(c.execution_count, 3);
});

test('a pool\'s warm-up cell is silent: it runs in the default context without counting or showing', async () => {
  const before = (await code.run(scope, ID, { code: 'total', language: 'javascript' })).execution_count!;
  assert.equal(await warmCodeInterpreter('127.0.0.1', { port }), true);
  assert.equal(await warmCodeInterpreter('127.0.0.1', { port: await freePort() }), false, 'no server: nothing to warm');
  assert.equal((await code.run(scope, ID, { code: 'total', language: 'javascript' })).execution_count, before + 1);
});

test('output streams to the handlers in order, and the result holds it all', async () => {
  const seen: string[] = [];
  const r = await code.run(scope, ID, { code: 'console.log("one"); console.error("two"); display(3); "four"', language: 'javascript' }, {
    onStdout: (t) => seen.push(`out:${t}`),
    onStderr: (t) => seen.push(`err:${t}`),
    onResult: (o) => seen.push(`${o.is_main_result ? 'main' : 'display'}:${o.data['text/plain']}`),
  });
  assert.deepEqual(seen, ['out:one\n', 'err:two\n', 'display:3', "main:'four'"]);
  assert.equal(r.stdout, 'one\n');
  assert.equal(r.stderr, 'two\n');
  assert.equal(r.results.length, 2);
});

test('an exception is the result\'s error; a seed replays Math.random', async () => {
  const r = await code.run(scope, ID, { code: 'throw new RangeError("too far")', language: 'javascript' });
  assert.deepEqual({ name: r.error?.name, value: r.error?.value }, { name: 'RangeError', value: 'too far' });
  assert.match(r.error!.traceback, /<cell \d+>/);
  const draw = () => code.run(scope, ID, { code: 'Math.random()', language: 'javascript', seed: '7' }).then((x) => x.results[0].data['text/plain']);
  assert.equal(await draw(), await draw());
  assert.equal((await code.run(scope, ID, { code: 'Math.random()', language: 'javascript', seed: '7' })).seed, '7');
});

test('a cell past its timeout is interrupted and the context stays usable', async () => {
  const r = await code.run(scope, ID, { code: 'while (true) {}', language: 'javascript', timeoutSecs: 1 });
  assert.equal(r.timed_out, true);
  assert.match(r.error?.value ?? '', /interrupted/);
  assert.equal((await code.run(scope, ID, { code: 'total', language: 'javascript' })).results[0].data['text/plain'], '40');
});

test('a cell deaf to the interrupt is left after a grace period, and a restart frees its context', async () => {
  const ctx = await code.createContext(scope, ID, { language: 'javascript' });
  // SIGINT stops synchronous JavaScript only: a cell waiting on a promise that never settles ignores it.
  const r = await code.run(scope, ID, { code: 'await new Promise(() => {})', context: ctx.id, timeoutSecs: 1 });
  assert.equal(r.timed_out, true);
  assert.equal(r.error?.name, 'TimeoutError');
  assert.match(r.error!.value, /restart the context/);
  await code.restartContext(scope, ID, ctx.id);
  assert.equal((await code.run(scope, ID, { code: '6 * 7', context: ctx.id })).results[0].data['text/plain'], '42');
  await code.deleteContext(scope, ID, ctx.id);
});

test('a client that goes away interrupts its cell', async () => {
  const gone = new AbortController();
  const running = code.run(scope, ID, { code: 'console.log("spinning"); while (true) {}', language: 'javascript' }, {
    onStdout: () => gone.abort(),
    signal: gone.signal,
  });
  await assert.rejects(running);
  assert.equal((await code.run(scope, ID, { code: 'total', language: 'javascript' })).results[0].data['text/plain'], '40');
});

test('contexts: made, listed, restarted empty, deleted; unknown ones are context_not_found', async () => {
  const made = await code.createContext(scope, ID, { language: 'javascript', cwd: dir });
  assert.equal(made.cwd, dir);
  await code.run(scope, ID, { code: 'var mine = 1', context: made.id });
  assert.equal((await code.run(scope, ID, { code: 'typeof total', context: made.id })).results[0].data['text/plain'], "'undefined'");
  assert.ok((await code.contexts(scope, ID)).some((c) => c.id === made.id));
  await code.restartContext(scope, ID, made.id);
  assert.equal((await code.run(scope, ID, { code: 'typeof mine', context: made.id })).results[0].data['text/plain'], "'undefined'");
  await code.deleteContext(scope, ID, made.id);
  const missing = (err: unknown) => err instanceof CollimateError && err.code === 'context_not_found';
  await assert.rejects(code.run(scope, ID, { code: '1', context: made.id }), missing);
  await assert.rejects(code.interruptContext(scope, ID, made.id), missing);
  await assert.rejects(code.createContext(scope, ID, { language: 'javascript', cwd: join(dir, 'nowhere') }), (err) => err instanceof CollimateError && err.code === 'validation_error' && /not a directory/.test(err.message));
  await assert.rejects(code.run(scope, ID, { code: '1', context: made.id, language: 'javascript' }), (err) => err instanceof CollimateError && err.code === 'validation_error');
});

test('a language the image lacks names what is missing', async () => {
  // This host's python3 has no ipykernel, as an image without it.
  await assert.rejects(code.run(scope, ID, { code: '1', language: 'python' }), (err) => err instanceof CollimateError && err.code === 'validation_error' && /ipykernel/.test(err.message));
});

test('a server that dies mid-cell is code_unavailable, and the next cell starts it again', async () => {
  let stopped: Promise<void> | undefined;
  const running = code.run(scope, ID, { code: 'console.log("up"); while (true) {}', language: 'javascript' }, { onStdout: () => void (stopped = stopServer()) });
  await assert.rejects(running, (err) => err instanceof CollimateError && err.code === 'code_unavailable' && /stopped answering/.test(err.message));
  await stopped;
  const before = execs;
  assert.equal((await code.run(scope, ID, { code: '5', language: 'javascript' })).results[0].data['text/plain'], '5');
  assert.equal(execs, before + 1);
});

test('an image without python3 cannot start the server: code_unavailable says so', async () => {
  await stopServer();
  execAnswer = { exit_code: 3, stderr: "this sandbox's image has no python3" };
  try {
    await assert.rejects(code.run(scope, ID, { code: '1' }), (err) => err instanceof CollimateError && err.code === 'code_unavailable' && /no python3/.test(err.message));
  } finally {
    execAnswer = undefined;
  }
});
