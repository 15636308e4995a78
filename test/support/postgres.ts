/**
 * A throwaway PostgreSQL 15 for tests: Debian's server binaries, a cluster made by initdb under a
 * temp dir, run as an unprivileged user, listening on 127.0.0.1 on a free port (and on a unix socket
 * in the temp dir). stop() ends it by its postmaster's pid and removes the directory. Nothing here
 * touches the distribution's own cluster (/var/lib/postgresql), which may be running or not.
 *
 * Durability is off (fsync, synchronous_commit, full_page_writes): the data dies with the test.
 */
import { spawnSync } from 'node:child_process';
import { appendFileSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './registry.ts';

export const PG_BIN = process.env.COLLIMATE_PG_BIN ?? '/usr/lib/postgresql/15/bin';
/** The database superuser the throwaway cluster is made with (trust auth on its own socket and loopback). */
const SUPERUSER = 'collimate';

export interface ThrowawayPostgres {
  /** postgres://collimate@127.0.0.1:PORT/postgres (or the address of `listenOn`) */
  url: string;
  port: number;
  /** The postmaster's pid. */
  pid: number;
  dir: string;
  /** A fresh database in this cluster, for a test that wants its own; returns its URL. */
  createDatabase(name: string): string;
  /** Stops the server by pid (fast shutdown, then SIGKILL after 10 s) and removes its directory. Idempotent. */
  stop(): Promise<void>;
}

/** Why a throwaway PostgreSQL cannot run here, or null when it can (tests skip with this reason). */
export function postgresUnavailable(): string | null {
  const why = !existsSync(join(PG_BIN, 'initdb')) || !existsSync(join(PG_BIN, 'postgres'))
    ? `no PostgreSQL 15 server binaries in ${PG_BIN} (scripts/setup.sh installs Debian's postgresql)`
    : process.getuid?.() === 0 && runAsUser() === null ? 'running as root with neither a postgres nor a nobody user to run the server as' : null;
  // CI has run the set-up, which installs PostgreSQL: there a missing server is a failure, not a skip.
  if (why && process.env.CI) throw new Error(`cluster tests cannot run: ${why}`);
  return why;
}

/** The unprivileged user the server runs as when the tests run as root (initdb refuses root). */
function runAsUser(): { name: string; uid: number; gid: number } | null {
  for (const name of ['postgres', 'nobody']) {
    const r = spawnSync('id', ['-u', name], { encoding: 'utf8' });
    const g = spawnSync('id', ['-g', name], { encoding: 'utf8' });
    if (r.status === 0 && g.status === 0) return { name, uid: Number(r.stdout.trim()), gid: Number(g.stdout.trim()) };
  }
  return null;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export interface PostgresOptions {
  /**
   * Another address to listen on besides 127.0.0.1, with trust auth for its /24 (hosts in network
   * namespaces reach the server over a bridge there). The URL then names this address.
   */
  listenOn?: string;
}

export async function startPostgres(opts: PostgresOptions = {}): Promise<ThrowawayPostgres> {
  const why = postgresUnavailable();
  if (why) throw new Error(why);
  const dir = mkdtempSync(join(tmpdir(), 'collimate-pg-'));
  const user = process.getuid?.() === 0 ? runAsUser()! : null;
  if (user) chownSync(dir, user.uid, user.gid);
  // As root, each server binary runs as the unprivileged user (runuser keeps no privileges).
  const run = (bin: string, args: string[]) =>
    spawnSync(user ? 'runuser' : join(PG_BIN, bin), user ? ['-u', user.name, '--', join(PG_BIN, bin), ...args] : args, { encoding: 'utf8', cwd: dir });
  const data = join(dir, 'data');
  try {
    const init = run('initdb', ['-D', data, '-U', SUPERUSER, '-A', 'trust', '--no-sync', '-E', 'UTF8', '--locale=C']);
    if (init.status !== 0) throw new Error(`initdb failed (${init.status}): ${init.stderr || init.stdout}`);
    if (opts.listenOn) appendFileSync(join(data, 'pg_hba.conf'), `host all all ${opts.listenOn.replace(/\.\d+$/, '.0')}/24 trust\n`);
    const listen = ['127.0.0.1', ...(opts.listenOn ? [opts.listenOn] : [])].join(',');
    // A port found free can be taken before the server binds it: try again with another.
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      const start = run('pg_ctl', [
        '-D', data, '-l', join(dir, 'server.log'), '-w', '-t', '60', 'start',
        '-o', `-p ${port} -c listen_addresses=${listen} -k ${dir} -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB`,
      ]);
      if (start.status === 0) {
        const pid = Number(readFileSync(join(data, 'postmaster.pid'), 'utf8').split('\n')[0]);
        return handle(dir, port, pid, opts.listenOn ?? '127.0.0.1');
      }
      const log = existsSync(join(dir, 'server.log')) ? readFileSync(join(dir, 'server.log'), 'utf8') : '';
      if (attempt >= 3 || !/could not bind|Address already in use/.test(log)) throw new Error(`pg_ctl start failed (${start.status}): ${start.stderr}\n${log.slice(-2000)}`);
    }
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

function handle(dir: string, port: number, pid: number, address: string): ThrowawayPostgres {
  const url = `postgres://${SUPERUSER}@${address}:${port}/postgres`;
  let stopped: Promise<void> | null = null;
  // A test process that ends without stop() (a failure, or the runner's timeout signalling it)
  // must not leave the server behind: SIGQUIT is PostgreSQL's immediate shutdown.
  const onExit = () => {
    if (alive(pid)) process.kill(pid, 'SIGQUIT');
  };
  const onSignal = (signal: NodeJS.Signals) => {
    onExit();
    process.kill(process.pid, signal); // the handler was once: this signal now does what it would have
  };
  process.once('exit', onExit);
  process.once('SIGTERM', onSignal);
  process.once('SIGINT', onSignal);
  return {
    url,
    port,
    pid,
    dir,
    createDatabase(name: string): string {
      if (!/^[a-z][a-z0-9_]{0,62}$/.test(name)) throw new Error(`database name ${name} must be lowercase letters, digits and _`);
      const r = spawnSync(join(PG_BIN, 'psql'), ['-X', '-q', '-d', url, '-c', `CREATE DATABASE ${name}`], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`CREATE DATABASE ${name} failed: ${r.stderr}`);
      return `postgres://${SUPERUSER}@${address}:${port}/${name}`;
    },
    stop() {
      stopped ??= (async () => {
        process.off('exit', onExit);
        process.off('SIGTERM', onSignal);
        process.off('SIGINT', onSignal);
        // SIGINT is PostgreSQL's fast shutdown: clients are disconnected, the server exits cleanly.
        if (alive(pid)) process.kill(pid, 'SIGINT');
        const deadline = Date.now() + 10_000;
        while (alive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
        if (alive(pid)) process.kill(pid, 'SIGKILL');
        while (alive(pid)) await new Promise((r) => setTimeout(r, 20));
        rmSync(dir, { recursive: true, force: true });
      })();
      return stopped;
    },
  };
}
