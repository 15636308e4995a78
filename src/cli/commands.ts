/**
 * The `collimate` command line. `serve` runs the engine and the REST API in this process; `keys`
 * operates directly on the SQLite database in the data directory; everything else is an HTTP client
 * of a running server (--url / COLLIMATE_BASE_URL, --key / COLLIMATE_API_KEY).
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { createSecureContext } from 'node:tls';
import { CollimateError } from '../errors.js';
import { homePaths } from '../host/paths.js';
import { ApiClient, CliHttpError } from './client.js';
import { duration, table } from './format.js';
import { CollimateError as SdkError, SandboxFiles } from '../sdk/index.js';
import { Transport } from '../../sdk/typescript/src/transport.js';
import { parseQuotaOverrides, type QuotaOverrides } from '../service/quotas.js';

export interface Io {
  out(s: string): void;
  err(s: string): void;
  /** Raw bytes to stdout / stderr (exec output). */
  outBytes(b: Buffer): void;
  errBytes(b: Buffer): void;
  env: Record<string, string | undefined>;
  /** This command's standard input (`processes send` streams it; default process.stdin). */
  stdin?(): AsyncIterable<Uint8Array>;
}

export const processIo: Io = {
  out: (s) => process.stdout.write(s),
  err: (s) => process.stderr.write(s),
  outBytes: (b) => process.stdout.write(b),
  errBytes: (b) => process.stderr.write(b),
  env: process.env,
};

class UsageError extends Error {}

const USAGE = `collimate — self-hosted sandbox cloud

Server
  collimate serve [--host 127.0.0.1] [--port 7070] [--home DIR] [--allow-tcg] [--tls-cert FILE --tls-key FILE] [--log-level info]
      Without KVM (TCG) the server runs in development mode; serving more than one tenant or
      listening beyond loopback then needs --allow-tcg (see docs/security.md). Logs are JSON lines
      on stdout; --tls-cert/--tls-key (PEM) serve HTTPS (docs/operations.md).

Cluster mode (docs/cluster.md): many hosts behind one API, sharing one PostgreSQL
  collimate serve --cluster postgres://USER@DB/NAME --advertise http://ADDR:PORT [--capacity N] ...
      --cluster (or $COLLIMATE_CLUSTER): the cluster database; --advertise: how the other hosts reach
      this one; --capacity: running sandboxes it takes at most (default 16; 0: an API-only node).

API keys (operate on the database in --home; default $COLLIMATE_HOME or ~/.collimate; with --cluster URL
or $COLLIMATE_CLUSTER, on the cluster's database: the key is valid on every host)
  collimate keys create --tenant T [--tier demo|pro|enterprise] [--name N] [--e2b]   prints the key on its last line
                                                              (--e2b: in E2B's e2b_<hex> shape, for the E2B SDK; the same key)
  collimate keys list [--tenant T] [--all]
  collimate keys revoke KEY_ID|KEY

Cluster operations (--cluster URL or $COLLIMATE_CLUSTER; see docs/cluster.md)
  collimate cluster move SANDBOX_ID [--to HOST_ID]     moves a suspended sandbox to another host (or the one named)
  collimate cluster drain --host HOST_ID [--to HOST_ID] moves every suspended sandbox off a host

Sandboxes (HTTP client: --url, default $COLLIMATE_BASE_URL or http://127.0.0.1:7070; --key, default $COLLIMATE_API_KEY)
  collimate sandboxes create --template T [--label k=v]... [--timeout SECS] [--egress none|allow|JSON] [--idempotency-key K]
  collimate sandboxes list [--state running|suspended] [--label k=v]... [--limit N] [--after CURSOR]
  collimate sandboxes get ID
  collimate sandboxes exec ID (--command STR | --code STR | -- ARGV...) [--env K=V]... [--cwd DIR] [--stdin STR] [--timeout SECS] [--stream]
  collimate sandboxes fork ID [--count N] [--label k=v]... [--idempotency-key K]
  collimate sandboxes suspend|resume|delete ID
  collimate sandboxes timeout ID SECS     end the running session SECS seconds from now, sooner or later
                                          (within the tier's maximum session from its start)
  collimate sandboxes port-url ID PORT [--expires SECS]   a signed URL of the port that needs no key (default 1 h)
  collimate processes start ID (--command STR | -- ARGV...) [--env K=V]... [--cwd DIR] [--stdin] [--pty COLSxROWS] [--tag T]
                                          a background process: prints its pid; runs beside execs
  collimate processes list ID
  collimate processes get ID PID
  collimate processes output ID PID [--from start|now|OFFSET]   follow its output until it exits
                                          (exit status: the process's)
  collimate processes send ID PID [--data STR] [--close]   input: --data, else this command's stdin,
                                          streamed as it is read
  collimate processes close-stdin ID PID
  collimate processes kill ID PID [--signal SIG]     default SIGTERM, to its process group
  collimate processes resize ID PID COLSxROWS
  collimate processes wait ID PID [--timeout SECS]
  collimate templates list
  collimate images list

Files in a running sandbox (paths absolute, or relative to /root; answered while an exec runs)
  collimate files ls ID PATH [--depth N]
  collimate files stat ID PATH
  collimate files exists ID PATH          prints true/false; exit 0 if something is there, 1 if not
  collimate files mkdir ID PATH [--mode 755]   with its parents; an existing directory is no error
  collimate files rm ID PATH              a directory goes with everything in it
  collimate files mv ID FROM TO           replaces a file at TO
  collimate files upload ID LOCAL PATH [--mode 644]   streamed; PATH is replaced whole or not at all
  collimate files download ID PATH LOCAL  streamed; LOCAL - writes to stdout
  collimate files watch ID PATH [--recursive]   one line per change (OP NAME) until interrupted or the
                                          watch ends (directory removed, sandbox suspended or deleted)
  collimate usage [--from T] [--to T] [--per day]

Host and service
  collimate doctor [--home DIR]       checks this host for serve (accelerator, cgroups, uid range, nftables,
                                      tmpfs, free disk): one line each with what to fix; exit 1 if one fails
  collimate service install [--home DIR] [--host H] [--port P] [--allow-tcg] [--tls-cert F --tls-key F] [--now] [--no-enable] [--root DIR]
                                      writes the systemd unit (home default /var/lib/collimate), runs
                                      daemon-reload and enables it (--now: and starts it)
  collimate service unit [same flags] prints that unit

Other
  collimate openapi [--out FILE]      print (or write) the OpenAPI document

Every command takes --json for machine-readable output.
`;

