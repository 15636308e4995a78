import { mkdtempSync, mkdirSync, readdirSync, existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';
import { Engine, type EngineOptions } from '../../src/sandboxes/engine.ts';
import { jailerFor } from '../../src/vmm/jail.ts';
import { qemuProcessesNaming } from '../../src/sandboxes/runtime.ts';
import { homeNamespaces } from '../../src/net/netns.ts';
import type { ApiServer } from '../../src/api/server.ts';
import { startServer, type ServerTuning } from '../../src/server/assemble.ts';
import type { ImageService } from '../../src/images/service.ts';
import type { QuotaOverrides } from '../../src/service/quotas.ts';

/** Guest assets and artifacts are shared by every test file (content-addressed, read-only once built). */
export const TEST_CACHE = process.env.COLLIMATE_CACHE_DIR ?? '/var/tmp/collimate-test-cache';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export function testHome(name: string): string {
  mkdirSync('/tmp/collimate-it', { recursive: true });
  return mkdtempSync(join('/tmp/collimate-it', `${name}-`));
}

export async function openEngine(home: string, opts: EngineOptions = {}): Promise<Engine> {
  mkdirSync(TEST_CACHE, { recursive: true });
  return Engine.open({
    home,
    cacheDir: TEST_CACHE,
    poolSize: 2,
    // Pools follow demand (poolSizer.ts); kept small here so that a test's bursts do not make every
    // later test share two cores with dozens of refills (pools.test.ts sets its own bounds).
    poolMax: 4,
    catalog: ['base'],
    progress: process.env.COLLIMATE_TEST_VERBOSE ? (m) => console.error(`[engine] ${m}`) : undefined,
    ...opts,
  });
}

/** QEMU processes whose command line mentions `needle` (a test home), by pid. */
export const qemuProcesses = qemuProcessesNaming;

function walk(dir: string, out: string[] = []): string[] {
  if (!existsSync(dir)) return out;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) walk(p, out); else out.push(p);
  }
  return out;
}

/**
 * The leak check: after every sandbox is deleted and the engine closed, no QEMU process, socket,
 * per-sandbox file, fork point, RAM file or VMM cgroup of this home may remain.
 */
export async function assertNoLeaks(engine: Engine, home: string): Promise<void> {
  const ramDir = engine.cfg.ramDir;
  await engine.deleteAll();
  await engine.close();
  const deadline = Date.now() + 5000;
  while (qemuProcesses(home).length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(qemuProcesses(home), [], 'QEMU processes left running');
  assert.deepEqual(walk(join(home, 'sandboxes')), [], 'per-sandbox files left');
  assert.deepEqual(walk(join(home, 'forkpoints')), [], 'fork point files left');
  assert.deepEqual(walk(join(home, 'disks')), [], 'disk layers left');
  assert.deepEqual(walk(home).filter((f) => f.endsWith('.sock')), [], 'sockets left');
  const ram = existsSync(ramDir) ? readdirSync(ramDir).filter((f) => !f.startsWith('artifact-')) : [];
  assert.deepEqual(ram, [], 'RAM files left');
  const jailer = await jailerFor(engine.cfg);
  if (jailer) assert.deepEqual(jailer.cgroupDirs(), [], 'VMM cgroups left');
  assert.deepEqual(homeNamespaces(engine.cfg.homeTag), [], 'network namespaces left');
}

/**
 * The API over a real engine, assembled as `collimate serve` does (src/server/assemble.ts): one
 * tenant service (images optional) under every door, /healthz included, not listening until the test
 * listens. `close` shuts the server and the service (not the engine).
 */
export type Served = ApiServer & { close(graceMs?: number): Promise<void> };

export async function serveEngine(engine: Engine, opts: ServerTuning & { images?: ImageService; quotas?: QuotaOverrides } = {}): Promise<Served> {
  const { images, quotas, ...server } = opts;
  const s = await startServer({ engine, images, listen: false, service: { reconcileIntervalMs: 0, quotas }, server });
  return { ...s.api, close: (graceMs = 1000) => s.stop(graceMs) };
}

/** `collimate keys create` against a server's home, as an operator would; the key is the last line. */
export async function createKey(home: string, tenant: string, tier: string): Promise<string> {
  const cli = ['--import', 'tsx', join(ROOT, 'src/cli/main.ts'), 'keys', 'create', '--tenant', tenant, '--tier', tier, '--home', home];
  const { stdout } = await promisify(execFile)(process.execPath, cli, { cwd: ROOT });
  const key = stdout.trim().split('\n').pop()!;
  assert.match(key, /^clm_[0-9A-Za-z]{40}$/);
  return key;
}

/**
 * What each of docs/examples prints when it works (on stdout), wherever it runs: in this repository
 * (sdk.test.ts) or installed from the SDK packages (packages.test.ts).
 */
export const EXAMPLE_OUTPUT: Record<string, RegExp[]> = {
  'quickstart.ts': [/hello from Linux \(exit 0\)/, /tick 3/, /child reads: remember me/, /while suspended: invalid_state/, /after resume: remember me/],
  'quickstart.py': [/hello from Linux \(exit 0\)/, /tick 3/, /stdout out/, /stderr err/, /child reads: remember me/, /while suspended: invalid_state/],
  'best_of_n.ts': [/winner: candidate 2 printed 97/, /swept: 0/],
  'best_of_n.py': [/winner: candidate 2 printed 97/, /swept: 0/],
  'mcp_client.ts': [/protocol: 2025-11-25/, /exec: 42/, /child sbx_[0-9a-f]{12} reads 42[\s\S]*child sbx_[0-9a-f]{12} reads 42/, /after delete: sandbox_not_found/],
};
