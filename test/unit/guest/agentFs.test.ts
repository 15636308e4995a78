/**
 * The agent's file and directory messages (FS_*), the streamed transfers built on FILE_READ /
 * FILE_WRITE and directory watches, against the real agent in test mode. A temporary directory
 * stands in for the guest; relative paths resolve under its `home` (--home).
 */
import assert from 'node:assert/strict';
import { execFileSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, statfsSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { chmod, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { connectSocket, startTestAgent } from '../../support/agentSocket.js';
import { AgentClient, AgentError } from '../../../src/guest/agentClient.js';
import {
  FrameDecoder,
  MessageType,
  Tag,
  TlvWriter,
  decodeError,
  decodeFsEvent,
  decodeFsRemoved,
  encodeFrame,
  encodeFsRemove,
  type Frame,
  type FsEvent,
} from '../../../src/guest/protocol.js';

let workDir: string;
let home: string;
let socketPath: string;
let agent: ChildProcess;

async function withClient<T>(use: (client: AgentClient) => Promise<T>): Promise<T> {
  const client = new AgentClient(await connectSocket(socketPath));
  try {
    return await use(client);
  } finally {
    client.close();
    // The agent serves one connection at a time: let it see this one go before the next test.
    await sleep(30);
  }
}

/** One request as raw bytes, for payloads the host codec refuses to build. */
async function rawRequest(type: number, payload: Buffer): Promise<Frame> {
  const socket = await connectSocket(socketPath);
  const decoder = new FrameDecoder();
  try {
    socket.write(encodeFrame(type, 7, payload));
    const deadline = Date.now() + 5000;
    for (;;) {
      const chunk = (await Promise.race([once(socket, 'data'), sleep(Math.max(0, deadline - Date.now())).then(() => null)])) as [Buffer] | null;
      if (!chunk) throw new Error('no reply from the agent');
      for (const event of decoder.push(chunk[0])) if (event.kind === 'frame' && event.frame.id === 7) return event.frame;
    }
  } finally {
    socket.destroy();
    await sleep(30);
  }
}

function rejectsWithCode(code: string) {
  return (e: unknown) => {
    assert.ok(e instanceof AgentError, `expected an AgentError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    return true;
  };
}

/** A fresh directory for one test, under the stand-in home. */
function scratch(name: string): string {
  const dir = join(home, name);
  mkdirSync(dir, { recursive: true });
  return dir;
}

/** Collects a watch's events; `until` waits for one matching. */
class EventLog {
  readonly events: FsEvent[] = [];
  readonly push = (e: FsEvent) => void this.events.push(e);

  async until(match: (e: FsEvent) => boolean, timeoutMs = 5000): Promise<FsEvent> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = this.events.find(match);
      if (found) return found;
      if (Date.now() > deadline) throw new Error(`no matching event; saw ${JSON.stringify(this.events)}`);
      await sleep(20);
    }
  }

  has(op: string, name: string): boolean {
    return this.events.some((e) => e.op === op && e.name === name);
  }
}

before(async () => {
  workDir = await mkdtemp(join(tmpdir(), 'collimate-agent-fs-'));
  home = join(workDir, 'home');
  mkdirSync(home);
  ({ agent, socketPath } = await startTestAgent(workDir, ['--home', home]));
});

after(async () => {
  agent?.kill('SIGKILL');
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

describe('FS_STAT', () => {
  it('describes a file with its size, permission bits, owner and group names and mtime in ns', async () => {
    const dir = scratch('stat');
    const file = join(dir, 'a.txt');
    writeFileSync(file, 'hello');
    await chmod(file, 0o640);
    const expected = statSync(file, { bigint: true });
    const groupName = readFileSync('/etc/group', 'utf8').split('\n').find((l) => l.split(':')[2] === String(expected.gid))?.split(':')[0];
    await withClient(async (client) => {
      const entry = await client.stat(file);
      assert.deepEqual(entry, {
        name: 'a.txt',
        path: file,
        type: 'file',
        size: 5,
        mode: 0o640,
        uid: Number(expected.uid),
        gid: Number(expected.gid),
        owner: userInfo().username,
        group: groupName ?? '',
        mtimeNs: expected.mtimeNs,
      });
    });
  });

  it('does not follow a final symlink and gives its target; knows directories', async () => {
    const dir = scratch('stat-link');
    symlinkSync('/somewhere/else', join(dir, 'link'));
    await withClient(async (client) => {
      const link = await client.stat(join(dir, 'link'));
      assert.equal(link.type, 'symlink');
      assert.equal(link.symlinkTarget, '/somewhere/else');
      const d = await client.stat(dir);
      assert.equal(d.type, 'dir');
      assert.equal(d.name, 'stat-link');
      assert.equal(d.symlinkTarget, undefined);
    });
  });

  it('resolves relative paths under the home directory and drops trailing slashes', async () => {
    const dir = scratch('relative');
    writeFileSync(join(dir, 'r.txt'), 'x');
    await withClient(async (client) => {
      const entry = await client.stat('relative/r.txt');
      assert.equal(entry.path, join(home, 'relative', 'r.txt'));
      assert.equal((await client.stat(`${dir}///`)).path, dir);
    });
  });

  it('answers file_not_found, not_a_directory, invalid_path and bad_request', async () => {
    const dir = scratch('stat-errors');
    writeFileSync(join(dir, 'file'), '');
    await withClient(async (client) => {
      await assert.rejects(client.stat(join(dir, 'missing')), rejectsWithCode('file_not_found'));
      await assert.rejects(client.stat(join(dir, 'file', 'below')), rejectsWithCode('not_a_directory'));
      await assert.rejects(client.stat('x'.repeat(5000)), rejectsWithCode('invalid_request'));
    });
    // What the host codec refuses to send, the agent refuses too.
    const empty = await rawRequest(MessageType.FsStat, new TlvWriter().str(Tag.FsPath, '').finish());
    assert.equal(decodeError(empty.payload).code, 'invalid_path');
    const nul = await rawRequest(MessageType.FsStat, new TlvWriter().bytes(Tag.FsPath, Buffer.from('/tmp\0x')).finish());
    assert.equal(decodeError(nul.payload).code, 'invalid_path');
    const none = await rawRequest(MessageType.FsStat, Buffer.alloc(0));
    assert.equal(decodeError(none.payload).code, 'bad_request');
    const truncated = await rawRequest(MessageType.FsList, Buffer.from([130, 0, 9, 0, 0]));
    assert.equal(decodeError(truncated.payload).code, 'bad_request');
  });
});