const common = {
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;
const http = { ...common, url: { type: 'string' }, key: { type: 'string' } } as const;
const home = { home: { type: 'string' } } as const;

function parse<T extends NonNullable<ParseArgsConfig['options']>>(args: string[], options: T, positionals = 0) {
  let r;
  try {
    r = parseArgs({ args, options, allowPositionals: true, strict: true });
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (r.positionals.length > positionals) throw new UsageError(`unexpected argument ${r.positionals[positionals]}`);
  return r;
}

function homeDir(v: string | undefined, io: Io): string {
  return resolve(v ?? (io.env.COLLIMATE_HOME || join(homedir(), '.collimate')));
}

export function dbPathOf(home: string): string {
  return homePaths(home).db; // the engine's database, which holds the API's tables too
}

function client(values: { url?: string; key?: string }, io: Io): ApiClient {
  const url = values.url ?? io.env.COLLIMATE_BASE_URL ?? 'http://127.0.0.1:7070';
  const key = values.key ?? io.env.COLLIMATE_API_KEY;
  if (!key) throw new UsageError('no API key: pass --key or set COLLIMATE_API_KEY (create one with `collimate keys create`)');
  return new ApiClient({ url, key });
}

function labels(list: string[] | undefined): Record<string, string> | undefined {
  if (!list || list.length === 0) return undefined;
  const out: Record<string, string> = {};
  for (const l of list) {
    const eq = l.indexOf('=');
    if (eq <= 0) throw new UsageError(`label ${l} must be key=value`);
    out[l.slice(0, eq)] = l.slice(eq + 1);
  }
  return out;
}

function need(id: string | undefined, what: string): string {
  if (!id) throw new UsageError(`missing ${what}`);
  return id;
}

/** --egress: `none`, `allow`, or an allowlist as JSON ({"domains": [...], "cidrs": [...], "ports": [...]}); the server validates it. */
function egressArg(v: string | undefined): unknown {
  if (v === undefined) return undefined;
  const s = v.trim();
  if (!s.startsWith('{')) return s;
  try {
    return JSON.parse(s);
  } catch {
    throw new UsageError('--egress must be none, allow, or JSON like \'{"domains": ["pypi.org"], "ports": [443]}\'');
  }
}

function num(v: string | undefined, name: string): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new UsageError(`--${name} must be a number`);
  return n;
}

const json = (io: Io, v: unknown) => io.out(JSON.stringify(v, null, 2) + '\n');

const SANDBOX_COLUMNS = ['id', 'template', 'state', 'age', 'idle', 'execs', 'labels', 'parent'];
const sandboxRow = (s: any) => ({
  id: s.id,
  template: s.template,
  state: s.state,
  age: duration(s.age_secs),
  idle: duration(s.idle_secs),
  execs: s.exec_count,
  labels: s.labels,
  parent: s.parent,
});

function printSandbox(io: Io, s: any, asJson: boolean | undefined): void {
  if (asJson) return json(io, s);
  io.out(table([sandboxRow(s)], SANDBOX_COLUMNS));
}

// ---------------------------------------------------------------------------------------------

/** Exit status of a `serve` that refuses to start because of the accelerator policy (sysexits EX_CONFIG). */
export const EXIT_TCG_REFUSED = 78;

export const QEMU_SECURITY_POLICY_URL = 'https://www.qemu.org/docs/master/system/security.html';

export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h);
}

/**
 * The accelerator policy of `serve`. QEMU treats only KVM-accelerated guests as a security
 * boundary; under TCG a guest escape is not a QEMU security bug. So without KVM the server runs in
 * an explicit development mode, and refuses what would make it a shared service — more than one
 * tenant, or an address beyond loopback — unless the operator passes --allow-tcg.
 * With KVM nothing is refused.
 */
export function tcgPolicy(opts: { accel: 'kvm' | 'tcg'; accelReason: string; host: string; tenants: number; allowTcg: boolean }):
  { refuse: false; banner?: string } | { refuse: true; message: string } {
  if (opts.accel === 'kvm') return { refuse: false };
  const why: string[] = [];
  if (opts.tenants > 1) why.push(`the keys table has ${opts.tenants} tenants`);
  if (!isLoopbackHost(opts.host)) why.push(`--host ${opts.host} listens beyond loopback`);
  if (why.length > 0 && !opts.allowTcg) {
    return {
      refuse: true,
      message:
        `collimate: refusing to serve: ${why.join(' and ')}, but this host has no usable KVM (accelerator TCG: ${opts.accelReason}).\n` +
        `  QEMU's security policy treats only KVM-accelerated guests as a security boundary; a guest escaping TCG\n` +
        `  is not a QEMU security bug (${QEMU_SECURITY_POLICY_URL}), so tenants would not be isolated from each other or the host.\n` +
        `  Run on a host with hardware virtualization (kvm_intel or kvm_amd loaded), or pass --allow-tcg to serve anyway\n` +
        `  (development and trusted tenants only).\n`,
    };
  }
  return {
    refuse: false,
    banner:
      `collimate: DEVELOPMENT MODE: accelerator TCG (${opts.accelReason}); QEMU does not treat TCG guest escapes as security bugs, ` +
      `so guests are not a security boundary here (${QEMU_SECURITY_POLICY_URL})${why.length ? `; serving anyway (--allow-tcg): ${why.join(' and ')}` : ''}\n`,
  };
}

/** A second tenant on a host without KVM changes what `serve` will do: say so when the key is made. */
async function warnMultiTenantTcg(db: { prepare(sql: string): { get(): unknown } }, io: Io): Promise<void> {
  const n = (db.prepare('SELECT COUNT(DISTINCT tenant) AS n FROM api_keys WHERE revoked_at IS NULL').get() as { n: number }).n;
  if (n < 2) return;
  const { detectAccel } = await import('../vmm/accel.js');
  let accel;
  try { accel = detectAccel(io.env); } catch { return; }
  if (accel.accel === 'tcg') {
    io.err(`note: ${n} tenants now hold keys and this host has no usable KVM (${accel.reason}): \`collimate serve\` will refuse to start without --allow-tcg (a running server keeps running; see docs/security.md)\n`);
  }
}

/** Tenants that hold a key that can still authenticate. */
async function countTenants(dir: string): Promise<number> {
  const { openDb } = await import('../store/db.js');
  const db = openDb(dbPathOf(dir));
  try {
    return (db.prepare('SELECT COUNT(DISTINCT tenant) AS n FROM api_keys WHERE revoked_at IS NULL').get() as { n: number }).n;
  } finally {
    db.close();
  }
}

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

