// Where an idle sandbox's memory goes (issue 18: PSS per idle sandbox ≤ 25 MiB), and what a change
// to how QEMU runs buys. Holds N idle sandboxes of the base template per trial and reports PSS per
// sandbox (median) and a per-mapping breakdown read from each VMM's /proc/PID/smaps: guest RAM (the
// template's RAM file, copy-on-write), the TCG translation cache, the heap and malloc arenas, thread
// stacks, QEMU's binary and libraries, and the rest. Trials run one after the other in the same run,
// the baseline (today's launch) first and again last, so host drift shows.
//
// A trial is a QEMU wrapper: `--trial NAME=ENV...;ARGS...` runs QEMU with the environment variables
// ENV and extra arguments ARGS appended (e.g. `--trial 'arena1=MALLOC_ARENA_MAX=1;'`; `thp=on` or
// `thp=off` among ENV sets transparent huge pages for it). `--busy CMD` also runs CMD in three
// sandboxes of each trial, after the idle figures, and reports the host CPU time their VMMs spent
// on it (median), so a setting that saves memory but slows a busy guest shows it.
// `--pool` also reports the warm pool's VMMs (with COLLIMATE_PREWARM=0: spawned, never restored).
// `--probe-trim` calls malloc_trim(0) in three VMMs through gdb (after the idle figures) and logs their PSS before and after.
// Usage: node --import tsx bench/pss.ts [--sandboxes 10] [--idle 5] [--trial NAME=ENV;ARGS]... [--busy CMD] [--probe-trim] [--pool]
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { Engine } from '../src/sandboxes/engine.ts';
import { percentile } from './stats.ts';

const args = process.argv.slice(2);
const opt = (name: string) => { const i = args.indexOf(`--${name}`); return i >= 0 ? args[i + 1] : undefined; };
const N = Number(opt('sandboxes') ?? 10);
const IDLE_SECS = Number(opt('idle') ?? 5);
const busy = opt('busy');
const trials: Array<{ name: string; env: string[]; extra: string[] }> = [{ name: 'baseline', env: [], extra: [] }];
args.forEach((a, i) => {
  if (a !== '--trial') return;
  const [name, rest] = [args[i + 1].slice(0, args[i + 1].indexOf('=')), args[i + 1].slice(args[i + 1].indexOf('=') + 1)];
  const [env, extra] = rest.split(';');
  trials.push({ name, env: env.split(/\s+/).filter(Boolean), extra: (extra ?? '').split(/\s+/).filter(Boolean) });
});
if (trials.length > 1) trials.push({ name: 'baseline again', env: [], extra: [] });

const home = `/tmp/collimate-bench-pss-${process.pid}`;
const wrappers = `${home}-qemu`;
mkdirSync(wrappers, { recursive: true });
const log = (m: string) => console.error(`[bench] ${m}`);
const qemu = execFileSync('sh', ['-c', 'command -v qemu-system-x86_64'], { encoding: 'utf8' }).trim();

/** A shell wrapper that runs QEMU with the trial's environment and extra arguments (the jail binds it). */
function wrapper(t: { name: string; env: string[]; extra: string[] }, i: number): string {
  const path = `${wrappers}/qemu-${i}.sh`;
  const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  // `thp=on` / `thp=off` in the environment list: QEMU runs with transparent huge pages allowed or
  // not (prctl PR_SET_THP_DISABLE, kept across exec; a confined VMM under TCG has them off).
  const thp = t.env.find((e) => e.startsWith('thp='));
  const env = t.env.filter((e) => e !== thp);
  const prefix = thp
    ? `/usr/bin/python3 -c 'import ctypes,os,sys; ctypes.CDLL(None).prctl(41,${thp === 'thp=off' ? 1 : 0},0,0,0); os.execv(sys.argv[1], sys.argv[1:])'`
    : '';
  writeFileSync(path, `#!/bin/sh\nexec env ${env.map(q).join(' ')} ${prefix} ${qemu} "$@" ${t.extra.map(q).join(' ')}\n`);
  chmodSync(path, 0o755);
  return path;
}

interface Mapping { start: bigint; end: bigint; perms: string; name: string; kb: Record<string, number> }

