/**
 * `collimate serve` as a service runs it: HTTPS with --tls-cert/--tls-key, JSON log lines on stdout,
 * a clean stop on SIGTERM. The engine is the in-memory fake (no VM); the certificate is self-signed,
 * made by openssl for the test, and everything stays on loopback.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';

const MAIN = fileURLToPath(new URL('../../../src/cli/main.ts', import.meta.url));
const FAKE_ENGINE = fileURLToPath(new URL('../../support/fakeEngine.ts', import.meta.url));
const env = { ...process.env, COLLIMATE_ENGINE_MODULE: FAKE_ENGINE, COLLIMATE_ACCEL: 'tcg' };

let dir: string;
let cert: string;
let key: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'collimate-serve-'));
  cert = join(dir, 'cert.pem');
  key = join(dir, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost', '-keyout', key, '-out', cert], { stdio: 'ignore' });
});
after(() => rmSync(dir, { recursive: true, force: true }));

function getJson(url: string, ca: Buffer): Promise<{ status: number; body: any; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const r = request(url, { ca }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(Buffer.concat(chunks).toString()), headers: res.headers }));
    });
    r.on('error', reject);
    r.end();
  });
}

test('serve --tls-cert/--tls-key serves HTTPS, logs JSON lines on stdout, and stops cleanly on SIGTERM', async () => {
  const home = mkdtempSync(join(dir, 'home-'));
  const child = spawn(process.execPath, ['--import', 'tsx', MAIN, 'serve', '--port', '0', '--home', home, '--tls-cert', cert, '--tls-key', key], {
    env, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  // 'close', not 'exit': at 'exit' the child's stdout may still hold lines not yet read here.
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  try {
    const address = await new Promise<string>((resolve, reject) => {
      child.stderr.on('data', (d) => {
        stderr += d;
        const m = /serving (https:\/\/\S+)/.exec(stderr);
        if (m) resolve(m[1]);
      });
      void exited.then((code) => reject(new Error(`serve exited ${code}: ${stderr}`)));
    });
    const port = new URL(address).port;
    // Verified against the self-signed certificate: a real TLS handshake, not a plaintext fallback.
    const r = await getJson(`https://127.0.0.1:${port}/v1/sandboxes`, readFileSync(cert));
    assert.equal(r.status, 401);
    assert.equal(r.body.error.code, 'unauthorized');
    const plain = await fetch(`http://127.0.0.1:${port}/healthz`).then(() => 'answered', () => 'refused');
    assert.equal(plain, 'refused', 'plain HTTP is not served on the TLS port');

    child.kill('SIGTERM');
    assert.equal(await exited, 0, stderr);
    const lines = stdout.trim().split('\n').map((l) => JSON.parse(l));
    const serving = lines.find((o) => o.event === 'serving');
    assert.equal(serving?.tls, true);
    assert.equal(serving?.mode, 'development');
    const req = lines.find((o) => o.msg === 'request' && o.url === '/v1/sandboxes');
    assert.equal(req?.status, 401);
    assert.equal(req?.reqId, r.headers['x-request-id']);
    assert.deepEqual(lines.filter((o) => o.event === 'stopping' || o.event === 'stopped').map((o) => [o.event, o.signal]), [['stopping', 'SIGTERM'], ['stopped', 'SIGTERM']]);
    assert.equal(readFileSync(join(home, 'engine-closed'), 'utf8'), 'yes');
  } finally {
    child.kill('SIGKILL');
  }
});

test('serve refuses a TLS pair it cannot use, naming the flag and what to pass', () => {
  const serve = (...args: string[]) => spawnSync(process.execPath, ['--import', 'tsx', MAIN, 'serve', '--port', '0', '--home', join(dir, 'bad'), ...args], { encoding: 'utf8', env, timeout: 60_000 });
  const onlyCert = serve('--tls-cert', cert);
  assert.equal(onlyCert.status, 2, onlyCert.stderr);
  assert.match(onlyCert.stderr, /--tls-cert and --tls-key go together/);

  const missing = serve('--tls-cert', join(dir, 'nope.pem'), '--tls-key', key);
  assert.equal(missing.status, 2);
  assert.match(missing.stderr, /--tls-cert .*nope\.pem: cannot read it \(ENOENT\)/);

  const otherKey = join(dir, 'other.pem');
  execFileSync('openssl', ['genpkey', '-algorithm', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-out', otherKey], { stdio: 'ignore' });
  const mismatch = serve('--tls-cert', cert, '--tls-key', otherKey);
  assert.equal(mismatch.status, 2);
  assert.match(mismatch.stderr, /not a usable pair .*PEM private key it was issued for/);

  const garbage = join(dir, 'garbage.pem');
  writeFileSync(garbage, 'not a certificate\n');
  const notPem = serve('--tls-cert', garbage, '--tls-key', key);
  assert.equal(notPem.status, 2);
  assert.match(notPem.stderr, /not a usable pair/);
  assert.doesNotMatch(notPem.stderr + mismatch.stderr, /serving/);
});

test('serve refuses an unknown --log-level', () => {
  const r = spawnSync(process.execPath, ['--import', 'tsx', MAIN, 'serve', '--port', '0', '--home', join(dir, 'lvl'), '--log-level', 'loud'], { encoding: 'utf8', env, timeout: 60_000 });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--log-level must be one of fatal, error, warn, info, debug, trace, silent/);
});
