// Cold-boot bakes in a loop: the path that once left a guest whose agent never answered in 120 s
// (an image environment's bake in the images suite, 2026-12-03, not reproduced since). Each round
// bakes an environment of a busybox image with a ready command of its own (a new artifact key, so a
// cold boot every time), then deletes it. A failed bake prints its error, which carries the guest
// console's tail, and the run goes on; the summary counts them.
//
// Usage: COLLIMATE_CACHE_DIR=/var/tmp/collimate-test-cache node --import tsx bench/cold-bakes.ts [--bakes 50]
// Run two at once to have two guests booting on the two cores, as the suite's concurrency does.
import { mkdirSync, rmSync, utimesSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Engine } from '../src/sandboxes/engine.js';
import { ImageService } from '../src/images/service.js';
import '../src/service/migrations.js';
import { busyboxEntries, image, layer, writeLayout } from '../test/support/oci.js';
import { percentile } from './stats.js';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const BAKES = arg('bakes', 50);
const home = `/tmp/collimate-bench-bakes-${process.pid}`;
const log = (m: string) => console.error(`[bakes ${process.pid}] ${m}`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 0, catalog: [], progress: () => {} });
engine.cfg.host.cpuPressureMax = 0;
const images = new ImageService({ host: engine, db: engine.db, importDir: join(home, 'imports'), storeDir: join(home, 'store'), poolSize: 0 });
await images.restore();
const tenant = 'bench';
mkdirSync(join(home, 'imports'), { recursive: true });
const img = image([layer(busyboxEntries(), 'gzip')], { Env: ['PATH=/usr/sbin:/usr/bin:/sbin:/bin'] });
let row = await images.pull(tenant, { kind: 'oci-layout', path: writeLayout(join(home, 'imports', 'busybox'), img) });
while (row.state === 'pulling') {
  await sleep(200);
  row = images.image(tenant, row.id);
}
if (row.state !== 'ready') throw new Error(`the image did not register: ${row.error}`);

const ms: number[] = [];
const failures: string[] = [];
for (let i = 0; i < BAKES; i++) {
  const name = `cold-${i}`;
  const t0 = performance.now();
  images.createEnvironment(tenant, { name, image: row.id, readyCommand: `echo round ${i} of ${process.pid}`, egress: 'none' });
  let env = images.environment(tenant, name);
  while (env.state === 'pending' || env.state === 'baking') {
    await sleep(100);
    env = images.environment(tenant, name);
  }
  if (env.state === 'ready') ms.push(performance.now() - t0);
  else {
    failures.push(`round ${i}: ${env.error}`);
    log(`round ${i} FAILED after ${Math.round(performance.now() - t0)} ms:\n${env.error}\n${env.log}`);
  }
  const artifactDir = engine.templatePools.get(`${tenant}/${name}`)?.artifact.dir;
  await images.deleteEnvironment(tenant, name);
  // Its RAM file goes now, as the collector would take it an hour later: a loop would fill tmpfs first.
  if (artifactDir) {
    const longAgo = new Date(Date.now() - 2 * 3600_000);
    utimesSync(join(dirname(artifactDir), 'claimed-at'), longAgo, longAgo);
    engine.collectArtifacts();
  }
  if (i % 10 === 9) log(`${i + 1} bakes, ${failures.length} failed`);
}
await images.close();
await engine.close();
rmSync(home, { recursive: true, force: true });
console.log(`cold bakes: ${ms.length} ready, ${failures.length} failed; bake p50 ${percentile(ms, 50).toFixed(0)} ms, p99 ${percentile(ms, 99).toFixed(0)} ms`);
for (const f of failures) console.log(f);
process.exit(failures.length ? 1 : 0);
