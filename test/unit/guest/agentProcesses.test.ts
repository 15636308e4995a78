/**
 * Background processes (src/guest/agent/proc.c) against the real guest agent in test mode
 * (--serve-socket on the host), driven with AgentClient.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { connectSocket, startTestAgent } from '../../support/agentSocket.js';
import { AgentClient, AgentError } from '../../../src/guest/agentClient.js';
import { MessageType, decodeProcExit, decodeProcOutput, type Frame, type ProcExit, type ProcOutput } from '../../../src/guest/protocol.js';

let workDir: string;
let socketPath: string;
let agent: ChildProcess;

/** A client and the process events it received. */
class Host {
  readonly outputs: ProcOutput[] = [];
  readonly exits: ProcExit[] = [];
  private constructor(
    readonly client: AgentClient,
    readonly socket: net.Socket,
  ) {
    client.on('event', (frame: Frame) => {
      if (frame.type === MessageType.ProcOutput) this.outputs.push(decodeProcOutput(frame.payload));
      if (frame.type === MessageType.ProcExit) this.exits.push(decodeProcExit(frame.payload));
    });
  }

  static async connect(): Promise<Host> {
    const socket = await connectSocket(socketPath);
    return new Host(new AgentClient(socket), socket);
  }

  text(pid: number, stream?: string): string {
    return Buffer.concat(this.outputs.filter((o) => o.pid === pid && (!stream || o.stream === stream)).map((o) => o.data)).toString();
  }

  async waitOutput(pid: number, needle: string | RegExp, timeoutMs = 10_000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const t = this.text(pid);
      if (typeof needle === 'string' ? t.includes(needle) : needle.test(t)) return t;
      if (Date.now() > deadline) throw new Error(`no ${String(needle)} in the output of ${pid}: ${JSON.stringify(t)}`);
      await sleep(20);
    }
  }

  async waitExit(pid: number, timeoutMs = 10_000): Promise<ProcExit> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const e = this.exits.find((x) => x.pid === pid);
      if (e) return e;
      if (Date.now() > deadline) throw new Error(`process ${pid} did not exit`);
      await sleep(20);
    }
  }

  close(): void {
    this.client.close();
  }
}

async function withHost<T>(use: (host: Host) => Promise<T>): Promise<T> {
  const host = await Host.connect();
  try {
    return await use(host);
  } finally {
    host.close();
  }
}

function rejectsWith(code: string) {
  return (e: unknown) => e instanceof AgentError && e.code === code;
}

