/**
 * `collimate serve` as a child process. `startServe`: `node --import tsx src/cli/main.ts serve ...` as an operator runs it, for CLI tests: resolves once
 * its "collimate serving http://ADDR:PORT" line is whole, with the port and everything it printed
 * on stderr so far; rejects with that output if it exits first. The caller kills `child`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { freePort } from './registry.ts';

const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

export async function startServe(args: string[], env: NodeJS.ProcessEnv): Promise<{ child: ChildProcess; url: string; stderr: () => string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', MAIN, 'serve', ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  try {
    const url = await new Promise<string>((resolve, reject) => {
      child.stderr!.on('data', (d) => {
        stderr += d;
        const m = /serving http:\/\/\S+?:(\d+)/.exec(stderr);
        if (m && stderr.includes('\n', m.index)) resolve(`http://127.0.0.1:${m[1]}`);
      });
      child.on('exit', (code) => reject(new Error(`serve exited ${code}: ${stderr}`)));
    });
    return { child, url, stderr: () => stderr };
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
}

const BIN = fileURLToPath(new URL('../../bin/collimate.js', import.meta.url));
const FAKE_ENGINE = fileURLToPath(new URL('./fakeEngine.ts', import.meta.url));

/** A `collimate serve` (bin/collimate.js, as installed) over the fake engine, for cluster and door tests. */
export interface FakeHost {
  url: string;
  child: ChildProcess;
  home: string;
  stderr: () => string;
}

/**
 * Starts a fake-engine host on a free port; `$URL` in `args` becomes its own address (for
 * --advertise). A port another process took meanwhile is retried. A test process that ends early
 * takes its hosts with it.
 */
export async function startFakeHost(args: string[], home: string, env: Record<string, string> = {}): Promise<FakeHost> {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    const child = spawn(process.execPath, [BIN, 'serve', '--port', String(port), '--home', home, '--log-level', 'warn', '--allow-tcg', ...args.map((a) => a.replace('$URL', url))], {
      env: { ...process.env, COLLIMATE_ENGINE_MODULE: FAKE_ENGINE, ...env },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    const up = await new Promise<boolean>((resolve, reject) => {
      child.stderr!.on('data', (d) => {
        stderr += d;
        if (/collimate serving http/.test(stderr)) resolve(true);
      });
      child.on('exit', (code) => (/EADDRINUSE/.test(stderr) && attempt < 3 ? resolve(false) : reject(new Error(`serve exited ${code}: ${stderr}`))));
    });
    if (up) {
      process.once('exit', () => child.kill('SIGKILL'));
      return { url, child, home, stderr: () => stderr };
    }
  }
}

/** Stops a host with `signal` and waits for it to exit; its home is removed. */
export async function stopFakeHost(h: FakeHost, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (h.child.exitCode === null && h.child.signalCode === null) {
    const exited = new Promise((r) => h.child.once('exit', r));
    h.child.kill(signal);
    await exited;
  }
  rmSync(h.home, { recursive: true, force: true });
}
