/**
 * Bundles the web console (src/console) into dist/console with esbuild: console.js (the app with
 * xterm.js and uPlot inside), console.css and index.html. Nothing is fetched at run time. Rebuilds
 * only when a source is newer than the bundle, so set-up can call it every time.
 *
 *   node --import tsx scripts/build-console.ts [--force]
 */
import { copyFileSync, existsSync, mkdirSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SRC = join(ROOT, 'src/console');
const OUT = join(ROOT, 'dist/console');
const OUTPUTS = ['index.html', 'console.js', 'console.css'].map((f) => join(OUT, f));

function newest(dir: string): number {
  return Math.max(...readdirSync(dir, { withFileTypes: true }).map((e) => (e.isDirectory() ? newest(join(dir, e.name)) : statSync(join(dir, e.name)).mtimeMs)));
}

function upToDate(): boolean {
  if (!OUTPUTS.every(existsSync)) return false;
  const built = Math.min(...OUTPUTS.map((f) => statSync(f).mtimeMs));
  const deps = ['package-lock.json'].map((f) => statSync(join(ROOT, f)).mtimeMs);
  return built > Math.max(newest(SRC), ...deps);
}

if (!process.argv.includes('--force') && upToDate()) process.exit(0);
mkdirSync(OUT, { recursive: true });
await build({
  entryPoints: { console: join(SRC, 'app.ts') },
  bundle: true,
  format: 'esm',
  target: 'es2022',
  minify: true,
  sourcemap: false,
  legalComments: 'linked',
  outdir: OUT,
  logLevel: 'warning',
});
await build({
  entryPoints: { console: join(SRC, 'console.css') },
  bundle: true,
  minify: true,
  outdir: OUT,
  logLevel: 'warning',
});
copyFileSync(join(SRC, 'index.html'), join(OUT, 'index.html'));
console.error(`collimate setup: console bundled into ${OUT}`);