describe('FS_LIST', () => {
  it('lists direct children sorted by name, and deeper levels with DEPTH, without following symlinks', async () => {
    const dir = scratch('list');
    mkdirSync(join(dir, 'b-dir', 'inner', 'deepest'), { recursive: true });
    writeFileSync(join(dir, 'c.txt'), 'ccc');
    writeFileSync(join(dir, 'a.txt'), 'a');
    writeFileSync(join(dir, 'b-dir', 'inner', 'f'), 'f');
    symlinkSync(join(dir, 'b-dir'), join(dir, 'link-to-dir'));
    await withClient(async (client) => {
      const one = await client.list(dir);
      assert.equal(one.truncated, false);
      assert.deepEqual(one.entries.map((e) => [e.name, e.type]), [['a.txt', 'file'], ['b-dir', 'dir'], ['c.txt', 'file'], ['link-to-dir', 'symlink']]);
      assert.equal(one.entries[2].size, 3);
      assert.equal(one.entries[2].path, join(dir, 'c.txt'));

      const three = await client.list(dir, 3);
      assert.deepEqual(
        three.entries.map((e) => e.path.slice(dir.length + 1)),
        ['a.txt', 'b-dir', 'b-dir/inner', 'b-dir/inner/deepest', 'b-dir/inner/f', 'c.txt', 'link-to-dir'],
      );
      // A listing through a symlinked directory is allowed; its entries are not followed further.
      assert.deepEqual((await client.list(join(dir, 'link-to-dir'))).entries.map((e) => e.name), ['inner']);
    });
  });

  it('stops at MAX_ENTRIES (and at 5000) and flags the listing truncated', async () => {
    const dir = scratch('list-many');
    for (let i = 0; i < 5050; i++) writeFileSync(join(dir, `f${String(i).padStart(5, '0')}`), '');
    await withClient(async (client) => {
      const few = await client.list(dir, 1, 3);
      assert.deepEqual(few.entries.map((e) => e.name), ['f00000', 'f00001', 'f00002']);
      assert.equal(few.truncated, true);
      const capped = await client.list(dir);
      assert.equal(capped.entries.length, 5000);
      assert.equal(capped.truncated, true);
    });
  });

  it('stops when the reply frame is full, long names and all', async () => {
    const dir = scratch('list-long-names');
    for (let i = 0; i < 3000; i++) writeFileSync(join(dir, `${String(i).padStart(4, '0')}${'n'.repeat(240)}`), '');
    await withClient(async (client) => {
      const listing = await client.list(dir);
      assert.equal(listing.truncated, true);
      assert.ok(listing.entries.length > 100 && listing.entries.length < 3000, `${listing.entries.length} entries`);
      assert.equal(listing.entries[0].name, `0000${'n'.repeat(240)}`);
    });
  });

  it('answers not_a_directory for a file and file_not_found for nothing', async () => {
    const dir = scratch('list-errors');
    writeFileSync(join(dir, 'file'), '');
    await withClient(async (client) => {
      await assert.rejects(client.list(join(dir, 'file')), rejectsWithCode('not_a_directory'));
      await assert.rejects(client.list(join(dir, 'missing')), rejectsWithCode('file_not_found'));
    });
  });
});

