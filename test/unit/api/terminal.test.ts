/**
 * The web terminal's WebSocket (src/api/terminal.ts) over a real socket, on the fake service's PTY
 * processes (a pty `sh` echoes what it is sent; a resize prints `size ROWS COLS`).
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, describe, test } from 'node:test';
import { connect as netConnect } from 'node:net';
import WebSocket from 'ws';
import { TERMINAL_SUBPROTOCOL, keyFromSubprotocols } from '../../../src/api/terminal.js';
import { fixture, type Fixture } from './helpers.js';

let f: Fixture;
let key: string;
let id: string;
let base: string;

before(async () => {
  f = await fixture();
  key = f.key('term-tenant', 'pro');
  id = (await f.req('createSandbox', { url: '/v1/sandboxes', key, body: { template: 'python' } })).json().id;
  base = (await f.api.app.listen({ host: '127.0.0.1', port: 0 })).replace('http:', 'ws:');
});
after(() => f.close());

async function startPty(): Promise<number> {
  return (await f.req('startProcess', { url: `/v1/sandboxes/${id}/processes`, key, body: { argv: ['sh'], pty: { cols: 80, rows: 24 } } })).json().pid;
}

/** Connects; resolves with the socket once open, or with the HTTP status it was refused with. */
function connect(path: string, protocols: string[]): Promise<{ ws?: WebSocket; status?: number; body?: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(base + path, protocols);
    ws.once('open', () => resolve({ ws }));
    ws.once('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    ws.once('error', reject);
  });
}

/** Collects binary output until `want` shows up in it. */
function outputUntil(ws: WebSocket, want: string): Promise<string> {
  return new Promise((resolve) => {
    let seen = '';
    const on = (data: Buffer, binary: boolean) => {
      if (!binary) return;
      seen += data.toString();
      if (seen.includes(want)) {
        ws.off('message', on);
        resolve(seen);
      }
    };
    ws.on('message', on);
  });
}

