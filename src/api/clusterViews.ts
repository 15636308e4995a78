/**
 * Tenant-wide views on a cluster host, over every host rather than this one: GET /v1/usage sums the
 * usage every host pushed to PostgreSQL (src/cluster/usage.ts), GET /v1/stats asks each alive host
 * that runs some of the tenant's sandboxes for its readings (with the peer secret, so each answers
 * from its own engine) and merges them. GET /v1/events needs nothing here: the tenant service's
 * event source is the cluster's (src/cluster/events.ts).
 */
import type { IncomingMessage } from 'node:http';
import type { FastifyRequest } from 'fastify';
import { checkUsageRange, type UsageReport } from '../service/metering.js';
import type { Scope, TenantService } from '../service/tenantService.js';
import { parseWith } from '../wire/errors.js';
import * as S from '../wire/schemas.js';
import { clusterUsage, type UsagePush } from '../cluster/usage.js';
import type { ClusterNode } from '../cluster/node.js';
import { parseTime } from './handlers/operations.js';

type LiveStat = { id: string; cpu_percent: number | null; memory_mib: number };

/** GET /v1/usage over every host: this host's latest rows are pushed first, so its own changes show at once. */
export async function usageAcrossHosts(req: FastifyRequest, node: ClusterNode, scope: Scope, push: UsagePush | undefined, now = Date.now()): Promise<UsageReport> {
  const query = parseWith(S.UsageQuery, (req.query ?? {}) as Record<string, unknown>, 'query') as { from?: string; to?: string; per?: string };
  const d = new Date(now);
  const to = query.to === undefined ? now : parseTime(query.to, 'to');
  const from = query.from === undefined ? Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) : parseTime(query.from, 'from');
  const perDay = query.per === 'day';
  checkUsageRange(from, to, { perDay });
  await push?.push().catch((err) => req.log.warn({ err }, 'pushing usage before a report failed'));
  return clusterUsage(node.pool, scope.tenant, from, to, now, { perDay });
}

/**
 * GET /v1/stats over every host: this host's readings and those of each other alive host that runs
 * some of the tenant's sandboxes. A host that does not answer is left out (its sandboxes have no
 * reading this time) rather than failing the whole answer.
 */
export async function statsAcrossHosts(req: FastifyRequest, node: ClusterNode, tenants: TenantService, scope: Scope, ask: (address: string) => Promise<IncomingMessage>): Promise<{ sandboxes: LiveStat[] }> {
  const local: LiveStat[] = tenants.liveStats(scope).map((s) => ({ id: s.id, cpu_percent: s.cpuPercent, memory_mib: s.memoryMib }));
  const peers = await node.pool.query<{ address: string }>(
    `SELECT DISTINCT h.address FROM sandboxes s JOIN hosts h ON h.id = s.host_id
     WHERE s.tenant = $1 AND s.state = 'running' AND h.state = 'alive' AND h.id <> $2`,
    [scope.tenant, node.hostId],
  );
  const remote = await Promise.all(
    peers.rows.map(async ({ address }) => {
      try {
        const res = await ask(address);
        const chunks: Buffer[] = [];
        for await (const c of res) chunks.push(c as Buffer);
        if (res.statusCode !== 200) throw new Error(`status ${res.statusCode}`);
        return (JSON.parse(Buffer.concat(chunks).toString('utf8')) as { sandboxes: LiveStat[] }).sandboxes;
      } catch (err) {
        req.log.warn({ err, address }, 'a cluster host did not give its live stats');
        return [];
      }
    }),
  );
  const all = [...local, ...remote.flat()];
  all.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return { sandboxes: all };
}
