/**
 * Background processes on real microVMs: through the engine, and over REST (streamed stdin, SSE
 * output). Each test creates its own sandbox; the leak check runs at the end. Resumes here spawn
 * their VMM (resumeOnReceivers off) while the RAM image is copied to tmpfs: this file covers that
 * path, lifecycle.test.ts the default one on VMMs spawned ahead.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Engine } from '../../src/sandboxes/engine.ts';
import type { ProcessEvent, ProcessInfo } from '../../src/sandboxes/types.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, createKey, type Served } from './fixture.ts';

const tenant = { tenant: 'it-processes' };
let engine: Engine;
let home: string;
let api: Served;
let baseUrl: string;
let key: string;

before(async () => {
  home = testHome('processes');
  engine = await openEngine(home, { resumeOnReceivers: false });
  api = await serveEngine(engine);
  baseUrl = await api.app.listen({ host: '127.0.0.1', port: 0 });
  key = await createKey(home, tenant.tenant, 'pro');
});

after(async () => {
  await api?.close();
  await assertNoLeaks(engine, home);
});

/** Collects a process's output events (from the given offset) until told to stop. */
async function collect(id: string, pid: number, from: 'start' | 'now' | number = 'start', eng: Engine = engine) {
  const events: ProcessEvent[] = [];
  const stop = await eng.watchProcessOutput(id, pid, from, (e) => events.push(e), tenant);
  const text = () => Buffer.concat(events.flatMap((e) => (e.type === 'output' ? [e.data] : []))).toString();
  const until = async (re: RegExp, timeoutMs = 60_000) => {
    const deadline = Date.now() + timeoutMs;
    while (!re.test(text())) {
      if (Date.now() > deadline) {
        // What the guest runs then, to tell a stuck process from lost output.
        const ps = await eng.exec(id, { command: 'ps -o pid,ppid,stat,args; cat /proc/uptime' }, tenant).then((r) => r.stdout, (e) => String(e));
        throw new Error(`no ${re} in ${JSON.stringify(text())}; host: ${JSON.stringify(await eng.getProcess(id, pid, tenant))}; guest:\n${ps}`);
      }
      await sleep(50);
    }
    return text();
  };
  return { events, stop, text, until };
}

test('a background process takes streamed stdin, runs beside an exec, and dies by a signal', async () => {
  const s = await engine.create({ template: 'base' }, tenant);
  const p = await engine.startProcess(s.id, { command: 'while read line; do echo "got:$line"; done', stdin: true, tag: 'reader' }, tenant);
  assert.equal(p.status, 'running');
  assert.equal(p.tag, 'reader');
  const out = await collect(s.id, p.pid);

  // Over REST: the body is sent in pieces with pauses between them; each line comes back as it goes in.
  let push!: (chunk: string | null) => void;
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      push = (chunk) => (chunk === null ? controller.close() : controller.enqueue(new TextEncoder().encode(chunk)));
    },
  });
  const posted = fetch(`${baseUrl}/v1/sandboxes/${s.id}/processes/${p.pid}/stdin`, {
    method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/octet-stream' }, body, duplex: 'half',
  } as RequestInit);
  push('one\n');
  await out.until(/got:one\n/);
  push('tw');
  await sleep(300);
  push('o\n');
  await out.until(/got:two\n/);
  push(null);
  const r = await posted;
  assert.equal(r.status, 200, await r.clone().text());
  assert.deepEqual(await r.json(), { pid: p.pid, written: 8 });

  // An exec runs (and finishes) while the process keeps running; the process takes input meanwhile.
  const exec = engine.exec(s.id, { command: 'sleep 2; echo exec-done' }, tenant);
  await sleep(500);
  await engine.writeProcessStdin(s.id, p.pid, Buffer.from('during-exec\n'), tenant);
  await out.until(/got:during-exec\n/, 10_000);
  assert.equal((await exec).stdout, 'exec-done\n');
  assert.ok(out.text().indexOf('got:during-exec') >= 0, 'input reached the process while the exec ran');

  await engine.signalProcess(s.id, p.pid, 'SIGTERM', tenant);
  const done = await engine.waitProcess(s.id, p.pid, 60, tenant);
  assert.equal(done.status, 'exited');
  assert.equal(done.signal, 15);
  assert.equal(done.exit_code, 143);
  assert.equal(out.events.at(-1)?.type, 'exit');
  await assert.rejects(engine.writeProcessStdin(s.id, p.pid, Buffer.from('x\n'), tenant), (e: { code?: string }) => e.code === 'process_exited');
  await assert.rejects(engine.getProcess(s.id, 99999, tenant), (e: { code?: string }) => e.code === 'process_not_found');
  await engine.delete(s.id, tenant);
});