function smaps(pid: number): Mapping[] {
  const out: Mapping[] = [];
  for (const line of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    const head = line.match(/^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$/);
    if (head) { out.push({ start: BigInt(`0x${head[1]}`), end: BigInt(`0x${head[2]}`), perms: head[3], name: head[4], kb: {} }); continue; }
    const f = line.match(/^(\w+):\s+(\d+) kB/);
    if (f && out.length) out[out.length - 1].kb[f[1]] = Number(f[2]);
  }
  return out;
}

const KINDS = ['guest RAM', 'TB cache', 'heap+arenas', 'stacks', 'qemu+libs', 'other'] as const;
type Kind = typeof KINDS[number];

/**
 * Sorts a VMM's mappings: the guest RAM file by name; the translation cache as the one anonymous
 * rwx mapping (TCG's code_gen_buffer); thread stacks as the anonymous rw mappings right above a
 * one-page guard; malloc arenas as the anonymous rw mappings inside a 64 MiB-aligned heap (glibc's
 * HEAP_MAX_SIZE) plus [heap]; the rest of the anonymous memory as other.
 */
function breakdown(pid: number, memPath: string): Record<Kind, number> {
  const maps = smaps(pid);
  const r = Object.fromEntries(KINDS.map((k) => [k, 0])) as Record<Kind, number>;
  maps.forEach((m, i) => {
    const pss = (m.kb.Pss ?? 0) / 1024;
    const size = Number(m.end - m.start);
    const prev = maps[i - 1];
    let kind: Kind;
    if (m.name === memPath || m.name.startsWith(`${memPath} `)) kind = 'guest RAM';
    else if (m.name === '[heap]') kind = 'heap+arenas';
    else if (m.name === '[stack]') kind = 'stacks';
    else if (m.name.startsWith('/')) kind = 'qemu+libs';
    else if (m.perms.startsWith('rwx')) kind = 'TB cache';
    else if (prev && prev.end === m.start && prev.perms.startsWith('---') && Number(prev.end - prev.start) === 4096 && size <= 8 << 20) kind = 'stacks';
    else if (m.start % BigInt(64 << 20) === 0n && m.name === '') kind = 'heap+arenas';
    else kind = 'other';
    r[kind] += pss;
  });
  return r;
}