describe('FS_MKDIR', () => {
  it('creates every missing level with MODE exactly, and says when it already existed', async () => {
    const dir = scratch('mkdir');
    await withClient(async (client) => {
      const made = await client.mkdir(join(dir, 'x', 'y', 'z'), 0o750);
      assert.equal(made.created, true);
      assert.equal(made.entry.type, 'dir');
      assert.equal(made.entry.path, join(dir, 'x', 'y', 'z'));
      for (const p of ['x', 'x/y', 'x/y/z']) assert.equal(statSync(join(dir, p)).mode & 0o7777, 0o750, p);
      const again = await client.mkdir(join(dir, 'x', 'y', 'z'));
      assert.equal(again.created, false);
      const defaultMode = await client.mkdir(join(dir, 'plain'));
      assert.equal(defaultMode.entry.mode, 0o755);
    });
  });

  it('refuses a file in the way: file_exists at the end, not_a_directory above it', async () => {
    const dir = scratch('mkdir-errors');
    writeFileSync(join(dir, 'file'), '');
    await withClient(async (client) => {
      await assert.rejects(client.mkdir(join(dir, 'file')), rejectsWithCode('file_exists'));
      await assert.rejects(client.mkdir(join(dir, 'file', 'sub')), rejectsWithCode('not_a_directory'));
    });
  });
});

describe('FS_REMOVE', () => {
  it('removes a file, and a directory tree in bounded rounds', async () => {
    const dir = scratch('remove');
    writeFileSync(join(dir, 'single'), 'x');
    const tree = join(dir, 'tree');
    for (let d = 0; d < 5; d++) {
      mkdirSync(join(tree, `d${d}`, 'nested'), { recursive: true });
      for (let i = 0; i < 500; i++) writeFileSync(join(tree, `d${d}`, i % 2 ? 'nested' : '', `f${i}`), '');
    }
    await withClient(async (client) => {
      assert.deepEqual(await client.remove(join(dir, 'single')), { removed: 1 });
      assert.equal(existsSync(join(dir, 'single')), false);
    });
    // One request removes at most its budget and says it is not done.
    const first = decodeFsRemoved((await rawRequest(MessageType.FsRemove, encodeFsRemove(tree))).payload);
    assert.equal(first.done, false);
    assert.equal(first.removed, 2000);
    assert.ok(existsSync(tree));
    await withClient(async (client) => {
      const rest = await client.remove(tree);
      // 2500 files, 10 directories and the tree itself.
      assert.equal(first.removed + rest.removed, 2511);
      assert.equal(existsSync(tree), false);
    });
  });

  it('does not follow symlinks: what a link inside the tree points to stays', async () => {
    const dir = scratch('remove-links');
    const outside = scratch('remove-links-outside');
    writeFileSync(join(outside, 'keep.txt'), 'keep');
    mkdirSync(join(dir, 'tree'));
    symlinkSync(outside, join(dir, 'tree', 'link'));
    symlinkSync(outside, join(dir, 'toplink'));
    await withClient(async (client) => {
      await client.remove(join(dir, 'toplink'));
      await client.remove(join(dir, 'tree'));
      assert.equal(existsSync(join(dir, 'tree')), false);
      assert.equal(readFileSync(join(outside, 'keep.txt'), 'utf8'), 'keep');
    });
  });

  it('answers file_not_found for nothing and refuses /', async () => {
    await withClient(async (client) => {
      await assert.rejects(client.remove(join(home, 'never-was')), rejectsWithCode('file_not_found'));
      await assert.rejects(client.remove('/'), rejectsWithCode('invalid_path'));
    });
  });
});