test('a shell on a pseudo-terminal is typed into, read, and resized; its output can be read again from the start over SSE', async () => {
  const s = await engine.create({ template: 'base' }, tenant);
  // A line-reading shell loop: the terminal is in canonical mode (echo, ^D is end of input). An
  // interactive BusyBox ash would put it in raw mode and query the cursor position (ESC [6n),
  // waiting for the answer a terminal emulator gives, which a test typing blind does not.
  const p = await engine.startProcess(s.id, { argv: ['/bin/sh', '-c', 'while IFS= read -r line; do eval "$line"; done'], pty: { cols: 100, rows: 30 } }, tenant);
  assert.equal(p.pty, true);
  const out = await collect(s.id, p.pid);
  await engine.writeProcessStdin(s.id, p.pid, Buffer.from('echo "answer=$((6*7))"; stty size; tty\n'), tenant);
  const seen = await out.until(/\/dev\/pts\/\d+/);
  assert.match(seen, /answer=42/);
  assert.match(seen, /30 100/);
  await engine.resizeProcess(s.id, p.pid, 132, 50, tenant);
  await engine.writeProcessStdin(s.id, p.pid, Buffer.from('stty size\n'), tenant);
  await out.until(/50 132/);
  assert.ok(out.events.every((e) => e.type !== 'output' || e.stream === 'pty'));
  out.stop();

  // Reattach over REST from the start: the same bytes again, then live output.
  const ctl = new AbortController();
  const sse = await fetch(`${baseUrl}/v1/sandboxes/${s.id}/processes/${p.pid}/output?from=start`, { headers: { authorization: `Bearer ${key}` }, signal: ctl.signal });
  assert.equal(sse.status, 200);
  assert.match(sse.headers.get('content-type') ?? '', /text\/event-stream/);
  const reader = sse.body!.getReader();
  let raw = '';
  const replayed = () => Buffer.concat([...raw.matchAll(/event: pty\ndata: (.*)\n/g)].map((m) => Buffer.from(JSON.parse(m[1]).data, 'base64'))).toString();
  const readUntil = async (re: RegExp) => {
    const deadline = Date.now() + 30_000;
    while (!re.test(replayed())) {
      if (Date.now() > deadline) throw new Error(`SSE: no ${re} in ${JSON.stringify(raw.slice(0, 2000))}`);
      const { value, done } = await reader.read();
      if (done) break;
      raw += new TextDecoder().decode(value);
    }
  };
  await readUntil(/50 132/);
  assert.ok(replayed().startsWith(out.text().slice(0, 20)), 'the replay starts at the process\'s first output');
  assert.match(raw, /"offset":0[,}]/);
  // The terminal echoes what is typed: wait for what only the shell's answer contains.
  await engine.writeProcessStdin(s.id, p.pid, Buffer.from('echo "live-$((2+3))"\n'), tenant);
  await readUntil(/live-5\r?\n/);
  // End of input on a terminal: the shell exits.
  await engine.closeProcessStdin(s.id, p.pid, tenant);
  const exited = await engine.waitProcess(s.id, p.pid, 60, tenant);
  const why = exited.status === 'running' ? (await engine.exec(s.id, { command: 'ps -eo pid,pgid,sid,stat,wchan:20,tty,args; cat /proc/' + p.pid + '/status | head -12' }, tenant)).stdout : '';
  assert.equal(exited.exit_code, 0, `${JSON.stringify(exited)}\n${why}\n${JSON.stringify(out.text())}`);
  await readUntil(/$^/).catch(() => {});
  assert.match(raw, /event: exit\n/);
  ctl.abort();
  await engine.delete(s.id, tenant);
});

