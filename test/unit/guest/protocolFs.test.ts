/** The FS_* codec (src/guest/protocol.ts) against literal payloads. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  ProtocolError,
  Tag,
  TlvWriter,
  decodeFsEntries,
  decodeFsEntry,
  decodeFsEvent,
  decodeFsRemoved,
  decodeFsUsage,
  encodeFsList,
  encodeFsMkdir,
  encodeFsRename,
  encodeFsStat,
  encodeFsWatch,
} from '../../../src/guest/protocol.js';

function entryFields(w: TlvWriter, name: string, type = 'file'): TlvWriter {
  return w
    .str(Tag.FsName, name)
    .str(Tag.FsEntryPath, `/d/${name}`)
    .str(Tag.FsType, type)
    .u64(Tag.FsSize, 3)
    .u32(Tag.FsPerm, 0o644)
    .u32(Tag.FsUid, 1000)
    .u32(Tag.FsGid, 100)
    .str(Tag.FsOwner, 'alice')
    .str(Tag.FsGroup, 'users')
    .u64(Tag.FsMtimeNs, 1_700_000_000_123_456_789n);
}

test('requests: tags 130-159 with exact widths; NUL, empty and overlong paths are refused', () => {
  assert.deepEqual(encodeFsStat('/a'), Buffer.from([130, 0, 2, 0, 0, 0, 0x2f, 0x61]));
  assert.deepEqual(encodeFsList('/a', 2), Buffer.from([130, 0, 2, 0, 0, 0, 0x2f, 0x61, 131, 0, 4, 0, 0, 0, 2, 0, 0, 0]));
  assert.deepEqual(encodeFsMkdir('/a', 0o750).subarray(8), Buffer.from([132, 0, 4, 0, 0, 0, 0xe8, 0x01, 0, 0]));
  assert.deepEqual(encodeFsRename('a', 'b'), Buffer.from([134, 0, 1, 0, 0, 0, 0x61, 135, 0, 1, 0, 0, 0, 0x62]));
  assert.deepEqual(encodeFsWatch('/a', true).subarray(8), Buffer.from([136, 0, 1, 0, 0, 0, 1]));
  for (const bad of ['', 'a\0b', 'x'.repeat(4096)]) assert.throws(() => encodeFsStat(bad), ProtocolError);
});

test('FS_ENTRY and FS_ENTRIES decode entry groups, the symlink target, CREATED and TRUNCATED', () => {
  const one = decodeFsEntry(entryFields(new TlvWriter(), 'f').u8(Tag.FsCreated, 1).finish());
  assert.deepEqual(one, {
    name: 'f', path: '/d/f', type: 'file', size: 3, mode: 0o644, uid: 1000, gid: 100, owner: 'alice', group: 'users', mtimeNs: 1_700_000_000_123_456_789n, created: true,
  });
  const w = new TlvWriter();
  entryFields(w.empty(Tag.FsEntryBegin), 'a');
  entryFields(w.empty(Tag.FsEntryBegin), 'l', 'symlink').str(Tag.FsTarget, '../a');
  const listing = decodeFsEntries(w.u8(Tag.FsTruncated, 1).finish());
  assert.equal(listing.truncated, true);
  assert.deepEqual(listing.entries.map((e) => [e.name, e.type, e.symlinkTarget]), [['a', 'file', undefined], ['l', 'symlink', '../a']]);
  assert.deepEqual(decodeFsEntries(new TlvWriter().u8(Tag.FsTruncated, 0).finish()), { entries: [], truncated: false });
  assert.throws(() => decodeFsEntry(entryFields(new TlvWriter(), 'x', 'fifo').finish()), ProtocolError);
  // /proc/kcore states a size past 2^53: shown clamped, not an undecodable reply (which read as the agent failing).
  const kcore = new TlvWriter().str(Tag.FsName, 'kcore').str(Tag.FsEntryPath, '/proc/kcore').str(Tag.FsType, 'file').u64(Tag.FsSize, 0x7ffffffffffff000n)
    .u32(Tag.FsPerm, 0o400).u32(Tag.FsUid, 0).u32(Tag.FsGid, 0).u64(Tag.FsMtimeNs, 1n).finish();
  assert.equal(decodeFsEntry(kcore).size, Number.MAX_SAFE_INTEGER);
  assert.throws(() => decodeFsEntries(new TlvWriter().empty(Tag.FsEntryBegin).str(Tag.FsName, 'half').finish()), ProtocolError);
});

test('FS_REMOVED and FS_EVENT', () => {
  assert.deepEqual(decodeFsRemoved(new TlvWriter().u64(Tag.FsRemovedCount, 2000).u8(Tag.FsDone, 0).finish()), { removed: 2000, done: false });
  assert.deepEqual(decodeFsEvent(new TlvWriter().u32(Tag.FsWatchId, 7).str(Tag.FsName, 'sub/f').str(Tag.FsOp, 'rename').finish()), { watchId: 7, name: 'sub/f', op: 'rename' });
  assert.throws(() => decodeFsEvent(new TlvWriter().u32(Tag.FsWatchId, 7).str(Tag.FsOp, 'explode').finish()), ProtocolError);
});

test('FS_USAGE_RESULT: total, free and available bytes as u64; free past the total is refused', () => {
  const payload = Buffer.from([
    157, 0, 8, 0, 0, 0, 0x00, 0x00, 0x00, 0x40, 0, 0, 0, 0, // 1 GiB
    158, 0, 8, 0, 0, 0, 0x00, 0x00, 0x00, 0x30, 0, 0, 0, 0, // 768 MiB
    159, 0, 8, 0, 0, 0, 0x00, 0x00, 0x00, 0x2c, 0, 0, 0, 0, // 704 MiB
  ]);
  assert.deepEqual(decodeFsUsage(payload), { totalBytes: 1 << 30, freeBytes: 768 << 20, availableBytes: 704 << 20 });
  const usage = (total: number, free: number, available: number) =>
    new TlvWriter().u64(Tag.FsTotalBytes, total).u64(Tag.FsFreeBytes, free).u64(Tag.FsAvailableBytes, available).finish();
  assert.throws(() => decodeFsUsage(usage(100, 200, 50)), ProtocolError);
  assert.throws(() => decodeFsUsage(usage(100, 50, 60)), ProtocolError);
  assert.throws(() => decodeFsUsage(new TlvWriter().u64(Tag.FsTotalBytes, 100).finish()), ProtocolError, 'every field is required');
});