/**
 * The certificate chain and key of --tls-cert/--tls-key, read and checked (PEM, key matching the
 * certificate) before anything starts, so a bad pair is a usage error rather than a failed start.
 */
export function tlsFiles(certPath: string | undefined, keyPath: string | undefined): { cert: Buffer; key: Buffer } | undefined {
  if (certPath === undefined && keyPath === undefined) return undefined;
  if (certPath === undefined || keyPath === undefined) throw new UsageError('--tls-cert and --tls-key go together: pass the certificate chain (PEM) and its private key (PEM)');
  const read = (path: string, flag: string) => {
    try {
      return readFileSync(path);
    } catch (e) {
      throw new UsageError(`${flag} ${path}: cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); the server must be able to read the file`);
    }
  };
  const cert = read(certPath, '--tls-cert');
  const key = read(keyPath, '--tls-key');
  try {
    createSecureContext({ cert, key });
  } catch (e) {
    throw new UsageError(`--tls-cert ${certPath} / --tls-key ${keyPath}: not a usable pair (${(e as Error).message}); pass a PEM certificate chain and the PEM private key it was issued for`);
  }
  return { cert, key };
}

/** The cluster database URL of --cluster or $COLLIMATE_CLUSTER, checked; undefined on a single host. */
export function clusterUrl(flag: string | undefined, env: Record<string, string | undefined>): string | undefined {
  const v = flag ?? (env.COLLIMATE_CLUSTER || undefined);
  if (v === undefined) return undefined;
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    throw new UsageError(`--cluster must be a PostgreSQL URL like postgres://collimate@db.internal:5432/collimate, not ${JSON.stringify(v.slice(0, 100))}`);
  }
  if (u.protocol !== 'postgres:' && u.protocol !== 'postgresql:') {
    throw new UsageError(`--cluster must be a PostgreSQL URL (postgres://USER@HOST:PORT/DB), not a ${u.protocol} URL`);
  }
  return v;
}

/** --advertise: how peers reach this host's API, http(s)://ADDR:PORT with nothing after it. */
export function advertiseUrl(v: string | undefined): string {
  if (v === undefined) throw new UsageError('--cluster needs --advertise http://ADDR:PORT: the address the other hosts reach this one at');
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    throw new UsageError(`--advertise must be a URL like http://10.0.0.5:7070, not ${JSON.stringify(v.slice(0, 100))}`);
  }
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || !u.port || (u.pathname !== '/' && u.pathname !== '') || u.search || u.hash || u.username) {
    throw new UsageError(`--advertise must be http://ADDR:PORT (scheme, address and port, nothing else), not ${JSON.stringify(v.slice(0, 100))}`);
  }
  if (u.protocol === 'https:') throw new UsageError('--advertise must be http:// for now: hosts do not yet speak TLS to each other (docs/cluster.md)');
  return `${u.protocol}//${u.host}`;
}

/**
 * COLLIMATE_CLUSTER_TIMINGS=HEARTBEAT,LEASE,DEAD_AFTER in ms (default 2000,10000,15000): shorter for
 * tests that kill hosts; heartbeat < lease < dead-after, so a host fences itself before peers act.
 */
function clusterTimings(env: Record<string, string | undefined>): { heartbeatMs: number; leaseMs: number; deadAfterMs: number } | undefined {
  const v = env.COLLIMATE_CLUSTER_TIMINGS;
  if (!v) return undefined;
  const n = v.split(',').map(Number);
  if (n.length !== 3 || !n.every((x) => Number.isInteger(x) && x > 0) || !(n[0] < n[1] && n[1] < n[2])) {
    throw new UsageError(`COLLIMATE_CLUSTER_TIMINGS must be HEARTBEAT,LEASE,DEAD_AFTER in ms with heartbeat < lease < dead-after (default 2000,10000,15000), not ${JSON.stringify(v)}`);
  }
  return { heartbeatMs: n[0], leaseMs: n[1], deadAfterMs: n[2] };
}

/** A database URL without its password, for messages. */
function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(the --cluster URL)';
  }
}

/** Tenants with a usable key in the cluster database (for the TCG policy). */
async function countClusterTenants(url: string): Promise<number> {
  const { openClusterDb, migrateCluster } = await import('../cluster/db.js');
  const { ClusterKeys } = await import('../cluster/keys.js');
  const pool = openClusterDb({ url, max: 1 });
  try {
    await migrateCluster(pool);
    return await new ClusterKeys(pool).countTenants();
  } finally {
    await pool.end();
  }
}

/** When this start began: COLLIMATE_STARTED_AT_MS (set by scripts/start.sh, so set-up counts) or now. */
function startedAt(env: Record<string, string | undefined>): number {
  const v = Number(env.COLLIMATE_STARTED_AT_MS);
  return Number.isFinite(v) && v > 0 && v <= Date.now() ? v : Date.now();
}

/** Seconds since `t0`: "93.4 s", or padded for progress lines to line up ("  93.4 s"). */
function elapsed(t0: number, pad = 0): string {
  return `${((Date.now() - t0) / 1000).toFixed(1).padStart(pad)} s`;
}

