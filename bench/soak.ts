// The soak (issue 19): `collimate serve` in a process of its own, driven for `minutes` by waves from
// both SDKs at once — the TypeScript SDK here, the Python SDK in bench/soak_driver.py — each wave
// create → exec → fork(4) → exec in the children → suspend some → resume them → delete all. Every
// 10 s the server's RSS and open descriptors, its RAM directory's and the artifacts' RAM directory's
// tmpfs use, the QEMU processes of its home and the database's size (file and WAL) are sampled. After
// the waves and a settle, checkSoak says which measure was unbounded or did not come back.
// test/integration/soak.test.ts runs it for 3 minutes; the long form:
//   flock /tmp/collimate-vm.lock env COLLIMATE_CACHE_DIR=/var/tmp/collimate-test-cache node --import tsx bench/soak.ts [--minutes 60] [--samples FILE.json]
//
// The warm pools and fork receivers are caches sized by demand that drain after idle time (300 s and
// 600 s by default). The soak's server keeps them small and lets them drain after 30 s, so that the
// end of the run can be compared with its start: one warm VMM per catalog template (the pools' floor).
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { Collimate, CollimateError, NotFoundError, type Sandbox } from '../src/sdk/index.ts';
import { loadConfig } from '../src/config.ts';
import { homePaths } from '../src/host/paths.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const BIN = join(ROOT, 'bin/collimate.js');
const MiB = 1024 * 1024;

export interface SoakOptions {
  minutes: number;
  /** Seconds between samples (10). */
  sampleSecs?: number;
  /** Longest wait, after the waves, for every measure to come back (240 s). */
  settleSecs?: number;
  cacheDir?: string;
  log?: (m: string) => void;
}

export interface Sample {
  /** Seconds since the baseline. */
  t: number;
  phase: 'start' | 'waves' | 'settle';
  rssMiB: number;
  fds: number;
  /** The server's RAM directory (fork points, resumed sandboxes' RAM, spare fork seeds), bytes in use. */
  ramMiB: number;
  /** Of which spare fork seeds (one per backing file forked from, kept for the next fork). */
  sparesMiB: number;
  spares: number;
  /**
   * Template RAM files, bytes in use: those there when the soak started (the directory is shared by
   * every home on this cache, and other homes' bakes add files to it).
   */
  artifactRamMiB: number;
  qemu: number;
  /** Database file plus WAL. */
  dbKiB: number;
}

export type Counts = Record<'waves' | 'create' | 'exec' | 'fork' | 'children' | 'suspend' | 'resume' | 'delete' | 'retries_503', number>;

export interface SoakResult {
  home: string;
  minutes: number;
  samples: Sample[];
  counts: { ts: Counts; py: Counts };
  errors: string[];
  /** Sandboxes the API still listed after the waves. */
  leftOver: number;
  /** QEMU processes of the home and files in its RAM directory after the server stopped. */
  afterStop: { qemu: number; ramFiles: string[] };
}

// ---------------------------------------------------------------------------------------------
// Measures

function vmRssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

function fdCount(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/**
 * Bytes a directory's files hold on their filesystem (holes excluded), and those of `seed-*` files;
 * only the files named in `only` when given.
 */
function usedBytes(dir: string, only?: Set<string>): { all: number; spares: number; spareCount: number; files: string[] } {
  const out = { all: 0, spares: 0, spareCount: 0, files: [] as string[] };
  if (!existsSync(dir)) return out;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (only && !only.has(e.name)) continue;
    let st;
    try { st = statSync(join(dir, e.name)); } catch { continue; } // removed while we looked
    if (!st.isFile()) continue;
    out.all += st.blocks * 512;
    out.files.push(e.name);
    if (/^seed-.*\.mem$/.test(e.name)) { out.spares += st.blocks * 512; out.spareCount++; }
  }
  return out;
}

/** Live QEMU processes whose command line names the home (directly or by its tag). */
export function qemuOf(needles: string[]): number[] {
  const pids: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8');
      if (!cmd.startsWith('qemu-system') || !needles.some((n) => cmd.includes(n))) continue;
      const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
      if (stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z') pids.push(Number(p));
    } catch { /* gone */ }
  }
  return pids;
}

function fileSize(p: string): number {
  try { return statSync(p).size; } catch { return 0; }
}

// ---------------------------------------------------------------------------------------------
// The server

interface Server { child: ChildProcess; base: string; exited: Promise<number | null> }

