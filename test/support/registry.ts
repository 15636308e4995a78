/**
 * A real OCI registry for tests: Debian's docker-registry (distribution 2.x) with its own config in a
 * temporary directory (filesystem storage there, 127.0.0.1 on a free port, optional htpasswd basic
 * auth with a bcrypt hash from `htpasswd -B`), started by the test and killed after. A byte-counting
 * TCP proxy can sit in front of it, so a test can see exactly what a pull moved.
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync, existsSync } from 'node:fs';
import { createServer, connect, type Server, type Socket, type AddressInfo } from 'node:net';
import { join } from 'node:path';

export const REGISTRY_BINARY = '/usr/bin/docker-registry';

/**
 * Lists a test registry the way an operator lists a private one (COLLIMATE_INSECURE_REGISTRIES):
 * pulls reach it over plain HTTP on loopback, which they refuse for any registry not listed. Servers
 * this process spawns afterwards inherit the list.
 */
export function listPrivateRegistry(host: string): void {
  const list = (process.env.COLLIMATE_INSECURE_REGISTRIES ?? '').split(',').filter(Boolean);
  if (!list.includes(host)) process.env.COLLIMATE_INSECURE_REGISTRIES = [...list, host].join(',');
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export interface TestRegistry {
  host: string;
  root: string;
  /** Where the registry keeps blob `digest`'s bytes (tests corrupt them). */
  blobDataPath(digest: string): string;
  stop(): Promise<void>;
}

export async function startRegistry(dir: string, auth?: { username: string; password: string }): Promise<TestRegistry> {
  if (!existsSync(REGISTRY_BINARY)) throw new Error('docker-registry is not installed; run scripts/setup.sh');
  mkdirSync(join(dir, 'data'), { recursive: true });
  const port = await freePort();
  let authYaml = '';
  if (auth) {
    execFileSync('htpasswd', ['-B', '-b', '-c', join(dir, 'htpasswd'), auth.username, auth.password], { stdio: 'ignore' });
    authYaml = `auth:\n  htpasswd:\n    realm: collimate-test\n    path: ${join(dir, 'htpasswd')}\n`;
  }
  const config = join(dir, 'config.yml');
  writeFileSync(config, `version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: ${join(dir, 'data')}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:${port}
${authYaml}`);
  const child: ChildProcess = spawn(REGISTRY_BINARY, ['serve', config], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  const host = `127.0.0.1:${port}`;
  listPrivateRegistry(host);
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`docker-registry exited: ${stderr}`);
    try {
      const r = await fetch(`http://${host}/v2/`);
      await r.body?.cancel();
      if (r.status === 200 || r.status === 401) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) { child.kill('SIGKILL'); throw new Error(`docker-registry did not start: ${stderr}`); }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    host,
    root: join(dir, 'data'),
    blobDataPath: (digest) => join(dir, 'data', 'docker/registry/v2/blobs/sha256', digest.slice(7, 9), digest.slice(7), 'data'),
    stop: async () => {
      if (child.exitCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 3000);
      await exited;
      clearTimeout(t);
    },
  };
}

/** A TCP proxy that counts the bytes flowing from `target` back to clients. */
export interface CountingProxy {
  host: string;
  bytesDown: number;
  reset(): void;
  stop(): Promise<void>;
}

export async function countingProxy(target: string): Promise<CountingProxy> {
  const [th, tp] = [target.split(':')[0], Number(target.split(':')[1])];
  const sockets = new Set<Socket>();
  const p: CountingProxy = { host: '', bytesDown: 0, reset: () => (p.bytesDown = 0), stop: async () => {} };
  const server: Server = createServer((client) => {
    const up = connect(tp, th);
    sockets.add(client).add(up);
    up.on('data', (d) => (p.bytesDown += d.length));
    client.pipe(up).pipe(client);
    const done = () => { client.destroy(); up.destroy(); sockets.delete(client); sockets.delete(up); };
    client.on('error', done).on('close', done);
    up.on('error', done).on('close', done);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  p.host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  listPrivateRegistry(p.host);
  p.stop = () => new Promise<void>((r) => { for (const s of sockets) s.destroy(); server.close(() => r()); });
  return p;
}
