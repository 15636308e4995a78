/**
 * libcollimate-seed.so on this host (Debian bookworm glibc, like the guests):
 * builds the library, runs real programs under LD_PRELOAD and checks which
 * outputs are a function of COLLIMATE_SEED. docs/determinism.md claims only
 * what is checked here.
 */
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildSeedLibrary, seedSourceFiles, SEED_LIBRARY_NAME } from '../../../src/guest/seed/build.ts';

const PYTHON = '/usr/bin/python3'; // Debian's, as in guest images (not a pyenv shim)
const dir = mkdtempSync(join(tmpdir(), 'collimate-seed-'));
let lib = '';

/** Environment without anything that could leak determinism in or out. */
function baseEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const k of ['LD_PRELOAD', 'COLLIMATE_SEED', 'COLLIMATE_SEED_LINEAGE', 'COLLIMATE_SEED_NODE_ARG', 'PYTHONHASHSEED', 'NODE_OPTIONS']) {
    delete env[k];
  }
  return env;
}

/** Run under the library; seed undefined = library loaded but no seed (pass-through). */
function run(seed: string | undefined, file: string, args: string[]): string {
  const env: NodeJS.ProcessEnv = { ...baseEnv(), LD_PRELOAD: lib };
  if (seed !== undefined) env.COLLIMATE_SEED = seed;
  return execFileSync(file, args, { env, encoding: 'utf8', timeout: 30_000 });
}
const sh = (seed: string | undefined, script: string) => run(seed, '/bin/sh', ['-c', script]);

/** Same seed twice → equal; another seed → different; no seed twice → different. */
function assertSeeded(label: string, f: (seed: string | undefined) => string): void {
  const a = f('42');
  assert.equal(f('42'), a, `${label}: same seed must reproduce`);
  assert.notEqual(f('43'), a, `${label}: another seed must differ`);
  assert.notEqual(f(undefined), f(undefined), `${label}: without COLLIMATE_SEED it must stay random`);
}

before(async () => {
  lib = await buildSeedLibrary(join(dir, 'out'));
});

test('buildSeedLibrary compiles the library and lists its sources', () => {
  assert.equal(lib, join(dir, 'out', SEED_LIBRARY_NAME));
  assert.ok(existsSync(lib));
  const names = seedSourceFiles().map((p) => p.split('/').pop());
  assert.deepEqual(names, ['seed_env.h', 'seedrandom.c']);
  const deps = execFileSync('ldd', [lib], { encoding: 'utf8' });
  assert.match(deps, /libc\.so\.6/);
  assert.doesNotMatch(deps.replace(/lib(c|dl|pthread)\.so\.\d|ld-linux[^ ]*|linux-vdso[^ ]*/g, ''), /\.so/);
});

test('python: random, os.urandom and uuid4 follow the seed', () => {
  const code = 'import random,os,uuid; print(random.random(), os.urandom(8).hex(), uuid.uuid4())';
  assertSeeded('python', (seed) => run(seed, PYTHON, ['-c', code]));
});

test('python: str hashes follow the seed even without PYTHONHASHSEED', () => {
  assertSeeded('hash', (seed) => run(seed, PYTHON, ['-c', 'print(hash("abc"), {"a", "b", "c", "d"})']));
});

test('coreutils: head reading /dev/urandom, by path and through an inherited fd', () => {
  assert.doesNotMatch(execFileSync('ldd', ['/usr/bin/head'], { encoding: 'utf8' }), /not a dynamic/);
  assertSeeded('head path', (seed) => sh(seed, 'head -c 32 /dev/urandom | od -An -tx1'));
  // The shell opens the device; head only inherits fd 0 across exec.
  assertSeeded('head stdin', (seed) => sh(seed, 'head -c 32 < /dev/urandom | od -An -tx1'));
  assertSeeded('dev/random', (seed) => sh(seed, 'head -c 32 /dev/random | od -An -tx1'));
});