const pssOf = (pid: number) => Number(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8').match(/^Pss:\s+(\d+)/m)![1]) / 1024;
const uptime = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

log(`${new Date().toISOString()} load ${uptime()}; ${N} sandboxes per trial, ${IDLE_SECS} s idle; ${qemu}`);
const rows: string[] = [];
try {
  for (const [i, t] of trials.entries()) {
    const engine = await Engine.open({ home, cacheDir: process.env.COLLIMATE_CACHE_DIR, poolSize: N, catalog: ['base'], progress: log, idlePauseSecs: 0, qemuBinary: wrapper(t, i) });
    try {
      const tenant = { tenant: 'bench' };
      const ids: string[] = [];
      for (let k = 0; k < N; k++) ids.push((await engine.create({ template: 'base' }, tenant)).id);
      await new Promise((res) => setTimeout(res, IDLE_SECS * 1000));
      const vmms = ids.map((id) => engine.repo.get(id)!.vmm!);
      const pss = vmms.map((v) => pssOf(v.pid));
      const parts = vmms.map((v) => breakdown(v.pid, v.memPath));
      if (args.includes('--dump')) {
        for (const m of smaps(vmms[0].pid).filter((m) => (m.kb.Pss ?? 0) >= 256)) {
          log(`  ${m.start.toString(16)} ${((Number(m.end - m.start)) / 1024).toFixed(0).padStart(8)} kB ${m.perms} Pss ${String(m.kb.Pss).padStart(6)} Anon ${String(m.kb.Anonymous).padStart(6)} Huge ${String(m.kb.AnonHugePages).padStart(6)} ${m.name}`);
        }
      }
      if (args.includes('--jit')) {
        // QEMU's own account of its translation cache (HMP `info jit`), for the first sandbox.
        const vmm = (engine as unknown as { registry: { get(id: string): { live: { vmm: { qmp: { execute<T>(c: string, a?: object): Promise<T> } } } } } }).registry.get(ids[0]).live.vmm;
        log(await vmm.qmp.execute<string>('human-monitor-command', { 'command-line': 'info jit' }));
      }
      const med = (k: Kind) => percentile(parts.map((p) => p[k]), 50);
      if (args.includes('--probe-trim')) {
        // What a malloc_trim(0) inside QEMU would give back (called through gdb in three VMMs):
        // the heap a trim on the idle pause could free, which QEMU's own trims (its RCU thread's,
        // keeping 4 MiB at the top) leave.
        const before = vmms.slice(0, 3).map((v) => pssOf(v.pid));
        for (const v of vmms.slice(0, 3)) {
          const out = execFileSync('gdb', ['-p', String(v.pid), '-batch', '-nx', '-ex', 'call (int) malloc_trim(0)'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 60_000 });
          log(`gdb: ${out.trim().split('\n').filter((l) => l.startsWith('$')).join(' ') || out.trim().slice(-300)}`);
        }
        const after = vmms.slice(0, 3).map((v) => pssOf(v.pid));
        log(`malloc_trim(0) in 3 VMMs: PSS ${before.map((b) => b.toFixed(1)).join(' ')} -> ${after.map((a) => a.toFixed(1)).join(' ')} MiB`);
      }
      if (args.includes('--pool')) {
        // The pool's VMMs beside them (this home's other QEMU processes): restored, warmed and
        // paused; with COLLIMATE_PREWARM=0 only spawned — what a QEMU costs before any guest code runs.
        const mine = new Set(vmms.map((v) => v.pid));
        const pool = readdirSync('/proc').filter((p) => /^\d+$/.test(p)).map(Number).filter((p) => {
          if (mine.has(p)) return false;
          try { return readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(`${home}/`) && readFileSync(`/proc/${p}/comm`, 'utf8').startsWith('qemu'); } catch { return false; }
        });
        const memOf = (p: number) => readFileSync(`/proc/${p}/cmdline`, 'utf8').match(/mem-path=([^,\0]+)/)?.[1] ?? '';
        const pp = pool.map((p) => breakdown(p, memOf(p)));
        const ps = pool.map(pssOf);
        log(`pool VMMs: ${pool.length}, PSS median ${percentile(ps, 50).toFixed(1)} MiB; ${KINDS.map((k) => `${k} ${percentile(pp.map((x) => x[k]), 50).toFixed(1)}`).join(', ')}`);
      }
      // After the idle figures: a busy guest grows its translation cache.
      let busyMs = NaN;
      if (busy) {
        // Three sandboxes one after the other; the median of the host CPU time their VMM spent on
        // it (all threads), which the other load on a shared host moves far less than wall time.
        const cpu = (pid: number) => readdirSync(`/proc/${pid}/task`).reduce((sum, tid) => {
          const f = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8').split(') ')[1].split(' ');
          return sum + (Number(f[11]) + Number(f[12])) * 10;
        }, 0);
        const times: number[] = [];
        for (const [k, id] of ids.slice(0, 3).entries()) {
          const c0 = cpu(vmms[k].pid);
          const r = await engine.exec(id, { command: busy, timeout: 600 }, tenant);
          times.push(cpu(vmms[k].pid) - c0);
          if (r.exit_code !== 0) log(`busy command exited ${r.exit_code}: ${r.stderr.slice(0, 200)}`);
        }
        busyMs = percentile(times, 50);
        log(`busy (VMM CPU): ${times.map((t) => (t / 1000).toFixed(2)).join(' ')} s`);
      }
      rows.push(`| ${t.name} | ${[...t.env, ...t.extra].join(' ') || '(today)'} | ${N} | ${percentile(pss, 50).toFixed(1)} (${Math.min(...pss).toFixed(1)}–${Math.max(...pss).toFixed(1)}) | ${KINDS.map((k) => med(k).toFixed(1)).join(' | ')} |${busy ? ` ${(busyMs / 1000).toFixed(2)} s |` : ''}`);
      log(rows[rows.length - 1]);
      for (const id of ids) await engine.delete(id, tenant);
    } finally {
      await engine.deleteAll();
      await engine.close();
    }
  }
} finally {
  rmSync(home, { recursive: true, force: true });
  rmSync(wrappers, { recursive: true, force: true });
}
console.log(`| trial | QEMU environment / extra arguments | n | PSS MiB, median (min–max) | ${KINDS.join(' | ')} |${busy ? ' busy command, VMM CPU s (median of 3) |' : ''}`);
console.log(`|---|---|---|---|${KINDS.map(() => '---').join('|')}|${busy ? '---|' : ''}`);
for (const r of rows) console.log(r);
log(`done ${new Date().toISOString()} load ${uptime()}`);
