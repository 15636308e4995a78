/**
 * `collimate serve` run the way the systemd unit runs it (deploy/collimate.service): HTTPS, JSON log
 * lines on stdout, and a stop that signals only the server process (KillMode=process). The sandbox's
 * QEMU must outlive the stop and answer after the restart; the log must show its lifecycle.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { request } from 'node:https';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import '../../src/service/migrations.ts';
import { openEngine, testHome, assertNoLeaks, TEST_CACHE, createKey, qemuProcesses } from './fixture.ts';

const BIN = fileURLToPath(new URL('../../bin/collimate.js', import.meta.url));

interface Serving { child: ChildProcess; base: string; logs: () => Array<Record<string, any>>; exited: Promise<number | null> }

function startServe(home: string, tls: { cert: string; key: string }): Promise<Serving> {
  const child = spawn(process.execPath, [BIN, 'serve', '--home', home, '--host', '127.0.0.1', '--port', '0', '--tls-cert', tls.cert, '--tls-key', tls.key], {
    env: { ...process.env, COLLIMATE_CACHE_DIR: TEST_CACHE, COLLIMATE_POOL_SIZE: '1', COLLIMATE_LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const logs = () => out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start: ${err}`)), 300_000);
    child.stderr!.on('data', (d) => {
      err += d;
      const m = /collimate serving (https:\/\/\S+)/.exec(err);
      if (m) { clearTimeout(timer); resolve({ child, base: m[1], logs, exited }); }
    });
    void exited.then((code) => { clearTimeout(timer); reject(new Error(`serve exited ${code}: ${err}`)); });
  });
}

function call(base: string, ca: Buffer, key: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: any }> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const r = request(`${base}${path}`, { method, ca, headers: { authorization: `Bearer ${key}`, ...(payload ? { 'content-type': 'application/json' } : {}) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        resolve({ status: res.statusCode!, json: text ? JSON.parse(text) : undefined });
      });
    });
    r.on('error', reject);
    r.end(payload);
  });
}

test('a stop that signals only the server leaves the sandbox running; the restarted server serves it; the JSON log tells its lifecycle', async () => {
  const home = testHome('service');
  const cert = join(home, 'cert.pem');
  const keyFile = join(home, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', keyFile, '-out', cert], { stdio: 'ignore' });
  const ca = readFileSync(cert);
  const key = await createKey(home, 'svc', 'pro');

  let s = await startServe(home, { cert, key: keyFile });
  const created = await call(s.base, ca, key, 'POST', '/v1/sandboxes', { template: 'base' });
  assert.equal(created.status, 201, JSON.stringify(created.json));
  const id = created.json.id as string;
  assert.equal((await call(s.base, ca, key, 'POST', `/v1/sandboxes/${id}/exec`, { command: 'echo kept > /root/kept' })).status, 200);
  const vmms = new Set(qemuProcesses(home));

  // What systemd does on stop with KillMode=process: SIGTERM to the main process only.
  s.child.kill('SIGTERM');
  assert.equal(await s.exited, 0);
  const first = s.logs();
  const alive = [...vmms].filter((pid) => qemuProcesses(home).includes(pid));
  assert.ok(alive.length > 0, 'the sandbox QEMU outlived the server');
  assert.deepEqual(first.filter((o) => o.msg === 'sandbox transition').map((o) => [o.sandbox_id, o.op, o.state, o.tenant]), [[id, 'create', 'running', 'svc']]);
  assert.ok(first.some((o) => o.msg === 'lifecycle phases' && o.sandbox_id === id && o.op === 'create' && o.total_ms > 0));
  const execLine = first.find((o) => o.msg === 'request' && o.method === 'POST' && o.url === `/v1/sandboxes/${id}/exec`);
  assert.equal(execLine?.status, 200);
  assert.equal(execLine?.sandbox_id, id);
  assert.equal(execLine?.tenant, 'svc');
  assert.match(execLine?.reqId ?? '', /^req-[0-9a-f]{16}$/);
  assert.deepEqual(first.filter((o) => /^stop/.test(o.event ?? '')).map((o) => o.event), ['stopping', 'stopped']);

  s = await startServe(home, { cert, key: keyFile });
  try {
    const r = await call(s.base, ca, key, 'POST', `/v1/sandboxes/${id}/exec`, { command: 'cat /root/kept' });
    assert.equal(r.json.stdout, 'kept\n', 'the same VM, re-adopted');
    assert.equal((await call(s.base, ca, key, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
    assert.deepEqual(s.logs().filter((o) => o.msg === 'sandbox transition').map((o) => [o.sandbox_id, o.op, o.state]), [[id, 'delete', 'deleted']]);
  } finally {
    s.child.kill('SIGTERM');
    await s.exited;
  }
  await assertNoLeaks(await openEngine(home, { poolSize: 0 }), home);
});
