import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { tcgPolicy, isLoopbackHost, EXIT_TCG_REFUSED } from '../../../src/cli/commands.ts';
import { startServe } from '../../support/serveProcess.ts';

// `node --import tsx src/cli/main.ts serve ...`, as an operator would run it; the engine is the
// in-memory fake so that no VM is needed (the policy is decided before the engine opens).
const MAIN = fileURLToPath(new URL('../../../src/cli/main.ts', import.meta.url));
const FAKE_ENGINE = fileURLToPath(new URL('../../support/fakeEngine.ts', import.meta.url));

function cli(args: string[], env: Record<string, string>) {
  return spawnSync(process.execPath, ['--import', 'tsx', MAIN, ...args], {
    encoding: 'utf8', env: { ...process.env, COLLIMATE_ENGINE_MODULE: FAKE_ENGINE, ...env }, timeout: 60_000,
  });
}

function withHome(fn: (home: string) => Promise<void> | void) {
  return async () => {
    const home = mkdtempSync(join(tmpdir(), 'collimate-policy-'));
    try { await fn(home); } finally { rmSync(home, { recursive: true, force: true }); }
  };
}

test('loopback hosts', () => {
  for (const h of ['127.0.0.1', '127.1.2.3', '::1', '[::1]', 'localhost', 'LOCALHOST']) assert.ok(isLoopbackHost(h), h);
  for (const h of ['0.0.0.0', '::', '10.0.0.5', 'example.com', '128.0.0.1']) assert.ok(!isLoopbackHost(h), h);
});

test('policy: KVM never refuses; TCG is development mode and refuses a shared service without --allow-tcg', () => {
  const base = { accelReason: 'no /dev/kvm', host: '127.0.0.1', tenants: 1, allowTcg: false };
  assert.deepEqual(tcgPolicy({ ...base, accel: 'kvm', host: '0.0.0.0', tenants: 5 }), { refuse: false });
  const dev = tcgPolicy({ ...base, accel: 'tcg' });
  assert.equal(dev.refuse, false);
  assert.match((dev as { banner: string }).banner, /DEVELOPMENT MODE.*TCG.*does not treat TCG guest escapes as security bugs/);
  for (const over of [{ tenants: 2 }, { host: '0.0.0.0' }]) {
    const r = tcgPolicy({ ...base, accel: 'tcg', ...over });
    assert.equal(r.refuse, true);
    const msg = (r as { message: string }).message;
    assert.match(msg, /refusing to serve/);
    assert.match(msg, /only KVM-accelerated guests as a security boundary/);
    assert.match(msg, /https:\/\/www\.qemu\.org\/docs\/master\/system\/security\.html/);
    assert.match(msg, /--allow-tcg/);
    assert.match(msg, /kvm_intel or kvm_amd/);
    const allowed = tcgPolicy({ ...base, accel: 'tcg', ...over, allowTcg: true });
    assert.equal(allowed.refuse, false);
    assert.match((allowed as { banner: string }).banner, /serving anyway \(--allow-tcg\)/);
  }
});

test('collimate serve under TCG refuses to listen beyond loopback, naming why and how', withHome((home) => {
  const r = cli(['serve', '--host', '0.0.0.0', '--port', '0', '--home', home], { COLLIMATE_ACCEL: 'tcg' });
  assert.equal(r.status, EXIT_TCG_REFUSED, r.stderr);
  assert.match(r.stderr, /refusing to serve: --host 0\.0\.0\.0 listens beyond loopback/);
  assert.match(r.stderr, /qemu\.org\/docs\/master\/system\/security\.html/);
  assert.match(r.stderr, /--allow-tcg/);
  assert.doesNotMatch(r.stderr, /serving http/);
}));

test('collimate serve under TCG refuses a database with two tenants; `keys create` warns when the second appears', withHome((home) => {
  assert.equal(cli(['keys', 'create', '--tenant', 'alpha', '--home', home], { COLLIMATE_ACCEL: 'tcg' }).status, 0);
  const second = cli(['keys', 'create', '--tenant', 'beta', '--home', home], { COLLIMATE_ACCEL: 'tcg' });
  assert.equal(second.status, 0);
  assert.match(second.stderr, /2 tenants now hold keys.*will refuse to start without --allow-tcg/);
  const r = cli(['serve', '--port', '0', '--home', home], { COLLIMATE_ACCEL: 'tcg' });
  assert.equal(r.status, EXIT_TCG_REFUSED, r.stderr);
  assert.match(r.stderr, /the keys table has 2 tenants/);
}));

test('collimate serve --allow-tcg starts in development mode and /healthz says so', withHome(async (home) => {
  cli(['keys', 'create', '--tenant', 'alpha', '--home', home], {});
  cli(['keys', 'create', '--tenant', 'beta', '--home', home], {});
  const serve = await startServe(['--host', '0.0.0.0', '--port', '0', '--home', home, '--allow-tcg', '--log-level', 'warn'], {
    ...process.env, COLLIMATE_ENGINE_MODULE: FAKE_ENGINE, COLLIMATE_ACCEL: 'tcg',
  });
  const stderr = serve.stderr();
  try {
    assert.match(stderr, /DEVELOPMENT MODE: accelerator TCG/);
    assert.match(stderr, /serving anyway \(--allow-tcg\): the keys table has 2 tenants and --host 0\.0\.0\.0 listens beyond loopback/);
    const h = (await (await fetch(`${serve.url}/healthz`)).json()) as any;
    assert.equal(h.mode, 'development');
    assert.equal(h.accel, 'tcg');
    assert.equal(h.isolation, 'QEMU does not treat TCG guest escapes as security bugs');
    assert.equal(typeof h.confinement?.enabled, 'boolean');
  } finally {
    serve.child.kill('SIGKILL');
  }
}));

test('with KVM the same multi-tenant, all-interfaces server starts without --allow-tcg and without a banner', withHome(async (home) => {
  cli(['keys', 'create', '--tenant', 'alpha', '--home', home], {});
  cli(['keys', 'create', '--tenant', 'beta', '--home', home], {});
  const serve = await startServe(['--host', '0.0.0.0', '--port', '0', '--home', home, '--log-level', 'warn'], {
    ...process.env, COLLIMATE_ENGINE_MODULE: FAKE_ENGINE, COLLIMATE_ACCEL: 'kvm',
  });
  try {
    assert.doesNotMatch(serve.stderr(), /DEVELOPMENT MODE|refusing/);
  } finally {
    serve.child.kill('SIGKILL');
  }
}));
