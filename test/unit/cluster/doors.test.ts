/**
 * One contract for every door and both modes: the same operations through REST, MCP and E2B's API,
 * against one host and against a three-host cluster (real `collimate serve` processes with the fake
 * engine, a real PostgreSQL), give the same outcomes — the Demo tier's cap, state errors, and
 * Idempotency-Key. Then every operation that can start a sandbox, through every door, is fired
 * concurrently at a cluster through hosts that do not own the sandbox: the cap holds for each.
 *
 * Which operations start sandboxes is read from the tenant service (the methods that ask the
 * placement to start something), so an operation added there fails this test until it is covered.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { postgresUnavailable, startPostgres, type ThrowawayPostgres } from '../../support/postgres.js';
import { startFakeHost, stopFakeHost, type FakeHost } from '../../support/serveProcess.ts';
import { call, DOORS, type Door, type Outcome } from '../../support/doors.ts';

const BIN = fileURLToPath(new URL('../../../bin/collimate.js', import.meta.url));
const SERVICE = fileURLToPath(new URL('../../../src/service/sandboxes.ts', import.meta.url));
const skip = postgresUnavailable() ?? false;

type Host = FakeHost;
// The contract is the running cap: the Demo tier's quota of suspended sandboxes (quotas.ts) is lifted
// so that the resume race can hold four suspended ones.
const startHost = (args: string[], home: string) => startFakeHost(args, home, { COLLIMATE_QUOTAS: JSON.stringify({ demo: { suspended_sandboxes: null, suspended_mib: null } }) });
const stopHost = (h: Host) => stopFakeHost(h);

function makeKey(where: string[], tenant: string, tier: string): string {
  const r = spawnSync(process.execPath, [BIN, 'keys', 'create', '--tenant', tenant, '--tier', tier, ...where], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trimEnd().split('\n').pop()!;
}

/** A deployment the contract runs against: its hosts, and a fresh Demo key per check. */
interface Deployment {
  name: string;
  hosts: Host[];
  demoKey(tag: string): string;
  proKey(tag: string): string;
}

