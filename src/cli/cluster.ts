import { parseArgs } from 'node:util';
import { CollimateError, ERROR_CODES, type ErrorCode } from '../errors.js';
import { openClusterDb } from '../cluster/db.js';
import { peerRequest } from '../cluster/moves.js';

/**
 * `collimate cluster move SANDBOX` and `collimate cluster drain --host ID`: an operator moves
 * suspended sandboxes off a host. The command reads the cluster database (where the sandbox is, the
 * hosts' addresses, the peer secret) and asks the host that holds them, which does the move
 * (src/api/moveRoutes.ts). It prints the answer as JSON; exit 1 when something did not move.
 */
export async function clusterCommand(sub: string | undefined, args: string[], io: { out(s: string): void; err(s: string): void }, url: string | undefined): Promise<number> {
  if (sub !== 'move' && sub !== 'drain') throw new UsageArgError(`unknown cluster command ${sub ?? ''} (move or drain)`);
  if (!url) throw new UsageArgError('name the cluster database: --cluster postgres://… or $COLLIMATE_CLUSTER');
  let parsed;
  try {
    parsed = parseArgs({ args, allowPositionals: true, options: { cluster: { type: 'string' }, to: { type: 'string' }, host: { type: 'string' } } });
  } catch (e) {
    throw new UsageArgError((e as Error).message);
  }
  const { values, positionals } = parsed;
  const pool = openClusterDb({ url, max: 1 });
  try {
    const secret = (await pool.query<{ value: string }>(`SELECT value FROM cluster_settings WHERE name = 'peer_secret'`)).rows[0]?.value;
    if (!secret) throw new CollimateError('not_found', 'This database holds no cluster (no peer secret): start a host with collimate serve --cluster first.');
    let address: string;
    let path: string;
    let body: Record<string, unknown>;
    if (sub === 'move') {
      const id = positionals[0];
      if (!id || positionals.length > 1) throw new UsageArgError('collimate cluster move SANDBOX_ID [--to HOST_ID]');
      const r = await pool.query<{ address: string; state: string; alive: boolean; host_id: string }>(
        `SELECT h.address, s.state, h.state = 'alive' AS alive, s.host_id FROM sandboxes s JOIN hosts h ON h.id = s.host_id WHERE s.id = $1`, [id]);
      const row = r.rows[0];
      if (!row || row.state === 'lost') throw new CollimateError('sandbox_not_found', `No sandbox ${id} in the cluster${row ? ' (it was lost with its host)' : ''}.`);
      if (!row.alive) throw new CollimateError('host_at_capacity', `Sandbox ${id} is on host ${row.host_id}, which is not available; its files are on that host's disk, so it moves once the host is back.`);
      [address, path, body] = [row.address, '/cluster/moves', { sandbox: id, ...(values.to ? { to: values.to } : {}) }];
    } else {
      if (!values.host) throw new UsageArgError('collimate cluster drain --host HOST_ID [--to HOST_ID]');
      const h = (await pool.query<{ address: string; alive: boolean }>(`SELECT address, state = 'alive' AS alive FROM hosts WHERE id = $1`, [values.host])).rows[0];
      if (!h) throw new CollimateError('validation_error', `No host ${values.host} in the cluster.`);
      if (!h.alive) throw new CollimateError('host_at_capacity', `Host ${values.host} is not available; its suspended sandboxes' files are on its disk, so it drains once it is back.`);
      [address, path, body] = [h.address, '/cluster/drain', values.to ? { to: values.to } : {}];
    }
    const res = await peerRequest(secret, address, 'POST', path, body);
    const json = res.json as { error?: { code?: string; message?: string }; failed?: unknown[] };
    if (res.status !== 200) {
      const code = json.error?.code && json.error.code in ERROR_CODES ? json.error.code as ErrorCode : 'internal_error';
      throw new CollimateError(code, json.error?.message ?? `the host answered ${res.status}`);
    }
    io.out(JSON.stringify(json, null, 2) + '\n');
    return json.failed && json.failed.length > 0 ? 1 : 0;
  } catch (e) {
    if (e instanceof CollimateError || e instanceof UsageArgError) throw e;
    // The database or the host could not be reached, or answered something else than JSON.
    throw new CollimateError('internal_error', `${(e as Error).message}; check that the cluster database and the host are reachable from here.`);
  } finally {
    await pool.end();
  }
}

/** A usage mistake (exit 2), told apart from a refusal of the move itself (exit 1). */
export class UsageArgError extends Error {}
