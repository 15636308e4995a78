// Warm pools on a bursty demand trace (issue: capacity follows demand). The same trace twice, in one
// run: a fixed pool of 4 (COLLIMATE_POOL_MIN = MAX = 4, the earlier behaviour) and the self-sizing
// pool (poolSizer.ts). Trace: quiet → a burst of N creates over ~2 s → the burst's sandboxes are
// deleted → quiet → the same burst again. Reports the warm-hit ratio and create latency per burst.
// Usage: node --import tsx bench/pool-trace.ts [--burst 30] [--quiet-secs 30]
import { rmSync } from 'node:fs';
import { Engine } from '../src/sandboxes/engine.ts';
import { summary, fmt, timed } from './stats.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const BURST = arg('burst', 30);
const QUIET_MS = arg('quiet-secs', 30) * 1000;
const tenant = { tenant: 'bench' };
const log = (m: string) => console.error(`[bench] ${m}`);

async function trace(label: string, bounds: { poolMin: number; poolMax: number }): Promise<string[]> {
  const home = `/tmp/collimate-bench-pool-${process.pid}-${label.replace(/\W+/g, '-')}`;
  const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 4, catalog: ['base'], ...bounds, progress: log });
  const rows: string[] = [];
  try {
    for (const round of [1, 2]) {
      await new Promise((r) => setTimeout(r, QUIET_MS));
      const before = engine.poolStatus().base;
      const results = await Promise.all(Array.from({ length: BURST }, async (_, i) => {
        await new Promise((r) => setTimeout(r, (i * 2000) / BURST));
        return timed(() => engine.create({ template: 'base' }, tenant));
      }));
      const after = engine.poolStatus().base;
      const ms = summary(results.map(([t]) => t));
      const hits = after.hits - before.hits;
      rows.push(`| ${label} | burst ${round} | ${hits} / ${BURST} (${Math.round((hits / BURST) * 100)} %) | ${fmt(ms.p50)} ms | ${fmt(ms.p99)} ms | ${before.target} → ${after.target} |`);
      log(rows.at(-1)!);
      for (const [, s] of results) await engine.delete(s.id);
    }
  } finally {
    await engine.deleteAll();
    await engine.close();
    rmSync(home, { recursive: true, force: true });
  }
  return rows;
}

const fixed = await trace('fixed pool of 4', { poolMin: 4, poolMax: 4 });
const sized = await trace('self-sizing pool', { poolMin: 0, poolMax: 32 });
console.log([
  `## Warm pools on a bursty trace — quiet ${QUIET_MS / 1000} s, then ${BURST} creates over 2 s, twice`,
  '',
  '| pool | | creates from the pool | create p50 | create p99 | pool size before → after the burst |',
  '|---|---|---|---|---|---|',
  ...fixed,
  ...sized,
].join('\n'));