const expectOk = (o: Outcome, what: string) => assert.ok(o.ok, `${what}: ${o.raw}`);
const expectCode = (o: Outcome, code: string, what: string) => assert.equal(o.ok ? 'ok' : o.code, code, `${what}: ${o.raw}`);
/** An error's message points to the operation that fixes it by the door's own name, and names no other door's routes or tools. */
const expectPointer = (door: Door, o: Outcome, name: string | null, what: string) => {
  if (name) assert.ok(o.raw.includes(` with ${name}`), `${what} points to ${name}: ${o.raw}`);
  if (door.name !== 'rest') assert.doesNotMatch(o.raw, /\/v1\//, `${what} names no REST route to a ${door.name} user`);
  if (door.name !== 'mcp') assert.doesNotMatch(o.raw, /_sandbox tool/, `${what} names no MCP tool to a ${door.name} user`);
};

/** The contract: what a user of each door gets, the same on one host and on a cluster. */
function contract(get: () => Deployment) {
  for (const door of DOORS) {
    test(`${door.name}: the Demo cap of 2 counts creates, forks and resumes; suspended sandboxes do not count`, async () => {
      const d = get();
      const key = d.demoKey(`cap-${door.name}`);
      const [h0, h1, h2] = [d.hosts[0], d.hosts[1 % d.hosts.length], d.hosts[2 % d.hosts.length]];
      const a = await door.create(h0.url, key);
      expectOk(a, 'first create');
      const b = await door.create(h1.url, key);
      expectOk(b, 'second create');
      const third = await door.create(h2.url, key);
      expectCode(third, 'concurrency_limit', 'a third create');
      expectPointer(door, third, door.names.suspend, 'concurrency_limit');
      expectCode(await door.fork(h2.url, key, a.id!), 'concurrency_limit', 'a fork at the cap');
      expectOk(await door.suspend(h1.url, key, b.id!), 'suspend');
      const c = await door.fork(h2.url, key, a.id!);
      expectOk(c, 'a fork once one is suspended');
      expectCode(await door.resume(h0.url, key, b.id!), 'concurrency_limit', 'a resume at the cap');
      expectOk(await door.remove(h0.url, key, c.ids![0]), 'delete a child');
      expectOk(await door.resume(h2.url, key, b.id!), 'a resume once one is deleted');
      for (const id of [a.id!, b.id!]) expectOk(await door.remove(h1.url, key, id), 'delete');
    });

    test(`${door.name}: state errors say invalid_state, another tenant's sandbox is not found, a deleted one too`, async () => {
      const d = get();
      const key = d.proKey(`state-${door.name}`);
      const other = d.proKey(`other-${door.name}`);
      const h = d.hosts[d.hosts.length - 1];
      const a = await door.create(d.hosts[0].url, key);
      expectOk(a, 'create');
      expectCode(await door.resume(h.url, key, a.id!), 'invalid_state', 'resume of a running sandbox');
      expectOk(await door.suspend(h.url, key, a.id!), 'suspend');
      const again = await door.suspend(h.url, key, a.id!);
      expectCode(again, 'invalid_state', 'suspend of a suspended sandbox');
      expectPointer(door, again, door.names.resume(a.id!), 'invalid_state');
      expectCode(await door.fork(h.url, other, a.id!), 'sandbox_not_found', "another tenant's fork");
      expectOk(await door.remove(h.url, key, a.id!), 'delete');
      expectCode(await door.resume(d.hosts[0].url, key, a.id!), 'sandbox_not_found', 'resume of a deleted sandbox');
      const gone = await door.fork(h.url, key, a.id!);
      expectCode(gone, 'sandbox_not_found', 'fork of a deleted sandbox');
      expectPointer(door, gone, door.names.list, 'sandbox_not_found');
    });
  }

  test('Idempotency-Key: one key sent to every host at once makes one sandbox; the same key on another request is idempotency_key_reused', async () => {
    const d = get();
    const key = d.proKey('idem');
    const send = (h: Host, body: unknown, path = '/v1/sandboxes') => call(h.url, key, 'POST', path, body, { 'idempotency-key': 'contract-key' });
    const rs = await Promise.all(d.hosts.flatMap((h) => [send(h, { template: 'base' }), send(h, { template: 'base' })]));
    assert.ok(rs.every((r) => r.status === 201), rs.map((r) => r.bytes.toString()).join('\n'));
    assert.equal(new Set(rs.map((r) => r.json.id)).size, 1);
    const id = rs[0].json.id as string;
    assert.equal((await send(d.hosts[0], { template: 'python' })).json?.error?.code, 'idempotency_key_reused');
    // A resume retried with its key resumes once (the drift fixed: on one host it ran again).
    assert.equal((await call(d.hosts[0].url, key, 'POST', `/v1/sandboxes/${id}/suspend`)).status, 200);
    const resumes = await Promise.all(d.hosts.map((h) => call(h.url, key, 'POST', `/v1/sandboxes/${id}/resume`, undefined, { 'idempotency-key': 'resume-key' })));
    assert.ok(resumes.every((r) => r.status === 200), resumes.map((r) => r.bytes.toString()).join('\n'));
    assert.ok(resumes.some((r) => r.headers.get('idempotent-replayed') === 'true') || d.hosts.length === 1);
    assert.equal((await call(d.hosts[0].url, key, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
  });
}

describe('every door, one host and a three-host cluster: one contract (fake engines, real PostgreSQL)', { skip }, () => {
  let pgServer: ThrowawayPostgres;
  let db: pg.Pool;
  const single: Host[] = [];
  const cluster: Host[] = [];
  let clusterUrl = '';

  before(async () => {
    pgServer = await startPostgres();
    clusterUrl = pgServer.url;
    const clusterArgs = (capacity: number) => ['--cluster', clusterUrl, '--advertise', '$URL', '--capacity', String(capacity)];
    const home = () => mkdtempSync(join(tmpdir(), 'cd-'));
    const [one, ...three] = await Promise.all([
      startHost([], home()),
      startHost(clusterArgs(20), home()),
      startHost(clusterArgs(20), home()),
      startHost(clusterArgs(0), home()),
    ]);
    single.push(one);
    cluster.push(...three);
    db = new pg.Pool({ connectionString: clusterUrl });
    db.on('error', () => {});
  });

  after(async () => {
    await Promise.all([...single, ...cluster].map((h) => stopHost(h)));
    await db?.end();
    await pgServer?.stop();
  });

  // Keys are made before the server reads them: the single host's in its home (its database is
  // read per request), the cluster's in PostgreSQL.
  const keyMaker = (where: () => string[]) => (tenant: string, tier: string) => makeKey(where(), tenant, tier);

  describe('one host', () => {
    contract(() => ({
      name: 'one host',
      hosts: single,
      demoKey: (tag) => keyMaker(() => ['--home', single[0].home])(`one-${tag}`, 'demo'),
      proKey: (tag) => keyMaker(() => ['--home', single[0].home])(`one-${tag}`, 'pro'),
    }));
  });

  describe('three hosts', () => {
    contract(() => ({
      name: 'three hosts',
      hosts: cluster,
      demoKey: (tag) => keyMaker(() => ['--cluster', clusterUrl])(`three-${tag}`, 'demo'),
      proKey: (tag) => keyMaker(() => ['--cluster', clusterUrl])(`three-${tag}`, 'pro'),
    }));

    test('every operation that starts a sandbox, through every door, fired concurrently through hosts that do not own it, stays within the Demo cap', async () => {
      // What starts sandboxes is what asks the placement to start: read from the service, so a new one is seen here.
      const service = readFileSync(SERVICE, 'utf8');
      const starters = [...service.matchAll(/\n  async (\w+)\(scope: Scope[^\n]*\n((?:(?!\n  async )[\s\S])*?)\n  }\n/g)]
        .filter((m) => /this\.placement\.start(Spread)?\(|this\.startSpread\(/.test(m[2])).map((m) => m[1]).sort();
      assert.deepEqual(starters, ['create', 'fork', 'resume', 'startFromSnapshot'], 'the tenant service starts sandboxes only in these; cover a new one here');
      const owner = async (id: string) => (await db.query('SELECT h.address FROM sandboxes s JOIN hosts h ON h.id = s.host_id WHERE s.id = $1', [id])).rows[0]?.address as string;
      for (const door of DOORS) {
        for (const op of starters) {
          const key = makeKey(['--cluster', clusterUrl], `race-${door.name}-${op.toLowerCase()}`, 'demo');
          // One slot left: one running sandbox (the fork's parent), and for resumes four suspended ones.
          const parent = await door.create(cluster[0].url, key);
          expectOk(parent, `${door.name} ${op}: the first sandbox`);
          const suspended: string[] = [];
          if (op === 'resume') {
            for (let i = 0; i < 4; i++) {
              const s = await door.create(cluster[i % 3].url, key);
              expectOk(s, 'a sandbox to suspend');
              expectOk(await door.suspend(cluster[(i + 1) % 3].url, key, s.id!), 'suspend');
              suspended.push(s.id!);
            }
          }
          // Starts from a snapshot of the parent, which lies on the parent's host.
          let snapshot = '';
          if (op === 'startFromSnapshot') {
            const taken = await call(cluster[1].url, key, 'POST', `/v1/sandboxes/${parent.id}/snapshots`, {});
            assert.equal(taken.status, 201, `a snapshot to start from: ${taken.bytes.toString()}`);
            snapshot = taken.json.id;
          }
          const ownerUrl = await owner(parent.id!);
          const via = cluster.filter((h) => h.url !== ownerUrl);
          // Each resume through a host that does not hold that sandbox.
          const resumeVia = await Promise.all(suspended.map(async (id, i) => {
            const o = await owner(id);
            const others = cluster.filter((h) => h.url !== o);
            return others[i % others.length];
          }));
          const fire = (i: number): Promise<Outcome> => {
            const h = via[i % via.length];
            if (op === 'create') return door.create(h.url, key);
            if (op === 'fork') return door.fork(h.url, key, parent.id!);
            if (op === 'startFromSnapshot') return door.startFromSnapshot(h.url, key, snapshot);
            return door.resume(resumeVia[i].url, key, suspended[i]);
          };
          const outcomes = await Promise.all(Array.from({ length: op === 'resume' ? 4 : 8 }, (_, i) => fire(i)));
          const started = outcomes.filter((o) => o.ok);
          const refused = outcomes.filter((o) => !o.ok && o.code === 'concurrency_limit');
          assert.equal(started.length, 1, `${door.name} ${op}: exactly one of ${outcomes.length} starts fits: ${outcomes.map((o) => o.raw).join('\n')}`);
          assert.equal(refused.length, outcomes.length - 1, `${door.name} ${op}: the rest are concurrency_limit: ${outcomes.map((o) => o.raw).join('\n')}`);
          const running = await call(cluster[2].url, key, 'GET', '/v1/limits');
          assert.equal(running.json.running, 2, `${door.name} ${op}: two running on the cluster`);
          const all = await call(cluster[1].url, key, 'GET', '/v1/sandboxes');
          for (const s of all.json.sandboxes) assert.equal((await call(cluster[2].url, key, 'DELETE', `/v1/sandboxes/${s.id}`)).status, 204);
          if (snapshot) assert.equal((await call(cluster[0].url, key, 'DELETE', `/v1/snapshots/${snapshot}`)).status, 204);
        }
      }
    });
  });
});

