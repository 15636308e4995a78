import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { openDb } from '../../../src/store/db.ts';
import { SandboxRepo } from '../../../src/sandboxes/repo.ts';

test('a database made with the earlier, wider state CHECK still opens and is used as it is', () => {
  const dir = mkdtempSync(join(tmpdir(), 'collimate-db-'));
  try {
    const path = join(dir, 'collimate.db');
    // Migrations 1 and 2 as an earlier server applied them.
    const old = new Database(path);
    old.exec(`
      CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL);
      CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY, tenant TEXT NOT NULL, template TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('creating','running','suspending','suspended','resuming','deleting','deleted')),
        labels TEXT NOT NULL DEFAULT '{}', created_at INTEGER NOT NULL, last_active INTEGER NOT NULL, exec_count INTEGER NOT NULL DEFAULT 0,
        parent TEXT, forked_at INTEGER, timeout_secs INTEGER NOT NULL, session_started_at INTEGER NOT NULL, vcpus INTEGER NOT NULL,
        memory_mib INTEGER NOT NULL, disk_mib INTEGER NOT NULL, vmm TEXT, snapshot TEXT, pending_op TEXT, deleted_at INTEGER
      );
      CREATE TABLE fork_points (id TEXT PRIMARY KEY, dir TEXT NOT NULL, mem_path TEXT NOT NULL, disk_path TEXT NOT NULL, created_at INTEGER NOT NULL, ready INTEGER NOT NULL DEFAULT 0);
      CREATE TABLE fork_point_refs (fork_point TEXT NOT NULL, owner TEXT NOT NULL, PRIMARY KEY (fork_point, owner));
      ALTER TABLE sandboxes ADD COLUMN egress TEXT NOT NULL DEFAULT '"none"';
      INSERT INTO schema_migrations VALUES (1, 'sandboxes', 1), (2, 'sandbox egress policy', 1);
      INSERT INTO sandboxes (id, tenant, template, state, created_at, last_active, timeout_secs, session_started_at, vcpus, memory_mib, disk_mib)
        VALUES ('sbx_old', 't1', 'base', 'running', 1, 1, 300, 1, 1, 256, 1024);
    `);
    old.close();
    const db = openDb(path);
    try {
      const repo = new SandboxRepo(db);
      assert.equal(repo.get('sbx_old')?.state, 'running');
      assert.equal(repo.get('sbx_old')?.egress, 'none');
      assert.equal(repo.countRunning('t1'), 1);
      assert.equal(repo.get('sbx_old')?.session_ends_at, 1 + 300 * 1000, 'a session from before keeps the end it had');
      repo.update('sbx_old', { state: 'suspended' });
      assert.equal(repo.list({ state: 'suspended' })[0]?.id, 'sbx_old');
    } finally {
      db.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