async function serve(args: string[], io: Io): Promise<number> {
  const { values } = parse(args, {
    ...common, ...home, host: { type: 'string' }, port: { type: 'string' }, 'log-level': { type: 'string' }, 'allow-tcg': { type: 'boolean' },
    'tls-cert': { type: 'string' }, 'tls-key': { type: 'string' },
    cluster: { type: 'string' }, advertise: { type: 'string' }, capacity: { type: 'string' },
  });
  const dir = homeDir(values.home, io);
  const host = values.host ?? '127.0.0.1';
  const port = num(values.port, 'port') ?? 7070;
  const cluster = clusterUrl(values.cluster, io.env);
  if (!cluster && (values.advertise !== undefined || values.capacity !== undefined)) throw new UsageError('--advertise and --capacity belong to cluster mode: pass --cluster postgres://… (or set COLLIMATE_CLUSTER) too');
  const advertise = cluster ? advertiseUrl(values.advertise) : undefined;
  const capacity = num(values.capacity, 'capacity') ?? 16;
  if (!Number.isInteger(capacity) || capacity < 0) throw new UsageError('--capacity must be a whole number of running sandboxes, 0 or more (0: an API-only node)');
  const timings = cluster ? clusterTimings(io.env) : undefined;
  const logLevel = values['log-level'] ?? io.env.COLLIMATE_LOG_LEVEL ?? 'info';
  if (!LOG_LEVELS.includes(logLevel)) throw new UsageError(`--log-level must be one of ${LOG_LEVELS.join(', ')}, not ${JSON.stringify(logLevel)}`);
  const tls = tlsFiles(values['tls-cert'], values['tls-key']);
  await import('../service/migrations.js'); // register the API's tables before the tenant count is read
  // The accelerator policy is decided before anything is spawned.
  const { detectAccel } = await import('../vmm/accel.js');
  const accel = detectAccel(io.env);
  let tenantCount: number;
  let clusterSecretsKey: Buffer | undefined;
  try {
    tenantCount = cluster ? await countClusterTenants(cluster) : await countTenants(dir);
    // Environment secrets are sealed with the cluster's key, so that every host opens them.
    if (cluster) clusterSecretsKey = await (await import('../cluster/secretsKey.js')).fetchClusterSecretsKey(cluster);
  } catch (err) {
    io.err(`collimate: cannot reach the cluster database ${redactUrl(cluster!)}: ${(err as Error).message}\n`);
    return 1;
  }
  const policy = tcgPolicy({ accel: accel.accel, accelReason: accel.reason, host, tenants: tenantCount, allowTcg: values['allow-tcg'] === true });
  if (policy.refuse) {
    io.err(policy.message);
    return EXIT_TCG_REFUSED;
  }
  if (policy.banner) io.err(policy.banner);
  // The engine module can be swapped for tests (COLLIMATE_ENGINE_MODULE, a path or URL).
  const override = io.env.COLLIMATE_ENGINE_MODULE;
  const engineModule = override ? (override.includes(':') && !isAbsolute(override) ? override : pathToFileURL(resolve(override)).href) : undefined;
  // Each line carries the time since `npm start` (scripts/start.sh) or since this command began.
  const t0 = startedAt(io.env);
  io.err(`collimate: opening ${dir} and warming catalog templates (the first start with a cache builds them: base first, the others once serving)...\n`);
  const { startServer, StartError } = await import('../server/assemble.js');
  let quotas: QuotaOverrides;
  try {
    // The operator's quotas by tier or tenant (docs/operations.md): a bad setting stops the start.
    quotas = parseQuotaOverrides(io.env.COLLIMATE_QUOTAS);
  } catch (err) {
    io.err(`collimate: ${(err as Error).message}\n`);
    return 2;
  }
  let server: Awaited<ReturnType<typeof startServer>>;
  try {
    server = await startServer({
      home: dir, host, port, logLevel, tls, engineModule,
      service: { quotas },
      // Sandbox ports' own origins, <port>-<id>.<domain> (wildcard DNS to this server): docs/security.md.
      server: {
        ...(io.env.COLLIMATE_SANDBOX_DOMAIN ? { sandboxDomain: io.env.COLLIMATE_SANDBOX_DOMAIN } : {}),
        // A /metrics scrape with this bearer token names tenants' environments (docs/operations.md).
        ...(io.env.COLLIMATE_METRICS_TOKEN ? { metricsToken: io.env.COLLIMATE_METRICS_TOKEN } : {}),
      },
      progress: (m) => io.err(`  [${elapsed(t0, 6)}] ${m}\n`),
      say: (line) => io.err(`${line}\n`),
      ...(cluster ? { cluster: { url: cluster, shownUrl: redactUrl(cluster), advertise: advertise!, capacity, timings, secretsKey: clusterSecretsKey } } : {}),
    });
  } catch (err) {
    // A first start's failure (a download, a bake, a bad directory, the cluster) ends in one line, not a stack.
    if (!(err instanceof StartError)) throw err;
    io.err(`collimate: ${err.message}\n`);
    return 1;
  }
  const { address, engine, node, api } = server;
  const stillBuilding = server.stillBuilding();
  io.err(`collimate serving ${address} (home ${dir}, accel ${engine.accel}${node ? `, cluster host ${node.hostId}` : ''}) after ${elapsed(t0)}${io.env.COLLIMATE_STARTED_AT_MS ? ' in all (set-up included)' : ''}` +
    `${stillBuilding.length ? `; still building ${stillBuilding.join(', ')} in the background (GET /healthz: catalog.building)` : ''}\n`);
  await new Promise<void>((done) => {
    let stopping = false;
    const stop = async (signal: string) => {
      if (stopping) {
        io.err(`${signal} again: exiting now\n`);
        process.exit(1);
      }
      stopping = true;
      io.err(`${signal}: draining requests, then closing (VMs are left running for re-adoption)\n`);
      api.app.log.info({ event: 'stopping', signal }, 'draining requests, then closing; VMs are left running for re-adoption');
      try {
        await server.stop();
        api.app.log.info({ event: 'stopped', signal }, 'stopped');
      } catch (err) {
        api.app.log.error({ err, event: 'stopped', signal }, 'stopping failed');
        throw err;
      } finally {
        done();
      }
    };
    process.once('SIGTERM', () => void stop('SIGTERM'));
    process.once('SIGINT', () => void stop('SIGINT'));
  });
  return 0;
}