describe('FS_RENAME', () => {
  it('moves a file and answers the destination entry; replaces a destination file', async () => {
    const dir = scratch('rename');
    writeFileSync(join(dir, 'from'), 'payload');
    writeFileSync(join(dir, 'existing'), 'old');
    await withClient(async (client) => {
      const moved = await client.rename(join(dir, 'from'), join(dir, 'to'));
      assert.equal(moved.path, join(dir, 'to'));
      assert.equal(moved.size, 7);
      assert.equal(existsSync(join(dir, 'from')), false);
      await client.rename(join(dir, 'to'), join(dir, 'existing'));
      assert.equal(readFileSync(join(dir, 'existing'), 'utf8'), 'payload');
    });
  });

  it('names what went wrong: missing source, missing destination directory, non-empty directory, file over directory', async () => {
    const dir = scratch('rename-errors');
    writeFileSync(join(dir, 'file'), '');
    mkdirSync(join(dir, 'a'));
    mkdirSync(join(dir, 'full'));
    writeFileSync(join(dir, 'full', 'x'), '');
    await withClient(async (client) => {
      await assert.rejects(client.rename(join(dir, 'missing'), join(dir, 'b')), rejectsWithCode('file_not_found'));
      await assert.rejects(client.rename(join(dir, 'file'), join(dir, 'no', 'such', 'dir')), (e: unknown) => {
        assert.ok(e instanceof AgentError && e.code === 'file_not_found' && /destination/.test(e.message), String(e));
        return true;
      });
      await assert.rejects(client.rename(join(dir, 'a'), join(dir, 'full')), rejectsWithCode('directory_not_empty'));
      await assert.rejects(client.rename(join(dir, 'file'), join(dir, 'a')), rejectsWithCode('is_a_directory'));
    });
  });
});

