// Runs test files `concurrency` at a time in the order given, as `node --test` would, and ends with
// each file's wall time, longest first. Node 20's `node --test` sorts its files by name whatever
// order they are given in, so scripts/test.sh cannot start the longest integration files first
// through it; node:test's run() keeps the order. Files run in processes of their own, with this
// process's flags (--import tsx), and report as TAP (spec on a terminal), as `node --test` does.
// Usage: node --import tsx scripts/run-tests.ts [--concurrency=N] [--timeout=MS] file…
import { run } from 'node:test';
import { spec, tap } from 'node:test/reporters';
import { basename, resolve } from 'node:path';
import { Transform } from 'node:stream';

const opts: Record<string, number> = { concurrency: 1, timeout: Infinity };
const files: string[] = [];
for (const arg of process.argv.slice(2)) {
  const m = /^--(concurrency|timeout)=(\d+)$/.exec(arg);
  if (m) opts[m[1]] = Number(m[2]);
  else if (arg.startsWith('--')) { console.error(`run-tests: unknown option ${arg}`); process.exit(2); }
  else files.push(arg);
}
if (files.length === 0) { console.error('run-tests: no test files given'); process.exit(2); }

const wall: { file: string; secs: number; passed: boolean }[] = [];
const stream = run({ files, concurrency: opts.concurrency, timeout: opts.timeout });
// A file's own test (named by the file's path as given) completes when its process ends, failing if any test in
// it failed or it could not load; that also makes this run fail.
stream.on('test:complete', (data: { name: string; file?: string; details: { duration_ms: number; passed: boolean } }) => {
  if (!data.file || resolve(data.name) !== data.file) return;
  wall.push({ file: data.file, secs: data.details.duration_ms / 1000, passed: data.details.passed });
  if (!data.details.passed) process.exitCode = 1;
});
stream.on('test:fail', () => { process.exitCode = 1; });
// Node 20's spec reporter is a class, its tap reporter an async generator function.
const reporter = process.stdout.isTTY ? (new (spec as unknown as new () => Transform)()) : tap;
stream.compose(reporter).pipe(process.stdout);
process.on('exit', () => {
  wall.sort((a, b) => b.secs - a.secs);
  const lines = wall.map((w) => `${w.secs.toFixed(0).padStart(6)} s  ${basename(w.file, '.test.ts')}${w.passed ? '' : '  (failed)'}`);
  console.error(`run-tests: each file's wall time, longest first\n${lines.join('\n')}`);
});
