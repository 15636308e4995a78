/** A session's end: the lease that moves it (session.ts), the reaper's choice by it, and that both survive a reopened database. */
import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { openDb } from '../../../src/store/db.ts';
import { SandboxRepo } from '../../../src/sandboxes/repo.ts';
import { SandboxRegistry } from '../../../src/sandboxes/registry.ts';
import { Reaper } from '../../../src/sandboxes/reaper.ts';
import { setSessionEnd } from '../../../src/sandboxes/session.ts';
import type { EngineContext } from '../../../src/sandboxes/context.ts';
import { CollimateError } from '../../../src/errors.ts';
import { freshRepo, row } from '../../support/sandboxRows.ts';

const t = freshRepo('session');
let registry: SandboxRegistry;
beforeEach(() => {
  registry = new SandboxRegistry(t.repo);
});

/** Just what a lease and the reaper's choice need of an engine context. */
const ctxOf = () => ({ repo: t.repo, registry, assertOpen: () => {} }) as unknown as EngineContext;
const ids = (rows: { id: string }[]) => rows.map((r) => r.id).sort();

test('the reaper ends the sessions whose end has passed, whether a timeout or a lease set it', () => {
  // Started at 1000 with 300 s: ends at 301_000 unless a lease moved it.
  t.repo.insert(row('sbx_timed_out'));
  t.repo.insert(row('sbx_shortened', { session_ends_at: 5_000 }));
  t.repo.insert(row('sbx_extended', { session_ends_at: 900_000 }));
  t.repo.insert(row('sbx_suspended', { state: 'suspended', session_ends_at: 5_000 }));
  const reaper = new Reaper(ctxOf());
  assert.deepEqual(ids(reaper.due(4_999)), []);
  assert.deepEqual(ids(reaper.due(5_000)), ['sbx_shortened']);
  assert.deepEqual(ids(reaper.due(301_000)), ['sbx_shortened', 'sbx_timed_out'], 'timeout_secs alone no longer decides: sbx_extended runs on');
  assert.deepEqual(ids(reaper.due(900_000)), ['sbx_extended', 'sbx_shortened', 'sbx_timed_out']);
});

test('setSessionEnd moves a running session\'s end both ways and the view shows it; not while suspended, nor for another tenant', () => {
  t.repo.insert(row('sbx_a'));
  const now = Date.now();
  const later = setSessionEnd(ctxOf(), 'sbx_a', now + 600_000, { tenant: 't1' });
  assert.equal(later.expires_at, new Date(now + 600_000).toISOString());
  assert.ok(later.remaining_secs !== null && later.remaining_secs > 598 && later.remaining_secs <= 600, String(later.remaining_secs));
  assert.equal(later.timeout_secs, 300, 'the session length of the next start is unchanged');
  assert.equal(later.session_started_at, new Date(1000).toISOString());
  assert.equal(t.repo.get('sbx_a')!.session_ends_at, now + 600_000);
  const sooner = setSessionEnd(ctxOf(), 'sbx_a', now - 1, { tenant: 't1' });
  assert.equal(sooner.remaining_secs, 0, 'a passed end reads 0, never negative');

  t.repo.insert(row('sbx_s', { state: 'suspended' }));
  assert.throws(() => setSessionEnd(ctxOf(), 'sbx_s', now + 1000), (e: unknown) => e instanceof CollimateError && e.code === 'invalid_state' && /resume/i.test(e.message));
  assert.equal(t.repo.get('sbx_s')!.session_ends_at, 301_000);
  assert.equal(setSessionEnd(ctxOf(), 'sbx_a', now, { tenant: 't1' }).id, 'sbx_a');
  assert.throws(() => setSessionEnd(ctxOf(), 'sbx_a', now + 1000, { tenant: 't2' }), { code: 'sandbox_not_found' });
  t.repo.insert(row('sbx_gone', { state: 'deleted' }));
  assert.throws(() => setSessionEnd(ctxOf(), 'sbx_gone', now + 1000), { code: 'sandbox_not_found' });
});

test('a lease is in the database at once: a restarted server reaps by it', () => {
  t.repo.insert(row('sbx_a'));
  setSessionEnd(ctxOf(), 'sbx_a', 2_000_000);
  const path = t.db.name;
  const db = openDb(path);
  try {
    const repo = new SandboxRepo(db);
    const reaper = new Reaper({ repo } as unknown as EngineContext);
    assert.deepEqual(ids(reaper.due(1_999_999)), []);
    assert.deepEqual(ids(reaper.due(2_000_000)), ['sbx_a']);
  } finally {
    db.close();
  }
});
