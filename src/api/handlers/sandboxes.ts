/** Handlers of /v1/sandboxes: parse → one tenant-service call → render. */
import { CollimateError } from '../../errors.js';
import { DISK_SAMPLE_MS, SAMPLE_MS } from '../../service/sandboxMetrics.js';
import type { TenantService } from '../../service/tenantService.js';
import * as S from '../../wire/schemas.js';
import { execResultView, sandboxView, snapshotView } from '../../wire/views.js';
import type { Handlers } from '../binder.js';
import { wantsSse, type SseStreams } from '../sse.js';

type SandboxOps =
  | 'createSandbox' | 'listSandboxes' | 'getSandbox' | 'createPortUrl' | 'rotateSandboxTokens' | 'execSandbox' | 'forkSandbox'
  | 'suspendSandbox' | 'resumeSandbox' | 'setSandboxTimeout' | 'setSandboxEgress' | 'deleteSandbox' | 'listExecs' | 'getSandboxMetrics' | 'getSandboxLogs'
  | 'createSnapshot' | 'listSnapshots' | 'getSnapshot' | 'deleteSnapshot' | 'promoteSnapshot' | 'restoreSandbox';

/** `key=value` label filters of a list query. */
export function parseLabelFilter(label: string | string[] | undefined): Record<string, string> | undefined {
  if (label === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const l of Array.isArray(label) ? label : [label]) {
    const eq = l.indexOf('=');
    if (eq <= 0) throw new CollimateError('validation_error', `label filter ${JSON.stringify(l.slice(0, 100))} must be key=value.`);
    const k = l.slice(0, eq);
    if (!S.LABEL_KEY_RE.test(k)) throw new CollimateError('validation_error', `label key ${JSON.stringify(k.slice(0, 100))} must match ${S.LABEL_KEY_RE.source}.`);
    out[k] = l.slice(eq + 1);
  }
  return out;
}

