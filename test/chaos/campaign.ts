/**
 * The crash campaign (issue: nothing lost, nothing leaked). A real `collimate serve` on one home
 * runs a seeded workload from three tenants over REST — creates (some with short session limits,
 * so the reaper works too), execs, file writes, forks of 1–8, suspends, resumes, deletes — and is
 * SIGKILLed, either at one of the engine's fault points (the server kills itself there) or at a
 * random moment. It is started again on the same home and, before the workload goes on, the
 * invariants are checked:
 *
 * - every acknowledged sandbox exists in its acknowledged state, or a documented successor (one
 *   whose session limit passed is reaped; one whose operation was cut off is in the state before
 *   or after it), and a running one answers exec with the file content last written to it;
 * - a sandbox nobody was told about exists only as the whole result of an operation that was cut
 *   off (a create or fork), running and answering exec;
 * - suspended sandboxes resume with their processes (a counter process goes on counting);
 * - the database passes `PRAGMA integrity_check`, every fork point row has its directory and disk
 *   and is referenced, and its references name sandboxes or fork points that exist;
 * - no QEMU process, cgroup, network namespace, VMM uid claim, socket, disk layer or RAM file is
 *   left that no row (or the new server's warm pools) accounts for.
 *
 * `runCampaign` is the one implementation: test/integration/chaos.test.ts runs a short form in
 * `npm test`, bench/chaos.ts the long one.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { loadConfig, type EngineConfig } from '../../src/config.ts';
import { homePaths } from '../../src/host/paths.ts';
import { processMatches, readClaim } from '../../src/host/claims.ts';
import { homeNamespaces } from '../../src/net/netns.ts';
import { backingChain, jailerFor } from '../../src/vmm/jail.ts';
import { rng } from '../support/rng.ts';
import { qemuProcessesNaming } from '../../src/sandboxes/runtime.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** The engine's fault points (grep `ctx.fault(` in src/sandboxes). */
export const FAULT_POINTS = [
  'fork:before-seed', 'fork:before-stop', 'fork:after-disk', 'fork:after-migrate', 'fork:children-spawned', 'fork:children-restored',
  'suspend:before-save', 'suspend:after-save', 'suspend:recorded', 'resume:vmm-starting', 'resume:vmm-started',
];

/** The operations a campaign must have had acknowledged at least once, across its kills. */
export const COVERED_OPS = ['create', 'exec', 'fork', 'suspend'] as const;

export interface CampaignOptions {
  seed: number;
  /** Server kills. */
  kills: number;
  home: string;
  cacheDir: string;
  /** Extra environment of the server (e.g. a VMM uid range of its own). */
  env?: NodeJS.ProcessEnv;
  log?: (m: string) => void;
}

export interface CampaignResult {
  seed: number;
  kills: number;
  /** How each kill came: at a fault point (by name) or at a random moment. */
  killedAt: Record<string, number>;
  /** Operations acknowledged (2xx), by kind, and cut off by a kill. */
  acknowledged: Record<string, number>;
  cutOff: number;
  /** Sandboxes checked after restarts, and how many of them were found in a wrong state or missing. */
  checked: number;
  lost: number;
  orphans: number;
  integrityFailures: number;
  /** Every invariant that failed, with the round it failed in. */
  violations: string[];
}

type State = 'running' | 'suspended' | 'gone';

interface Known {
  id: string;
  tenant: string;
  /** The states it may be in: one once acknowledged, two while an operation on it was cut off. */
  states: Set<State>;
  /** /root/marker's possible contents (the last acknowledged write, and any write cut off since). */
  markers: Set<string>;
  /** A counter process was started in it (acknowledged). */
  counter: boolean;
  /** It may be reaped from this time on (its session limit), or never. */
  reapableAt: number;
  busy: boolean;
}


async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

const TENANTS = ['chaos-a', 'chaos-b', 'chaos-c'];
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

class Cut extends Error {}

