/**
 * better-sqlite3 built for another Node.js than the machine's, and cached only once it is known to
 * load there (scripts/test-node.sh).
 *
 * A cached build is checked by loading it under the Node.js it is for: a module made for another
 * ABI (NODE_MODULE_VERSION) fails there, and is rebuilt rather than used. The build itself runs
 * node-gyp with the target's headers and nothing of the caller's npm configuration: npm hands its
 * settings (~/.npmrc, e.g. `nodedir=/usr`) to every script it runs as `npm_config_*`, and node-gyp
 * lets those override its own command line, so a build started from `npm test` on such a machine
 * silently compiled against the machine's Node.js headers.
 *
 *   node --import tsx scripts/nativeModule.ts --node DIR/bin/node --nodedir DIR --out DEPS --from node_modules
 */
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

/** The packages better-sqlite3 loads its binding with, copied beside it. */
export const PACKAGES = ['better-sqlite3', 'bindings', 'file-uri-to-path'];
export const BINDING = 'better-sqlite3/build/Release/better_sqlite3.node';

export type LoadCheck = { ok: true; modules: string } | { ok: false; modules: string; reason: string };

/**
 * Loads the better-sqlite3 under `deps/node_modules` with `node` and runs one query. `modules` is
 * that Node.js's ABI (process.versions.modules); `reason` the first line of what failed.
 */
export function checkLoads(node: string, deps: string): LoadCheck {
  const probe = `
    const out = { modules: process.versions.modules };
    try {
      const Database = require(${JSON.stringify(join(deps, 'node_modules', 'better-sqlite3'))});
      const db = new Database(':memory:');
      if (db.prepare('select 41 + 1 as n').get().n !== 42) throw new Error('select 41 + 1 did not give 42');
      db.close();
      out.ok = true;
    } catch (e) {
      out.ok = false;
      out.reason = String(e && e.message || e).split('\\n').map((l) => l.trim()).filter(Boolean).join(' ');
    }
    console.log(JSON.stringify(out));`;
  const r = spawnSync(node, ['-e', probe], { encoding: 'utf8', env: cleanEnv(process.env), timeout: 60_000 });
  const last = r.stdout?.trim().split('\n').pop() ?? '';
  try {
    const v = JSON.parse(last) as { ok: boolean; modules: string; reason?: string };
    return v.ok ? { ok: true, modules: v.modules } : { ok: false, modules: v.modules, reason: v.reason ?? 'unknown' };
  } catch {
    const why = r.error ? r.error.message : `exit ${r.status ?? r.signal}: ${(r.stderr ?? '').trim().split('\n').pop() ?? ''}`;
    return { ok: false, modules: '?', reason: `${node} could not run the load check (${why})` };
  }
}

/**
 * The environment a native build runs in: the caller's, without npm's configuration (`npm_config_*`,
 * which node-gyp obeys over its command line, and `npm_package_config_node_gyp_*`).
 */
export function cleanEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(env)) {
    if (/^npm_config_/i.test(k) || /^npm_package_config_node_gyp_/i.test(k)) continue;
    out[k] = v;
  }
  return out;
}

/** Builds better-sqlite3 in `pkgDir` (a copy of the package); throws a one-line cause on failure. */
export type Builder = (pkgDir: string) => void;

/** node-gyp (npm's own) run by the target Node.js against the target's headers, in a clean environment. */
export function nodeGypBuilder(opts: { node: string; nodedir: string; gyp: string; log: (s: string) => void }): Builder {
  return (pkgDir) => {
    if (!existsSync(join(opts.nodedir, 'include', 'node', 'node.h'))) {
      throw new Error(`no Node.js headers in ${opts.nodedir}/include/node (node.h missing)`);
    }
    // A devdir of its own: node-gyp's global cache (~/.cache/node-gyp) may hold another Node's headers.
    const devdir = join(pkgDir, '..', '.node-gyp');
    const env = { ...cleanEnv(process.env), PATH: `${dirname(opts.node)}:${process.env.PATH ?? ''}` };
    const r = spawnSync(opts.node, [opts.gyp, 'rebuild', '--release', `--nodedir=${opts.nodedir}`, `--devdir=${devdir}`, '-j', 'max'], {
      cwd: pkgDir, env, encoding: 'utf8', maxBuffer: 64 << 20,
    });
    if (r.error) throw new Error(`node-gyp could not start: ${r.error.message}`);
    if (r.status !== 0) {
      const log = `${r.stdout}\n${r.stderr}`.trim().split('\n');
      opts.log(log.slice(-40).join('\n'));
      // The cause is gyp's own complaint ("gyp: …") or the compiler's first error, not node-gyp's summary after it.
      const cause = log.find((l) => /^gyp: /.test(l)) ?? log.find((l) => /\berror:|fatal error|No such file/i.test(l) && !/^gyp (ERR|info)/.test(l))
        ?? log.reverse().find((l) => /^gyp ERR! /.test(l) && !/^gyp ERR! (cwd|node -v|node-gyp -v|System|command|not ok|stack +at)/.test(l)) ?? `exit ${r.status}`;
      throw new Error(`node-gyp rebuild failed: ${cause.trim()}`);
    }
  };
}

