// E2B's own JavaScript SDK test suite against a Collimate server (issue 33, "Show it"): the test
// files of e2b-dev/E2B at a tag, run unchanged with vitest against the `e2b` package from npm and a
// real server on loopback with real microVMs. E2B's files are copied into a work directory under
// /tmp and never into this repository.
//
//   node --import tsx bench/e2b-suite.ts [E2B_REPO] [--strict] [--only TEXT]... [--work DIR] [--workers N] [--keep] [--list]
//
// E2B_REPO (argument or variable): a git directory or checkout of e2b-dev/E2B holding the tag; without
// it the tag is cloned from GitHub. What it does:
//   1. copies packages/js-sdk/tests at E2B_TAG (default e2b@2.45.0) into the work directory;
//   2. points every import of the SDK's source ('../src', '../../src/index.js'…) at the package 'e2b';
//      an import of an internal module (src/errors, src/sandbox/filesystem…) too when the package
//      exports every name it takes (or declares it as a type, which compiling erases). Test bodies
//      are not touched. Files that need the SDK's internals, or that mock E2B's API in-process, are
//      listed as not runnable from the npm package; E2B-cloud-only folders are listed as excluded;
//   3. installs e2b@E2B_SDK_VERSION and vitest (the range E2B's package.json names). The default SDK
//      is the tag's own release (2.45.0): the one its tests were written against. A later SDK
//      differs from its tests in places (2.51.0 leaves a create's timeout to the server, whose
//      default is E2B's 15 s, and sends `fork({count: 0})` instead of refusing it);
//   4. makes an E2B-shaped key and starts `collimate serve` on a free port (COLLIMATE_CACHE_DIR,
//      default /var/tmp/collimate-test-cache), and sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY
//      and E2B_DOMAIN (docs/e2b.md);
//   5. runs vitest (--workers files at a time, default 2; 60 s a test), deletes what the tests left,
//      stops the server by its pid, and prints the counts, each file's and each failed test's name
//      with the first line of its error. The exit status is 0, or with --strict 1 on any failure.
// --only TEXT runs only the runnable files whose path contains TEXT (repeatable); --work DIR reuses
// a work directory (and its node_modules); --keep leaves the server's home behind; --list prints
// which files would run and why the others do not, and starts nothing.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join, posix, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TAG = process.env.E2B_TAG ?? 'e2b@2.45.0';
const SDK_VERSION = process.env.E2B_SDK_VERSION ?? /^e2b@(\d+\.\d+\.\d+)$/.exec(TAG)?.[1] ?? '2.51.0';
const CLONE_URL = 'https://github.com/e2b-dev/E2B';
const TEST_TIMEOUT_MS = 60_000;
/** How long a first start may take to build the catalog templates when the cache is cold. */
const READY_TIMEOUT_MS = 20 * 60_000;

/** Folders that test E2B's cloud services Collimate does not serve, or runtimes other than Node. */
const EXCLUDED: Record<string, string> = {
  'template/': 'template builds (Template.build and friends): E2B build service; Collimate serves no /templates',
  'runtimes/': 'browser and Cloudflare Workers runtimes, not Node.js',
  'volume/': 'volumes: an E2B-cloud-only service',
  'secret/': 'secrets: an E2B-cloud-only service',
  'bundle/': "checks the SDK's own build output (dist/ of a source checkout), not a server",
};

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    strict: { type: 'boolean' },
    only: { type: 'string', multiple: true },
    work: { type: 'string' },
    workers: { type: 'string' },
    keep: { type: 'boolean' },
    list: { type: 'boolean' },
  },
});
const workers = Number(opts.workers ?? process.env.E2B_SUITE_WORKERS ?? 2);
const say = (m: string) => console.error(`[e2b-suite] ${m}`);

// ---- 1. E2B's test files at the tag ------------------------------------------------------------

