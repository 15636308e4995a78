/**
 * `collimate serve --cluster` hosts on real microVMs, for the cluster tests and bench/cluster.ts:
 * each is a server process with its own home, on loopback or in a machine of a HostNet
 * (test/support/hostNet.ts), sharing the test cache's built guest assets and checkpoints.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import type { HostNet } from '../support/hostNet.ts';
import { freePort } from '../support/registry.ts';
import { rmSync } from 'node:fs';
import { qemuProcesses, TEST_CACHE, testHome } from './fixture.js';

const cli = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface ClusterHost {
  url: string;
  home: string;
  child: ChildProcess;
  /** Where it runs: the HostNet machine's index, or undefined on loopback. */
  machine?: number;
  /** The environment it was started with beyond the defaults (its cache, say): a restart keeps it. */
  env?: Record<string, string>;
  stderr: () => string;
}

export interface HostOptions {
  cluster: string;
  capacity: number;
  /** Run in machine `machine` of `net` (listening on its address), instead of on loopback. */
  net?: HostNet;
  machine?: number;
  /** An existing home: the host restarts as itself. */
  home?: string;
  /** heartbeat,lease,dead-after in ms (COLLIMATE_CLUSTER_TIMINGS); null: the server's defaults. */
  timings?: string | null;
  env?: Record<string, string>;
}

/** Starts a host and resolves once its /healthz answers 200 (its pools may still be warming). */
export async function startClusterHost(o: HostOptions): Promise<ClusterHost> {
  const home = o.home ?? testHome('cluster-host');
  const inNet = o.net && o.machine !== undefined;
  const addr = inNet ? o.net!.address(o.machine!) : '127.0.0.1';
  const port = inNet ? 7070 : await freePort();
  const url = `http://${addr}:${port}`;
  const argv = [
    process.execPath, '--import', 'tsx', cli, 'serve', '--home', home, '--host', addr, '--port', String(port), '--allow-tcg',
    '--cluster', o.cluster, '--advertise', url, '--capacity', String(o.capacity),
  ];
  const [cmd, ...args] = inNet ? [...o.net!.prefix(o.machine!), ...argv] : argv;
  const child = spawn(cmd, args, {
    env: {
      ...process.env, COLLIMATE_CACHE_DIR: TEST_CACHE, COLLIMATE_POOL_SIZE: '1', COLLIMATE_POOL_MAX: '1', COLLIMATE_LOG_LEVEL: 'warn',
      // Leases with room for heartbeats a loaded machine delays, unless the test says otherwise.
      ...(o.timings === null ? {} : { COLLIMATE_CLUSTER_TIMINGS: o.timings ?? '1000,15000,20000' }),
      ...o.env,
    },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  process.once('exit', () => child.kill('SIGKILL'));
  let stderr = '';
  child.stderr!.on('data', (d) => { stderr += d; });
  const deadline = Date.now() + 600_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`serve exited: ${stderr}`);
    try {
      if ((await fetch(`${url}/healthz`)).status === 200) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) throw new Error(`serve did not become healthy: ${stderr}`);
    await sleep(200);
  }
  return { url, home, child, machine: o.machine, env: o.env, stderr: () => stderr };
}

/** Stops a host: SIGTERM (a clean stop) or SIGKILL, and waits for its process to end. */
export async function stopClusterHost(h: ClusterHost, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (h.child.exitCode !== null || h.child.signalCode !== null) return;
  const exited = new Promise((r) => h.child.once('exit', r));
  h.child.kill(signal);
  await exited;
}

/** An API key valid on every host of the cluster (`collimate keys create --cluster`). */
export function clusterKey(cluster: string, tenant: string, tier: string): string {
  const r = spawnSync(process.execPath, ['--import', 'tsx', cli, 'keys', 'create', '--tenant', tenant, '--tier', tier, '--cluster', cluster], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trimEnd().split('\n').pop()!;
}

export interface Answer {
  status: number;
  headers: Headers;
  bytes: Buffer;
  json: any;
}

/** One request with the key; the body as bytes and, when it is JSON, parsed. */
export async function clusterCall(base: string, key: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
    body: body === undefined ? undefined : Buffer.isBuffer(body) ? body : JSON.stringify(body),
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  let json: any = null;
  try { json = JSON.parse(bytes.toString('utf8')); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, bytes, json };
}

/**
 * A test's sandboxes on a cluster: where one runs (the directory's owner, read through `db`, the
 * test's pool once it has one), and creates and deletes through a host that keep `owned` (what the
 * test deletes at its end if it failed first).
 */
export function clusterSandboxes(db: () => pg.Pool, hostOf: Map<string, ClusterHost>, owned: Array<{ id: string; key: string }>) {
  return {
    ownerOf: async (id: string): Promise<ClusterHost> => hostOf.get((await db().query('SELECT host_id FROM sandboxes WHERE id = $1', [id])).rows[0].host_id)!,
    create: async (via: ClusterHost, key: string, body: Record<string, unknown> = { template: 'base' }): Promise<string> => {
      const r = await clusterCall(via.url, key, 'POST', '/v1/sandboxes', body);
      assert.equal(r.status, 201, r.bytes.toString());
      owned.push({ id: r.json.id, key });
      return r.json.id;
    },
    remove: async (via: ClusterHost, key: string, id: string): Promise<void> => {
      assert.equal((await clusterCall(via.url, key, 'DELETE', `/v1/sandboxes/${id}`)).status, 204, `delete ${id}`);
      owned.splice(owned.findIndex((o) => o.id === id), 1);
    },
  };
}

/** After the hosts stopped: asserts that none left a QEMU process (each given 10 s to exit), and removes their homes. */
export async function removeHostHomes(hosts: ClusterHost[]): Promise<void> {
  for (const h of hosts) {
    const deadline = Date.now() + 10_000;
    while (qemuProcesses(h.home).length > 0 && Date.now() < deadline) await sleep(50);
    assert.deepEqual(qemuProcesses(h.home), [], `no QEMU of ${h.home} left`);
    rmSync(h.home, { recursive: true, force: true });
  }
}
