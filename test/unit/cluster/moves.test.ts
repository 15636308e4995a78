/**
 * Moving suspended sandboxes, the cluster database's part, on a real PostgreSQL 15: which hosts may
 * receive one (and the error for each host that may not), the one transaction that flips the
 * owner (never two owners: a resume, a delete or a second move in between makes it fail), and what
 * a host settles when it joins after a crash cut a move off.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { migrateCluster, openClusterDb } from '../../../src/cluster/db.js';
import { compatKey, HostMembership, type HostRegistration } from '../../../src/cluster/hosts.js';
import { SandboxDirectory } from '../../../src/cluster/directory.js';
import { peerRequest, reconcileMoves, SandboxMoves } from '../../../src/cluster/moves.js';
import { createServer } from 'node:http';
import { PEER_HEADER } from '../../../src/cluster/peerHeader.js';
import { freePort } from '../../support/registry.js';
import { refusal } from '../../support/refusal.js';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../../support/postgres.js';

const skip = postgresUnavailable() ?? false;
const COMPAT = { qemuVersion: '7.2.0', machine: 'microvm', cpuModel: 'max', accel: 'tcg' };
const OTHER = { ...COMPAT, qemuVersion: '8.1.0' };
const LONG = { heartbeatMs: 1000, leaseMs: 600_000, deadAfterMs: 1_200_000 };
const KEY = 'a'.repeat(64);
const DIGEST = (n: number) => `sha256:${String(n).padStart(64, '0')}`;

let server: ThrowawayPostgres;
let dbCount = 0;
const pools: pg.Pool[] = [];

async function database(): Promise<pg.Pool> {
  const pool = openClusterDb({ url: server.createDatabase(`m${++dbCount}`), max: 10 });
  pools.push(pool);
  await migrateCluster(pool);
  return pool;
}

function host(id: string, capacity = 4, compat = COMPAT): HostRegistration {
  return { id, address: `http://${id}.test:7070`, capacity, compat };
}

async function register(pool: pg.Pool, ...hosts: HostRegistration[]): Promise<void> {
  for (const h of hosts) await new HostMembership(pool, h, () => ({ templates: ['base'], warmPools: {} }), LONG).register();
}

/** Writes a sandbox row as its owner would (through the directory), and waits for it. */
async function own(pool: pg.Pool, hostId: string, id: string, state: 'running' | 'suspended'): Promise<void> {
  const dir = new SandboxDirectory(pool);
  const epoch = (await pool.query<{ epoch: string }>('SELECT epoch FROM hosts WHERE id = $1', [hostId])).rows[0].epoch;
  dir.record(hostId, Number(epoch), id, 'acme', state);
  await dir.flushed();
}

const ownerOf = async (pool: pg.Pool, id: string) => (await pool.query('SELECT host_id FROM sandboxes WHERE id = $1', [id])).rows[0]?.host_id;

