/**
 * Runs the real guest agent in test mode (--serve-socket / --serve-fd) on the host
 * and drives it over its socket, with AgentClient or with raw frames.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildAgent } from '../../../src/guest/agentBuild.js';
import { connectSocket } from '../../support/agentSocket.js';
import { AgentClient, AgentError } from '../../../src/guest/agentClient.js';
import {
  FRAME_HEADER_SIZE,
  FrameDecoder,
  MAGIC,
  MessageType,
  Tag,
  TlvWriter,
  decodeError,
  decodeExecResult,
  decodeFileData,
  encodeExec,
  encodeFileRead,
  encodeFrame,
  type Frame,
} from '../../../src/guest/protocol.js';

let workDir: string;
let agentBinary: string;
let socketPath: string;
let agent: ChildProcess;

async function withClient<T>(use: (client: AgentClient, socket: net.Socket) => Promise<T>): Promise<T> {
  const socket = await connectSocket(socketPath);
  const client = new AgentClient(socket);
  try {
    return await use(client, socket);
  } finally {
    client.close();
  }
}

/** Frames straight off the socket, for the tests that need to misbehave. */
class RawPeer {
  private readonly decoder = new FrameDecoder();
  private readonly frames: Frame[] = [];
  private wake: (() => void) | undefined;

  private constructor(readonly socket: net.Socket) {
    socket.on('data', (chunk: Buffer) => {
      for (const event of this.decoder.push(chunk)) if (event.kind === 'frame') this.frames.push(event.frame);
      this.wake?.();
    });
  }

  static async connect(): Promise<RawPeer> {
    return new RawPeer(await connectSocket(socketPath));
  }

  send(type: number, id: number, payload: Buffer = Buffer.alloc(0)): void {
    this.socket.write(encodeFrame(type, id, payload));
  }

  async next(timeoutMs = 5000): Promise<Frame> {
    const deadline = Date.now() + timeoutMs;
    while (this.frames.length === 0) {
      if (Date.now() > deadline) throw new Error('no frame from the agent');
      await Promise.race([new Promise<void>((resolve) => (this.wake = resolve)), sleep(50)]);
    }
    return this.frames.shift() as Frame;
  }

  /** Skips output chunks and returns the next frame of another kind. */
  async nextReply(timeoutMs = 5000): Promise<Frame> {
    for (;;) {
      const frame = await this.next(timeoutMs);
      if (frame.type !== MessageType.Stdout && frame.type !== MessageType.Stderr) return frame;
    }
  }

  close(): void {
    this.socket.destroy();
  }
}

function errorCode(frame: Frame): string {
  assert.equal(frame.type, MessageType.Error, `expected ERROR, got type 0x${frame.type.toString(16)}`);
  return decodeError(frame.payload).code;
}

async function waitFor(condition: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) return false;
    await sleep(20);
  }
  return true;
}

