/**
 * envd's server streams (src/e2b/connectRpc.ts ServerStream) against a real HTTP client that
 * stops reading: the server holds a bounded amount for it, then cuts it off.
 */
import assert from 'node:assert/strict';
import { createServer, request, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { connectErrorOf, ServerStream, STREAM_PENDING_MAX } from '../../../src/e2b/connectRpc.js';
import { CollimateError } from '../../../src/errors.js';

test('a client that stops reading a stream is cut off once STREAM_PENDING_MAX waits for it, not buffered for without bound', async () => {
  let res!: ServerResponse;
  let highest = 0;
  const sent = new Promise<void>((resolve) => {
    const server = createServer(async (_req, r) => {
      res = r;
      const stream = new ServerStream(r);
      const chunk = 'x'.repeat(64 * 1024);
      // A producer that does not wait (a process's output): 64 MiB offered.
      for (let i = 0; i < 1024 && !stream.closed; i++) {
        void stream.send({ data: chunk });
        highest = Math.max(highest, r.writableLength);
        if (i % 16 === 0) await new Promise((t) => setImmediate(t));
      }
      server.close();
      resolve();
    });
    server.listen(0, '127.0.0.1', () => {
      const req = request({ port: (server.address() as AddressInfo).port, host: '127.0.0.1', method: 'POST' }, (incoming) => incoming.pause());
      req.on('error', () => {});
      req.end();
    });
  });
  await sent;
  assert.equal(res.destroyed, true, 'the stream was cut off');
  assert.ok(highest <= STREAM_PENDING_MAX + 1024 * 1024, `at most ${STREAM_PENDING_MAX} (+ one message) waited: ${highest}`);
});

test('a message in invalid UTF-8 is invalid_argument, unary or enveloped: never decoded with replacement characters and run', async () => {
  const { ConnectError, decodeUnary, decodeEnvelopes, envelope } = await import('../../../src/e2b/connectRpc.js');
  const bad = Buffer.concat([Buffer.from('{"process":{"cmd":"/bin/echo","args":["'), Buffer.from([0xff, 0xfe]), Buffer.from('"]}}')]);
  const refused = (f: () => unknown) => assert.throws(f, (e: unknown) => e instanceof ConnectError && e.code === 'invalid_argument' && /UTF-8/.test(e.message));
  refused(() => decodeUnary(bad));
  refused(() => decodeUnary(Buffer.concat([Buffer.from('{"path":"/tmp/'), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('"}')])));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(bad.length, 1);
  refused(() => decodeEnvelopes(Buffer.concat([head, bad])));
  // Valid UTF-8 beyond ASCII still decodes.
  assert.deepEqual(decodeUnary(Buffer.from('{"path":"/tmp/é😀"}')), { path: '/tmp/é😀' });
  assert.deepEqual(decodeEnvelopes(envelope({ path: '/tmp/é' })), [{ path: '/tmp/é' }]);
});

test("the guest's refusals are the path's state in Connect's words, never `internal` (HTTP 500)", () => {
  const busy = connectErrorOf(new CollimateError('file_operation_failed', '/tmp: Resource busy'));
  assert.equal(busy.code, 'failed_precondition');
  assert.equal(connectErrorOf(new CollimateError('no_space', 'disk full')).code, 'resource_exhausted');
  assert.equal(connectErrorOf(new CollimateError('internal_error', 'bug')).code, 'internal');
});
