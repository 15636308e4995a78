import assert from 'node:assert/strict';
import { Duplex } from 'node:stream';
import { describe, it } from 'node:test';
import { AgentClient, AgentError } from '../../../src/guest/agentClient.js';
import {
  FRAME_HEADER_SIZE,
  FrameDecoder,
  MAGIC,
  MAX_FRAME_PAYLOAD,
  MessageType,
  ProtocolError,
  Tag,
  TlvWriter,
  decodeExecResult,
  decodeFileData,
  decodePong,
  encodeExec,
  encodeFileWrite,
  encodeFrame,
  encodeRestored,
  parseTlv,
  type DecoderEvent,
  type Frame,
} from '../../../src/guest/protocol.js';

function framesOf(events: DecoderEvent[]): Frame[] {
  return events.flatMap((e) => (e.kind === 'frame' ? [e.frame] : []));
}

function resyncsOf(events: DecoderEvent[]): number[] {
  return events.flatMap((e) => (e.kind === 'resync' ? [e.skippedBytes] : []));
}

function oversizedHeader(): Buffer {
  const h = Buffer.alloc(FRAME_HEADER_SIZE);
  h.writeUInt32LE(MAGIC, 0);
  h.writeUInt16LE(MessageType.Ping, 4);
  h.writeUInt32LE(7, 8);
  h.writeUInt32LE(MAX_FRAME_PAYLOAD + 1, 12);
  return h;
}

describe('frames', () => {
  it('lays out the 16-byte little-endian header', () => {
    const frame = encodeFrame(MessageType.Exec, 0x01020304, Buffer.from('xyz'));
    assert.equal(frame.length, 19);
    assert.equal(frame.subarray(0, 4).toString('latin1'), 'CLM1');
    assert.equal(frame.readUInt16LE(4), 2);
    assert.equal(frame.readUInt16LE(6), 0);
    assert.equal(frame.readUInt32LE(8), 0x01020304);
    assert.equal(frame.readUInt32LE(12), 3);
    assert.equal(frame.subarray(16).toString(), 'xyz');
  });

  it('refuses payloads over MAX_FRAME_PAYLOAD', () => {
    assert.doesNotThrow(() => encodeFrame(1, 1, Buffer.alloc(MAX_FRAME_PAYLOAD)));
    assert.throws(() => encodeFrame(1, 1, Buffer.alloc(MAX_FRAME_PAYLOAD + 1)), ProtocolError);
  });

  it('reassembles frames pushed one byte at a time and several per chunk', () => {
    const a = encodeFrame(MessageType.Pong, 1, Buffer.from('first'));
    const b = encodeFrame(MessageType.Ok, 2, Buffer.alloc(0));
    const c = encodeFrame(MessageType.Stdout, 3, Buffer.alloc(70000, 9));
    const decoder = new FrameDecoder();
    const events: DecoderEvent[] = [];
    for (const byte of Buffer.concat([a, b])) events.push(...decoder.push(Buffer.from([byte])));
    events.push(...decoder.push(Buffer.concat([c, a])));
    const frames = framesOf(events);
    assert.deepEqual(
      frames.map((f) => [f.type, f.id, f.payload.length]),
      [
        [MessageType.Pong, 1, 5],
        [MessageType.Ok, 2, 0],
        [MessageType.Stdout, 3, 70000],
        [MessageType.Pong, 1, 5],
      ],
    );
    assert.equal(frames[0].payload.toString(), 'first');
    assert.deepEqual(resyncsOf(events), []);
    assert.equal(decoder.bufferedBytes, 0);
  });

  it('resyncs after garbage, reporting the skipped bytes once', () => {
    const decoder = new FrameDecoder();
    const garbage = Buffer.from('definitely not a frame, just noise');
    const good = encodeFrame(MessageType.Pong, 5, Buffer.from('ok'));
    const events = [...decoder.push(garbage.subarray(0, 10)), ...decoder.push(garbage.subarray(10)), ...decoder.push(good)];
    assert.deepEqual(resyncsOf(events), [garbage.length]);
    assert.deepEqual(
      framesOf(events).map((f) => f.id),
      [5],
    );
    assert.equal(events[0].kind, 'resync', 'the resync is reported before the frame that ends it');
  });

  it('treats an oversized length as a bad header and finds the next frame', () => {
    const decoder = new FrameDecoder();
    const good = encodeFrame(MessageType.Ok, 9, Buffer.alloc(0));
    const events = decoder.push(Buffer.concat([oversizedHeader(), good]));
    assert.deepEqual(resyncsOf(events), [FRAME_HEADER_SIZE]);
    assert.deepEqual(
      framesOf(events).map((f) => f.id),
      [9],
    );
  });

  it('keeps a magic split across chunks while scanning', () => {
    const decoder = new FrameDecoder();
    const good = encodeFrame(MessageType.Ok, 11, Buffer.from('p'));
    const stream = Buffer.concat([Buffer.from('garbage!'), good]);
    const cut = 8 + 2; // inside the magic of the good frame
    const events = [...decoder.push(stream.subarray(0, cut)), ...decoder.push(stream.subarray(cut))];
    assert.deepEqual(resyncsOf(events), [8]);
    assert.deepEqual(
      framesOf(events).map((f) => f.id),
      [11],
    );
  });

  it('does not accumulate garbage while out of sync', () => {
    const decoder = new FrameDecoder();
    const noise = Buffer.alloc(256 * 1024, 0x55);
    for (let i = 0; i < 40; i++) assert.deepEqual(decoder.push(noise), []);
    assert.ok(decoder.bufferedBytes < 4, `buffered ${decoder.bufferedBytes} bytes of garbage`);
    const events = decoder.push(encodeFrame(MessageType.Ok, 1, Buffer.alloc(0)));
    assert.deepEqual(resyncsOf(events), [40 * noise.length]);
  });

  it('waits for a large payload without reporting anything', () => {
    const decoder = new FrameDecoder();
    const big = encodeFrame(MessageType.FileData, 3, Buffer.alloc(MAX_FRAME_PAYLOAD, 1));
    let events: DecoderEvent[] = [];
    for (let off = 0; off < big.length; off += 65536) events = events.concat(decoder.push(big.subarray(off, off + 65536)));
    assert.equal(framesOf(events).length, 1);
    assert.equal(framesOf(events)[0].payload.length, MAX_FRAME_PAYLOAD);
  });
});

