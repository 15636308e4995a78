/**
 * An EnvdBackend on the host, for unit tests of the E2B envd translation: processes are real host
 * processes (no PTY), files live under a temporary directory that stands for the guest's `/`
 * (relative paths under its /root). The real backend (the guest agent through the tenant service)
 * is tested by test/integration/e2b.test.ts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createReadStream, createWriteStream, existsSync, lstatSync, mkdirSync, readdirSync, readlinkSync, renameSync, rmSync, watch, type FSWatcher } from 'node:fs';
import { basename, join, posix } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Readable } from 'node:stream';
import { CollimateError } from '../../src/errors.js';
import type { EnvdBackend, FsEntry, ProcessExit, ProcessSpec, ProcessWatcher, WriteOptions } from '../../src/e2b/envd.js';

interface Proc {
  pid: number;
  spec: ProcessSpec;
  child: ChildProcess;
  output: Array<['stdout' | 'stderr', Buffer]>;
  exit?: ProcessExit;
  watchers: Set<ProcessWatcher>;
}

export class HostEnvdBackend implements EnvdBackend {
  readonly procs = new Map<number, Proc>();
  /** Paths the backend was asked to stat (tests check the bash probe). */
  readonly stats: string[] = [];
  /** The account each mkdir and write was asked to run as (none: root), by guest path. */
  readonly accounts: Array<{ op: 'mkdir' | 'write'; path: string; user?: string }> = [];
  /** E2B metadata by guest path (the guest keeps it in the file's extended attributes). */
  private readonly metadata = new Map<string, Record<string, string>>();

  constructor(readonly root: string) {
    mkdirSync(join(root, 'root'), { recursive: true });
  }

  private guestPath(path: string): string {
    return posix.resolve('/root', path);
  }

  private hostPath(path: string): string {
    return join(this.root, this.guestPath(path));
  }

  private entry(path: string): FsEntry {
    const guest = this.guestPath(path);
    let st;
    try {
      st = lstatSync(this.hostPath(path));
    } catch {
      throw new CollimateError('file_not_found' as never, `No file ${guest} in the sandbox.`);
    }
    const type = st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : st.isFile() ? 'file' : 'other';
    return {
      name: basename(guest),
      path: guest,
      type,
      size: st.size,
      mode: st.mode & 0o7777,
      owner: 'root',
      group: 'root',
      mtimeMs: st.mtimeMs,
      ...(type === 'symlink' ? { symlinkTarget: readlinkSync(this.hostPath(path)) } : {}),
      ...(this.metadata.has(guest) ? { metadata: this.metadata.get(guest) } : {}),
    };
  }

  private proc(pid: number): Proc {
    const p = this.procs.get(pid);
    if (!p) throw new CollimateError('process_not_found' as never, `No process ${pid} in the sandbox.`);
    return p;
  }

  async startProcess(_scope: unknown, _id: string, spec: ProcessSpec): Promise<{ pid: number }> {
    const child = spawn(spec.argv[0], spec.argv.slice(1), {
      cwd: spec.cwd ? this.hostPath(spec.cwd) : join(this.root, 'root'),
      env: { PATH: process.env.PATH, ...spec.env },
      stdio: [spec.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
    });
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
    const p: Proc = { pid: child.pid!, spec, child, output: [], watchers: new Set() };
    this.procs.set(p.pid, p);
    const emit = (kind: 'stdout' | 'stderr') => (data: Buffer) => {
      p.output.push([kind, data]);
      for (const w of p.watchers) w.onOutput(kind, data);
    };
    child.stdout!.on('data', emit('stdout'));
    child.stderr!.on('data', emit('stderr'));
    child.once('close', (code, signal) => {
      const signals: Record<string, number> = { SIGKILL: 9, SIGTERM: 15, SIGINT: 2 };
      p.exit = signal ? { exitCode: 128 + (signals[signal] ?? 0), signal: signals[signal] ?? 0 } : { exitCode: code ?? 0 };
      for (const w of p.watchers) w.onExit(p.exit);
      p.watchers.clear();
    });
    return { pid: p.pid };
  }

  async attachProcess(_scope: unknown, _id: string, pid: number, fromStart: boolean, watcher: ProcessWatcher): Promise<() => void> {
    const p = this.proc(pid);
    if (fromStart) for (const [kind, data] of p.output) watcher.onOutput(kind, data);
    if (p.exit) {
      watcher.onExit(p.exit);
      return () => {};
    }
    p.watchers.add(watcher);
    return () => p.watchers.delete(watcher);
  }

  async listProcesses() {
    return [...this.procs.values()].filter((p) => !p.exit).map((p) => ({ pid: p.pid, argv: p.spec.argv, env: p.spec.env, cwd: p.spec.cwd, tag: p.spec.tag }));
  }

  async sendInput(_s: unknown, _id: string, pid: number, data: Buffer): Promise<void> {
    const p = this.proc(pid);
    if (!p.child.stdin) throw new CollimateError('validation_error', `Process ${pid} was started without stdin.`);
    p.child.stdin.write(data);
  }

  async closeStdin(_s: unknown, _id: string, pid: number): Promise<void> {
    this.proc(pid).child.stdin?.end();
  }

  async signalProcess(_s: unknown, _id: string, pid: number, signal: 'SIGTERM' | 'SIGKILL'): Promise<void> {
    this.proc(pid).child.kill(signal);
  }

  async resizeProcess(): Promise<void> {}

  async stat(_s: unknown, _id: string, path: string): Promise<FsEntry> {
    this.stats.push(path);
    return this.entry(path);
  }

  async listDir(_s: unknown, _id: string, path: string, depth: number): Promise<FsEntry[]> {
    const dir = this.entry(path);
    if (dir.type !== 'dir') throw new CollimateError('validation_error', `${dir.path} is not a directory.`);
    const out: FsEntry[] = [];
    const walk = (guest: string, level: number) => {
      for (const name of readdirSync(join(this.root, guest)).sort()) {
        const e = this.entry(posix.join(guest, name));
        out.push(e);
        if (e.type === 'dir' && level < depth) walk(e.path, level + 1);
      }
    };
    walk(dir.path, 1);
    return out;
  }

  async makeDir(_s: unknown, _id: string, path: string, user?: string) {
    this.accounts.push({ op: 'mkdir', path: this.guestPath(path), ...(user ? { user } : {}) });
    const existed = existsSync(this.hostPath(path));
    mkdirSync(this.hostPath(path), { recursive: true });
    return { created: !existed, entry: this.entry(path) };
  }

  async move(_s: unknown, _id: string, from: string, to: string): Promise<FsEntry> {
    this.entry(from);
    renameSync(this.hostPath(from), this.hostPath(to));
    return this.entry(to);
  }

  async remove(_s: unknown, _id: string, path: string): Promise<void> {
    this.entry(path);
    rmSync(this.hostPath(path), { recursive: true, force: true });
  }

  async watchDir(_s: unknown, _id: string, path: string, recursive: boolean, onEvent: (e: { name: string; type: 'create' | 'write' | 'remove' | 'rename' | 'chmod' }) => void): Promise<() => void> {
    this.entry(path);
    const w: FSWatcher = watch(this.hostPath(path), { recursive }, (kind, name) => {
      if (!name) return;
      const exists = existsSync(join(this.hostPath(path), name));
      onEvent({ name, type: kind === 'rename' ? (exists ? 'create' : 'remove') : 'write' });
    });
    return () => w.close();
  }

  async readFile(_s: unknown, _id: string, path: string, sink: { start?(info: { size: number }): void | Promise<void>; chunk(data: Buffer): void | Promise<void> }): Promise<void> {
    const e = this.entry(path);
    if (e.type !== 'file') throw new CollimateError('validation_error', `${e.path} is not a file.`);
    await sink.start?.({ size: e.size });
    for await (const chunk of createReadStream(this.hostPath(path))) await sink.chunk(chunk as Buffer);
  }

  async writeFile(_s: unknown, _id: string, path: string, data: AsyncIterable<Buffer>, opts: WriteOptions = {}): Promise<FsEntry> {
    this.accounts.push({ op: 'write', path: this.guestPath(path), ...(opts.user ? { user: opts.user } : {}) });
    // As the guest's user.e2b.* attributes: a write replaces the file, and its metadata with it.
    if (opts.metadata) this.metadata.set(this.guestPath(path), opts.metadata);
    else this.metadata.delete(this.guestPath(path));
    const target = this.hostPath(path);
    mkdirSync(join(target, '..'), { recursive: true });
    const tmp = `${target}.upload-${process.pid}`;
    await pipeline(Readable.from(data), createWriteStream(tmp));
    renameSync(tmp, target);
    return this.entry(path);
  }

  close(): void {
    for (const p of this.procs.values()) if (!p.exit) p.child.kill('SIGKILL');
  }
}