function alive(pid: number): boolean {
  try {
    const state = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
    return state !== undefined && state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

before(async () => {
  workDir = await mkdtemp(join(tmpdir(), 'collimate-agent-proc-'));
  ({ agent, socketPath } = await startTestAgent(workDir));
});

after(async () => {
  agent?.kill('SIGKILL');
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

describe('background processes', () => {
  it('streams stdin in pieces to a process and its output back, then closes stdin and reports the exit', async () => {
    await withHost(async (host) => {
      const { pid, startedNs } = await host.client.startProcess({ argv: ['sh', '-c', 'while read line; do echo "got $line"; echo "err $line" >&2; done; echo bye'], stdinOpen: true });
      assert.ok(pid > 0 && startedNs > 0n);
      await host.client.processInput(pid, Buffer.from('one\n'));
      await host.waitOutput(pid, 'got one\n');
      await host.client.processInput(pid, Buffer.from('tw'));
      await host.client.processInput(pid, Buffer.from('o\n'));
      await host.waitOutput(pid, 'got two\n');
      await host.client.closeProcessStdin(pid);
      const exit = await host.waitExit(pid);
      assert.equal(exit.exitCode, 0);
      assert.equal(exit.signal, undefined);
      assert.equal(host.text(pid, 'stdout'), 'got one\ngot two\nbye\n');
      assert.equal(host.text(pid, 'stderr'), 'err one\nerr two\n');
      assert.equal(exit.stdoutBytes, 20);
      assert.equal(exit.stderrBytes, 16);
      assert.equal(exit.outputTotal, 36);
      // Offsets place every chunk in the process's whole output, all streams together.
      let next = 0;
      for (const o of host.outputs.filter((x) => x.pid === pid)) {
        assert.equal(o.offset, next);
        next += o.data.length;
      }
      assert.equal(next, 36);
      // Exit comes after the output it drained.
      await assert.rejects(host.client.processInput(pid, Buffer.from('late\n')), rejectsWith('process_exited'));
    });
  });

  it('starts a process without address randomization when NO_ASLR asks, with it otherwise', async () => {
    await withHost(async (host) => {
      // personality(2)'s ADDR_NO_RANDOMIZE (0x0040000) as the process itself sees it.
      const persona = async (noAslr?: boolean) => {
        const { pid } = await host.client.startProcess({ argv: ['cat', '/proc/self/personality'], ...(noAslr === undefined ? {} : { noAslr }) });
        assert.equal((await host.waitExit(pid)).exitCode, 0);
        return (BigInt(`0x${host.text(pid, 'stdout').trim()}`) & 0x40000n) === 0x40000n;
      };
      const hosts = (BigInt(`0x${readFileSync('/proc/self/personality', 'utf8').trim()}`) & 0x40000n) === 0x40000n;
      assert.equal(await persona(true), true, 'NO_ASLR 1: ADDR_NO_RANDOMIZE');
      assert.equal(await persona(false), hosts, 'NO_ASLR absent: the personality the agent runs with');
      assert.equal(await persona(), hosts);
    });
  });

  it('signals the process group and reports death by signal', async () => {
    await withHost(async (host) => {
      const { pid } = await host.client.startProcess({ argv: ['sh', '-c', 'sleep 60 & echo child $!; wait'] });
      const child = Number(/child (\d+)/.exec(await host.waitOutput(pid, /child \d+\n/))![1]);
      assert.ok(alive(child));
      await host.client.signalProcess(pid, 15);
      const exit = await host.waitExit(pid);
      assert.equal(exit.signal, 15);
      assert.equal(exit.exitCode, 143);
      // The whole group got it: the backgrounded sleep too.
      for (let i = 0; i < 100 && alive(child); i++) await sleep(20);
      assert.equal(alive(child), false);
      await assert.rejects(host.client.signalProcess(pid, 9), rejectsWith('process_exited'));
    });
  });

  it('gives a process a clean signal state, three stdio fds and /dev/null stdin without STDIN_OPEN', async () => {
    await withHost(async (host) => {
      const { pid } = await host.client.startProcess({ argv: ['sh', '-c', 'exec sleep 30'] });
      await sleep(200);
      assert.deepEqual(readdirSync(`/proc/${pid}/fd`).map(Number).sort(), [0, 1, 2]);
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      assert.match(status, /^SigBlk:\s+0+$/m);
      assert.match(status, /^SigIgn:\s+0+$/m);
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
      assert.equal(Number(stat[2]), pid, 'it leads its own process group');
      assert.equal(Number(stat[3]), pid, 'and its own session');
      await assert.rejects(host.client.processInput(pid, Buffer.from('x')), rejectsWith('stdin_closed'));
      await assert.rejects(host.client.resizeProcess(pid, 100, 40), rejectsWith('not_a_terminal'));
      await host.client.signalProcess(pid, 9);
      assert.equal((await host.waitExit(pid)).signal, 9);
    });
  });

  it('runs a shell on a pseudo-terminal: typed into, read back, resized', async () => {
    await withHost(async (host) => {
      const { pid } = await host.client.startProcess({ argv: ['sh'], pty: { cols: 100, rows: 30 }, env: { PS1: '$ ' } });
      // The terminal echoes what is typed: wait for what only the shell's answer contains.
      await host.client.processInput(pid, Buffer.from('echo "answer=$((6*7))"; stty size; [ -t 0 ] && echo "tty-$((1+1))"\n'));
      const seen = await host.waitOutput(pid, /tty-2/);
      assert.match(seen, /answer=42/);
      assert.match(seen, /30 100/);
      assert.ok(host.outputs.filter((o) => o.pid === pid).every((o) => o.stream === 'pty'));
      await host.client.resizeProcess(pid, 132, 50);
      await host.client.processInput(pid, Buffer.from('stty size\n'));
      await host.waitOutput(pid, /50 132/);
      // Close stdin on a terminal: the EOF character, and the shell exits.
      await host.client.closeProcessStdin(pid);
      const exit = await host.waitExit(pid);
      assert.equal(exit.exitCode, 0);
      assert.equal(exit.stderrBytes, 0);
      assert.ok(exit.stdoutBytes > 0);
    });
  });

  it('runs beside an exec, and an exec runs while background processes do', async () => {
    await withHost(async (host) => {
      const { pid } = await host.client.startProcess({ argv: ['sh', '-c', 'while :; do echo tick; sleep 0.05; done'] });
      const exec = host.client.exec({ commands: [['sh', '-c', 'sleep 0.3; echo exec-done']] });
      // While the exec runs: another process starts, is listed, signalled.
      await sleep(50);
      const second = await host.client.startProcess({ argv: ['cat'], stdinOpen: true, tag: 'beside' });
      await host.client.processInput(second.pid, Buffer.from('during exec\n'));
      await host.waitOutput(second.pid, 'during exec');
      const listed = await host.client.listProcesses();
      assert.equal(listed.find((e) => e.pid === second.pid)?.tag, 'beside');
      const out = await exec;
      assert.equal(out.stdout.toString(), 'exec-done\n');
      assert.ok(host.text(pid).split('tick').length > 3, 'the background process kept printing during the exec');
      await host.client.signalProcess(pid, 9);
      await host.client.closeProcessStdin(second.pid);
      await host.waitExit(pid);
      await host.waitExit(second.pid);
    });
  });

  it('lists live and exited processes to a host that reconnects, with what they wrote meanwhile counted', async () => {
    let pid: number;
    let quick: number;
    await withHost(async (host) => {
      ({ pid } = await host.client.startProcess({ argv: ['sh', '-c', 'echo start; read x; head -c 100000 /dev/zero; echo; sleep 30'], stdinOpen: true, tag: 'survivor', cwd: '/tmp', env: { A: '1' } }));
      ({ pid: quick } = await host.client.startProcess({ argv: ['sh', '-c', 'read x; exit 7'], stdinOpen: true }));
      await host.waitOutput(pid, 'start\n');
      // Both are fed now, and act only once this host is gone.
      await host.client.processInput(quick, Buffer.from('go\n'));
      await host.client.processInput(pid, Buffer.from('go\n'));
    });
    await sleep(500);
    await withHost(async (host) => {
      const table = await host.client.listProcesses();
      const survivor = table.find((e) => e.pid === pid)!;
      assert.deepEqual(survivor.argv, ['sh', '-c', 'echo start; read x; head -c 100000 /dev/zero; echo; sleep 30']);
      assert.equal(survivor.tag, 'survivor');
      assert.equal(survivor.cwd, '/tmp');
      assert.equal(survivor.pty, false);
      assert.equal(survivor.stdinOpen, true);
      assert.equal(survivor.exit, undefined);
      // Read and dropped while nobody listened, but counted.
      assert.equal(survivor.outputTotal, 6 + 100001);
      const exited = table.find((e) => e.pid === quick)!;
      assert.equal(exited.exit?.exitCode, 7);
      assert.equal(host.exits.length, 0, 'an exit nobody heard is only in the table');
      // New output continues at the process's offsets.
      await host.client.signalProcess(pid, 15);
      const exit = await host.waitExit(pid);
      assert.equal(exit.outputTotal, 6 + 100001);
    });
  });

  it('stops reading a process whose output the host does not take (it blocks), and resumes', async () => {
    await withHost(async (host) => {
      const { pid } = await host.client.startProcess({ argv: ['sh', '-c', 'exec head -c 200000000 /dev/zero'] });
      await host.waitOutput(pid, /\0/);
      host.socket.pause();
      await sleep(500);
      const written = () => Number(/wchar: (\d+)/.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))![1]);
      const before = written();
      await sleep(400);
      assert.equal(written(), before, 'the writer is blocked while the host does not read');
      assert.ok(before < 64 * 1024 * 1024, `it got only a bounded way ahead (${before} bytes)`);
      host.socket.resume();
      await host.client.signalProcess(pid, 9);
      await host.waitExit(pid, 30_000);
    });
  });

  it('lists a process with a huge command line cut short (the table always fits one frame)', async () => {
    await withHost(async (host) => {
      const args = Array.from({ length: 3000 }, (_, i) => `a${i}`);
      const { pid } = await host.client.startProcess({ argv: ['sh', '-c', 'sleep 30', ...args] });
      const entry = (await host.client.listProcesses()).find((e) => e.pid === pid)!;
      assert.equal(entry.argvTruncated, true);
      assert.equal(entry.argv.length, 64);
      assert.deepEqual(entry.argv.slice(0, 4), ['sh', '-c', 'sleep 30', 'a0']);
      await host.client.signalProcess(pid, 9);
      await host.waitExit(pid);
    });
  });

  it('refuses unknown pids, unknown programs, a bad cwd, and a 65th live process', async () => {
    await withHost(async (host) => {
      await assert.rejects(host.client.signalProcess(999_999, 15), rejectsWith('process_not_found'));
      await assert.rejects(host.client.startProcess({ argv: ['no-such-program-here'] }), rejectsWith('command_not_found'));
      await assert.rejects(host.client.startProcess({ argv: ['true'], cwd: '/no/such/dir' }), rejectsWith('spawn_failed'));
      const pids: number[] = [];
      try {
        for (;;) {
          const listed = (await host.client.listProcesses()).filter((e) => !e.exit).length;
          if (listed >= 64) break;
          pids.push((await host.client.startProcess({ argv: ['sleep', '30'] })).pid);
        }
        await assert.rejects(host.client.startProcess({ argv: ['sleep', '30'] }), rejectsWith('too_many_processes'));
      } finally {
        for (const pid of pids) await host.client.signalProcess(pid, 9).catch(() => {});
      }
      for (const pid of pids) await host.waitExit(pid);
      // The table keeps at most 64 exited processes.
      const table = await host.client.listProcesses();
      assert.ok(table.filter((e) => e.exit).length <= 64);
      assert.ok(!table.some((e) => !e.exit && pids.includes(e.pid)));
      // Room again.
      const again = await host.client.startProcess({ argv: ['true'] });
      assert.equal((await host.waitExit(again.pid)).exitCode, 0);
    });
  });
});