const work = opts.work ?? process.env.E2B_SUITE_DIR ?? mkdtempSync('/tmp/e2b-suite-');
mkdirSync(work, { recursive: true });
if (work.startsWith(ROOT)) throw new Error(`the work directory ${work} is inside the repository: E2B's files never go there`);
const src = join(work, 'e2b');
rmSync(src, { recursive: true, force: true });
rmSync(join(work, 'tests'), { recursive: true, force: true });
mkdirSync(src);
let repo = positionals[0] ?? process.env.E2B_REPO;
let ref = TAG;
if (!repo) {
  repo = join(work, 'E2B.git');
  ref = 'HEAD'; // a clone of the tag alone: its HEAD is the tag's commit
  if (!existsSync(repo)) {
    say(`cloning ${CLONE_URL} at ${TAG}`);
    execFileSync('git', ['clone', '--bare', '--depth', '1', '--branch', TAG, CLONE_URL, repo], { stdio: 'inherit' });
  }
}
// `git -C` finds the repository in a bare directory and in a checkout alike.
let commit: string;
try {
  commit = execFileSync('git', ['-C', repo, 'rev-parse', '--verify', '-q', `${ref}^{commit}`], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
} catch {
  throw new Error(`${repo} is not a git repository of e2b-dev/E2B holding the tag ${TAG} (fetch it with git fetch origin tag ${TAG})`);
}
execFileSync('bash', ['-c', 'git -C "$1" archive --format=tar "$2" packages/js-sdk/tests packages/js-sdk/package.json | tar -x -C "$3"', '-', repo, commit, src]);
execFileSync('cp', ['-r', join(src, 'packages/js-sdk/tests'), join(work, 'tests')]);
const e2bPackage = JSON.parse(readFileSync(join(src, 'packages/js-sdk/package.json'), 'utf8')) as { devDependencies: Record<string, string> };
say(`E2B's tests at ${TAG} (${commit.slice(0, 12)}) in ${work}/tests`);

// ---- 3 (first half). The npm package, and what it exports --------------------------------------

const vitestRange = process.env.E2B_SUITE_VITEST ?? e2bPackage.devDependencies.vitest;
const deps: Record<string, string> = { e2b: SDK_VERSION, vitest: vitestRange };
writeFileSync(join(work, 'package.json'), JSON.stringify({ name: 'e2b-suite-run', private: true, type: 'module', dependencies: deps }, null, 2) + '\n');
const installedVersion = (name: string) => {
  try { return (JSON.parse(readFileSync(join(work, 'node_modules', name, 'package.json'), 'utf8')) as { version: string }).version; } catch { return undefined; }
};
if (installedVersion('e2b') !== SDK_VERSION || !installedVersion('vitest')) {
  say(`npm install e2b@${SDK_VERSION} vitest@${vitestRange}`);
  execFileSync('npm', ['install', '--no-audit', '--no-fund'], { cwd: work, stdio: ['ignore', 'inherit', 'inherit'] });
}
const runtimeExports = new Set(JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', "console.log(JSON.stringify(Object.keys(await import('e2b'))))"], { cwd: work, encoding: 'utf8' })) as string[]);
const declarations = readFileSync(join(work, 'node_modules/e2b/dist/index.d.ts'), 'utf8');
const isTypeIn = (name: string) => new RegExp(`^(export )?(declare )?(type|interface) ${name}\\b`, 'm').test(declarations);

// ---- 2. Which files run, and pointing them at the package --------------------------------------

interface Verdict { file: string; run: boolean; why?: string; kind?: 'excluded' | 'not runnable from the npm package' }

const testsDir = join(work, 'tests');
const allTs = (dir: string): string[] => readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
  e.isDirectory() ? allTs(join(dir, e.name)) : /\.tsx?$/.test(e.name) ? [relative(testsDir, join(dir, e.name))] : []);
const files = allTs(testsDir).sort();

/** The SDK module a relative specifier names from `file` ('' for the package's root), or undefined if it is not the SDK's source. */
function sdkModule(file: string, spec: string): string | undefined {
  if (!spec.startsWith('.')) return undefined;
  const p = posix.normalize(posix.join('tests', posix.dirname(file), spec));
  if (p !== 'src' && !p.startsWith('src/')) return undefined;
  const m = p.replace(/^src\/?/, '').replace(/\.js$/, '');
  return m === 'index' ? '' : m;
}

const STATIC_IMPORT = /\bimport\s+(type\s+)?([\w*{}\s,$]*?)\s*from\s*(['"])([^'"]+)\3/g;
const problems = new Map<string, string[]>(); // every .ts file: why it cannot run from the package
const rewritten = new Map<string, string>();
for (const file of files) {
  const text = readFileSync(join(testsDir, file), 'utf8');
  const why: string[] = [];
  if (/from\s+['"]msw(\/node)?['"]/.test(text)) {
    why.push("mocks E2B's API in-process with msw, which the npm package's undici transport bypasses (E2B's suite reroutes it by mocking its internal src/undici)");
  }
  for (const m of text.matchAll(/\bvi\.(?:do)?[mM]ock\(\s*['"]([^'"]+)['"]/g)) {
    const mod = sdkModule(file, m[1]);
    if (mod !== undefined) why.push(`mocks the internal module src/${mod}`);
  }
  for (const m of text.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g)) {
    const mod = sdkModule(file, m[1]);
    if (mod) why.push(`imports the internal module src/${mod}`);
  }
  for (const m of text.matchAll(STATIC_IMPORT)) {
    const mod = sdkModule(file, m[4]);
    if (!mod || m[1]) continue; // the package's root, or `import type` (erased)
    const clause = m[2].trim();
    const named = /^\{([^}]*)\}$/.exec(clause);
    if (!named) { why.push(`imports src/${mod} as a whole`); continue; }
    const missing = named[1].split(',').map((s) => s.trim()).filter(Boolean)
      .filter((s) => !s.startsWith('type '))
      .map((s) => s.split(/\s+as\s+/)[0])
      .filter((name) => !runtimeExports.has(name) && !isTypeIn(name));
    if (missing.length) why.push(`imports ${missing.join(', ')} from the internal module src/${mod}, which the package does not export`);
  }
  problems.set(file, why);
  rewritten.set(file, text.replace(STATIC_IMPORT, (whole, _t, _c, q: string, spec: string) =>
    sdkModule(file, spec) === undefined ? whole : whole.slice(0, whole.length - spec.length - 2) + `${q}e2b${q}`));
}
/** A file's problems and those of the local helpers it imports. */
function problemsOf(file: string, seen = new Set<string>()): string[] {
  if (seen.has(file)) return [];
  seen.add(file);
  const own = problems.get(file) ?? [];
  const helpers = [...readFileSync(join(testsDir, file), 'utf8').matchAll(STATIC_IMPORT)]
    .map((m) => m[4]).filter((s) => s.startsWith('.') && sdkModule(file, s) === undefined)
    .map((s) => posix.normalize(posix.join(posix.dirname(file), s)).replace(/\.js$/, ''))
    .map((p) => [p, `${p}.ts`, `${p}.tsx`].find((c) => problems.has(c)))
    .filter((p): p is string => p !== undefined);
  return [...new Set([...own, ...helpers.flatMap((h) => problemsOf(h, seen).map((w) => `${w} (via ${h})`))])];
}
const verdicts: Verdict[] = files.filter((f) => /\.test\.tsx?$/.test(f)).map((file) => {
  const dir = Object.keys(EXCLUDED).find((d) => file.startsWith(d));
  if (dir) return { file, run: false, kind: 'excluded', why: EXCLUDED[dir] };
  const why = problemsOf(file);
  return why.length ? { file, run: false, kind: 'not runnable from the npm package', why: why.join('; ') } : { file, run: true };
});
for (const [file, text] of rewritten) writeFileSync(join(testsDir, file), text);
const only = opts.only ?? [];
const runnable = verdicts.filter((v) => v.run).map((v) => v.file);
const selected = runnable.filter((f) => only.length === 0 || only.some((o) => f.includes(o)));
say(`${verdicts.length} test files: ${runnable.length} runnable, ${selected.length} selected`);
if (opts.list) {
  for (const v of verdicts) console.log(v.run ? `run  ${v.file}${selected.includes(v.file) ? '' : ' (not selected)'}` : `skip ${v.file}: ${v.kind}: ${v.why}`);
  process.exit(0);
}

// ---- 3 (second half). vitest's settings --------------------------------------------------------

const resultsJson = join(work, 'results.json');
rmSync(resultsJson, { force: true });
writeFileSync(join(work, 'vitest.config.mjs'), `// Written by Collimate's bench/e2b-suite.ts.
import { defineConfig } from 'vitest/config'
export default defineConfig({
  test: {
    include: ${JSON.stringify(selected.map((f) => `tests/${f}`))},
    environment: 'node',
    globals: false,
    isolate: true,
    testTimeout: ${TEST_TIMEOUT_MS},
    hookTimeout: ${TEST_TIMEOUT_MS},
    maxWorkers: ${workers},
    fileParallelism: ${workers > 1},
    reporters: ['default', 'json', './errorDetails.mjs'],
    outputFile: { json: ${JSON.stringify(resultsJson)} },
  },
})
`);
// vitest's JSON holds an error's stack only: this reporter keeps what its first line leaves out (a
// command's exit code and stderr, the cause of a failed fetch), by file and test name.
const detailsJson = join(work, 'errorDetails.json');
rmSync(detailsJson, { force: true });
writeFileSync(join(work, 'errorDetails.mjs'), `// Written by Collimate's bench/e2b-suite.ts.
import { writeFileSync } from 'node:fs'
const firstLine = (s) => String(s ?? '').split('\\n').map((l) => l.trim()).find(Boolean) ?? ''
function describe(e) {
  let line = (e.name ?? 'Error') + (firstLine(e.message) ? ': ' + firstLine(e.message) : '')
  const r = e.result
  if (r && typeof r === 'object' && 'exitCode' in r) line += ' [exit ' + r.exitCode + (firstLine(r.stderr) ? ': ' + firstLine(r.stderr) : '') + ']'
  for (let c = e.cause, depth = 0; c && depth < 3; c = c.cause, depth++) line += ' (cause: ' + (c.code ? c.code + ' ' : '') + firstLine(c.message) + ')'
  return line
}
export default class ErrorDetails {
  onTestRunEnd(modules) {
    const out = {}
    for (const m of modules) {
      for (const t of m.children.allTests()) {
        const errors = t.result().errors ?? []
        if (errors.length) out[m.moduleId + '::' + t.fullName] = describe(errors[0])
      }
    }
    writeFileSync(${JSON.stringify(detailsJson)}, JSON.stringify(out, null, 1))
  }
}
`);

// ---- 4. A Collimate server ---------------------------------------------------------------------

const freePort = () => new Promise<number>((done, fail) => {
  const s = createServer().once('error', fail).listen(0, '127.0.0.1', () => {
    const { port } = s.address() as { port: number };
    s.close(() => done(port));
  });
});
const home = join(work, 'home');
rmSync(home, { recursive: true, force: true });
const serverEnv: NodeJS.ProcessEnv = {
  ...process.env,
  COLLIMATE_CACHE_DIR: process.env.COLLIMATE_CACHE_DIR || '/var/tmp/collimate-test-cache',
  // Small warm pools and no admission by CPU pressure: the machine's two cores are shared, and a
  // create refused because another job is busy would measure the machine, not the door.
  COLLIMATE_POOL_SIZE: process.env.COLLIMATE_POOL_SIZE ?? '2',
  COLLIMATE_POOL_MAX: process.env.COLLIMATE_POOL_MAX ?? '4',
  COLLIMATE_HOST_CPU_PRESSURE_MAX: process.env.COLLIMATE_HOST_CPU_PRESSURE_MAX ?? '0',
};
const cli = (...args: string[]) => [process.execPath, ['--import', 'tsx', join(ROOT, 'src/cli/main.ts'), ...args]] as const;
const key = execFileSync(...cli('keys', 'create', '--tenant', 'e2b-suite', '--tier', 'pro', '--name', 'e2b-suite', '--e2b', '--home', home), { cwd: ROOT, env: serverEnv, encoding: 'utf8' }).trim().split('\n').pop()!;
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const serverLog = join(work, 'server.log');
const server: ChildProcess = spawn(...cli('serve', '--home', home, '--port', String(port)), { cwd: ROOT, env: serverEnv, stdio: ['ignore', 'pipe', 'pipe'] });
const logStream = createWriteStream(serverLog);
server.stdout!.pipe(logStream);
server.stderr!.pipe(logStream);
let serverExited = false;
server.once('exit', () => { serverExited = true; });
say(`collimate serve on ${base} (pid ${server.pid}, home ${home}, log ${serverLog})`);

let vitest: ChildProcess | undefined;
let stopped = false;
/** Deletes every sandbox the tests left, stops the server by its pid, and ends any QEMU of this home. */
async function stopServer(): Promise<void> {
  if (stopped) return;
  stopped = true;
  if (!serverExited) {
    try {
      const auth = { authorization: `Bearer ${key}` };
      const res = await fetch(`${base}/v1/sandboxes?limit=1000`, { headers: auth });
      const left = res.ok ? ((await res.json()) as { sandboxes: { id: string; state: string }[] }).sandboxes : [];
      if (left.length) say(`deleting ${left.length} sandboxes the tests left: ${left.map((s) => `${s.id} (${s.state})`).join(', ')}`);
      await Promise.all(left.map((s) => fetch(`${base}/v1/sandboxes/${s.id}`, { method: 'DELETE', headers: auth }).catch(() => {})));
    } catch (err) {
      say(`could not list what the tests left: ${(err as Error).message}`);
    }
    server.kill('SIGTERM');
    const exited = await Promise.race([new Promise((done) => server.once('exit', done)).then(() => true), sleep(60_000).then(() => false)]);
    if (!exited && !serverExited) { say('the server did not stop within 60 s: SIGKILL'); server.kill('SIGKILL'); }
  }
  // A VM the server leaves running (for a next server to adopt) is this run's own: its command line names this home.
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      if (!readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(home)) continue;
      say(`left running by the server: pid ${pid} (${readlinkSync(`/proc/${pid}/exe`)}); ending it`);
      process.kill(Number(pid), 'SIGKILL');
    } catch { /* gone meanwhile */ }
  }
  if (!opts.keep) rmSync(home, { recursive: true, force: true });
}
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    say(`${signal}: stopping vitest and the server`);
    if (vitest?.pid) vitest.kill('SIGTERM');
    void stopServer().finally(() => process.exit(130));
  });
}

