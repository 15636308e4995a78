// A server stand-in for crash tests: opens an engine on a home, runs one operation, and SIGKILLs
// itself at the named fault point inside it (COLLIMATE_CRASH_AT), like a server killed mid-request.
// Usage: crashWorker.ts <home> <cacheDir> setup|fork|snapshot|suspend|resume|resume-on-receiver|suspend-after-resume-on-receiver|create-and-suspend|bake [sandboxId | bake nonce]
import { readdirSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { Engine } from '../../src/sandboxes/engine.ts';
import { loadConfig } from '../../src/config.ts';
import { bakeRecipe } from '../../src/images/templates.ts';
import { ensureBaseRootfs } from '../../src/images/guestAssets.ts';
import { homePaths } from '../../src/host/paths.ts';

const [home, cacheDir, op, id] = process.argv.slice(2);
const crashAt = process.env.COLLIMATE_CRASH_AT;
// Ops that do something first (on a receiver) arm the crash only for their last step.
let armed = !op.includes('on-receiver');
if (op === 'bake') {
  // A template bake whose ready command (made unique by `id`) is running when the server dies:
  // prints the bake's build directory, then SIGKILLs itself with the bake VMM up.
  const cfg = loadConfig({ home, cacheDir });
  const layers = [await ensureBaseRootfs(cfg.cacheDir, () => {})];
  await bakeRecipe(cfg, {
    id: 'crash-bake', tenant: 'crash', description: 'interrupted bake', interpreter: ['/bin/sh', '-c'], layers,
    vcpus: 1, memoryMib: 256, diskMib: 64, ready: { command: `sleep 600 # ${id}` },
  }, () => {}, (chunk) => {
    if (!chunk.startsWith('$ ')) return;
    const artifacts = homePaths(cfg.cacheDir).artifacts;
    const dirs = readdirSync(artifacts).flatMap((k) => (existsSync(join(artifacts, k)) ? readdirSync(join(artifacts, k)) : [])
      .filter((d) => d.startsWith('tmp-') && d.endsWith(`-${process.pid}`)).map((d) => join(artifacts, k, d)));
    console.log(JSON.stringify({ buildDir: dirs[0] }));
    process.kill(process.pid, 'SIGKILL');
  });
}
const engine = await Engine.open({
  home,
  cacheDir,
  poolSize: 1,
  faultPoint: (name) => {
    if (armed && name === crashAt) process.kill(process.pid, 'SIGKILL');
  },
});
const tenant = { tenant: 'crash' };
if (op === 'setup') {
  const sb = await engine.create({ template: 'base' }, tenant);
  await engine.exec(sb.id, { command: 'echo before > /root/marker; (i=0; while true; do i=$((i+1)); echo $i > /root/counter.new; mv /root/counter.new /root/counter; sleep 0.2; done) >/dev/null 2>&1 &' });
  console.log(JSON.stringify({ id: sb.id }));
} else if (op === 'fork') {
  await engine.fork(id, { count: 4 });
  console.log(JSON.stringify({ done: true }));
} else if (op === 'snapshot') {
  await engine.createSnapshot(id, { name: 'crash' }, tenant);
  console.log(JSON.stringify({ done: true }));
} else if (op === 'suspend') {
  await engine.suspend(id);
  console.log(JSON.stringify({ done: true }));
} else if (op === 'resume') {
  await engine.resume(id);
  console.log(JSON.stringify({ done: true }));
} else if (op === 'resume-on-receiver' || op === 'suspend-after-resume-on-receiver') {
  // A first resume asks for a VMM spawned ahead (a fork receiver); the second takes it.
  await engine.resume(id);
  await engine.suspend(id);
  const key = engine.repo.get(id)!.vmm!.artifactKey;
  while ((engine.forkReceiverSizes()[key]?.ready ?? 0) < 1) await new Promise((r) => setTimeout(r, 100));
  if (op === 'resume-on-receiver') armed = true;
  await engine.resume(id);
  if (op === 'suspend-after-resume-on-receiver') {
    // The receiver's directory, which the suspend removes last.
    console.log(JSON.stringify({ receiverDir: engine.repo.get(id)!.vmm!.dir }));
    armed = true;
    await engine.suspend(id);
  }
  console.log(JSON.stringify({ done: true }));
} else if (op === 'create-and-suspend') {
  const sb = await engine.create({ template: 'base' }, tenant);
  await engine.exec(sb.id, { command: 'echo kept > /root/marker; (i=0; while true; do i=$((i+1)); echo $i > /root/counter.new; mv /root/counter.new /root/counter; sleep 0.2; done) >/dev/null 2>&1 &' });
  await engine.suspend(sb.id);
  console.log(JSON.stringify({ id: sb.id }));
}
// Exit without closing: a server that dies leaves its VMMs to the next start.
process.kill(process.pid, 'SIGKILL');
