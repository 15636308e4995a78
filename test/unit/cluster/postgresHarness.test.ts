/** The throwaway PostgreSQL harness itself: it starts as an unprivileged user, answers, and stops by pid without leftovers. */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { test } from 'node:test';
import pg from 'pg';
import { postgresUnavailable, startPostgres } from '../../support/postgres.js';

const skip = postgresUnavailable() ?? false;

test('a throwaway PostgreSQL 15 runs unprivileged on loopback and is gone after stop()', { skip }, async () => {
  const server = await startPostgres();
  try {
    const client = new pg.Client({ connectionString: server.url });
    await client.connect();
    const r = await client.query<{ v: string; su: boolean }>("SELECT current_setting('server_version_num') AS v, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS su");
    assert.match(r.rows[0].v, /^15\d{4}$/);
    await client.end();
    // The server process is not root.
    const status = await import('node:fs/promises').then((fs) => fs.readFile(`/proc/${server.pid}/status`, 'utf8'));
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)![1]);
    assert.notEqual(uid, 0, 'the postmaster runs as an unprivileged user');
    const other = server.createDatabase('other_db');
    const c2 = new pg.Client({ connectionString: other });
    await c2.connect();
    assert.equal((await c2.query<{ d: string }>('SELECT current_database() AS d')).rows[0].d, 'other_db');
    await c2.end();
  } finally {
    await server.stop();
  }
  assert.throws(() => process.kill(server.pid, 0), 'the postmaster is gone');
  assert.equal(existsSync(server.dir), false, 'its directory is removed');
});
