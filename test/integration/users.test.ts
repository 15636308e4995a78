/**
 * Accounts of the image (issue 33 item 1), on real microVMs of the `debian` catalog image, which has
 * E2B's `user` (uid 1000, /home/user, passwordless sudo):
 * - E2B's door: E2B's `base` is `debian`; commands, relative paths and written files are `user`'s
 *   by default (the newest `e2b` and the pinned 2.30), root's with `user: 'root'`; an image without
 *   `user` (our busybox `base`) keeps root.
 * - Our own door: REST execs, processes, uploads and mkdirs run as root unless they name a `user`,
 *   through our TypeScript SDK.
 * - The image itself, through the engine: bash, the tools and versions the catalog states, and the
 *   account as the image makes it (the layers these VMs boot from are checked in images-debian.test.ts).
 *   They share this file's engine: a second one would boot its own Debian pool for two tests.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import * as e2bNew from 'e2b';
import * as e2bOld from 'e2b-2-30';
import '../../src/service/migrations.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { NODE_DISTS } from '../../src/images/debianRootfs.ts';
import { Collimate, NotFoundError } from '../../sdk/typescript/src/index.ts';
import { openEngine, testHome, assertNoLeaks, serveEngine, type Served } from './fixture.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

let engine: Engine;
let home: string;
let api: Served;
let base: string;
let e2bKey: string;
let key: string;

before(async () => {
  home = testHome('users');
  engine = await openEngine(home, { catalog: ['base', 'debian'], poolSize: 1, poolMax: 2 });
  api = await serveEngine(engine);
  base = await api.app.listen({ host: '127.0.0.1', port: 0 });
  const keyOf = async (e2b: boolean) => {
    const cli = ['--import', 'tsx', join(ROOT, 'src/cli/main.ts'), 'keys', 'create', '--tenant', 'users', '--tier', 'pro', ...(e2b ? ['--e2b'] : []), '--home', home];
    const { stdout } = await promisify(execFile)(process.execPath, cli, { cwd: ROOT });
    return stdout.trim().split('\n').pop()!;
  };
  e2bKey = await keyOf(true);
  key = await keyOf(false);
});

after(async () => {
  await api?.close(1000);
  await assertNoLeaks(engine, home);
});

const debianTenant = { tenant: 'it-debian' };

test('code runs as bash; the tools E2B\'s base carries are there, at the versions the catalog states', async () => {
  const t = engine.templates().find((x) => x.id === 'debian')!;
  assert.ok(t.ready && t.kind === 'catalog');
  const { python, pip, node: nodeVersion, npm, git } = t.runtimes ?? {};
  assert.equal(nodeVersion, NODE_DISTS.node.version);
  const sb = await engine.create({ template: 'debian' }, debianTenant);
  // [[ ]] and BASH_VERSINFO exist in bash only: dash (/bin/sh here) fails on both.
  const code = await engine.exec(sb.id, { code: '[[ -n $BASH_VERSION ]] && echo "bash ${BASH_VERSINFO[0]}"' });
  assert.equal(code.stdout, 'bash 5\n', code.stderr);
  const viaBash = await engine.exec(sb.id, { command: "bash -c 'echo $((6 * 7))'" });
  assert.equal(viaBash.stdout, '42\n', viaBash.stderr);
  const versions = await engine.exec(sb.id, {
    command: 'python3 --version; python3 -m pip --version | cut -d" " -f1-2; node --version; npm --version; git --version; curl --version | head -n1 | cut -d" " -f1',
  });
  // git as the catalog states it: the release line bookworm keeps (its security updates move the last number).
  assert.match(versions.stdout, new RegExp(`^Python ${python}\\npip ${pip}\\nv${nodeVersion}\\n${npm}\\ngit version ${git!.replace(/\./g, '\\.')}\\.\\d+\\ncurl\\n$`), versions.stderr);
  // Without a terminal tput answers from terminfo: xterm's entry says 80 columns.
  const cols = await engine.exec(sb.id, { command: 'env -u COLUMNS -u LINES tput cols', env: { TERM: 'xterm' } });
  assert.equal(cols.stdout, '80\n', cols.stderr);
  const tools = await engine.exec(sb.id, { command: 'for t in sudo git curl nano less ps unzip xz npx; do command -v $t >/dev/null || echo "missing $t"; done; test -s /etc/ssl/certs/ca-certificates.crt && echo certs' });
  assert.equal(tools.stdout, 'certs\n', tools.stderr);
  const repo = await engine.exec(sb.id, { command: 'cd /tmp && git init -q r && cd r && git -c user.name=a -c user.email=a@example.com commit -q --allow-empty -m first && git log --format=%s' });
  assert.equal(repo.stdout, 'first\n', repo.stderr);
  await engine.delete(sb.id);
});

test('the user account: uid and gid 1000, home /home/user, bash, in sudo, with passwordless sudo', async () => {
  const sb = await engine.create({ template: 'debian' }, debianTenant);
  const ids = await engine.exec(sb.id, { command: 'id user; getent passwd user; getent group sudo' });
  assert.equal(ids.stdout, 'uid=1000(user) gid=1000(user) groups=1000(user),27(sudo)\nuser:x:1000:1000::/home/user:/bin/bash\nsudo:x:27:user\n', ids.stderr);
  const files = await engine.exec(sb.id, { command: "stat -c '%a %U:%G %n' /etc/sudoers.d/user /home/user /home/user/.bashrc; cat /etc/sudoers.d/user; visudo -c -q && echo sudoers parse" });
  assert.equal(files.stdout, '440 root:root /etc/sudoers.d/user\n755 user:user /home/user\n644 user:user /home/user/.bashrc\nuser ALL=(ALL:ALL) NOPASSWD: ALL\nsudoers parse\n', files.stderr);
  // As the user (root drops to it with runuser): a login shell lands in its home, and sudo asks no password.
  const asUser = await engine.exec(sb.id, { command: "runuser -l user -c 'id -un; echo $HOME; pwd; echo $SHELL; sudo -n id -u'" });
  assert.equal(asUser.stdout, 'user\n/home/user\n/home/user\n/bin/bash\n0\n', asUser.stderr);
  await engine.delete(sb.id);
});

const e2bOpts = () => ({ apiKey: e2bKey, apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd` });

test("E2B's base is the debian image: commands, paths and files are `user`'s, root's when asked", async () => {
  const sbx = await e2bNew.Sandbox.create('base', { ...e2bOpts(), timeoutMs: 600_000 });
  try {
    const who = await sbx.commands.run('echo "$(id -un) $(id -u) $(id -g)|$HOME|$(pwd)"; bash --version | head -1');
    assert.equal(who.stdout.split('\n')[0], 'user 1000 1000|/home/user|/home/user');
    assert.match(who.stdout, /GNU bash/);
    // Passwordless sudo, as on E2B.
    assert.equal((await sbx.commands.run('sudo -n id -u')).stdout.trim(), '0');
    assert.equal((await sbx.commands.run('id -un', { user: 'root' })).stdout.trim(), 'root');
    assert.equal((await sbx.commands.run('pwd', { user: 'root' })).stdout.trim(), '/root');
    // The tools E2B's base carries.
    for (const tool of ['python3 --version', 'node --version', 'git --version', 'curl --version', 'tput -T xterm cols']) {
      const r = await sbx.commands.run(tool);
      assert.equal(r.exitCode, 0, `${tool}: ${r.stderr}`);
    }

    // Relative paths are under the user's home; what the user writes and makes is theirs.
    await sbx.files.write('notes/today.txt', 'written by user');
    const entry = await sbx.files.getInfo('/home/user/notes/today.txt');
    assert.equal(entry.owner, 'user');
    assert.equal(await sbx.files.read('notes/today.txt'), 'written by user');
    assert.equal((await sbx.commands.run('stat -c %U /home/user/notes')).stdout.trim(), 'user');
    assert.equal(await sbx.files.makeDir('made/here'), true);
    assert.equal((await sbx.files.getInfo('/home/user/made/here')).owner, 'user');
    // As E2B's envd: a write is the envd's, owned by the user wherever it lands (E2B's own suite writes
    // to /0/… as `user`); a command as the user is held to its permissions.
    const anywhere = await sbx.files.write('/0/multi/file.txt', 'x');
    assert.equal(anywhere.path, '/0/multi/file.txt');
    assert.equal((await sbx.commands.run('stat -c %U /0 /0/multi /0/multi/file.txt')).stdout, 'user\nuser\nuser\n');
    await assert.rejects(sbx.commands.run('touch /root/nope.txt'));
    await sbx.files.write('/root/yes.txt', 'x', { user: 'root' });
    assert.equal((await sbx.files.getInfo('/root/yes.txt', { user: 'root' })).owner, 'root');
    const listed = (await sbx.files.list('.')).map((e) => e.name);
    assert.ok(listed.includes('notes') && listed.includes('made'), listed.join(','));
    // A relative cwd is under the home too.
    assert.equal((await sbx.commands.run('pwd', { cwd: 'notes' })).stdout.trim(), '/home/user/notes');
  } finally {
    await sbx.kill();
  }
});

test('e2b 2.30 runs as user by default too; an image without a `user` account runs as root in /root', async () => {
  const old = await e2bOld.Sandbox.create('base', { ...e2bOpts(), timeoutMs: 300_000 });
  try {
    assert.equal((await old.commands.run('id -un; pwd')).stdout, 'user\n/home/user\n');
    await old.files.write('old.txt', 'from 2.30');
    assert.equal((await old.commands.run('stat -c %U /home/user/old.txt')).stdout.trim(), 'user');
  } finally {
    await old.kill();
  }
  // Our busybox `base` by its other name is not E2B's: without a `user` account the default is root.
  const c = new Collimate({ apiKey: key, baseUrl: base });
  const busybox = await c.sandboxes.create({ template: 'base' });
  try {
    const sbx = await e2bNew.Sandbox.connect(busybox.id, e2bOpts()).catch(() => null);
    // A sandbox made by another key of the same tenant is reachable by the tenant's E2B key.
    assert.ok(sbx, 'the E2B door connects to the tenant\'s sandbox');
    assert.equal((await sbx!.commands.run('id -u; pwd')).stdout, '0\n/root\n');
    await assert.rejects(sbx!.commands.run('true', { user: 'nobody-here' }));
  } finally {
    await busybox.delete();
  }
});

test('our own door: root by default; `user` on an exec, a process, an upload and a mkdir; an unknown account is 404 user_not_found', async () => {
  const c = new Collimate({ apiKey: key, baseUrl: base });
  const sb = await c.sandboxes.create({ template: 'debian' });
  try {
    assert.equal((await sb.exec({ command: 'id -un; pwd' })).stdout, 'root\n/root\n');
    const as = await sb.exec({ command: 'id -un; echo $HOME; pwd', user: 'user' });
    assert.equal(as.stdout, 'user\n/home/user\n/home/user\n');
    const p = await sb.processes.start({ command: 'id -u > /tmp/proc-uid', user: 'user' });
    await p.wait({ timeoutSecs: 60 });
    assert.equal((await sb.files.read('/tmp/proc-uid')).toString().trim(), '1000');
    await sb.files.write('/home/user/up.txt', 'up', { user: 'user' });
    await sb.files.mkdir('/home/user/dir/sub', { user: 'user' });
    assert.equal((await sb.exec({ command: 'stat -c %U /home/user/up.txt /home/user/dir /home/user/dir/sub' })).stdout, 'user\nuser\nuser\n');
    await sb.files.write('/home/user/by-root.txt', 'root');
    assert.equal((await sb.exec({ command: 'stat -c %U /home/user/by-root.txt' })).stdout.trim(), 'root');
    await assert.rejects(sb.exec({ command: 'true', user: 'ghost' }), (e: unknown) => e instanceof NotFoundError && (e as NotFoundError).code === 'user_not_found');
    await assert.rejects(sb.exec({ command: 'touch /root/x', user: 'user' }).then((r) => assert.equal(r.exit_code, 0)));
  } finally {
    await sb.delete();
  }
});
