/**
 * The MCP tools: each one is a thin translation onto one SandboxService call, with the same policy as
 * the REST handlers in src/api/server.ts — the caller's tenant scope, the tier's template, session
 * and concurrency rules (the server's shared Admission, so REST and MCP draw on one cap), and the same
 * error codes. Results are JSON text plus structuredContent (validated against the REST response
 * schemas); failures are `isError` results whose text starts with the API error code.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { CollimateError, invalidState, sandboxNotFound } from '../errors.js';
import type { Admission } from '../api/admission.js';
import type { Principal } from '../api/keys.js';
import type { PortUrlSigner } from '../api/portUrls.js';
import * as S from '../api/schemas.js';
import { execResultView, sandboxView, templateView, toClientError, withLivePorts } from '../api/server.js';
import type { SandboxInfo, SandboxService, Scope } from '../sandboxes/types.js';

export interface ToolContext {
  service: SandboxService;
  admission: Admission;
  principal: Principal;
  signer: PortUrlSigner;
  /** Scheme, host and port the MCP request reached the server at: absolute URLs start with it. */
  baseUrl: string;
  log?: { error: (o: object, msg: string) => void; warn: (o: object, msg: string) => void };
}

// ---------------------------------------------------------------------------------------------
// Input schemas. Field types and limits come from the REST schemas; descriptions are for agents.

const sandboxId = z.string().max(100).describe('Sandbox id, e.g. sbx_9f2a1c7b3e40 (from create_sandbox, fork_sandbox or list_sandboxes).');
const labels = S.Labels.optional().describe('Key/value labels, e.g. {"task": "t1"}; filter on them with list_sandboxes.');
const E = S.ExecRequest.shape;

export const INPUTS = {
  list_images: z.strictObject({}),
  create_sandbox: z.strictObject({
    template: S.CreateSandboxRequest.shape.template.describe('Catalog image or template id, e.g. "base" (see list_images).'),
    labels,
    timeout_secs: S.CreateSandboxRequest.shape.timeout_secs.describe(
      'Maximum session length in seconds before the sandbox is reaped; default and maximum depend on your tier (demo: 900).',
    ),
    egress: S.CreateSandboxRequest.shape.egress.describe(
      'What the sandbox may reach on the network: "none", "allow" (every public address) or {"domains": ["pypi.org", "*.pythonhosted.org"], "cidrs": [...], "ports": [443]}. ' +
        "Only narrower than the template's policy (default: the template's); wider is egress_forbidden.",
    ),
  }),
  exec: z.strictObject({
    sandbox_id: sandboxId,
    command: E.command.describe('A shell string run by /bin/sh -c, e.g. "ls -la /root && echo done".'),
    code: E.code.describe("Source code run by the template's interpreter (sh for base, python3 for python, node for node)."),
    commands: E.commands.describe('argv lists run in order, e.g. [["mkdir","-p","/w"],["ls","/w"]]; the first failure stops the rest.'),
    files: E.files.describe('Files written before the command runs: [{path, content, encoding?: "utf8"|"base64", mode?}].'),
    env: E.env.describe('Extra environment variables.'),
    cwd: E.cwd.describe('Working directory (absolute path).'),
    stdin: E.stdin.describe('Text fed to the command on standard input.'),
    timeout: E.timeout.describe('Seconds before the command is killed (default 60, max 3600); the result then has timed_out: true, exit_code 124.'),
    seed: E.seed.describe('CRNG seed (decimal u64 string). Pass the `seed` a result reported to replay that exec in the same state; absent: a fresh one.'),
  }),
  fork_sandbox: z.strictObject({
    sandbox_id: sandboxId,
    count: S.ForkRequest.shape.count.describe('Number of children, 1..64 (default 1). Each counts against your concurrency cap.'),
    labels: S.ForkRequest.shape.labels.describe("Labels for the children, merged over the parent's."),
  }),
  suspend_sandbox: z.strictObject({ sandbox_id: sandboxId }),
  resume_sandbox: z.strictObject({ sandbox_id: sandboxId }),
  delete_sandbox: z.strictObject({ sandbox_id: sandboxId }),
  get_sandbox: z.strictObject({ sandbox_id: sandboxId }),
  list_sandboxes: z.strictObject({
    state: S.SandboxState.optional().describe('Only sandboxes in this state.'),
    labels: z.record(z.string(), z.string()).optional().describe('Only sandboxes carrying every one of these labels.'),
    limit: z.number().int().min(1).max(1000).optional().describe('Page size, 1..1000 (default 100).'),
    after: z.string().max(256).optional().describe('The `next` cursor of the previous page.'),
  }),
  expose_port: z.strictObject({
    sandbox_id: sandboxId,
    port: S.CreatePortUrlRequest.shape.port.describe('The port a server listens on inside the sandbox, e.g. 8000 for `python3 -m http.server 8000`.'),
    expires_in_secs: S.CreatePortUrlRequest.shape.expires_in_secs.describe(`How long the link works, in seconds (default ${S.DEFAULT_PORT_URL_SECS}, at most ${S.MAX_PORT_URL_SECS}).`),
  }),
  read_file: z.strictObject({
    sandbox_id: sandboxId,
    path: S.FileQuery.shape.path.describe('Absolute path inside the sandbox, e.g. /root/out.txt.'),
  }),
  write_file: z.strictObject({
    sandbox_id: sandboxId,
    path: S.PutFileQuery.shape.path.describe('Absolute path inside the sandbox; parent directories are created.'),
    content: z.string().describe('The file content (text, or base64 with encoding "base64").'),
    encoding: z.enum(['utf8', 'base64']).optional().describe('How `content` is encoded (default utf8).'),
    mode: S.PutFileQuery.shape.mode.describe('Octal permission bits, e.g. "755" (default 644).'),
  }),
} as const;

