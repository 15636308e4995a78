// The cache check of scripts/test-node.sh: a better-sqlite3 build is used only when it loads under
// the Node.js it is for. The "build for another ABI" here is a real native module that registers
// itself with a NODE_MODULE_VERSION this Node.js does not have, which Node refuses exactly as it
// refused the build made against Node 20's headers for Node 24.
import { strict as assert } from 'node:assert';
import { execFileSync } from 'node:child_process';
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { BINDING, checkLoads, cleanEnv, ensureNativeModule } from '../../../scripts/nativeModule.ts';

const repoModules = join(import.meta.dirname, '..', '..', '..', 'node_modules');
const goodBinding = join(repoModules, BINDING);
const otherAbi = Number(process.versions.modules) === 137 ? 115 : 137;
let dir: string;
let foreign: string;

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'native-module-'));
  // A module that self-registers as built for `otherAbi` (struct node_module's first field).
  const src = join(dir, 'foreign.c');
  writeFileSync(src, `
    struct node_module { int nm_version; unsigned nm_flags; void *dso; const char *file; void *reg; void *ctx_reg; const char *name; void *priv; void *link; };
    extern void node_module_register(void *);
    static struct node_module m = { ${otherAbi}, 0, 0, __FILE__, 0, 0, "better_sqlite3", 0, 0 };
    __attribute__((constructor)) static void reg(void) { node_module_register(&m); }
  `);
  foreign = join(dir, 'foreign.node');
  execFileSync('gcc', ['-shared', '-fPIC', '-o', foreign, src]);
});

after(() => rmSync(dir, { recursive: true, force: true }));

/** A cache entry like test-node.sh's, its binding the given file. */
function cacheWith(name: string, binding: string): string {
  const deps = join(dir, name);
  for (const p of ['better-sqlite3', 'bindings', 'file-uri-to-path']) {
    cpSync(join(repoModules, p), join(deps, 'node_modules', p), { recursive: true, dereference: true, filter: (s) => !s.includes(`${join('better-sqlite3', 'build')}`) && !s.includes(join('better-sqlite3', 'deps')) });
  }
  mkdirSync(join(deps, 'node_modules', 'better-sqlite3', 'build', 'Release'), { recursive: true });
  copyFileSync(binding, join(deps, 'node_modules', BINDING));
  return deps;
}

test('a module built for another ABI is found by loading it, with the version it was built for', () => {
  const r = checkLoads(process.execPath, cacheWith('check-foreign', foreign));
  assert.equal(r.ok, false);
  assert.equal(r.modules, process.versions.modules);
  assert.match((r as { reason: string }).reason, new RegExp(`NODE_MODULE_VERSION ${otherAbi}\\b`));
  assert.deepEqual(checkLoads(process.execPath, cacheWith('check-good', goodBinding)), { ok: true, modules: process.versions.modules });
});

test('a cached module built for another ABI is rebuilt, not used; a good one is used as it is', () => {
  const deps = cacheWith('ensure', foreign);
  const builds: string[] = [];
  const build = (pkg: string) => {
    builds.push(pkg);
    mkdirSync(join(pkg, 'build', 'Release'), { recursive: true });
    copyFileSync(goodBinding, join(pkg, 'build', 'Release', 'better_sqlite3.node'));
    writeFileSync(join(pkg, 'build', 'Release', 'obj.o'), 'objects');
  };
  const first = ensureNativeModule({ node: process.execPath, deps, from: repoModules, build });
  assert.equal(builds.length, 1);
  assert.match(first.rebuilt ?? '', new RegExp(`does not load under this Node.js \\(ABI ${process.versions.modules}\\).*NODE_MODULE_VERSION ${otherAbi}`));
  assert.deepEqual(readFileSync(join(deps, 'node_modules', BINDING)), readFileSync(goodBinding), 'the cache now holds the new build');
  assert.ok(!existsSync(join(deps, 'node_modules', 'better-sqlite3', 'build', 'Release', 'obj.o')), 'only the module is kept');
  assert.equal(checkLoads(process.execPath, deps).ok, true);

  const second = ensureNativeModule({ node: process.execPath, deps, from: repoModules, build });
  assert.equal(builds.length, 1, 'a cached build that loads is not rebuilt');
  assert.equal(second.rebuilt, undefined);
});

test('a build that does not load is not cached, and the error says why in one line', () => {
  const deps = join(dir, 'bad-build');
  const build = (pkg: string) => {
    mkdirSync(join(pkg, 'build', 'Release'), { recursive: true });
    copyFileSync(foreign, join(pkg, 'build', 'Release', 'better_sqlite3.node'));
  };
  assert.throws(() => ensureNativeModule({ node: process.execPath, deps, from: repoModules, build }), (e: Error) => {
    assert.match(e.message, new RegExp(`^the new build does not load under this Node.js \\(ABI ${process.versions.modules}\\) either: .*NODE_MODULE_VERSION ${otherAbi}`));
    assert.doesNotMatch(e.message, /\n/);
    return true;
  });
  assert.ok(!existsSync(deps), 'nothing was cached');

  assert.throws(() => ensureNativeModule({ node: process.execPath, deps, from: repoModules, build: () => { throw new Error('node-gyp rebuild failed: gyp: Undefined variable'); } }), { message: /^node-gyp rebuild failed/ });
  assert.ok(!existsSync(deps));
});

test("npm's configuration does not reach the build", () => {
  const env = cleanEnv({ PATH: '/bin', npm_config_nodedir: '/usr', NPM_CONFIG_NODEDIR: '/usr', npm_package_config_node_gyp_nodedir: '/usr', npm_lifecycle_event: 'test' });
  assert.deepEqual(env, { PATH: '/bin', npm_lifecycle_event: 'test' });
});
