import { homedir, totalmem } from 'node:os';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { detectAccel, type AccelChoice } from './vmm/accel.js';
import type { JailSettings } from './vmm/jail.js';
import type { CgroupMode } from './vmm/cgroup.js';
import type { NetSettings } from './net/netns.js';
import { parseEgress, parseOpenCidrs, type EgressPolicy } from './net/policy.js';

/** Engine settings with their embedded defaults. Every knob has an environment override. */
export interface EngineConfig {
  home: string;
  /** Built guest assets and baked artifacts: content-addressed and read-only once built, so several
   * homes (e.g. concurrent test files) may share one. Defaults to the home. */
  cacheDir: string;
  /** tmpfs directory for RAM files of templates and fork points (DESIGN.md: "Where RAM files live"). */
  ramDir: string;
  /** tmpfs directory for artifact RAM files, tied to cacheDir (they are shared wherever it is). */
  artifactRamDir: string;
  accel: AccelChoice;
  qemuBinary: string;
  /**
   * Warm VMMs per catalog template before it has seen any demand (COLLIMATE_POOL_SIZE); from then on
   * the pool sizes itself (poolSizer.ts) within [poolMin, poolMax].
   */
  poolSize: number;
  /** Bounds of every template's self-sized pool: COLLIMATE_POOL_MIN (0), COLLIMATE_POOL_MAX (32). */
  poolMin: number;
  poolMax: number;
  /** A pool with no create for this long shrinks to poolMin (COLLIMATE_POOL_IDLE_SECS, 300). */
  poolIdleSecs: number;
  /** Creates within this long of each other are one burst (COLLIMATE_POOL_BURST_SECS, 10). */
  poolBurstSecs: number;
  /** Memory all warm pools together may hold, in MiB (COLLIMATE_POOL_MEMORY_MIB; default a tenth of the host's RAM). */
  poolMemoryMib: number;
  /**
   * Admission by what the host has (src/sandboxes/hostCapacity.ts): guest memory running sandboxes
   * may have together (COLLIMATE_HOST_MEMORY_MIB, 0 = no cap), memory kept available for the rest of
   * the host (COLLIMATE_HOST_MEMORY_RESERVE_MIB, default 5% of RAM, at least 512), CPU pressure at which
   * new sandboxes wait (COLLIMATE_HOST_CPU_PRESSURE_MAX, % of time some task waited, default 90, 0 = never),
   * free space kept on the RAM files' tmpfs (COLLIMATE_TMPFS_RESERVE_MIB, default 256) and on the
   * home's filesystem (COLLIMATE_DISK_RESERVE_MIB, default 1024).
   */
  host: { memoryMib: number; reserveMib: number; cpuPressureMax: number; tmpfsReserveMib: number; diskReserveMib: number };
  /**
   * A running sandbox with nothing of its own running in it (no exec, no process an exec left) is
   * paused by the host after this long idle and woken by its next request (src/sandboxes/quiesce.ts;
   * COLLIMATE_IDLE_PAUSE_SECS, default 60; 0 = never).
   */
  idlePauseSecs: number;
  /**
   * A template RAM file no process has claimed or mapped for this long is removed from tmpfs
   * (src/images/artifactGc.ts; COLLIMATE_ARTIFACT_GRACE_SECS, default 3600; checked every 10 min).
   */
  artifactGraceSecs: number;
  /**
   * An image layer no home's record holds and no process has open, written or reused longer ago
   * than this, is removed from the shared layer store (src/images/layerGc.ts;
   * COLLIMATE_LAYER_GRACE_SECS, default 3600; checked every 10 min).
   */
  layerGraceSecs: number;
  /**
   * A deleted sandbox's row (what `GET` of its id answers: why it ended) is kept this long, then
   * pruned, so the database does not grow with every sandbox ever made; usage records stay
   * (COLLIMATE_DELETED_RETENTION_SECS, default 86400; checked every 10 min).
   */
  deletedRetentionSecs: number;
  /** Pool VMMs are restored, warmed with one exec and paused ahead of time (COLLIMATE_PREWARM=0: only spawned). */
  prewarmPool: boolean;
  /**
   * How a live fork captures the parent's memory: `pages` (default) copies the pages the parent
   * wrote onto a copy of its backing file while it is stopped (src/vmm/memory.ts); `migrate` streams
   * all of its RAM through a receiving VMM (QEMU migration). COLLIMATE_FORK_CAPTURE.
   */
  forkCapture: 'pages' | 'migrate';
  /**
   * Most VMMs kept spawned ahead of forks per artifact (forkReceivers.ts): a template whose
   * sandboxes fork keeps as many as its largest recent fork asked for, up to this. 0: none.
   * COLLIMATE_FORK_POOL_MAX.
   */
  forkPoolMax: number;
  /** A template's fork receivers go after this long without a fork of its sandboxes. COLLIMATE_FORK_POOL_IDLE_SECS. */
  forkPoolIdleSecs: number;
  /**
   * Resumes take fork receivers and map the RAM image where it lies (suspendResume.ts
   * resumeOnReceiver). On by default; COLLIMATE_RESUME_ON_RECEIVERS=0 makes every resume spawn its
   * VMM while the image is copied to tmpfs.
   */
  resumeOnReceivers: boolean;
  /** Warm VMMs per environment (tenant) template. */
  environmentPoolSize: number;
  /** Cap per output stream of one exec, in bytes. */
  maxOutputBytes: number;
  /** Largest file a streamed download sends (COLLIMATE_MAX_DOWNLOAD_MIB, default 1 TiB: any real file; /proc/kcore is refused). */
  maxDownloadBytes: number;
  defaultExecTimeoutSecs: number;
  /** Maximum session duration when the caller gives none. */
  defaultSessionSecs: number;
  /** What the reaper does with a sandbox past its maximum session duration. */
  reapAction: 'delete' | 'suspend';
  reapIntervalMs: number;
  /** Confine QEMU with `-sandbox on,...` (seccomp). */
  seccomp: boolean;
  /** Confinement of VMM processes: own uid, no capabilities, private mount view, cgroup limits (docs/security.md). */
  jail: JailSettings;
  /** Short digest of the home: names this home's RAM directory and VMM cgroups. */
  homeTag: string;
  debugGuest: boolean;
  /**
   * Whether a process started unseeded (a background process, a PTY, the web terminal, E2B's
   * commands) keeps address randomization in the guest (COLLIMATE_GUEST_ASLR: on, off, or auto = on
   * under KVM, off under TCG, where each start at fresh addresses is translated afresh and costs
   * 3–4× one at the addresses the VMM already translated; docs/determinism.md). Seeded ones never do.
   */
  unseededAslr: boolean;
  /** Extra guest kernel arguments for every template (COLLIMATE_GUEST_KERNEL_ARGS, space-separated; part of each artifact's key). */
  guestKernelArgs: string[];
  /** Per-sandbox networking (src/net): namespaces, taps, egress policy, ports proxy. */
  net: NetSettings;
  /** Egress policy of catalog templates' sandboxes (COLLIMATE_CATALOG_EGRESS: none | allow | JSON allowlist). */
  catalogEgress: EgressPolicy;
  /** Guest RAM of every catalog template, overriding the catalog's own (benchmarks, big workloads). */
  catalogMemoryMib?: number;
}