describe('TLV', () => {
  it('round-trips every field kind', () => {
    const payload = new TlvWriter()
      .u8(1, 200)
      .u32(2, 0xfffffffe)
      .i32(3, -5)
      .u64(4, 2n ** 63n + 5n)
      .bytes(5, Buffer.from([0, 1, 2]))
      .str(6, 'héllo')
      .empty(7)
      .finish();
    const fields = parseTlv(payload);
    assert.deepEqual(
      fields.map((f) => [f.tag, f.value.length]),
      [
        [1, 1],
        [2, 4],
        [3, 4],
        [4, 8],
        [5, 3],
        [6, 6],
        [7, 0],
      ],
    );
    assert.equal(fields[0].value.readUInt8(0), 200);
    assert.equal(fields[1].value.readUInt32LE(0), 0xfffffffe);
    assert.equal(fields[2].value.readInt32LE(0), -5);
    assert.equal(fields[3].value.readBigUInt64LE(0), 2n ** 63n + 5n);
    assert.equal(fields[5].value.toString(), 'héllo');
  });

  it('throws on a truncated header or value', () => {
    const payload = new TlvWriter().str(1, 'abc').str(2, 'defgh').finish();
    assert.equal(parseTlv(payload).length, 2);
    assert.throws(() => parseTlv(payload.subarray(0, payload.length - 1)), ProtocolError);
    assert.throws(() => parseTlv(payload.subarray(0, 9 + 3)), ProtocolError); // half a header
    assert.deepEqual(parseTlv(Buffer.alloc(0)), []);
  });

  it('encodes EXEC commands as ARGV_BEGIN followed by their args, in order', () => {
    const payload = encodeExec({ commands: [['a', 'b'], ['c']], env: { K: 'v' }, timeoutMs: 5, maxOutput: 7 });
    const tags = parseTlv(payload).map((f) => f.tag);
    const commandTags = tags.filter((t) => t === Tag.ArgvBegin || t === Tag.Arg);
    assert.deepEqual(commandTags, [Tag.ArgvBegin, Tag.Arg, Tag.Arg, Tag.ArgvBegin, Tag.Arg]);
    const env = parseTlv(payload).find((f) => f.tag === Tag.Env);
    assert.equal(env?.value.toString(), 'K=v');
  });

  it('encodes SEED as a u64 only when given, and refuses seeds outside [0, 2^64)', () => {
    assert.equal(parseTlv(encodeExec({ commands: [['x']] })).some((f) => f.tag === Tag.Seed), false);
    const max = parseTlv(encodeExec({ commands: [['x']], seed: 18446744073709551615n })).find((f) => f.tag === Tag.Seed);
    assert.equal(max?.value.length, 8);
    assert.equal(max?.value.readBigUInt64LE(0), 18446744073709551615n);
    assert.throws(() => encodeExec({ commands: [['x']], seed: 1n << 64n }), ProtocolError);
    assert.throws(() => encodeExec({ commands: [['x']], seed: -1n }), ProtocolError);
    assert.throws(() => encodeExec({ commands: [['x']], seed: 5 as unknown as bigint }), ProtocolError);
  });

  it('refuses exec requests the guest would reject or that exceed a frame', () => {
    assert.throws(() => encodeExec({ commands: [] }), ProtocolError);
    assert.throws(() => encodeExec({ commands: [[]] }), ProtocolError);
    assert.throws(() => encodeExec({ commands: [['x']], env: { 'A=B': 'c' } }), ProtocolError);
    assert.throws(() => encodeExec({ commands: [['x\0y']] }), ProtocolError);
    assert.throws(() => encodeExec({ commands: [['cat']], stdin: Buffer.alloc(MAX_FRAME_PAYLOAD) }), ProtocolError);
    assert.throws(() => encodeRestored({ entropy: Buffer.alloc(16), timeNs: 1n, sandboxId: 's', token: 't' }), ProtocolError);
  });

  it('writes FILE_WRITE TRUNCATE and OFFSET only when asked', () => {
    const first = parseTlv(encodeFileWrite({ path: '/p', data: Buffer.from('x'), truncate: true, mode: 0o600 }));
    assert.deepEqual(first.map((f) => f.tag).sort(), [Tag.Mode, Tag.Path, Tag.Data, Tag.Truncate].sort());
    const next = parseTlv(encodeFileWrite({ path: '/p', data: Buffer.from('x'), offset: 10 }));
    assert.deepEqual(next.map((f) => f.tag).sort(), [Tag.Path, Tag.Data, Tag.Offset].sort());
  });

  it('decodes PIDS_LIMITED (43, u8) into pidsLimited: true, and only a 1 sets it', () => {
    assert.equal(Tag.PidsLimited, 43);
    const limited = decodeExecResult(
      new TlvWriter().i32(Tag.ExitCode, 137).u32(Tag.Signal, 9).u8(Tag.PidsLimited, 1).str(Tag.ErrorText, 'the exec hit its process limit (831 processes)').finish(),
    );
    assert.equal(limited.pidsLimited, true);
    assert.equal(limited.exitCode, 137);
    assert.match(limited.errorText!, /process limit/);
    assert.equal(decodeExecResult(new TlvWriter().i32(Tag.ExitCode, 0).u8(Tag.PidsLimited, 0).finish()).pidsLimited, undefined);
    assert.throws(() => decodeExecResult(new TlvWriter().i32(Tag.ExitCode, 0).u32(Tag.PidsLimited, 1).finish()), ProtocolError, 'exact width');
  });

  it('decodes replies and insists on required fields and exact widths', () => {
    const result = decodeExecResult(
      new TlvWriter()
        .i32(Tag.ExitCode, 137)
        .u32(Tag.Signal, 9)
        .u8(Tag.TimedOut, 0)
        .u8(Tag.StdoutTruncated, 1)
        .u64(Tag.StdoutBytes, 3000000n)
        .u32(Tag.FailedIndex, 2)
        .u64(Tag.StartedNs, 10n)
        .u64(Tag.FinishedNs, 20n)
        .str(Tag.ErrorText, 'boom')
        .finish(),
    );
    assert.equal(result.pidsLimited, undefined, 'absent without the PIDS_LIMITED field');
    assert.deepEqual(result, {
      exitCode: 137,
      signal: 9,
      timedOut: false,
      stdoutTruncated: true,
      stderrTruncated: false,
      stdoutBytes: 3000000,
      stderrBytes: 0,
      failedIndex: 2,
      startedNs: 10n,
      finishedNs: 20n,
      errorText: 'boom',
    });
    assert.throws(() => decodeExecResult(new TlvWriter().u8(Tag.TimedOut, 1).finish()), ProtocolError);
    assert.throws(() => decodeExecResult(new TlvWriter().u32(Tag.ExitCode, 0).u32(Tag.TimedOut, 1).finish()), ProtocolError);
    assert.throws(() => decodeFileData(new TlvWriter().bytes(Tag.Data, Buffer.from('x')).finish()), ProtocolError);
    // A size past 2^53 (the guest's /proc/kcore) is clamped, so the read is refused as too large instead of failing to decode.
    assert.equal(decodeFileData(new TlvWriter().bytes(Tag.Data, Buffer.from('x')).u64(Tag.Size, 2n ** 63n).finish()).size, Number.MAX_SAFE_INTEGER);
    assert.deepEqual(
      decodePong(new TlvWriter().str(Tag.AgentVersion, 'v').u64(Tag.UptimeMs, 5n).str(Tag.SandboxId, 'sb').finish()),
      { agentVersion: 'v', uptimeMs: 5, sandboxId: 'sb' },
    );
  });
});