describe('terminal WebSocket', () => {
  test('keystrokes in, output out, resize; the key is taken from the subprotocol and never echoed', async () => {
    const pid = await startPty();
    const { ws } = await connect(`/v1/sandboxes/${id}/processes/${pid}/terminal`, [TERMINAL_SUBPROTOCOL, `bearer.${key}`]);
    assert.ok(ws);
    assert.equal(ws.protocol, TERMINAL_SUBPROTOCOL);
    const echoed = outputUntil(ws, 'hello');
    ws.send(Buffer.from('hello\n'));
    await echoed;
    const resized = outputUntil(ws, 'size 30 90');
    ws.send(JSON.stringify({ type: 'resize', cols: 90, rows: 30 }));
    await resized;
    // The process ends: an exit message, then a normal close.
    const exit = new Promise<any>((resolve) => ws.on('message', (d: Buffer, binary: boolean) => !binary && resolve(JSON.parse(d.toString()))));
    const closed = once(ws, 'close');
    await f.req('signalProcess', { url: `/v1/sandboxes/${id}/processes/${pid}/signal`, key, body: { signal: 'SIGKILL' } });
    const msg = await exit;
    assert.equal(msg.type, 'exit');
    assert.equal(msg.process.pid, pid);
    const [code] = await closed;
    assert.equal(code, 1000);
  });

  test('refusals are HTTP errors before the upgrade', async () => {
    const pid = await startPty();
    const path = `/v1/sandboxes/${id}/processes/${pid}/terminal`;
    const cases: Array<[string, string[], number, string]> = [
      ['no key', [TERMINAL_SUBPROTOCOL], 401, 'unauthorized'],
      ['a wrong key', [TERMINAL_SUBPROTOCOL, `bearer.clm_${'A'.repeat(40)}`], 401, 'unauthorized'],
      ["another tenant's key", [TERMINAL_SUBPROTOCOL, `bearer.${f.key('someone-else', 'pro')}`], 404, 'sandbox_not_found'],
      ['no terminal subprotocol', [`bearer.${key}`], 400, 'validation_error'],
    ];
    for (const [what, protocols, status, code] of cases) {
      const r = await connect(path, protocols);
      assert.equal(r.status, status, what);
      assert.equal(JSON.parse(r.body!).error.code, code, what);
    }
    const pipe = (await f.req('startProcess', { url: `/v1/sandboxes/${id}/processes`, key, body: { argv: ['cat'], stdin: true } })).json().pid;
    const r = await connect(`/v1/sandboxes/${id}/processes/${pipe}/terminal`, [TERMINAL_SUBPROTOCOL, `bearer.${key}`]);
    assert.equal(r.status, 409);
    assert.equal(JSON.parse(r.body!).error.code, 'not_a_terminal');
    const missing = await connect(`/v1/sandboxes/${id}/processes/999999/terminal`, [TERMINAL_SUBPROTOCOL, `bearer.${key}`]);
    assert.equal(missing.status, 404);
    // An id whose percent-encoding is not UTF-8 names no sandbox (it was a 500 internal_error).
    const undecodable = await connect(`/v1/sandboxes/%ff%fe/processes/${pid}/terminal`, [TERMINAL_SUBPROTOCOL, `bearer.${key}`]);
    assert.equal(undecodable.status, 404);
    assert.equal(JSON.parse(undecodable.body!).error.code, 'sandbox_not_found');
  });

  test('a malformed WebSocket handshake is refused as the other refusals are: a JSON error, not the WebSocket library\'s text', async () => {
    const pid = await startPty();
    const path = `/v1/sandboxes/${id}/processes/${pid}/terminal`;
    const good = { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==', 'sec-websocket-protocol': `${TERMINAL_SUBPROTOCOL}, bearer.${key}` };
    const cases: Array<[string, string, Record<string, string | undefined>, number, string]> = [
      ['no Sec-WebSocket-Key', 'GET', { 'sec-websocket-key': undefined }, 400, 'validation_error'],
      ['a short Sec-WebSocket-Key', 'GET', { 'sec-websocket-key': 'short' }, 400, 'validation_error'],
      ['version 0', 'GET', { 'sec-websocket-version': '0' }, 400, 'validation_error'],
      ['no version', 'GET', { 'sec-websocket-version': undefined }, 400, 'validation_error'],
      ['a subprotocol offered twice', 'GET', { 'sec-websocket-protocol': `${TERMINAL_SUBPROTOCOL}, ${TERMINAL_SUBPROTOCOL}, bearer.${key}` }, 400, 'validation_error'],
      ['POST', 'POST', {}, 405, 'method_not_allowed'],
    ];
    for (const [what, method, over, status, code] of cases) {
      const headers = Object.entries({ host: 'x', ...good, ...over }).filter(([, v]) => v !== undefined).map(([k, v]) => `${k}: ${v}`);
      const socket = netConnect(Number(new URL(base.replace('ws:', 'http:')).port), '127.0.0.1');
      socket.write(`${method} ${path} HTTP/1.1\r\n${headers.join('\r\n')}\r\n\r\n`);
      const chunks: Buffer[] = [];
      socket.on('data', (c: Buffer) => chunks.push(c));
      await once(socket, 'close');
      const text = Buffer.concat(chunks).toString();
      const [head, body] = text.split('\r\n\r\n');
      assert.match(head, new RegExp(`^HTTP/1.1 ${status} `), `${what}: ${text}`);
      assert.match(head, /content-type: application\/json/i, `${what}: ${text}`);
      assert.equal(JSON.parse(body).error.code, code, what);
    }
  });

  test('a text frame that is not a resize ends the socket with an error', async () => {
    const pid = await startPty();
    const { ws } = await connect(`/v1/sandboxes/${id}/processes/${pid}/terminal`, [TERMINAL_SUBPROTOCOL, `bearer.${key}`]);
    const msg = new Promise<any>((resolve) => ws!.on('message', (d: Buffer, binary: boolean) => !binary && resolve(JSON.parse(d.toString()))));
    const closed = once(ws!, 'close');
    ws!.send('ls\n');
    assert.equal((await msg).error.code, 'validation_error');
    assert.equal((await closed)[0], 1011);
  });

  test('a plain GET answers the process; the key is read from bearer.<key> only', async () => {
    const pid = await startPty();
    const r = await f.req('processTerminal', { url: `/v1/sandboxes/${id}/processes/${pid}/terminal`, key });
    assert.equal(r.statusCode, 200);
    assert.equal(r.json().pty, true);
    assert.equal(keyFromSubprotocols('collimate.terminal, bearer.clm_x'), 'clm_x');
    assert.equal(keyFromSubprotocols(['collimate.terminal', 'bearer.k']), 'k');
    assert.equal(keyFromSubprotocols('collimate.terminal'), undefined);
    assert.equal(keyFromSubprotocols('bearer.'), undefined);
  });
});