export function sandboxHandlers(tenants: TenantService, streams: SseStreams): Pick<Handlers, SandboxOps> {
  return {
    async createSandbox({ scope, body }) {
      if (body.snapshot !== undefined) {
        if (body.template !== undefined) throw new CollimateError('validation_error', 'Give either template or snapshot, not both: a sandbox started from a snapshot has the snapshot\'s template.');
        const started = await tenants.sandboxes.startFromSnapshot(scope, {
          snapshot: body.snapshot, count: body.count ?? 1, labels: body.labels, timeoutSecs: body.timeout_secs, egress: body.egress, onTimeout: body.on_timeout, autoResume: body.auto_resume,
          keepMemory: body.keep_memory, publicPorts: body.public_ports, portHost: body.port_host,
        });
        const views = started.map(sandboxView);
        return { status: 201, body: body.count === undefined ? views[0] : { ...views[0], sandboxes: views } };
      }
      if (body.count !== undefined) throw new CollimateError('validation_error', 'count starts several sandboxes from a snapshot: give snapshot with it (a template create makes one; fork one to have more).');
      if (body.template === undefined) throw new CollimateError('validation_error', 'Give template (see GET /v1/templates) or snapshot (see GET /v1/snapshots).');
      const info = await tenants.sandboxes.create(scope, {
        template: body.template, labels: body.labels, timeoutSecs: body.timeout_secs, egress: body.egress, onTimeout: body.on_timeout, autoResume: body.auto_resume,
        keepMemory: body.keep_memory, publicPorts: body.public_ports, portHost: body.port_host,
      });
      return { status: 201, body: sandboxView(info) };
    },

    async createSnapshot({ scope, params, body }) {
      return { status: 201, body: snapshotView(await tenants.sandboxes.createSnapshot(scope, params.id, { name: body.name, labels: body.labels })) };
    },

    async listSnapshots({ scope, query }) {
      const r = await tenants.sandboxes.listSnapshots(scope, { sandboxId: query.sandbox_id, labels: parseLabelFilter(query.label), after: query.after, limit: query.limit ?? 100 });
      return { status: 200, body: { snapshots: r.snapshots.map(snapshotView), next: r.next } };
    },

    async getSnapshot({ scope, params }) {
      return { status: 200, body: snapshotView(await tenants.sandboxes.getSnapshot(scope, params.snapshot)) };
    },

    async deleteSnapshot({ scope, params }) {
      await tenants.sandboxes.deleteSnapshot(scope, params.snapshot);
      return { status: 204 };
    },

    async promoteSnapshot({ scope, params, body }) {
      return { status: 200, body: snapshotView(await tenants.sandboxes.promoteSnapshot(scope, params.snapshot, body.environment)) };
    },

    async restoreSandbox({ scope, params, body }) {
      return { status: 200, body: sandboxView(await tenants.sandboxes.restore(scope, params.id, body.snapshot)) };
    },

    async listSandboxes({ scope, query }) {
      const r = await tenants.sandboxes.list(scope, { state: query.state, labels: parseLabelFilter(query.label), after: query.after, limit: query.limit ?? 100 });
      return { status: 200, body: { sandboxes: r.sandboxes.map(sandboxView), next: r.next } };
    },

    async getSandbox({ scope, params }) {
      return { status: 200, body: sandboxView(await tenants.sandboxes.inspect(scope, params.id)) };
    },

    async createPortUrl({ scope, params, body }) {
      const u = await tenants.sandboxes.portUrl(scope, params.id, body.port, body.expires_in_secs);
      return { status: 201, body: { url: `/v1/p/${u.token}/`, port: u.port, expires_at: new Date(u.expiresAt * 1000).toISOString() } };
    },

    async rotateSandboxTokens({ scope, params }) {
      const t = await tenants.accounts.rotateSandboxTokens(scope, params.id);
      return { status: 200, body: { envd_access_token: t.envd, traffic_access_token: t.traffic, generation: t.generation } };
    },

    async execSandbox({ scope, params, body, req, reply }) {
      if (!wantsSse(req.headers.accept)) {
        return { status: 200, body: execResultView(await tenants.sandboxes.exec(scope, params.id, body)) };
      }
      // Checked before committing to a 200 stream, so the common mistakes still get their status code.
      await tenants.sandboxes.requireRunning(scope, params.id, 'exec');
      tenants.quotas.holdStream(scope, reply.raw);
      await streams.streamExec(reply, req.log, req.id, (handlers) => tenants.sandboxes.exec(scope, params.id, body, handlers));
      return null;
    },

    async listExecs({ scope, params, query }) {
      return { status: 200, body: { execs: await tenants.sandboxes.recentExecs(scope, params.id, query.limit) } };
    },

    async getSandboxLogs({ scope, params, query }) {
      const logs = await tenants.sandboxes.logs(scope, params.id, {
        cursorMs: query.cursor, direction: query.direction, level: query.level, search: query.search, limit: query.limit,
      });
      return { status: 200, body: { logs } };
    },

    async forkSandbox({ scope, params, body }) {
      const children = await tenants.sandboxes.fork(scope, params.id, { count: body.count ?? 1, labels: body.labels });
      return { status: 201, body: { sandboxes: children.map(sandboxView) } };
    },

    async suspendSandbox({ scope, params, body }) {
      return { status: 200, body: sandboxView(await tenants.sandboxes.suspend(scope, params.id, { keepMemory: body?.keep_memory })) };
    },

    async resumeSandbox({ scope, params }) {
      return { status: 200, body: sandboxView(await tenants.sandboxes.resume(scope, params.id)) };
    },

    async setSandboxTimeout({ scope, params, body }) {
      return { status: 200, body: sandboxView(await tenants.sandboxes.setTimeout(scope, params.id, body.timeout_secs)) };
    },

    async getSandboxMetrics({ scope, params, query }) {
      const samples = await tenants.sandboxes.metrics(scope, params.id, query.from ? Date.parse(query.from) : undefined, query.to ? Date.parse(query.to) : undefined);
      return {
        status: 200,
        body: {
          period_secs: SAMPLE_MS / 1000,
          disk_period_secs: DISK_SAMPLE_MS / 1000,
          samples: samples.map((s) => ({
            at: new Date(s.atMs).toISOString(), cpu_percent: s.cpuPercent, memory_mib: s.memoryMib, disk_used_bytes: s.diskUsedBytes, disk_total_bytes: s.diskTotalBytes,
          })),
        },
      };
    },

    async setSandboxEgress({ scope, params, body }) {
      return { status: 200, body: sandboxView(await tenants.sandboxes.setEgress(scope, params.id, body.egress)) };
    },

    async deleteSandbox({ scope, params }) {
      await tenants.sandboxes.delete(scope, params.id);
      return { status: 204 };
    },

  };
}
