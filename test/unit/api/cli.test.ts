import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { KEY_RE } from '../../../src/service/keys.js';
import { run, type Io } from '../../../src/cli/commands.js';
import { fixture, type Fixture } from './helpers.js';

const BIN = fileURLToPath(new URL('../../../bin/collimate.js', import.meta.url));
const FAKE_ENGINE = fileURLToPath(new URL('../../support/fakeEngine.ts', import.meta.url));

function captureIo(env: Record<string, string | undefined> = {}): Io & { stdout: () => string; stderr: () => string } {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  return {
    out: (s) => out.push(Buffer.from(s)),
    err: (s) => err.push(Buffer.from(s)),
    outBytes: (b) => out.push(b),
    errBytes: (b) => err.push(b),
    env,
    stdout: () => Buffer.concat(out).toString(),
    stderr: () => Buffer.concat(err).toString(),
  };
}

const lastLine = (s: string) => s.trimEnd().split('\n').pop()!;

describe('collimate keys', () => {
  let home: string;
  before(() => (home = mkdtempSync(join(tmpdir(), 'collimate-cli-'))));
  after(() => rmSync(home, { recursive: true, force: true }));

  test('create prints the key alone on its last line; list and revoke', async () => {
    const io = captureIo({ COLLIMATE_HOME: home });
    assert.equal(await run(['keys', 'create', '--tenant', 'acme', '--tier', 'demo', '--name', 'ci'], io), 0);
    const key = lastLine(io.stdout());
    assert.match(key, KEY_RE);

    const list = captureIo({ COLLIMATE_HOME: home });
    assert.equal(await run(['keys', 'list', '--json'], list), 0);
    const keys = JSON.parse(list.stdout());
    assert.equal(keys.length, 1);
    assert.equal(keys[0].tenant, 'acme');
    assert.equal(keys[0].tier, 'demo');
    assert.ok(key.startsWith(keys[0].prefix));
    assert.ok(!list.stdout().includes(key), 'the key is never listed');

    const table = captureIo({ COLLIMATE_HOME: home });
    await run(['keys', 'list'], table);
    assert.match(table.stdout(), /^ID\s+TENANT\s+TIER/);

    const rv = captureIo({ COLLIMATE_HOME: home });
    assert.equal(await run(['keys', 'revoke', keys[0].id], rv), 0);
    const after = captureIo({ COLLIMATE_HOME: home });
    await run(['keys', 'list', '--json'], after);
    assert.equal(JSON.parse(after.stdout()).length, 0);
    const all = captureIo({ COLLIMATE_HOME: home });
    await run(['keys', 'list', '--all', '--json'], all);
    assert.ok(JSON.parse(all.stdout())[0].revoked_at);

    const again = captureIo({ COLLIMATE_HOME: home });
    assert.equal(await run(['keys', 'revoke', 'key_000000000000'], again), 1);
  });

  test('usage errors exit 2', async () => {
    for (const argv of [['keys', 'create', '--home', home], ['keys', 'create', '--tenant', 'x', '--tier', 'gold', '--home', home], ['keys', 'frob'], ['nope'], ['sandboxes', 'get', '--bogus']]) {
      const io = captureIo({ COLLIMATE_API_KEY: 'k' });
      assert.equal(await run(argv, io), 2, argv.join(' '));
      assert.match(io.stderr(), /^error: /);
    }
  });

  test('bin/collimate.js works from any cwd', () => {
    const r = spawnSync(process.execPath, [BIN, 'keys', 'create', '--tenant', 'shim', '--home', home], { cwd: '/', encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(lastLine(r.stdout), KEY_RE);
  });
});

describe('collimate sandboxes (HTTP client)', () => {
  let f: Fixture;
  let url: string;
  let key: string;
  before(async () => {
    f = await fixture();
    key = f.key('cli', 'pro');
    url = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  });
  after(() => f.close());

  const cli = async (...argv: string[]) => {
    const io = captureIo({ COLLIMATE_BASE_URL: url, COLLIMATE_API_KEY: key });
    const code = await run(argv, io);
    return { code, out: io.stdout(), err: io.stderr() };
  };

  test('create --egress, and port-url prints a signed URL that works without a key', async () => {
    const c = await cli('sandboxes', 'create', '--template', 'python', '--egress', '{"domains": ["PyPI.org"], "ports": [443]}', '--json');
    assert.equal(c.code, 0, c.err);
    const s = JSON.parse(c.out);
    assert.deepEqual(s.egress, { domains: ['pypi.org'], cidrs: [], ports: [443] });
    const none = JSON.parse((await cli('sandboxes', 'create', '--template', 'python', '--egress', 'none', '--json')).out);
    assert.equal(none.egress, 'none');
    const bad = await cli('sandboxes', 'create', '--template', 'python', '--egress', '{nope');
    assert.equal(bad.code, 2);
    assert.match(bad.err, /--egress/);
    const invalid = await cli('sandboxes', 'create', '--template', 'python', '--egress', 'some');
    assert.notEqual(invalid.code, 0);
    assert.match(invalid.err, /validation_error/);
    const p = await cli('sandboxes', 'port-url', s.id, '8000', '--expires', '60');
    assert.equal(p.code, 0, p.err);
    const link = p.out.split('\n')[0];
    assert.match(link, new RegExp(`^${url}/v1/p/[A-Za-z0-9_-]+/$`));
    assert.match(p.out, /without a key/);
    const j = JSON.parse((await cli('sandboxes', 'port-url', s.id, '8000', '--json')).out);
    assert.ok(j.url.startsWith(`${url}/v1/p/`) && j.port === 8000 && typeof j.expires_at === 'string');
    // The fake sandbox has nothing on 8000 (its portTarget is 127.0.0.1:8000 unless mapped): the URL is accepted, the port is not answering.
    f.svc.portMap.set(8000, 1);
    const r = await fetch(link);
    assert.equal(r.headers.get('x-collimate-error'), 'port_unreachable');
    assert.equal((await cli('sandboxes', 'port-url', s.id)).code, 2, 'PORT is required');
  });

  test('create, list, get, exec, fork, suspend, resume, delete', async () => {
    const c = await cli('sandboxes', 'create', '--template', 'python', '--label', 'run=1', '--json');
    assert.equal(c.code, 0, c.err);
    const s = JSON.parse(c.out);
    assert.equal(s.state, 'running');
    assert.deepEqual(s.labels, { run: '1' });

    const l = await cli('sandboxes', 'list', '--label', 'run=1');
    assert.match(l.out, /^ID\s+TEMPLATE\s+STATE/);
    assert.ok(l.out.includes(s.id));

    const g = await cli('sandboxes', 'get', s.id);
    assert.match(g.out, /state\s+running/);

    let e = await cli('sandboxes', 'exec', s.id, '--command', 'echo hello');
    assert.equal(e.code, 0);
    assert.equal(e.out, 'hello\n');
    e = await cli('sandboxes', 'exec', s.id, '--', 'exit', '3');
    assert.equal(e.code, 3, 'the command exit code is the CLI exit code');
    e = await cli('sandboxes', 'exec', s.id, '--stream', '--command', 'printf-bytes 68690a');
    assert.equal(e.out, 'hi\n');
    e = await cli('sandboxes', 'exec', s.id, '--json', '--code', 'x=1');
    assert.equal(JSON.parse(e.out).stdout, 'x=1');

    const fk = await cli('sandboxes', 'fork', s.id, '--count', '2', '--json');
    assert.equal(JSON.parse(fk.out).sandboxes.length, 2);

    assert.match((await cli('sandboxes', 'suspend', s.id)).out, /suspended/);
    const bad = await cli('sandboxes', 'exec', s.id, '--command', 'echo');
    assert.equal(bad.code, 1);
    assert.match(bad.err, /^error: invalid_state: /);
    assert.match((await cli('sandboxes', 'resume', s.id)).out, /running/);
    assert.equal((await cli('sandboxes', 'delete', s.id)).code, 0);
    assert.match((await cli('sandboxes', 'get', s.id)).err, /sandbox_not_found/);
  });

  test('timeout sets the lease and prints when the session ends; the tier maximum and bad input are errors', async () => {
    const s = JSON.parse((await cli('sandboxes', 'create', '--template', 'python', '--timeout', '60', '--json')).out);
    const t = await cli('sandboxes', 'timeout', s.id, '7200');
    assert.equal(t.code, 0, t.err);
    assert.match(t.out, new RegExp(`^${s.id} ends at \\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z \\(in (1h59m|2h0m)\\)\\n$`));
    const j = JSON.parse((await cli('sandboxes', 'timeout', s.id, '30', '--json')).out);
    assert.ok(j.remaining_secs <= 30 && j.timeout_secs === 60, JSON.stringify(j));
    const tooLong = await cli('sandboxes', 'timeout', s.id, '86401');
    assert.equal(tooLong.code, 1);
    assert.match(tooLong.err, /^error: tier_forbidden: .*maximum session of 86400 s/);
    assert.equal((await cli('sandboxes', 'timeout', s.id)).code, 2, 'SECS is required');
    assert.equal((await cli('sandboxes', 'timeout', s.id, 'soon')).code, 2);
    assert.match((await cli('sandboxes', 'timeout', s.id, '0')).err, /validation_error/);
    await cli('sandboxes', 'delete', s.id);
  });

  test('templates, images, usage', async () => {
    assert.match((await cli('templates', 'list')).out, /python/);
    assert.equal(JSON.parse((await cli('images', 'list', '--json')).out).images.length, 3);
    assert.ok(JSON.parse((await cli('usage', '--json')).out).totals);
  });

  test('a bad key or an unreachable server is a clear error', async () => {
    const io = captureIo({ COLLIMATE_BASE_URL: url, COLLIMATE_API_KEY: 'clm_wrong' });
    assert.equal(await run(['sandboxes', 'list'], io), 1);
    assert.match(io.stderr(), /unauthorized/);
    const down = captureIo({ COLLIMATE_BASE_URL: 'http://127.0.0.1:1', COLLIMATE_API_KEY: key });
    assert.equal(await run(['templates', 'list'], down), 1);
    assert.match(down.stderr(), /connection_failed/);
  });
});

test('collimate serve: health, a request, and a clean SIGTERM that closes the engine', async () => {
  const home = mkdtempSync(join(tmpdir(), 'collimate-serve-'));
  try {
    const mk = spawnSync(process.execPath, [BIN, 'keys', 'create', '--tenant', 'srv', '--home', home], { encoding: 'utf8' });
    const key = lastLine(mk.stdout);
    const child = spawn(process.execPath, [BIN, 'serve', '--port', '0', '--home', home, '--log-level', 'warn'], {
      env: { ...process.env, COLLIMATE_ENGINE_MODULE: FAKE_ENGINE },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    const address = await new Promise<string>((resolve, reject) => {
      child.stderr.on('data', (d) => {
        stderr += d;
        const m = /serving (http:\/\/\S+)/.exec(stderr);
        if (m) resolve(m[1]);
      });
      child.on('exit', (code) => reject(new Error(`serve exited ${code}: ${stderr}`)));
    });
    const h = await fetch(`${address}/healthz`);
    assert.equal(h.status, 200);
    const c = await fetch(`${address}/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: '{"template":"base"}' });
    assert.equal(c.status, 201);
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    child.kill('SIGTERM');
    assert.equal(await exited, 0, stderr);
    assert.ok(existsSync(join(home, 'engine-closed')), 'engine.close() ran');
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});
