// Builds every guest asset and bakes every catalog template once, with progress, so that the first
// `serve` or test run does not pay for it inside a request or a test timeout. Idempotent.
// `prepare.ts [id…]` limits it to those catalog templates (the guest assets are always built).
import { loadConfig } from '../src/config.ts';
import { CATALOG, loadCatalog } from '../src/images/templates.ts';

const only = process.argv.slice(2);
const unknown = only.filter((id) => !CATALOG.some((e) => e.id === id));
if (unknown.length) {
  console.error(`[prepare] not in the catalog: ${unknown.join(', ')} (it has ${CATALOG.map((e) => e.id).join(', ')})`);
  process.exit(2);
}
const cfg = loadConfig();
const t0 = Date.now();
const templates = await loadCatalog(cfg, (m) => console.error(`[prepare ${((Date.now() - t0) / 1000).toFixed(1)}s] ${m}`), only.length ? only : undefined);
console.error(`[prepare] ready: ${templates.map((t) => t.id).join(', ')} (cache ${cfg.cacheDir}, accel ${cfg.accel.accel}: ${cfg.accel.reason})`);
