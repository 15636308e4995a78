/**
 * The one schema set of the REST API. These zod schemas validate requests, generate the OpenAPI 3.1
 * document (src/api/openapi.ts) and type the handlers; tests parse every response with them.
 *
 * Request objects are strict (unknown fields are a 400 validation_error, like Firecracker's
 * deny_unknown_fields). Response objects are strict too, so a field the server starts sending without
 * updating this file fails the response-validation tests instead of silently drifting from the doc.
 */
import { z } from 'zod';

/** Metadata registry for the OpenAPI document: schemas with an `id` become components. */
export const apiRegistry = z.registry<{ id?: string; description?: string; examples?: unknown[] }>();

function named<T extends z.ZodType>(id: string, schema: T, description?: string): T {
  if (apiRegistry.has(schema)) throw new Error(`schema ${id} registered twice`);
  apiRegistry.add(schema, description === undefined ? { id } : { id, description });
  return schema;
}

function described<T extends z.ZodType>(schema: T, description: string): T {
  // Describing a shared schema would overwrite its metadata: wrap it (e.g. `.optional()`) first.
  if (apiRegistry.has(schema)) throw new Error(`schema already registered: ${description}`);
  apiRegistry.add(schema, { description });
  return schema;
}

export const SANDBOX_ID_RE = /^sbx_[0-9a-f]{12}$/;
export const TEMPLATE_ID_RE = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
export const LABEL_KEY_RE = /^[A-Za-z0-9][A-Za-z0-9._\/-]{0,62}$/;
export const MAX_LABELS = 32;

// ---------------------------------------------------------------------------------------------
// Shared pieces

export const SandboxId = described(z.string().regex(SANDBOX_ID_RE), 'Sandbox id, e.g. sbx_9f2a1c7b3e40.');
export const SandboxState = named('SandboxState', z.enum(['running', 'suspended', 'deleted']));

export const Labels = named(
  'Labels',
  z
    .record(z.string().regex(LABEL_KEY_RE), z.string().max(256))
    .refine((v) => Object.keys(v).length <= MAX_LABELS, { message: `at most ${MAX_LABELS} labels` }),
  `Free-form key/value labels (at most ${MAX_LABELS}; keys ${LABEL_KEY_RE.source}, values up to 256 chars). Filter on them with ?label=k=v.`,
);

const IsoTime = z.string();

// ---------------------------------------------------------------------------------------------
// Errors

export const ErrorBody = named(
  'Error',
  z.strictObject({
    error: z
      .object({
        code: described(z.string(), 'Stable machine-readable code, e.g. sandbox_not_found; see src/errors.ts.'),
        message: described(z.string(), 'Human-readable; says how to fix the problem.'),
        issues: z.array(z.strictObject({ path: z.string(), message: z.string() })).optional(),
        state: z.string().optional(),
        limit: z.number().optional(),
        running: z.number().optional(),
      })
      // Extra detail fields may be added over time; clients must ignore unknown ones.
      .loose(),
  }),
  'Every error response. 4xx are client mistakes; 5xx never echo internal causes.',
);

// ---------------------------------------------------------------------------------------------
// Sandboxes

export const Sandbox = named(
  'Sandbox',
  z.strictObject({
    id: SandboxId,
    template: z.string(),
    state: SandboxState,
    labels: z.record(z.string(), z.string()),
    created_at: described(IsoTime, 'ISO 8601.'),
    age_secs: z.number(),
    idle_secs: described(z.number(), 'Seconds since the last exec finished (or since create).'),
    exec_count: z.number().int(),
    parent: described(z.string().nullable(), 'The sandbox this one was live-forked from; null for a template create.'),
    forked_at: z.string().nullable(),
    children: z.array(z.string()),
    timeout_secs: described(z.number(), 'Maximum session duration; the sandbox is reaped once age_secs passes it.'),
    expires_at: IsoTime,
    vcpus: z.number(),
    memory_mib: z.number(),
    disk_mib: z.number(),
  }),
  'One microVM.',
);

export const CreateSandboxRequest = named(
  'CreateSandboxRequest',
  z.strictObject({
    template: described(z.string().min(1).max(128), 'Template (or catalog image) id; see GET /v1/templates.'),
    labels: Labels.optional(),
    timeout_secs: described(
      z.number().int().min(1).max(2 ** 31 - 1),
      'Maximum session duration in seconds. Default and maximum depend on the tier (demo 900, pro 86400, enterprise 604800; beyond it: 403 tier_forbidden).',
    ).optional(),
  }),
);

export const SandboxList = named(
  'SandboxList',
  z.strictObject({
    sandboxes: z.array(Sandbox),
    next: described(z.string().nullable(), 'Cursor for the next page (pass as ?after=), or null on the last page.'),
  }),
);

export const ListSandboxesQuery = z.strictObject({
  state: SandboxState.optional(),
  label: described(
    z.union([z.string(), z.array(z.string())]),
    'k=v; repeat to require several labels (all must match).',
  ).optional(),
  limit: described(z.coerce.number().int().min(1).max(1000), 'Page size, 1..1000 (default 100).').optional(),
  after: described(z.string().max(256), 'Cursor: the `next` of the previous page.').optional(),
});

export const ForkRequest = named(
  'ForkRequest',
  z.strictObject({
    count: described(z.number().int().min(1).max(64), 'Number of children, 1..64 (default 1).').optional(),
    labels: described(Labels.optional(), "Labels for the children (default: the parent's labels)."),
  }),
);

export const ForkResponse = named('ForkResponse', z.strictObject({ sandboxes: z.array(Sandbox) }));

// ---------------------------------------------------------------------------------------------
// Exec

