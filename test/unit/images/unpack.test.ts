import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { lstatSync, mkdtempSync, readFileSync, readlinkSync, rmSync, existsSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { readTar, writeTar, indexTarFile, type TarWriteEntry } from '../../../src/images/tar.ts';
import { lookupMerged, newBudget, normalizeMember, unpackLayer, LayerRejected } from '../../../src/images/unpack.ts';

const dirs: string[] = [];
const fresh = () => { const d = mkdtempSync(join(tmpdir(), 'collimate-unpack-')); dirs.push(d); const r = join(d, 'root'); mkdirSync(r); return r; };
after(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

async function* once(b: Buffer) { for (let i = 0; i < b.length; i += 700) yield b.subarray(i, i + 700); }
const unpack = (entries: TarWriteEntry[], root = fresh(), max = 1 << 30) => unpackLayer(readTar(once(writeTar(entries))), root, newBudget(max)).then((f) => ({ root, facts: f }));

describe('tar', () => {
  test('round trip: long names via pax, xattrs, modes, owners, links; GNU tar reads what we write', async () => {
    const long = `${'d'.repeat(120)}/${'f'.repeat(90)}`;
    const tar = writeTar([
      { name: 'a/', type: 'dir', mode: 0o750, uid: 7, gid: 8 },
      { name: 'a/file', data: 'hello', mode: 0o4755, uid: 1000, gid: 1000, mtime: 1234567890, xattrs: { 'user.k': 'v' } },
      { name: long, data: 'x' },
      { name: 'a/link', type: 'symlink', linkname: 'file' },
      { name: 'a/hard', type: 'hardlink', linkname: 'a/file' },
    ]);
    const got: any[] = [];
    for await (const e of readTar(once(tar))) {
      const chunks: Buffer[] = [];
      await e.read((c) => chunks.push(Buffer.from(c)));
      got.push({ ...e.header, data: Buffer.concat(chunks).toString(), xattrs: Object.fromEntries(Object.entries(e.header.xattrs).map(([k, v]) => [k, v.toString()])) });
    }
    assert.deepEqual(got.map((g) => [g.name, g.type, g.mode, g.uid, g.gid, g.data]), [
      ['a/', 'dir', 0o750, 7, 8, ''], ['a/file', 'file', 0o4755, 1000, 1000, 'hello'], [long, 'file', 0o644, 0, 0, 'x'],
      ['a/link', 'symlink', 0o644, 0, 0, ''], ['a/hard', 'hardlink', 0o644, 0, 0, ''],
    ]);
    assert.equal(got[1].mtime, 1234567890);
    assert.deepEqual(got[1].xattrs, { 'user.k': 'v' });
    const listing = execFileSync('tar', ['-tvf', '-'], { input: tar }).toString();
    assert.match(listing, /a\/file/);
    assert.match(listing, new RegExp(long));
  });

  test('a truncated archive and a bad checksum are errors', async () => {
    const tar = writeTar([{ name: 'f', data: 'x'.repeat(2000) }]);
    await assert.rejects(async () => { for await (const e of readTar(once(tar.subarray(0, 1024)))) await e.read(() => {}); }, /ends/);
    const bad = Buffer.from(tar); bad[10] ^= 1;
    await assert.rejects(async () => { for await (const _ of readTar(once(bad))); }, /checksum/);
  });

  test('pax global headers apply to every later entry, under the entry\'s own; more than MAX_PAX_RECORDS for one entry is refused', async () => {
    // A global ('g') header: what writeTar never writes, built here the way GNU tar lays it out.
    const record = (k: string, v: string) => {
      const body = ` ${k}=${v}\n`;
      let len = body.length + 1;
      while (String(len).length + body.length !== len) len = String(len).length + body.length;
      return `${len}${body}`;
    };
    const global = (records: string) => {
      const h = Buffer.alloc(512);
      h.write('pax_global_header', 0, 'latin1');
      for (const [off, len, v] of [[100, 8, 0o644], [108, 8, 0], [116, 8, 0], [124, 12, Buffer.byteLength(records)], [136, 12, 0]] as const) h.write(v.toString(8).padStart(len - 1, '0') + '\0', off, len, 'latin1');
      h.write('g', 156, 'latin1');
      h.write('ustar\0', 257, 'latin1');
      h.write('00', 263, 'latin1');
      h.fill(32, 148, 156);
      let sum = 0;
      for (const b of h) sum += b;
      h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8, 'latin1');
      const body = Buffer.from(records);
      return Buffer.concat([h, body, Buffer.alloc((512 - (body.length % 512)) % 512)]);
    };
    const files = writeTar([{ name: 'a', data: 'A', xattrs: { 'user.own': 'mine' } }, { name: 'b', data: 'B' }]);
    const read = async (tar: Buffer) => {
      const out: Array<{ name: string; xattrs: Record<string, string> }> = [];
      for await (const e of readTar(once(tar))) {
        out.push({ name: e.header.name, xattrs: Object.fromEntries(Object.entries(e.header.xattrs).map(([k, v]) => [k, v.toString()])) });
        await e.read(() => {});
      }
      return out;
    };
    const tagged = await read(Buffer.concat([global(record('SCHILY.xattr.user.all', 'g') + record('SCHILY.xattr.user.own', 'global')), files]));
    assert.deepEqual(tagged, [{ name: 'a', xattrs: { 'user.all': 'g', 'user.own': 'mine' } }, { name: 'b', xattrs: { 'user.all': 'g', 'user.own': 'global' } }]);
    // 1,025 tiny global records (a few kB) would otherwise be scanned for every entry of the layer.
    const many = Array.from({ length: 1025 }, (_, i) => record(`k${i}`, 'v')).join('');
    await assert.rejects(read(Buffer.concat([global(many), files])), /more than 1024 pax records apply to one entry \(global headers/);
    const split = Array.from({ length: 2 }, (_, j) => global(Array.from({ length: 600 }, (_, i) => record(`k${j}-${i}`, 'v')).join('')));
    await assert.rejects(read(Buffer.concat([...split, files])), /more than 1024 pax records/, 'counted across global headers');
  });

  test('indexTarFile finds members by offset', () => {
    const d = fresh();
    const f = join(d, 'a.tar');
    execFileSync('sh', ['-c', `printf hello > ${d}/x && tar -C ${d} -cf ${f} x`]);
    const m = indexTarFile(f).get('x')!;
    assert.equal(readFileSync(f).subarray(m.offset, m.offset + m.size).toString(), 'hello');
  });
});

describe('unpack', () => {
  test('whiteouts become 0:0 char devices, opaque dirs get trusted.overlay.opaque, owners and modes kept', async () => {
    const { root, facts } = await unpack([
      { name: './etc/', type: 'dir' },
      { name: './etc/.wh.shadow', data: '' },
      { name: './opt/', type: 'dir', mode: 0o700, uid: 1000, gid: 1000 },
      { name: './opt/.wh..wh..opq', data: '' },
      { name: './opt/new', data: 'n', mode: 0o600, uid: 1000, gid: 1000 },
      { name: './usr/bin/ping', data: 'p', mode: 0o4755, xattrs: { 'security.capability': Buffer.from('0100000200200000000000000000000000000000', 'hex'), 'trusted.overlay.redirect': 'x' } },
      { name: './bin', type: 'symlink', linkname: 'usr/bin' },
      { name: './kept/', type: 'dir' },
      { name: './kept/.wh.same', data: '' },
      { name: './kept/same', data: 'stays' },
    ]);
    const wh = lstatSync(join(root, 'etc/shadow'));
    assert.ok(wh.isCharacterDevice());
    assert.equal(wh.rdev, 0);
    assert.match(execFileSync('getfattr', ['-h', '-n', 'trusted.overlay.opaque', '--only-values', join(root, 'opt')]).toString(), /^y$/);
    const opt = lstatSync(join(root, 'opt'));
    assert.equal(opt.mode & 0o7777, 0o700);
    assert.equal(opt.uid, 1000);
    assert.equal(lstatSync(join(root, 'usr/bin/ping')).mode & 0o7777, 0o4755);
    assert.match(execFileSync('getfattr', ['-h', '-d', '-m', '-', join(root, 'usr/bin/ping')]).toString(), /security\.capability/);
    assert.doesNotMatch(execFileSync('getfattr', ['-h', '-d', '-m', '-', join(root, 'usr/bin/ping')]).toString(), /trusted/);
    assert.equal(readlinkSync(join(root, 'bin')), 'usr/bin');
    assert.equal(readFileSync(join(root, 'kept/same'), 'utf8'), 'stays', 'a whiteout only hides lower layers');
    assert.deepEqual(facts.whiteouts.sort(), ['etc/shadow', 'kept/same']);
    assert.deepEqual(facts.opaque, ['opt']);
    assert.equal(facts.top.bin, 'link:usr/bin');
  });

  test('hard links share the inode; a hard link to a file not in the layer is refused', async () => {
    const { root } = await unpack([{ name: 'a', data: 'A' }, { name: 'b', type: 'hardlink', linkname: 'a' }]);
    assert.equal(lstatSync(join(root, 'a')).ino, lstatSync(join(root, 'b')).ino);
    await assert.rejects(unpack([{ name: 'b', type: 'hardlink', linkname: 'a' }]), /not earlier in the same layer/);
  });

  for (const [what, entries, re] of [
    ['../ escape', [{ name: '../../etc/passwd', data: 'x' }], /escapes the root/],
    ['absolute path', [{ name: '/etc/passwd', data: 'x' }], /absolute path/],
    ['hard link escaping', [{ name: 'h', type: 'hardlink', linkname: '../../etc/passwd' }], /escapes the root/],
    ['symlink escaping', [{ name: 'a/s', type: 'symlink', linkname: '../../etc' }], /escapes the root/],
    ['write through a symlink', [{ name: 'evil', type: 'symlink', linkname: '/etc' }, { name: 'evil/passwd', data: 'x' }], /passes through a symlink/],
    ['block device', [{ name: 'dev/sda', type: 'block', devmajor: 8, devminor: 0 }], /device node/],
    ['char device', [{ name: 'dev/mem', type: 'char', devmajor: 1, devminor: 1 }], /device node/],
  ] as [string, TarWriteEntry[], RegExp][]) {
    test(`refuses ${what}`, async () => {
      const root = fresh();
      await assert.rejects(unpack(entries, root), (e: Error) => e instanceof LayerRejected && re.test(e.message));
      assert.ok(!existsSync('/etc/passwd.collimate-test'));
    });
  }

  test('a member declaring more than the cap is refused before its data is read', async () => {
    await assert.rejects(unpack([{ name: 'big', data: 'x'.repeat(10), size: 2 ** 40 }], fresh(), 1 << 20), /limit of 1048576 bytes/);
    await assert.rejects(unpack([{ name: 'a', data: 'x'.repeat(600_000) }, { name: 'b', data: 'x'.repeat(600_000) }], fresh(), 1 << 20), /limit/);
  });

  test('normalizeMember', () => {
    assert.equal(normalizeMember('./a//b/./c/'), 'a/b/c');
    assert.equal(normalizeMember('.'), '');
    assert.throws(() => normalizeMember('a/../b'), /\.\./);
  });

  test('lookupMerged follows top-level symlinks and honours whiteouts and opaque dirs', async () => {
    const base = (await unpack([{ name: 'bin', type: 'symlink', linkname: 'usr/bin' }, { name: 'usr/bin/sh', type: 'symlink', linkname: 'busybox' }, { name: 'etc/passwd', data: 'root:x:0:0::/root:/bin/sh\n' }])).facts;
    const upper = (await unpack([{ name: 'etc/.wh.passwd', data: '' }])).facts;
    const opq = (await unpack([{ name: 'usr/bin/.wh..wh..opq', data: '' }])).facts;
    assert.equal(lookupMerged([base], 'bin/sh'), '\0link:busybox');
    assert.equal(lookupMerged([base], 'etc/passwd'), 'root:x:0:0::/root:/bin/sh\n');
    assert.equal(lookupMerged([upper, base], 'etc/passwd'), undefined);
    assert.equal(lookupMerged([opq, base], 'bin/sh'), undefined);
    assert.equal(lookupMerged([base], 'usr/bin/setpriv'), undefined);
  });
});
