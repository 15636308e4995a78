// Restore stress (issue: restores that never hang). Restores — warm-pool prewarms, creates, fork
// children and resumes — while two guests run busy loops on the host's cores, until N restores have
// been made; counts those whose guest never acknowledged and writes each one's interrupt and virtio
// state (Vmm.interruptState) to the report file.
// Usage: node --import tsx bench/restore-stress.ts [--restores 3000] [--busy 2] [--report /tmp/restore-stress.txt]
import { appendFileSync, rmSync, writeFileSync } from 'node:fs';
import { Engine } from '../src/sandboxes/engine.ts';
import { restoreCounts, restoreEvents, type RestoreUnacknowledgedError } from '../src/sandboxes/runtime.ts';

const argOf = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const RESTORES = Number(argOf('restores', '3000'));
const BUSY = Number(argOf('busy', '2'));
const REPORT = argOf('report', '/tmp/restore-stress.txt');
const home = `/tmp/collimate-bench-restore-${process.pid}`;
const tenant = { tenant: 'bench' };
const log = (m: string) => console.error(`[bench] ${m}`);
writeFileSync(REPORT, '');
restoreEvents.on('unacknowledged', (e: RestoreUnacknowledgedError) => {
  log(`UNACKNOWLEDGED restore #${restoreCounts.unacknowledged} (after ${restoreCounts.acknowledged} acknowledged)`);
  appendFileSync(REPORT, `==== unacknowledged restore at ${new Date().toISOString()}\n${e.diagnostics ?? '(no diagnostics)'}\n\n`);
});

const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 2, catalog: ['base'], progress: log });
const busy = [];
for (let i = 0; i < BUSY; i++) {
  const s = await engine.create({ template: 'base' }, tenant);
  await engine.exec(s.id, { command: '(while :; do :; done) >/dev/null 2>&1 &' }, tenant);
  busy.push(s);
}
const t0 = Date.now();
let failures = 0;
let round = 0;
while (restoreCounts.acknowledged + restoreCounts.unacknowledged < RESTORES) {
  round++;
  try {
    const s = await engine.create({ template: 'base' }, tenant);
    await engine.exec(s.id, { command: 'echo $((1+1)) > /root/x' }, tenant);
    const kids = await engine.fork(s.id, { count: 2 }, tenant);
    for (const k of kids) await engine.exec(k.id, { command: 'cat /root/x' }, tenant);
    if (round % 3 === 0) {
      await engine.suspend(s.id, tenant);
      await engine.resume(s.id, tenant);
      await engine.exec(s.id, { command: 'true' }, tenant);
    }
    for (const k of kids) await engine.delete(k.id, tenant);
    await engine.delete(s.id, tenant);
  } catch (e) {
    failures++;
    log(`round ${round} failed: ${(e as Error).message}`);
    for (const row of engine.list({ limit: 1000 }, tenant).sandboxes) if (!busy.some((b) => b.id === row.id)) await engine.delete(row.id, tenant).catch(() => {});
  }
  if (round % 10 === 0) log(`round ${round}: ${restoreCounts.acknowledged} acknowledged, ${restoreCounts.unacknowledged} unacknowledged, ${failures} failed rounds, ${((Date.now() - t0) / 1000).toFixed(0)} s`);
}
const total = restoreCounts.acknowledged + restoreCounts.unacknowledged;
console.log(`restores: ${total} in ${((Date.now() - t0) / 1000).toFixed(0)} s under ${BUSY} busy guests; unacknowledged: ${restoreCounts.unacknowledged}; failed rounds: ${failures}; report: ${REPORT}`);
await engine.deleteAll();
await engine.close();
rmSync(home, { recursive: true, force: true });
