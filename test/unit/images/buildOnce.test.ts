// buildOnce: a cache entry appears whole or not at all, and one process builds it once however many
// callers ask for it at the same time (the catalog's layers are built side by side and each Debian
// runtime layer asks for the base).
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildOnce } from '../../../src/host/buildOnce.ts';

test('concurrent callers for one path share one build; a later caller finds it built', async () => {
  const root = mkdtempSync(join(tmpdir(), 'build-once-'));
  try {
    const final = join(root, 'entry');
    let builds = 0;
    const build = async (dir: string) => {
      builds++;
      await sleep(50);
      writeFileSync(join(dir, 'data'), 'made');
    };
    const paths = await Promise.all([buildOnce(final, join(root, 'tmp'), build), buildOnce(final, join(root, 'tmp'), build), buildOnce(final, join(root, 'tmp'), build)]);
    assert.deepEqual(paths, [final, final, final]);
    assert.equal(builds, 1);
    assert.equal(readFileSync(join(final, 'data'), 'utf8'), 'made');
    await buildOnce(final, join(root, 'tmp'), build);
    assert.equal(builds, 1, 'a built entry is not built again');
    assert.deepEqual(readdirSync(join(root, 'tmp')), [], 'no temporary directory is left');
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('a failed build leaves nothing, fails every caller that waited for it, and the next call builds again', async () => {
  const root = mkdtempSync(join(tmpdir(), 'build-once-'));
  try {
    const final = join(root, 'entry');
    let builds = 0;
    const failing = async () => { builds++; await sleep(20); throw new Error('apt failed'); };
    const results = await Promise.allSettled([buildOnce(final, join(root, 'tmp'), failing), buildOnce(final, join(root, 'tmp'), failing)]);
    assert.deepEqual(results.map((r) => r.status), ['rejected', 'rejected']);
    assert.equal(builds, 1);
    assert.equal(existsSync(final), false);
    assert.deepEqual(readdirSync(join(root, 'tmp')), []);
    await buildOnce(final, join(root, 'tmp'), async (dir) => { builds++; writeFileSync(join(dir, 'data'), 'x'); });
    assert.equal(builds, 2);
    assert.equal(existsSync(join(final, 'data')), true);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
