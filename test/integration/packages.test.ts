/**
 * The SDKs as a user installs them, against a real server on real microVMs (started here as in
 * sdk.test.ts; the suite ends with the leak check).
 *
 * - TypeScript: `npm pack` in sdk/typescript (it builds the package first), then the tarball alone is
 *   installed offline into a fresh project outside the repository. The project's only other files
 *   are the user's programs — the docs' quickstart and RL example, which import nothing but
 *   `@collimate/sdk` — type-checked against the installed declarations, compiled and run with plain
 *   `node`.
 * - Python: `pip wheel` (offline, Debian's setuptools) builds the wheel from a copy of sdk/python,
 *   and the wheel alone is installed into a fresh virtualenv, whose interpreter runs the quickstart
 *   and the RL example in isolated mode (no PYTHONPATH, no user site, not the script's directory).
 *
 * The examples get an environment of PATH, HOME and the server's address and key only.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { assertNoLeaks, createKey, EXAMPLE_OUTPUT, openEngine, serveEngine, testHome, type Served } from './fixture.ts';

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PYTHON = '/usr/bin/python3';
const SERVER_VERSION: string = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).version;

let engine: Engine;
let home: string;
let api: Served;
let userEnv: NodeJS.ProcessEnv;
const workDirs: string[] = [];

function workDir(name: string): string {
  const dir = mkdtempSync(join(tmpdir(), `collimate-${name}-`));
  workDirs.push(dir);
  return dir;
}

/** Runs a command; fails the test with its output when it exits non-zero. */
async function runOk(file: string, args: string[], opts: { cwd: string; env?: NodeJS.ProcessEnv; timeout?: number }): Promise<string> {
  const r = await run(file, args, { timeout: 300_000, maxBuffer: 16 << 20, ...opts }).catch((e) => e);
  assert.equal(r.code ?? 0, 0, `${file} ${args.join(' ')} failed:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** A docs example as the user's program: checked to import nothing but the SDK (and Node's built-ins). */
function example(file: string, allowed: RegExp): string {
  const source = readFileSync(join(ROOT, 'docs/examples', file), 'utf8');
  const imports = [...source.matchAll(/^\s*(?:import .* from|import|from) +['"]?([\w@/.:-]+)['"]?/gm)].map((m) => m[1]);
  assert.ok(imports.length > 0, `${file} imports the SDK`);
  for (const spec of imports) assert.match(spec, allowed, `${file} imports ${spec}`);
  return source;
}

function assertPrints(file: string, stdout: string): void {
  for (const p of EXAMPLE_OUTPUT[file]) assert.match(stdout, p, `${file}:\n${stdout}`);
}

before(async () => {
  home = testHome('packages');
  engine = await openEngine(home);
  api = await serveEngine(engine);
  const baseUrl = await api.app.listen({ host: '127.0.0.1', port: 0 });
  const apiKey = await createKey(home, 'packages', 'pro');
  userEnv = { PATH: process.env.PATH, HOME: process.env.HOME, COLLIMATE_BASE_URL: baseUrl, COLLIMATE_API_KEY: apiKey };
});

after(async () => {
  await api?.close(1000);
  await assertNoLeaks(engine, home);
  for (const dir of workDirs) rmSync(dir, { recursive: true, force: true });
});

test('TypeScript: the packed @collimate/sdk installs offline into a fresh project, type-checks, and runs the quickstart and the RL example', async () => {
  const work = workDir('ts');
  const packed = JSON.parse(await runOk('npm', ['pack', '--json', '--pack-destination', work], { cwd: join(ROOT, 'sdk/typescript') }))[0];
  assert.equal(packed.name, '@collimate/sdk');
  assert.equal(packed.version, SERVER_VERSION);
  const contents: string[] = packed.files.map((f: { path: string }) => f.path);
  for (const f of ['package.json', 'README.md', 'dist/index.js', 'dist/index.d.ts', 'dist/rl/index.js', 'dist/rl/index.d.ts', 'dist/wire.generated.d.ts']) {
    assert.ok(contents.includes(f), `the tarball has ${f}`);
  }
  assert.deepEqual(contents.filter((f) => !/^(package\.json|README\.md|dist\/.+\.(js|d\.ts))$/.test(f)), [], 'only the built package');

  // A fresh project that has the tarball, and the user's programs.
  const app = join(work, 'app');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'sdk-user', private: true, type: 'module' }));
  await runOk('npm', ['install', '--offline', '--no-audit', '--no-fund', join(work, packed.filename)], { cwd: app, env: userEnv });
  assert.deepEqual(readdirSync(join(app, 'node_modules')).sort(), ['.package-lock.json', '@collimate'], 'no dependency came with it');
  const programs = ['quickstart.ts', 'best_of_n.ts'];
  for (const p of programs) writeFileSync(join(app, p), example(p, /^@collimate\/sdk(\/rl)?$/));

  // Type-checked against the package's own declarations (@types/node is all it borrows).
  const tsconfig = {
    compilerOptions: {
      target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, outDir: 'out',
      lib: ['ES2023', 'esnext.disposable'], types: ['node'], typeRoots: [join(ROOT, 'node_modules/@types')],
    },
    files: programs,
  };
  writeFileSync(join(app, 'tsconfig.json'), JSON.stringify(tsconfig, null, 2));
  await runOk(join(ROOT, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json'], { cwd: app });

  const resolved = await runOk(process.execPath, ['--input-type=module', '-e', "console.log(import.meta.resolve('@collimate/sdk/rl'))"], { cwd: app, env: userEnv });
  assert.equal(resolved.trim(), `file://${app}/node_modules/@collimate/sdk/dist/rl/index.js`, 'the installed copy, by the exports map');

  for (const p of programs) {
    const stdout = await runOk(process.execPath, [join('out', p.replace(/\.ts$/, '.js'))], { cwd: app, env: userEnv, timeout: 180_000 });
    assertPrints(p, stdout);
  }
});

