/** Handlers of the tenant's own account (keys, limits), its event stream and live stats: parse → one tenant-service call → render. */
import type { KeyRecord } from '../../service/keys.js';
import type { TenantService } from '../../service/tenantService.js';
import type { Tier } from '../../service/tiers.js';
import type { Handlers } from '../binder.js';
import type { SseStreams } from '../sse.js';

type AccountOps = 'listKeys' | 'createKey' | 'revokeKey' | 'getLimits' | 'streamEvents' | 'getLiveStats';

/** What a tenant sees of a key: never its hash, nor the tenant and tier it already knows. */
export function keyView(r: KeyRecord) {
  return { id: r.id, prefix: r.prefix, name: r.name, created_at: r.created_at, last_used_at: r.last_used_at };
}

/** The tier's limits and how many of the tenant's sandboxes run (GET /v1/limits). */
export function limitsView(tier: Tier, running: number, quotas: Record<string, { limit: number | null; used: number }>) {
  return {
    tier: tier.name,
    max_running: tier.maxRunning,
    running,
    own_images: tier.ownImages,
    max_session_secs: tier.maxSessionSecs,
    default_session_secs: tier.defaultSessionSecs,
    max_vcpus: tier.maxVcpus,
    max_memory_mib: tier.maxMemoryMib,
    quotas,
  };
}

export function accountHandlers(tenants: TenantService, streams: SseStreams): Pick<Handlers, AccountOps> {
  return {
    async listKeys({ scope }) {
      return { status: 200, body: { keys: (await tenants.accounts.ownKeys(scope)).map(keyView) } };
    },

    async createKey({ scope, body }) {
      const { key, record } = await tenants.accounts.createOwnKey(scope, body.name);
      return { status: 201, body: { key, record: keyView(record) } };
    },

    async revokeKey({ scope, params }) {
      await tenants.accounts.revokeOwnKey(scope, params.id);
      return { status: 204 };
    },

    async getLimits({ scope }) {
      const { tier, running } = await tenants.accounts.limits(scope);
      return { status: 200, body: limitsView(tier, running, await tenants.quotaUse(scope)) };
    },

    async getLiveStats({ scope }) {
      return { status: 200, body: { sandboxes: (await tenants.usage.liveStats(scope)).map((s) => ({ id: s.id, cpu_percent: s.cpuPercent, memory_mib: s.memoryMib })) } };
    },

    streamEvents({ scope, reply }) {
      tenants.quotas.holdStream(scope, reply.raw);
      streams.streamSandboxEvents(reply, (listener) => tenants.events.watch(scope, listener));
      return null;
    },
  };
}
