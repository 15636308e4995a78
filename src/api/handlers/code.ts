/** Handlers of /v1/sandboxes/{id}/code: parse → one call of the code interpreter (src/service/code.ts) → render. */
import type { TenantService } from '../../service/tenantService.js';
import type { Handlers } from '../binder.js';
import { wantsSse, type SseStreams } from '../sse.js';

type CodeOps = 'runCode' | 'listCodeContexts' | 'createCodeContext' | 'restartCodeContext' | 'interruptCodeContext' | 'deleteCodeContext';

export function codeHandlers(tenants: TenantService, streams: SseStreams): Pick<Handlers, CodeOps> {
  return {
    async runCode({ scope, params, body, req, reply }) {
      const request = { code: body.code, language: body.language, context: body.context, env: body.env, timeoutSecs: body.timeout_secs, seed: body.seed };
      if (!wantsSse(req.headers.accept)) {
        return { status: 200, body: await tenants.code.run(scope, params.id, request) };
      }
      // Checked before committing to a 200 stream, so the common mistakes still get their status code.
      await tenants.sandboxes.requireRunning(scope, params.id, 'run code');
      tenants.quotas.holdStream(scope, reply.raw);
      await streams.streamCode(reply, req.log, req.id, (handlers) => tenants.code.run(scope, params.id, request, handlers));
      return null;
    },

    async listCodeContexts({ scope, params }) {
      return { status: 200, body: { contexts: await tenants.code.contexts(scope, params.id) } };
    },

    async createCodeContext({ scope, params, body }) {
      return { status: 201, body: await tenants.code.createContext(scope, params.id, { language: body.language, cwd: body.cwd }) };
    },

    async restartCodeContext({ scope, params }) {
      return { status: 200, body: await tenants.code.restartContext(scope, params.id, params.context) };
    },

    async interruptCodeContext({ scope, params }) {
      return { status: 200, body: await tenants.code.interruptContext(scope, params.id, params.context) };
    },

    async deleteCodeContext({ scope, params }) {
      await tenants.code.deleteContext(scope, params.id, params.context);
      return { status: 204 };
    },
  };
}