async function keys(sub: string | undefined, args: string[], io: Io): Promise<number> {
  await import('../service/migrations.js');
  const { openDb } = await import('../store/db.js');
  const { KeyStore, e2bKeyOf } = await import('../service/keys.js');
  const { isTierName, TIER_NAMES } = await import('../service/tiers.js');
  const opts = { ...common, ...home, tenant: { type: 'string' }, tier: { type: 'string' }, name: { type: 'string' }, all: { type: 'boolean' }, e2b: { type: 'boolean' }, cluster: { type: 'string' } } as const;
  const { values, positionals } = parse(args, opts, sub === 'revoke' ? 1 : 0);
  if (sub === 'create' && values.tier !== undefined && !isTierName(values.tier)) throw new UsageError(`--tier must be one of ${TIER_NAMES.join(', ')}`);
  if (sub !== 'create' && sub !== 'list' && sub !== 'revoke') throw new UsageError(`unknown keys command ${sub ?? ''}`);
  const cluster = clusterUrl(values.cluster, io.env);
  // One store or the other: the local database, or the cluster's (the same operations, async).
  type Store = {
    create(o: { tenant: string; tier?: any; name?: string }): Promise<{ key: string; record: import('../service/keys.js').KeyRecord; tierChanged: boolean }>;
    list(f: { tenant?: string; includeRevoked?: boolean }): Promise<import('../service/keys.js').KeyRecord[]>;
    revoke(k: string): Promise<import('../service/keys.js').KeyRecord | null>;
  };
  let store: Store;
  let close: () => Promise<void>;
  let afterCreate: () => Promise<void> = async () => {};
  if (cluster) {
    const { openClusterDb, migrateCluster } = await import('../cluster/db.js');
    const { ClusterKeys } = await import('../cluster/keys.js');
    const pool = openClusterDb({ url: cluster, max: 1 });
    try {
      await migrateCluster(pool);
    } catch (err) {
      await pool.end();
      io.err(`error: cannot use the cluster database ${redactUrl(cluster)}: ${(err as Error).message}\n`);
      return 1;
    }
    store = new ClusterKeys(pool);
    close = () => pool.end();
  } else {
    const db = openDb(dbPathOf(homeDir(values.home, io)));
    const local = new KeyStore(db);
    store = { create: async (o) => local.create(o), list: async (f) => local.list(f), revoke: async (k) => local.revoke(k) };
    close = async () => {
      db.close();
    };
    afterCreate = () => warnMultiTenantTcg(db, io);
  }
  try {
    switch (sub) {
      case 'create': {
        const tenant = need(values.tenant, '--tenant');
        const { key, record, tierChanged } = await store.create({ tenant, tier: values.tier as any, name: values.name });
        if (tierChanged) io.err(`note: tenant ${tenant} is now on the ${record.tier} tier (applies to all its keys)\n`);
        await afterCreate();
        if (values.json) json(io, { ...record, key, e2b_key: e2bKeyOf(key) });
        else io.out(`created ${record.id} for tenant ${record.tenant} (${record.tier})${cluster ? ', valid on every host of the cluster' : ''}; store the key now, it is not shown again:\n${values.e2b ? e2bKeyOf(key) : key}\n`);
        return 0;
      }
      case 'list': {
        const list = await store.list({ tenant: values.tenant, includeRevoked: values.all });
        if (values.json) json(io, list);
        else io.out(table(list as any[], ['id', 'tenant', 'tier', 'prefix', 'name', 'created_at', 'last_used_at', 'revoked_at']));
        return 0;
      }
      default: {
        const r = await store.revoke(need(positionals[0], 'KEY_ID or KEY'));
        if (!r) {
          io.err(`error: no such key\n`);
          return 1;
        }
        if (values.json) json(io, r);
        else io.out(`revoked ${r.id} (tenant ${r.tenant})\n`);
        return 0;
      }
    }
  } finally {
    await close();
  }
}

const FILE_COLUMNS = ['type', 'permissions', 'owner', 'size', 'modified_at', 'path'];

/** `collimate files`: a sandbox's files through the SDK's SandboxFiles (streamed transfers). */
async function files(sub: string | undefined, args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(
    args,
    { ...http, depth: { type: 'string' }, mode: { type: 'string' }, recursive: { type: 'boolean' } },
    sub === 'mv' || sub === 'upload' || sub === 'download' ? 3 : 2,
  );
  const url = values.url ?? io.env.COLLIMATE_BASE_URL ?? 'http://127.0.0.1:7070';
  const key = values.key ?? io.env.COLLIMATE_API_KEY;
  if (!key) throw new UsageError('no API key: pass --key or set COLLIMATE_API_KEY (create one with `collimate keys create`)');
  const id = need(positionals[0], 'sandbox ID');
  const arg = (i: number, what: string) => need(positionals[i], what);
  const mode = values.mode === undefined ? undefined : /^0?[0-7]{3,4}$/.test(values.mode) ? parseInt(values.mode, 8) : (() => { throw new UsageError('--mode must be octal permission bits, e.g. 755'); })();
  const fs = new SandboxFiles(new Transport({ baseUrl: url, apiKey: key, timeoutMs: 120_000 }), id);
  // /files takes absolute paths; the others resolve relative ones under /root themselves.
  const absolute = (p: string) => (p.startsWith('/') ? p : `/root/${p}`);
  const show = (value: unknown, text: () => string) => io.out(values.json ? JSON.stringify(value, null, 2) + '\n' : text());
  try {
    switch (sub) {
      case 'ls': {
        const r = await fs.list(arg(1, 'PATH'), { depth: num(values.depth, 'depth') });
        show(r, () => table(r.entries as unknown as Record<string, unknown>[], FILE_COLUMNS) + (r.truncated ? '(truncated: more entries than one listing holds)\n' : ''));
        return 0;
      }
      case 'stat': {
        const e = await fs.stat(arg(1, 'PATH'));
        show(e, () => Object.entries(e).map(([k, v]) => `${k.padEnd(15)} ${v}`).join('\n') + '\n');
        return 0;
      }
      case 'exists': {
        const exists = await fs.exists(arg(1, 'PATH'));
        show({ exists }, () => `${exists}\n`);
        return exists ? 0 : 1;
      }
      case 'mkdir': {
        const r = await fs.mkdir(arg(1, 'PATH'), { mode });
        show(r, () => `${r.created ? 'created' : 'exists'} ${r.entry.path}\n`);
        return 0;
      }
      case 'rm': {
        const r = await fs.remove(arg(1, 'PATH'));
        show(r, () => `removed ${r.path} (${r.removed} ${r.removed === 1 ? 'entry' : 'entries'})\n`);
        return 0;
      }
      case 'mv': {
        const e = await fs.rename(arg(1, 'FROM'), arg(2, 'TO'));
        show(e, () => `${e.path}\n`);
        return 0;
      }
      case 'upload': {
        const r = await fs.uploadFrom(arg(1, 'LOCAL'), absolute(arg(2, 'PATH')), { mode });
        show(r, () => `uploaded ${r.size} bytes to ${r.path}\n`);
        return 0;
      }
      case 'download': {
        const local = arg(2, 'LOCAL');
        if (local === '-') {
          const { stream } = await fs.download(absolute(arg(1, 'PATH')));
          for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) io.outBytes(Buffer.from(chunk));
          return 0;
        }
        const r = await fs.downloadTo(absolute(arg(1, 'PATH')), local);
        show(r, () => `downloaded ${r.size} bytes to ${local}\n`);
        return 0;
      }
      case 'watch': {
        const stop = new AbortController();
        const onSignal = () => stop.abort();
        process.once('SIGINT', onSignal);
        try {
          for await (const ev of fs.watch(arg(1, 'PATH'), { recursive: values.recursive, signal: stop.signal })) {
            if (values.json) io.out(JSON.stringify(ev) + '\n');
            else if (ev.type === 'change') io.out(`${ev.op.padEnd(8)} ${ev.name}\n`);
            else io.err(`watch ended: ${ev.reason}\n`);
          }
        } finally {
          process.off('SIGINT', onSignal);
        }
        return 0;
      }
      default:
        throw new UsageError(`unknown files command ${sub ?? ''}`);
    }
  } catch (e) {
    if (e instanceof SdkError) throw new CliHttpError(e.status, e.code, e.message);
    throw e;
  }
}