test('/proc/sys/kernel/random/uuid yields a seeded, well-formed v4 UUID per open', () => {
  assertSeeded('uuid', (seed) => sh(seed, 'cat /proc/sys/kernel/random/uuid; cat /proc/sys/kernel/random/uuid'));
  const [a, b] = sh('7', 'cat /proc/sys/kernel/random/uuid; cat /proc/sys/kernel/random/uuid').trim().split('\n');
  assert.match(a, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.notEqual(a, b);
});

test('C: getrandom, getentropy, syscall(SYS_getrandom), fread(fopen), dup+read, arc4random', () => {
  const src = join(dir, 'rnd.c');
  writeFileSync(
    src,
    `#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>
static void hex(const char *tag, const unsigned char *b) { printf("%s=", tag); for (int i = 0; i < 16; i++) printf("%02x", b[i]); printf("\\n"); }
int main(void) {
    unsigned char b[16];
    if (getrandom(b, 16, 0) != 16) return 1; hex("getrandom", b);
    if (getentropy(b, 16) != 0) return 2; hex("getentropy", b);
    if (syscall(SYS_getrandom, b, 16, 0) != 16) return 3; hex("syscall", b);
    FILE *f = fopen("/dev/urandom", "rb"); if (!f || fread(b, 1, 16, f) != 16) return 4; fclose(f); hex("fread", b);
    int fd = open("/dev/urandom", O_RDONLY), fd2 = dup(fd); close(fd);
    if (read(fd2, b, 16) != 16) return 5; close(fd2); hex("dup", b);
    arc4random_buf(b, 16); hex("arc4random", b);
    /* other syscalls still pass through syscall() with their arguments */
    if (syscall(SYS_getpid) != getpid()) return 6;
    fflush(stdout);
    if (syscall(SYS_write, 1, "write-ok\\n", 9) != 9) return 7;
    return 0;
}
`,
  );
  const bin = join(dir, 'rnd');
  execFileSync('gcc', ['-O2', '-o', bin, src]);
  assertSeeded('C', (seed) => run(seed, bin, []));
  const lines = run('42', bin, []).trim().split('\n');
  assert.equal(lines.pop(), 'write-ok');
  const values = lines.map((l) => l.split('=')[1]);
  assert.equal(values.length, 6);
  assert.equal(new Set(values).size, 6, 'each call must advance the stream');
});

test('fork: child and parent get different, reproducible streams; siblings differ', () => {
  const code = `
import os, subprocess
r = os.open("/dev/urandom", os.O_RDONLY)
pid = os.fork()
data = os.read(r, 8).hex() + " " + os.urandom(8).hex()
if pid == 0:
    print("child", data, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent", data, flush=True)
head = ["head", "-c", "8", "/dev/urandom"]
print("sub1", subprocess.run(head, capture_output=True).stdout.hex())
print("sub2", subprocess.run(head, capture_output=True).stdout.hex())
print("sub3", subprocess.run(head, capture_output=True, env=dict(os.environ)).stdout.hex())
print("sys", flush=True); os.system("head -c 8 /dev/urandom | od -An -tx1")
`;
  assertSeeded('fork', (seed) => run(seed, PYTHON, ['-c', code]));
  const out = run('42', PYTHON, ['-c', code]);
  const [child, parent, sub1, sub2, sub3, , od] = out.trim().split('\n');
  const values = [
    ...child.split(' ').slice(1), ...parent.split(' ').slice(1),
    sub1.split(' ')[1], sub2.split(' ')[1], sub3.split(' ')[1], od.replace(/ /g, ''),
  ];
  assert.equal(values.length, 8, out);
  for (const v of values) assert.match(v, /^[0-9a-f]{16}$/, out);
  assert.equal(new Set(values).size, values.length, out);
});

test('node: Math.random follows the seed (library adds --random-seed), nested node gets its own', () => {
  const code = `console.log(Math.random(), require('child_process').execFileSync(process.execPath, ['-p', 'Math.random()']).toString().trim())`;
  assertSeeded('Math.random', (seed) => run(seed, process.execPath, ['-e', code]));
  const [parent, child] = run('42', process.execPath, ['-e', code]).trim().split(' ');
  assert.notEqual(parent, child);
  // No argv change at all without a seed.
  assert.equal(run(undefined, process.execPath, ['-p', 'process.execArgv.join(" ")']).trim(), '-p process.execArgv.join(" ")');
});

test('node: crypto.randomBytes (OpenSSL, not interposed) differs with ASLR on, and replays with ADDR_NO_RANDOMIZE despite other pids and times', () => {
  const code = `console.log(require('crypto').randomBytes(16).toString('hex'))`;
  assert.notEqual(run('42', process.execPath, ['-e', code]), run('42', process.execPath, ['-e', code]));
  // OpenSSL 3.0 seeds its DRBG from getrandom (interposed); what else differs between runs is an
  // address. Every run is a new process (new pid) and a second or more apart.
  const noAslr = () => run('42', '/usr/bin/setarch', ['-R', process.execPath, '-e', code]);
  const first = noAslr();
  execFileSync('sleep', ['1.1']);
  // Node.js 26 (26.12.1, the same OpenSSL 3.5.9 as 24) mixes the wall-clock second in: its output
  // replays only within the same second, so there the claim is not made (docs/determinism.md).
  if (Number(process.versions.node.split('.')[0]) < 26) assert.equal(noAslr(), first);
  assert.notEqual(run('43', '/usr/bin/setarch', ['-R', process.execPath, '-e', code]), first);
});

test('seed_env.h: PYTHONHASHSEED entries are in range and differ between nearby seeds', () => {
  const src = join(dir, 'env.c');
  const header = seedSourceFiles().find((p) => p.endsWith('seed_env.h'))!;
  writeFileSync(
    src,
    `#include "${header}"
int main(void) {
    char s[COLLIMATE_SEED_ENTRY_MAX], h[COLLIMATE_SEED_ENTRY_MAX];
    unsigned long long seeds[] = {0, 1, 2, 18446744073709551615ull};
    for (int i = 0; i < 4; i++) { collimate_seed_env_entries(seeds[i], s, h); printf("%s %s\\n", s, h); }
    return 0;
}
`,
  );
  const bin = join(dir, 'env');
  execFileSync('gcc', ['-Wall', '-Wextra', '-Werror', '-O2', '-o', bin, src]);
  const lines = execFileSync(bin, { encoding: 'utf8' }).trim().split('\n');
  assert.equal(lines[3].split(' ')[0], 'COLLIMATE_SEED=18446744073709551615');
  const hashes = lines.map((l) => Number(l.split(' ')[1].replace('PYTHONHASHSEED=', '')));
  for (const h of hashes) assert.ok(Number.isInteger(h) && h >= 0 && h <= 4294967295);
  assert.equal(new Set(hashes).size, 4);
  // Python accepts it, and it pins the hash across runs (without the library).
  const env = { ...baseEnv(), PYTHONHASHSEED: String(hashes[1]) };
  const h = () => execFileSync(PYTHON, ['-c', 'print(hash("abc"))'], { env, encoding: 'utf8' });
  assert.equal(h(), h());
});

test('NOT covered: a statically linked program asks the kernel directly', () => {
  const src = join(dir, 'static.c');
  writeFileSync(
    src,
    `#include <stdio.h>
#include <sys/random.h>
int main(void) { unsigned long long v; if (getrandom(&v, sizeof v, 0) != sizeof v) return 1; printf("%llx\\n", v); return 0; }
`,
  );
  const bin = join(dir, 'static');
  execFileSync('gcc', ['-static', '-O2', '-o', bin, src]);
  assert.notEqual(run('42', bin, []), run('42', bin, []));
});

test('NOT covered by the library: addresses (ASLR); personality(ADDR_NO_RANDOMIZE) via setarch -R fixes them here', () => {
  const code = 'print(id(object()), hex(id(print)))';
  assert.notEqual(run('42', PYTHON, ['-c', code]), run('42', PYTHON, ['-c', code]));
  const noAslr = () => run('42', '/usr/bin/setarch', ['-R', PYTHON, '-c', code]);
  assert.equal(noAslr(), noAslr());
});