/** An in-memory stream pair: what the client writes, the fake guest reads, and back. */
function streamPair(): [Duplex, Duplex] {
  const ends: Duplex[] = [];
  const make = (peer: () => Duplex) =>
    new Duplex({
      read() {},
      write(chunk, _encoding, callback) {
        peer().push(chunk);
        callback();
      },
      final(callback) {
        peer().push(null);
        callback();
      },
    });
  ends.push(make(() => ends[1]), make(() => ends[0]));
  return [ends[0], ends[1]];
}

/** Scripted guest: hands each decoded request to `respond`. */
function fakeGuest(stream: Duplex, respond: (frame: Frame, send: (type: number, payload?: Buffer) => void) => void) {
  const decoder = new FrameDecoder();
  const seen: Frame[] = [];
  stream.on('data', (chunk: Buffer) => {
    for (const event of decoder.push(chunk)) {
      if (event.kind !== 'frame') continue;
      seen.push(event.frame);
      respond(event.frame, (type, payload = Buffer.alloc(0)) => stream.write(encodeFrame(type, event.frame.id, payload)));
    }
  });
  return seen;
}

const okResult = new TlvWriter().i32(Tag.ExitCode, 0).finish();

describe('AgentClient (against a scripted guest)', () => {
  it('rejects the pending request with agent_disconnected when the stream closes', async () => {
    const [hostEnd, guestEnd] = streamPair();
    const client = new AgentClient(hostEnd);
    fakeGuest(guestEnd, () => setImmediate(() => guestEnd.end())); // the guest hangs up mid-request
    await assert.rejects(client.ping(5000), (e: unknown) => e instanceof AgentError && e.code === 'agent_disconnected');
    await assert.rejects(client.ping(5000), (e: unknown) => e instanceof AgentError && e.code === 'agent_disconnected');
  });

  it('sends one request at a time, never id 0, and ignores replies to other ids', async () => {
    const [hostEnd, guestEnd] = streamPair();
    const client = new AgentClient(hostEnd);
    let inFlight = 0;
    let maxInFlight = 0;
    const seen = fakeGuest(guestEnd, (frame, send) => {
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      guestEnd.write(encodeFrame(MessageType.Ok, frame.id + 1000, Buffer.alloc(0))); // stale noise
      setTimeout(() => {
        inFlight--;
        send(MessageType.Pong, new TlvWriter().str(Tag.AgentVersion, 'fake').u64(Tag.UptimeMs, 1n).finish());
      }, 5);
    });
    const pongs = await Promise.all([client.ping(), client.ping(), client.ping()]);
    assert.equal(pongs.length, 3);
    assert.equal(maxInFlight, 1);
    assert.equal(new Set(seen.map((f) => f.id)).size, 3);
    assert.ok(seen.every((f) => f.id !== 0));
    client.close();
  });

  it('caps accumulated exec output at maxOutput even if the guest sends more', async () => {
    const [hostEnd, guestEnd] = streamPair();
    const client = new AgentClient(hostEnd);
    fakeGuest(guestEnd, (_frame, send) => {
      for (let i = 0; i < 10; i++) send(MessageType.Stdout, Buffer.alloc(1000, 0x61));
      send(MessageType.ExecResult, okResult);
    });
    let streamed = 0;
    const out = await client.exec({ commands: [['x']], maxOutput: 2500 }, { onStdout: (b) => (streamed += b.length) });
    assert.equal(out.stdout.length, 2500);
    assert.equal(streamed, 10000);
    client.close();
  });

  it('surfaces guest errors as AgentError and unsolicited ones as guestError events', async () => {
    const [hostEnd, guestEnd] = streamPair();
    const client = new AgentClient(hostEnd);
    const unsolicited: AgentError[] = [];
    client.on('guestError', (e: AgentError) => unsolicited.push(e));
    fakeGuest(guestEnd, (_frame, send) => {
      guestEnd.write(encodeFrame(MessageType.Error, 0, new TlvWriter().str(Tag.Code, 'bad_frame').str(Tag.Message, 'noise').finish()));
      send(MessageType.Error, new TlvWriter().str(Tag.Code, 'busy').str(Tag.Message, 'exec 1 is running').finish());
    });
    await assert.rejects(client.exec({ commands: [['x']] }), (e: unknown) => e instanceof AgentError && e.code === 'busy' && /running/.test(e.message));
    assert.deepEqual(
      unsolicited.map((e) => e.code),
      ['bad_frame'],
    );
    client.close();
  });

  it('times out a ping that gets no answer and stays usable', async () => {
    const [hostEnd, guestEnd] = streamPair();
    const client = new AgentClient(hostEnd);
    let calls = 0;
    fakeGuest(guestEnd, (_frame, send) => {
      if (++calls === 1) return;
      send(MessageType.Pong, new TlvWriter().str(Tag.AgentVersion, 'v').u64(Tag.UptimeMs, 1n).finish());
    });
    await assert.rejects(client.ping(50), (e: unknown) => e instanceof AgentError && e.code === 'timeout');
    assert.equal((await client.ping(1000)).agentVersion, 'v');
    client.close();
  });

  it('refuses to read a file larger than the limit', async () => {
    const [hostEnd, guestEnd] = streamPair();
    const client = new AgentClient(hostEnd, { maxReadFileBytes: 100 });
    fakeGuest(guestEnd, (_frame, send) => {
      send(MessageType.FileData, new TlvWriter().bytes(Tag.Data, Buffer.alloc(50)).u64(Tag.Size, 5000n).u32(Tag.Mode, 0o644).finish());
    });
    await assert.rejects(client.readFile('/big'), (e: unknown) => e instanceof AgentError && e.code === 'file_too_large');
    client.close();
  });
});
