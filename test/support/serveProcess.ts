/**
 * `node --import tsx src/cli/main.ts serve ...` as an operator runs it, for CLI tests: resolves once
 * its "collimate serving http://ADDR:PORT" line is whole, with the port and everything it printed
 * on stderr so far; rejects with that output if it exits first. The caller kills `child`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

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