async function sandboxes(sub: string | undefined, args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(
    args,
    {
      ...http,
      template: { type: 'string' },
      label: { type: 'string', multiple: true },
      timeout: { type: 'string' },
      state: { type: 'string' },
      limit: { type: 'string' },
      after: { type: 'string' },
      count: { type: 'string' },
      command: { type: 'string', short: 'c' },
      code: { type: 'string' },
      env: { type: 'string', multiple: true },
      cwd: { type: 'string' },
      stdin: { type: 'string' },
      stream: { type: 'boolean' },
      egress: { type: 'string' },
      expires: { type: 'string' },
      'idempotency-key': { type: 'string' },
    },
    sub === 'exec' ? Infinity : sub === 'port-url' || sub === 'timeout' ? 2 : 1,
  );
  const api = client(values, io);
  const id = () => encodeURIComponent(need(positionals[0], 'sandbox ID'));
  const idem: Record<string, string> = values['idempotency-key'] ? { 'idempotency-key': values['idempotency-key'] } : {};
  switch (sub) {
    case 'create': {
      const body = { template: need(values.template, '--template'), labels: labels(values.label), timeout_secs: num(values.timeout, 'timeout'), egress: egressArg(values.egress) };
      const r = await api.request('POST', '/v1/sandboxes', body, idem);
      printSandbox(io, r.body, values.json);
      return 0;
    }
    case 'list': {
      const q = new URLSearchParams();
      if (values.state) q.set('state', values.state);
      for (const l of values.label ?? []) q.append('label', l);
      if (values.limit) q.set('limit', values.limit);
      if (values.after) q.set('after', values.after);
      const r = await api.request('GET', `/v1/sandboxes${q.size ? '?' + q : ''}`);
      if (values.json) json(io, r.body);
      else {
        io.out(table(r.body.sandboxes.map(sandboxRow), SANDBOX_COLUMNS));
        if (r.body.next) io.out(`more: --after ${r.body.next}\n`);
      }
      return 0;
    }
    case 'get': {
      const r = await api.request('GET', `/v1/sandboxes/${id()}`);
      if (values.json) json(io, r.body);
      else io.out(Object.entries(r.body).map(([k, v]) => `${k.padEnd(13)} ${typeof v === 'object' && v !== null ? JSON.stringify(v) : v}`).join('\n') + '\n');
      return 0;
    }
    case 'exec': {
      const argv = positionals.slice(1);
      const chosen = [values.command !== undefined, values.code !== undefined, argv.length > 0].filter(Boolean).length;
      if (chosen !== 1) throw new UsageError('exec needs exactly one of --command, --code, or -- ARGV...');
      const env = values.env ? labels(values.env) : undefined;
      const body: Record<string, unknown> = {
        ...(values.command !== undefined ? { command: values.command } : values.code !== undefined ? { code: values.code } : { commands: [argv] }),
        env,
        cwd: values.cwd,
        stdin: values.stdin,
        timeout: num(values.timeout, 'timeout'),
      };
      let result: any;
      if (values.stream) {
        result = await api.execStream(`/v1/sandboxes/${id()}/exec`, body, (event, data) => {
          if (values.json) return;
          if (event === 'stdout') io.outBytes(Buffer.from(data.data, 'base64'));
          if (event === 'stderr') io.errBytes(Buffer.from(data.data, 'base64'));
        });
      } else {
        result = (await api.request('POST', `/v1/sandboxes/${id()}/exec`, body)).body;
        if (!values.json) {
          io.outBytes(Buffer.from(result.stdout, result.stdout_encoding === 'base64' ? 'base64' : 'utf8'));
          io.errBytes(Buffer.from(result.stderr, result.stderr_encoding === 'base64' ? 'base64' : 'utf8'));
        }
      }
      if (values.json) json(io, result);
      else if (result.timed_out) io.err(`(timed out)\n`);
      // The command's own exit code, so scripts can branch on it.
      return typeof result.exit_code === 'number' ? Math.min(255, Math.max(0, result.exit_code)) : 1;
    }
    case 'fork': {
      const r = await api.request('POST', `/v1/sandboxes/${id()}/fork`, { count: num(values.count, 'count') ?? 1, labels: labels(values.label) }, idem);
      if (values.json) json(io, r.body);
      else io.out(table(r.body.sandboxes.map(sandboxRow), SANDBOX_COLUMNS));
      return 0;
    }
    case 'suspend':
    case 'resume': {
      const r = await api.request('POST', `/v1/sandboxes/${id()}/${sub}`);
      printSandbox(io, r.body, values.json);
      return 0;
    }
    case 'timeout': {
      const secs = num(need(positionals[1], 'SECS'), 'SECS');
      const r = await api.request('POST', `/v1/sandboxes/${id()}/timeout`, { timeout_secs: secs });
      if (values.json) json(io, r.body);
      else io.out(`${r.body.id} ends at ${r.body.expires_at} (in ${duration(r.body.remaining_secs ?? 0)})\n`);
      return 0;
    }
    case 'port-url': {
      const port = num(need(positionals[1], 'PORT'), 'PORT');
      const r = await api.request('POST', `/v1/sandboxes/${id()}/port-urls`, { port, expires_in_secs: num(values.expires, 'expires') });
      const url = api.absolute(r.body.url);
      if (values.json) json(io, { ...r.body, url });
      else io.out(`${url}\n(expires ${r.body.expires_at}; anyone with this URL reaches port ${port} without a key)\n`);
      return 0;
    }
    case 'delete': {
      const sid = need(positionals[0], 'sandbox ID');
      await api.request('DELETE', `/v1/sandboxes/${encodeURIComponent(sid)}`);
      if (values.json) json(io, { id: sid, deleted: true });
      else io.out(`deleted ${sid}\n`);
      return 0;
    }
    default:
      throw new UsageError(`unknown sandboxes command ${sub ?? ''}`);
  }
}

const PROCESS_COLUMNS = ['pid', 'status', 'exit_code', 'tag', 'output_bytes', 'started_at', 'command'];