export async function runCampaign(o: CampaignOptions): Promise<CampaignResult> {
  const { next: rnd, pick } = rng(o.seed);
  const log = o.log ?? (() => {});
  const trace = process.env.COLLIMATE_CHAOS_TRACE ? log : () => {};
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    COLLIMATE_CACHE_DIR: o.cacheDir,
    COLLIMATE_ENGINE_MODULE: join(ROOT, 'test/chaos/faultyEngine.ts'),
    COLLIMATE_HOST_CPU_PRESSURE_MAX: '0',
    COLLIMATE_POOL_MAX: '2',
    COLLIMATE_FORK_POOL_MAX: '4',
    COLLIMATE_CHAOS_CATALOG: 'base',
    ...o.env,
  };
  const cfg = loadConfig({ home: o.home, cacheDir: o.cacheDir }, env);
  const result: CampaignResult = {
    seed: o.seed, kills: 0, killedAt: {}, acknowledged: {}, cutOff: 0, checked: 0, lost: 0, orphans: 0, integrityFailures: 0, violations: [],
  };
  /** The server's fault point counts once this file exists: after the invariants are checked. */
  const armFile = join(o.home, 'chaos-armed');
  const keys = new Map<string, string>();
  for (const t of TENANTS) keys.set(t, await createKey(o.home, t, 'enterprise'));
  const known = new Map<string, Known>();
  /** Sandboxes a cut-off create or fork may have made, per tenant. */
  const unannounced = new Map<string, number>();
  let round = 0;
  let base = '';
  let server: ChildProcess | null = null;
  let serverStarted = 0;
  const violation = (m: string) => {
    result.violations.push(`round ${round}: ${m}`);
    log(`VIOLATION round ${round}: ${m}`);
  };

  async function call(tenant: string, method: string, path: string, body?: unknown, raw?: string): Promise<{ status: number; json: any }> {
    let res: Response;
    try {
      res = await fetch(base + path, {
        method,
        headers: {
          authorization: `Bearer ${keys.get(tenant)}`,
          ...(body !== undefined ? { 'content-type': 'application/json' } : raw !== undefined ? { 'content-type': 'application/octet-stream' } : {}),
        },
        body: body !== undefined ? JSON.stringify(body) : raw,
        signal: AbortSignal.timeout(120_000),
      });
    } catch (e) {
      throw new Cut((e as Error).message);
    }
    let text: string;
    try {
      text = await res.text();
    } catch (e) {
      throw new Cut((e as Error).message);
    }
    return { status: res.status, json: text ? JSON.parse(text) : null };
  }

  async function startServer(crashAt: string | null): Promise<void> {
    rmSync(armFile, { force: true });
    const port = await freePort();
    serverStarted = Date.now();
    const child = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'src/cli/main.ts'), 'serve', '--home', o.home, '--port', String(port), '--log-level', 'warn', '--allow-tcg'], {
      cwd: ROOT, env: { ...env, ...(crashAt ? { COLLIMATE_CRASH_AT: crashAt, COLLIMATE_CRASH_ARMED_BY: armFile } : {}) }, stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (d) => { stderr = (stderr + d).slice(-4000); });
    server = child;
    base = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 600_000;
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) throw new Error(`the server exited at start (${child.exitCode ?? child.signalCode}):\n${stderr}`);
      try {
        const r = await fetch(`${base}/healthz`);
        if (r.ok && ((await r.json()) as { status?: string }).status === 'ok') return;
      } catch { /* not listening yet */ }
      if (Date.now() > deadline) throw new Error(`the server did not get ready:\n${stderr}`);
      await sleep(100);
    }
  }

  async function killServer(): Promise<void> {
    const s = server;
    if (!s) return;
    if (s.exitCode === null && s.signalCode === null) s.kill('SIGKILL');
    if (s.exitCode === null && s.signalCode === null) await new Promise((r) => s.once('exit', r));
    server = null;
  }

  const alive = () => !!server && server.exitCode === null && server.signalCode === null;
  const ack = (kind: string) => { result.acknowledged[kind] = (result.acknowledged[kind] ?? 0) + 1; };

  // ---- the workload ----------------------------------------------------------------------------

  const COUNTER = '(i=0; while true; do i=$((i+1)); echo $i > /root/counter.new; mv /root/counter.new /root/counter; sleep 0.2; done) >/dev/null 2>&1 &';
  let writes = 0;

  function candidates(tenant: string, state: State): Known[] {
    return [...known.values()].filter((k) => k.tenant === tenant && !k.busy && k.states.size === 1 && k.states.has(state));
  }

  /** One operation of `tenant`, chosen by the seed; what it does to the model on an answer, and on a cut. */
  async function step(tenant: string): Promise<void> {
    const running = candidates(tenant, 'running');
    const suspended = candidates(tenant, 'suspended');
    const r = rnd();
    let k: Known | undefined;
    let op: string;
    if (running.length === 0 || (r < 0.16 && running.length + suspended.length < 6)) op = 'create';
    else if (r < 0.34) op = 'exec';
    else if (r < 0.50) op = 'write';
    else if (r < 0.62) op = 'fork';
    else if (r < 0.74) op = 'suspend';
    else if (r < 0.86) op = suspended.length ? 'resume' : 'exec';
    else op = running.length + suspended.length > 3 ? 'delete' : 'exec';
    // Forks multiply sandboxes: past a dozen a tenant, the workload deletes instead.
    if (op === 'fork' && running.length + suspended.length >= 12) op = 'delete';
    if (op === 'resume') k = pick(suspended);
    else if (op !== 'create') k = pick(op === 'delete' && suspended.length && rnd() < 0.3 ? suspended : running);
    if (k) k.busy = true;
    trace(`${tenant} ${op}${k ? ` ${k.id}` : ''}`);
    try {
      await perform(tenant, op, k);
    } finally {
      if (k) k.busy = false;
    }
  }

  /** Whether the answer says the reaper took it (gone, or going), past its session limit. */
  const reaped = (res: { status: number; json: any }, k: Known) =>
    Date.now() >= k.reapableAt && (res.status === 404 || (res.status === 409 && res.json?.error?.state === 'deleting'));

  async function perform(tenant: string, op: string, k: Known | undefined): Promise<void> {
    const expect = (res: { status: number; json: any }, ok: number[], what: string) => {
      if (ok.includes(res.status)) return true;
      // Admission refusals and the tier's concurrency cap are documented and retryable; anything else is wrong.
      if (res.status === 503 && res.json?.error?.code === 'host_at_capacity') return false;
      if (res.status === 429 && res.json?.error?.code === 'concurrency_limit') return false;
      violation(`${what}: ${res.status} ${JSON.stringify(res.json)}`);
      return false;
    };
    try {
      switch (op) {
        case 'create': {
          unannounced.set(tenant, (unannounced.get(tenant) ?? 0) + 1);
          const limit = rnd() < 0.15 ? 3 + Math.floor(rnd() * 5) : undefined;
          const res = await call(tenant, 'POST', '/v1/sandboxes', { template: 'base', ...(limit ? { timeout_secs: limit } : {}) });
          unannounced.set(tenant, unannounced.get(tenant)! - 1);
          if (!expect(res, [201], 'create')) return;
          known.set(res.json.id, {
            id: res.json.id, tenant, states: new Set(['running']), markers: new Set(['']), counter: false,
            reapableAt: limit ? Date.now() + limit * 1000 - 1000 : Infinity, busy: false,
          });
          ack('create');
          // Most sandboxes get a process that must live through everything that follows.
          if (rnd() < 0.7) {
            const kk = known.get(res.json.id)!;
            kk.busy = true;
            try {
              const e = await call(tenant, 'POST', `/v1/sandboxes/${kk.id}/exec`, { command: COUNTER });
              if (e.status === 200) { kk.counter = true; ack('exec'); } else if (!reaped(e, kk)) violation(`counter start in ${kk.id}: ${e.status} ${JSON.stringify(e.json)}`);
            } finally {
              kk.busy = false;
            }
          }
          return;
        }
        case 'exec': {
          const res = await call(tenant, 'POST', `/v1/sandboxes/${k!.id}/exec`, { command: 'echo $((6*7))' });
          if (reaped(res, k!)) return void (k!.states = new Set(['gone']));
          if (!expect(res, [200], `exec in ${k!.id}`)) return;
          if (res.json.stdout !== '42\n') violation(`exec in ${k!.id} answered ${JSON.stringify(res.json.stdout)}`);
          ack('exec');
          return;
        }
        case 'write': {
          const value = `v${++writes}`;
          k!.markers.add(value);
          const res = await call(tenant, 'PUT', `/v1/sandboxes/${k!.id}/files?path=/root/marker`, undefined, value);
          if (reaped(res, k!)) return void (k!.states = new Set(['gone']));
          if (!expect(res, [200, 204], `write in ${k!.id}`)) { k!.markers.delete(value); return; }
          k!.markers = new Set([value]);
          ack('write');
          return;
        }
        case 'fork': {
          const count = pick([1, 1, 2, 2, 4, 8]);
          unannounced.set(tenant, (unannounced.get(tenant) ?? 0) + count);
          const res = await call(tenant, 'POST', `/v1/sandboxes/${k!.id}/fork`, { count });
          unannounced.set(tenant, unannounced.get(tenant)! - count);
          if (reaped(res, k!)) return void (k!.states = new Set(['gone']));
          if (!expect(res, [200, 201], `fork(${count}) of ${k!.id}`)) return;
          const kids = (res.json.sandboxes ?? res.json) as Array<{ id: string }>;
          if (kids.length !== count) violation(`fork(${count}) of ${k!.id} answered ${kids.length} children`);
          for (const c of kids) {
            known.set(c.id, {
              id: c.id, tenant, states: new Set(['running']), markers: new Set(k!.markers), counter: k!.counter,
              reapableAt: k!.reapableAt === Infinity ? Infinity : Date.now() - 1000, busy: false,
            });
          }
          ack('fork');
          return;
        }
        case 'suspend':
        case 'resume': {
          const to: State = op === 'suspend' ? 'suspended' : 'running';
          k!.states.add(to);
          const res = await call(tenant, 'POST', `/v1/sandboxes/${k!.id}/${op}`, {});
          if (reaped(res, k!)) return void (k!.states = new Set(['gone']));
          if (!expect(res, [200], `${op} of ${k!.id}`)) { k!.states.delete(to); return; }
          k!.states = new Set([to]);
          ack(op);
          return;
        }
        case 'delete': {
          k!.states.add('gone');
          const res = await call(tenant, 'DELETE', `/v1/sandboxes/${k!.id}`);
          if (reaped(res, k!)) return void (k!.states = new Set(['gone']));
          if (!expect(res, [204], `delete of ${k!.id}`)) { k!.states.delete('gone'); return; }
          k!.states = new Set(['gone']);
          ack('delete');
          return;
        }
      }
    } catch (e) {
      if (!(e instanceof Cut)) throw e;
      // Cut off by the kill: its effect may or may not have landed; the model already allows both.
      result.cutOff++;
    }
  }

  // ---- the invariants, checked on a freshly started server ------------------------------------

  async function checkSandboxes(): Promise<void> {
    const seen = new Map<string, any>();
    for (const t of TENANTS) {
      const res = await call(t, 'GET', '/v1/sandboxes?limit=1000');
      for (const s of res.json.sandboxes) seen.set(s.id, { ...s, tenant: t });
    }
    const now = Date.now();
    for (const k of [...known.values()]) {
      if (k.states.size === 1 && k.states.has('gone')) {
        if (seen.has(k.id)) { violation(`${k.id} was deleted (acknowledged) but is listed as ${seen.get(k.id).state}`); result.orphans++; }
        known.delete(k.id);
        continue;
      }
      result.checked++;
      const s = seen.get(k.id);
      const state: State = s ? (s.state as State) : 'gone';
      if (!k.states.has(state) && !(state === 'gone' && now >= k.reapableAt)) {
        violation(`${k.id} is ${state}; acknowledged: ${[...k.states].join(' or ')}`);
        result.lost++;
      }
      if (state === 'gone') { known.delete(k.id); continue; }
      k.states = new Set([state]);
      seen.delete(k.id);
    }
    // Listed but never announced: only the whole result of a create or fork that was cut off.
    for (const [id, s] of seen) {
      const left = unannounced.get(s.tenant) ?? 0;
      if (left <= 0 || s.state !== 'running') {
        violation(`${id} (${s.tenant}, ${s.state}) exists though no create or fork of it was cut off`);
        result.orphans++;
        continue;
      }
      unannounced.set(s.tenant, left - 1);
      known.set(id, { id, tenant: s.tenant, states: new Set(['running']), markers: new Set(), counter: false, reapableAt: s.timeout_secs < 60 ? 0 : Infinity, busy: false });
    }
    unannounced.clear();
    // Running ones answer, with what was last written to them; their processes live.
    const counters: Array<{ k: Known; value: number }> = [];
    for (const k of known.values()) {
      if (!k.states.has('running')) continue;
      const res = await call(k.tenant, 'POST', `/v1/sandboxes/${k.id}/exec`, { command: 'cat /root/marker 2>/dev/null; echo; cat /root/counter 2>/dev/null || echo 0' });
      if (reaped(res, k)) { known.delete(k.id); continue; }
      if (res.status !== 200) { violation(`${k.id} does not answer exec after the restart: ${res.status} ${JSON.stringify(res.json)}`); result.lost++; continue; }
      const [marker, count] = res.json.stdout.split('\n');
      if (k.markers.size > 0 && !k.markers.has(marker)) violation(`${k.id}'s /root/marker is ${JSON.stringify(marker)}; written: ${[...k.markers].join(' or ')}`);
      k.markers = new Set([marker]);
      if (k.counter) counters.push({ k, value: Number(count) });
    }
    // Suspended ones resume with their processes: some of them now (the workload resumes others).
    for (const k of [...known.values()]) {
      if (!k.states.has('suspended') || rnd() < 0.5) continue;
      const res = await call(k.tenant, 'POST', `/v1/sandboxes/${k.id}/resume`, {});
      if (reaped(res, k)) { known.delete(k.id); continue; }
      if (res.status === 503) continue;
      if (res.status !== 200) { violation(`${k.id} does not resume after the restart: ${res.status} ${JSON.stringify(res.json)}`); result.lost++; continue; }
      ack('resume');
      k.states = new Set(['running']);
      const e = await call(k.tenant, 'POST', `/v1/sandboxes/${k.id}/exec`, { command: 'cat /root/marker 2>/dev/null; echo; cat /root/counter 2>/dev/null || echo 0' });
      const [marker, count] = e.json.stdout.split('\n');
      if (k.markers.size > 0 && !k.markers.has(marker)) violation(`${k.id}'s /root/marker is ${JSON.stringify(marker)} after resume; written: ${[...k.markers].join(' or ')}`);
      if (k.counter) counters.push({ k, value: Number(count) });
    }
    if (counters.length) {
      await sleep(700);
      for (const { k, value } of counters) {
        const res = await call(k.tenant, 'POST', `/v1/sandboxes/${k.id}/exec`, { command: 'cat /root/counter' });
        if (reaped(res, k)) { known.delete(k.id); continue; }
        if (res.status !== 200 || !(Number(res.json.stdout) > value)) violation(`${k.id}'s counter process does not count on (${value} → ${res.json?.stdout ?? res.status})`);
      }
    }
  }

  async function checkHost(): Promise<void> {
    const p = homePaths(o.home);
    // The database.
    const db = new Database(p.db, { readonly: true, fileMustExist: true });
    try {
      const ic = db.pragma('integrity_check', { simple: true });
      if (ic !== 'ok') { violation(`integrity_check: ${ic}`); result.integrityFailures++; }
      const rows = db.prepare("SELECT id, state, vmm FROM sandboxes WHERE state IN ('running', 'suspended')").all() as Array<{ id: string; state: string; vmm: string | null }>;
      const fps = db.prepare('SELECT id, dir, mem_path, disk_path FROM fork_points').all() as Array<{ id: string; dir: string; mem_path: string; disk_path: string }>;
      const refs = db.prepare('SELECT fork_point, owner FROM fork_point_refs').all() as Array<{ fork_point: string; owner: string }>;
      const live = new Set(rows.map((r) => r.id));
      const fpIds = new Set(fps.map((f) => f.id));
      for (const f of fps) {
        if (!existsSync(f.dir)) violation(`fork point ${f.id} has no directory`);
        if (!existsSync(f.disk_path)) violation(`fork point ${f.id} has no disk layer`);
        if (!refs.some((r) => r.fork_point === f.id)) { violation(`fork point ${f.id} is referenced by nothing`); result.orphans++; }
      }
      for (const r of refs) {
        if (!fpIds.has(r.fork_point)) violation(`a reference names fork point ${r.fork_point}, which has no row`);
        if (!live.has(r.owner) && !fpIds.has(r.owner)) violation(`fork point ${r.fork_point} is referenced by ${r.owner}, which does not exist`);
      }
      for (const d of existsSync(join(o.home, 'forkpoints')) ? readdirSync(join(o.home, 'forkpoints')) : []) {
        if (!fpIds.has(d)) { violation(`fork point directory ${d} has no row`); result.orphans++; }
      }
      const records = rows.map((r) => (r.vmm ? JSON.parse(r.vmm) : null)).filter(Boolean) as Array<{ pid: number; diskPath: string; memPath: string; dir: string }>;
      const runningPids = new Set(rows.filter((r) => r.state === 'running').map((r) => JSON.parse(r.vmm!).pid as number));
      // QEMU processes of this home: a running sandbox's, or one the new server started (its pools).
      const poolDisks = new Set<string>();
      const poolMems = new Set<string>();
      const qemuUids = new Set<number>();
      for (const pid of qemuProcessesNaming(o.home)) {
        const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
        qemuUids.add(statSync(`/proc/${pid}`).uid);
        if (runningPids.has(pid)) continue;
        if (startedAtMs(pid) < serverStarted - 1000) {
          const dir = /-name ([^,\0]+)/.exec(cmd.join('\0'))?.[1] ?? cmd.find((a) => a.includes('/sandboxes/')) ?? '?';
          const row = rows.find((r) => dir.includes(r.id));
          violation(`QEMU ${pid} (${dir.slice(0, 160)}) outlived the server that started it and no running sandbox accounts for it${row ? ` (its row is ${row.state}, VMM pid ${row.vmm ? JSON.parse(row.vmm).pid : 'none'})` : ''}`);
          result.orphans++;
          continue;
        }
        for (const a of cmd) {
          for (const m of a.matchAll(/file=([^,]+)/g)) poolDisks.add(m[1]);
          for (const m of a.matchAll(/mem-path=([^,]+)/g)) poolMems.add(m[1]);
        }
      }
      // Disk layers: the chains of running and suspended sandboxes, fork points and pool VMMs.
      const chains = new Set<string>();
      for (const top of [...records.map((r) => r.diskPath), ...fps.map((f) => f.disk_path), ...poolDisks]) {
        if (!existsSync(top)) continue;
        for (const l of backingChain(top)) chains.add(l);
      }
      for (const f of readdirSync(join(o.home, 'disks'))) {
        if (!chains.has(join(o.home, 'disks', f))) { violation(`disk layer ${f} is in no sandbox's, fork point's or warm VMM's chain`); result.orphans++; }
      }
      // RAM files: fork points', resumed sandboxes', warm VMMs', and spare copies (a few, by design).
      const mems = new Set([...fps.map((f) => f.mem_path), ...records.map((r) => r.memPath), ...poolMems]);
      for (const f of existsSync(cfg.ramDir) ? readdirSync(cfg.ramDir) : []) {
        if (f.startsWith('seed-') || f.startsWith('remap-')) continue;
        if (!mems.has(join(cfg.ramDir, f))) { violation(`RAM file ${f} belongs to nothing`); result.orphans++; }
      }
      // Per-sandbox directories and their sockets.
      for (const d of readdirSync(join(o.home, 'sandboxes'))) {
        if (live.has(d)) continue;
        const dir = join(o.home, 'sandboxes', d);
        if (!qemuProcessesNaming(dir).length) { violation(`sandbox directory ${d} belongs to no sandbox and no VMM`); result.orphans++; }
      }
      // VMM uid claims in this server's range: each held by a live process or a running VMM's uid.
      const base = cfg.jail.uidBase;
      const uidDir = join(cfg.jail.runDir, 'uids');
      for (const n of existsSync(uidDir) ? readdirSync(uidDir) : []) {
        const uid = Number(n);
        if (!/^\d+$/.test(n) || uid < base || uid >= base + cfg.jail.uidCount) continue;
        const owner = readClaim(join(uidDir, n));
        if ((owner && processMatches(owner)) || qemuUids.has(uid)) continue;
        violation(`VMM uid ${uid} is claimed by a process that is gone`);
        result.orphans++;
      }
      // Cgroups and namespaces: no more than the VMMs running (and the namespace pool).
      const vmms = qemuProcessesNaming(o.home).length;
      // A VMM cgroup with no process in it is one whose VMM is gone (one being prepared is empty
      // for a moment: looked at twice).
      const jailer = await jailerFor(cfg);
      const empty = () => (jailer?.cgroupDirs() ?? []).filter((d) => {
        try { return readFileSync(join(d, 'cgroup.procs'), 'utf8').trim() === ''; } catch { return false; }
      });
      let left = empty();
      if (left.length) { await sleep(2000); left = left.filter((d) => empty().includes(d)); }
      for (const d of left) { violation(`VMM cgroup ${d} has no process in it`); result.orphans++; }
      const nss = homeNamespaces(cfg.homeTag).length;
      if (nss > vmms + 8) { violation(`${nss} network namespaces for ${vmms} VMMs`); result.orphans++; }
    } finally {
      db.close();
    }
  }

  /** The checks, on a server that must not die meanwhile (its fault point is not armed yet). */
  async function checkedOrDied(check: () => Promise<void>): Promise<void> {
    try {
      await check();
    } catch (e) {
      if (!(e instanceof Cut)) throw e;
      violation(`the server died while the invariants were checked (${e.message}; exit ${server?.exitCode ?? server?.signalCode})`);
      await killServer();
      await startServer(null);
    }
  }

  // ---- the rounds ------------------------------------------------------------------------------

  try {
    for (round = 1; round <= o.kills; round++) {
      const atPoint = rnd() < 0.5 ? pick(FAULT_POINTS) : null;
      const t0 = Date.now();
      await startServer(atPoint);
      log(`round ${round}: server up in ${Date.now() - t0} ms${atPoint ? `, armed at ${atPoint}` : ''}`);
      // Let the new server's pools settle before counting what is on the host.
      await sleep(300);
      await checkedOrDied(async () => { await checkSandboxes(); await checkHost(); });
      log(`round ${round}: invariants checked (${known.size} sandboxes known)`);
      // Before the first arming, the workload goes on until every kind the campaign is judged on
      // was acknowledged once: the rounds' windows are a few seconds, and on a loaded host they
      // could all end with nothing suspended or forked to check across the kills.
      if (round === 1) {
        const missing = () => COVERED_OPS.filter((op) => !((result.acknowledged[op] ?? 0) > 0));
        const deadline = Date.now() + 180_000;
        await Promise.all(TENANTS.map(async (t) => {
          while (alive() && missing().length > 0 && Date.now() < deadline) await step(t);
        }));
        log(`round 1: ${missing().length ? `still not acknowledged: ${missing().join(', ')}` : 'every kind acknowledged'} before the first arming`);
      }
      writeFileSync(armFile, '');
      // The workload, until the server kills itself at its fault point or the timer does.
      const budgetMs = atPoint ? 20_000 : 300 + Math.floor(rnd() * 4000);
      const until = Date.now() + budgetMs;
      let killedByUs = false;
      const timer = setTimeout(() => { if (alive()) { killedByUs = true; server!.kill('SIGKILL'); } }, budgetMs);
      await Promise.all(TENANTS.map(async (t) => {
        while (alive() && Date.now() < until) await step(t);
      }));
      clearTimeout(timer);
      const died = !alive();
      const hit = !!atPoint && died && !killedByUs;
      if (died && !hit && !killedByUs) violation(`the server died on its own (${(server as ChildProcess | null)?.exitCode ?? (server as ChildProcess | null)?.signalCode})`);
      await killServer();
      result.kills++;
      const how = hit ? atPoint! : 'random moment';
      result.killedAt[how] = (result.killedAt[how] ?? 0) + 1;
      log(`round ${round}: killed at ${how}; ${known.size} sandboxes known, ${result.violations.length} violations so far`);
    }
    // The last restart: the invariants once more, then everything goes and nothing may remain.
    await startServer(null);
    await checkedOrDied(async () => { await checkSandboxes(); await checkHost(); });
    for (const k of known.values()) if (!k.states.has('gone')) await call(k.tenant, 'DELETE', `/v1/sandboxes/${k.id}`);
    // A clean stop: its warm VMMs go with it.
    const s = server as ChildProcess | null;
    if (s && alive()) {
      s.kill('SIGTERM');
      await new Promise((r) => s.once('exit', r));
    }
    server = null;
  } finally {
    await killServer();
  }
  return result;
}

/** When process `pid` started, in ms since the epoch (from /proc: boot time + start ticks). */
function startedAtMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const ticks = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]);
  const btime = Number(/^btime (\d+)/m.exec(readFileSync('/proc/stat', 'utf8'))![1]);
  return btime * 1000 + (ticks / 100) * 1000;
}

/** `collimate keys create` on the home, as an operator would; the key. */
async function createKey(home: string, tenant: string, tier: string): Promise<string> {
  const { execFile } = await import('node:child_process');
  const { promisify } = await import('node:util');
  const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', join(ROOT, 'src/cli/main.ts'), 'keys', 'create', '--tenant', tenant, '--tier', tier, '--home', home], { cwd: ROOT });
  return stdout.trim().split('\n').pop()!;
}

export type { EngineConfig };