describe('streamed transfers', () => {
  it('downloads exactly the size the file had, chunk by chunk', async () => {
    const dir = scratch('download');
    const data = randomBytes(3 * 512 * 1024 + 777);
    writeFileSync(join(dir, 'big.bin'), data);
    await withClient(async (client) => {
      const chunks: Buffer[] = [];
      let started: { size: number; mode: number } | undefined;
      const r = await client.downloadFile(join(dir, 'big.bin'), { start: (info) => void (started = info), chunk: (c) => void chunks.push(c) });
      assert.deepEqual(started, { size: data.length, mode: 0o644 });
      assert.equal(r.size, data.length);
      assert.ok(chunks.length >= 4 && chunks.every((c) => c.length <= 512 * 1024));
      assert.ok(Buffer.concat(chunks).equals(data));
      await assert.rejects(client.downloadFile(join(dir, 'big.bin'), { chunk: () => {} }, { maxBytes: 1000 }), rejectsWithCode('file_too_large'));
    });
  });

  it('reads a pseudo-file that states size 0 (/proc) to its end, its size unknown', async () => {
    await withClient(async (client) => {
      const chunks: Buffer[] = [];
      let started: { size: number; mode: number } | undefined;
      const r = await client.downloadFile('/proc/version', { start: (info) => void (started = info), chunk: (c) => void chunks.push(c) });
      assert.equal(started?.size, -1);
      assert.equal(Buffer.concat(chunks).toString(), readFileSync('/proc/version', 'utf8'));
      assert.equal(r.size, Buffer.concat(chunks).length);
      assert.ok(r.size > 0);
    });
  });

  it('fails with file_changed when the file shrinks while it is read', async () => {
    const dir = scratch('download-shrinks');
    writeFileSync(join(dir, 'f'), Buffer.alloc(2 * 1024 * 1024, 1));
    await withClient(async (client) => {
      await assert.rejects(
        client.downloadFile(join(dir, 'f'), { chunk: () => writeFileSync(join(dir, 'f'), 'tiny') }),
        rejectsWithCode('file_changed'),
      );
    });
  });

  it('uploads through a temporary file renamed over the target, and leaves nothing when the source fails', async () => {
    const dir = scratch('upload');
    writeFileSync(join(dir, 'target'), 'old content');
    const data = randomBytes(2 * 1024 * 1024 + 5);
    await withClient(async (client) => {
      // Odd-sized pieces: the client regroups them into whole chunks.
      const pieces = Array.from({ length: 40 }, (_, i) => data.subarray(Math.floor((i * data.length) / 40), Math.floor(((i + 1) * data.length) / 40)));
      const entry = await client.uploadFile(join(dir, 'target'), Readable.from(pieces), { tempPath: join(dir, '.target.upload-1'), mode: 0o600 });
      assert.equal(entry.bytes, data.length);
      assert.equal(entry.size, data.length);
      assert.equal(entry.mode, 0o600);
      assert.ok(readFileSync(join(dir, 'target')).equals(data));
      assert.deepEqual(readdirSync(dir), ['target']);

      async function* failing() {
        yield Buffer.alloc(700 * 1024, 7);
        throw new Error('the client went away');
      }
      await assert.rejects(client.uploadFile(join(dir, 'target'), failing(), { tempPath: join(dir, '.target.upload-2') }), /went away/);
      assert.deepEqual(readdirSync(dir), ['target']);
      assert.ok(readFileSync(join(dir, 'target')).equals(data), 'the target must be untouched');

      await assert.rejects(
        client.uploadFile(join(dir, 'target'), Readable.from([Buffer.alloc(600 * 1024), Buffer.alloc(600 * 1024)]), { tempPath: join(dir, '.target.upload-3'), maxBytes: 1024 * 1024 }),
        rejectsWithCode('file_too_large'),
      );
      assert.deepEqual(readdirSync(dir), ['target']);

      const empty = await client.uploadFile(join(dir, 'new', 'empty'), Readable.from([]), { tempPath: join(dir, 'new', '.empty.upload') });
      assert.equal(empty.size, 0);
      assert.deepEqual(readdirSync(join(dir, 'new')), ['empty']);
    });
  });
});