function processRow(p: any): Record<string, unknown> {
  return { ...p, tag: p.tag ?? '', exit_code: p.exit_code ?? '', command: p.argv.join(' ').slice(0, 60) };
}

function size(v: string): { cols: number; rows: number } {
  const m = /^(\d+)x(\d+)$/.exec(v);
  if (!m) throw new UsageError(`size ${v} must be COLSxROWS, e.g. 120x40`);
  return { cols: Number(m[1]), rows: Number(m[2]) };
}

async function processes(sub: string | undefined, args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(
    args,
    {
      ...http,
      command: { type: 'string', short: 'c' },
      env: { type: 'string', multiple: true },
      cwd: { type: 'string' },
      stdin: { type: 'boolean' },
      pty: { type: 'string' },
      tag: { type: 'string' },
      from: { type: 'string' },
      data: { type: 'string' },
      close: { type: 'boolean' },
      signal: { type: 'string' },
      timeout: { type: 'string' },
    },
    sub === 'start' ? Infinity : sub === 'resize' ? 3 : sub === 'list' ? 1 : 2,
  );
  const api = client(values, io);
  const base = `/v1/sandboxes/${encodeURIComponent(need(positionals[0], 'sandbox ID'))}/processes`;
  const pidPath = () => `${base}/${encodeURIComponent(need(positionals[1], 'PID'))}`;
  const show = (p: any) => {
    if (values.json) json(io, p);
    else io.out(`${p.pid} ${p.status}${p.exit_code !== null ? ` exit ${p.exit_code}` : ''}${p.signal ? ` (signal ${p.signal})` : ''}\n`);
  };
  switch (sub) {
    case 'start': {
      const argv = positionals.slice(1);
      if ((values.command !== undefined) === argv.length > 0) throw new UsageError('start needs exactly one of --command or -- ARGV...');
      const body = {
        ...(values.command !== undefined ? { command: values.command } : { argv }),
        env: values.env ? labels(values.env) : undefined, cwd: values.cwd, stdin: values.stdin || undefined,
        pty: values.pty ? size(values.pty) : undefined, tag: values.tag,
      };
      const r = await api.request('POST', base, body);
      if (values.json) json(io, r.body);
      else io.out(`${r.body.pid}\n`);
      return 0;
    }
    case 'list': {
      const r = await api.request('GET', base);
      if (values.json) json(io, r.body);
      else io.out(table(r.body.processes.map(processRow), PROCESS_COLUMNS));
      return 0;
    }
    case 'get': {
      const r = await api.request('GET', pidPath());
      if (values.json) json(io, r.body);
      else io.out(Object.entries(r.body).map(([k, v]) => `${k.padEnd(13)} ${typeof v === 'object' && v !== null ? JSON.stringify(v) : v}`).join('\n') + '\n');
      return 0;
    }
    case 'output': {
      let exit: any;
      const from = values.from ? `?from=${encodeURIComponent(values.from)}` : '';
      await api.stream(`${pidPath()}/output${from}`, (event, data) => {
        if (values.json) io.out(JSON.stringify({ event, ...data }) + '\n');
        else if (event === 'stdout' || event === 'pty') io.outBytes(Buffer.from(data.data, 'base64'));
        else if (event === 'stderr') io.errBytes(Buffer.from(data.data, 'base64'));
        else if (event === 'gap') io.err(`(${data.to - data.from} bytes of output not kept)\n`);
        if (event === 'exit') exit = data.process;
      });
      return typeof exit?.exit_code === 'number' ? Math.min(255, Math.max(0, exit.exit_code)) : 1;
    }
    case 'send': {
      const r = await api.upload(`${pidPath()}/stdin`, values.data !== undefined ? Buffer.from(values.data, 'utf8') : (io.stdin?.() ?? process.stdin));
      if (values.close) await api.request('POST', `${pidPath()}/close-stdin`);
      if (values.json) json(io, r.body);
      else io.out(`wrote ${r.body.written} bytes${values.close ? ', closed stdin' : ''}\n`);
      return 0;
    }
    case 'close-stdin': {
      show((await api.request('POST', `${pidPath()}/close-stdin`)).body);
      return 0;
    }
    case 'kill': {
      show((await api.request('POST', `${pidPath()}/signal`, { signal: values.signal ?? 'SIGTERM' })).body);
      return 0;
    }
    case 'resize': {
      show((await api.request('POST', `${pidPath()}/resize`, size(need(positionals[2], 'COLSxROWS')))).body);
      return 0;
    }
    case 'wait': {
      const r = await api.request('POST', `${pidPath()}/wait`, { timeout: num(values.timeout, 'timeout') });
      show(r.body);
      return r.body.status === 'running' ? 124 : typeof r.body.exit_code === 'number' ? Math.min(255, Math.max(0, r.body.exit_code)) : 1;
    }
    default:
      throw new UsageError(`unknown processes command ${sub ?? ''}`);
  }
}

async function templates(kind: 'templates' | 'images', sub: string | undefined, args: string[], io: Io): Promise<number> {
  if (sub !== 'list') throw new UsageError(`unknown ${kind} command ${sub ?? ''}`);
  const { values } = parse(args, http);
  const r = await client(values, io).request('GET', `/v1/${kind}`);
  if (values.json) json(io, r.body);
  else io.out(table(r.body[kind], ['id', 'kind', 'ready', 'vcpus', 'memory_mib', 'description']));
  return 0;
}

async function usage(args: string[], io: Io): Promise<number> {
  const { values } = parse(args, { ...http, from: { type: 'string' }, to: { type: 'string' }, per: { type: 'string' } });
  const q = new URLSearchParams();
  if (values.from) q.set('from', values.from);
  if (values.to) q.set('to', values.to);
  if (values.per) q.set('per', values.per);
  const r = await client(values, io).request('GET', `/v1/usage${q.size ? '?' + q : ''}`);
  if (values.json) json(io, r.body);
  else {
    io.out(`usage ${r.body.from} .. ${r.body.to}\n`);
    io.out(table([{ id: 'TOTAL', template: '', ...r.body.totals }, ...r.body.sandboxes], ['id', 'template', 'running_secs', 'vcpu_secs', 'memory_mib_secs', 'suspended_secs', 'snapshot_mib_secs']));
    if (r.body.days) {
      io.out('\nper day (UTC)\n');
      io.out(table(r.body.days.map((d: { from: string; totals: object }) => ({ day: d.from.slice(0, 10), ...d.totals })), ['day', 'running_secs', 'vcpu_secs', 'memory_mib_secs', 'suspended_secs', 'snapshot_mib_secs']));
    }
  }
  return 0;
}

