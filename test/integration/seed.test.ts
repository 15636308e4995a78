/**
 * Seeded execs on real microVMs (docs/determinism.md): the same seed in sandboxes in the same state
 * replays user-space randomness; every result reports its seed; without one the host draws a fresh
 * seed per exec; the kernel CRNG and statically linked programs stay truly random.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import type { Engine } from '../../src/sandboxes/engine.ts';
import type { ExecRequest, ExecResult } from '../../src/sandboxes/types.ts';
import { openEngine, testHome, assertNoLeaks } from './fixture.ts';

const tenant = { tenant: 'it-seed' };
let engine: Engine;
let home: string;

before(async () => {
  home = testHome('seed');
  // One warm VMM per template: the machine has 2 cores under TCG.
  engine = await openEngine(home, { catalog: ['base', 'python', 'node'], poolSize: 1 });
});

after(async () => {
  await assertNoLeaks(engine, home);
});

const SEED_RE = /^(0|[1-9][0-9]{0,19})$/;
const PY_RANDOM = 'python3 -c "import random,os,uuid; print(random.random(), os.urandom(8).hex(), uuid.uuid4())"';
const URANDOM = 'head -c 32 /dev/urandom | od -An -tx1';

async function run(id: string, req: ExecRequest): Promise<ExecResult> {
  const r = await engine.exec(id, req);
  assert.equal(r.exit_code, 0, `${JSON.stringify(req)}: ${r.stderr}`);
  assert.match(r.seed, SEED_RE);
  if (req.seed !== undefined) assert.equal(r.seed, req.seed);
  return r;
}

const outs = (rs: ExecResult[]) => rs.map((r) => r.stdout);

test('python: the same seed in two forks of one parent gives the same bytes; other or no seeds differ; a reported seed replays', async () => {
  const parent = await engine.create({ template: 'python' }, tenant);
  const [a, b] = await engine.fork(parent.id, { count: 2 });
  try {
    for (const command of [PY_RANDOM, URANDOM, 'python3 -c "print(id(object()), hash(\'abc\'))"']) {
      const same = await Promise.all([a, b].map((s) => run(s.id, { command, seed: '42' })));
      assert.equal(same[0].stdout, same[1].stdout, `${command}: same seed, same output`);
      assert.notEqual(same[0].stdout.trim(), '');

      const other = await run(b.id, { command, seed: '43' });
      assert.notEqual(other.stdout, same[0].stdout, `${command}: another seed, other output`);
    }
    // The commands of one exec are each a root of the exec's stream (docs/determinism.md).
    const roots = await run(a.id, { commands: [['head', '-c', '16', '/dev/urandom'], ['head', '-c', '16', '/dev/urandom']], seed: '42' });
    const rootBytes = Buffer.from(roots.stdout, roots.stdout_encoding === 'base64' ? 'base64' : 'utf8');
    assert.equal(rootBytes.length, 32);
    assert.deepEqual(rootBytes.subarray(0, 16), rootBytes.subarray(16));

    const seed0 = await run(a.id, { command: PY_RANDOM, seed: '0' });
    const seedMax = await run(a.id, { command: PY_RANDOM, seed: '18446744073709551615' });
    assert.notEqual(seed0.stdout, seedMax.stdout);

    // No seed: the host draws a fresh one for every exec, in every sandbox.
    const unseeded = [await run(a.id, { command: PY_RANDOM }), await run(a.id, { command: PY_RANDOM }), await run(b.id, { command: PY_RANDOM })];
    assert.equal(new Set(unseeded.map((r) => r.seed)).size, 3, 'each exec gets its own seed');
    assert.equal(new Set(outs(unseeded)).size, 3, 'and its own randomness');
    const unseededUrandom = [await run(a.id, { command: URANDOM }), await run(b.id, { command: URANDOM })];
    assert.notEqual(unseededUrandom[0].stdout, unseededUrandom[1].stdout);

    // Replay: a sandbox in the same state (a new fork of the same, untouched parent) and the seeds
    // the unseeded execs reported give back exactly their output.
    const [c] = await engine.fork(parent.id, { count: 1 });
    try {
      assert.equal((await run(c.id, { command: PY_RANDOM, seed: unseeded[0].seed })).stdout, unseeded[0].stdout);
      assert.equal((await run(c.id, { command: PY_RANDOM, seed: unseeded[2].seed })).stdout, unseeded[2].stdout);
      assert.equal((await run(c.id, { command: URANDOM, seed: unseededUrandom[1].seed })).stdout, unseededUrandom[1].stdout);
    } finally {
      await engine.delete(c.id);
    }

    // The caller cannot override COLLIMATE_SEED through env; the library's bookkeeping never leaks in.
    const env = await run(a.id, {
      command: 'echo "$COLLIMATE_SEED ${COLLIMATE_SEED_NODE_ARG-unset}"; python3 -c "import random; print(random.random())"',
      seed: '42',
      env: { COLLIMATE_SEED: '7', COLLIMATE_SEED_NODE_ARG: '--random-seed=1' },
    });
    const plain = await run(b.id, { command: 'echo "$COLLIMATE_SEED ${COLLIMATE_SEED_NODE_ARG-unset}"; python3 -c "import random; print(random.random())"', seed: '42' });
    assert.equal(env.stdout, plain.stdout);
    assert.match(env.stdout, /^42 unset\n/);

    // The kernel CRNG is not seeded: every fork has its own boot id.
    const boot = await Promise.all([parent, a, b].map((s) => run(s.id, { command: 'cat /proc/sys/kernel/random/boot_id', seed: '42' })));
    assert.equal(new Set(outs(boot)).size, 3, `boot_id must differ: ${outs(boot).join(' ')}`);
  } finally {
    for (const s of [a, b, parent]) await engine.delete(s.id);
  }
});

test('python: a 10-step rollout recorded with its seeds replays byte for byte from the fork point', async () => {
  const parent = await engine.create({ template: 'python' }, tenant);
  await run(parent.id, { command: 'echo start > /root/rollout.txt' });
  // Each step draws randomness, appends it to a file the next step reads, and prints the file's digest.
  const step = (i: number) =>
    `python3 -c "import random,os,uuid,hashlib; f=open('/root/rollout.txt','a'); f.write('${i} %r %s %s\\n' % (random.random(), os.urandom(6).hex(), uuid.uuid4())); f.close(); ` +
    `d=open('/root/rollout.txt','rb').read(); print(${i}, random.randrange(10**9), hashlib.sha256(d).hexdigest())"; tail -n1 /root/rollout.txt; head -c 8 /dev/urandom | od -An -tx1`;
  const [first, second] = await engine.fork(parent.id, { count: 2 });
  try {
    const recorded: ExecResult[] = [];
    for (let i = 0; i < 10; i++) recorded.push(await run(first.id, { command: step(i) }));
    assert.equal(new Set(recorded.map((r) => r.seed)).size, 10, 'every step drew its own seed');
    assert.equal(new Set(outs(recorded)).size, 10);
    for (let i = 0; i < 10; i++) {
      const replayed = await run(second.id, { command: step(i), seed: recorded[i].seed });
      assert.equal(replayed.stdout, recorded[i].stdout, `step ${i} replays identically`);
      assert.equal(replayed.stderr, recorded[i].stderr);
    }
    const files = await Promise.all([first, second].map((s) => run(s.id, { command: 'cat /root/rollout.txt' })));
    assert.equal(files[0].stdout, files[1].stdout);
    assert.equal(files[0].stdout.trim().split('\n').length, 11);
  } finally {
    for (const s of [first, second, parent]) await engine.delete(s.id);
  }
});

test('node: Math.random and crypto.randomBytes replay with the seed; randomBytes only because ASLR is off', async () => {
  const [a, b] = await Promise.all([engine.create({ template: 'node' }, tenant), engine.create({ template: 'node' }, tenant)]);
  try {
    const code = 'console.log(Math.random(), Math.random()); console.log(require("crypto").randomBytes(16).toString("hex"))';
    const node = ['node', '-e', code];
    const lines = (r: ExecResult) => r.stdout.trim().split('\n');
    const same = await Promise.all([a, b].map((s) => run(s.id, { commands: [node], seed: '42' })));
    assert.equal(lines(same[0])[0], lines(same[1])[0], 'Math.random is a function of the seed');
    assert.match(lines(same[0])[1], /^[0-9a-f]{32}$/);
    // OpenSSL is not interposed: its DRBG seeds from getrandom (which is) and otherwise only from
    // addresses, which the agent pins for seeded execs (ADDR_NO_RANDOMIZE).
    assert.equal(lines(same[0])[1], lines(same[1])[1], 'crypto.randomBytes replays too, with ASLR off');
    // With ASLR turned back on (personality(0), syscall 135, from perl before it execs node) the
    // OpenSSL output differs between the two sandboxes while Math.random still replays.
    const aslr = ['perl', '-e', 'syscall(135, 0) == -1 and die "personality: $!"; exec @ARGV or die', ...node];
    const randomized = await Promise.all([a, b].map((s) => run(s.id, { commands: [aslr], seed: '42' })));
    assert.equal(lines(randomized[0])[0], lines(randomized[1])[0]);
    assert.notEqual(lines(randomized[0])[1], lines(randomized[1])[1], 'with ASLR on, randomBytes does not replay');

    const other = await run(b.id, { commands: [node], seed: '43' });
    assert.notEqual(lines(other)[0], lines(same[0])[0]);
    assert.notEqual(lines(other)[1], lines(same[0])[1]);
    const unseeded = await Promise.all([a, b].map((s) => run(s.id, { commands: [node] })));
    assert.notEqual(unseeded[0].stdout, unseeded[1].stdout);
    const replay = await run(b.id, { commands: [node], seed: unseeded[0].seed });
    assert.equal(replay.stdout, unseeded[0].stdout, 'an unseeded exec replays with its reported seed');
  } finally {
    for (const s of [a, b]) await engine.delete(s.id);
  }
});

test('base: a statically linked program (busybox head) reads the real kernel CRNG, which differs between siblings even with the same seed', async () => {
  const parent = await engine.create({ template: 'base' }, tenant);
  const [a, b] = await engine.fork(parent.id, { count: 2 });
  try {
    const rs = await Promise.all([a, b].map((s) => run(s.id, { command: `${URANDOM}; cat /proc/sys/kernel/random/boot_id; echo "preload=\${LD_PRELOAD-none}"`, seed: '42' })));
    const [ra, rb] = rs.map((r) => r.stdout.split('\n'));
    assert.notEqual(ra.slice(0, 2).join(''), rb.slice(0, 2).join(''), 'urandom differs');
    assert.notEqual(ra[2], rb[2], 'boot_id differs');
    // busybox is static and the image has no glibc loader: the agent does not preload the library.
    assert.ok(rs.every((r) => r.stdout.includes('preload=none\n')));
  } finally {
    for (const s of [a, b, parent]) await engine.delete(s.id);
  }
});
