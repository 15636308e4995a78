/**
 * The policy resolver (src/net/resolver.ts) against a fake upstream on loopback: ids kept apart on
 * one upstream socket, and what one sandbox flooding DNS may cost.
 */
import assert from 'node:assert/strict';
import { createSocket } from 'node:dgram';
import { after, before, describe, test } from 'node:test';
import { PolicyResolver, QUERY_BURST, QUERY_INFLIGHT, QUERY_RATE } from '../../../src/net/resolver.ts';

function query(id: number, name: string): Buffer {
  const labels = name.split('.').flatMap((l) => [Buffer.from([l.length]), Buffer.from(l)]);
  const head = Buffer.from([0, 0, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
  head.writeUInt16BE(id, 0);
  return Buffer.concat([head, ...labels, Buffer.from([0, 0, 1, 0, 1])]);
}
const rcode = (m: Buffer) => m.readUInt16BE(2) & 0xf;

describe('policy resolver', () => {
  const upstream = createSocket('udp4');
  const seenPorts = new Set<number>();
  let asked = 0;
  /** Answers after this many ms (queries pile up in flight meanwhile). */
  let delayMs = 0;
  let resolver: PolicyResolver;
  let clock = 1_000_000;
  before(async () => {
    upstream.on('message', (msg, rinfo) => {
      asked++;
      seenPorts.add(rinfo.port);
      // An answer with no records, the query's id and question echoed: enough for the resolver.
      const reply = Buffer.from(msg);
      reply.writeUInt16BE(0x8180, 2);
      setTimeout(() => upstream.send(reply, rinfo.port, rinfo.address), delayMs);
    });
    await new Promise<void>((r) => upstream.bind(0, '127.0.0.1', () => r()));
    resolver = await PolicyResolver.start({
      policy: 'allow', bindIp: '127.0.0.1', upstream: `127.0.0.1:${upstream.address().port}`,
      onAnswer: async () => {}, knows: (src) => src.startsWith('10.'),
      // Stopped: a budget refilled by the host's real time made the flood test depend on its speed
      // (under load the queries came slower than the budget refilled, and none was refused).
      now: () => clock,
    });
  });
  after(async () => {
    await resolver.close();
    upstream.close();
  });

  test('concurrent queries with the same id from two sandboxes each get their own answer, over one upstream socket', async () => {
    const [a, b] = await Promise.all([resolver.answer(query(7, 'a.example'), '10.0.0.1'), resolver.answer(query(7, 'b.example'), '10.0.0.2')]);
    assert.equal(a!.readUInt16BE(0), 7);
    assert.equal(b!.readUInt16BE(0), 7);
    assert.match(a!.toString('latin1'), /\x01a\x07example/);
    assert.match(b!.toString('latin1'), /\x01b\x07example/);
    for (let i = 0; i < 20; i++) await resolver.answer(query(i, 'c.example'), '10.0.0.3');
    assert.equal(seenPorts.size, 1, 'every upstream query left from one socket');
  });

  test('a sandbox flooding DNS is REFUSED past its budget, without upstream queries; others are not affected', async () => {
    asked = 0;
    delayMs = 200;
    // More at once than may be in flight: the rest are refused at once.
    const burst = await Promise.all(Array.from({ length: QUERY_INFLIGHT + 20 }, (_, i) => resolver.answer(query(i, `f${i}.example`), '10.0.0.9')));
    assert.equal(burst.filter((r) => rcode(r!) === 5).length, 20);
    assert.equal(asked, QUERY_INFLIGHT);
    delayMs = 0;
    // One after another: the bucket empties, then every query is refused without going upstream.
    let refused = 0;
    for (let i = 0; i < QUERY_BURST + 50; i++) if (rcode((await resolver.answer(query(i, `g${i}.example`), '10.0.0.9'))!) === 5) refused++;
    // The clock stood still: the bucket's burst is all it had.
    assert.equal(asked, QUERY_BURST, 'the burst went upstream, nothing more');
    assert.equal(refused, 50 + QUERY_INFLIGHT, 'the rest was refused');
    // Time refills it at QUERY_RATE a second.
    clock += 1000;
    let again = 0;
    for (let i = 0; i < QUERY_RATE + 10; i++) if (rcode((await resolver.answer(query(i, `h${i}.example`), '10.0.0.9'))!) === 0) again++;
    assert.equal(again, QUERY_RATE);
    // Another sandbox still resolves.
    assert.equal(rcode((await resolver.answer(query(1, 'ok.example'), '10.0.0.10'))!), 0);
  });
});