describe('extended attributes', () => {
  it("an upload sets the new file's user.* attributes; stat, list and rename report them (within 4 KiB); a replacing upload leaves none", async () => {
    const dir = scratch('xattrs');
    await withClient(async (client) => {
      const entry = await client.uploadFile(join(dir, 'tagged'), Readable.from([Buffer.from('data')]), { tempPath: join(dir, '.tagged.up'), xattrs: { 'e2b.author': 'mish', 'e2b.purpose': 'upload' } });
      assert.deepEqual(entry.xattrs, { 'e2b.author': 'mish', 'e2b.purpose': 'upload' });
      assert.deepEqual((await client.stat(join(dir, 'tagged'))).xattrs, { 'e2b.author': 'mish', 'e2b.purpose': 'upload' });
      // Set out of band, as a program in the sandbox would: reported too; other namespaces are not.
      execFileSync('setfattr', ['-n', 'user.e2b.extra', '-v', 'x'.repeat(10), join(dir, 'tagged')]);
      execFileSync('setfattr', ['-n', 'trusted.not-user', '-v', 'hidden', join(dir, 'tagged')]);
      assert.equal((await client.stat(join(dir, 'tagged'))).xattrs?.['e2b.extra'], 'x'.repeat(10));
      const listed = (await client.list(dir)).entries.find((e) => e.name === 'tagged');
      assert.deepEqual(listed?.xattrs, { 'e2b.author': 'mish', 'e2b.purpose': 'upload', 'e2b.extra': 'xxxxxxxxxx' });
      const moved = await client.rename(join(dir, 'tagged'), join(dir, 'moved'));
      assert.equal(moved.xattrs?.['e2b.author'], 'mish');
      const replaced = await client.uploadFile(join(dir, 'moved'), Readable.from([Buffer.from('new')]), { tempPath: join(dir, '.moved.up') });
      assert.equal(replaced.xattrs, undefined, 'a replacing upload is a new file with no attributes');
      // A file without any: none reported; a listing of many tagged files still fits one frame or says it is truncated.
      writeFileSync(join(dir, 'plain'), 'x');
      assert.equal((await client.stat(join(dir, 'plain'))).xattrs, undefined);
      for (let i = 0; i < 400; i++) {
        const p = join(dir, `many-${String(i).padStart(3, '0')}`);
        writeFileSync(p, '');
        execFileSync('setfattr', ['-n', 'user.big', '-v', 'v'.repeat(3000), p]);
      }
      const many = await client.list(dir, 1, 5000);
      assert.ok(many.truncated, 'over the frame: truncated, not cut mid-entry');
      assert.ok(many.entries.filter((e) => e.name.startsWith('many-')).length > 200, 'as many whole entries as fit');
      assert.ok(many.entries.every((e) => !e.name.startsWith('many-') || e.xattrs?.big === 'v'.repeat(3000)), 'every listed entry has its attributes whole');
    });
  });
});

