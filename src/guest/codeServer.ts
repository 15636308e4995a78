/**
 * The code interpreter's server as the guest gets it (docs/code.md): its files (src/guest/code/) and
 * the shell script that installs them under /run/collimate/code and starts the server, in a cgroup
 * of its own outside the agent's /execs (an idle kernel must not keep a sandbox from its idle
 * pause; busy cells are announced in CODE_BUSY_FILE instead).
 *
 * The catalog's python and node templates run the script at bake, so a kernel is already up in
 * their checkpoint; any other sandbox runs it on its first runCode. The script is idempotent: a
 * server already running is left alone.
 */
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sha256Hex } from '../host/hash.js';

/** The port the server listens on in the guest: E2B's code interpreter port, which its SDK calls. */
export const CODE_PORT = 49999;
export const CODE_DIR = '/run/collimate/code';
/** Cells running now, as a decimal number (written by the server; absent or 0: idle). */
export const CODE_BUSY_FILE = `${CODE_DIR}/busy`;
const CODE_CGROUP = '/sys/fs/cgroup/code';
/** The server's process limit (kernels, their threads and whatever cells start). */
const CODE_PIDS_MAX = 4096;
/** How long the script waits for the server's default kernel; a first Python kernel under TCG takes tens of seconds. */
const READY_WAIT_SECS = 300;
/** A bake's wait (its ready step allows 600 s): on a loaded host the server may start its spare kernel twice. */
export const BAKE_READY_WAIT_SECS = 570;

const SOURCE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), 'code');
const FILES = ['server.py', 'kernel.js', 'python_setup.py'] as const;

function files(): Array<{ name: string; data: Buffer }> {
  return FILES.map((name) => ({ name, data: readFileSync(resolve(SOURCE_DIR, name)) }));
}

/** The digest of the server's files: a template baked with another server is baked anew. */
export function codeServerDigest(): string {
  return sha256Hex('code-server-v1', ...files().flatMap((f) => [f.name, f.data]));
}

/**
 * The shell script (POSIX sh, run as root) that installs and starts the server and waits until its
 * default kernel answers. Exit codes: 0 ready (or already running), 3 no python3 in the image, 4 the
 * server exited (its log's tail on stderr), 5 not ready in `readyWaitSecs`.
 */
export function codeServerScript(readyWaitSecs = READY_WAIT_SECS): string {
  const writes = files().map((f) => `printf %s '${f.data.toString('base64')}' | base64 -d > "$d/${f.name}"`);
  return [
    'set -eu',
    `d=${CODE_DIR}`,
    `if [ -f "$d/pid" ] && [ -f "$d/ready" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then exit 0; fi`,
    `command -v python3 >/dev/null 2>&1 || { echo "this sandbox's image has no python3, which the code interpreter's server runs on" >&2; exit 3; }`,
    // A server already starting (another first cell) is waited for, not started twice.
    'if [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then started=1; else started=; fi',
    'if [ -z "$started" ]; then',
    'mkdir -p "$d"',
    'rm -f "$d/ready" "$d/pid"',
    ...writes,
    // Its own cgroup, beside the agent's /execs; without cgroup v2 it stays where it is.
    `if [ -d /sys/fs/cgroup/execs ] && mkdir -p ${CODE_CGROUP} 2>/dev/null; then echo ${CODE_PIDS_MAX} > ${CODE_CGROUP}/pids.max 2>/dev/null || true; fi`,
    // Not seeded: the seed library preloaded into this exec must not reach the kernels (a seeded cell asks for its seed).
    'unset LD_PRELOAD COLLIMATE_SEED COLLIMATE_SEED_LINEAGE',
    `setsid sh -c 'echo $$ > ${CODE_CGROUP}/cgroup.procs 2>/dev/null || true; exec python3 ${CODE_DIR}/server.py' </dev/null >>"$d/server.log" 2>&1 &`,
    'echo $! > "$d/pid"',
    'fi',
    'i=0',
    'while [ ! -f "$d/ready" ]; do',
    '  i=$((i+1))',
    `  if [ $i -gt 20 ] && ! kill -0 "$(cat "$d/pid" 2>/dev/null || echo 0)" 2>/dev/null; then echo "the code interpreter's server exited:" >&2; tail -n 20 "$d/server.log" >&2; exit 4; fi`,
    `  if [ $i -gt ${readyWaitSecs * 10} ]; then echo "the code interpreter's server was not ready in ${readyWaitSecs} s:" >&2; tail -n 20 "$d/server.log" >&2; exit 5; fi`,
    '  sleep 0.1',
    'done',
    '',
  ].join('\n');
}

/**
 * Runs the warm-up cell (silent: not counted, nothing shown; server.py WARM_UP) in the default context of the code interpreter
 * at `host`, if one listens: under TCG a new QEMU process translates every guest path afresh, so the
 * first cell after a restore costs most of a second; a pool pays it before the sandbox is claimed.
 * Resolves false when no server answers (a template without one) or the cell did not finish in time.
 */
export function warmCodeInterpreter(host: string, { port = CODE_PORT, timeoutMs = 30_000 } = {}): Promise<boolean> {
  const body = JSON.stringify({ warm: true });
  return new Promise((resolve) => {
    const req = request({ host, port, method: 'POST', path: '/execute?format=mime', agent: false, timeout: timeoutMs,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => { text += c; });
      res.on('end', () => resolve(res.statusCode === 200 && text.includes('"end_of_execution"')));
      res.on('error', () => resolve(false));
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
    req.end(body);
  });
}