function intEnv(env: NodeJS.ProcessEnv, name: string, dflt: number): number {
  const v = env[name];
  if (v === undefined || v === '') return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, not ${JSON.stringify(v)}`);
  return n;
}

const MIB = 1024 * 1024;

/**
 * Size limits of streamed file transfers: uploads (PUT /files, COLLIMATE_MAX_UPLOAD_MIB, default
 * 1 GiB; an upload also has to arrive within the server's request timeout) and downloads
 * (COLLIMATE_MAX_DOWNLOAD_MIB, default 1 TiB).
 */
export function fileLimits(env: NodeJS.ProcessEnv = process.env): { maxUploadBytes: number; maxDownloadBytes: number } {
  return {
    maxUploadBytes: intEnv(env, 'COLLIMATE_MAX_UPLOAD_MIB', 1024) * MIB,
    maxDownloadBytes: intEnv(env, 'COLLIMATE_MAX_DOWNLOAD_MIB', 1024 * 1024) * MIB,
  };
}

export function defaultHome(env: NodeJS.ProcessEnv = process.env): string {
  return env.COLLIMATE_HOME || join(homedir(), '.collimate');
}

function enumEnv<T extends string>(env: NodeJS.ProcessEnv, name: string, allowed: readonly T[], dflt: T): T {
  const v = env[name];
  if (v === undefined || v === '') return dflt;
  if (!(allowed as readonly string[]).includes(v)) throw new Error(`${name} must be one of ${allowed.join(', ')}, not ${JSON.stringify(v)}`);
  return v as T;
}

export function jailSettings(env: NodeJS.ProcessEnv = process.env): JailSettings {
  return {
    mode: enumEnv(env, 'COLLIMATE_JAIL', ['auto', 'on', 'off'] as const, 'auto'),
    uidBase: intEnv(env, 'COLLIMATE_VMM_UID_BASE', 200_000),
    uidCount: intEnv(env, 'COLLIMATE_VMM_UID_COUNT', 65_536),
    runDir: env.COLLIMATE_RUN_DIR || '/run/collimate',
    cgroups: enumEnv<CgroupMode>(env, 'COLLIMATE_CGROUPS', ['auto', 'v1', 'v2', 'off'], 'auto'),
    cgroupParent: env.COLLIMATE_CGROUP_PARENT || undefined,
    memoryOverheadMib: intEnv(env, 'COLLIMATE_VMM_MEMORY_OVERHEAD_MIB', 192),
    pidsMax: intEnv(env, 'COLLIMATE_VMM_PIDS_MAX', 128),
  };
}

export function netSettings(env: NodeJS.ProcessEnv = process.env): NetSettings {
  return {
    mode: enumEnv(env, 'COLLIMATE_NET', ['auto', 'on', 'off'] as const, 'auto'),
    transitCidr: env.COLLIMATE_NET_TRANSIT || '10.201.0.0/16',
    dnsUpstream: env.COLLIMATE_DNS_UPSTREAM || undefined,
    runDir: env.COLLIMATE_RUN_DIR || '/run/collimate',
    openCidrs: parseOpenCidrs(env.COLLIMATE_EGRESS_OPEN_CIDRS),
  };
}

function catalogEgress(env: NodeJS.ProcessEnv): EgressPolicy {
  const v = env.COLLIMATE_CATALOG_EGRESS;
  if (v === undefined || v === '') return 'allow';
  try {
    return parseEgress(v === 'none' || v === 'allow' ? v : JSON.parse(v), 'COLLIMATE_CATALOG_EGRESS');
  } catch (e) {
    throw new Error(`COLLIMATE_CATALOG_EGRESS must be none, allow or a JSON allowlist: ${(e as Error).message}`);
  }
}

/** sun_path holds 108 bytes with its NUL: the longest Unix socket path bind() and connect() take. */
export const UNIX_SOCKET_PATH_MAX = 107;

/**
 * VMM sockets live under the data and cache directories; a directory deep enough to push them past
 * the Unix socket limit would fail at the first bake or create with a bare ENOENT (libuv truncates
 * the name). The longest such paths: a bake's QMP/agent socket under the cache,
 * `<cache>/artifacts/<24 hex>/tmp-<time>-<pid>/agent.sock.<6 hex>` (74 bytes past the directory),
 * and a sandbox's under the home, `<home>/sandboxes/sbx_<12 hex>/agent.sock.<6 hex>` (45; 52 leaves room).
 */
export function assertSocketRoom(home: string, cacheDir: string): void {
  for (const [dir, what, tail] of [[cacheDir, 'cache directory (COLLIMATE_CACHE_DIR, else the home)', 74], [home, 'home (COLLIMATE_HOME or --home)', 52]] as const) {
    const n = Buffer.byteLength(dir) + tail;
    if (n > UNIX_SOCKET_PATH_MAX) {
      throw new Error(`the ${what} ${dir} is too deep for the VMM sockets under it: they would be ${n} bytes, past the ${UNIX_SOCKET_PATH_MAX} a Unix socket path may have; choose one of at most ${UNIX_SOCKET_PATH_MAX - tail} bytes`);
    }
  }
}

export function loadConfig(overrides: Partial<EngineConfig> = {}, env: NodeJS.ProcessEnv = process.env): EngineConfig {
  const home = overrides.home ?? defaultHome(env);
  const tag = (p: string) => createHash('sha256').update(p).digest('hex').slice(0, 12);
  const homeTag = tag(home);
  const cacheDir = overrides.cacheDir ?? (env.COLLIMATE_CACHE_DIR || home);
  assertSocketRoom(home, cacheDir);
  const accel = overrides.accel ?? detectAccel(env);
  const reapAction = (env.COLLIMATE_REAP_ACTION ?? 'delete') as EngineConfig['reapAction'];
  if (reapAction !== 'delete' && reapAction !== 'suspend') throw new Error('COLLIMATE_REAP_ACTION must be "delete" or "suspend"');
  return {
    home,
    cacheDir,
    ramDir: env.COLLIMATE_RAM_DIR || `/dev/shm/collimate-${homeTag}`,
    artifactRamDir: env.COLLIMATE_RAM_DIR || `/dev/shm/collimate-${tag(cacheDir)}`,
    accel,
    qemuBinary: env.COLLIMATE_QEMU || 'qemu-system-x86_64',
    poolSize: intEnv(env, 'COLLIMATE_POOL_SIZE', 4),
    poolMin: intEnv(env, 'COLLIMATE_POOL_MIN', 0),
    poolMax: intEnv(env, 'COLLIMATE_POOL_MAX', 32),
    poolIdleSecs: intEnv(env, 'COLLIMATE_POOL_IDLE_SECS', 300),
    poolBurstSecs: intEnv(env, 'COLLIMATE_POOL_BURST_SECS', 10),
    poolMemoryMib: intEnv(env, 'COLLIMATE_POOL_MEMORY_MIB', Math.floor(totalmem() / 1024 / 1024 / 10)),
    environmentPoolSize: intEnv(env, 'COLLIMATE_ENV_POOL_SIZE', 1),
    idlePauseSecs: intEnv(env, 'COLLIMATE_IDLE_PAUSE_SECS', 60),
    artifactGraceSecs: intEnv(env, 'COLLIMATE_ARTIFACT_GRACE_SECS', 3600),
    layerGraceSecs: intEnv(env, 'COLLIMATE_LAYER_GRACE_SECS', 3600),
    deletedRetentionSecs: intEnv(env, 'COLLIMATE_DELETED_RETENTION_SECS', 86_400),
    host: {
      memoryMib: intEnv(env, 'COLLIMATE_HOST_MEMORY_MIB', 0),
      reserveMib: intEnv(env, 'COLLIMATE_HOST_MEMORY_RESERVE_MIB', Math.max(512, Math.floor(totalmem() / 1024 / 1024 / 20))),
      cpuPressureMax: intEnv(env, 'COLLIMATE_HOST_CPU_PRESSURE_MAX', 90),
      tmpfsReserveMib: intEnv(env, 'COLLIMATE_TMPFS_RESERVE_MIB', 256),
      diskReserveMib: intEnv(env, 'COLLIMATE_DISK_RESERVE_MIB', 1024),
    },
    prewarmPool: env.COLLIMATE_PREWARM !== '0',
    forkCapture: forkCaptureOf(env.COLLIMATE_FORK_CAPTURE),
    forkPoolMax: intEnv(env, 'COLLIMATE_FORK_POOL_MAX', 16),
    forkPoolIdleSecs: intEnv(env, 'COLLIMATE_FORK_POOL_IDLE_SECS', 600),
    resumeOnReceivers: env.COLLIMATE_RESUME_ON_RECEIVERS !== '0',
    maxOutputBytes: intEnv(env, 'COLLIMATE_MAX_OUTPUT_BYTES', 1024 * 1024),
    maxDownloadBytes: fileLimits(env).maxDownloadBytes,
    defaultExecTimeoutSecs: 60,
    defaultSessionSecs: intEnv(env, 'COLLIMATE_SESSION_SECS', 3600),
    reapAction,
    reapIntervalMs: 1000,
    seccomp: env.COLLIMATE_SECCOMP !== '0',
    jail: jailSettings(env),
    homeTag,
    debugGuest: env.COLLIMATE_DEBUG_GUEST === '1',
    unseededAslr: unseededAslrOf(env.COLLIMATE_GUEST_ASLR, accel.accel),
    guestKernelArgs: (env.COLLIMATE_GUEST_KERNEL_ARGS ?? '').split(/\s+/).filter(Boolean),
    net: netSettings(env),
    catalogEgress: catalogEgress(env),
    catalogMemoryMib: env.COLLIMATE_CATALOG_MEMORY_MIB ? intEnv(env, 'COLLIMATE_CATALOG_MEMORY_MIB', 256) : undefined,
    ...overrides,
  };
}

function unseededAslrOf(v: string | undefined, accel: 'kvm' | 'tcg'): boolean {
  if (v === undefined || v === '' || v === 'auto') return accel === 'kvm';
  if (v === 'on' || v === 'off') return v === 'on';
  throw new Error(`COLLIMATE_GUEST_ASLR must be auto, on or off, not ${JSON.stringify(v)}`);
}

function forkCaptureOf(v: string | undefined): 'pages' | 'migrate' {
  if (v === undefined || v === '' || v === 'pages') return 'pages';
  if (v === 'migrate') return 'migrate';
  throw new Error(`COLLIMATE_FORK_CAPTURE must be pages or migrate, not ${JSON.stringify(v)}`);
}
