/** The background-process messages of the codec (src/guest/protocol.ts), against literal bytes. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  ProtocolError, Tag, TlvWriter, decodeProcExit, decodeProcOutput, decodeProcStarted, decodeProcTable, encodeProcInput, encodeProcPid,
  encodeProcResize, encodeProcSignal, encodeProcStart, parseTlv,
} from '../../../src/guest/protocol.js';

describe('process messages', () => {
  it('PROC_START: one command, env, cwd, seed, pty with its size, stdin flag, tag', () => {
    const fields = parseTlv(encodeProcStart({ argv: ['sh', '-c', 'x'], env: { A: '1' }, cwd: '/w', seed: 5n, pty: { cols: 100, rows: 30 }, stdinOpen: true, tag: 't' }));
    assert.deepEqual(fields.map((f) => f.tag), [Tag.ArgvBegin, Tag.Arg, Tag.Arg, Tag.Arg, Tag.Env, Tag.Cwd, Tag.Seed, Tag.Pty, Tag.Cols, Tag.Rows, Tag.StdinOpen, Tag.ProcTag]);
    assert.deepEqual(fields.slice(1, 4).map((f) => f.value.toString()), ['sh', '-c', 'x']);
    assert.equal(fields[4].value.toString(), 'A=1');
    assert.equal(fields[8].value.readUInt32LE(0), 100);
    assert.equal(fields[9].value.readUInt32LE(0), 30);
    assert.deepEqual(parseTlv(encodeProcStart({ argv: ['true'] })).map((f) => f.tag), [Tag.ArgvBegin, Tag.Arg]);
    for (const bad of [{ argv: [] }, { argv: ['a\0b'] }, { argv: ['x'], pty: { cols: 0, rows: 1 } }, { argv: ['x'], tag: 'x'.repeat(257) }, { argv: ['x'], env: { 'A=B': '1' } }]) {
      assert.throws(() => encodeProcStart(bad), ProtocolError, JSON.stringify(bad));
    }
  });

  it('requests naming a process', () => {
    assert.deepEqual([...encodeProcPid(7)], [100, 0, 4, 0, 0, 0, 7, 0, 0, 0]);
    assert.deepEqual(parseTlv(encodeProcInput(7, Buffer.from('hi'))).map((f) => [f.tag, f.value.toString('hex')]), [[100, '07000000'], [61, '6869']]);
    assert.deepEqual(parseTlv(encodeProcSignal(7, 15)).map((f) => f.value.readUInt32LE(0)), [7, 15]);
    assert.deepEqual(parseTlv(encodeProcResize(7, 80, 24)).map((f) => f.value.readUInt32LE(0)), [7, 80, 24]);
    assert.throws(() => encodeProcPid(0), ProtocolError);
    assert.throws(() => encodeProcInput(7, Buffer.alloc(0)), ProtocolError);
    assert.throws(() => encodeProcSignal(7, 65), ProtocolError);
  });

  it('decodes STARTED, OUTPUT and EXIT', () => {
    assert.deepEqual(decodeProcStarted(new TlvWriter().u32(Tag.Pid, 9).u64(Tag.StartedNs, 123n).finish()), { pid: 9, startedNs: 123n });
    const out = decodeProcOutput(new TlvWriter().u32(Tag.Pid, 9).u8(Tag.Stream, 3).u64(Tag.OutputOffset, 42).bytes(Tag.Data, Buffer.from('x')).finish());
    assert.deepEqual({ ...out, data: out.data.toString() }, { pid: 9, stream: 'pty', offset: 42, data: 'x' });
    assert.throws(() => decodeProcOutput(new TlvWriter().u32(Tag.Pid, 9).u8(Tag.Stream, 4).u64(Tag.OutputOffset, 0).bytes(Tag.Data, Buffer.alloc(0)).finish()), ProtocolError);
    const exit = decodeProcExit(new TlvWriter().u32(Tag.Pid, 9).i32(Tag.ExitCode, 137).u32(Tag.Signal, 9).u64(Tag.FinishedNs, 5n).u8(Tag.PidsLimited, 1)
      .u64(Tag.StdoutBytes, 1).u64(Tag.StderrBytes, 2).u64(Tag.OutputTotal, 3).finish());
    assert.deepEqual(exit, { pid: 9, exitCode: 137, signal: 9, finishedNs: 5n, pidsLimited: true, stdoutBytes: 1, stderrBytes: 2, outputTotal: 3 });
  });

  it('decodes a TABLE of entries, each starting at PROC_ENTRY', () => {
    const w = new TlvWriter()
      .empty(Tag.ProcEntry).u32(Tag.Pid, 1).str(Tag.Arg, 'sleep').str(Tag.Arg, '9').str(Tag.Cwd, '/').u8(Tag.Pty, 0).u8(Tag.StdinOpen, 1).u64(Tag.StartedNs, 10n).u8(Tag.Exited, 0)
      .u64(Tag.StdoutBytes, 0).u64(Tag.StderrBytes, 0).u64(Tag.OutputTotal, 0)
      .empty(Tag.ProcEntry).u32(Tag.Pid, 2).str(Tag.Arg, 'sh').u8(Tag.ArgvTruncated, 1).str(Tag.Cwd, '/root').str(Tag.ProcTag, 'srv').u8(Tag.Pty, 1).u64(Tag.StartedNs, 11n)
      .u8(Tag.Exited, 1).i32(Tag.ExitCode, 3).u64(Tag.FinishedNs, 12n).u64(Tag.StdoutBytes, 5).u64(Tag.StderrBytes, 0).u64(Tag.OutputTotal, 5);
    const [a, b] = decodeProcTable(w.finish());
    assert.deepEqual(a, { pid: 1, argv: ['sleep', '9'], argvTruncated: false, cwd: '/', pty: false, stdinOpen: true, startedNs: 10n, stdoutBytes: 0, stderrBytes: 0, outputTotal: 0 });
    assert.deepEqual(b, { pid: 2, argv: ['sh'], argvTruncated: true, cwd: '/root', tag: 'srv', pty: true, stdinOpen: false, startedNs: 11n, stdoutBytes: 5, stderrBytes: 0, outputTotal: 5, exit: { exitCode: 3, finishedNs: 12n } });
    assert.deepEqual(decodeProcTable(Buffer.alloc(0)), []);
    assert.throws(() => decodeProcTable(new TlvWriter().u32(Tag.Pid, 1).finish()), ProtocolError);
  });
});