describe('moving suspended sandboxes: receivers, the owner flip, reconcile (real PostgreSQL)', { skip }, () => {
  before(async () => {
    server = await startPostgres();
  });
  after(async () => {
    for (const p of pools) await p.end();
    await server?.stop();
  });

  test('receivers: alive, same class, room to run it, never the source; those holding the artifact first', async () => {
    const pool = await database();
    await register(pool, host('h1'), host('h2', 8), host('h3', 2), host('h4', 0), host('h5', 4, OTHER), host('h6'));
    await pool.query(`UPDATE hosts SET heartbeat_at = now() - interval '1 hour', state = 'dead' WHERE id = 'h6'`);
    // h3 holds the artifact (and has less room than h2); h3 is then filled up.
    await pool.query(`INSERT INTO blob_locations (digest, host_id, kind, size, of) VALUES ($1, 'h3', 'artifact-disk', 1, $2)`, [DIGEST(1), KEY]);
    const moves = new SandboxMoves(pool);
    const compat = compatKey(COMPAT);
    assert.deepEqual((await moves.targets({ from: 'h1', compat, artifactKey: KEY })).map((t) => t.hostId), ['h3', 'h2']);
    await own(pool, 'h3', 'sbx_a', 'running');
    await own(pool, 'h3', 'sbx_b', 'running');
    assert.deepEqual((await moves.targets({ from: 'h1', compat, artifactKey: KEY })).map((t) => t.hostId), ['h2'], 'a full host receives none');
    assert.deepEqual((await moves.targets({ from: 'h2', compat, artifactKey: KEY })).map((t) => t.hostId), ['h1']);
    const none = await refusal(moves.targets({ from: 'h5', compat: compatKey(OTHER), artifactKey: KEY }));
    assert.equal(none.code, 'host_at_capacity');
    assert.equal(none.details?.reason, 'no_target');

    // A host the operator names: taken if it may, else why not, each with its code.
    assert.deepEqual(await moves.targets({ from: 'h1', compat, artifactKey: KEY, to: 'h2' }), [{ hostId: 'h2', address: 'http://h2.test:7070' }]);
    const cases: Array<[string, string, string | undefined]> = [
      ['h9', 'validation_error', undefined],
      ['h1', 'validation_error', undefined],
      ['h6', 'host_at_capacity', 'target_dead'],
      ['h5', 'conflict', 'incompatible_host'],
      ['h4', 'host_at_capacity', 'target_full'],
      ['h3', 'host_at_capacity', 'target_full'],
    ];
    for (const [to, code, reason] of cases) {
      const e = await refusal(moves.targets({ from: 'h1', compat, artifactKey: KEY, to }));
      assert.equal(e.code, code, `${to}: ${e.message}`);
      assert.equal(e.details?.reason, reason, to);
      assert.ok(e.message.length > 20);
    }
  });

  test('the owner flips once, only while the source owns it suspended and the receiver is alive', async () => {
    const pool = await database();
    await register(pool, host('h1'), host('h2'), host('h3'));
    const moves = new SandboxMoves(pool);
    await own(pool, 'h1', 'sbx_s', 'suspended');

    // The source's journal says it is no longer suspended (a resume or a delete got in first).
    assert.equal(await moves.flip('sbx_s', 'h1', 'h2', () => false), false);
    assert.equal(await ownerOf(pool, 'sbx_s'), 'h1', 'nothing changed');

    // Two moves of one sandbox at once: exactly one receiver becomes the owner.
    const both = await Promise.all([moves.flip('sbx_s', 'h1', 'h2', () => true), moves.flip('sbx_s', 'h1', 'h3', () => true)]);
    assert.deepEqual(both.filter(Boolean).length, 1, `one flip wins: ${both}`);
    const owner = await ownerOf(pool, 'sbx_s');
    assert.equal(owner, both[0] ? 'h2' : 'h3');
    const epoch = (await pool.query('SELECT epoch FROM hosts WHERE id = $1', [owner])).rows[0].epoch;
    assert.equal((await pool.query('SELECT host_epoch FROM sandboxes WHERE id = $1', ['sbx_s'])).rows[0].host_epoch, epoch, 'the row carries the new owner\'s epoch');
    // The source cannot flip it again, nor can the old owner's later writes take it back.
    assert.equal(await moves.flip('sbx_s', 'h1', 'h2', () => true), false);
    const dir = new SandboxDirectory(pool);
    dir.record('h1', 1, 'sbx_s', 'acme', 'running');
    dir.record('h1', 1, 'sbx_s', 'acme', null);
    await dir.flushed();
    assert.equal(await ownerOf(pool, 'sbx_s'), owner, 'the old owner\'s writes (a late mirror, its removal) leave the row alone');

    // Running (resumed), deleted, or a dead receiver: no flip.
    await own(pool, 'h1', 'sbx_r', 'running');
    assert.equal(await moves.flip('sbx_r', 'h1', 'h2', () => true), false);
    assert.equal(await moves.flip('sbx_gone', 'h1', 'h2', () => true), false);
    await own(pool, 'h1', 'sbx_t', 'suspended');
    await pool.query(`UPDATE hosts SET state = 'dead' WHERE id = 'h3'`);
    assert.equal(await moves.flip('sbx_t', 'h1', 'h3', () => true), false);
    assert.equal(await ownerOf(pool, 'sbx_t'), 'h1');
  });

  test('a host joining settles cut-off moves: keeps what flipped to it, drops what did not, and drops what moved away', async () => {
    const pool = await database();
    await register(pool, host('h1'), host('h2'));
    await own(pool, 'h1', 'sbx_in_done', 'suspended');
    await own(pool, 'h1', 'sbx_in_not', 'suspended');
    await own(pool, 'h2', 'sbx_out', 'suspended');
    await own(pool, 'h2', 'sbx_kept', 'suspended');
    const moves = new SandboxMoves(pool);
    // h2's view: two moves onto it were cut off (one had flipped), and one of its own moved to h1
    // before h2 could remove its copy.
    assert.equal(await moves.flip('sbx_in_done', 'h1', 'h2', () => true), true);
    assert.equal(await moves.flip('sbx_out', 'h2', 'h1', () => true), true);
    const calls: string[] = [];
    const engine = {
      moves: {
        pendingIn: () => ['sbx_in_done', 'sbx_in_not'],
        commitIn: (id: string) => { calls.push(`commit ${id}`); return true; },
        abortIn: (id: string) => { calls.push(`abort ${id}`); return true; },
        dropOut: (id: string, to: string) => { calls.push(`drop ${id} -> ${to}`); return true; },
      },
      list: (f: { state?: string }) => ({ sandboxes: f.state === 'suspended' ? ['sbx_in_done', 'sbx_in_not', 'sbx_kept', 'sbx_out'].map((id) => ({ id })) : [], next: null }),
    };
    const done = await reconcileMoves('h2', new SandboxDirectory(pool), engine);
    assert.deepEqual(calls, ['commit sbx_in_done', 'abort sbx_in_not', 'drop sbx_out -> h1'], done.join('; '));
    assert.equal(done.length, 3);
  });

  test('peer requests carry the secret and a JSON body, and read the JSON answer or say why there is none', async () => {
    const seen: Array<{ secret: unknown; body: string; method: string }> = [];
    const srv = createServer((req, res) => {
      let body = '';
      req.on('data', (c) => { body += c; });
      req.on('end', () => {
        seen.push({ secret: req.headers[PEER_HEADER], body, method: req.method! });
        if (req.url === '/html') res.writeHead(502).end('<html>bad gateway</html>');
        else res.writeHead(409, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { code: 'conflict', message: 'no' } }));
      });
    });
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const base = `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
    try {
      assert.deepEqual(await peerRequest('s3cret', base, 'POST', '/cluster/moves', { sandbox: 'sbx_1' }), { status: 409, json: { error: { code: 'conflict', message: 'no' } } });
      assert.deepEqual(seen[0], { secret: 's3cret', body: '{"sandbox":"sbx_1"}', method: 'POST' });
      const html = await peerRequest('s3cret', base, 'DELETE', '/html');
      assert.equal(html.status, 502);
      assert.match((html.json as { error: { message: string } }).error.message, /answered 502: <html>/);
    } finally {
      srv.close();
    }
    await assert.rejects(peerRequest('s', `http://127.0.0.1:${await freePort()}`, 'POST', '/x'), /could not be reached/);
  });
});
