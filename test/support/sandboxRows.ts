/** A sandbox repository on a fresh SQLite file per test, and rows to fill it with (unit tests of src/sandboxes). */
import { afterEach, beforeEach } from 'node:test';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDb, type Db } from '../../src/store/db.ts';
import { SandboxRepo, type SandboxRow } from '../../src/sandboxes/repo.ts';

/** Registers beforeEach/afterEach hooks; the returned object holds the current test's db and repo. */
export function freshRepo(name: string): { db: Db; repo: SandboxRepo } {
  const cur = {} as { db: Db; repo: SandboxRepo; dir: string };
  beforeEach(() => {
    cur.dir = mkdtempSync(join(tmpdir(), `collimate-${name}-`));
    cur.db = openDb(join(cur.dir, 'collimate.db'));
    cur.repo = new SandboxRepo(cur.db);
  });
  afterEach(() => {
    cur.db.close();
    rmSync(cur.dir, { recursive: true, force: true });
  });
  return cur;
}

export function row(id: string, over: Partial<SandboxRow> = {}): SandboxRow {
  return {
    id, tenant: 't1', template: 'base', state: 'running', labels: {}, created_at: 1000, last_active: 1000, exec_count: 0,
    parent: null, forked_at: null, timeout_secs: 300, session_started_at: 1000, session_ends_at: 301_000, vcpus: 1, memory_mib: 256, disk_mib: 1024,
    egress: 'none', vmm: null, snapshot: null, pending_op: null, on_timeout: 'delete', auto_resume: 0, public_ports: 0, port_host: null, ...over,
  };
}
