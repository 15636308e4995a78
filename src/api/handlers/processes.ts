/** Handlers of /v1/sandboxes/{id}/processes: parse → one tenant-service call → render. */
import type { TenantService } from '../../service/tenantService.js';
import { notATerminal } from '../terminal.js';
import type { Handlers } from '../binder.js';
import type { SseStreams } from '../sse.js';
import { bodyChunks } from '../../wire/streamedBody.js';

type ProcessOps =
  | 'startProcess' | 'listProcesses' | 'getProcess' | 'processOutput' | 'writeProcessStdin' | 'closeProcessStdin'
  | 'signalProcess' | 'resizeProcess' | 'waitProcess' | 'processTerminal';

const DEFAULT_WAIT_SECS = 30;

export function processHandlers(tenants: TenantService, streams: SseStreams): Pick<Handlers, ProcessOps> {
  return {
    async startProcess({ scope, params, body }) {
      return { status: 201, body: await tenants.sandboxes.startProcess(scope, params.id, body) };
    },

    async listProcesses({ scope, params }) {
      return { status: 200, body: { processes: await tenants.sandboxes.listProcesses(scope, params.id) } };
    },

    async getProcess({ scope, params }) {
      return { status: 200, body: await tenants.sandboxes.getProcess(scope, params.id, Number(params.pid)) };
    },

    async processOutput({ scope, params, query, reply }) {
      const pid = Number(params.pid);
      const from = query.from === undefined || query.from === 'start' ? 'start' : query.from === 'now' ? 'now' : Number(query.from);
      // Found before committing to a 200 stream, so an unknown process is still a 404.
      await tenants.sandboxes.getProcess(scope, params.id, pid);
      tenants.quotas.holdStream(scope, reply.raw);
      await streams.streamProcess(reply, (listener) => tenants.sandboxes.watchProcessOutput(scope, params.id, pid, from, listener));
      return null;
    },

    async writeProcessStdin({ scope, params, body }) {
      const pid = Number(params.pid);
      const written = await tenants.sandboxes.writeProcessStdin(scope, params.id, pid, bodyChunks(body));
      return { status: 200, body: { pid, written } };
    },

    async closeProcessStdin({ scope, params }) {
      const pid = Number(params.pid);
      await tenants.sandboxes.closeProcessStdin(scope, params.id, pid);
      return { status: 200, body: await tenants.sandboxes.getProcess(scope, params.id, pid) };
    },

    async signalProcess({ scope, params, body }) {
      const pid = Number(params.pid);
      await tenants.sandboxes.signalProcess(scope, params.id, pid, body.signal);
      return { status: 200, body: await tenants.sandboxes.getProcess(scope, params.id, pid) };
    },

    async resizeProcess({ scope, params, body }) {
      const pid = Number(params.pid);
      await tenants.sandboxes.resizeProcess(scope, params.id, pid, body.cols, body.rows);
      return { status: 200, body: await tenants.sandboxes.getProcess(scope, params.id, pid) };
    },

    async processTerminal({ scope, params }) {
      // Only a plain GET reaches here: a WebSocket upgrade goes to terminal.ts (via portsProxy.ts).
      const proc = await tenants.sandboxes.getProcess(scope, params.id, Number(params.pid));
      if (!proc.pty) throw notATerminal(proc.pid);
      return { status: 200, body: proc };
    },

    async waitProcess({ scope, params, body }) {
      return { status: 200, body: await tenants.sandboxes.waitProcess(scope, params.id, Number(params.pid), body.timeout ?? DEFAULT_WAIT_SECS) };
    },
  };
}
