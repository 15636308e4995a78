/**
 * The contract of a SandboxService (src/sandboxes/types.ts), as one list of tests run against two
 * targets: the unit tests' in-memory fake (test/unit/sandboxes/contract.test.ts) and the real engine
 * on microVMs (test/integration/contract.test.ts). Whatever the front doors are tested against on the
 * fake must hold on the engine, so the fake cannot drift from it again.
 *
 * Only behaviour both must share is asserted: states and transitions, tenant isolation, lineage,
 * labels, files, exec results and activity, error codes. Commands are ones the fake's tiny shell
 * understands and /bin/sh runs alike (`echo`, `exit N`).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { CollimateError } from '../../src/errors.js';
import { Readable } from 'node:stream';
import type { FileChange, HostReadings, SandboxService, Scope, WatchEndReason } from '../../src/sandboxes/types.js';

export interface ContractTarget {
  service: SandboxService;
  /** Stops what the target started (sandboxes the tests left are deleted before). */
  close(): Promise<void>;
}

async function rejectsWith(p: Promise<unknown> | (() => unknown), code: string): Promise<void> {
  await assert.rejects(async () => (typeof p === 'function' ? p() : p), (e: unknown) => {
    assert.ok(e instanceof CollimateError, `expected a CollimateError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    return true;
  });
}

export function sandboxServiceContract(name: string, open: () => Promise<ContractTarget>): void {
  describe(`SandboxService contract: ${name}`, () => {
    let t: ContractTarget;
    let svc: SandboxService;
    const a: Scope = { tenant: 'contract-a' };
    const b: Scope = { tenant: 'contract-b' };

    before(async () => {
      t = await open();
      svc = t.service;
    });
    after(async () => {
      for (const scope of [a, b]) {
        for (const s of svc.list({ limit: 1000 }, scope).sandboxes) await svc.delete(s.id, scope).catch(() => {});
      }
      await t.close();
    });

    test('templates: the catalog is listed with its egress and network; an unknown id is template_not_found', async () => {
      const base = svc.templates(a).find((x) => x.id === 'base');
      assert.ok(base, 'base is in the catalog');
      assert.equal(base.kind, 'catalog');
      assert.equal(base.ready, true);
      assert.equal(typeof base.network, 'boolean');
      assert.ok(base.egress !== undefined);
      assert.deepEqual(svc.template('base', a).id, 'base');
      await rejectsWith(() => svc.template('no-such-template', a), 'template_not_found');
      await rejectsWith(svc.create({ template: 'no-such-template' }, a), 'template_not_found');
    });

    test('files and directories: mkdir, transfers, stat, list, rename, watch, remove, with the same codes', async () => {
      const s = await svc.create({ template: 'base' }, a);
      const made = await svc.fsMkdir(s.id, '/root/c/d', { mode: 0o750 }, a);
      assert.deepEqual([made.created, made.entry.type, made.entry.mode, made.entry.path], [true, 'dir', 0o750, '/root/c/d']);
      assert.equal((await svc.fsMkdir(s.id, 'c/d', {}, a)).created, false, 'relative paths are under /root');
      const up = await svc.uploadFile(s.id, '/root/c/d/f.txt', Readable.from([Buffer.from('hel'), Buffer.from('lo')]), { mode: 0o600 }, a);
      assert.deepEqual([up.bytes, up.size, up.mode, up.type], [5, 5, 0o600, 'file']);
      assert.equal((await svc.fsStat(s.id, '/root/c/d/f.txt', a)).size, 5);
      assert.deepEqual((await svc.fsList(s.id, '/root/c', 2, a)).entries.map((e) => e.path), ['/root/c/d', '/root/c/d/f.txt']);
      assert.equal((await svc.fsRename(s.id, '/root/c/d/f.txt', '/root/c/g.txt', a)).path, '/root/c/g.txt');
      const chunks: Buffer[] = [];
      assert.deepEqual(await svc.downloadFile(s.id, '/root/c/g.txt', { chunk: (c) => void chunks.push(c) }, a), { size: 5 });
      assert.equal(Buffer.concat(chunks).toString(), 'hello');
      await rejectsWith(svc.fsStat(s.id, '/root/c/d/f.txt', a), 'file_not_found');
      await rejectsWith(svc.fsMkdir(s.id, '/root/c/g.txt', {}, a), 'file_exists');
      await rejectsWith(svc.fsList(s.id, '/root/c/g.txt', 1, a), 'not_a_directory');
      await rejectsWith(svc.fsStat(s.id, '/root/c', b), 'sandbox_not_found');
      await rejectsWith(svc.uploadFile(s.id, '/root/c/big', Readable.from([Buffer.alloc(2048)]), { maxBytes: 1024 }, a), 'payload_too_large');
      await rejectsWith(svc.fsStat(s.id, '/root/c/big', a), 'file_not_found');

      const changes: FileChange[] = [];
      const ends: WatchEndReason[] = [];
      await svc.fsWatch(s.id, '/root/c', false, { onChange: (c) => changes.push(c), onEnd: (r) => ends.push(r) }, a);
      await svc.writeFile(s.id, '/root/c/new', Buffer.from('x'), a);
      for (let i = 0; i < 200 && !changes.some((c) => c.op === 'create' && c.name === 'new'); i++) await new Promise((r) => setTimeout(r, 25));
      assert.ok(changes.some((c) => c.op === 'create' && c.name === 'new'), JSON.stringify(changes));
      await svc.suspend(s.id, a);
      for (let i = 0; i < 200 && ends.length === 0; i++) await new Promise((r) => setTimeout(r, 25));
      assert.deepEqual(ends, ['sandbox_suspended']);
      await rejectsWith(svc.fsStat(s.id, '/root/c', a), 'invalid_state');
      await svc.resume(s.id, a);
      assert.deepEqual(await svc.fsRemove(s.id, '/root/c', a), { removed: 4 });
      assert.equal((await svc.fsList(s.id, '/root', 1, a)).entries.some((e) => e.name === 'c'), false);
      await svc.delete(s.id, a);
    });

    test("disk use: df / of a running sandbox, which grows by what a file written to it holds; none for a suspended one", async () => {
      const readings = svc as SandboxService & HostReadings;
      assert.ok(readings.guestDiskUsage, 'the target reads its guests\' disk use');
      const read = async (id: string) => (await readings.guestDiskUsage!([id])).get(id);
      const s = await svc.create({ template: 'base' }, a);
      const first = await read(s.id);
      assert.ok(first, 'a running sandbox has a reading');
      assert.ok(first.usedBytes > 0 && first.usedBytes < first.totalBytes, JSON.stringify(first));
      assert.ok(first.totalBytes <= svc.get(s.id, a).disk_mib * 1048576, `a root file system of ${first.totalBytes} bytes fits its ${svc.get(s.id, a).disk_mib} MiB disk`);
      const size = 20 * 1048576;
      await svc.uploadFile(s.id, '/root/twenty', Readable.from(Array.from({ length: 20 }, () => Buffer.alloc(1048576, 7))), {}, a);
      const after = await read(s.id);
      assert.ok(after, 'read again');
      const grew = after.usedBytes - first.usedBytes;
      assert.ok(grew >= size && grew <= size + 1048576, `used grew by ${grew} bytes for a file of ${size}`);
      assert.equal(after.totalBytes, first.totalBytes);
      await svc.suspend(s.id, a);
      assert.equal(await read(s.id), undefined, 'a suspended sandbox is not read');
      assert.equal(await read('sbx_000000000000'), undefined, 'nor an id that is none');
      await svc.delete(s.id, a);
    });

    test('lifecycle: create, exec, files, fork a running and a suspended parent, resume, delete', async () => {
      const before = svc.countRunning(a.tenant);
      const p = await svc.create({ template: 'base', labels: { role: 'parent', run: 'c1' }, timeoutSecs: 600 }, a);
      assert.equal(p.state, 'running');
      assert.equal(p.tenant, a.tenant);
      assert.equal(p.parent, null);
      assert.deepEqual(p.children, []);
      assert.deepEqual(p.labels, { role: 'parent', run: 'c1' });
      assert.equal(p.timeout_secs, 600);
      assert.equal(Date.parse(p.expires_at), Date.parse(p.session_started_at) + 600_000, 'a session ends timeout_secs after its start');
      assert.ok(p.remaining_secs !== null && p.remaining_secs <= 600 && p.remaining_secs > 590);
      assert.equal(p.exec_count, 0);
      assert.equal(svc.countRunning(a.tenant), before + 1);

      // Tenant isolation: another tenant's id reads as not found for every operation.
      await rejectsWith(() => svc.get(p.id, b), 'sandbox_not_found');
      await rejectsWith(svc.exec(p.id, { command: 'echo x' }, b), 'sandbox_not_found');
      await rejectsWith(svc.fork(p.id, { count: 1 }, b), 'sandbox_not_found');
      await rejectsWith(svc.delete(p.id, b), 'sandbox_not_found');
      assert.ok(!svc.list({ limit: 1000 }, b).sandboxes.some((s) => s.id === p.id));
      assert.ok(svc.list({ labels: { run: 'c1' } }, a).sandboxes.some((s) => s.id === p.id));

      // Exec results, and activity visible to the very next read.
      const r = await svc.exec(p.id, { command: 'echo hi' }, a);
      assert.equal(r.stdout, 'hi\n');
      assert.equal(r.exit_code, 0);
      assert.match(r.seed, /^\d+$/);
      assert.equal((await svc.exec(p.id, { command: 'exit 3' }, a)).exit_code, 3);
      const seen = svc.get(p.id, a);
      assert.equal(seen.exec_count, 2, 'inspect right after an exec counts it');
      assert.ok(seen.idle_secs < 5, `idle_secs ${seen.idle_secs} is since the last exec`);

      // Files.
      await svc.writeFile(p.id, '/root/note.txt', Buffer.from('from the parent'), a);
      assert.equal((await svc.readFile(p.id, '/root/note.txt', a)).toString(), 'from the parent');
      await rejectsWith(svc.readFile(p.id, '/root/missing.txt', a), 'file_not_found');

      // A lease moves the end of the running session; timeout_secs stays the length of the next one.
      const leaseEnd = Date.now() + 1_200_000;
      const leased = svc.setSessionEnd(p.id, leaseEnd, a);
      assert.equal(leased.expires_at, new Date(leaseEnd).toISOString());
      assert.equal(leased.timeout_secs, 600);
      assert.equal(svc.get(p.id, a).expires_at, leased.expires_at);
      await rejectsWith(() => svc.setSessionEnd(p.id, leaseEnd, b), 'sandbox_not_found');

      // Fork of a running parent: children run, keep its files, merge labels; the parent runs on.
      await rejectsWith(svc.fork(p.id, { count: 0 }, a), 'validation_error');
      const kids = await svc.fork(p.id, { count: 2, labels: { role: 'child' } }, a);
      assert.equal(kids.length, 2);
      for (const k of kids) {
        assert.equal(k.state, 'running');
        assert.equal(k.parent, p.id);
        assert.ok(k.forked_at);
        assert.deepEqual(k.labels, { role: 'child', run: 'c1' });
        assert.equal(Date.parse(k.expires_at), Date.parse(k.session_started_at) + 600_000, "a child's session is a new one of the parent's timeout_secs");
        assert.equal((await svc.readFile(k.id, '/root/note.txt', a)).toString(), 'from the parent');
      }
      assert.equal(svc.get(p.id, a).state, 'running');
      assert.deepEqual(svc.get(p.id, a).children.slice().sort(), kids.map((k) => k.id).sort());

      // Suspend: state-bound operations say invalid_state; the slot is freed.
      const running = svc.countRunning(a.tenant);
      const s = await svc.suspend(p.id, a);
      assert.equal(s.state, 'suspended');
      assert.equal(svc.countRunning(a.tenant), running - 1);
      await rejectsWith(svc.exec(p.id, { command: 'echo x' }, a), 'invalid_state');
      await rejectsWith(svc.suspend(p.id, a), 'invalid_state');
      assert.equal(s.remaining_secs, null);
      await rejectsWith(() => svc.setSessionEnd(p.id, Date.now() + 60_000, a), 'invalid_state');
      assert.ok(svc.list({ state: 'suspended' }, a).sandboxes.some((x) => x.id === p.id));

      // Fork of a suspended parent: the child runs with its files, the parent stays suspended.
      const [fromSnap] = await svc.fork(p.id, { count: 1 }, a);
      assert.equal(fromSnap.state, 'running');
      assert.equal(fromSnap.parent, p.id);
      assert.equal((await svc.readFile(fromSnap.id, '/root/note.txt', a)).toString(), 'from the parent');
      assert.equal(svc.get(p.id, a).state, 'suspended');

      // Resume: running again with its files; resuming a running sandbox is invalid_state.
      const back = await svc.resume(p.id, a);
      assert.equal(back.state, 'running');
      await rejectsWith(svc.resume(p.id, a), 'invalid_state');
      assert.ok(Date.parse(back.session_started_at) > Date.parse(p.session_started_at), 'a resume starts a new session');
      assert.equal(Date.parse(back.expires_at), Date.parse(back.session_started_at) + 600_000, 'of timeout_secs: the lease ended with the suspend');
      assert.equal((await svc.readFile(p.id, '/root/note.txt', a)).toString(), 'from the parent');

      // Delete: the id is gone for good; the children live on.
      await svc.delete(p.id, a);
      await rejectsWith(() => svc.get(p.id, a), 'sandbox_not_found');
      await rejectsWith(svc.delete(p.id, a), 'sandbox_not_found');
      await rejectsWith(svc.resume(p.id, a), 'sandbox_not_found');
      for (const k of [...kids, fromSnap]) {
        assert.equal(svc.get(k.id, a).state, 'running');
        await svc.delete(k.id, a);
      }
      assert.equal(svc.countRunning(a.tenant), before);
    });
  });
}