function processAlive(pid: number): boolean {
  try {
    const state = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
    return state !== undefined && state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

function zombieChildrenOf(pid: number): number[] {
  const children = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim();
  if (!children) return [];
  return children
    .split(/\s+/)
    .map(Number)
    .filter((child) => {
      try {
        return readFileSync(`/proc/${child}/stat`, 'utf8').split(') ')[1]?.[0] === 'Z';
      } catch {
        return false;
      }
    });
}

before(async () => {
  workDir = await mkdtemp(join(tmpdir(), 'collimate-agent-'));
  agentBinary = await buildAgent(join(workDir, 'bin'));
  socketPath = join(workDir, 'agent.sock');
  agent = spawn(agentBinary, ['--serve-socket', socketPath], {
    stdio: ['ignore', 'inherit', 'inherit'],
    env: { ...process.env, COLLIMATE_MUST_NOT_LEAK: 'agent-env' },
  });
  (await connectSocket(socketPath)).destroy();
});

after(async () => {
  agent?.kill('SIGKILL');
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

describe('exec', () => {
  it('runs a command and returns its stdout and exit status', async () => {
    await withClient(async (client) => {
      const { result, stdout, stderr } = await client.exec({ commands: [['echo', 'hello']] });
      assert.equal(stdout.toString(), 'hello\n');
      assert.equal(stderr.length, 0);
      assert.equal(result.exitCode, 0);
      assert.equal(result.timedOut, false);
      assert.equal(result.stdoutBytes, 6);
      assert.ok(result.startedNs > 0n && result.finishedNs >= result.startedNs);
    });
  });

  it('answers a concurrent request while an exec runs, and queues serialized ones behind it', async () => {
    await withClient(async (client) => {
      const order: string[] = [];
      const exec = client.exec({ commands: [['sh', '-c', 'sleep 0.4; echo done']] }).then(() => order.push('exec'));
      await sleep(50);
      const pong = client
        .concurrentRequest(MessageType.Ping, Buffer.alloc(0), 5000, (frame, done) => {
          if (frame.type !== MessageType.Pong) return false;
          done(frame);
          return true;
        })
        .then(() => order.push('concurrent ping'));
      const serializedPing = client.ping().then(() => order.push('serialized ping'));
      await Promise.all([exec, pong, serializedPing]);
      assert.deepEqual(order, ['concurrent ping', 'exec', 'serialized ping']);
    });
  });

  it('returns stderr and a non-zero exit code', async () => {
    await withClient(async (client) => {
      const { result, stdout, stderr } = await client.exec({ commands: [['sh', '-c', 'echo oops >&2; exit 3']] });
      assert.equal(result.exitCode, 3);
      assert.equal(stderr.toString(), 'oops\n');
      assert.equal(stdout.length, 0);
      assert.equal(result.signal, undefined);
    });
  });

  it('runs commands in order and stops at the first failure', async () => {
    await withClient(async (client) => {
      const failed = await client.exec({
        commands: [['sh', '-c', 'echo one'], ['sh', '-c', 'echo two; exit 4'], ['sh', '-c', 'echo three']],
      });
      assert.equal(failed.stdout.toString(), 'one\ntwo\n');
      assert.equal(failed.result.exitCode, 4);
      assert.equal(failed.result.failedIndex, 1);

      const passed = await client.exec({ commands: [['echo', 'a'], ['echo', 'b'], ['echo', 'c']] });
      assert.equal(passed.stdout.toString(), 'a\nb\nc\n');
      assert.equal(passed.result.exitCode, 0);
      assert.equal(passed.result.failedIndex, 2);
    });
  });

  it('reports death by signal as 128+N with SIGNAL', async () => {
    await withClient(async (client) => {
      const { result } = await client.exec({ commands: [['sh', '-c', 'kill -TERM $$'], ['echo', 'not reached']] });
      assert.equal(result.exitCode, 143);
      assert.equal(result.signal, 15);
      assert.equal(result.failedIndex, 0);
    });
  });

  it('writes files (creating parents, with their mode) before running anything', async () => {
    const target = join(workDir, 'files', 'a', 'b', 'script.sh');
    await withClient(async (client) => {
      const { result, stdout } = await client.exec({
        files: [
          { path: target, mode: 0o700, data: Buffer.from('#!/bin/sh\necho from-script\n') },
          { path: join(workDir, 'files', 'plain.txt'), data: Buffer.from('plain') },
        ],
        commands: [[target], ['stat', '-c', '%a', target, join(workDir, 'files', 'plain.txt')]],
      });
      assert.equal(result.exitCode, 0, result.errorText);
      assert.equal(stdout.toString(), 'from-script\n700\n644\n');
    });
  });

  it('fails with file_write_failed and runs nothing when a file cannot be written', async () => {
    const marker = join(workDir, 'must-not-exist');
    await withClient(async (client) => {
      await assert.rejects(
        client.exec({ files: [{ path: '/proc/version/child', data: Buffer.from('x') }], commands: [['touch', marker]] }),
        (e: unknown) => e instanceof AgentError && e.code === 'file_write_failed' && e.message.includes('/proc/version/child'),
      );
    });
    assert.equal(existsSync(marker), false);
  });

  it('applies ENV over the base environment, CWD, and STDIN to the first command only', async () => {
    const cwd = join(workDir, 'cwd-test');
    await mkdir(cwd, { recursive: true });
    await withClient(async (client) => {
      const { result, stdout } = await client.exec({
        commands: [
          ['sh', '-c', 'echo "$GREETING $LANG $HOME"; pwd; cat; echo; env | grep -c COLLIMATE_MUST_NOT_LEAK || true'],
          ['sh', '-c', 'cat; echo second-done'],
        ],
        env: { GREETING: 'hi', LANG: 'en_US.UTF-8' },
        cwd,
        stdin: Buffer.from('piped input'),
      });
      assert.equal(result.exitCode, 0, result.errorText);
      assert.equal(stdout.toString(), `hi en_US.UTF-8 /root\n${cwd}\npiped input\n0\nsecond-done\n`);
    });
  });

  it('gives commands a clean signal state (SIGPIPE default, nothing blocked)', async () => {
    await withClient(async (client) => {
      const { stdout } = await client.exec({ commands: [['grep', '-E', '^Sig(Ign|Blk)', '/proc/self/status']] });
      const masks = Object.fromEntries(
        stdout
          .toString()
          .trim()
          .split('\n')
          .map((line) => line.split(/:\s+/)),
      );
      const SIGPIPE_BIT = 1n << 12n;
      const SIGCHLD_BIT = 1n << 16n;
      const SIGIO_BIT = 1n << 28n;
      assert.equal(BigInt(`0x${masks.SigIgn}`) & SIGPIPE_BIT, 0n, 'SIGPIPE must not be ignored');
      assert.equal(BigInt(`0x${masks.SigBlk}`) & SIGCHLD_BIT, 0n, 'SIGCHLD must not be blocked');
      assert.equal(BigInt(`0x${masks.SigBlk}`) & SIGIO_BIT, 0n, 'SIGIO (the agent waits for it) must not be blocked');
    });
  });

  it('seeds an exec: COLLIMATE_SEED and PYTHONHASHSEED the caller cannot override, no stale lineage, ASLR off', async () => {
    // splitmix64's finalizer, as in src/guest/seed/seed_env.h.
    const mix = (seed: bigint) => {
      const M = (1n << 64n) - 1n;
      let x = (seed + 0x9e3779b97f4a7c15n) & M;
      x = ((x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
      x = ((x ^ (x >> 27n)) * 0x94d049bb133111ebn) & M;
      return (x ^ (x >> 31n)) & 0xffffffffn;
    };
    const show = ['sh', '-c', 'env | grep -E "^(COLLIMATE_|PYTHONHASHSEED=|LD_PRELOAD=)" | sort; cat /proc/self/personality'];
    // The library is only preloaded where it (and the glibc loader) exist; on this host, only if installed there.
    const preloads = existsSync('/run/collimate/libcollimate-seed.so') && existsSync('/lib64/ld-linux-x86-64.so.2');
    await withClient(async (client) => {
      const seeded = await client.exec({
        commands: [show, show],
        env: { COLLIMATE_SEED: '7', COLLIMATE_SEED_LINEAGE: 'ab'.repeat(32), COLLIMATE_SEED_NODE_ARG: '--random-seed=1' },
        seed: 18446744073709551615n,
      });
      assert.equal(seeded.result.exitCode, 0, seeded.result.errorText);
      const lines = [
        ...(preloads ? ['LD_PRELOAD=/run/collimate/libcollimate-seed.so'] : []),
        'COLLIMATE_SEED=18446744073709551615',
        `PYTHONHASHSEED=${mix(18446744073709551615n)}`,
        '00040000',
      ].sort((a, b) => (a === '00040000' ? 1 : b === '00040000' ? -1 : a < b ? -1 : 1));
      const expected = lines.join('\n') + '\n';
      assert.equal(seeded.stdout.toString(), expected + expected, 'every command gets the seed environment');

      // A caller's PYTHONHASHSEED wins; a caller's LD_PRELOAD follows the library.
      const own = await client.exec({ commands: [show], env: { PYTHONHASHSEED: '0', LD_PRELOAD: '/nonexistent.so' }, seed: 0n });
      assert.match(own.stdout.toString(), /^PYTHONHASHSEED=0$/m);
      assert.match(own.stdout.toString(), /^COLLIMATE_SEED=0$/m);
      if (preloads) assert.match(own.stdout.toString(), /^LD_PRELOAD=\/run\/collimate\/libcollimate-seed\.so:\/nonexistent\.so$/m);

      // Without SEED nothing changes: the caller's variables pass through, ASLR stays as it was.
      const plain = await client.exec({ commands: [show], env: { COLLIMATE_SEED: '7' } });
      assert.equal(plain.stdout.toString().split('\n')[0], 'COLLIMATE_SEED=7');
      assert.doesNotMatch(plain.stdout.toString(), /PYTHONHASHSEED|LD_PRELOAD|LINEAGE/);
      assert.equal((BigInt(`0x${plain.stdout.toString().trim().split('\n').pop()}`) & 0x40000n) === 0x40000n,
        (BigInt(`0x${readFileSync('/proc/self/personality', 'utf8').trim()}`) & 0x40000n) === 0x40000n);
    });
  });

  it('refuses a SEED that is not a u64', async () => {
    const socket = await connectSocket(socketPath);
    try {
      const decoder = new FrameDecoder();
      const payload = new TlvWriter().empty(Tag.ArgvBegin).str(Tag.Arg, 'true').u32(Tag.Seed, 1).finish();
      socket.write(encodeFrame(MessageType.Exec, 77, payload));
      const frame = await new Promise<Frame>((resolve) => {
        socket.on('data', (chunk) => {
          for (const e of decoder.push(chunk)) if (e.kind === 'frame') resolve(e.frame);
        });
      });
      assert.equal(frame.type, MessageType.Error);
      assert.equal(frame.id, 77);
      assert.deepEqual(decodeError(frame.payload), { code: 'bad_request', message: 'SEED must be a u64' });
    } finally {
      socket.destroy();
    }
  });

  it('passes commands only their three stdio descriptors', async () => {
    await withClient(async (client) => {
      // Exec'd directly, so the only extra fd is the one ls opens to list the directory.
      const { stdout } = await client.exec({ commands: [['ls', '/proc/self/fd']] });
      assert.deepEqual(stdout.toString().trim().split(/\s+/).map(Number), [0, 1, 2, 3]);
    });
  });

  it('maps spawn failures to 127 (not found) and 126 (cwd missing) with ERROR_TEXT', async () => {
    await withClient(async (client) => {
      const missing = await client.exec({ commands: [['echo', 'first'], ['collimate-no-such-program'], ['echo', 'never']] });
      assert.equal(missing.result.exitCode, 127);
      assert.equal(missing.result.failedIndex, 1);
      assert.match(missing.result.errorText ?? '', /collimate-no-such-program/);
      assert.equal(missing.stdout.toString(), 'first\n');

      const badCwd = await client.exec({ commands: [['true']], cwd: join(workDir, 'no', 'such', 'dir') });
      assert.equal(badCwd.result.exitCode, 126);
      assert.match(badCwd.result.errorText ?? '', /cwd/);
    });
  });

  it('kills the whole process group on timeout, returns 124, and keeps serving', async () => {
    await withClient(async (client) => {
      const started = Date.now();
      const { result, stdout } = await client.exec({
        commands: [['sh', '-c', 'sleep 60 & echo $!; exec sleep 60']],
        timeoutMs: 1000,
      });
      const elapsed = Date.now() - started;
      assert.equal(result.timedOut, true);
      assert.equal(result.exitCode, 124);
      assert.ok(elapsed >= 900 && elapsed < 30_000, `took ${elapsed} ms: the timeout did not end the 60 s sleep`);
      const backgroundPid = Number(stdout.toString().trim());
      assert.ok(backgroundPid > 0);
      assert.ok(await waitFor(() => !processAlive(backgroundPid), 2000), 'the group member survived the timeout');

      const next = await client.exec({ commands: [['echo', 'still here']] });
      assert.equal(next.stdout.toString(), 'still here\n');
      assert.equal(next.result.timedOut, false);
    });
  });

  it('caps output per stream, counts the rest and flags truncation', async () => {
    await withClient(async (client) => {
      let largestChunk = 0;
      const { result, stdout, stderr } = await client.exec(
        { commands: [['sh', '-c', 'head -c 3000000 /dev/zero; echo small >&2']], maxOutput: 1024 * 1024 },
        { onStdout: (chunk) => (largestChunk = Math.max(largestChunk, chunk.length)) },
      );
      assert.equal(result.exitCode, 0);
      assert.equal(stdout.length, 1024 * 1024);
      assert.equal(result.stdoutTruncated, true);
      assert.equal(result.stdoutBytes, 3_000_000);
      assert.equal(stderr.toString(), 'small\n');
      assert.equal(result.stderrTruncated, false);
      assert.ok(largestChunk > 0 && largestChunk <= 64 * 1024, `chunk of ${largestChunk} bytes`);
    });
  });

  it('returns promptly while a background process lives on with its pipes intact', async () => {
    const marker = join(workDir, 'late-marker');
    await withClient(async (client) => {
      const { result, stdout } = await client.exec({
        // `&&`: if the agent had closed the pipe, echo dies of SIGPIPE (or fails) and no marker appears.
        commands: [['sh', '-c', `(sleep 3; echo late && touch ${marker}) & echo started`]],
      });
      assert.equal(result.exitCode, 0);
      assert.equal(stdout.toString(), 'started\n');
      // An exec that waited for the background process would only answer after its marker exists.
      assert.equal(existsSync(marker), false, 'exec answered before the background process ended');
      assert.ok(await waitFor(() => existsSync(marker), 10_000), 'background process did not finish its work');
      // Orphans come back to the agent (a subreaper in test mode, PID 1 in the guest): none may linger as zombies.
      assert.ok(await waitFor(() => zombieChildrenOf(agent.pid as number).length === 0, 2000), 'agent left zombies behind');
    });
  });

  it('is not confused by orphans exiting while it waits for a command', async () => {
    await withClient(async (client) => {
      const { result } = await client.exec({
        commands: [['sh', '-c', '(sleep 0.1; exit 9) & (exit 7) & exit 0'], ['sleep', '0.4']],
      });
      assert.equal(result.exitCode, 0);
      assert.equal(result.failedIndex, 1);
    });
  });
});

describe('protocol robustness', () => {
  it('answers PING and refuses a second EXEC with busy while an exec runs', async () => {
    const peer = await RawPeer.connect();
    try {
      peer.send(MessageType.Exec, 10, encodeExec({ commands: [['sleep', '0.5']] }));
      peer.send(MessageType.Ping, 11);
      peer.send(MessageType.Exec, 12, encodeExec({ commands: [['echo', 'second']] }));
      const pong = await peer.next();
      assert.deepEqual([pong.type, pong.id], [MessageType.Pong, 11]);
      const busy = await peer.next();
      assert.equal(busy.id, 12);
      assert.equal(errorCode(busy), 'busy');
      const result = await peer.nextReply();
      assert.deepEqual([result.type, result.id], [MessageType.ExecResult, 10]);
      assert.equal(decodeExecResult(result.payload).exitCode, 0);
    } finally {
      peer.close();
    }
  });

  it('reports garbage bytes once with bad_frame and keeps serving', async () => {
    const peer = await RawPeer.connect();
    try {
      peer.socket.write(Buffer.from('this is definitely not a frame header!'));
      peer.send(MessageType.Ping, 21);
      const report = await peer.next();
      assert.equal(report.id, 0);
      assert.equal(errorCode(report), 'bad_frame');
      const pong = await peer.next();
      assert.deepEqual([pong.type, pong.id], [MessageType.Pong, 21]);
    } finally {
      peer.close();
    }
  });

  it('treats an oversized length as a bad frame instead of waiting for it', async () => {
    await withClient(async (client, socket) => {
      const reports: AgentError[] = [];
      client.on('guestError', (e: AgentError) => reports.push(e));
      const header = Buffer.alloc(FRAME_HEADER_SIZE);
      header.writeUInt32LE(MAGIC, 0);
      header.writeUInt16LE(MessageType.FileWrite, 4);
      header.writeUInt32LE(99, 8);
      header.writeUInt32LE(0xffffffff, 12);
      socket.write(header);
      const pong = await client.ping(3000);
      assert.equal(typeof pong.agentVersion, 'string');
      assert.deepEqual(
        reports.map((e) => e.code),
        ['bad_frame'],
      );
    });
  });

  it('answers undecodable payloads and unknown types with bad_request and carries on', async () => {
    const peer = await RawPeer.connect();
    try {
      const truncated = Buffer.concat([new TlvWriter().empty(Tag.ArgvBegin).finish(), Buffer.from([Tag.Arg, 0, 100, 0, 0, 0, 0x61, 0x62])]);
      peer.send(MessageType.Exec, 31, truncated);
      const first = await peer.next();
      assert.equal(first.id, 31);
      assert.equal(errorCode(first), 'bad_request');

      peer.send(0x77, 32);
      const second = await peer.next();
      assert.equal(second.id, 32);
      assert.equal(errorCode(second), 'bad_request');

      peer.send(MessageType.Exec, 33, new TlvWriter().u32(Tag.TimeoutMs, 5).finish()); // no commands
      assert.equal(errorCode(await peer.next()), 'bad_request');

      peer.send(MessageType.Ping, 34);
      const pong = await peer.next();
      assert.deepEqual([pong.type, pong.id], [MessageType.Pong, 34]);
    } finally {
      peer.close();
    }
  });

  it('detaches a running exec when the host disconnects, leaving its process alive', async () => {
    const peer = await RawPeer.connect();
    const firstChunk = new Promise<Frame>((resolve, reject) => {
      peer.send(MessageType.Exec, 41, encodeExec({ commands: [['sh', '-c', 'echo $$; exec sleep 5']] }));
      peer.next().then(resolve, reject);
    });
    const chunk = await firstChunk;
    assert.equal(chunk.type, MessageType.Stdout);
    const pid = Number(chunk.payload.toString().trim());
    peer.close();
    try {
      await withClient(async (client) => {
        const { result, stdout } = await client.exec({ commands: [['echo', 'new host']] }, { timeoutMs: 3000 });
        assert.equal(result.exitCode, 0);
        assert.equal(stdout.toString(), 'new host\n');
      });
      assert.ok(processAlive(pid), 'the detached command was killed');
    } finally {
      if (processAlive(pid)) process.kill(pid, 'SIGKILL');
    }
  });
});

describe('restore and identity', () => {
  it('accepts RESTORED in test mode and reports the sandbox id in PONG', async () => {
    await withClient(async (client) => {
      await client.restored({ entropy: randomBytes(64), timeNs: BigInt(Date.now()) * 1_000_000n, sandboxId: 'sb-test-1', token: 'tok' });
      const pong = await client.ping();
      assert.equal(pong.sandboxId, 'sb-test-1');
      assert.ok(pong.uptimeMs > 0);
    });
  });

  it('rejects RESTORED with too little entropy', async () => {
    const peer = await RawPeer.connect();
    try {
      const payload = new TlvWriter().bytes(Tag.Entropy, randomBytes(8)).u64(Tag.TimeNs, 1n).str(Tag.SandboxId, 'x').str(Tag.Token, 'y').finish();
      peer.send(MessageType.Restored, 51, payload);
      assert.equal(errorCode(await peer.next()), 'bad_request');
    } finally {
      peer.close();
    }
  });
});

describe('set time', () => {
  it('answers SET_TIME with OK and keeps the identity RESTORED gave; a SET_TIME without TIME_NS is bad_request', async () => {
    await withClient(async (client) => {
      await client.restored({ entropy: randomBytes(64), timeNs: BigInt(Date.now()) * 1_000_000n, sandboxId: 'sb-set-time', token: 'tok' });
      await client.setTime(BigInt(Date.now()) * 1_000_000n);
      assert.equal((await client.ping()).sandboxId, 'sb-set-time');
    });
    const peer = await RawPeer.connect();
    try {
      peer.send(MessageType.SetTime, 52, new TlvWriter().str(Tag.SandboxId, 'x').finish());
      assert.equal(errorCode(await peer.next()), 'bad_request');
    } finally {
      peer.close();
    }
  });
});

describe('files', () => {
  it('round-trips 3 MiB of binary data through FILE_WRITE and FILE_READ', async () => {
    const path = join(workDir, 'roundtrip', 'deep', 'blob.bin');
    const data = randomBytes(3 * 1024 * 1024 + 12345);
    await withClient(async (client) => {
      await client.writeFile(path, data, 0o640);
      assert.ok((await readFile(path)).equals(data), 'bytes on disk differ');
      assert.equal((await stat(path)).mode & 0o777, 0o640);
      const back = await client.readFile(path);
      assert.equal(back.length, data.length);
      assert.ok(back.equals(data), 'bytes read back differ');

      // Rewriting a file with less data must truncate it first.
      await client.writeFile(path, Buffer.from('short'));
      assert.equal((await client.readFile(path)).toString(), 'short');
      await client.writeFile(join(workDir, 'roundtrip', 'empty'), Buffer.alloc(0));
      assert.equal((await client.readFile(join(workDir, 'roundtrip', 'empty'))).length, 0);
    });
  });

  it('honours OFFSET and LENGTH and reports the whole size', async () => {
    const path = join(workDir, 'ranged.txt');
    const peer = await RawPeer.connect();
    try {
      peer.send(MessageType.FileWrite, 61, new TlvWriter().str(Tag.Path, path).bytes(Tag.Data, Buffer.from('0123456789')).u8(Tag.Truncate, 1).finish());
      assert.equal((await peer.next()).type, MessageType.Ok);
      peer.send(MessageType.FileRead, 62, encodeFileRead({ path, offset: 3, length: 4 }));
      const reply = await peer.next();
      assert.equal(reply.type, MessageType.FileData);
      const chunk = decodeFileData(reply.payload);
      assert.equal(chunk.data.toString(), '3456');
      assert.equal(chunk.size, 10);
      assert.equal(chunk.mode, 0o644);
      peer.send(MessageType.FileRead, 63, encodeFileRead({ path, offset: 50 }));
      assert.equal(decodeFileData((await peer.next()).payload).data.length, 0);
    } finally {
      peer.close();
    }
  });

  it('maps missing files, directories and oversized files to distinct errors', async () => {
    await withClient(async (client) => {
      await assert.rejects(client.readFile(join(workDir, 'nope')), (e: unknown) => e instanceof AgentError && e.code === 'file_not_found');
      await assert.rejects(client.readFile(workDir), (e: unknown) => e instanceof AgentError && e.code === 'not_a_file');
      await client.writeFile(join(workDir, 'medium.bin'), Buffer.alloc(4096));
      await assert.rejects(client.readFile(join(workDir, 'medium.bin'), { maxBytes: 1000 }), (e: unknown) => e instanceof AgentError && e.code === 'file_too_large');
    });
  });
});

describe('--serve-fd', () => {
  it('serves on an inherited socket and exits when it closes', async () => {
    const listenPath = join(workDir, 'fd-mode.sock');
    const server = net.createServer();
    server.listen(listenPath);
    await once(server, 'listening');
    const hostSide = net.createConnection(listenPath);
    const [agentSide] = (await once(server, 'connection')) as [net.Socket];
    const child = spawn(agentBinary, ['--serve-fd', '3'], { stdio: ['ignore', 'inherit', 'inherit', agentSide] });
    agentSide.destroy();
    server.close();
    const client = new AgentClient(hostSide);
    try {
      const { stdout } = await client.exec({ commands: [['echo', 'over fd']] });
      assert.equal(stdout.toString(), 'over fd\n');
      hostSide.end();
      const [code] = await Promise.race([once(child, 'exit'), sleep(3000).then(() => ['still running'])]);
      assert.equal(code, 0);
    } finally {
      child.kill('SIGKILL');
      client.close();
    }
  });
});
