import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { qcow2Size, rebaseEmptyOverlay } from '../../../src/vmm/qcow2.ts';

const qemuImg = (...args: string[]) => execFileSync('qemu-img', args, { encoding: 'utf8' });
const qemuIo = (...args: string[]) => execFileSync('qemu-io', args, { encoding: 'utf8' });

test('an empty overlay made over a raw disk is re-pointed at a qcow2 layer: qemu-img agrees, reads fall through to the new layer', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'qcow2-'));
  try {
    const base = join(dir, 'base.raw');
    writeFileSync(base, Buffer.alloc(0));
    qemuImg('resize', '-q', '-f', 'raw', base, '64M');
    qemuIo('-f', 'raw', '-c', 'write -P 0x11 0 1M', base);
    const layer = join(dir, 'layer.qcow2');
    qemuImg('create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', base, layer);
    qemuIo('-c', 'write -P 0xab 1M 1M', layer);
    const top = join(dir, 'top.qcow2');
    qemuImg('create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', base, top);
    await rebaseEmptyOverlay(top, layer, 'qcow2', qcow2Size(layer));
    const info = JSON.parse(qemuImg('info', '--output=json', top));
    assert.equal(info['backing-filename'], layer);
    assert.equal(info['backing-filename-format'], 'qcow2');
    assert.equal(info['virtual-size'], 64 * 1024 * 1024);
    qemuImg('check', '-q', top);
    assert.match(qemuIo('-c', 'read -P 0x11 0 1M', '-c', 'read -P 0xab 1M 1M', top), /read 1048576\/1048576 bytes at offset 1048576/);
    // A long name and the other header extensions survive a second rebase.
    const deep = join(dir, ...Array.from({ length: 6 }, (_, i) => `${i}${'x'.repeat(60)}`));
    mkdirSync(deep, { recursive: true });
    const far = join(deep, 'far.qcow2');
    qemuImg('create', '-q', '-f', 'qcow2', '-F', 'qcow2', '-b', layer, far);
    await rebaseEmptyOverlay(top, far, 'qcow2', qcow2Size(far));
    assert.equal(JSON.parse(qemuImg('info', '--output=json', top))['backing-filename'], far);
    qemuImg('check', '-q', top);
    assert.match(qemuIo('-c', 'read -P 0xab 1M 1M', top), /read 1048576\/1048576/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an overlay that holds data, or whose size differs, is refused untouched', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'qcow2-'));
  try {
    const layer = join(dir, 'layer.qcow2');
    qemuImg('create', '-q', '-f', 'qcow2', layer, '64M');
    const used = join(dir, 'used.qcow2');
    qemuImg('create', '-q', '-f', 'qcow2', used, '64M');
    qemuIo('-c', 'write -P 0x22 0 64k', used);
    await assert.rejects(rebaseEmptyOverlay(used, layer, 'qcow2', qcow2Size(layer)), /has data/);
    assert.equal(JSON.parse(qemuImg('info', '--output=json', used))['backing-filename'], undefined);
    const small = join(dir, 'small.qcow2');
    qemuImg('create', '-q', '-f', 'qcow2', small, '32M');
    await assert.rejects(rebaseEmptyOverlay(small, layer, 'qcow2', qcow2Size(layer)), /size/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