export interface EnsureResult {
  /** The directory whose node_modules holds the checked build. */
  deps: string;
  /** Why it was (re)built; undefined when the cached build loaded. */
  rebuilt?: string;
  modules: string;
}

/**
 * A better-sqlite3 that loads under `node`, in `deps/node_modules`: the cached one when it does,
 * else built from the packages in `from` (a node_modules) by `build`, checked, and only then put
 * in place. Throws an Error with a one-line message when no working build can be made.
 */
export function ensureNativeModule(opts: { node: string; deps: string; from: string; build: Builder; log?: (s: string) => void }): EnsureResult {
  const log = opts.log ?? (() => {});
  let stale: string;
  if (existsSync(join(opts.deps, 'node_modules', BINDING))) {
    const cached = checkLoads(opts.node, opts.deps);
    if (cached.ok) return { deps: opts.deps, modules: cached.modules };
    stale = `the cached build does not load under this Node.js (ABI ${cached.modules}): ${cached.reason}`;
  } else {
    stale = 'none cached';
  }
  log(`rebuilding: ${stale}`);
  const parent = dirname(resolve(opts.deps));
  mkdirSync(parent, { recursive: true });
  const tmp = mkdtempSync(join(parent, '.deps-'));
  try {
    mkdirSync(join(tmp, 'node_modules'));
    for (const p of PACKAGES) {
      if (!existsSync(join(opts.from, p))) throw new Error(`${join(opts.from, p)} is missing: run npm ci first`);
      cpSync(join(opts.from, p), join(tmp, 'node_modules', p), { recursive: true, dereference: true });
    }
    const pkg = join(tmp, 'node_modules', 'better-sqlite3');
    rmSync(join(pkg, 'build'), { recursive: true, force: true });
    opts.build(pkg);
    if (!existsSync(join(tmp, 'node_modules', BINDING))) throw new Error(`the build made no ${BINDING}`);
    const built = checkLoads(opts.node, tmp);
    if (!built.ok) throw new Error(`the new build does not load under this Node.js (ABI ${built.modules}) either: ${built.reason}`);
    // Only the module is needed at run time; the objects and the SQLite sources are most of the size.
    for (const e of readdirSync(join(pkg, 'build'))) if (e !== 'Release') rmSync(join(pkg, 'build', e), { recursive: true, force: true });
    for (const e of readdirSync(join(pkg, 'build', 'Release'))) if (e !== 'better_sqlite3.node') rmSync(join(pkg, 'build', 'Release', e), { recursive: true, force: true });
    rmSync(join(pkg, 'deps'), { recursive: true, force: true });
    rmSync(join(tmp, '.node-gyp'), { recursive: true, force: true });
    writeFileSync(join(tmp, 'abi.json'), `${JSON.stringify({ modules: built.modules, node: opts.node })}\n`);
    rmSync(opts.deps, { recursive: true, force: true });
    renameSync(tmp, opts.deps);
    return { deps: opts.deps, rebuilt: stale, modules: built.modules };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

function main(): number {
  const { values } = parseArgs({ options: { node: { type: 'string' }, nodedir: { type: 'string' }, out: { type: 'string' }, from: { type: 'string' }, gyp: { type: 'string' } } });
  const { node, nodedir, out, from, gyp } = values;
  if (!node || !nodedir || !out || !from || !gyp) {
    process.stderr.write('usage: nativeModule.ts --node BIN --nodedir DIR --out DEPS --from NODE_MODULES --gyp NODE_GYP_JS\n');
    return 2;
  }
  const version = JSON.parse(readFileSync(join(from, 'better-sqlite3', 'package.json'), 'utf8')).version as string;
  const log = (s: string) => process.stderr.write(`test-node: ${s}\n`);
  try {
    const r = ensureNativeModule({ node, deps: out, from, build: nodeGypBuilder({ node, nodedir, gyp, log: (s) => process.stderr.write(`${s}\n`) }), log });
    if (r.rebuilt) log(`built better-sqlite3 ${version} for ABI ${r.modules} (${node}), checked and cached in ${out}`);
    return 0;
  } catch (e) {
    process.stderr.write(`test-node: cannot make better-sqlite3 ${version} for ${node}: ${(e as Error).message}\n`);
    return 1;
  }
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(new URL(import.meta.url).pathname)) process.exitCode = main();
