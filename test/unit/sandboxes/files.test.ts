/**
 * The engine's file operations (src/sandboxes/files.ts) over a real test-mode agent standing in for
 * a sandbox's guest: scoping and states, error codes, the idle pause's wake-up and hold-off, watches
 * ending with the reason their sandbox went, and streamed transfers.
 */
import { test, before, after, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { CollimateError } from '../../../src/errors.ts';
import { buildAgent } from '../../../src/guest/agentBuild.ts';
import { AgentClient } from '../../../src/guest/agentClient.ts';
import type { EngineContext } from '../../../src/sandboxes/context.ts';
import { downloadFile, fsList, fsMkdir, fsRemove, fsRename, fsStat, fsWatch, uploadFile } from '../../../src/sandboxes/files.ts';
import { SandboxRegistry, type Running } from '../../../src/sandboxes/registry.ts';
import type { SandboxRow } from '../../../src/sandboxes/repo.ts';
import type { LiveVm } from '../../../src/sandboxes/runtime.ts';
import type { FileChange, WatchEndReason } from '../../../src/sandboxes/types.ts';
import { row } from '../../support/sandboxRows.ts';

const ID = 'sbx_0123456789ab';
const scope = { tenant: 't1' };
let workDir: string;
let guest: string;
let socketPath: string;
let agentProcess: ChildProcess;

// Per test: a row, a registry whose wake-up is counted, and a Running over a fresh agent link.
let rowState: SandboxRow;
let registry: SandboxRegistry;
let running: Running;
let woken: number;
let closing: boolean;
let ctx: EngineContext;

async function connect(): Promise<AgentClient> {
  for (let i = 0; ; i++) {
    try {
      const socket = net.createConnection(socketPath);
      await once(socket, 'connect');
      return new AgentClient(socket);
    } catch (e) {
      if (i > 200) throw e;
      await sleep(20);
    }
  }
}

async function rejectsWith(p: Promise<unknown>, code: string, message?: RegExp): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof CollimateError, `expected a CollimateError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    if (message) assert.match(e.message, message);
    return true;
  });
}

before(async () => {
  workDir = mkdtempSync(join(tmpdir(), 'collimate-engine-files-'));
  guest = join(workDir, 'guest');
  mkdirSync(guest);
  socketPath = join(workDir, 'agent.sock');
  agentProcess = spawn(await buildAgent(join(workDir, 'bin')), ['--serve-socket', socketPath, '--home', guest], { stdio: ['ignore', 'inherit', 'inherit'] });
  (await connect()).close();
});
after(() => {
  agentProcess?.kill('SIGKILL');
  rmSync(workDir, { recursive: true, force: true });
});

beforeEach(async () => {
  rowState = row(ID);
  woken = 0;
  closing = false;
  registry = new SandboxRegistry({ addActivity: () => {} }, async (r) => {
    if (!r.paused) return;
    woken++;
    r.paused = undefined;
  });
  running = registry.add(ID, { agent: await connect() } as unknown as LiveVm);
  ctx = {
    repo: { get: (id: string) => (id === ID ? rowState : undefined) },
    registry,
    assertOpen: () => {},
    isClosing: () => closing,
  } as unknown as EngineContext;
});
afterEach(async () => {
  running.live.agent.close();
  await sleep(30); // the agent serves one connection at a time
});

test('directory operations through the engine: entries, tenant scoping, states and the guest\'s error codes', async () => {
  const dir = join(guest, 'ops');
  const made = await fsMkdir(ctx, ID, dir, { mode: 0o750 }, scope);
  assert.equal(made.created, true);
  assert.equal(made.entry.mode, 0o750);
  writeFileSync(join(dir, 'f.txt'), 'abc');
  const entry = await fsStat(ctx, ID, join(dir, 'f.txt'), scope);
  assert.equal(entry.size, 3);
  assert.equal(typeof entry.mtimeNs, 'bigint');
  assert.equal((await fsStat(ctx, ID, 'ops/f.txt', scope)).path, join(dir, 'f.txt'), 'relative to the guest\'s home');
  assert.deepEqual((await fsList(ctx, ID, dir, 1, scope)).entries.map((e) => e.name), ['f.txt']);
  assert.equal((await fsRename(ctx, ID, join(dir, 'f.txt'), join(dir, 'g.txt'), scope)).name, 'g.txt');

  await rejectsWith(fsMkdir(ctx, ID, join(dir, 'g.txt'), {}, scope), 'file_exists');
  await rejectsWith(fsList(ctx, ID, join(dir, 'g.txt'), 1, scope), 'not_a_directory');
  await rejectsWith(fsStat(ctx, ID, join(dir, 'missing'), scope), 'file_not_found', /missing/);
  await rejectsWith(fsRemove(ctx, ID, '/', scope), 'validation_error');
  await rejectsWith(fsStat(ctx, ID, 'a\0b', scope), 'validation_error');
  await rejectsWith(fsStat(ctx, ID, '', scope), 'validation_error');
  await rejectsWith(fsList(ctx, ID, dir, 0, scope), 'validation_error');
  await rejectsWith(fsMkdir(ctx, ID, dir, { mode: 0o17777 }, scope), 'validation_error');
  await rejectsWith(fsStat(ctx, ID, dir, { tenant: 'someone-else' }), 'sandbox_not_found');
  assert.deepEqual(await fsRemove(ctx, ID, dir, scope), { removed: 2 });
  assert.equal(existsSync(dir), false);

  rowState = { ...rowState, state: 'suspended' };
  await rejectsWith(fsStat(ctx, ID, guest, scope), 'invalid_state');
});

test('a sandbox paused for being idle is woken first; one being paused waits its turn; requests under way hold the pause off', async () => {
  running.paused = { at: Date.now() };
  assert.equal((await fsStat(ctx, ID, guest, scope)).type, 'dir');
  assert.equal(woken, 1);
  assert.equal(running.paused, undefined);

  // `pausing`: the request goes through the queue (whose gate wakes the sandbox once it is paused).
  running.pausing = true;
  let releasePause!: () => void;
  const pause = running.queue.run(() => new Promise<void>((resolve) => (releasePause = resolve)).then(() => {
    running.pausing = undefined;
    running.paused = { at: Date.now() };
  }));
  let answered = false;
  const stat = fsStat(ctx, ID, guest, scope).then(() => (answered = true));
  await sleep(100);
  assert.equal(answered, false, 'nothing is sent to a guest being stopped');
  releasePause();
  await Promise.all([pause, stat]);
  assert.equal(woken, 2);

  // While a request is under way the idle pause sees it (quiesce.ts checks `besides`).
  const pending = fsList(ctx, ID, guest, 1, scope);
  assert.equal(running.besides, 1);
  await pending;
  assert.equal(running.besides, 0);
});

test('a watch ends with why its sandbox went: suspended, deleted, lost, the server closing, the directory removed', async () => {
  const dir = join(guest, 'watched');
  mkdirSync(dir, { recursive: true });
  const cases: Array<[WatchEndReason, () => void]> = [
    ['sandbox_suspended', () => { rowState = { ...rowState, state: 'suspended' }; running.live.agent.close(); }],
    ['sandbox_deleted', () => { running.deleting = true; running.live.agent.close(); }],
    ['sandbox_lost', () => { running.lost = 'its VM exited'; running.deleting = true; running.live.agent.close(); }],
    ['shutting_down', () => { closing = true; running.live.agent.close(); }],
    ['agent_disconnected', () => running.live.agent.close()],
    ['directory_removed', () => rmSync(dir, { recursive: true })],
  ];
  for (const [reason, end] of cases) {
    mkdirSync(dir, { recursive: true });
    rowState = row(ID);
    closing = false;
    running.live.agent.close();
    await sleep(30);
    running = registry.add(ID, { agent: await connect() } as unknown as LiveVm);
    const changes: FileChange[] = [];
    const ends: WatchEndReason[] = [];
    await fsWatch(ctx, ID, dir, false, { onChange: (c) => changes.push(c), onEnd: (r) => ends.push(r) }, scope);
    writeFileSync(join(dir, reason), '1');
    for (let i = 0; i < 100 && !changes.some((c) => c.name === reason); i++) await sleep(10);
    assert.ok(changes.some((c) => c.op === 'create' && c.name === reason), `${reason}: ${JSON.stringify(changes)}`);
    end();
    for (let i = 0; i < 200 && ends.length === 0; i++) await sleep(10);
    assert.deepEqual(ends, [reason]);
  }

  // close() stops it: nothing more is delivered, and the agent has forgotten it.
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir);
  const changes: FileChange[] = [];
  const ends: WatchEndReason[] = [];
  const w = await fsWatch(ctx, ID, dir, false, { onChange: (c) => changes.push(c), onEnd: (r) => ends.push(r) }, scope);
  await w.close();
  writeFileSync(join(dir, 'after'), '1');
  running.live.agent.close();
  await sleep(100);
  assert.deepEqual([changes, ends], [[], []]);
});

test('streamed transfers through the engine: limits and aborted sources leave nothing; downloads map the guest\'s errors', async () => {
  const dir = join(guest, 'transfers');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'target'), 'old');
  const written = await uploadFile(ctx, ID, join(dir, 'target'), Readable.from([Buffer.alloc(700 * 1024, 1), Buffer.alloc(10, 2)]), { mode: 0o640 }, scope);
  assert.equal(written.bytes, 700 * 1024 + 10);
  assert.equal(written.mode, 0o640);
  assert.equal(readFileSync(join(dir, 'target')).length, 700 * 1024 + 10);

  await rejectsWith(uploadFile(ctx, ID, join(dir, 'target'), Readable.from([Buffer.alloc(600 * 1024), Buffer.alloc(600 * 1024)]), { maxBytes: 1024 * 1024 }, scope), 'payload_too_large');
  async function* broken() {
    yield Buffer.alloc(600 * 1024);
    throw new Error('aborted');
  }
  await rejectsWith(uploadFile(ctx, ID, join(dir, 'target'), broken(), {}, scope), 'validation_error', /did not arrive whole/);
  await rejectsWith(uploadFile(ctx, ID, dir, Readable.from([Buffer.from('x')]), {}, scope), 'is_a_directory');
  assert.deepEqual(readdirSync(dir), ['target'], 'no temporary file is left');
  assert.equal(readFileSync(join(dir, 'target')).length, 700 * 1024 + 10, 'the target is untouched');

  const chunks: Buffer[] = [];
  assert.deepEqual(await downloadFile(ctx, ID, join(dir, 'target'), { chunk: (c) => void chunks.push(c) }, scope), { size: 700 * 1024 + 10 });
  assert.equal(Buffer.concat(chunks).length, 700 * 1024 + 10);
  await rejectsWith(downloadFile(ctx, ID, join(dir, 'none'), { chunk: () => {} }, scope), 'file_not_found');
  await rejectsWith(downloadFile(ctx, ID, join(dir, 'target'), { chunk: () => {} }, scope, 1000), 'payload_too_large');
  await rejectsWith(downloadFile(ctx, ID, dir, { chunk: () => {} }, scope), 'validation_error', /not a regular file/);
});