test('Python: the wheel builds offline, installs into a fresh virtualenv, and runs the quickstart and the RL example there', async () => {
  const work = workDir('py');
  // Built from a copy, so the build leaves nothing in the repository (build/, *.egg-info).
  const source = join(work, 'src');
  cpSync(join(ROOT, 'sdk/python'), source, { recursive: true, filter: (p) => !/(__pycache__|\.egg-info|\/build)$/.test(p) });
  const dist = join(work, 'dist');
  await runOk(PYTHON, ['-m', 'pip', 'wheel', '--no-build-isolation', '--no-index', '--no-deps', '--quiet', '-w', dist, source], { cwd: work });
  const wheel = `collimate-${SERVER_VERSION}-py3-none-any.whl`;
  assert.deepEqual(readdirSync(dist), [wheel]);

  const venv = join(work, 'venv');
  await runOk(PYTHON, ['-m', 'venv', venv], { cwd: work });
  await runOk(join(venv, 'bin/pip'), ['install', '--no-index', '--no-deps', '--quiet', join(dist, wheel)], { cwd: work, env: userEnv });
  const python = join(venv, 'bin/python');
  const probe = await runOk(
    python,
    ['-I', '-c', "import collimate, collimate_rl, importlib.metadata as m; d = m.metadata('collimate'); print(collimate.__file__, collimate_rl.__file__, d['Version'], d['Requires-Python'], d['License'], bool(d['Summary']), bool(d.get_payload()), sep='\\n')"],
    { cwd: work, env: userEnv },
  );
  const site = `${venv}/lib/python3.`;
  const [pkg, rl, version, requires, license, summary, readme] = probe.trim().split('\n');
  assert.ok(pkg.startsWith(site) && rl.startsWith(site), `imported from the virtualenv: ${pkg}, ${rl}`);
  assert.deepEqual([version, requires, license, summary, readme], [SERVER_VERSION, '>=3.9', 'UNLICENSED', 'True', 'True']);

  for (const p of ['quickstart.py', 'best_of_n.py']) {
    example(p, /^(collimate|collimate_rl|sys)$/);
    const stdout = await runOk(python, ['-I', join(ROOT, 'docs/examples', p)], { cwd: work, env: userEnv, timeout: 180_000 });
    assertPrints(p, stdout);
  }
});
