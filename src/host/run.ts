import { execFile } from 'node:child_process';

export interface RunResult { stdout: string; stderr: string }

/**
 * Runs a program (no shell), failing with its stderr tail so set-up errors say what broke.
 * `input` is written to its stdin.
 */
export function run(cmd: string, args: string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number; input?: string } = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = execFile(cmd, args, { cwd: opts.cwd, env: opts.env ?? process.env, maxBuffer: 64 * 1024 * 1024, timeout: opts.timeoutMs ?? 600_000 }, (err, stdout, stderr) => {
      if (err) {
        const tail = String(stderr).trim().split('\n').slice(-15).join('\n');
        reject(new Error(`${cmd} ${args.join(' ')} failed: ${err.message}\n${tail}`));
      } else resolve({ stdout: String(stdout), stderr: String(stderr) });
    });
    if (opts.input !== undefined) {
      // A program that fails before reading its input closes the pipe: its exit status says why.
      child.stdin?.on('error', () => {});
      child.stdin?.end(opts.input);
    }
  });
}