const FileContent = z.strictObject({
  path: z.string(),
  size: z.number().int(),
  encoding: z.enum(['utf8', 'base64']),
  content: z.string(),
});
const Deleted = z.strictObject({ id: z.string(), deleted: z.literal(true) });
const ExposedPort = z.strictObject({
  url: z.string(),
  port: z.number().int(),
  expires_at: z.string(),
  listening: z.boolean(),
});

// ---------------------------------------------------------------------------------------------

const DESCRIPTIONS: Record<keyof typeof INPUTS, string> = {
  list_images:
    'List the catalog images you can create sandboxes from (ready to run on every tier, no build step). Returns {images: [{id, description, interpreter, ready, vcpus, memory_mib}]}. Pass an id to create_sandbox.',
  create_sandbox:
    'Create a new sandbox — an isolated Linux microVM — from a catalog image (e.g. "base") and return it running: {id, state: "running", template, labels, expires_at, ...}. Counts against your tier\'s cap on running sandboxes (concurrency_limit when full: suspend or delete one). Delete it with delete_sandbox when done.',
  exec:
    'Run a command in a running sandbox and wait for it: exactly one of `command` (shell string), `code` (interpreter source) or `commands` (argv lists). Returns {stdout, stderr, exit_code, timed_out, ...}. Files and background processes persist between calls; calls to one sandbox run one at a time. Needs state "running" (invalid_state if suspended: resume_sandbox first).',
  fork_sandbox:
    'Live-fork a running sandbox into `count` children that keep its memory, running processes and files as of now; the parent keeps running unchanged. Use it to try several actions from one prepared state. Returns {sandboxes: [...children]}, all running; each child counts against your cap. Needs state "running" (invalid_state otherwise).',
  suspend_sandbox:
    'Suspend a running sandbox to disk, memory and processes included; it stops counting against your concurrency cap. Returns the sandbox with state "suspended". Needs state "running".',
  resume_sandbox:
    'Resume a suspended sandbox exactly where it was (processes keep running). Takes a slot of your concurrency cap. Returns the sandbox with state "running". Needs state "suspended".',
  delete_sandbox: 'Delete a sandbox (running or suspended) and everything in it. Irreversible. Returns {id, deleted: true}.',
  get_sandbox:
    'Get one sandbox: {id, state, template, labels, parent, children, exec_count, age_secs, idle_secs, expires_at, egress, ports: [{port, protocol, url}], ...}; `ports` are the TCP ports servers listen on right now.',
  list_sandboxes:
    'List your sandboxes (not deleted ones), optionally only those in `state` or carrying all `labels`. Returns {sandboxes: [...], next}; pass `next` as `after` for the next page (null on the last).',
  expose_port:
    'Get a shareable link to a server running in a sandbox (start it first with exec, in the background, e.g. "python3 -m http.server 8000 >/dev/null 2>&1 &"). ' +
    'Returns {url, port, expires_at, listening}: anyone with the url reaches that port over HTTP or WebSocket, without a key, until it expires or the sandbox is deleted. ' +
    '`listening` says whether something listens on the port now.',
  read_file:
    'Read a file from a running sandbox. Returns {path, size, encoding, content}: content is the text when the file is valid UTF-8 (encoding "utf8"), else base64 (encoding "base64"). file_not_found when missing.',
  write_file:
    'Write a file into a running sandbox (creating parent directories), replacing any existing file. Returns {path, size}. Use encoding "base64" for binary content.',
};

