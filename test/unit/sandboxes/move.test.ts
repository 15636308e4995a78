/**
 * Moving a suspended sandbox, the engine's side (src/sandboxes/move.ts), without VMs: two homes
 * with real SQLite journals and real qcow2 chains made by qemu-img. The disk that leaves is one
 * overlay over the artifact's disk with every block of the chain (a fork point's layer included);
 * the receiver's copy is pending until committed and gone when aborted; the source's commit
 * refuses a sandbox that changed and, once the flip succeeded, removes its copy and only the fork
 * points nothing else holds.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { refusal } from '../../support/refusal.js';
import { openDb } from '../../../src/store/db.js';
import { SandboxRepo, type SandboxRow } from '../../../src/sandboxes/repo.js';
import { SandboxRegistry } from '../../../src/sandboxes/registry.js';
import { ProcessRegistry } from '../../../src/sandboxes/processes.js';
import type { EngineContext } from '../../../src/sandboxes/context.js';
import type { SandboxTransition } from '../../../src/sandboxes/types.js';
import { abortMoveIn, commitMoveIn, commitMoveOut, importMoveIn, pendingMovesIn, prepareMoveOut } from '../../../src/sandboxes/move.js';

const skip = spawnSync('qemu-img', ['--version']).status === 0 ? false : 'qemu-img is not installed';
const KEY = 'k'.repeat(64);
const roots: string[] = [];
const qimg = (...args: string[]) => execFileSync('qemu-img', args, { encoding: 'utf8' });
const io = (img: string, cmd: string) => execFileSync('qemu-io', ['-c', cmd, img], { encoding: 'utf8' });

/** An engine context over a fresh home whose one artifact's frozen disk is `artifactDisk` (or none). */
function home(artifactDisk: string | null): EngineContext & { events: SandboxTransition[] } {
  const dir = mkdtempSync(join(tmpdir(), 'collimate-move-'));
  roots.push(dir);
  for (const d of ['sandboxes', 'disks', 'forkpoints', 'ram']) mkdirSync(join(dir, d));
  const repo = new SandboxRepo(openDb(join(dir, 'collimate.db')));
  const events: SandboxTransition[] = [];
  return {
    events,
    cfg: { home: dir, ramDir: join(dir, 'ram') },
    repo,
    registry: new SandboxRegistry(repo),
    processes: new ProcessRegistry(),
    templates: {
      artifactFor: (key: string) => {
        if (key !== KEY || !artifactDisk) throw new Error(`no artifact ${key}`);
        return { diskPath: artifactDisk };
      },
    },
    seeds: { drop: async () => {} },
    forking: new Set(),
    removals: new Set(),
    unlinking: new Set(),
    emit: (_e: string, t: SandboxTransition) => { events.push(t); },
    assertOpen: () => {},
  } as unknown as EngineContext & { events: SandboxTransition[] };
}

/**
 * A suspended sandbox on `ctx`: artifact disk ← fork point layer (0x11 at 1 MiB, held by it and by
 * `sibling` when given) ← its top (0x22 at 2 MiB), and a snapshot of two files.
 */
function suspended(ctx: EngineContext, artifactDisk: string, id: string, sibling?: string, diskOnly = false): SandboxRow {
  const disks = join(ctx.cfg.home, 'disks');
  const fpDisk = join(disks, `${id}-00000000.qcow2`);
  const top = join(disks, `${id}-11111111.qcow2`);
  qimg('create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', artifactDisk, fpDisk);
  io(fpDisk, 'write -P 0x11 1M 64k');
  qimg('create', '-q', '-f', 'qcow2', '-F', 'qcow2', '-b', fpDisk, top);
  io(top, 'write -P 0x22 2M 64k');
  const fpDir = join(ctx.cfg.home, 'forkpoints', `fp_${id}`);
  mkdirSync(fpDir);
  ctx.repo.addForkPoint(`fp_${id}`, fpDir, join(fpDir, 'ram.img'), fpDisk);
  ctx.repo.addRef(`fp_${id}`, id);
  if (sibling) ctx.repo.addRef(`fp_${id}`, sibling);
  const snap = join(ctx.cfg.home, 'sandboxes', id, 'suspend');
  mkdirSync(snap, { recursive: true });
  if (diskOnly) writeFileSync(join(snap, 'disk-only'), '');
  else {
    writeFileSync(join(snap, 'device.state'), 'devices');
    writeFileSync(join(snap, 'ram.img'), Buffer.alloc(1 << 20, 7));
  }
  writeFileSync(join(snap, 'complete'), '');
  const row: SandboxRow = {
    id, tenant: 'acme', template: 'base', state: 'suspended', labels: { a: 'b' }, created_at: 1, last_active: 2, exec_count: 3, parent: null, forked_at: null,
    timeout_secs: 300, session_started_at: 1, session_ends_at: 2, vcpus: 1, memory_mib: 256, disk_mib: 2048, egress: 'allow' as never,
    vmm: { pid: 0, startTicks: '', dir: join(ctx.cfg.home, 'sandboxes', id), diskPath: top, memPath: '/nonexistent', memShared: true, artifactKey: KEY },
    snapshot: diskOnly
      ? { statePath: join(snap, 'device.state'), diskOnly: true, bytes: 0, suspendedAt: 1234 }
      : { statePath: join(snap, 'device.state'), ramPath: join(snap, 'ram.img'), bytes: 1, suspendedAt: 1234 },
    pending_op: null, on_timeout: 'suspend', auto_resume: 1, public_ports: 1, port_host: 'app.test:${PORT}', keep_memory: diskOnly ? 0 : 1,
  };
  ctx.repo.insert(row);
  return row;
}