async function doctor(args: string[], io: Io): Promise<number> {
  const { values } = parse(args, { ...common, ...home });
  const { doctorChecks, formatChecks } = await import('./doctor.js');
  const checks = doctorChecks(homeDir(values.home, io), io.env);
  if (values.json) json(io, checks);
  else io.out(formatChecks(checks));
  const failed = checks.filter((c) => c.verdict === 'fail');
  if (failed.length && !values.json) io.err(`collimate doctor: ${failed.length} prerequisite${failed.length > 1 ? 's' : ''} broken: ${failed.map((c) => c.name).join(', ')}\n`);
  return failed.length ? 1 : 0;
}

async function service(sub: string | undefined, args: string[], io: Io): Promise<number> {
  if (sub !== 'install' && sub !== 'unit') throw new UsageError(`unknown service command ${sub ?? ''}: use service install or service unit`);
  const { values } = parse(args, {
    ...common, ...home, root: { type: 'string' }, host: { type: 'string' }, port: { type: 'string' }, 'allow-tcg': { type: 'boolean' },
    'tls-cert': { type: 'string' }, 'tls-key': { type: 'string' }, now: { type: 'boolean' }, 'no-enable': { type: 'boolean' },
  });
  const { APP_DIR, installPlan } = await import('./service.js');
  const port = num(values.port, 'port') ?? 7070;
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new UsageError('--port must be a TCP port, 1..65535');
  if ((values['tls-cert'] === undefined) !== (values['tls-key'] === undefined)) throw new UsageError('--tls-cert and --tls-key go together');
  const serveArgs = [
    ...(values['allow-tcg'] ? ['--allow-tcg'] : []),
    ...(values['tls-cert'] ? ['--tls-cert', resolve(values['tls-cert']), '--tls-key', resolve(values['tls-key']!)] : []),
  ];
  const plan = installPlan({
    node: process.execPath,
    appDir: APP_DIR,
    // A service's data lives in /var/lib unless the operator names another home.
    home: resolve(values.home ?? (io.env.COLLIMATE_HOME || '/var/lib/collimate')),
    host: values.host ?? '127.0.0.1',
    port,
    serveArgs,
    root: values.root,
    enable: values['no-enable'] !== true,
    now: values.now === true,
  });
  if (sub === 'unit') {
    io.out(plan.unit);
    return 0;
  }
  try {
    mkdirSync(dirname(plan.unitPath), { recursive: true });
    writeFileSync(plan.unitPath, plan.unit, { mode: 0o644 });
  } catch (e) {
    io.err(`error: cannot write ${plan.unitPath} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}): run as root, or pass --root DIR to write into another tree\n`);
    return 1;
  }
  io.out(`wrote ${plan.unitPath}\n`);
  for (const args of plan.commands) {
    const r = spawnSync('systemctl', args, { encoding: 'utf8', env: io.env as NodeJS.ProcessEnv });
    if (r.error || r.status !== 0) {
      const why = r.error ? (r.error as NodeJS.ErrnoException).code ?? r.error.message : `exit ${r.status}: ${r.stderr.trim()}`;
      io.err(`error: systemctl ${args.join(' ')} failed (${why}); the unit is written at ${plan.unitPath}, run the command again once systemd is reachable\n`);
      return 1;
    }
    io.out(`systemctl ${args.join(' ')}\n`);
  }
  if (values.root) io.out(`installed into ${resolve(values.root)}${values['no-enable'] ? '' : ', enabled there'}\n`);
  else if (values['no-enable']) io.out('not enabled (--no-enable): systemctl enable --now collimate\n');
  else if (!values.now) io.out('enabled: starts at boot; start it now with `systemctl start collimate`; logs: journalctl -u collimate -f\n');
  else io.out('enabled and started; logs: journalctl -u collimate -f\n');
  return 0;
}

async function openapi(args: string[], io: Io): Promise<number> {
  const { values } = parse(args, { ...common, out: { type: 'string' } });
  const { renderOpenApi } = await import('../api/openapi.js');
  const text = renderOpenApi();
  if (values.out) {
    writeFileSync(values.out, text);
    io.err(`wrote ${values.out}\n`);
  } else io.out(text);
  return 0;
}

/** Runs one command line; returns the exit code (2 for usage errors). */
export async function run(argv: string[], io: Io = processIo): Promise<number> {
  const [cmd, sub, ...rest] = argv;
  try {
    if (!cmd || cmd === 'help' || cmd === '--help' || cmd === '-h') {
      io.out(USAGE);
      return cmd ? 0 : 2;
    }
    if ((sub === '--help' || sub === '-h' || rest.includes('--help')) && cmd !== 'serve') {
      io.out(USAGE);
      return 0;
    }
    switch (cmd) {
      case 'serve':
        return await serve(argv.slice(1), io);
      case 'keys':
        return await keys(sub, rest, io);
      case 'sandboxes':
      case 'sandbox':
      case 'sbx':
        return await sandboxes(sub, rest, io);
      case 'processes':
      case 'process':
      case 'proc':
        return await processes(sub, rest, io);
      case 'files':
        return await files(sub, rest, io);
      case 'templates':
        return await templates('templates', sub, rest, io);
      case 'images':
        return await templates('images', sub, rest, io);
      case 'usage':
        return await usage(argv.slice(1), io);
      case 'openapi':
        return await openapi(argv.slice(1), io);
      case 'doctor':
        return await doctor(argv.slice(1), io);
      case 'service':
        return await service(sub, rest, io);
      case 'cluster': {
        const { clusterCommand, UsageArgError } = await import('./cluster.js');
        const flag = rest.find((a, i) => rest[i - 1] === '--cluster') ?? rest.find((a) => a.startsWith('--cluster='))?.slice('--cluster='.length);
        return await clusterCommand(sub, rest, io, clusterUrl(flag, io.env)).catch((e) => {
          throw e instanceof UsageArgError ? new UsageError(e.message) : e;
        });
      }
      default:
        throw new UsageError(`unknown command ${cmd}`);
    }
  } catch (e) {
    if (e instanceof UsageError) {
      io.err(`error: ${e.message}\nrun \`collimate help\` for usage\n`);
      return 2;
    }
    if (e instanceof CliHttpError || e instanceof CollimateError) {
      io.err(`error: ${e.code}: ${e.message}\n`);
      return 1;
    }
    throw e;
  }
}