async function sleep(ms: number) { await new Promise((done) => setTimeout(done, ms)); }

const t0 = Date.now();
let ready = false;
while (!ready) {
  if (serverExited) { say(`the server exited before it was ready; its log:\n${readFileSync(serverLog, 'utf8')}`); process.exit(2); }
  if (Date.now() - t0 > READY_TIMEOUT_MS) { say('the server was not ready in time'); await stopServer(); process.exit(2); }
  ready = await fetch(`${base}/healthz`).then((r) => r.status === 200, () => false);
  if (!ready) await sleep(500);
}
say(`ready after ${((Date.now() - t0) / 1000).toFixed(1)} s`);

// ---- 5. The run --------------------------------------------------------------------------------

const e2bEnv = {
  E2B_API_URL: `${base}/e2b/api`,
  E2B_SANDBOX_URL: `${base}/e2b/envd`,
  E2B_API_KEY: key,
  E2B_DOMAIN: `localhost:${port}`,
};
const vitestLog = join(work, 'vitest.log');
const tRun = Date.now();
const vitestStatus = await new Promise<number | null>((done) => {
  const env: NodeJS.ProcessEnv = { ...process.env, ...e2bEnv };
  delete env.E2B_DEBUG; // debug mode would skip the control plane
  if (!process.stderr.isTTY) env.NO_COLOR = '1'; // vitest.log stays plain text
  vitest = spawn(join(work, 'node_modules/.bin/vitest'), ['run', '--config', 'vitest.config.mjs'], { cwd: work, env, stdio: ['ignore', 'pipe', 'pipe'] });
  const out = createWriteStream(vitestLog);
  for (const s of [vitest.stdout!, vitest.stderr!]) { s.pipe(out, { end: false }); s.pipe(process.stderr, { end: false }); }
  vitest.once('exit', (code) => done(code));
});
const runSecs = (Date.now() - tRun) / 1000;
await stopServer();

