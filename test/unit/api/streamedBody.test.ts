/**
 * discardRest: what is left of a refused streamed body is read to its end when the client sends it
 * (the connection then carries the answer), and given up on a client that stalls or outlasts the
 * bound, over a real socket.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { bodyChunks, discardRest } from '../../../src/wire/streamedBody.js';

const limits = { ms: 600, idleMs: 200 };

/** A server whose handler reads one chunk through bodyChunks, stops, and reports discardRest's verdict. */
async function withServer(run: (port: number, verdicts: boolean[]) => Promise<void>): Promise<void> {
  const verdicts: boolean[] = [];
  const server = http.createServer(async (req, res) => {
    for await (const _ of bodyChunks(req)) break;
    assert.equal(req.destroyed, false, 'stopping early must not destroy the request');
    const ended = await discardRest(req, limits);
    verdicts.push(ended);
    res.writeHead(413, ended ? {} : { connection: 'close' }).end('refused');
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  try {
    await run((server.address() as AddressInfo).port, verdicts);
  } finally {
    server.closeAllConnections();
    server.close();
  }
}

function send(port: number, chunks: number, stallAfter?: number, everyMs = 0): Promise<string> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let got = '';
    s.on('data', (d) => (got += d.toString()));
    s.on('close', () => resolve(got));
    // Writing on after the server gave up and closed is a reset here: what was answered is in `got`.
    s.on('error', () => {});
    s.write('PUT / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n');
    void (async () => {
      for (let i = 0; i < chunks && !s.destroyed; i++) {
        if (i === stallAfter) return;
        s.write(`10000\r\n${'x'.repeat(0x10000)}\r\n`);
        if (everyMs) await sleep(everyMs);
      }
      s.write('0\r\n\r\n');
      await sleep(50);
      s.end();
    })();
  });
}

test('the rest of a body sent whole is read, and the answer keeps the connection', async () => {
  await withServer(async (port, verdicts) => {
    const answer = await send(port, 200);
    assert.match(answer, /^HTTP\/1.1 413 /);
    assert.doesNotMatch(answer, /connection: close/i);
    assert.deepEqual(verdicts, [true]);
  });
});

test('a client that stops sending is given up after the idle bound, and its connection closed', async () => {
  await withServer(async (port, verdicts) => {
    const answer = await send(port, 200, 20);
    assert.match(answer, /^HTTP\/1.1 413 [\s\S]*connection: close/i);
    assert.deepEqual(verdicts, [false]);
  });
});

test('a client that keeps sending past the overall bound is given up too', async () => {
  await withServer(async (port, verdicts) => {
    const answer = await send(port, 100, undefined, 20);
    assert.match(answer, /^HTTP\/1.1 413 [\s\S]*connection: close/i);
    assert.deepEqual(verdicts, [false]);
  });
});
