/**
 * A guest agent's background processes in memory, for unit tests of the host side (processes.ts,
 * the fake SandboxService, REST/SDK/MCP/CLI). It speaks what AgentClient would: PROC_OUTPUT and
 * PROC_EXIT as 'event' frames (encoded as the guest does), the guest's error codes as AgentError.
 *
 * Its programs: `echo WORDS` (prints, exits 0), `stderr WORDS` (to stderr, exits 0), `exit N`, and
 * anything else runs until signalled and echoes its input (`cat`; on a pty the input is echoed as
 * the terminal would, and a resize prints `size ROWS COLS`). Closing stdin ends a `cat` with 0.
 * `no-such-program` is command_not_found.
 */
import { EventEmitter } from 'node:events';
import { AgentError } from '../../src/guest/agentClient.js';
import { MessageType, Tag, TlvWriter, type Frame, type ProcEntry, type ProcStartRequest, type ProcStarted } from '../../src/guest/protocol.js';
import type { ProcessAgent } from '../../src/sandboxes/processes.js';

interface FakeProc {
  pid: number;
  req: ProcStartRequest;
  startedNs: bigint;
  stdinOpen: boolean;
  stdout: number;
  stderr: number;
  total: number;
  exit?: { code: number; signal?: number; finishedNs: bigint };
}

export class FakeProcessAgent extends EventEmitter implements ProcessAgent {
  private readonly procs = new Map<number, FakeProc>();
  private nextPid = 100;
  /** When false, events are counted but not sent (a host that is away). */
  connected = true;
  liveLimit = 64;

  async startProcess(req: ProcStartRequest): Promise<ProcStarted> {
    if (req.argv[0] === 'no-such-program') throw new AgentError('command_not_found', 'no-such-program: No such file or directory');
    if ([...this.procs.values()].filter((p) => !p.exit).length >= this.liveLimit) throw new AgentError('too_many_processes', 'too many');
    const p: FakeProc = { pid: this.nextPid++, req, startedNs: BigInt(Date.now()) * 1_000_000n, stdinOpen: !!req.stdinOpen || !!req.pty, stdout: 0, stderr: 0, total: 0 };
    this.procs.set(p.pid, p);
    const line = (req.argv[0] === '/bin/sh' && req.argv[1] === '-c' ? String(req.argv[2]) : req.argv.join(' ')).trim();
    const [cmd, ...rest] = line.split(/\s+/);
    const arg = rest.join(' ');
    // As the guest does: the reply first, output and exit after it.
    setImmediate(() => {
      if (cmd === 'echo') { this.write(p, 1, `${arg}\n`); this.exit(p, 0); }
      else if (cmd === 'stderr') { this.write(p, 2, `${arg}\n`); this.exit(p, 0); }
      else if (cmd === 'exit') this.exit(p, Number(arg) || 0);
    });
    return { pid: p.pid, startedNs: p.startedNs };
  }

  private live(pid: number): FakeProc {
    const p = this.procs.get(pid);
    if (!p) throw new AgentError('process_not_found', `no background process with pid ${pid}`);
    if (p.exit) throw new AgentError('process_exited', `process ${pid} has exited`);
    return p;
  }

  async processInput(pid: number, data: Buffer): Promise<void> {
    const p = this.live(pid);
    if (!p.stdinOpen) throw new AgentError('stdin_closed', `process ${pid} has no open stdin`);
    this.write(p, p.req.pty ? 3 : 1, data);
  }

  async closeProcessStdin(pid: number): Promise<void> {
    const p = this.live(pid);
    if (!p.req.pty) p.stdinOpen = false;
    setImmediate(() => { if (!p.exit) this.exit(p, 0); });
  }

  async signalProcess(pid: number, signal: number): Promise<void> {
    const p = this.live(pid);
    setImmediate(() => this.exit(p, 128 + signal, signal));
  }

  async resizeProcess(pid: number, cols: number, rows: number): Promise<void> {
    const p = this.live(pid);
    if (!p.req.pty) throw new AgentError('not_a_terminal', `process ${pid} does not run on a pseudo-terminal`);
    this.write(p, 3, `size ${rows} ${cols}\n`);
  }

  async listProcesses(): Promise<ProcEntry[]> {
    return [...this.procs.values()].map((p) => ({
      pid: p.pid, argv: p.req.argv.map(String), argvTruncated: false, cwd: p.req.cwd ?? '/root', pty: !!p.req.pty,
      stdinOpen: !p.exit && p.stdinOpen, startedNs: p.startedNs, stdoutBytes: p.stdout, stderrBytes: p.stderr, outputTotal: p.total,
      ...(p.req.tag !== undefined ? { tag: p.req.tag } : {}),
      ...(p.exit ? { exit: { exitCode: p.exit.code, finishedNs: p.exit.finishedNs, ...(p.exit.signal ? { signal: p.exit.signal } : {}) } } : {}),
    }));
  }

  /** Test hook: the process writes (as if by itself). */
  write(p: FakeProc | number, stream: 1 | 2 | 3, data: string | Buffer): void {
    const proc = typeof p === 'number' ? this.procs.get(p)! : p;
    const bytes = Buffer.from(data);
    const offset = proc.total;
    proc.total += bytes.length;
    if (stream === 2) proc.stderr += bytes.length;
    else proc.stdout += bytes.length;
    this.send(MessageType.ProcOutput, new TlvWriter().u32(Tag.Pid, proc.pid).u8(Tag.Stream, stream).u64(Tag.OutputOffset, offset).bytes(Tag.Data, bytes).finish());
  }

  /** Test hook: the process exits. */
  exit(p: FakeProc | number, code: number, signal?: number): void {
    const proc = typeof p === 'number' ? this.procs.get(p)! : p;
    if (proc.exit) return;
    proc.exit = { code, finishedNs: BigInt(Date.now()) * 1_000_000n, ...(signal ? { signal } : {}) };
    const w = new TlvWriter().u32(Tag.Pid, proc.pid).i32(Tag.ExitCode, code);
    if (signal) w.u32(Tag.Signal, signal);
    w.u64(Tag.FinishedNs, proc.exit.finishedNs).u64(Tag.StdoutBytes, proc.stdout).u64(Tag.StderrBytes, proc.stderr).u64(Tag.OutputTotal, proc.total);
    this.send(MessageType.ProcExit, w.finish());
  }

  private send(type: number, payload: Buffer): void {
    if (!this.connected) return;
    const frame: Frame = { type, flags: 0, id: 0, payload };
    this.emit('event', frame);
  }
}