test('a process survives suspend and resume with its output, and runs on in a fork child', async () => {
  const s = await engine.create({ template: 'base' }, tenant);
  const p = await engine.startProcess(s.id, { command: '(i=0; while :; do i=$((i+1)); echo "tick $i"; sleep 0.3; done) & while read line; do echo "in:$line"; done', stdin: true, tag: 'ticker' }, tenant);
  const before = await collect(s.id, p.pid);
  await before.until(/tick 3\n/);
  before.stop();

  await engine.suspend(s.id, tenant);
  // Listed while suspended, as it was.
  const whileSuspended = (await engine.listProcesses(s.id, tenant)).find((x) => x.pid === p.pid);
  assert.equal(whileSuspended?.status, 'running');
  const phases: Array<Record<string, number>> = [];
  const onPhases = (r: { op: string; phases: Record<string, number> }) => { if (r.op === 'resume') phases.push(r.phases); };
  engine.on('phases', onPhases);
  await engine.resume(s.id, tenant);
  engine.off('phases', onPhases);
  assert.ok(phases[0].spawn !== undefined && phases[0].memory_load !== undefined, `the resume spawned its VMM and copied the image: ${JSON.stringify(phases[0])}`);

  const after = await collect(s.id, p.pid, 'start');
  await engine.writeProcessStdin(s.id, p.pid, Buffer.from('after-resume\n'), tenant);
  await after.until(/in:after-resume\n/);
  assert.match(after.text(), /^tick 1\ntick 2\ntick 3\n/, 'output from before the suspend is still there, from the start');
  const info: ProcessInfo = await engine.getProcess(s.id, p.pid, tenant);
  assert.equal(info.status, 'running');
  assert.ok(info.output_bytes >= after.text().length);
  after.stop();

  const [child] = await engine.fork(s.id, { count: 1 }, tenant);
  const listed = (await engine.listProcesses(child.id, tenant)).find((x) => x.pid === p.pid);
  assert.equal(listed?.status, 'running', 'the fork child has the process');
  assert.equal(listed?.tag, 'ticker');
  const inChild = await collect(child.id, p.pid, 'now');
  await engine.writeProcessStdin(child.id, p.pid, Buffer.from('to-child\n'), tenant);
  await inChild.until(/in:to-child\n/);
  const inParent = await collect(s.id, p.pid, 'now');
  await sleep(1000);
  assert.ok(!inParent.text().includes('to-child'), 'input to the child\'s copy does not reach the parent\'s');
  inChild.stop();
  inParent.stop();
  // An exec in the child sees the same pid running.
  const ps = await engine.exec(child.id, { command: `kill -0 ${p.pid} && echo alive` }, tenant);
  assert.equal(ps.stdout, 'alive\n');
  await engine.signalProcess(child.id, p.pid, 'KILL', tenant);
  assert.equal((await engine.waitProcess(child.id, p.pid, 60, tenant)).signal, 9);
  assert.equal((await engine.getProcess(s.id, p.pid, tenant)).status, 'running', 'the parent\'s copy runs on');
  await engine.delete(child.id, tenant);
  await engine.delete(s.id, tenant);
});

test('a live background process keeps a sandbox from the idle pause; once it is gone the sandbox pauses, and a start wakes it', async () => {
  const idleHome = testHome('processes-idle');
  const idle = await openEngine(idleHome, { idlePauseSecs: 2 });
  try {
    const s = await idle.create({ template: 'base' }, tenant);
    const p = await idle.startProcess(s.id, { command: 'sleep 1000' }, tenant);
    await sleep(6000);
    assert.equal(idle.isIdlePaused(s.id), false, 'its process counts as activity');
    await idle.signalProcess(s.id, p.pid, 'KILL', tenant);
    assert.equal((await idle.waitProcess(s.id, p.pid, 60, tenant)).signal, 9);
    const deadline = Date.now() + 30_000;
    while (!idle.isIdlePaused(s.id)) {
      assert.ok(Date.now() < deadline, 'paused once nothing of its own runs');
      await sleep(200);
    }
    const woke = await idle.startProcess(s.id, { command: 'echo "woke $((40+2))"; sleep 1000' }, tenant);
    assert.equal(idle.isIdlePaused(s.id), false);
    const out = await collect(s.id, woke.pid, 'start', idle);
    await out.until(/woke 42\n/, 30_000);
    out.stop();
    await idle.delete(s.id, tenant);
  } finally {
    await assertNoLeaks(idle, idleHome);
  }
});