function ok(value: Record<string, unknown>): CallToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(value) }], structuredContent: value };
}

/** An error result: the text starts with the stable API code, like REST's error.code. */
export function errorResult(err: CollimateError): CallToolResult {
  const extra = err.retryAfterSecs !== undefined ? ` (retry after ${err.retryAfterSecs} s)` : '';
  return { content: [{ type: 'text', text: `${err.code}: ${err.message}${extra}` }], isError: true };
}

function validationError(where: string, issues: z.core.$ZodIssue[]): CollimateError {
  const summary = issues
    .slice(0, 20)
    .map((i) => `${[where, ...i.path.map(String)].join('.')}: ${i.message}`)
    .join('; ');
  return new CollimateError('validation_error', `Invalid arguments — ${summary}.`);
}

/** Reads the sandbox through the tenant's scope (ids of other tenants and malformed ids: not found). */
function getOwn(service: SandboxService, id: string, scope: Scope): SandboxInfo {
  if (!S.SANDBOX_ID_RE.test(id)) throw sandboxNotFound(id.slice(0, 100));
  const info = service.get(id, scope);
  if (info.tenant !== scope.tenant) throw sandboxNotFound(id);
  return info;
}

/** Registers every tool on `server`, bound to one authenticated principal. */
export function registerTools(server: McpServer, ctx: ToolContext): void {
  const { service, admission, principal } = ctx;
  const scope: Scope = { tenant: principal.tenant };
  const tier = principal.tier;

  const tool = <K extends keyof typeof INPUTS>(
    name: K,
    outputSchema: z.ZodObject | undefined,
    annotations: { readOnlyHint?: boolean; destructiveHint?: boolean; idempotentHint?: boolean },
    run: (args: z.infer<(typeof INPUTS)[K]>, extra: { sendProgress?: (progress: number, message: string) => void }) => Promise<Record<string, unknown>> | Record<string, unknown>,
  ) => {
    server.registerTool(
      name,
      { description: DESCRIPTIONS[name], inputSchema: INPUTS[name], outputSchema, annotations: { openWorldHint: false, ...annotations } },
      (async (args: z.infer<(typeof INPUTS)[K]>, extra: any) => {
        try {
          const token = extra?._meta?.progressToken;
          const sendProgress =
            token === undefined
              ? undefined
              : (progress: number, message: string) =>
                  void extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress, message } }).catch(() => {});
          return ok(await run(args, { sendProgress }));
        } catch (err) {
          return errorResult(toClientError(err, ctx.log));
        }
      }) as any,
    );
  };

  tool('list_images', S.ImageList, { readOnlyHint: true }, () => ({
    images: service.templates(scope).filter((t) => t.kind === 'catalog').map(templateView),
  }));

  tool('create_sandbox', S.Sandbox, { readOnlyHint: false, destructiveHint: false }, async (a) => {
    // The same rules, in the same order, as POST /v1/sandboxes (src/api/server.ts createSandbox;
    // test/unit/mcp/mcp.test.ts checks both doors answer alike). A catalog-only tier gets 403 for
    // anything outside the catalog, whether or not such a template exists.
    const inCatalog = service.templates(scope).some((t) => t.id === a.template && t.kind === 'catalog');
    const tpl = !tier.ownImages && !inCatalog ? null : service.template(a.template, scope);
    if (!tpl || (tpl.kind !== 'catalog' && !tier.ownImages)) {
      throw new CollimateError(
        'template_forbidden',
        `Template ${a.template} is not in the catalog; the ${tier.name} tier can only create from catalog images (list_images). Upgrade to Pro to use your own images.`,
      );
    }
    if (a.timeout_secs !== undefined && a.timeout_secs > tier.maxSessionSecs) {
      throw new CollimateError('tier_forbidden', `timeout_secs ${a.timeout_secs} exceeds the ${tier.name} tier's maximum session of ${tier.maxSessionSecs} s.`);
    }
    const slot = await admission.reserve(principal.tenant, tier, 1, 'create');
    try {
      const info = await service.create(
        {
          template: a.template,
          labels: a.labels ?? {},
          timeoutSecs: a.timeout_secs ?? tier.defaultSessionSecs,
          ...(a.egress === undefined ? {} : { egress: a.egress }),
        },
        scope,
      );
      return sandboxView(info);
    } finally {
      slot.release();
    }
  });

  tool('exec', S.ExecResult, { readOnlyHint: false, destructiveHint: true }, async (a, extra) => {
    const { sandbox_id, ...req } = a;
    const parsed = S.ExecRequest.safeParse(req);
    if (!parsed.success) throw validationError('arguments', parsed.error.issues);
    getOwn(service, sandbox_id, scope);
    let bytes = 0;
    const progress = extra.sendProgress
      ? (c: Buffer) => {
          bytes += c.length;
          extra.sendProgress!(bytes, c.toString('utf8'));
        }
      : undefined;
    const r = await service.exec(sandbox_id, parsed.data, scope, progress ? { onStdout: progress, onStderr: progress } : undefined);
    return execResultView(r);
  });

  tool('fork_sandbox', S.ForkResponse, { readOnlyHint: false, destructiveHint: false }, async (a) => {
    const count = a.count ?? 1;
    const parent = getOwn(service, a.sandbox_id, scope);
    if (parent.state !== 'running') throw invalidState(a.sandbox_id, parent.state, 'fork', ['running']);
    const slot = await admission.reserve(principal.tenant, tier, count, `fork of ${count}`);
    try {
      const children = await service.fork(a.sandbox_id, { count, labels: a.labels }, scope);
      return { sandboxes: children.map(sandboxView) };
    } finally {
      slot.release();
    }
  });

  tool('suspend_sandbox', S.Sandbox, { readOnlyHint: false, destructiveHint: false, idempotentHint: false }, async (a) => {
    getOwn(service, a.sandbox_id, scope);
    return sandboxView(await service.suspend(a.sandbox_id, scope));
  });

  tool('resume_sandbox', S.Sandbox, { readOnlyHint: false, destructiveHint: false }, async (a) => {
    const cur = getOwn(service, a.sandbox_id, scope);
    if (cur.state !== 'suspended') throw invalidState(a.sandbox_id, cur.state, 'resume', ['suspended']);
    const slot = await admission.reserve(principal.tenant, tier, 1, 'resume');
    try {
      return sandboxView(await service.resume(a.sandbox_id, scope));
    } finally {
      slot.release();
    }
  });

  tool('delete_sandbox', Deleted, { readOnlyHint: false, destructiveHint: true, idempotentHint: true }, async (a) => {
    getOwn(service, a.sandbox_id, scope);
    await service.delete(a.sandbox_id, scope);
    return { id: a.sandbox_id, deleted: true };
  });

  tool('get_sandbox', S.Sandbox, { readOnlyHint: true }, async (a) => sandboxView(await withLivePorts(service, getOwn(service, a.sandbox_id, scope), scope, ctx.log)));

  tool('expose_port', ExposedPort, { readOnlyHint: false, destructiveHint: false }, async (a) => {
    const info = await withLivePorts(service, getOwn(service, a.sandbox_id, scope), scope, ctx.log);
    const expiresAt = Math.floor(Date.now() / 1000) + (a.expires_in_secs ?? S.DEFAULT_PORT_URL_SECS);
    const token = ctx.signer.sign({ sandboxId: a.sandbox_id, port: a.port, expiresAt });
    return { url: `${ctx.baseUrl}/v1/p/${token}/`, port: a.port, expires_at: new Date(expiresAt * 1000).toISOString(), listening: info.ports.some((p) => p.port === a.port) };
  });

  tool('list_sandboxes', S.SandboxList, { readOnlyHint: true }, (a) => {
    for (const k of Object.keys(a.labels ?? {})) {
      if (!S.LABEL_KEY_RE.test(k)) throw new CollimateError('validation_error', `label key ${JSON.stringify(k.slice(0, 100))} must match ${S.LABEL_KEY_RE.source}.`);
    }
    const r = service.list({ state: a.state, labels: a.labels, after: a.after, limit: a.limit ?? 100 }, scope);
    return { sandboxes: r.sandboxes.filter((s) => s.tenant === scope.tenant).map(sandboxView), next: r.next };
  });

  tool('read_file', FileContent, { readOnlyHint: true }, async (a) => {
    getOwn(service, a.sandbox_id, scope);
    const data = await service.readFile(a.sandbox_id, a.path, scope);
    const text = data.toString('utf8');
    const utf8 = Buffer.from(text, 'utf8').equals(data);
    return { path: a.path, size: data.length, encoding: utf8 ? 'utf8' : 'base64', content: utf8 ? text : data.toString('base64') };
  });

  tool('write_file', S.PutFileResponse, { readOnlyHint: false, destructiveHint: true, idempotentHint: true }, async (a) => {
    getOwn(service, a.sandbox_id, scope);
    const data = Buffer.from(a.content, a.encoding === 'base64' ? 'base64' : 'utf8');
    await service.writeFile(a.sandbox_id, a.path, data, scope, a.mode === undefined ? undefined : parseInt(a.mode, 8));
    return { path: a.path, size: data.length };
  });
}
