// Networking benchmark (issue: networking). In one run, side by side, interleaved:
//   warm create with networking on (namespace + tap + the template's "allow" policy in place) vs off
//   (no NIC); a create that narrows the policy (one nft ruleset applied on the create path);
//   fork(1) with networking on vs off; a namespace made from scratch (what the pool keeps off the path).
// Usage: node --import tsx bench/network.ts [--creates 100] [--forks 8]
import { rmSync } from 'node:fs';
import { Engine } from '../src/sandboxes/engine.ts';
import { netSettings } from '../src/config.ts';
import { NetManager } from '../src/net/netns.ts';
import type { EgressPolicy } from '../src/net/policy.ts';
import { summary, fmt, timed } from './stats.ts';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const CREATES = arg('creates', 100);
const FORKS = arg('forks', 8);
const tenant = { tenant: 'bench' };
const log = (m: string) => console.error(`[bench] ${m}`);
const homes = { on: `/tmp/collimate-bench-net-on-${process.pid}`, off: `/tmp/collimate-bench-net-off-${process.pid}` };

const open = (mode: 'on' | 'off') => Engine.open({
  home: homes[mode], cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: 4, catalog: ['base'], progress: log,
  net: { ...netSettings(), mode },
});
const engines = { on: await open('on'), off: await open('off') };
const pools = { on: engines.on.templatePools.pool('base')!, off: engines.off.templatePools.pool('base')! };

async function create(mode: 'on' | 'off', egress?: EgressPolicy): Promise<number> {
  await pools[mode].waitFull(60_000);
  const [ms, sb] = await timed(() => engines[mode].create({ template: 'base', ...(egress ? { egress } : {}) }, tenant));
  await engines[mode].delete(sb.id);
  return ms;
}

const ms = { on: [] as number[], off: [] as number[], narrowed: [] as number[] };
log(`warm creates x${CREATES} each, interleaved`);
for (let i = 0; i < CREATES; i++) {
  ms.off.push(await create('off'));
  ms.on.push(await create('on'));
  ms.narrowed.push(await create('on', { domains: ['pypi.org'], cidrs: [], ports: [] }));
}

log(`fork(1) x${FORKS} each`);
const forkMs = { on: [] as number[], off: [] as number[] };
for (const mode of ['off', 'on'] as const) {
  const sb = await engines[mode].create({ template: 'base' }, tenant);
  for (let i = 0; i < FORKS; i++) {
    const [t, kids] = await timed(() => engines[mode].fork(sb.id, { count: 1 }, tenant));
    forkMs[mode].push(t);
    for (const k of kids) await engines[mode].delete(k.id);
  }
  await engines[mode].delete(sb.id);
}

log('namespace from scratch x20');
const nsMs: number[] = [];
const m = await NetManager.open(netSettings(), { tag: 'b0000000000b', poolSize: 0 });
for (let i = 0; i < 20; i++) {
  const [t, rec] = await timed(() => m!.acquire());
  nsMs.push(t);
  await m!.release(rec);
}
await m!.close();

for (const e of Object.values(engines)) { await e.deleteAll(); await e.close(); }
for (const h of Object.values(homes)) rmSync(h, { recursive: true, force: true });

const row = (name: string, v: number[]) => {
  const s = summary(v);
  return `| ${name} | ${s.n} | ${fmt(s.p50)} | ${fmt(s.p99)} |`;
};
const on = summary(ms.on), off = summary(ms.off);
console.log(['| measurement | n | p50 ms | p99 ms |', '|---|---|---|---|',
  row('create, networking off (no NIC)', ms.off), row('create, networking on (template policy "allow")', ms.on),
  row('create, networking on, narrowed policy (nft on the create path)', ms.narrowed),
  row('fork(1), networking off', forkMs.off), row('fork(1), networking on', forkMs.on),
  row('namespace + veth + base ruleset from scratch (pooled)', nsMs),
].join('\n'));
console.log(`\ncreate on/off: p50 ${(on.p50 / off.p50).toFixed(2)}×, p99 ${(on.p99 / off.p99).toFixed(2)}×`);