describe('FS_WATCH', () => {
  it('reports create, write, chmod, rename and remove relative to the watched directory', async () => {
    const dir = scratch('watch');
    await withClient(async (client) => {
      const log = new EventLog();
      const id = await client.watch(dir, false, log.push);
      assert.ok(id > 0);
      await writeFile(join(dir, 'new.txt'), 'one');
      await log.until((e) => e.op === 'create' && e.name === 'new.txt');
      await log.until((e) => e.op === 'write' && e.name === 'new.txt');
      await chmod(join(dir, 'new.txt'), 0o600);
      await log.until((e) => e.op === 'chmod' && e.name === 'new.txt');
      await rename(join(dir, 'new.txt'), join(dir, 'moved.txt'));
      await log.until((e) => e.op === 'rename' && e.name === 'new.txt');
      await log.until((e) => e.op === 'create' && e.name === 'moved.txt');
      await rm(join(dir, 'moved.txt'));
      await log.until((e) => e.op === 'remove' && e.name === 'moved.txt');
      assert.ok(log.events.every((e) => e.watchId === id));
      // Not recursive: a subdirectory is seen, what happens inside it is not.
      mkdirSync(join(dir, 'sub'));
      await log.until((e) => e.op === 'create' && e.name === 'sub');
      writeFileSync(join(dir, 'sub', 'inner'), 'x');
      await sleep(200);
      assert.ok(!log.events.some((e) => e.name.startsWith('sub/')), JSON.stringify(log.events));

      await client.unwatch(id);
      const count = log.events.length;
      writeFileSync(join(dir, 'after-unwatch'), 'x');
      await sleep(200);
      assert.equal(log.events.length, count);
      await assert.rejects(client.unwatch(id), rejectsWithCode('watch_not_found'));
    });
  });

  it('recursive: watches subdirectories that exist and ones that appear, reporting what they hold', async () => {
    const dir = scratch('watch-recursive');
    mkdirSync(join(dir, 'old', 'deeper'), { recursive: true });
    await withClient(async (client) => {
      const log = new EventLog();
      await client.watch(dir, true, log.push);
      writeFileSync(join(dir, 'old', 'deeper', 'f'), 'x');
      await log.until((e) => e.op === 'create' && e.name === 'old/deeper/f');
      // A tree made at once: its inner entries may appear before their directory is watched, and
      // are reported all the same.
      mkdirSync(join(dir, 'fresh', 'a', 'b'), { recursive: true });
      writeFileSync(join(dir, 'fresh', 'a', 'b', 'g'), 'y');
      await log.until((e) => e.op === 'create' && e.name === 'fresh');
      await log.until((e) => e.name === 'fresh/a/b/g');
      await sleep(100);
      writeFileSync(join(dir, 'fresh', 'a', 'b', 'later'), 'z');
      await log.until((e) => e.op === 'create' && e.name === 'fresh/a/b/later');
      // A directory moved away is no longer watched; one moved in is.
      await rename(join(dir, 'old'), join(workDir, 'moved-out'));
      await log.until((e) => e.op === 'rename' && e.name === 'old');
      writeFileSync(join(workDir, 'moved-out', 'unseen'), 'x');
      await sleep(200);
      assert.ok(!log.events.some((e) => e.name.endsWith('unseen')));
    });
  });

  it('ends a watch whose directory is removed with an end event', async () => {
    const dir = scratch('watch-end');
    await withClient(async (client) => {
      const log = new EventLog();
      const id = await client.watch(dir, false, log.push);
      await rm(dir, { recursive: true });
      const end = await log.until((e) => e.op === 'end');
      assert.equal(end.name, 'removed');
      await assert.rejects(client.unwatch(id), rejectsWithCode('watch_not_found'));
    });
  });

  it('sends events and answers directory requests while an exec runs', async () => {
    const dir = scratch('watch-exec');
    await withClient(async (client) => {
      const log = new EventLog();
      await client.watch(dir, false, log.push);
      // The exec ends only once the directory request below has been answered: had the agent held
      // directory requests until the exec finished, the exec would give up and exit 1 (no clock in
      // the assertion, only the order of events; the 20 s cap keeps a broken agent from hanging).
      const exec = client.exec({
        commands: [['sh', '-c', `echo hi > ${dir}/from-exec; i=0; while [ ! -d ${dir}/made-beside ]; do i=$((i+1)); [ $i -gt 400 ] && exit 1; sleep 0.05; done`]],
      });
      const settled = exec.then((r) => r, (error: unknown) => ({ error }));
      // The create event comes before echo's write: wait for the write, or the stat may see 0 bytes.
      await log.until((e) => e.op === 'write' && e.name === 'from-exec', 10_000);
      assert.equal((await client.stat(join(dir, 'from-exec'))).size, 3);
      assert.deepEqual((await client.list(dir)).entries.map((e) => e.name), ['from-exec']);
      await client.mkdir(join(dir, 'made-beside'));
      const outcome = await settled;
      assert.ok('result' in outcome, `the exec failed: ${String((outcome as { error: unknown }).error)}`);
      assert.equal(outcome.result.exitCode, 0, 'the exec gave up waiting: the directory request waited for it');
      await log.until((e) => e.op === 'create' && e.name === 'made-beside', 10_000);
    });
  });

  it('allows 32 watches, refuses the 33rd, and forgets them all when the host goes away or RESTORED arrives', async () => {
    const dir = scratch('watch-limit');
    await withClient(async (client) => {
      for (let i = 0; i < 32; i++) await client.watch(dir, false, () => {});
      await assert.rejects(client.watch(dir, false, () => {}), rejectsWithCode('too_many_watches'));
      await assert.rejects(client.watch(join(dir, 'missing'), false, () => {}), rejectsWithCode('file_not_found'));
    });
    await withClient(async (client) => {
      const id = await client.watch(dir, false, () => {});
      await client.restored({ entropy: randomBytes(32), timeNs: BigInt(Date.now()) * 1_000_000n, sandboxId: 'sb-fs', token: 't' });
      await assert.rejects(client.unwatch(id), rejectsWithCode('watch_not_found'));
    });
    writeFileSync(join(dir, 'file'), '');
    await withClient(async (client) => {
      await assert.rejects(client.watch(join(dir, 'file'), false, () => {}), rejectsWithCode('not_a_directory'));
    });
  });
});

