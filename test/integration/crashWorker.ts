// A server stand-in for crash tests: opens an engine on a home, runs one operation, and SIGKILLs
// itself at the named fault point inside it (COLLIMATE_CRASH_AT), like a server killed mid-request.
// Usage: crashWorker.ts <home> <cacheDir> setup|fork|suspend [sandboxId]
import { Engine } from '../../src/sandboxes/engine.ts';

const [home, cacheDir, op, id] = process.argv.slice(2);
const crashAt = process.env.COLLIMATE_CRASH_AT;
const engine = await Engine.open({
  home,
  cacheDir,
  poolSize: 1,
  faultPoint: (name) => {
    if (name === crashAt) process.kill(process.pid, 'SIGKILL');
  },
});
const tenant = { tenant: 'crash' };
if (op === 'setup') {
  const sb = await engine.create({ template: 'base' }, tenant);
  await engine.exec(sb.id, { command: 'echo before > /root/marker; (i=0; while true; do i=$((i+1)); echo $i > /root/counter; sleep 0.2; done) >/dev/null 2>&1 &' });
  console.log(JSON.stringify({ id: sb.id }));
} else if (op === 'fork') {
  await engine.fork(id, { count: 4 });
  console.log(JSON.stringify({ done: true }));
} else if (op === 'suspend') {
  await engine.suspend(id);
  console.log(JSON.stringify({ done: true }));
} else if (op === 'create-and-suspend') {
  const sb = await engine.create({ template: 'base' }, tenant);
  await engine.exec(sb.id, { command: 'echo kept > /root/marker; (i=0; while true; do i=$((i+1)); echo $i > /root/counter; sleep 0.2; done) >/dev/null 2>&1 &' });
  await engine.suspend(sb.id);
  console.log(JSON.stringify({ id: sb.id }));
}
// Exit without closing: a server that dies leaves its VMMs to the next start.
process.kill(process.pid, 'SIGKILL');
