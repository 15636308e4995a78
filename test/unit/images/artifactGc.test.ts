import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { claimArtifact, collectArtifactRam, liveClaims, releaseArtifact } from '../../../src/images/artifactGc.ts';

/** A cache and a tmpfs RAM directory with artifacts `keys` (24 hex digits), each with one build's RAM file. */
function layout(keys: string[]) {
  const base = mkdtempSync('/dev/shm/artifact-gc-');
  const cache = join(base, 'cache');
  const ram = join(base, 'ram');
  mkdirSync(ram, { recursive: true });
  const files: Record<string, { root: string; mem: string }> = {};
  for (const k of keys) {
    const root = join(cache, 'artifacts', k);
    mkdirSync(join(root, 'b1'), { recursive: true });
    writeFileSync(join(root, 'b1', 'artifact.json'), '{}');
    const mem = join(ram, `artifact-${k}-b1.mem`);
    writeFileSync(mem, Buffer.alloc(4096, 1));
    files[k] = { root, mem };
  }
  return { base, cache, ram, files };
}

/** A claim by a process that has exited. */
function deadClaim(root: string): void {
  const gone = spawnSync('true').pid!;
  mkdirSync(join(root, 'users'), { recursive: true });
  writeFileSync(join(root, 'users', `${gone}-1`), JSON.stringify({ pid: gone, startTicks: '1' }));
}

const key = (c: string) => c.repeat(24);

test('template RAM files nobody claims or maps go; claimed, mapped, kept, recently claimed and baking ones stay', async () => {
  const { base, cache, ram, files } = layout([key('a'), key('b'), key('c'), key('d'), key('e'), key('f')]);
  let mapper: ReturnType<typeof spawn> | undefined;
  try {
    deadClaim(files[key('a')].root); // its server died: goes
    claimArtifact(files[key('b')].root); // claimed by this live process: stays
    // Mapped by a process (a running sandbox of an old build): stays while it maps it.
    mapper = spawn('python3', ['-c', 'import mmap,sys,time; f=open(sys.argv[1],"rb"); m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ); print("mapped",flush=True); time.sleep(60)', files[key('c')].mem]);
    await new Promise<void>((resolve, reject) => { mapper!.stdout!.once('data', () => resolve()); mapper!.once('error', reject); });
    mkdirSync(join(files[key('d')].root, 'tmp-b1')); // its bake is under way: stays
    // e: kept by the caller (its own template). f: claimed a moment ago by a server now gone: stays within the grace.
    deadClaim(files[key('f')].root);
    writeFileSync(join(files[key('f')].root, 'claimed-at'), '');
    const old = new Date(Date.now() - 7200_000);
    for (const k of [key('a'), key('c')]) { writeFileSync(join(files[k].root, 'claimed-at'), ''); utimesSync(join(files[k].root, 'claimed-at'), old, old); }

    // A collector that died mid-way left a file aside: it goes.
    const gone = spawnSync('true').pid!;
    writeFileSync(join(ram, `artifact-${key('9')}-b1.mem.gc-${gone}`), 'x');
    const removed = collectArtifactRam(cache, ram, new Set([files[key('e')].mem]), 3600_000);
    assert.ok(!existsSync(join(ram, `artifact-${key('9')}-b1.mem.gc-${gone}`)));
    assert.deepEqual(removed, [files[key('a')].mem]);
    for (const k of [key('b'), key('c'), key('d'), key('e'), key('f')]) assert.ok(existsSync(files[k].mem), `${k[0]} stays`);
    assert.equal(liveClaims(files[key('a')].root), 0, 'the dead claim is cleared');
    assert.equal(liveClaims(files[key('b')].root), 1);

    // Once the mapping process is gone, the file it mapped goes too; nothing is left renamed aside.
    mapper.kill('SIGKILL');
    await new Promise((r) => mapper!.once('exit', r));
    assert.deepEqual(collectArtifactRam(cache, ram, new Set([files[key('e')].mem]), 3600_000), [files[key('c')].mem]);
    assert.deepEqual(collectArtifactRam(cache, ram, new Set(), 0).sort(), [files[key('d')].mem, files[key('e')].mem, files[key('f')].mem].filter((f) => !f.includes(key('d'))).sort(),
      'with no grace and nothing kept, all but the claimed and the baking one go');
    assert.ok(existsSync(files[key('b')].mem) && existsSync(files[key('d')].mem));
  } finally {
    mapper?.kill('SIGKILL');
    rmSync(base, { recursive: true, force: true });
  }
});

test('an artifact this process stops using is collected once the grace has passed since then, not kept by its old claim', () => {
  const { base, cache, ram, files } = layout([key('a')]);
  try {
    const { root, mem } = files[key('a')];
    claimArtifact(root);
    assert.deepEqual(collectArtifactRam(cache, ram, new Set(), 0), [], 'claimed by this live process: stays');
    const old = new Date(Date.now() - 7200_000);
    utimesSync(join(root, 'claimed-at'), old, old);
    releaseArtifact(root);
    assert.equal(liveClaims(root), 0, 'the claim is gone');
    assert.deepEqual(collectArtifactRam(cache, ram, new Set(), 3600_000), [], 'released a moment ago: within the grace');
    assert.deepEqual(collectArtifactRam(cache, ram, new Set(), 0), [mem], 'past the grace: collected');
    // Claiming it again after a release claims it for real (the process remembered nothing stale).
    writeFileSync(mem, Buffer.alloc(4096, 1));
    claimArtifact(root);
    assert.equal(liveClaims(root), 1);
    assert.deepEqual(collectArtifactRam(cache, ram, new Set(), 0), []);
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
});
