/**
 * REST for background processes over the fake service (whose processes are the engine's registry
 * over a fake agent, test/support/fakeProcessAgent.ts).
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { assertErrorBody, fixture, type Fixture } from './helpers.js';

let f: Fixture;
let key: string;
let id: string;

before(async () => {
  f = await fixture();
  key = f.key('proc-tenant', 'pro');
  id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json().id;
});
after(() => f.close());

const url = (rest = '') => `/v1/sandboxes/${id}/processes${rest}`;

/** The events of an SSE body: [event, data]. */
function events(body: string): Array<[string, any]> {
  return [...body.matchAll(/event: (\w+)\ndata: (.*)\n\n/g)].map((m) => [m[1], JSON.parse(m[2])]);
}

describe('processes over REST', () => {
  test('start (201), get, list, stdin, output as SSE from the start, close-stdin and wait', async () => {
    const started = await f.req('startProcess', { url: url(), key, body: { argv: ['cat'], stdin: true, tag: 'cat-1' } });
    assert.equal(started.statusCode, 201, started.body);
    const p = started.json();
    assert.equal(p.status, 'running');
    assert.deepEqual(p.argv, ['cat']);
    assert.equal(p.tag, 'cat-1');
    assert.equal(p.stdin_open, true);

    const w = await f.req('writeProcessStdin', { url: url(`/${p.pid}/stdin`), key, rawBody: 'hello\n', headers: { 'content-type': 'application/octet-stream' } });
    assert.equal(w.statusCode, 200, w.body);
    assert.deepEqual(w.json(), { pid: p.pid, written: 6 });
    // Bodies larger than one piece go in 64 KiB pieces, all of it.
    const big = Buffer.alloc(200_000, 'x');
    assert.equal((await f.req('writeProcessStdin', { url: url(`/${p.pid}/stdin`), key, rawBody: big })).json().written, 200_000);

    assert.equal((await f.req('getProcess', { url: url(`/${p.pid}`), key })).json().output_bytes, 200_006);
    const list = (await f.req('listProcesses', { url: url(), key })).json().processes;
    assert.deepEqual(list.map((x: { pid: number }) => x.pid), [p.pid]);

    const waiting = f.req('waitProcess', { url: url(`/${p.pid}/wait`), key, body: { timeout: 10 } });
    const closed = await f.req('closeProcessStdin', { url: url(`/${p.pid}/close-stdin`), key });
    assert.equal(closed.statusCode, 200, closed.body);
    const done = (await waiting).json();
    assert.equal(done.status, 'exited');
    assert.equal(done.exit_code, 0);

    const sse = await f.req('processOutput', { url: url(`/${p.pid}/output?from=start`), key });
    assert.equal(sse.statusCode, 200);
    assert.match(String(sse.headers['content-type']), /^text\/event-stream/);
    const ev = events(sse.body);
    const data = Buffer.concat(ev.filter(([e]) => e === 'stdout').map(([, d]) => Buffer.from(d.data, 'base64')));
    assert.equal(data.length, 200_006);
    assert.equal(data.subarray(0, 6).toString(), 'hello\n');
    assert.equal(ev[0][1].offset, 0);
    assert.deepEqual(ev.at(-1)?.[0], 'exit');
    assert.equal(ev.at(-1)?.[1].process.exit_code, 0);

    // From an offset: only what follows it.
    const tail = events((await f.req('processOutput', { url: url(`/${p.pid}/output?from=200000`), key })).body);
    assert.equal(Buffer.concat(tail.filter(([e]) => e === 'stdout').map(([, d]) => Buffer.from(d.data, 'base64'))).length, 6);
    assert.equal(tail[0][1].offset, 200_000);
  });

  test('live output streams to an SSE client until the process dies by a signal', async () => {
    const p = (await f.req('startProcess', { url: url(), key, body: { command: 'sleep 100' } })).json();
    const agent = f.svc.agentOf(id);
    const stream = f.req('processOutput', { url: url(`/${p.pid}/output?from=now`), key });
    await sleep(50);
    agent.write(p.pid, 1, 'out\n');
    agent.write(p.pid, 2, 'err\n');
    const sig = await f.req('signalProcess', { url: url(`/${p.pid}/signal`), key, body: { signal: 'SIGTERM' } });
    assert.equal(sig.statusCode, 200, sig.body);
    const ev = events((await stream).body);
    assert.deepEqual(ev.map(([e]) => e), ['stdout', 'stderr', 'exit']);
    assert.deepEqual(ev.slice(0, 2).map(([, d]) => [Buffer.from(d.data, 'base64').toString(), d.offset]), [['out\n', 0], ['err\n', 4]]);
    assert.equal(ev[2][1].process.signal, 15);
    assert.equal(ev[2][1].process.exit_code, 143);
  });

  test('output the server never saw is announced as a gap', async () => {
    const p = (await f.req('startProcess', { url: url(), key, body: { command: 'sleep 100', stdin: true } })).json();
    const agent = f.svc.agentOf(id);
    agent.write(p.pid, 1, 'seen\n');
    agent.connected = false;
    agent.write(p.pid, 1, 'missed\n');
    agent.connected = true;
    agent.write(p.pid, 1, 'seen again\n');
    agent.exit(p.pid, 0);
    const ev = events((await f.req('processOutput', { url: url(`/${p.pid}/output`), key })).body);
    assert.deepEqual(ev.map(([e]) => e), ['stdout', 'gap', 'stdout', 'exit']);
    assert.deepEqual(ev[1][1], { from: 5, to: 12 });
    assert.equal(ev[2][1].offset, 12);
  });

  test('a pty process is resized; a pipe process is not a terminal', async () => {
    const tty = (await f.req('startProcess', { url: url(), key, body: { argv: ['sh'], pty: { cols: 100, rows: 40 } } })).json();
    assert.equal(tty.pty, true);
    assert.equal(tty.stdin_open, true);
    assert.equal((await f.req('resizeProcess', { url: url(`/${tty.pid}/resize`), key, body: { cols: 120, rows: 50 } })).statusCode, 200);
    const pipe = (await f.req('startProcess', { url: url(), key, body: { command: 'sleep 100' } })).json();
    assertErrorBody(await f.req('resizeProcess', { url: url(`/${pipe.pid}/resize`), key, body: { cols: 120, rows: 50 } }), 'not_a_terminal');
    assertErrorBody(await f.req('writeProcessStdin', { url: url(`/${pipe.pid}/stdin`), key, rawBody: 'x' }), 'stdin_closed');
  });

  test('clear errors: unknown pid 404, exited 409, bad requests 400, command not found 400', async () => {
    assertErrorBody(await f.req('getProcess', { url: url('/424242'), key }), 'process_not_found');
    assertErrorBody(await f.req('getProcess', { url: url('/abc'), key }), 'process_not_found');
    assertErrorBody(await f.req('processOutput', { url: url('/424242/output'), key }), 'process_not_found');
    assertErrorBody(await f.req('writeProcessStdin', { url: url('/424242/stdin'), key, rawBody: 'x' }), 'process_not_found');
    assertErrorBody(await f.req('startProcess', { url: url(), key, body: { command: 'x', argv: ['x'] } }), 'validation_error');
    assertErrorBody(await f.req('startProcess', { url: url(), key, body: {} }), 'validation_error');
    assertErrorBody(await f.req('startProcess', { url: url(), key, body: { argv: ['x'], nope: 1 } }), 'validation_error');
    assertErrorBody(await f.req('startProcess', { url: url(), key, body: { argv: ['no-such-program'] } }), 'command_not_found');
    const p = (await f.req('startProcess', { url: url(), key, body: { command: 'exit 3' } })).json();
    const done = (await f.req('waitProcess', { url: url(`/${p.pid}/wait`), key, body: { timeout: 5 } })).json();
    assert.equal(done.exit_code, 3);
    assertErrorBody(await f.req('signalProcess', { url: url(`/${p.pid}/signal`), key, body: { signal: 'SIGTERM' } }), 'process_exited');
    assertErrorBody(await f.req('signalProcess', { url: url(`/${p.pid}/signal`), key, body: { signal: 'SIGNOPE' } }), 'validation_error');
    // A wait that times out answers with the process still running.
    const sleeper = (await f.req('startProcess', { url: url(), key, body: { command: 'sleep 100' } })).json();
    const still = (await f.req('waitProcess', { url: url(`/${sleeper.pid}/wait`), key, body: { timeout: 0.05 } })).json();
    assert.equal(still.status, 'running');
    assert.equal(still.exit_code, null);
  });

  test('a suspended sandbox lists its processes but cannot start one', async () => {
    const s = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'base' } })).json();
    const p = (await f.req('startProcess', { url: `/v1/sandboxes/${s.id}/processes`, key, body: { command: 'sleep 100' } })).json();
    await f.req('suspendSandbox', { url: `/v1/sandboxes/${s.id}/suspend`, key });
    const listed = (await f.req('listProcesses', { url: `/v1/sandboxes/${s.id}/processes`, key })).json().processes;
    assert.equal(listed[0].pid, p.pid);
    assertErrorBody(await f.req('startProcess', { url: `/v1/sandboxes/${s.id}/processes`, key, body: { command: 'true' } }), 'invalid_state');
    assertErrorBody(await f.req('signalProcess', { url: `/v1/sandboxes/${s.id}/processes/${p.pid}/signal`, key, body: { signal: 9 } }), 'invalid_state');
  });

  test('a client that does not read its output stream is not buffered for: the skipped output is a gap', async () => {
    const p = (await f.req('startProcess', { url: url(), key, body: { command: 'sleep 100' } })).json();
    const base = new URL(await f.api.app.listen({ host: '127.0.0.1', port: 0 }));
    const socket = net.connect(Number(base.port), '127.0.0.1');
    await once(socket, 'connect');
    socket.pause();
    socket.write(`GET ${url(`/${p.pid}/output?from=now`)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nAccept: text/event-stream\r\n\r\n`);
    await sleep(100);
    const agent = f.svc.agentOf(id);
    const chunk = Buffer.alloc(64 * 1024, 'y');
    for (let i = 0; i < 32 * 16; i++) agent.write(p.pid, 1, chunk); // 32 MiB while the client reads nothing
    agent.exit(p.pid, 0);
    socket.resume();
    let text = '';
    socket.on('data', (d: Buffer) => (text += d.toString()));
    const deadline = Date.now() + 20_000;
    while (!text.includes('event: exit') && Date.now() < deadline) await sleep(50);
    socket.destroy();
    const ev = events(text.slice(text.indexOf('\r\n\r\n') + 4).replace(/\r\n[0-9a-f]+\r\n/g, ''));
    const sent = ev.filter(([e]) => e === 'stdout').reduce((n, [, d]) => n + Buffer.from(d.data, 'base64').length, 0);
    const gaps = ev.filter(([e]) => e === 'gap');
    assert.ok(gaps.length >= 1, 'a gap says what was skipped');
    assert.equal(sent + gaps.reduce((n, [, d]) => n + d.to - d.from, 0), 32 * 1024 * 1024, 'sent and skipped account for every byte');
    assert.ok(sent < 24 * 1024 * 1024, `only a bounded amount was queued for the client (${sent})`);
    assert.equal(ev.at(-1)?.[0], 'exit');
  });
});
