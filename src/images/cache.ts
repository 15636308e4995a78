import { createHash } from 'node:crypto';
import { createReadStream, mkdirSync, renameSync, existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { execFile } from 'node:child_process';

/** Layout of the data directory (COLLIMATE_HOME, default ~/.collimate). */
export function homePaths(home: string) {
  return {
    home,
    blobs: join(home, 'blobs', 'sha256'),
    assets: join(home, 'assets'),
    artifacts: join(home, 'artifacts'),
    sandboxes: join(home, 'sandboxes'),
    /** qcow2 disk layers of sandboxes and fork points, by path; shared within a fork tree. */
    disks: join(home, 'disks'),
    snapshots: join(home, 'snapshots'),
    tmp: join(home, 'tmp'),
    db: join(home, 'collimate.db'),
  };
}

export function sha256Hex(...parts: (string | Buffer)[]): string {
  const h = createHash('sha256');
  for (const p of parts) { h.update(typeof p === 'string' ? Buffer.from(p) : p); h.update('\0'); }
  return h.digest('hex');
}

export function sha256File(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const h = createHash('sha256');
    createReadStream(path).on('data', (d) => h.update(d)).on('end', () => resolve(h.digest('hex'))).on('error', reject);
  });
}

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

/**
 * Builds `finalPath` at most once: `build` writes into a fresh temporary directory, which is then
 * renamed into place, so a crash mid-build never leaves a half-made cache entry that looks done.
 */
export async function buildOnce(finalPath: string, tmpRoot: string, build: (tmpDir: string) => Promise<void>): Promise<string> {
  if (existsSync(finalPath)) return finalPath;
  mkdirSync(tmpRoot, { recursive: true });
  const tmp = join(tmpRoot, `build-${process.pid}-${Date.now()}-${Math.random().toString(16).slice(2)}`);
  mkdirSync(tmp, { recursive: true });
  try {
    await build(tmp);
    mkdirSync(join(finalPath, '..'), { recursive: true });
    try {
      renameSync(tmp, finalPath);
    } catch (e) {
      // Another builder won the race; theirs is identical by construction (content-addressed).
      if (!existsSync(finalPath)) throw e;
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return finalPath;
}