describe('moving a suspended sandbox: the engine side (real qcow2 chains, real journals)', { skip }, () => {
  after(() => {
    for (const r of roots) rmSync(r, { recursive: true, force: true });
  });

  const artifacts = () => {
    const dir = mkdtempSync(join(tmpdir(), 'collimate-move-art-'));
    roots.push(dir);
    const disk = join(dir, 'disk.raw');
    writeFileSync(disk, Buffer.alloc(0));
    execFileSync('truncate', ['-s', '8M', disk]);
    io(disk, 'write -P 0x33 0 64k');
    // The receiver's copy of the same artifact lies elsewhere.
    const copy = join(dir, 'copy.raw');
    copyFileSync(disk, copy);
    return { disk, copy };
  };

  test('the disk leaves flattened over the artifact, arrives pending, and is the sandbox\'s once committed', async () => {
    const art = artifacts();
    const src = home(art.disk);
    const dst = home(art.copy);
    const row = suspended(src, art.disk, 'sbx_aaaaaaaaaaaa');
    const prepared = await prepareMoveOut(src, row.id);
    assert.deepEqual(prepared.manifest.files.map((f) => f.name), ['device.state', 'ram.img', 'disk.qcow2']);
    assert.equal(prepared.manifest.row.labels.a, 'b');
    assert.equal(prepared.manifest.suspendedAt, 1234);
    const flat = prepared.paths['disk.qcow2']!;
    assert.match(qimg('info', flat), new RegExp(`backing file: ${art.disk}\\n`), 'one overlay over the artifact\'s disk');
    assert.match(qimg('compare', '-f', 'qcow2', '-F', 'qcow2', row.vmm!.diskPath, flat), /identical/, 'with every block of the chain');

    // The receiver: the files "pulled" (copied here; moveRoutes pulls them by digest), a pending row.
    let pulled = 0;
    await importMoveIn(dst, prepared.manifest, async (f, dest) => {
      copyFileSync(prepared.paths[f.name]!, dest);
      pulled++;
    });
    assert.equal(pulled, 3);
    assert.deepEqual(pendingMovesIn(dst), [row.id]);
    const got = dst.repo.get(row.id)!;
    assert.equal(got.state, 'suspended');
    assert.equal(got.pending_op?.op, 'move');
    assert.deepEqual([got.public_ports, got.port_host], [1, 'app.test:${PORT}'], 'public ports and the port Host travel with it');
    assert.match(qimg('info', got.vmm!.diskPath), new RegExp(`backing file: ${art.copy}\\n`), 'pointed at the receiver\'s copy of the artifact');
    assert.match(qimg('compare', '-f', 'qcow2', '-F', 'qcow2', row.vmm!.diskPath, got.vmm!.diskPath), /identical/);
    assert.ok(existsSync(join(dst.cfg.home, 'sandboxes', row.id, 'suspend', 'complete')));
    assert.equal(dst.events.length, 0, 'a pending move is not announced');
    assert.equal(commitMoveIn(dst, row.id), true);
    assert.equal(dst.repo.get(row.id)!.pending_op, null);
    assert.deepEqual(dst.events.map((e) => [e.state, e.op]), [['suspended', 'move']]);
    assert.equal(commitMoveIn(dst, row.id), false, 'committed once');

    // The source, its flip done: its copy goes, and the fork point only it held.
    assert.deepEqual(await commitMoveOut(src, row.id, 1234, 'host_b', async () => true), { deletedMeanwhile: false });
    prepared.discard();
    const left = src.repo.get(row.id)!;
    assert.equal(left.state, 'deleted');
    assert.match(left.end_reason!, /moved to cluster host host_b/);
    assert.deepEqual(readdirSync(join(src.cfg.home, 'disks')), []);
    assert.deepEqual(readdirSync(join(src.cfg.home, 'sandboxes')), []);
    assert.equal(src.repo.allForkPoints().length, 0);
    assert.deepEqual(src.events.map((e) => [e.state, e.op]), [['deleted', 'move']]);
  });

  test('a sandbox suspended with only its files moves as its disk alone, and arrives suspended the same way', async () => {
    const art = artifacts();
    const src = home(art.disk);
    const dst = home(art.copy);
    const row = suspended(src, art.disk, 'sbx_dddddddddddd', undefined, true);
    const prepared = await prepareMoveOut(src, row.id);
    assert.deepEqual(prepared.manifest.files.map((f) => f.name), ['disk.qcow2'], 'no device state or RAM image: there is none');
    assert.equal(prepared.manifest.diskOnly, true);
    assert.equal(prepared.manifest.row.keep_memory, 0, 'its keep_memory travels with it');
    await importMoveIn(dst, prepared.manifest, async (f, dest) => { copyFileSync(prepared.paths[f.name]!, dest); });
    const got = dst.repo.get(row.id)!;
    assert.equal(got.snapshot?.diskOnly, true, 'the resume there boots it from its disk');
    assert.equal(got.snapshot?.ramPath, undefined);
    assert.equal(got.keep_memory, 0);
    const snapDir = join(dst.cfg.home, 'sandboxes', row.id, 'suspend');
    assert.ok(existsSync(join(snapDir, 'disk-only')) && existsSync(join(snapDir, 'complete')), 'a restart of the receiver reads it the same way');
    assert.match(qimg('compare', '-f', 'qcow2', '-F', 'qcow2', row.vmm!.diskPath, got.vmm!.diskPath), /identical/);
    assert.equal(commitMoveIn(dst, row.id), true);
    prepared.discard();
  });

  test('the source refuses what changed and keeps the fork point its sibling holds; the receiver refuses without the artifact and aborts cleanly', async () => {
    const art = artifacts();
    const src = home(art.disk);
    const row = suspended(src, art.disk, 'sbx_bbbbbbbbbbbb', 'sbx_sibling00000');
    const prepared = await prepareMoveOut(src, row.id);
    assert.equal((await refusal(prepareMoveOut(src, row.id))).code, 'conflict', 'one move of a sandbox at a time');

    // Suspended again since (another snapshot), or the flip refused: nothing changes.
    assert.equal((await refusal(commitMoveOut(src, row.id, 999, 'host_b', async () => true))).code, 'conflict');
    let flipped = false;
    assert.equal((await refusal(commitMoveOut(src, row.id, 1234, 'host_b', async () => { flipped = true; return false; }))).code, 'conflict');
    assert.ok(flipped);
    assert.equal(src.repo.get(row.id)!.state, 'suspended');
    assert.ok(existsSync(row.vmm!.diskPath));

    // A receiver without the template's artifact refuses before it records anything.
    const bare = home(null);
    const e = await refusal(importMoveIn(bare, prepared.manifest, async () => assert.fail('nothing is pulled')));
    assert.equal(e.code, 'conflict');
    assert.equal(e.details?.reason, 'artifact_missing');
    assert.equal(bare.repo.get(row.id), undefined);

    // A pull that fails halfway leaves nothing; an abort of a pending one removes it all.
    const dst = home(art.copy);
    let n = 0;
    await assert.rejects(importMoveIn(dst, prepared.manifest, async (f, dest) => {
      if (++n === 2) throw new Error('the source went away');
      copyFileSync(prepared.paths[f.name]!, dest);
    }), /went away/);
    assert.equal(dst.repo.get(row.id), undefined);
    assert.deepEqual(readdirSync(join(dst.cfg.home, 'sandboxes')), []);
    assert.deepEqual(readdirSync(join(dst.cfg.home, 'disks')), []);
    await importMoveIn(dst, prepared.manifest, async (f, dest) => copyFileSync(prepared.paths[f.name]!, dest));
    assert.equal(abortMoveIn(dst, row.id), true);
    assert.equal(dst.repo.get(row.id), undefined);
    assert.deepEqual(readdirSync(join(dst.cfg.home, 'disks')), []);

    // Moved: the fork point stays for the sibling that still holds it (its layer too).
    await commitMoveOut(src, row.id, 1234, 'host_b', async () => true);
    prepared.discard();
    assert.deepEqual(src.repo.allForkPoints().map((f) => f.id), [`fp_${row.id}`]);
    assert.deepEqual(readdirSync(join(src.cfg.home, 'disks')), [`${row.id}-00000000.qcow2`]);
    assert.deepEqual(src.repo.refsOf('sbx_sibling00000'), [`fp_${row.id}`]);

    // A running sandbox does not move.
    const running = suspended(src, art.disk, 'sbx_cccccccccccc');
    src.repo.update(running.id, { state: 'running' });
    const r = await refusal(prepareMoveOut(src, running.id));
    assert.equal(r.code, 'invalid_state');
    assert.match(r.message, /Suspend it first/);
  });
});