export const ExecFile = named(
  'ExecFile',
  z.strictObject({
    path: z.string().min(1).max(4096),
    content: z.string(),
    encoding: z.enum(['utf8', 'base64']).optional(),
    mode: described(z.number().int().min(0).max(0o7777), 'Permission bits as a number (0o755 = 493); default 0o644.').optional(),
  }),
  'A file written into the guest before the command runs.',
);

export const ExecRequest = named(
  'ExecRequest',
  z
    .strictObject({
      command: described(z.string().min(1), 'A shell string, run by /bin/sh -c.').optional(),
      code: described(z.string(), "Source run by the template's interpreter (python3 for python, node for node, sh for base).").optional(),
      commands: described(
        z.array(z.array(z.string()).min(1)).min(1).max(256),
        'argv lists run in order; the first failure stops the rest.',
      ).optional(),
      files: z.array(ExecFile).max(1024).optional(),
      env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()).optional(),
      cwd: z.string().min(1).max(4096).optional(),
      stdin: z.string().optional(),
      timeout: described(z.number().positive().max(3600), 'Seconds; default 60, max 3600.').optional(),
    })
    .refine((r) => [r.command, r.code, r.commands].filter((x) => x !== undefined).length === 1, {
      message: 'exactly one of command, code, commands is required',
    }),
  'Exactly one of command, code, commands. With `Accept: text/event-stream` the response is an SSE stream: ' +
    '`stdout` / `stderr` events carry `{"data": "<base64 of the raw bytes>"}`, then one `result` event carries ' +
    'the ExecResult, or one `error` event carries an Error body.',
);

export const ExecTiming = z.strictObject({
  queued_at: z.string(),
  started_at: z.string(),
  finished_at: z.string(),
  queued_ms: z.number(),
  run_ms: z.number(),
});

export const ExecResult = named(
  'ExecResult',
  z.strictObject({
    stdout: z.string(),
    stderr: z.string(),
    stdout_encoding: described(z.enum(['utf8', 'base64']), '`utf8` when the bytes were valid UTF-8, else `base64`.'),
    stderr_encoding: z.enum(['utf8', 'base64']),
    exit_code: z.number().int(),
    timed_out: z.boolean(),
    stdout_truncated: z.boolean(),
    stderr_truncated: z.boolean(),
    failed_index: described(z.number().int(), 'With `commands`: index of the last command that ran.').optional(),
    signal: z.number().int().optional(),
    error: z.string().optional(),
    timing: ExecTiming,
  }),
);

/** Payload of the SSE `stdout` / `stderr` events. */
export const ExecChunkEvent = named(
  'ExecChunkEvent',
  z.strictObject({ data: described(z.string(), 'Base64 of the raw bytes (chunks may split UTF-8 sequences).') }),
);

// ---------------------------------------------------------------------------------------------
// Files

export const FileQuery = z.strictObject({
  path: described(z.string().startsWith('/').max(4096), 'Absolute path inside the guest.'),
});

export const PutFileQuery = z.strictObject({
  path: described(z.string().startsWith('/').max(4096), 'Absolute path inside the guest.'),
  mode: described(z.string().regex(/^0?[0-7]{3,4}$/), 'Octal permission bits, e.g. 755 (default 644).').optional(),
});

export const PutFileResponse = named('PutFileResponse', z.strictObject({ path: z.string(), size: z.number().int() }));

// ---------------------------------------------------------------------------------------------
// Templates

export const Template = named(
  'Template',
  z.strictObject({
    id: z.string(),
    kind: described(z.enum(['catalog', 'environment']), '`catalog`: kept warm by the platform; `environment`: your own (Pro).'),
    description: z.string(),
    interpreter: z.array(z.string()),
    ready: z.boolean(),
    vcpus: z.number(),
    memory_mib: z.number(),
  }),
);

export const TemplateList = named('TemplateList', z.strictObject({ templates: z.array(Template) }));
export const ImageList = named('ImageList', z.strictObject({ images: z.array(Template) }));

// ---------------------------------------------------------------------------------------------
// Usage

export const UsageTotals = named(
  'UsageTotals',
  z.strictObject({
    running_secs: z.number(),
    vcpu_secs: z.number(),
    memory_mib_secs: z.number(),
    disk_mib_secs: z.number(),
    suspended_secs: z.number(),
    snapshot_mib_secs: described(z.number(), 'Suspended seconds × snapshot size in MiB.'),
  }),
);

export const SandboxUsage = named(
  'SandboxUsage',
  z.strictObject({
    id: z.string(),
    template: z.string(),
    running_secs: z.number(),
    vcpu_secs: z.number(),
    memory_mib_secs: z.number(),
    disk_mib_secs: z.number(),
    suspended_secs: z.number(),
    snapshot_mib_secs: z.number(),
  }),
);

export const UsageQuery = z.strictObject({
  from: described(z.string().max(64), 'ISO 8601 or epoch seconds; default: start of the current UTC month.').optional(),
  to: described(z.string().max(64), 'ISO 8601 or epoch seconds; default: now.').optional(),
});

export const UsageResponse = named(
  'Usage',
  z.strictObject({
    from: z.string(),
    to: z.string(),
    totals: UsageTotals,
    sandboxes: z.array(SandboxUsage),
  }),
  'Metered time in [from, to): running seconds × vCPUs / RAM MiB / disk MiB, and suspended seconds × snapshot MiB.',
);

// ---------------------------------------------------------------------------------------------
// Operations

export const Health = named(
  'Health',
  z.strictObject({
    status: z.enum(['ok', 'starting', 'shutting_down']),
    accel: z.string(),
    templates_ready: z.boolean(),
  }),
);

export const EmptyQuery = z.strictObject({});
