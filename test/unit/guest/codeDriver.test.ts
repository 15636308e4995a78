/**
 * The code server's Driver (src/guest/code/server.py), run on this host's python3: every call on a
 * Python kernel's jupyter_client objects is made on the driver's one thread and its one asyncio
 * loop, whichever request thread asks (pyzmq asyncio sockets belong to the loop they are used on);
 * a call's exception reaches its caller; a call made on the driver's own thread runs inline; once
 * stopped, calls are refused with KernelGone, and none is left waiting. The kernels themselves
 * (ipykernel, jupyter_client) are exercised on real VMs by test/integration/code.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const CODE_DIR = fileURLToPath(new URL('../../../src/guest/code', import.meta.url));

/** Runs `body` with server.py imported as S; its last line prints the JSON the test reads. */
function python(body: string): any {
  const script = ['import sys, json, threading, asyncio, time', `sys.path.insert(0, ${JSON.stringify(CODE_DIR)})`, 'import server as S', body].join('\n');
  const env = { ...process.env, COLLIMATE_CODE_STATE_DIR: mkdtempSync(join(tmpdir(), 'collimate-driver-')) };
  const out = execFileSync('/usr/bin/python3', ['-c', script], { env, encoding: 'utf8', timeout: 60_000 });
  return JSON.parse(out.trim().split('\n').pop()!);
}

test('every call runs on the driver\'s one thread and one event loop, from whichever thread it is made', () => {
  const r = python(`
d = S.Driver("t")
seen = []
def where():
    return (threading.get_ident(), id(asyncio.get_event_loop()))
def caller():
    seen.append(d.call(where))
threads = [threading.Thread(target=caller) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
seen.append(d.call(where))
print(json.dumps({"threads": len({s[0] for s in seen}), "loops": len({s[1] for s in seen}), "driver": seen[0][0] == d.thread.ident, "calls": len(seen)}))
`);
  assert.deepEqual(r, { threads: 1, loops: 1, driver: true, calls: 9 });
});

test('a call returns its value, raises its exception to the caller, and runs inline on the driver itself', () => {
  const r = python(`
d = S.Driver("t")
value = d.call(lambda: 41 + 1)
try:
    d.call(lambda: 1 / 0)
    raised = None
except ZeroDivisionError as e:
    raised = type(e).__name__
inline = d.call(lambda: d.call(lambda: threading.get_ident()) == threading.get_ident())
print(json.dumps({"value": value, "raised": raised, "inline": inline}))
`);
  assert.deepEqual(r, { value: 42, raised: 'ZeroDivisionError', inline: true });
});

test('after stop, calls are refused with KernelGone; a call under way finishes; nobody is left waiting', () => {
  const r = python(`
d = S.Driver("t")
started = threading.Event()
def slow():
    started.set()
    time.sleep(0.3)
    return "finished"
results = []
def caller(fn):
    try:
        results.append(d.call(fn))
    except S.KernelGone:
        results.append("gone")
first = threading.Thread(target=caller, args=(slow,))
first.start()
started.wait()
# Calls racing the stop: each either runs (queued before it) or is refused; none hangs.
racers = [threading.Thread(target=caller, args=(lambda: "ran",)) for _ in range(20)]
for t in racers: t.start()
d.stop()
for t in racers + [first]: t.join(timeout=10)
hung = sum(t.is_alive() for t in racers + [first])
try:
    d.call(lambda: "late")
    late = "ran"
except S.KernelGone:
    late = "gone"
d.thread.join(timeout=10)
print(json.dumps({"first": results.count("finished"), "answered": len(results), "hung": hung, "late": late, "driverEnded": not d.thread.is_alive(), "others": sorted(set(results) - {"finished"})}))
`);
  assert.equal(r.first, 1, 'the call under way at the stop finishes');
  assert.equal(r.hung, 0, 'no caller is left waiting');
  assert.equal(r.answered, 21);
  assert.equal(r.late, 'gone');
  assert.equal(r.driverEnded, true);
  assert.ok(r.others.every((x: string) => x === 'ran' || x === 'gone'), JSON.stringify(r.others));
});

test('SIGUSR1 writes every thread\'s stack to the log while cells stream, and the server lives on', async () => {
  // The server on this host, with the JavaScript kernel (Node.js is here; ipykernel is not).
  const { spawn } = await import('node:child_process');
  const { existsSync, readFileSync, openSync, copyFileSync } = await import('node:fs');
  const { createServer } = await import('node:net');
  const state = mkdtempSync(join(tmpdir(), 'collimate-codesrv-'));
  const port = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => { const p = (s.address() as { port: number }).port; s.close(() => resolve(p)); });
  });
  // Copied out, as the guest has them: kernel.js is CommonJS, which the repository's package.json
  // ("type": "module") would not let it be.
  for (const f of ['server.py', 'kernel.js', 'python_setup.py']) copyFileSync(join(CODE_DIR, f), join(state, f));
  const log = join(state, 'server.log');
  const server = spawn('/usr/bin/python3', [join(state, 'server.py')], {
    env: { ...process.env, COLLIMATE_CODE_PORT: String(port), COLLIMATE_CODE_STATE_DIR: state },
    stdio: ['ignore', openSync(log, 'a'), openSync(log, 'a')],
  });
  try {
    for (let i = 0; !existsSync(join(state, 'ready')); i++) {
      assert.ok(i < 600 && server.exitCode === null, `the server did not start: ${readFileSync(log, 'utf8')}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const cell = (n: number) => fetch(`http://127.0.0.1:${port}/execute`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ code: `for (let i = 0; i < ${n}; i++) console.log(i)`, language: 'javascript' }),
    }).then((r) => r.text());
    const cells = [cell(20000), cell(20000), cell(20000)];
    const dumps = () => (readFileSync(log, 'utf8').match(/threads of the code server/g) ?? []).length;
    // One signal at a time: signals are not queued, so two that arrive before Python's main thread
    // runs its handler make one dump (on a loaded host, one of 20 sent 25 ms apart was lost so).
    for (let i = 0; i < 20; i++) {
      server.kill('SIGUSR1');
      for (let waited = 0; dumps() < i + 1; waited += 10) {
        assert.ok(waited < 20_000 && server.exitCode === null, `dump ${i + 1} never came: ${readFileSync(log, 'utf8').slice(-2000)}`);
        await new Promise((r) => setTimeout(r, 10));
      }
    }
    for (const out of await Promise.all(cells)) assert.match(out, /"type": "end_of_execution"/);
    assert.equal(server.exitCode, null, 'the server is still running');
    const dumped = readFileSync(log, 'utf8');
    assert.equal(dumps(), 20, dumped.slice(-2000));
    assert.match(dumped, /Thread MainThread \(\d+\):\n.*serve_forever/s);
  } finally {
    server.kill('SIGKILL');
  }
});