// ---- The report --------------------------------------------------------------------------------

interface Assertion { ancestorTitles: string[]; title: string; fullName: string; status: string; failureMessages: string[] }
interface FileResult { name: string; status: string; message: string; assertionResults: Assertion[] }
let results: FileResult[] = [];
try {
  results = (JSON.parse(readFileSync(resultsJson, 'utf8')) as { testResults: FileResult[] }).testResults;
} catch {
  say(`vitest wrote no results (exit ${vitestStatus}); see ${vitestLog}`);
}
const firstLine = (s: string) => s.split('\n').map((l) => l.trim()).find((l) => l.length > 0) ?? '(no message)';
let details: Record<string, string> = {};
try { details = JSON.parse(readFileSync(detailsJson, 'utf8')) as Record<string, string>; } catch { /* the stacks' first lines only */ }
const SKIPPED = new Set(['skipped', 'pending', 'todo', 'disabled']);
const lines: string[] = [];
const out = (l = '') => lines.push(l);
let passed = 0, failed = 0, skipped = 0, fileErrors = 0;
const perFile: string[] = [];
const failures: string[] = [];
const byFile = new Map(results.map((r) => [relative(join(work, 'tests'), r.name), r]));
for (const file of selected) {
  const r = byFile.get(file);
  if (!r) { fileErrors++; perFile.push(`  ${'-'.padStart(4)} ${'-'.padStart(4)} ${'-'.padStart(4)}  ${file}  (no result)`); continue; }
  const n = { p: 0, f: 0, s: 0 };
  for (const a of r.assertionResults) {
    if (a.status === 'passed') n.p++;
    else if (a.status === 'failed') {
      n.f++;
      const name = [...a.ancestorTitles, a.title].join(' > ');
      failures.push(`  ${file} > ${name}\n      ${details[`${r.name}::${name}`] ?? firstLine(a.failureMessages.join('\n'))}`);
    } else if (SKIPPED.has(a.status)) n.s++;
  }
  passed += n.p; failed += n.f; skipped += n.s;
  const broken = r.status === 'failed' && n.f === 0 && r.message;
  if (broken) { fileErrors++; failures.push(`  ${file} (the file itself)\n      ${firstLine(r.message)}`); }
  perFile.push(`  ${String(n.p).padStart(4)} ${String(n.f).padStart(4)} ${String(n.s).padStart(4)}  ${file}${broken ? '  (file failed to run)' : ''}`);
}
const sha = execFileSync('git', ['-C', ROOT, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
out(`E2B's JS SDK suite (${TAG}, ${commit.slice(0, 12)}) with e2b ${SDK_VERSION} from npm, vitest ${installedVersion('vitest')}, against Collimate ${sha}`);
out(`${selected.length} files run in ${runSecs.toFixed(0)} s, ${workers} at a time; ${runnable.length - selected.length} runnable files not selected`);
out(`tests: ${passed} passed, ${failed} failed, ${skipped} skipped${fileErrors ? `; ${fileErrors} files failed to run` : ''}`);
out();
out('per file (passed failed skipped):');
for (const l of perFile) out(l);
out();
out(`failed (${failures.length}):`);
for (const l of failures) out(l);
for (const kind of ['excluded', 'not runnable from the npm package'] as const) {
  const list = verdicts.filter((v) => v.kind === kind);
  out();
  out(`${kind} (${list.length}):`);
  for (const v of list) out(`  ${v.file}: ${v.why}`);
}
const report = lines.join('\n') + '\n';
writeFileSync(join(work, 'summary.txt'), report);
process.stdout.write('\n' + report);
say(`results in ${work} (summary.txt, results.json, vitest.log, server.log)`);
process.exit(opts.strict && (failed > 0 || fileErrors > 0 || vitestStatus === null) ? 1 : 0);