describe('FS_WATCH under backpressure', () => {
  it('stops reading events while the host does not read, and reports the kernel queue\'s overflow', async () => {
    const dir = scratch('watch-overflow');
    const queueMax = Number(readFileSync('/proc/sys/fs/inotify/max_queued_events', 'utf8'));
    const socket = await connectSocket(socketPath);
    const decoder = new FrameDecoder();
    const frames: Frame[] = [];
    socket.on('data', (chunk: Buffer) => {
      for (const event of decoder.push(chunk)) if (event.kind === 'frame') frames.push(event.frame);
    });
    try {
      socket.write(encodeFrame(MessageType.FsWatch, 1, new TlvWriter().str(Tag.FsPath, dir).finish()));
      for (let i = 0; i < 100 && !frames.some((f) => f.id === 1); i++) await sleep(10);
      assert.equal(frames.find((f) => f.id === 1)?.type, MessageType.FsWatching);
      // An exec floods output the host does not read: the agent's queue passes its high-water mark.
      socket.pause();
      socket.write(encodeFrame(MessageType.Exec, 2, new TlvWriter().empty(Tag.ArgvBegin).str(Tag.Arg, 'head').str(Tag.Arg, '-c').str(Tag.Arg, '16000000').str(Tag.Arg, '/dev/zero').u32(Tag.MaxOutput, 32 * 1024 * 1024).finish()));
      await sleep(1000);
      for (let i = 0; i < queueMax + 500; i++) writeFileSync(join(dir, `f${i}`), '');
      socket.resume();
      const deadline = Date.now() + 60_000;
      const isOverflow = (f: Frame) => f.type === MessageType.FsEvent && decodeFsEvent(f.payload).op === 'overflow';
      while (!frames.some(isOverflow) || !frames.some((f) => f.type === MessageType.ExecResult)) {
        assert.ok(Date.now() < deadline, `no overflow event among ${frames.filter((f) => f.type === MessageType.FsEvent).length} events`);
        await sleep(50);
      }
      const creates = frames.filter((f) => f.type === MessageType.FsEvent && decodeFsEvent(f.payload).op === 'create').length;
      assert.ok(creates <= queueMax, `${creates} creates: more than the kernel queues, so the agent read them while backpressured`);
    } finally {
      socket.destroy();
      await sleep(50);
    }
  });
});

describe('FS_USAGE', () => {
  it('answers statvfs("/") as df sees it, beside a running exec', async () => {
    await withClient(async (client) => {
      // Answered while an exec runs: the exec waits for a file the test writes only after the answer.
      const flag = join(scratch('usage'), 'answered');
      const exec = client.exec({ commands: [['sh', '-c', `i=0; while [ ! -e ${flag} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 1; sleep 0.05; done`]] });
      const u = await client.fsUsage();
      writeFileSync(flag, '');
      assert.equal((await exec).result.exitCode, 0, 'the exec gave up waiting: FS_USAGE waited for it');
      const host = statfsSync('/');
      assert.equal(u.totalBytes, host.blocks * host.bsize);
      // Free space moves as the host writes; within 256 MiB of what the host saw a moment later.
      assert.ok(Math.abs(u.freeBytes - host.bfree * host.bsize) < 256 * 1048576, `free ${u.freeBytes} vs ${host.bfree * host.bsize}`);
      assert.ok(u.availableBytes <= u.freeBytes && u.freeBytes <= u.totalBytes);
    });
  });

  it('refuses a payload that is not TLV with bad_request', async () => {
    const reply = await rawRequest(MessageType.FsUsage, Buffer.from([1, 2, 3]));
    assert.equal(reply.type, MessageType.Error);
    assert.equal(decodeError(reply.payload).code, 'bad_request');
  });
});

describe('hashing helper sanity', () => {
  it('the download of a file hashes like the file', async () => {
    const dir = scratch('hash');
    const data = randomBytes(1024 * 1024 + 3);
    writeFileSync(join(dir, 'h'), data);
    await withClient(async (client) => {
      const h = createHash('sha256');
      await client.downloadFile(join(dir, 'h'), { chunk: (c) => void h.update(c) });
      assert.equal(h.digest('hex'), createHash('sha256').update(data).digest('hex'));
      assert.equal(lstatSync(join(dir, 'h')).size, data.length);
    });
  });
});