const SERVER_ENV = {
  COLLIMATE_POOL_SIZE: '1',
  COLLIMATE_POOL_MIN: '1',
  COLLIMATE_POOL_MAX: '4',
  COLLIMATE_POOL_IDLE_SECS: '30',
  COLLIMATE_FORK_POOL_MAX: '4',
  COLLIMATE_FORK_POOL_IDLE_SECS: '30',
  COLLIMATE_LOG_LEVEL: 'info',
};

function startServer(home: string, cacheDir: string): Promise<Server> {
  const logFd = openSync(join(home, 'serve.log'), 'a');
  const child = spawn(process.execPath, [BIN, 'serve', '--home', home, '--host', '127.0.0.1', '--port', '0'], {
    env: { ...process.env, ...SERVER_ENV, COLLIMATE_CACHE_DIR: cacheDir },
    stdio: ['ignore', logFd, 'pipe'],
  });
  closeSync(logFd);
  let err = '';
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start: ${err}`)), 600_000);
    child.stderr!.on('data', (d) => {
      if (err.length < 1 << 20) err += d;
      const m = /collimate serving (http:\/\/\S+)/.exec(err);
      if (m) { clearTimeout(timer); resolve({ child, base: m[1], exited }); }
    });
    void exited.then((code) => { clearTimeout(timer); reject(new Error(`serve exited ${code}: ${err}`)); });
  });
}

async function createKey(home: string, name: string): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [BIN, 'keys', 'create', '--tenant', 'soak', '--tier', 'pro', '--name', name, '--home', home], { cwd: ROOT });
  const key = stdout.trim().split('\n').pop()!;
  if (!/^clm_[0-9A-Za-z]{40}$/.test(key)) throw new Error(`keys create printed no key: ${stdout}`);
  return key;
}

// ---------------------------------------------------------------------------------------------
// The TypeScript SDK's waves (the Python SDK's are bench/soak_driver.py: the same steps)

const MAX_RETRIES = 30;

function newCounts(): Counts {
  return { waves: 0, create: 0, exec: 0, fork: 0, children: 0, suspend: 0, resume: 0, delete: 0, retries_503: 0 };
}

async function tsWaves(client: Collimate, until: number, counts: Counts, errors: string[], log: (m: string) => void): Promise<void> {
  /** One SDK call, its 503s (nothing was done) retried after their Retry-After; counted once it succeeds. */
  const op = async <T>(name: Exclude<keyof Counts, 'waves' | 'children' | 'retries_503'>, fn: () => Promise<T>): Promise<T> => {
    for (let attempt = 0; ; attempt++) {
      try {
        const r = await fn();
        counts[name]++;
        return r;
      } catch (e) {
        if (!(e instanceof CollimateError) || e.status !== 503 || attempt === MAX_RETRIES) throw e;
        counts.retries_503++;
        await sleep((e.retryAfter || 5) * 1000);
      }
    }
  };
  const expect = (what: string, got: unknown, want: unknown) => {
    if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  };
  for (let n = 0; Date.now() < until; n++) {
    const made: Sandbox[] = [];
    try {
      const tag = `ts-${n}`;
      const sb = await op('create', () => client.sandboxes.create({ template: 'base', labels: { soak: 'ts', wave: String(n) } }));
      made.push(sb);
      const r = await op('exec', () => sb.exec({
        command: `echo ${tag} > /root/state; head -c 1048576 /dev/urandom > /root/blob; (while :; do sleep 1; done) >/dev/null 2>&1 & echo $! > /root/bg.pid; echo ok`,
      }));
      expect('parent exec', [r.exit_code, r.stdout], [0, 'ok\n']);
      const kids = await op('fork', () => sb.fork(4, { labels: { role: 'child' } }));
      made.push(...kids);
      counts.children += kids.length;
      expect('children', kids.length, 4);
      // The children's execs at once: four guests, each its own queue.
      await Promise.all(kids.map(async (k, i) => {
        const out = await op('exec', () => k.exec({ command: `cat /root/state; kill -0 $(cat /root/bg.pid) && echo alive; echo child-${i} > /root/state` }));
        expect(`child ${i} exec`, out.stdout, `${tag}\nalive\n`);
      }));
      // Suspend some: two children every wave, the parent every other wave.
      const some = [...kids.slice(0, 2), ...(n % 2 === 1 ? [sb] : [])];
      for (const s of some) await op('suspend', () => s.suspend());
      for (const s of some) await op('resume', () => s.resume());
      for (const s of some) {
        const want = s === sb ? tag : `child-${kids.indexOf(s)}`;
        const out = await op('exec', () => s.exec({ command: 'cat /root/state; kill -0 $(cat /root/bg.pid) && echo alive' }));
        expect('exec after resume', out.stdout, `${want}\nalive\n`);
      }
      for (const s of made.reverse()) await op('delete', () => s.delete());
      made.length = 0;
      counts.waves++;
    } catch (e) {
      errors.push(`ts wave ${n}: ${(e as Error).name}: ${(e as Error).message}`);
      log(`ts wave ${n} failed: ${(e as Error).message}`);
      for (const s of made) await s.delete().catch((e2) => { if (!(e2 instanceof NotFoundError)) errors.push(`ts wave ${n} cleanup ${s.id}: ${e2}`); });
    }
    log(`ts wave ${n + 1} done: ${JSON.stringify(counts)}`);
  }
}

function pyWaves(base: string, key: string, seconds: number, log: (m: string) => void): Promise<{ counts: Counts; errors: string[] }> {
  const child = spawn('python3', [join(ROOT, 'bench/soak_driver.py'), '--seconds', String(seconds)], {
    env: { ...process.env, PYTHONPATH: join(ROOT, 'sdk/python'), COLLIMATE_BASE_URL: base, COLLIMATE_API_KEY: key },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => { for (const l of String(d).split('\n')) if (l.trim()) log(l.replace(/^\[soak py\] /, 'py ')); });
  return new Promise((resolve) => {
    child.once('exit', (code) => {
      try {
        resolve(JSON.parse(out.trim().split('\n').pop()!));
      } catch {
        resolve({ counts: newCounts(), errors: [`python driver exited ${code} without counts: ${out.slice(-500)}`] });
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// The run

export async function runSoak(opts: SoakOptions): Promise<SoakResult> {
  const log = opts.log ?? ((m: string) => console.error(`[soak] ${m}`));
  const sampleMs = (opts.sampleSecs ?? 10) * 1000;
  const cacheDir = opts.cacheDir ?? process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache';
  mkdirSync('/tmp/collimate-it', { recursive: true });
  const home = mkdtempSync('/tmp/collimate-it/soak-');
  const cfg = loadConfig({ home, cacheDir });
  const db = homePaths(home).db;
  const needles = [home, cfg.homeTag];

  const [tsKey, pyKey] = [await createKey(home, 'ts'), await createKey(home, 'py')];
  log(`home ${home}; starting the server`);
  const server = await startServer(home, cacheDir);
  const pid = server.child.pid!;
  const samples: Sample[] = [];
  const artifacts = new Set(usedBytes(cfg.artifactRamDir).files);
  let t0 = Date.now();
  const sample = (phase: Sample['phase']): Sample => {
    const ram = usedBytes(cfg.ramDir);
    const s: Sample = {
      t: Math.round((Date.now() - t0) / 1000),
      phase,
      rssMiB: vmRssMiB(pid),
      fds: fdCount(pid),
      ramMiB: ram.all / MiB,
      sparesMiB: ram.spares / MiB,
      spares: ram.spareCount,
      artifactRamMiB: cfg.artifactRamDir === cfg.ramDir ? 0 : usedBytes(cfg.artifactRamDir, artifacts).all / MiB,
      qemu: qemuOf(needles).length,
      dbKiB: (fileSize(db) + fileSize(`${db}-wal`)) / 1024,
    };
    samples.push(s);
    return s;
  };

  const errors: string[] = [];
  const ts = newCounts();
  let py = newCounts();
  let leftOver = -1;
  try {
    log(`serving ${server.base} (pid ${pid}); waves for ${opts.minutes} min`);
    t0 = Date.now();
    sample('start');
    let phase: Sample['phase'] = 'waves';
    const sampler = setInterval(() => {
      const s = sample(phase);
      log(`t=${s.t}s rss ${s.rssMiB.toFixed(0)} MiB, fds ${s.fds}, ram ${s.ramMiB.toFixed(1)} MiB, artifacts ${s.artifactRamMiB.toFixed(1)} MiB, qemu ${s.qemu}, db ${s.dbKiB.toFixed(0)} KiB`);
    }, sampleMs);
    const until = Date.now() + opts.minutes * 60_000;
    const client = new Collimate({ apiKey: tsKey, baseUrl: server.base, maxRetries: 0, timeoutMs: 300_000 });
    const [, pyOut] = await Promise.all([
      tsWaves(client, until, ts, errors, log),
      pyWaves(server.base, pyKey, opts.minutes * 60, log),
    ]);
    py = pyOut.counts;
    errors.push(...pyOut.errors.map((e) => `py ${e}`));
    leftOver = (await client.sandboxes.list({ labels: {} }).all()).length;

    // Settle: the caches drain (pools to their floor, fork receivers gone), client connections close.
    phase = 'settle';
    const base = samples[0];
    const settleUntil = Date.now() + (opts.settleSecs ?? 240) * 1000;
    const settleFrom = Date.now();
    log(`waves done; settling (at most ${opts.settleSecs ?? 240} s)`);
    for (;;) {
      await sleep(2000);
      const s = samples[samples.length - 1];
      const back = s.t * 1000 >= settleFrom - t0 + 20_000 && s.qemu <= base.qemu && s.fds <= base.fds + FD_SLACK && s.ramMiB - s.sparesMiB <= base.ramMiB - base.sparesMiB + 1;
      if (back || Date.now() > settleUntil) break;
    }
    clearInterval(sampler);
    sample('settle');
  } finally {
    server.child.kill('SIGTERM');
    await server.exited;
  }
  await sleep(1000);
  return {
    home,
    minutes: opts.minutes,
    samples,
    counts: { ts, py },
    errors,
    leftOver,
    afterStop: { qemu: qemuOf(needles).length, ramFiles: usedBytes(cfg.ramDir).files },
  };
}

// ---------------------------------------------------------------------------------------------
// Bounds: relative to the first sample, generous but finite

/** Descriptors the end may hold beyond the start (an HTTP connection still closing, a log reopen). */
const FD_SLACK = 4;

export interface Bound { measure: keyof Sample; label: string; peak: (start: number, r: SoakResult) => number; end: (start: number, r: SoakResult) => number }

const made = (r: SoakResult) => r.counts.ts.create + r.counts.ts.children + r.counts.py.create + r.counts.py.children;

export const BOUNDS: Bound[] = [
  // V8 grows its heap to fit the load and gives it back lazily: bounded, not back to the byte.
  { measure: 'rssMiB', label: 'server RSS (MiB)', peak: (s) => s + 256, end: (s) => s + 96 },
  // Each sandbox holds a few (QMP, agent, tap, RAM file); a wave has five, two waves at once.
  { measure: 'fds', label: 'server open fds', peak: (s) => s + 300, end: (s) => s + FD_SLACK },
  // Fork points and resumed RAM files go with their sandboxes; a spare seed per template forked from stays.
  { measure: 'ramMiB', label: 'RAM dir tmpfs (MiB)', peak: (s) => s + 4096, end: (s, r) => s + 1 + sparesAtEnd(r) },
  // Template RAM files: sandboxes' faults on holes grow them, the 30 s dig gives the pages back.
  { measure: 'artifactRamMiB', label: 'artifact RAM tmpfs (MiB)', peak: (s) => s + 1024, end: (s) => s + 64 },
  { measure: 'qemu', label: 'QEMU processes', peak: (s) => s + 32, end: (s) => s },
  // Deleted sandboxes keep their rows (history, metering): the database grows with what was made, a few KiB each.
  { measure: 'dbKiB', label: 'database + WAL (KiB)', peak: (s, r) => s + 8192 + 16 * made(r), end: (s, r) => s + 8192 + 16 * made(r) },
];

/**
 * A slow leak shows as a trend: the server's RSS over the last quarter of the waves against the
 * first quarter (after the first minute, once V8 has grown to the load), in MiB.
 */
export function rssTrend(r: SoakResult): number {
  const waves = r.samples.filter((s) => s.phase === 'waves' && s.t >= 60);
  if (waves.length < 8) return 0;
  const q = Math.floor(waves.length / 4);
  const mean = (xs: Sample[]) => xs.reduce((a, s) => a + s.rssMiB, 0) / xs.length;
  return mean(waves.slice(-q)) - mean(waves.slice(0, q));
}
const RSS_TREND_MIB = 48;

function sparesAtEnd(r: SoakResult): number {
  return r.samples[r.samples.length - 1].sparesMiB;
}

function peakOf(r: SoakResult, m: keyof Sample): number {
  return Math.max(...r.samples.map((s) => s[m] as number));
}

/** What went wrong: unbounded or not back measures, failed operations, too little work. Empty when the soak passed. */
export function checkSoak(r: SoakResult): string[] {
  const out: string[] = [];
  const start = r.samples[0];
  const end = r.samples[r.samples.length - 1];
  for (const b of BOUNDS) {
    const s = start[b.measure] as number;
    const peak = peakOf(r, b.measure);
    const e = end[b.measure] as number;
    if (!(peak <= b.peak(s, r))) out.push(`${b.label}: peak ${fmt(peak)} above the bound ${fmt(b.peak(s, r))} (start ${fmt(s)})`);
    if (!(e <= b.end(s, r))) out.push(`${b.label}: end ${fmt(e)} not back within ${fmt(b.end(s, r))} (start ${fmt(s)})`);
  }
  const trend = rssTrend(r);
  if (trend > RSS_TREND_MIB) out.push(`server RSS grew ${fmt(trend)} MiB from the first quarter of the waves to the last (bound ${RSS_TREND_MIB})`);
  if (end.spares > 1) out.push(`${end.spares} spare fork seeds at the end; one template was forked from`);
  const expectedSamples = Math.floor((r.minutes * 60) / 10) - 1;
  if (r.samples.length < expectedSamples) out.push(`only ${r.samples.length} samples in ${r.minutes} min`);
  for (const [sdk, c] of Object.entries(r.counts)) {
    if (c.waves < 1) out.push(`${sdk}: no wave completed`);
    for (const k of ['create', 'exec', 'fork', 'children', 'suspend', 'resume', 'delete'] as const) if (c[k] < 1) out.push(`${sdk}: no ${k}`);
    if (c.create + c.children !== c.delete) out.push(`${sdk}: ${c.create + c.children} sandboxes made, ${c.delete} deleted`);
  }
  out.push(...r.errors);
  if (r.leftOver !== 0) out.push(`${r.leftOver} sandboxes still listed after the waves`);
  if (r.afterStop.qemu !== 0) out.push(`${r.afterStop.qemu} QEMU processes of the home after the server stopped`);
  const ramLeft = r.afterStop.ramFiles.filter((f) => !f.startsWith('artifact-'));
  if (ramLeft.length) out.push(`RAM files left after the server stopped: ${ramLeft.join(', ')}`);
  return out;
}

function fmt(n: number): string {
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

/** Markdown: start, peak and end of each measure with its bounds; then the operations of each SDK. */
export function soakTable(r: SoakResult): string {
  const start = r.samples[0];
  const end = r.samples[r.samples.length - 1];
  const lines = [
    `| measure | start | peak | end | bound: peak ≤ | bound: end ≤ |`,
    `|---|---:|---:|---:|---:|---:|`,
  ];
  for (const b of BOUNDS) {
    const s = start[b.measure] as number;
    lines.push(`| ${b.label} | ${fmt(s)} | ${fmt(peakOf(r, b.measure))} | ${fmt(end[b.measure] as number)} | ${fmt(b.peak(s, r))} | ${fmt(b.end(s, r))} |`);
  }
  lines.push(`| of the RAM dir: spare fork seeds (MiB, files) | ${fmt(start.sparesMiB)}, ${start.spares} | ${fmt(peakOf(r, 'sparesMiB'))}, ${peakOf(r, 'spares')} | ${fmt(end.sparesMiB)}, ${end.spares} | | 1 file |`);
  lines.push('', `${r.samples.length} samples over ${r.samples[r.samples.length - 1].t} s (waves for ${r.minutes} min, then the settle); server RSS trend over the waves (last quarter − first quarter after the first minute): ${fmt(rssTrend(r))} MiB (bound ${RSS_TREND_MIB}).`, '');
  lines.push(`| SDK | waves | creates | execs | forks | children | suspends | resumes | deletes | 503s retried | errors |`);
  lines.push(`|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|`);
  for (const [sdk, c] of Object.entries(r.counts)) {
    const errs = r.errors.filter((e) => e.startsWith(`${sdk} `)).length;
    lines.push(`| ${sdk === 'ts' ? 'TypeScript' : 'Python'} | ${c.waves} | ${c.create} | ${c.exec} | ${c.fork} | ${c.children} | ${c.suspend} | ${c.resume} | ${c.delete} | ${c.retries_503} | ${errs} |`);
  }
  return lines.join('\n');
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const argOf = (name: string) => {
    const i = process.argv.indexOf(`--${name}`);
    return i > 0 ? process.argv[i + 1] : undefined;
  };
  const minutes = Number(argOf('minutes') ?? 60);
  if (!(minutes > 0)) throw new Error('--minutes must be a positive number');
  const r = await runSoak({ minutes });
  const out = argOf('samples');
  if (out) writeFileSync(out, JSON.stringify(r, null, 1));
  console.log(soakTable(r));
  const failures = checkSoak(r);
  console.log(failures.length ? `\nFAILED:\n- ${failures.join('\n- ')}` : '\nall measures bounded and back at the end');
  process.exit(failures.length ? 1 : 0);
}
