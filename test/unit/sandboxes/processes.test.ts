/**
 * The host's record of background processes (src/sandboxes/processes.ts) and the engine's process
 * operations (processOps.ts: what queues and what does not), over a fake agent.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { ExecQueue } from '../../../src/sandboxes/execQueue.js';
import { OutputBuffer, ProcessRegistry, SandboxProcesses, type ProcessEvent } from '../../../src/sandboxes/processes.js';
import { buildProcStart, closeProcessStdin, signalNumber, signalProcess, startProcess, waitProcess, writeProcessStdin } from '../../../src/sandboxes/processOps.js';
import type { EngineContext } from '../../../src/sandboxes/context.js';
import type { Running } from '../../../src/sandboxes/registry.js';
import { FakeProcessAgent } from '../../support/fakeProcessAgent.js';

const tick = () => new Promise((r) => setImmediate(r));

describe('OutputBuffer', () => {
  test('keeps the last bytes up to its cap, with offsets; skips duplicates; knows of bytes it never saw', () => {
    const b = new OutputBuffer(10);
    b.append({ stream: 'stdout', offset: 0, data: Buffer.from('abcdef') });
    b.append({ stream: 'stderr', offset: 6, data: Buffer.from('ghijkl') });
    assert.equal(b.bytes, 10);
    assert.equal(b.start, 2);
    assert.equal(b.end, 12);
    assert.deepEqual(b.since(0).map((c) => [c.stream, c.offset, c.data.toString()]), [['stdout', 2, 'cdef'], ['stderr', 6, 'ghijkl']]);
    assert.deepEqual(b.since(8).map((c) => [c.offset, c.data.toString()]), [[8, 'ijkl']]);
    // A chunk overlapping what is held only adds its new part.
    assert.equal(b.append({ stream: 'stdout', offset: 10, data: Buffer.from('klmn') })?.data.toString(), 'mn');
    assert.equal(b.append({ stream: 'stdout', offset: 3, data: Buffer.from('x') }), undefined);
    b.advanceTo(20);
    assert.equal(b.end, 20);
    b.append({ stream: 'stdout', offset: 20, data: Buffer.from('z') });
    assert.deepEqual(b.since(0).map((c) => c.offset), [5, 6, 12, 20]);
  });
});

function listen(procs: SandboxProcesses, pid: number, from: 'start' | 'now' | number = 'start') {
  const events: ProcessEvent[] = [];
  const stop = procs.subscribe(pid, from, (e) => events.push(e));
  return { events, stop, kinds: () => events.map((e) => e.type) };
}

describe('SandboxProcesses', () => {
  test('records a start, fans out live output and the exit to every subscriber, and replays to late ones', async () => {
    const agent = new FakeProcessAgent();
    const procs = new SandboxProcesses();
    await procs.attach(agent);
    const req = buildProcStart({ argv: ['cat'], stdin: true, tag: 't' });
    const info = procs.started(req, await agent.startProcess(req));
    assert.equal(info.status, 'running');
    const early = listen(procs, info.pid);
    agent.write(info.pid, 1, 'one ');
    agent.write(info.pid, 2, 'two ');
    const late = listen(procs, info.pid, 'start');
    const now = listen(procs, info.pid, 'now');
    agent.write(info.pid, 1, 'three');
    agent.exit(info.pid, 0);
    for (const l of [early, late]) {
      assert.deepEqual(l.kinds(), ['output', 'output', 'output', 'exit']);
      assert.deepEqual(l.events.slice(0, 3).map((e) => e.type === 'output' && [e.stream, e.offset, e.data.toString()]), [['stdout', 0, 'one '], ['stderr', 4, 'two '], ['stdout', 8, 'three']]);
    }
    assert.deepEqual(now.kinds(), ['output', 'exit']);
    const after = procs.get(info.pid)!;
    assert.equal(after.status, 'exited');
    assert.equal(after.exit_code, 0);
    assert.equal(after.stdout_bytes, 9);
    assert.equal(after.stderr_bytes, 4);
    assert.equal(after.output_bytes, 13);
    assert.equal(after.stdin_open, false);
    // Subscribing to an exited process replays and ends.
    assert.deepEqual(listen(procs, info.pid).kinds(), ['output', 'output', 'output', 'exit']);
  });

  test('output that arrives before the start is answered is kept (the reply and events race)', async () => {
    const agent = new FakeProcessAgent();
    const procs = new SandboxProcesses();
    await procs.attach(agent);
    const req = buildProcStart({ command: 'echo hi' });
    const started = await agent.startProcess(req);
    await tick(); // the process printed and exited before the host recorded its start
    const info = procs.started(req, started);
    assert.deepEqual(info.argv, ['/bin/sh', '-c', 'echo hi']);
    assert.equal(info.status, 'exited');
    const l = listen(procs, info.pid);
    assert.equal(l.events[0].type === 'output' && l.events[0].data.toString(), 'hi\n');
  });

  test('a reconnect learns what it missed: exits, output written meanwhile (a gap), processes it never saw start', async () => {
    const agent = new FakeProcessAgent();
    const procs = new SandboxProcesses();
    await procs.attach(agent);
    const req = buildProcStart({ command: 'sleep 100' });
    const a = procs.started(req, await agent.startProcess(req));
    const b = procs.started(req, await agent.startProcess(req));
    agent.write(a.pid, 1, 'before ');
    const sub = listen(procs, a.pid);
    const waiting = procs.wait(b.pid, 10_000);
    // The host goes away (a suspend, say): what happens meanwhile is not heard.
    agent.connected = false;
    agent.write(a.pid, 1, 'while away ');
    agent.exit(b.pid, 7);
    const c = await agent.startProcess(buildProcStart({ argv: ['other'], tag: 'new' }));
    agent.connected = true;
    const again = new FakeProcessAgent();
    Object.assign(again, { procs: (agent as unknown as { procs: unknown }).procs });
    await procs.attach(again);
    assert.equal((await waiting).exit_code, 7);
    assert.equal(procs.get(b.pid)!.status, 'exited');
    assert.equal(procs.get(c.pid)!.tag, 'new');
    assert.equal(procs.get(a.pid)!.output_bytes, 18);
    // Output continues at the guest's offsets; the subscriber sees the gap, not silently missing bytes.
    again.write(a.pid, 1, 'after');
    assert.deepEqual(sub.events.map((e) => (e.type === 'gap' ? ['gap', e.from, e.to] : e.type === 'output' ? ['out', e.offset] : [e.type])), [['out', 0], ['gap', 7, 18], ['out', 18]]);
    // Events of the old connection are no longer listened to.
    agent.write(a.pid, 1, 'stale');
    assert.equal(procs.get(a.pid)!.output_bytes, 23);
  });

  test('a process the guest no longer lists is lost; a fork child starts with a copy of the output', async () => {
    const agent = new FakeProcessAgent();
    const registry = new ProcessRegistry();
    const procs = registry.of('sbx_parent');
    await procs.attach(agent);
    const req = buildProcStart({ command: 'sleep 100' });
    const p = procs.started(req, await agent.startProcess(req));
    agent.write(p.pid, 1, 'from the parent\n');
    registry.beginFork('sbx_parent');
    // The parent runs on while the fork is made: the child must not inherit what it writes now.
    agent.write(p.pid, 1, 'parent only\n');
    registry.inherit('sbx_parent', 'sbx_child');
    registry.endFork('sbx_parent');
    const child = registry.of('sbx_child');
    // The child's guest: the parent's table as of the snapshot, then output of its own.
    const childAgent = new FakeProcessAgent();
    const cp = await childAgent.startProcess(req);
    assert.equal(cp.pid, p.pid);
    type Procs = { procs: Map<number, { startedNs: bigint }> };
    (childAgent as unknown as Procs).procs.get(p.pid)!.startedNs = (agent as unknown as Procs).procs.get(p.pid)!.startedNs;
    childAgent.connected = false;
    childAgent.write(p.pid, 1, 'from the parent\n');
    childAgent.connected = true;
    await child.attach(childAgent);
    childAgent.write(p.pid, 1, 'child only\n');
    const seen = listen(child, p.pid).events.flatMap((e) => (e.type === 'output' ? [e.data.toString()] : []));
    assert.deepEqual(seen, ['from the parent\n', 'child only\n'], 'no byte of what the parent wrote after the fork began');
    // A guest without the process (its table was replaced): lost, with its waiters answered.
    await procs.attach(new FakeProcessAgent());
    assert.equal(procs.get(p.pid)!.status, 'lost');
    assert.equal(child.get(p.pid)!.status, 'running');
    // A deleted sandbox's streams end: its running processes are lost.
    const childSub = listen(child, p.pid, 'now');
    registry.forget('sbx_child');
    assert.deepEqual(childSub.kinds(), ['exit']);
    assert.equal(registry.of('sbx_child').list().length, 0);
  });

  test('a process started while the table is on its way is not lost when the (older) table arrives', async () => {
    const agent = new FakeProcessAgent();
    // The table is taken when asked, and answered only after the start and its first output.
    let answer!: () => void;
    const asked = agent.listProcesses();
    agent.listProcesses = () => new Promise((resolve) => { answer = () => void asked.then(resolve); });
    const procs = new SandboxProcesses();
    const synced = procs.attach(agent);
    const req = buildProcStart({ command: 'sleep 100' });
    const p = procs.started(req, await agent.startProcess(req));
    agent.write(p.pid, 1, 'one\n');
    const sub = listen(procs, p.pid);
    answer();
    await synced;
    agent.write(p.pid, 1, 'two\n');
    assert.equal(procs.get(p.pid)!.status, 'running');
    assert.deepEqual(procs.get(p.pid)!.argv, ['/bin/sh', '-c', 'sleep 100']);
    assert.deepEqual(sub.events.map((e) => e.type === 'output' && e.data.toString()), ['one\n', 'two\n']);
  });

  test("output that arrives before the table, for a process this host never started, takes the table's argv and tag", async () => {
    // As after a server restart: the guest runs a process; the new host hears its output first.
    const guest = new FakeProcessAgent();
    const req = buildProcStart({ command: 'sleep 100', tag: 'survivor' });
    const started = await guest.startProcess(req);
    let answer!: () => void;
    const asked = guest.listProcesses();
    guest.listProcesses = () => new Promise((resolve) => { answer = () => void asked.then(resolve); });
    const procs = new SandboxProcesses();
    const synced = procs.attach(guest);
    guest.write(started.pid, 1, 'tick\n');
    answer();
    await synced;
    const p = procs.get(started.pid)!;
    assert.equal(p.status, 'running');
    assert.equal(p.tag, 'survivor');
    assert.deepEqual(p.argv, ['/bin/sh', '-c', 'sleep 100']);
  });

  test('wait times out with the process still running', async () => {
    const agent = new FakeProcessAgent();
    const procs = new SandboxProcesses();
    await procs.attach(agent);
    const req = buildProcStart({ command: 'sleep 100' });
    const p = procs.started(req, await agent.startProcess(req));
    const t0 = Date.now();
    assert.equal((await procs.wait(p.pid, 50)).status, 'running');
    assert.ok(Date.now() - t0 >= 45);
  });
});

describe('process operations', () => {
  test('signal names and numbers', () => {
    assert.equal(signalNumber('SIGTERM'), 15);
    assert.equal(signalNumber('kill'), 9);
    assert.equal(signalNumber(2), 2);
    assert.throws(() => signalNumber('SIGNOPE'), /signal must be/);
    assert.throws(() => signalNumber(0), /signal must be/);
  });

  test('start validates: exactly one of command and argv, absolute cwd, pty size, tag', () => {
    assert.deepEqual(buildProcStart({ command: 'ls' }).argv, ['/bin/sh', '-c', 'ls']);
    assert.deepEqual(buildProcStart({ argv: ['ls', '-l'], pty: {} }).pty, { cols: 80, rows: 24 });
    assert.equal(buildProcStart({ argv: ['ls'], stdin: true }).stdinOpen, true);
    assert.equal(buildProcStart({ argv: ['ls'] }).seed, undefined, 'unseeded unless asked');
    assert.equal(buildProcStart({ argv: ['ls'], seed: '42' }).seed, 42n);
    assert.equal(buildProcStart({ argv: ['ls'] }).noAslr, undefined, 'unseeded: ASLR as the guest has it');
    assert.equal(buildProcStart({ argv: ['ls'] }, undefined, false).noAslr, true, 'unseeded on a host that turns ASLR off');
    assert.equal(buildProcStart({ argv: ['ls'], seed: '42' }, undefined, false).noAslr, undefined, 'seeded: the seed turns it off');
    const { argv, env, cwd } = buildProcStart({ argv: ['ls'], env: { B: '2' } }, { prefix: ['runuser', '-u', 'app', '--'], env: { A: '1' }, cwd: '/app' });
    assert.deepEqual({ argv, env, cwd }, { argv: ['runuser', '-u', 'app', '--', 'ls'], env: { A: '1', B: '2' }, cwd: '/app' });
    for (const bad of [{}, { command: 'a', argv: ['a'] }, { argv: [] }, { argv: ['ls'], cwd: 'rel' }, { argv: ['ls'], pty: { cols: 0 } }, { argv: ['ls'], tag: 'x'.repeat(257) }]) {
      assert.throws(() => buildProcStart(bad), (e: { code?: string }) => e.code === 'validation_error', JSON.stringify(bad));
    }
  });

  /** An engine context with one running sandbox over a fake agent; its queue's gate wakes it. */
  function harness() {
    const agent = new FakeProcessAgent();
    const registry = new ProcessRegistry();
    const wakes: number[] = [];
    const r = { id: 'sbx_000000000001', deleting: false, live: { agent }, queue: undefined as unknown as ExecQueue } as unknown as Running;
    r.queue = new ExecQueue(async () => { if (r.paused) { wakes.push(Date.now()); r.paused = undefined; } });
    const row = { id: r.id, tenant: 't', template: 'base', state: 'running' };
    const ctx = {
      assertOpen() {},
      repo: { get: (id: string) => (id === r.id ? row : undefined) },
      registry: { get: (id: string) => (id === r.id ? r : undefined), touch() {} },
      templates: { resolve: () => ({}) },
      processes: registry,
      cfg: { unseededAslr: true },
    } as unknown as EngineContext;
    void registry.of(r.id).attach(agent);
    return { ctx, r, agent, registry, wakes };
  }

  test('a start waits its turn behind a running exec; stdin, signal and close-stdin do not', async () => {
    const { ctx, r } = harness();
    const order: string[] = [];
    const first = await startProcess(ctx, r.id, { command: 'sleep 100', stdin: true }, { tenant: 't' });
    // An exec holds the queue for 300 ms.
    const exec = r.queue.run(async () => { await sleep(300); order.push('exec done'); });
    const queuedStart = startProcess(ctx, r.id, { command: 'sleep 100' }, { tenant: 't' }).then((p) => { order.push('second start'); return p; });
    await writeProcessStdin(ctx, r.id, first.pid, Buffer.from('hi\n'), { tenant: 't' });
    order.push('stdin');
    await signalProcess(ctx, r.id, first.pid, 'SIGINT', { tenant: 't' });
    order.push('signal');
    const exited = await waitProcess(ctx, r.id, first.pid, 5, { tenant: 't' });
    order.push('wait');
    assert.equal(exited.signal, 2);
    await exec;
    const second = await queuedStart;
    await closeProcessStdin(ctx, r.id, second.pid, { tenant: 't' }).catch((e) => order.push(e.code));
    assert.deepEqual(order, ['stdin', 'signal', 'wait', 'exec done', 'second start']);
  });

  test('a sandbox paused by the idle pause is woken for process operations', async () => {
    const { ctx, r, wakes } = harness();
    const p = await startProcess(ctx, r.id, { command: 'sleep 100', stdin: true }, { tenant: 't' });
    r.paused = { at: Date.now() };
    await writeProcessStdin(ctx, r.id, p.pid, Buffer.from('x'), { tenant: 't' });
    assert.equal(wakes.length, 1);
    assert.equal(r.paused, undefined);
    r.paused = { at: Date.now() };
    await signalProcess(ctx, r.id, p.pid, 9, { tenant: 't' });
    assert.equal(wakes.length, 2);
  });

  test('unknown pids are process_not_found; exited ones process_exited', async () => {
    const { ctx, r, agent } = harness();
    await assert.rejects(signalProcess(ctx, r.id, 4242, 'TERM', { tenant: 't' }), (e: { code?: string }) => e.code === 'process_not_found');
    const p = await startProcess(ctx, r.id, { command: 'sleep 100' }, { tenant: 't' });
    agent.exit(p.pid, 0);
    await assert.rejects(signalProcess(ctx, r.id, p.pid, 'TERM', { tenant: 't' }), (e: { code?: string }) => e.code === 'process_exited');
    await assert.rejects(writeProcessStdin(ctx, r.id, p.pid, Buffer.from('x'), { tenant: 't' }), (e: { code?: string }) => e.code === 'process_exited');
  });
});
