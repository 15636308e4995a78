// Builds every guest asset and bakes every catalog template once, with progress, so that the first
// `serve` or test run does not pay for it inside a request or a test timeout. Idempotent.
import { loadConfig } from '../src/config.ts';
import { loadCatalog } from '../src/images/templates.ts';

const cfg = loadConfig();
const t0 = Date.now();
const templates = await loadCatalog(cfg, (m) => console.error(`[prepare ${((Date.now() - t0) / 1000).toFixed(1)}s] ${m}`));
console.error(`[prepare] ready: ${templates.map((t) => t.id).join(', ')} (cache ${cfg.cacheDir}, accel ${cfg.accel.accel}: ${cfg.accel.reason})`);