test('a server that restarts adopts the VM and learns its processes from the guest: counters kept, a gap for the output it never held', async () => {
  const restartHome = testHome('processes-restart');
  let first: Engine | undefined = await openEngine(restartHome, { poolSize: 1 });
  let second: Engine | undefined;
  try {
    const s = await first.create({ template: 'base' }, tenant);
    const p = await first.startProcess(s.id, { command: 'i=0; while :; do i=$((i+1)); echo "n $i"; sleep 0.2; done', tag: 'survivor' }, tenant);
    const before = await collect(s.id, p.pid, 'start', first);
    await before.until(/n 3\n/);
    before.stop();
    await first.close(); // its VMMs run on for the next server
    first = undefined;
    await sleep(1000);
    second = await openEngine(restartHome, { poolSize: 1 });
    const listed = (await second.listProcesses(s.id, tenant)).find((x) => x.pid === p.pid);
    assert.equal(listed?.status, 'running');
    assert.equal(listed?.tag, 'survivor');
    assert.ok(listed!.output_bytes >= before.text().length, 'its byte count comes from the guest');
    assert.ok(listed!.buffered.from >= before.text().length, 'nothing from before the restart is held');
    const after = await collect(s.id, p.pid, 'start', second);
    await after.until(/n \d+\n/, 30_000);
    const [gap, firstOut] = after.events;
    assert.ok(gap.type === 'gap' && gap.from === 0, 'what the new server never saw is a gap from the start');
    assert.ok(firstOut.type === 'output' && firstOut.offset === gap.to && gap.to >= before.text().length, 'then output at the guest\'s offsets');
    after.stop();
    await second.signalProcess(s.id, p.pid, 'TERM', tenant);
    assert.equal((await second.waitProcess(s.id, p.pid, 60, tenant)).signal, 15);
    await second.delete(s.id, tenant);
  } finally {
    // A failure before the restart leaves the first server holding the sandbox: it deletes it
    // (closing it alone would leave its VMM running for a next server that never comes).
    if (first) await assertNoLeaks(first, restartHome);
    if (second) await assertNoLeaks(second, restartHome);
  }
});

test('a background process and a PTY are unseeded, with ASLR as the host sets it (off under TCG), unless started with a seed; an exec is always seeded', async () => {
  const s = await engine.create({ template: 'base' }, tenant);
  try {
    // personality 0x0040000 is ADDR_NO_RANDOMIZE; COLLIMATE_SEED is set only in seeded process trees.
    const probe = 'echo "persona=$(cat /proc/self/personality) seed=${COLLIMATE_SEED:-none}"';
    const run = async (extra: { seed?: string; pty?: { cols: number; rows: number } }) => {
      const p = await engine.startProcess(s.id, { command: probe, ...extra }, tenant);
      const out = await collect(s.id, p.pid);
      const text = await out.until(/persona=\S+ seed=\S+/);
      out.stop();
      return /persona=(\S+) seed=(\S+)/.exec(text)!.slice(1);
    };
    // COLLIMATE_GUEST_ASLR=auto: on under KVM, off under TCG (config.ts unseededAslr).
    assert.equal(engine.cfg.unseededAslr, engine.accel === 'kvm');
    const unseeded = engine.cfg.unseededAslr ? '00000000' : '00040000';
    assert.deepEqual(await run({}), [unseeded, 'none'], `a background process: not seeded, ASLR ${engine.cfg.unseededAslr ? 'on' : 'off'}`);
    assert.deepEqual(await run({ pty: { cols: 80, rows: 24 } }), [unseeded, 'none'], `a PTY: not seeded, ASLR ${engine.cfg.unseededAslr ? 'on' : 'off'}`);
    assert.deepEqual(await run({ seed: '42' }), ['00040000', '42'], 'asked for: seeded and replayable');
    const exec = await engine.exec(s.id, { command: probe }, tenant);
    assert.match(exec.stdout, new RegExp(`persona=00040000 seed=${exec.seed}`), 'an exec reports the seed it ran with');
  } finally {
    await engine.delete(s.id, tenant);
  }
});
