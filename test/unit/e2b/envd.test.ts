/**
 * E2B's envd front door driven by the unmodified `e2b` SDK (newest pinned 2.x and an older 2.x) over
 * a real loopback listener: Connect unary and server-streaming calls, /files uploads (multipart and
 * octet-stream) and downloads, the access token. The sandbox is the fake service and processes and
 * files are the host's (HostEnvdBackend); the guest agent behind the same calls is
 * test/integration/e2b.test.ts.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import * as e2bNew from 'e2b';
import * as e2bOld from 'e2b-2-30';
import { e2bKeyOf } from '../../../src/service/keys.js';
import { openDb } from '../../../src/store/db.js';
import { FakeSandboxService } from '../../support/fakeSandboxService.js';
import { HostEnvdBackend } from '../../support/hostEnvdBackend.js';
import { serverOn } from '../api/helpers.js';
import type { ApiServer } from '../../../src/api/server.js';

let dir: string;
let api: ApiServer;
let backend: HostEnvdBackend;
let base: string;
let key: string;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'collimate-envd-'));
  backend = new HostEnvdBackend(join(dir, 'guest'));
  const db = openDb(join(dir, 'collimate.db'));
  api = await serverOn(new FakeSandboxService({ events: true }), db, { envdBackend: backend });
  await api.app.listen({ host: '127.0.0.1', port: 0 });
  base = `http://127.0.0.1:${(api.app.server.address() as AddressInfo).port}`;
  key = e2bKeyOf(api.keys.create({ tenant: 'acme', tier: 'pro' }).key);
});

after(async () => {
  backend.close();
  await api.shutdown(100);
  rmSync(dir, { recursive: true, force: true });
});

const opts = () => ({ apiKey: key, apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd` });

for (const [version, sdk] of [['2.51', e2bNew], ['2.30', e2bOld as unknown as typeof e2bNew]] as const) {
  describe(`e2b ${version} against envd`, () => {
    it('runs a command with streamed stdout/stderr, the sandbox envs and its own', async () => {
      const sbx = await sdk.Sandbox.create('python', { ...opts(), envs: { FROM_SANDBOX: 'sbx' } });
      const out: string[] = [];
      const err: string[] = [];
      const r = await sbx.commands.run('echo "$FROM_SANDBOX $OWN"; echo oops >&2', { envs: { OWN: 'own' }, onStdout: (d) => void out.push(d), onStderr: (d) => void err.push(d) });
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, 'sbx own\n');
      assert.equal(out.join(''), 'sbx own\n');
      assert.equal(err.join(''), 'oops\n');
      // As envd: the error is Go's "exit status N", which the SDK shows as the CommandExitError's message.
      await assert.rejects(sbx.commands.run('exit 3'), (e: Error & { exitCode?: number; error?: string }) => e instanceof sdk.CommandExitError && e.exitCode === 3 && e.error === 'exit status 3');
      await sbx.kill();
    });

    it('starts a background command, feeds it stdin, lists it, and kills it', async () => {
      const sbx = await sdk.Sandbox.create('python', opts());
      const seen: string[] = [];
      const handle = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => void seen.push(d) });
      assert.ok(handle.pid > 0);
      await sbx.commands.sendStdin(handle.pid, 'hello through stdin\n');
      for (let i = 0; i < 100 && seen.join('') !== 'hello through stdin\n'; i++) await new Promise((r) => setTimeout(r, 20));
      assert.equal(seen.join(''), 'hello through stdin\n');
      const listed = await sbx.commands.list();
      assert.ok(listed.some((p) => p.pid === handle.pid), JSON.stringify(listed));
      assert.equal(await sbx.commands.kill(handle.pid), true);
      const result = await handle.wait().catch((e) => e);
      assert.ok(result instanceof sdk.CommandExitError, String(result));
      assert.equal((await sbx.commands.list()).some((p) => p.pid === handle.pid), false);
      await sbx.kill();
    });

    it("removing a path that is not there succeeds, as E2B's does; connecting to a pid that is not there rejects", async () => {
      const sbx = await sdk.Sandbox.create('python', opts());
      await sbx.files.remove('/tmp/never-was-here.txt');
      await assert.rejects(sbx.commands.connect(999_999), (e: Error) => e instanceof sdk.NotFoundError || /not found|no process/i.test(e.message));
      // A real one still connects, and sees its output and end.
      const bg = await sbx.commands.run('sleep 0.3; echo late', { background: true });
      const again = await sbx.commands.connect(bg.pid);
      assert.equal(again.pid, bg.pid);
      assert.equal((await again.wait()).stdout, 'late\n');
      await sbx.kill();
    });

    it('writes, reads, lists, makes directories, renames, removes and checks existence', async () => {
      const sbx = await sdk.Sandbox.create('python', opts());
      await sbx.files.write(`/tmp/${version}/a.txt`, 'alpha');
      assert.equal(await sbx.files.read(`/tmp/${version}/a.txt`), 'alpha');
      assert.equal(readFileSync(join(backend.root, 'tmp', version, 'a.txt'), 'utf8'), 'alpha');
      assert.equal(await sbx.files.makeDir(`/tmp/${version}/sub`), true);
      assert.equal(await sbx.files.makeDir(`/tmp/${version}/sub`), false);
      const names = (await sbx.files.list(`/tmp/${version}`)).map((e) => `${e.name}:${e.type}`);
      assert.deepEqual(names, ['a.txt:file', 'sub:dir']);
      const moved = await sbx.files.rename(`/tmp/${version}/a.txt`, `/tmp/${version}/sub/b.txt`);
      assert.equal(moved.path, `/tmp/${version}/sub/b.txt`);
      assert.equal(await sbx.files.exists(`/tmp/${version}/a.txt`), false);
      assert.equal(await sbx.files.exists(`/tmp/${version}/sub/b.txt`), true);
      await sbx.files.remove(`/tmp/${version}/sub`);
      assert.equal(await sbx.files.exists(`/tmp/${version}/sub`), false);
      await assert.rejects(sbx.files.read(`/tmp/${version}/missing`), (e: Error) => e instanceof sdk.NotFoundError || /not found/i.test(e.name));
      await sbx.kill();
    });

    it('refuses a wrong access token', async () => {
      const sbx = await sdk.Sandbox.create('python', opts());
      const res = await fetch(`${base}/e2b/envd/process.Process/List`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': 'nope' },
        body: '{}',
      });
      assert.equal(res.status, 401);
      assert.equal(((await res.json()) as { code: string }).code, 'unauthenticated');
      await sbx.kill();
    });
  });
}

describe('envd details', () => {
  it('runs /bin/bash -l -c as /bin/sh -c where the image has no bash, and bash where it has', async () => {
    const sbx = await e2bNew.Sandbox.create('python', opts());
    // The host-backed guest root has no /bin/bash.
    const r = await sbx.commands.run('echo $0');
    assert.equal(r.stdout.trim(), '/bin/sh');
    assert.ok(backend.stats.includes('/bin/bash'));
    await sbx.kill();
  });

  it('writes a gzip-encoded upload decompressed and reads a file gzip-encoded when asked, as envd does', async () => {
    const sbx = await e2bNew.Sandbox.create('python', opts());
    const text = 'squeezed '.repeat(1000);
    await sbx.files.write('/tmp/gz.txt', text, { gzip: true } as never);
    assert.equal(readFileSync(join(backend.root, 'tmp', 'gz.txt'), 'utf8'), text, 'stored decompressed');
    assert.equal(await sbx.files.read('/tmp/gz.txt', { gzip: true } as never), text);
    assert.equal(await sbx.files.read('/tmp/gz.txt'), text);
    const headers = { 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': (sbx as unknown as { envdAccessToken: string }).envdAccessToken };
    const raw = await fetch(`${base}/e2b/envd/files?path=/tmp/gz.txt`, { headers: { ...headers, 'accept-encoding': 'gzip' } });
    assert.equal(raw.headers.get('content-encoding'), 'gzip');
    const broken = await fetch(`${base}/e2b/envd/files?path=/tmp/bad.txt`, { method: 'POST', headers: { ...headers, 'content-type': 'application/octet-stream', 'content-encoding': 'gzip' }, body: 'not gzip at all' });
    assert.equal(broken.status, 400);
    assert.match(((await broken.json()) as { message: string }).message, /could not be decompressed/);
    // An upload refused before its bytes are read (the parent is a file): the undecompressible body
    // is an error nobody reads, which must not become the server's uncaught exception.
    const uncaught: Error[] = [];
    const onUncaught = (e: Error) => uncaught.push(e);
    process.on('uncaughtException', onUncaught);
    try {
      const refused = await fetch(`${base}/e2b/envd/files?path=/tmp/gz.txt/under-a-file`, { method: 'POST', headers: { ...headers, 'content-type': 'application/octet-stream', 'content-encoding': 'gzip' }, body: 'not gzip at all' });
      assert.notEqual(refused.status, 200);
      await new Promise((r) => setTimeout(r, 100));
      assert.deepEqual(uncaught.map((e) => e.message), []);
    } finally {
      process.off('uncaughtException', onUncaught);
    }
    await sbx.kill();
  });

  it('serves signed upload and download URLs without a token header, and refuses an altered or expired one', async () => {
    const sbx = await e2bNew.Sandbox.create('python', opts());
    const up = await sbx.uploadUrl('/tmp/signed.txt');
    const put = await fetch(up, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: 'signed bytes' });
    assert.equal(put.status, 200, await put.clone().text());
    const down = await sbx.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: 60 });
    assert.equal(await (await fetch(down)).text(), 'signed bytes');
    // A form's `file` part without a filename (FormData.append('file', 'text')) is written to ?path=, as envd does.
    const form = new FormData();
    form.append('file', 'form field bytes');
    const posted = await fetch(await sbx.uploadUrl('/tmp/field.txt'), { method: 'POST', body: form });
    assert.deepEqual(await posted.json(), [{ name: 'field.txt', type: 'file', path: '/tmp/field.txt' }]);
    assert.equal(readFileSync(join(backend.root, 'tmp', 'field.txt'), 'utf8'), 'form field bytes');
    const altered = down.replace('signed.txt', 'other.txt');
    assert.equal((await fetch(altered)).status, 401);
    const expired = await sbx.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: -10 });
    const refused = await fetch(expired);
    assert.equal(refused.status, 401);
    assert.deepEqual(await refused.json(), { code: 401, message: 'signature is already expired' }, "E2B's answer, word for word");
    // An upload URL does not read.
    assert.equal((await fetch(up.replace('/files?', '/files?x=1&'))).status, 401);
    await sbx.kill();
  });

  it('streams an octet-stream upload and answers health', async () => {
    const sbx = await e2bNew.Sandbox.create('python', opts());
    const big = Buffer.alloc(3 * 1024 * 1024, 7);
    await sbx.files.write('/tmp/big.bin', new Blob([big]).stream(), { useOctetStream: true } as never);
    assert.ok(readFileSync(join(backend.root, 'tmp', 'big.bin')).equals(big));
    const headers = { 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': (sbx as unknown as { envdAccessToken: string }).envdAccessToken };
    const health = await fetch(`${base}/e2b/envd/health`, { headers });
    assert.equal(health.status, 204);
    // Past its session's end it is over for the SDK at once, though the reaper acts a moment later.
    await sbx.setTimeout(1000);
    await new Promise((r) => setTimeout(r, 1100));
    assert.equal(await sbx.isRunning(), false);
    await sbx.kill();
    // As E2B's: a sandbox that is gone is 502 (the SDK's sign that it was killed), token or not.
    assert.equal((await fetch(`${base}/e2b/envd/health`, { headers })).status, 502);
    assert.equal((await fetch(`${base}/e2b/envd/health`, { headers: { 'e2b-sandbox-id': 'sbx_000000000000' } })).status, 502);
    assert.equal(await sbx.isRunning(), false);
  });
});

describe("E2B's default account", () => {
  it("runs as `user` where the image has one (its home for relative paths, its writes), as root where not or when asked", async () => {
    const sbx = await e2bNew.Sandbox.create('python', opts());
    // No /etc/passwd with `user` in this guest: root, in /root, as before.
    await sbx.files.write('plain.txt', 'root');
    assert.deepEqual(backend.accounts.at(-1), { op: 'write', path: '/root/plain.txt' });
    await sbx.kill();

    mkdirSync(join(backend.root, 'etc'), { recursive: true });
    writeFileSync(join(backend.root, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nsvc:x:999:999::/srv/svc:/bin/false\n');
    try {
      const withUser = await e2bNew.Sandbox.create('python', opts());
      await withUser.files.write('notes.txt', 'mine');
      assert.deepEqual(backend.accounts.at(-1), { op: 'write', path: '/home/user/notes.txt', user: 'user' });
      await withUser.files.makeDir('made');
      assert.deepEqual(backend.accounts.at(-1), { op: 'mkdir', path: '/home/user/made', user: 'user' });
      await withUser.files.write('/tmp/as-root.txt', 'x', { user: 'root' });
      assert.deepEqual(backend.accounts.at(-1), { op: 'write', path: '/tmp/as-root.txt' });
      await withUser.files.write('svc.txt', 'x', { user: 'svc' });
      assert.deepEqual(backend.accounts.at(-1), { op: 'write', path: '/srv/svc/svc.txt', user: 'svc' }, "an account's home is its /etc/passwd's");
      const started = backend.procs.size;
      await withUser.commands.run('true');
      await withUser.commands.run('true', { user: 'root' });
      const specs = [...backend.procs.values()].slice(started).map((p) => p.spec.user);
      assert.deepEqual(specs, ['user', undefined]);
      assert.equal(readFileSync(join(backend.root, 'home', 'user', 'notes.txt'), 'utf8'), 'mine');
      await withUser.kill();
    } finally {
      rmSync(join(backend.root, 'etc'), { recursive: true, force: true });
    }
  });
});

describe('multipart uploads', () => {
  it("writes each part to its filename's whole path, directories and all, not to its last component", async () => {
    const sbx = await e2bNew.Sandbox.create('python', opts());
    const infos = await sbx.files.write([{ path: '/tmp/parts/a/one.txt', data: 'one' }, { path: '/tmp/parts/two.txt', data: 'two' }]);
    assert.deepEqual(infos.map((i) => i.path), ['/tmp/parts/a/one.txt', '/tmp/parts/two.txt']);
    assert.equal(readFileSync(join(backend.root, 'tmp', 'parts', 'a', 'one.txt'), 'utf8'), 'one');
    assert.equal(readFileSync(join(backend.root, 'tmp', 'parts', 'two.txt'), 'utf8'), 'two');
    await sbx.kill();
  });
});

describe('envd 0.6.4: file metadata and watch entries', () => {
  it('answers envd 0.6.4; metadata written with a file (form or octet-stream) comes back on write, getInfo and list, and a rewrite without it clears it', async () => {
    const sbx = await e2bNew.Sandbox.create('python', opts());
    const info = await sbx.files.write('/tmp/meta.txt', 'with metadata', { metadata: { author: 'mish', purpose: 'upload' } } as never);
    assert.deepEqual((info as { metadata?: unknown }).metadata, { author: 'mish', purpose: 'upload' });
    assert.deepEqual((await sbx.files.getInfo('/tmp/meta.txt')).metadata, { author: 'mish', purpose: 'upload' });
    assert.deepEqual((await sbx.files.list('/tmp')).find((e) => e.name === 'meta.txt')?.metadata, { author: 'mish', purpose: 'upload' });
    const octet = await sbx.files.write('/tmp/meta-octet.txt', 'octet', { metadata: { tag: 'o' }, useOctetStream: true } as never);
    assert.deepEqual((octet as { metadata?: unknown }).metadata, { tag: 'o' });
    const plain = await sbx.files.write('/tmp/meta.txt', 'rewritten');
    assert.equal((plain as { metadata?: unknown }).metadata, undefined);
    assert.equal((await sbx.files.getInfo('/tmp/meta.txt')).metadata, undefined);
    // As envd: a key that is no HTTP token or a value that is not printable ASCII is refused, nothing written.
    const headers = { 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': (sbx as unknown as { envdAccessToken: string }).envdAccessToken };
    const bad = await fetch(`${base}/e2b/envd/files?path=/tmp/bad-meta.txt`, { method: 'POST', headers: { ...headers, 'content-type': 'application/octet-stream', 'x-metadata-ok': 'caf\u00e9' }, body: 'x' });
    assert.equal(bad.status, 400);
    assert.equal(await sbx.files.exists('/tmp/bad-meta.txt'), false);
    await sbx.kill();
  });

  it('a watch with includeEntry sends each event with the entry as it is now', async () => {
    const sbx = await e2bNew.Sandbox.create('python', opts());
    await sbx.files.makeDir('/tmp/watched-entries');
    const events: Array<{ name: string; entry?: { path: string; size: number } }> = [];
    const handle = await sbx.files.watchDir('/tmp/watched-entries', (e) => void events.push(e as never), { includeEntry: true, allowNetworkMounts: true } as never);
    await sbx.files.write('/tmp/watched-entries/seen.txt', '12345');
    for (let i = 0; i < 200 && !events.some((e) => e.name === 'seen.txt' && e.entry?.size === 5); i++) await new Promise((r) => setTimeout(r, 25));
    await handle.stop();
    const withEntry = events.find((e) => e.name === 'seen.txt' && e.entry);
    assert.ok(withEntry, JSON.stringify(events));
    assert.equal(withEntry!.entry!.path, '/tmp/watched-entries/seen.txt');
    await sbx.kill();
  });
});
