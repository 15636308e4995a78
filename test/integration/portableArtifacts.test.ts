import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { openEngine, testHome, assertNoLeaks, TEST_CACHE } from './fixture.ts';

/**
 * A template artifact moves between hosts as files: the `base` artifact baked in the test cache,
 * its build directory copied (sparse) into a second cache under another path and its RAM file into
 * a second RAM directory, is found by an engine on that second cache under the same key, without a
 * bake, and a sandbox created from it runs and execs. The guest assets (kernel, initramfs, layers)
 * the second cache needs are the same files, hard-linked: same bytes, other paths.
 */

const tenant = { tenant: 'it-portable' };
const cleanup: string[] = [];
after(() => { for (const p of cleanup) rmSync(p, { recursive: true, force: true }); });

test('an artifact directory copied into another cache dir is found and used there without baking', async () => {
  const homeA = testHome('portable-a');
  cleanup.push(homeA);
  const engineA = await openEngine(homeA, { poolSize: 0 });
  const baked = engineA.templatePools.get('base')!.artifact;
  await assertNoLeaks(engineA, homeA);

  // The second host: its cache and RAM directory elsewhere (hard links need the test cache's file system).
  const cacheB = mkdtempSync(join(dirname(TEST_CACHE), 'cp-')); // short: VMM sockets go below it (config.ts)
  const ramB = mkdtempSync('/dev/shm/collimate-portable-');
  cleanup.push(cacheB, ramB);
  execFileSync('cp', ['-al', join(TEST_CACHE, 'assets'), join(cacheB, 'assets')]);
  const copy = join(cacheB, 'artifacts', basename(dirname(baked.dir)), basename(baked.dir));
  mkdirSync(dirname(copy), { recursive: true });
  execFileSync('cp', ['-r', '--sparse=always', baked.dir, copy]);
  execFileSync('cp', ['--sparse=always', baked.memPath, join(ramB, basename(baked.memPath))]);

  const homeB = testHome('portable-b');
  cleanup.push(homeB);
  const progress: string[] = [];
  const engineB = await openEngine(homeB, { cacheDir: cacheB, artifactRamDir: ramB, poolSize: 0, progress: (m) => progress.push(m) });
  try {
    const found = engineB.templatePools.get('base')!.artifact;
    assert.equal(found.key, baked.key, 'the same key on the second cache');
    assert.equal(found.dir, copy, 'the copy is the artifact used');
    assert.equal(found.memPath, join(ramB, basename(baked.memPath)));
    assert.ok(found.diskPath.startsWith(cacheB) && found.shape.layers.every((l) => l.startsWith(cacheB)), 'with the second cache\'s own paths');
    assert.deepEqual(progress.filter((m) => m.includes('baking artifact')), [], 'nothing baked');
    assert.deepEqual(readdirSync(dirname(copy)).filter((b) => b !== 'users' && b !== 'claimed-at'), [basename(copy)], 'no other build made');

    const sb = await engineB.create({ template: 'base' }, tenant);
    const out = await engineB.exec(sb.id, { command: 'echo portable; cat /etc/os-release' });
    assert.equal(out.exit_code, 0, out.stderr);
    assert.match(out.stdout, /^portable\n.*collimate-base/s);
  } finally {
    await assertNoLeaks(engineB, homeB);
  }
  assert.ok(existsSync(join(ramB, basename(baked.memPath))), 'the RAM file stays for the next start (collected only by the artifact collector)');
});
