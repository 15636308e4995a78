/** Handlers of /v1/images, /v1/environments and /v1/templates: parse → one tenant-service call → render. */
import { CollimateError } from '../../errors.js';
import type { TenantService } from '../../service/tenantService.js';
import * as S from '../../wire/schemas.js';
import { environmentView, imageView, templateView } from '../../wire/views.js';
import type { Handlers } from '../binder.js';
import { wantsSse, type SseStreams } from '../sse.js';

type ImageOps =
  | 'listImages' | 'createImage' | 'getImage' | 'deleteImage'
  | 'createEnvironment' | 'listEnvironments' | 'getEnvironment' | 'getEnvironmentLog' | 'deleteEnvironment'
  | 'listTemplates' | 'getTemplate';

const IMAGE_ID_RE = /^sha256:[a-f0-9]{64}$/;

function checkImageId(id: string): void {
  if (!IMAGE_ID_RE.test(id)) throw new CollimateError('image_not_found', `No image ${id.slice(0, 80)}; image ids are sha256:<64 hex>.`);
}

export function imageHandlers(tenants: TenantService, streams: SseStreams): Pick<Handlers, ImageOps> {
  return {
    listImages({ scope }) {
      return { status: 200, body: { images: tenants.templates.catalog(scope).map(templateView), own: tenants.templates.ownImages(scope).map(imageView) } };
    },

    async createImage({ scope, body }) {
      return { status: 202, body: imageView(await tenants.templates.pullImage(scope, body.source)) };
    },

    getImage({ scope, params }) {
      checkImageId(params.id);
      return { status: 200, body: imageView(tenants.templates.image(scope, params.id)) };
    },

    deleteImage({ scope, params }) {
      checkImageId(params.id);
      tenants.templates.deleteImage(scope, params.id);
      return { status: 204 };
    },

    async createEnvironment({ scope, body }) {
      const env = await tenants.templates.createEnvironment(scope, {
        name: body.name, image: body.image, description: body.description, interpreter: body.interpreter,
        readyCommand: body.ready_command, readyProbe: body.ready_probe, readyTimeoutSecs: body.ready_timeout_secs,
        secrets: body.secrets, vcpus: body.vcpus, memoryMib: body.memory_mib, egress: body.egress,
      });
      return { status: 202, body: environmentView(env) };
    },

    async listEnvironments({ scope }) {
      return { status: 200, body: { environments: (await tenants.templates.environments(scope)).map(environmentView) } };
    },

    async getEnvironment({ scope, params }) {
      return { status: 200, body: environmentView(await tenants.templates.environment(scope, params.name)) };
    },

    async getEnvironmentLog({ scope, params, req, reply }) {
      const env = await tenants.templates.environment(scope, params.name, { fromItsHost: true });
      if (!wantsSse(req.headers.accept)) {
        reply.code(200).type('text/plain; charset=utf-8').send(env.log);
        return null;
      }
      streams.streamBakeLog(reply, async () => {
        try {
          return await tenants.templates.environment(scope, params.name, { fromItsHost: true });
        } catch (err) {
          if (err instanceof CollimateError && err.code === 'environment_not_found') return null; // deleted while followed
          throw err;
        }
      });
      return null;
    },

    async deleteEnvironment({ scope, params }) {
      await tenants.templates.deleteEnvironment(scope, params.name);
      return { status: 204 };
    },

    async listTemplates({ scope }) {
      return { status: 200, body: { templates: (await tenants.templates.templates(scope)).map(templateView) } };
    },

    async getTemplate({ scope, params }) {
      if (!S.TEMPLATE_ID_RE.test(params.id)) {
        throw new CollimateError('template_not_found', `No template ${params.id.slice(0, 130)}. List them with GET /v1/templates.`);
      }
      return { status: 200, body: templateView(await tenants.templates.template(scope, params.id)) };
    },
  };
}
