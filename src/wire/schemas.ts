/**
 * The one schema set of the REST API. These zod schemas validate requests, generate the OpenAPI 3.1
 * document (src/api/openapi.ts) and type the handlers; tests parse every response with them.
 *
 * Request objects are strict (unknown fields are a 400 validation_error, like Firecracker's
 * deny_unknown_fields). Response objects are strict too, so a field the server starts sending without
 * updating this file fails the response-validation tests instead of silently drifting from the doc.
 */
import { z } from 'zod';
import { MAX_SEED, SEED_FORMAT_MESSAGE, SEED_RE, USER_NAME_RE } from '../sandboxes/exec.js';
import { MAX_FORK_COUNT } from '../sandboxes/types.js';
import { PORT_HOST_MAX } from '../sandboxes/portHost.js';
import { EGRESS_LIMITS, parseEgress } from '../net/policy.js';

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
export const SNAPSHOT_ID_RE = /^snap_[0-9a-f]{16}$/;
/** A fresh schema per use, so each can carry its own description. */
const snapshotIdRef = () => z.string().max(64);
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
// Networking

/** parseEgress's complaint about `input` (without its field prefix), or null when it is a valid policy. */
function egressProblem(input: unknown): string | null {
  try {
    parseEgress(input, '');
    return null;
  } catch (e) {
    return (e as Error).message.replace(/^: /, '').replace(/^\./, '');
  }
}

const EGRESS_FORMS = 'must be "none", "allow", an allowlist { "domains": [...], "cidrs": [...], "ports": [...] } or a denylist { "deny": [...] }';

export const EgressPolicy = named(
  'EgressPolicy',
  z
    .xor(
      [
        described(z.literal('none'), 'No route out; DNS fails.'),
        described(z.literal('allow'), 'Every public address.'),
        described(
          z.strictObject({
            domains: described(
              z.array(z.string()).max(EGRESS_LIMITS.domains),
              'Exact names ("api.example.com") or "*.suffix" (any name below suffix, not suffix itself).',
            ).optional(),
            cidrs: described(z.array(z.string()).max(EGRESS_LIMITS.cidrs), 'IPv4 "a.b.c.d/n" or bare addresses.').optional(),
            ports: described(
              z.array(z.number().int().min(1).max(65535)).max(EGRESS_LIMITS.ports),
              'TCP/UDP destination ports for every listed destination (empty or absent: any port). With no domains and no cidrs they apply to every public address.',
            ).optional(),
          }),
          'An allowlist; at least one of the lists must be non-empty.',
        ),
        described(
          z.strictObject({
            deny: described(z.array(z.string()).min(1).max(EGRESS_LIMITS.deny), 'IPv4 "a.b.c.d/n" or bare addresses the sandbox may not reach.'),
          }),
          'A denylist: every public address except these.',
        ),
      ],
      { error: (iss) => egressProblem(iss.input) ?? EGRESS_FORMS },
    )
    .superRefine((v, ctx) => {
      const problem = egressProblem(v);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    }),
  'What a sandbox may reach. Always blocked unless a listed CIDR names them: link-local and metadata addresses, private, ' +
    'loopback, multicast and reserved ranges; never reachable: the host, the API server and other sandboxes. ' +
    'Addresses a listed domain resolves to are subject to the blocked ranges too.',
);

export const OpenPort = named(
  'OpenPort',
  z.strictObject({
    port: z.number().int().min(1).max(65535),
    protocol: z.literal('tcp'),
    url: described(z.string(), 'Where the ports proxy serves it, relative to the API base: /v1/sandboxes/{id}/ports/{port}/ (needs your key; see POST …/port-urls for a link that does not).'),
  }),
  'A TCP port a server listens on inside the sandbox.',
);

export const MAX_PORT_URL_SECS = 7 * 24 * 3600;
export const DEFAULT_PORT_URL_SECS = 3600;

export const CreatePortUrlRequest = named(
  'CreatePortUrlRequest',
  z.strictObject({
    port: described(z.number().int().min(1).max(65535), 'The port inside the sandbox.'),
    expires_in_secs: described(
      z.number().int().min(1).max(MAX_PORT_URL_SECS),
      `Lifetime of the URL in seconds, 1..${MAX_PORT_URL_SECS} (7 days); default ${DEFAULT_PORT_URL_SECS}.`,
    ).optional(),
  }),
);

export const PortUrl = named(
  'PortUrl',
  z.strictObject({
    url: described(z.string(), 'Relative to the API base: /v1/p/<token>/. Anyone holding it reaches the port without a key until it expires or the sandbox is deleted.'),
    port: z.number().int(),
    expires_at: described(z.string(), 'ISO 8601.'),
  }),
  'A signed, expiring URL of a sandbox port.',
);

export const SandboxTokens = named(
  'SandboxTokens',
  z.strictObject({
    envd_access_token: described(z.string(), "E2B's envdAccessToken (header X-Access-Token): commands and files of this sandbox."),
    traffic_access_token: described(z.string(), "E2B's trafficAccessToken (header e2b-traffic-access-token): this sandbox's ports only."),
    generation: described(z.number().int(), 'Counts the rotations: 0 for the first tokens.'),
  }),
  "A sandbox's access tokens, issued under the calling key.",
);

// ---------------------------------------------------------------------------------------------
// Sandboxes

/** A fresh schema per use: each use carries its own description. */
const onTimeout = () => z.enum(['delete', 'suspend']);

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
    timeout_secs: described(z.number(), 'Session length in seconds: each start (create, fork, resume) sets expires_at this far ahead.'),
    session_started_at: described(z.string(), "When the current session started (create, fork or resume; for a suspended sandbox, its last one). ISO 8601. The tier's maximum session counts from here."),
    expires_at: described(
      z.string(),
      'When the session ends: the reaper then deletes the sandbox (or suspends it, as the server is configured). session_started_at + timeout_secs, or as POST /v1/sandboxes/{id}/timeout set it. ISO 8601.',
    ),
    remaining_secs: described(z.number().nullable(), 'Seconds until expires_at (0 once past it); null unless running.'),
    vcpus: z.number(),
    memory_mib: z.number(),
    disk_mib: z.number(),
    egress: EgressPolicy,
    ports: described(
      z.array(OpenPort),
      'TCP ports a server listens on inside the sandbox, reachable through the ports proxy. GET of one sandbox reads them live; lists show the last reading.',
    ),
    on_timeout: described(onTimeout(), 'What happens when the session ends (expires_at): `delete`, or `suspend` (resume it later; with keep_memory, with its memory and processes).'),
    keep_memory: described(z.boolean(), 'Whether a suspend keeps its memory and processes (true) or only its files (false: the resume boots the guest afresh from its disk). Applies to the suspend at the session\'s end and to a suspend that does not say.'),
    memory_kept: described(z.boolean().nullable(), 'While suspended: true if its memory and processes were kept (a resume continues them), false if only its files were (a resume boots it afresh). Null unless suspended.'),
    auto_resume: described(z.boolean(), 'While suspended, a request that needs it running (an exec, a file, a process, a port) resumes it first.'),
    public_ports: described(z.boolean(), 'Its ports answer anyone, without a key, traffic token or signed URL (E2B\'s allowPublicTraffic).'),
    port_host: described(z.string().nullable(), 'The Host header its servers see through the ports proxy, `${PORT}` replaced by the port; null: `localhost:<port>`.'),
    from_snapshot: described(snapshotIdRef().nullable(), 'The snapshot it was started from, or last rolled back to; null otherwise.'),
  }),
  'One microVM.',
);

export const CreateSandboxResponse = named(
  'CreateSandboxResponse',
  Sandbox.extend({
    sandboxes: described(
      z.array(Sandbox),
      'With `count` in the request (a start from a snapshot): every sandbox started, this one first. Absent otherwise.',
    ).optional(),
  }),
  'The sandbox created (with `count`: the first of them, and all of them in `sandboxes`).',
);

export const CreateSandboxRequest = named(
  'CreateSandboxRequest',
  z.strictObject({
    template: described(z.string().min(1).max(128), 'Template (or catalog image) id; see GET /v1/templates. Required unless `snapshot` is given.').optional(),
    snapshot: described(
      snapshotIdRef(),
      'Start from this snapshot instead of a template: its memory, processes and files, with a fresh identity (as a fork child). ' +
        'Its template, shape and egress policy are the snapshot\'s (egress may be narrowed). Default session: the tier\'s, else that of the sandbox it was taken of.',
    ).optional(),
    count: described(
      z.number().int().min(1).max(MAX_FORK_COUNT),
      `With \`snapshot\`: start this many sandboxes from it, 1..${MAX_FORK_COUNT}; the answer lists them all in \`sandboxes\`. Each counts against the tier cap.`,
    ).optional(),
    labels: Labels.optional(),
    timeout_secs: described(
      z.number().int().min(1).max(2 ** 31 - 1),
      'Session length in seconds: the sandbox is reaped this long after each start (create, resume); POST /v1/sandboxes/{id}/timeout moves the end of a running session. Default and maximum depend on the tier (demo 900, pro 86400, enterprise 604800; beyond it: 403 tier_forbidden).',
    ).optional(),
    egress: described(
      EgressPolicy.optional(),
      "Narrows the template's egress policy for this sandbox; wider than the template's is 403 egress_forbidden. Default: the template's.",
    ),
    on_timeout: described(onTimeout(), "What happens when the session ends: `delete` it, or `suspend` it (it keeps counting against the suspended quotas). Default: the server's COLLIMATE_REAP_ACTION (delete). Forks keep their parent's.").optional(),
    keep_memory: described(
      z.boolean(),
      'Whether a suspend keeps the sandbox\'s memory and processes (true, the default) or only its files (false): the suspend at the session\'s end (on_timeout `suspend`) and one that does not say (POST /v1/sandboxes/{id}/suspend). A suspend that keeps only the files is quick and holds no RAM image on disk; its resume boots the guest afresh from its disk (a new boot_id), so its processes, open connections and what lay in /tmp, /run and /dev/shm (memory file systems) are gone. Forks keep their parent\'s; with `snapshot`, default the snapshot\'s.',
    ).optional(),
    auto_resume: described(z.boolean(), 'While suspended (by a timeout or a suspend), a request that needs it running — an exec, a file, a process, a port — resumes it first instead of answering 409 invalid_state. Default false.').optional(),
    public_ports: described(
      z.boolean(),
      "Its ports answer anyone through the ports proxy (`/v1/sandboxes/{id}/ports/{port}/…` and `<port>-<id>.<domain>`) without a key, traffic token or signed URL: for webhooks and public demos. Nothing else of the sandbox opens. Default false. Forks and sandboxes started from its snapshots keep it (with `snapshot`, default the snapshot's).",
    ).optional(),
    port_host: described(
      z.string().min(1).max(PORT_HOST_MAX),
      'The Host header its servers see on requests through the ports proxy: hostname[:port], `${PORT}` replaced by the port asked for (e.g. `localhost:${PORT}`, `app.example.com`); not a host shape is 400 validation_error. Default `localhost:<port>`. Forks keep it.',
    ).optional(),
  }),
);

export const SuspendRequest = named(
  'SuspendRequest',
  z.strictObject({
    keep_memory: described(
      z.boolean(),
      'true: keep its memory and processes (a resume continues them); false: keep only its files (quick, no RAM image on disk; the resume boots it afresh from its disk, so processes and the memory file systems /tmp, /run and /dev/shm are gone). Default: the sandbox\'s keep_memory.',
    ).optional(),
  }),
);

export const SetEgressRequest = named(
  'SetEgressRequest',
  z.strictObject({
    egress: EgressPolicy,
  }),
);

export const SetTimeoutRequest = named(
  'SetTimeoutRequest',
  z.strictObject({
    timeout_secs: described(
      z.number().int().min(1).max(2 ** 31 - 1),
      "End the running session this many seconds from now, earlier or later than before (a lease). It may not end later than the tier's maximum session (demo 900, pro 86400, enterprise 604800 s) after the session started (session_started_at): beyond it is 403 tier_forbidden, whose max_timeout_secs is the longest still allowed.",
    ),
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
    count: described(z.number().int().min(1).max(MAX_FORK_COUNT), `Number of children, 1..${MAX_FORK_COUNT} (default 1).`).optional(),
    labels: described(Labels.optional(), "Labels for the children (default: the parent's labels)."),
  }),
);

export const ForkResponse = named('ForkResponse', z.strictObject({ sandboxes: z.array(Sandbox) }));

// ---------------------------------------------------------------------------------------------
// Snapshots

export const Snapshot = named(
  'Snapshot',
  z.strictObject({
    id: described(snapshotIdRef(), 'Snapshot id, e.g. snap_4c1d9a0e7b2f3a65.'),
    name: z.string().nullable(),
    labels: z.record(z.string(), z.string()),
    sandbox_id: described(z.string().regex(SANDBOX_ID_RE), 'The sandbox it was taken of: the one sandbox that may roll back to it.'),
    template: described(z.string(), 'The template or environment that sandbox descends from.'),
    created_at: IsoTime,
    size_bytes: described(z.number().int(), 'What it occupies on the host\'s disk: its RAM image (zero pages are holes), device state and disk layer.'),
    vcpus: z.number(),
    memory_mib: z.number(),
    disk_mib: z.number(),
    egress: EgressPolicy,
    environment: described(z.string().nullable(), 'The name it is promoted under (POST /v1/snapshots/{snapshot}/promote): a template id you create sandboxes from, each started from it; null if none.'),
  }),
  'A kept moment of a sandbox: its memory, processes and files. Start sandboxes from it (POST /v1/sandboxes with `snapshot`) or roll its sandbox back to it.',
);

export const PromoteSnapshotRequest = named(
  'PromoteSnapshotRequest',
  z.strictObject({
    environment: described(
      z.string().max(63).nullable(),
      'The template id to promote it under (lower-case letters, digits, ".", "_", "-"; free among the catalog, your environments and your other snapshots); null takes the name away.',
    ),
  }),
);

export const CreateSnapshotRequest = named(
  'CreateSnapshotRequest',
  z.strictObject({
    name: described(z.string().min(1).max(128), 'A name to show; not unique.').optional(),
    labels: Labels.optional(),
  }),
);

export const SnapshotList = named(
  'SnapshotList',
  z.strictObject({
    snapshots: z.array(Snapshot),
    next: described(z.string().nullable(), 'Cursor for the next page (pass as ?after=), or null on the last page.'),
  }),
);

export const ListSnapshotsQuery = z.strictObject({
  sandbox_id: described(z.string().max(64), 'Only snapshots of this sandbox.').optional(),
  label: described(z.union([z.string(), z.array(z.string())]), 'k=v; repeat to require several labels (all must match).').optional(),
  limit: described(z.coerce.number().int().min(1).max(1000), 'Page size, 1..1000 (default 100).').optional(),
  after: described(z.string().max(256), 'Cursor: the `next` of the previous page.').optional(),
});

export const RestoreRequest = named(
  'RestoreRequest',
  z.strictObject({
    snapshot: described(snapshotIdRef(), 'A snapshot of this sandbox (one of another sandbox is 409 snapshot_mismatch).'),
  }),
);

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

const ExecSeedDescription =
  'CRNG seed of the exec: an unsigned 64-bit integer as a decimal string, "0" to "18446744073709551615". ' +
  'Re-running an exec with the seed it reported, in a sandbox in the same state (e.g. a fresh fork of the same parent), ' +
  'replays the randomness of dynamically linked glibc programs (getrandom, /dev/urandom, Python random/os.urandom/uuid4, ' +
  'Node Math.random); OpenSSL-based randomness (e.g. Node crypto.randomBytes), statically linked programs and the kernel CRNG ' +
  'stay truly random. See docs/determinism.md.';
/** A fresh schema per use, so each can carry its own description. */
const execSeed = () =>
  z
    .string({ error: SEED_FORMAT_MESSAGE })
    .regex(SEED_RE, { message: SEED_FORMAT_MESSAGE })
    .refine((v) => !SEED_RE.test(v) || BigInt(v) <= MAX_SEED, { message: SEED_FORMAT_MESSAGE });

/** `user` of an exec, a process, an upload or a mkdir: an account of the sandbox's image. A factory: `described` once per schema. */
const RunAsUser = (what: string) => described(
  z.string().regex(USER_NAME_RE),
  `An account of the sandbox's image (its /etc/passwd) ${what}, e.g. "user" in the \`debian\` image; absent: root. ` +
    'An account the image does not have is 404 user_not_found.',
);

export const ExecRequest = named(
  'ExecRequest',
  z
    .strictObject({
      command: described(z.string().min(1), 'A shell string, run by /bin/sh -c.').optional(),
      code: described(z.string(), "Source run by the template's interpreter (python3 for python, node for node, bash for debian, sh for base).").optional(),
      commands: described(
        z.array(z.array(z.string()).min(1)).min(1).max(256),
        'argv lists run in order; the first failure stops the rest.',
      ).optional(),
      files: z.array(ExecFile).max(1024).optional(),
      env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()).optional(),
      cwd: z.string().min(1).max(4096).optional(),
      stdin: z.string().optional(),
      timeout: described(z.number().positive().max(3600), 'Seconds; default 60, max 3600.').optional(),
      seed: described(execSeed(), ExecSeedDescription + ' Absent: the server draws one at random; the result reports it either way.').optional(),
      user: RunAsUser('the commands run as: its uid and groups, HOME, USER and LOGNAME, and its home as the default cwd; `files` (and the directories made for them) become its').optional(),
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
    oom_killed: described(z.literal(true), 'The exec was SIGKILLed by the guest kernel\'s OOM killer (it used more memory than the sandbox has). Absent otherwise.').optional(),
    pids_limited: described(z.literal(true), 'The exec\'s processes hit its process limit inside the guest (a fork bomb, or runaway forking): the guest agent killed all of them, background ones included, and `error` says so. Absent otherwise.').optional(),
    error: z.string().optional(),
    seed: described(execSeed(), 'The CRNG seed this exec ran with (the one given, or the one the server drew); pass it back as `seed` to replay it.'),
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
  user: RunAsUser('whose the file and the directories made for it become (written by the guest agent, as E2B\'s envd writes: the account\'s permissions do not decide)').optional(),
});

export const PutFileResponse = named('PutFileResponse', z.strictObject({ path: z.string(), size: z.number().int() }));

// ---------------------------------------------------------------------------------------------
// Background processes

export const ProcessStartRequest = named(
  'ProcessStartRequest',
  z
    .strictObject({
      command: described(z.string().min(1), 'A shell string, run by /bin/sh -c.').optional(),
      argv: described(z.array(z.string()).min(1).max(4096), 'The program and its arguments; the program is looked up on PATH.').optional(),
      env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()).optional(),
      cwd: z.string().startsWith('/').max(1023).optional(),
      pty: described(
        z.strictObject({ cols: z.number().int().min(1).max(65535).optional(), rows: z.number().int().min(1).max(65535).optional() }),
        'Run on a pseudo-terminal of this size (default 80x24): stdout and stderr are then one stream, `pty`, and input is typed into the terminal.',
      ).optional(),
      stdin: described(z.boolean(), 'Keep stdin open for POST …/stdin (else it reads /dev/null). A pty always takes input.').optional(),
      tag: described(z.string().max(256), 'A label of yours, listed with the process.').optional(),
      seed: described(
        execSeed(),
        'Run seeded, like an exec: user-space randomness from this CRNG seed and address-space randomization off, so the process replays. ' +
          'Absent: not seeded — a server, a shell or a PTY gets the kernel\'s randomness, and ASLR as the host sets it (COLLIMATE_GUEST_ASLR: on under KVM, off under TCG by default; docs/determinism.md). ' + ExecSeedDescription,
      ).optional(),
      user: RunAsUser('the process runs as, as for an exec').optional(),
    })
    .refine((r) => (r.command === undefined) !== (r.argv === undefined), { message: 'exactly one of command, argv is required' }),
  'Exactly one of command, argv. The start takes its turn in the sandbox\'s operation queue (FIFO, like an exec) and returns once the process runs.',
);

export const Process = named(
  'Process',
  z.strictObject({
    pid: described(z.number().int(), 'The guest pid: the handle of the process in every call.'),
    argv: z.array(z.string()),
    cwd: z.string(),
    tag: z.string().nullable(),
    pty: z.boolean(),
    stdin_open: described(z.boolean(), 'Whether input can be sent now.'),
    status: described(z.enum(['running', 'exited', 'lost']), '`lost`: it was running when the server last knew, and the guest no longer lists it.'),
    started_at: z.string(),
    finished_at: z.string().nullable(),
    exit_code: described(z.number().int().nullable(), '128+N if killed by signal N; null while running.'),
    signal: z.number().int().nullable(),
    pids_limited: described(z.literal(true), 'Present when its processes hit the process limit and the guest killed them.').optional(),
    stdout_bytes: z.number().int(),
    stderr_bytes: z.number().int(),
    output_bytes: described(z.number().int(), 'Everything it wrote, all streams: the offset its next output starts at.'),
    buffered: described(
      z.strictObject({ from: z.number().int(), to: z.number().int() }),
      'The output the server holds, as offsets [from, to) (the last 1 MiB per process); earlier bytes are gone.',
    ),
  }),
  'A background process of a sandbox.',
);

export const ProcessList = named('ProcessList', z.strictObject({ processes: z.array(Process) }));

export const ProcessOutputQuery = z.strictObject({
  from: described(
    z.string().regex(/^(start|now|\d{1,15})$/),
    '`start` (default): the output held from its beginning, then live; `now`: live only; a number: from that offset.',
  ).optional(),
});

export const ProcessOutputEvent = named(
  'ProcessOutputEvent',
  z.strictObject({
    data: described(z.string(), 'base64 of the bytes (events stdout, stderr, pty).').optional(),
    offset: described(z.number().int(), 'Offset of the first byte in everything the process wrote.').optional(),
    from: described(z.number().int(), 'gap: the first offset missing.').optional(),
    to: described(z.number().int(), 'gap: the offset output resumes at.').optional(),
    process: Process.optional(),
  }),
  'The data of an output stream\'s events: `stdout` / `stderr` / `pty` {data, offset}; `gap` {from, to} when output in between was dropped ' +
    '(written while the server was away, or older than what it keeps); `exit` {process} last; `error` an Error body.',
);

export const ProcessStdinResponse = named('ProcessStdinResponse', z.strictObject({ pid: z.number().int(), written: z.number().int() }));

export const ProcessSignalRequest = named(
  'ProcessSignalRequest',
  z.strictObject({
    signal: described(z.union([z.string().regex(/^(SIG)?[A-Z0-9]{2,8}$/), z.number().int().min(1).max(64)]), 'A name ("SIGTERM", "INT", "SIGKILL"…) or a number.'),
  }),
);

export const ProcessResizeRequest = named(
  'ProcessResizeRequest',
  z.strictObject({ cols: z.number().int().min(1).max(65535), rows: z.number().int().min(1).max(65535) }),
);

export const ProcessWaitRequest = named(
  'ProcessWaitRequest',
  z.strictObject({ timeout: described(z.number().min(0).max(300), 'Seconds to wait for the exit (default 30, max 300).').optional() }),
);

// ---------------------------------------------------------------------------------------------
// Files and directories (/v1/sandboxes/{id}/fs/...)

export const FS_PATH_DESCRIPTION = 'Guest path: absolute, or relative to /root. No NUL; at most 4095 bytes.';
export const FsPath = described(z.string().min(1).max(4095).refine((p) => !p.includes('\0'), 'must not contain NUL'), FS_PATH_DESCRIPTION);
const OctalMode = described(z.string().regex(/^0?[0-7]{3,4}$/), 'Octal permission bits, e.g. 755.');

export const FileEntry = named(
  'FileEntry',
  z.strictObject({
    name: described(z.string(), 'Last path component.'),
    path: described(z.string(), 'Absolute guest path.'),
    type: z.enum(['file', 'dir', 'symlink', 'other']),
    size: z.number().int(),
    mode: described(z.number().int(), 'Permission bits (mode & 0o7777), e.g. 420 for 0644.'),
    permissions: described(z.string(), 'The same bits as ls shows them, e.g. rw-r--r--.'),
    uid: z.number().int(),
    gid: z.number().int(),
    owner: described(z.string(), 'User name of uid in the guest\'s /etc/passwd; empty if it has none.'),
    group: described(z.string(), 'Group name of gid in the guest\'s /etc/group; empty if it has none.'),
    modified_at: described(z.string(), 'Modification time, ISO 8601 (ms).'),
    mtime_ns: described(z.string().regex(/^\d+$/), 'Modification time in ns since the epoch, as a decimal string.'),
    symlink_target: described(z.string(), 'Symlinks only: the target, as stored.').optional(),
    xattrs: described(z.record(z.string(), z.string()), 'Its extended attributes of the user.* namespace, by name without `user.` (values as UTF-8 text; at most 4 KiB of them); absent when it has none.').optional(),
  }),
  'One file-system entry as the guest sees it (a symlink itself, not what it points to).',
);

export const FsPathQuery = z.strictObject({ path: FsPath });

export const FsListQuery = z.strictObject({
  path: FsPath,
  depth: described(z.coerce.number().int().min(1).max(32), 'Levels to list: 1 (default) the directory\'s own entries, 2 theirs too, up to 32.').optional(),
});

export const FsWatchQuery = z.strictObject({
  path: FsPath,
  recursive: described(z.enum(['true', 'false', '1', '0']), 'Watch subdirectories too, present and future (default false).').optional(),
});

export const FsListing = named(
  'FsListing',
  z.strictObject({
    path: z.string(),
    entries: z.array(FileEntry),
    truncated: described(z.boolean(), 'More entries exist than one listing holds (5000, or 1 MiB of them); list deeper directories separately.'),
  }),
);

export const FsExists = named('FsExists', z.strictObject({ path: z.string(), exists: z.boolean() }));

export const FsMkdirRequest = named('FsMkdirRequest', z.strictObject({ path: FsPath, mode: OctalMode.optional(), user: RunAsUser('whose the directories made become (made by the guest agent, as E2B\'s envd makes them); a relative path is under its home').optional() }));
export const FsMkdirResponse = named(
  'FsMkdirResponse',
  z.strictObject({ created: described(z.boolean(), 'False when the directory existed already.'), entry: FileEntry }),
);

export const FsRemoveRequest = named('FsRemoveRequest', z.strictObject({ path: FsPath }));
export const FsRemoveResponse = named(
  'FsRemoveResponse',
  z.strictObject({ path: z.string(), removed: described(z.number().int(), 'Entries removed (a directory counts with everything in it).') }),
);

export const FsRenameRequest = named('FsRenameRequest', z.strictObject({ from: FsPath, to: FsPath }));

export const FsChangeEvent = named(
  'FsChangeEvent',
  z.strictObject({
    op: z.enum(['create', 'write', 'remove', 'rename', 'chmod', 'overflow']),
    name: described(z.string(), 'Relative to the watched directory (sub/file); empty for the directory itself.'),
  }),
  'The data of a watch stream\'s `change` event.',
);

export const FsWatchEndEvent = named(
  'FsWatchEndEvent',
  z.strictObject({
    reason: z.enum(['directory_removed', 'directory_moved', 'sandbox_suspended', 'sandbox_deleted', 'sandbox_lost', 'agent_disconnected', 'shutting_down']),
  }),
  'The data of a watch stream\'s last event, `end`.',
);

// ---------------------------------------------------------------------------------------------
// Templates

export const Template = named(
  'Template',
  z.strictObject({
    id: z.string(),
    kind: described(
      z.enum(['catalog', 'environment', 'snapshot']),
      '`catalog`: kept warm by the platform; `environment`: your own (Pro); `snapshot`: one of your snapshots promoted under this name (`snapshot_id`): each sandbox created from it starts from the snapshot.',
    ),
    snapshot_id: described(z.string(), 'With kind `snapshot`: the snapshot it starts sandboxes from.').optional(),
    description: z.string(),
    interpreter: z.array(z.string()),
    runtimes: described(
      z.record(z.string(), z.string()),
      'Language runtimes the image carries, by name, with their upstream versions, e.g. `{"node": "24.22.3", "npm": "11.21.2"}`. Empty when none is stated (`base`, environments).',
    ),
    ready: z.boolean(),
    vcpus: z.number(),
    memory_mib: z.number(),
  }),
);

export const TemplateList = named('TemplateList', z.strictObject({ templates: z.array(Template) }));

// ---------------------------------------------------------------------------------------------
// Images (bring your own: Pro and Enterprise)

export const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const AbsPath = () => z.string().startsWith('/').max(4096);

export const ImageSource = named(
  'ImageSource',
  z.discriminatedUnion('kind', [
    z.strictObject({
      kind: z.literal('oci-layout'),
      path: described(AbsPath(), 'An OCI image layout directory on the server, inside its import directory (COLLIMATE_IMPORT_DIR).'),
      tag: described(z.string().min(1).max(128), 'Picks the index entry annotated org.opencontainers.image.ref.name=tag.').optional(),
    }),
    z.strictObject({
      kind: z.literal('archive'),
      path: described(AbsPath(), 'A `docker save` or OCI archive tarball (optionally gzip or zstd) inside the import directory.'),
      tag: described(z.string().min(1).max(128), 'Which image of a multi-image docker save archive (a RepoTag).').optional(),
    }),
    z.strictObject({
      kind: z.literal('registry'),
      ref: described(z.string().min(1).max(512), 'host[:port]/name[:tag][@sha256:…]; docker.io and library/ are the defaults.'),
      username: z.string().max(1024).optional(),
      password: described(z.string().max(8192), 'Password or token; used for the pull only, never stored.').optional(),
    }),
  ]),
  'Where the image comes from.',
);

export const CreateImageRequest = named('CreateImageRequest', z.strictObject({ source: ImageSource }));

export const ImageLayer = named(
  'ImageLayer',
  z.strictObject({
    digest: described(z.string(), 'Digest of the (compressed) blob.'),
    diff_id: described(z.string(), 'Digest of the uncompressed tar; the layer store key.'),
    size: described(z.number().int(), 'Blob bytes.'),
    media_type: z.string(),
    stored_bytes: described(z.number().int().nullable(), 'Bytes of the stored erofs layer (null until pulled).'),
  }),
);

export const Image = named(
  'Image',
  z.strictObject({
    id: described(z.string(), 'sha256 digest of the image manifest.'),
    ref: z.string(),
    source: z.enum(['oci-layout', 'archive', 'registry']),
    state: described(z.enum(['pulling', 'ready', 'failed']), 'pulling → ready | failed.'),
    error: z.string().nullable(),
    progress: z.string().nullable(),
    layers: z.array(ImageLayer),
    config: z.strictObject({
      env: z.array(z.string()),
      working_dir: z.string().nullable(),
      user: z.string().nullable(),
      entrypoint: described(z.array(z.string()).nullable(), 'Recorded, not run: sandboxes start from the baked ready state.'),
      cmd: z.array(z.string()).nullable(),
    }),
    warnings: described(z.array(z.string()), 'E.g. no /bin/sh, or a User that cannot be applied.'),
    transferred_bytes: described(z.number().int(), 'Layer bytes the last pull moved (0 when every layer was already held).'),
    created_at: IsoTime,
    updated_at: IsoTime,
  }),
  "One of your images. Its layers live once each in the server's content-addressed layer store.",
);

export const ImageList = named(
  'ImageList',
  z.strictObject({
    images: described(z.array(Template), 'Catalog images, ready to run on every tier.'),
    own: described(z.array(Image).optional(), 'Your own images (Pro and Enterprise); always sent by REST.'),
  }),
);

// ---------------------------------------------------------------------------------------------
// Environments

export const ENVIRONMENT_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;

export const CreateEnvironmentRequest = named(
  'CreateEnvironmentRequest',
  z.strictObject({
    name: described(z.string().regex(ENVIRONMENT_NAME_RE), 'The template id sandboxes are created with.'),
    image: described(z.string().min(1).max(512), 'An image id (sha256:…) or the ref it was registered by.'),
    description: z.string().max(1024).optional(),
    interpreter: described(z.array(z.string().min(1)).min(1).max(16), 'argv prefix that runs `code` (default ["/bin/sh", "-c"]).').optional(),
    ready_command: described(z.string().min(1).max(65536), 'Shell command run once at bake (as root, with the image Env and WorkingDir); its result is in every sandbox.').optional(),
    ready_probe: described(z.string().min(1).max(65536), 'Shell command that must exit 0 before the checkpoint.').optional(),
    ready_timeout_secs: z.number().int().min(1).max(7200).optional(),
    secrets: described(
      z.record(z.string().regex(ENV_NAME_RE), z.string().max(65536)).refine((v) => Object.keys(v).length <= 64, { message: 'at most 64 secrets' }),
      'Injected as environment variables into every exec. Write-only: never returned, logged, or stored in plaintext.',
    ).optional(),
    vcpus: described(z.number().int().min(1).max(64), 'Default 1; at most the tier maximum.').optional(),
    memory_mib: described(z.number().int().min(64).max(1048576), 'Default 256; at most the tier maximum.').optional(),
    egress: described(EgressPolicy.optional(), 'The egress policy of its sandboxes (a create may narrow it, never widen it). Default "allow".'),
  }),
);

export const Environment = named(
  'Environment',
  z.strictObject({
    name: z.string(),
    image: z.string(),
    state: described(z.enum(['pending', 'baking', 'ready', 'failed']), 'pending → baking → ready | failed.'),
    error: z.string().nullable(),
    progress: z.string().nullable(),
    log_tail: described(z.string(), 'The last lines of the bake log (GET …/log for all of it).'),
    description: z.string(),
    interpreter: z.array(z.string()),
    ready_command: z.string().nullable(),
    ready_probe: z.string().nullable(),
    secret_names: described(z.array(z.string()), 'Names only; values are write-only.'),
    vcpus: z.number().int(),
    memory_mib: z.number().int(),
    egress: EgressPolicy,
    created_at: IsoTime,
    updated_at: IsoTime,
  }),
  'Your named configuration of an image; once ready, its name is a template id for POST /v1/sandboxes.',
);

export const EnvironmentList = named('EnvironmentList', z.strictObject({ environments: z.array(Environment) }));

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
  per: described(z.enum(['day']), '`day`: also the totals of each UTC day in [from, to) (`days`), at most 366 days.').optional(),
});

export const UsageResponse = named(
  'Usage',
  z.strictObject({
    from: z.string(),
    to: z.string(),
    totals: UsageTotals,
    sandboxes: z.array(SandboxUsage),
    days: described(
      z.array(z.strictObject({ from: z.string(), to: z.string(), totals: UsageTotals })),
      'With per=day: each UTC day\'s totals, oldest first; the first and last days clipped to [from, to).',
    ).optional(),
  }),
  'Metered time in [from, to): running seconds × vCPUs / RAM MiB / disk MiB, and suspended seconds × snapshot MiB.',
);

export const ExecLogEntry = named(
  'ExecLogEntry',
  z.strictObject({
    command: described(z.string(), 'What ran, on one line (at most 200 characters): the command, the first line of `code` as `[code] …`, or the argv lists joined by &&. Never stdin, files or env.'),
    exit_code: z.number().int(),
    timed_out: z.boolean(),
    duration_ms: described(z.number().int(), 'From the request reaching the service to the result, queueing included.'),
    started_at: IsoTime,
  }),
);

export const ExecLogList = named('ExecLogList', z.strictObject({ execs: z.array(ExecLogEntry) }));

export const ExecLogQuery = z.strictObject({
  limit: described(z.coerce.number().int().min(1).max(50), 'At most this many, newest first (default and maximum 50).').optional(),
});

const isoQuery = () => z.string().refine((t) => !Number.isNaN(Date.parse(t)), 'must be an ISO 8601 time, e.g. 2026-12-05T10:00:00Z');

export const MetricsQuery = z.strictObject({
  from: described(isoQuery(), 'Samples taken at or after this time, ISO 8601 (default: the oldest kept).').optional(),
  to: described(isoQuery(), 'Samples taken at or before this time, ISO 8601 (default: now).').optional(),
});

export const SandboxMetrics = named(
  'SandboxMetrics',
  z.strictObject({
    period_secs: described(z.number().int(), 'How often a running sandbox is sampled.'),
    disk_period_secs: described(z.number().int(), 'How often its disk use is read in the guest; the samples between carry the last reading.'),
    samples: z.array(
      z.strictObject({
        at: IsoTime,
        cpu_percent: described(z.number().nullable(), "Of its vCPUs together since the sample before (100 = one vCPU busy); null for the first."),
        memory_mib: described(z.number().int(), "Its VMM's resident memory."),
        disk_used_bytes: described(z.number().int().nullable(), "Used on its root file system, as `df /` in the sandbox says (the last reading); null before the first reading, or if its guest cannot tell."),
        disk_total_bytes: described(z.number().int().nullable(), 'The size of its root file system (`df /`); null when disk_used_bytes is.'),
      }),
    ),
  }),
  "A sandbox's resource use over time, oldest first: sampled while it runs on the host that runs it, kept for its life (its last 12 hours), gone with it and with a server restart.",
);

/** Log levels, least severe first: a read's `level` returns that one and those after it. */
export const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
/** Log entries kept per sandbox (the oldest go first). */
export const LOG_KEPT_PER_SANDBOX = 1000;
/** Most log entries one read returns, and its default. */
export const LOG_READ_MAX = 1000;
/** Longest log search string. */
export const LOG_SEARCH_MAX = 256;

export const LogLevelSchema = named('LogLevel', z.enum(LOG_LEVELS), 'Severity, least first: debug, info, warn, error.');

export const SandboxLogsQuery = z.strictObject({
  cursor: described(
    z.coerce.number().int().min(0),
    'Where to start, ms since the epoch, inclusive: forward reads entries at or after it (default: the oldest kept), backward at or before it (default: the newest).',
  ).optional(),
  direction: described(z.enum(['forward', 'backward']), '`forward` (default): oldest first; `backward`: newest first.').optional(),
  level: described(LogLevelSchema.optional(), 'The least severe level returned (default debug: every entry).'),
  search: described(z.string().max(LOG_SEARCH_MAX), `Only entries whose message contains this, case-sensitive (at most ${LOG_SEARCH_MAX} characters).`).optional(),
  limit: described(z.coerce.number().int().min(1).max(LOG_READ_MAX), `At most this many, 1..${LOG_READ_MAX} (default ${LOG_READ_MAX}).`).optional(),
});

export const SandboxLogEntry = named(
  'SandboxLogEntry',
  z.strictObject({
    timestamp: IsoTime,
    level: LogLevelSchema,
    message: described(z.string(), 'What happened, for people, e.g. `Exec exited 0 in 12 ms: echo hi`.'),
    fields: described(
      z.record(z.string(), z.string()),
      'The same for programs: `event` (lifecycle, exec, process, reaper, snapshot) and what it has — `op` and `state`; `command`, `exit_code`, `duration_ms`, `timed_out`; `pid`, `status`, `signal`; `error_code`…',
    ),
  }),
);

export const SandboxLogs = named(
  'SandboxLogs',
  z.strictObject({ logs: z.array(SandboxLogEntry) }),
  `What happened to a sandbox, kept where it runs (its last ${LOG_KEPT_PER_SANDBOX} entries, across restarts, gone with it): lifecycle changes, execs (a one-line summary of the command, never stdin, env or files), background processes' starts and exits, the reaper's action, snapshots taken and failures of the guest.`,
);

export const LiveStats = named(
  'LiveStats',
  z.strictObject({
    sandboxes: z.array(
      z.strictObject({
        id: SandboxId,
        cpu_percent: described(z.number().nullable(), "The sandbox's VMM's CPU use since the previous reading, in % of one core; null on the first reading."),
        memory_mib: described(z.number().int(), "Host memory the sandbox's VMM holds now (resident set)."),
      }),
    ),
  }),
  'Live use of the host by each running sandbox.',
);

// ---------------------------------------------------------------------------------------------
// Account: the tenant's own keys, its tier's limits, and the stream of its sandboxes' changes

export const KEY_NAME_MAX = 100;

export const ApiKey = named(
  'ApiKey',
  z.strictObject({
    id: described(z.string(), 'Key id (key_…): what DELETE /v1/keys/{id} takes. The key itself is shown once, when created.'),
    prefix: described(z.string(), 'The first 12 characters of the key, to tell keys apart.'),
    name: z.string().nullable(),
    created_at: IsoTime,
    last_used_at: described(IsoTime.nullable(), 'Updated at most once a minute.'),
  }),
);

export const ApiKeyList = named('ApiKeyList', z.strictObject({ keys: z.array(ApiKey) }));

export const CreateKeyRequest = named(
  'CreateKeyRequest',
  z.strictObject({ name: described(z.string().min(1).max(KEY_NAME_MAX), 'A name to recognise the key by.').optional() }),
);

export const CreatedKey = named(
  'CreatedKey',
  z.strictObject({ key: described(z.string(), 'The new key (clm_…). Shown only in this answer; store it now.'), record: ApiKey }),
);

/** The per-tenant quotas (src/service/quotas.ts enforces them), in the order GET /v1/limits lists them. */
export const QUOTA_NAMES = ['suspended_sandboxes', 'suspended_mib', 'snapshots', 'snapshot_mib', 'images', 'environments', 'open_streams', 'keys'] as const;
export type QuotaName = (typeof QUOTA_NAMES)[number];

const QuotaUse = z.strictObject({
  limit: described(z.number().int().nullable(), 'null: no limit.'),
  used: z.number().int(),
});

export const Limits = named(
  'Limits',
  z.strictObject({
    tier: z.string(),
    max_running: described(z.number().int().nullable(), 'Running sandboxes at once (suspended ones do not count); null: no cap.'),
    running: described(z.number().int(), 'Running now.'),
    own_images: described(z.boolean(), 'May bake environments from its own images.'),
    max_session_secs: z.number().int(),
    default_session_secs: z.number().int().nullable(),
    max_vcpus: z.number().int(),
    max_memory_mib: z.number().int(),
    quotas: described(
      z.strictObject(Object.fromEntries(QUOTA_NAMES.map((n) => [n, QuotaUse])) as Record<QuotaName, typeof QuotaUse>),
      'Each quota with its limit and your use now. suspended_sandboxes; suspended_mib (each suspended sandbox at its memory plus disk size); ' +
        'snapshots; snapshot_mib (each snapshot at its memory size, the most its RAM image takes, plus what its files take beyond that); ' +
        'images; environments; open_streams (event streams, watches, process and terminal streams, E2B streams and port connections open on this host); ' +
        'keys (not revoked). Going past one is 429 quota_exceeded with details.quota naming it.',
    ),
  }),
  "The tier's limits, its quotas and current use.",
);

export const SandboxEvent = named(
  'SandboxEvent',
  z.strictObject({
    sandbox_id: SandboxId,
    op: described(z.enum(['create', 'fork', 'suspend', 'resume', 'delete', 'lost', 'move', 'restore']), 'What happened; `lost`: the sandbox ended on its own (its VMM died, or it could not be restored); `move`: an operator moved it, suspended, to another cluster host (`deleted` from the host it left, then `suspended` on the one it reached); `restore`: it was rolled back to one of its snapshots.'),
    state: SandboxState,
    at: IsoTime,
  }),
  'The data of a `sandbox` event on GET /v1/events.',
);

// ---------------------------------------------------------------------------------------------
// Operations


const StorageBudget = z.strictObject({
  path: z.string(), free_mib: z.number().int(), reserve_mib: z.number().int(), starting_mib: z.number().int(),
});

const ClaimBudget = z.strictObject({ free: z.number().int(), total: z.number().int() });

export const Health = named(
  'Health',
  z.strictObject({
    status: z.enum(['ok', 'starting', 'shutting_down']),
    accel: z.string(),
    templates_ready: z.boolean(),
    mode: described(z.enum(['development', 'production']), '`development` without KVM (TCG): QEMU does not treat TCG guest escapes as security bugs, so guests are not a security boundary.').optional(),
    isolation: z.string().optional(),
    confinement: described(
      z.strictObject({ enabled: z.boolean(), cgroups: z.string().optional(), reason: z.string().optional() }),
      'Whether VMM processes run confined (own uid, no capabilities, private mount view) and which cgroup layout limits them.',
    ).optional(),
    network: described(
      z.strictObject({ enabled: z.boolean(), reason: z.string().optional() }),
      'Whether sandboxes get a network namespace and NIC (docs/networking.md); off when the server is not root or COLLIMATE_NET=off.',
    ).optional(),
    pools: described(
      z.record(z.string(), z.strictObject({ ready: z.number().int(), target: z.number().int(), reason: z.string() })),
      'Warm pools: VMMs ready, the size each pool holds now and why (it follows demand, within COLLIMATE_POOL_MIN/MAX and COLLIMATE_POOL_MEMORY_MIB). Catalog templates by id; tenants\' environments summed under `environments`.',
    ).optional(),
    capacity: described(
      z.strictObject({
        memory: z.strictObject({
          available_mib: z.number().int(), reserve_mib: z.number().int(), committed_mib: z.number().int(),
          limit_mib: z.number().int().nullable(), starting_mib: z.number().int(),
        }),
        cpu: z.strictObject({ pressure: z.number().nullable(), max: z.number().nullable() }),
        tmpfs: StorageBudget,
        disk: StorageBudget,
        claims: z.strictObject({
          vmm_uids: ClaimBudget.optional(),
          net_indexes: ClaimBudget.optional(),
        }),
        refusals: z.strictObject({
          memory: z.number().int(), cpu: z.number().int(), tmpfs: z.number().int(), disk: z.number().int(),
          vmm_uids: z.number().int(), net_indexes: z.number().int(),
        }),
      }),
      'Admission by what the host has: a create, fork or resume that would take MemAvailable below the reserve, the running sandboxes\' guest memory past limit_mib (COLLIMATE_HOST_MEMORY_MIB), or that arrives while CPU pressure (% of the last 10 s some task waited for a CPU) is at max; an operation that would leave less than the reserve free on the RAM files\' tmpfs (a fork point, a resumed sandbox\'s RAM: up to its guest memory; COLLIMATE_TMPFS_RESERVE_MIB) or on the home\'s disk (a suspend\'s image; COLLIMATE_DISK_RESERVE_MIB); or one that starts more VMMs than VMM uids (COLLIMATE_VMM_UID_COUNT) or network indexes (COLLIMATE_NET_TRANSIT) are free: each gets 503 host_at_capacity with Retry-After, its details naming the resource. refusals counts them since start, by resource.',
    ).optional(),
    catalog: described(
      z.strictObject({
        building: z.record(z.string(), z.strictObject({ step: z.string(), secs: z.number().int() })),
        failed: z.record(z.string(), z.string()),
      }),
      'Catalog templates still being built: a first start with an empty cache serves once `base` is ready and builds the others (python, node, debian) in the background, one at a time; `building` names each with the step it is at and the seconds since its build began, `failed` each whose build failed with why. A create of one of them is 503 template_not_ready with Retry-After (a failed one is built again by it). Both empty once every catalog template is ready.',
    ).optional(),
    cluster: described(
      z.strictObject({ host_id: z.string(), address: z.string(), capacity: z.number().int(), lease: z.boolean() }),
      'Cluster mode only (docs/cluster.md): this host\'s id and advertised address, the running sandboxes it takes at most (0: an API-only node), and whether it holds its lease (false: it takes no create, fork or resume until a heartbeat succeeds).',
    ).optional(),
  }),
);

export const EmptyQuery = z.strictObject({});

/** A code context's id: the server in the guest names each with a UUID. */
export const CODE_CONTEXT_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** A fresh schema per use, so each can carry its own description. */
const codeLanguage = (what: string) => described(z.enum(['python', 'javascript']), `The kernel's language, \`python\` (IPython) or \`javascript\` (Node.js). ${what}`);

export const RunCodeRequest = named(
  'RunCodeRequest',
  z.strictObject({
    code: described(z.string().max(1024 * 1024), 'The cell\'s source.'),
    language: codeLanguage('Runs in that language\'s default context (made on first use). Absent (and no context): the image\'s first kernel, python where there is one.').optional(),
    context: described(z.string().regex(CODE_CONTEXT_RE, { message: 'context must be a context id (a UUID) from GET /v1/sandboxes/{id}/code/contexts' }), 'A context made with POST /v1/sandboxes/{id}/code/contexts; not with language.').optional(),
    env: described(z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()), 'Environment variables for this cell only (set before it, removed after).').optional(),
    timeout_secs: described(z.number().positive().max(3600), 'Seconds the cell may run before it is interrupted (timed_out in the result); default 300, max 3600.').optional(),
    seed: described(execSeed(), 'Reseeds the language\'s own generators before the cell, as a decimal u64: Python\'s random and numpy.random\'s global state (when numpy is loaded), JavaScript\'s Math.random. The same seed in the same kernel state replays the cell. Absent: the generators go on as they are. See docs/code.md.').optional(),
  }),
  'With `Accept: text/event-stream` the answer is an SSE stream: `stdout` / `stderr` `{"text"}` as the cell prints, `display` (a CodeOutput) for each display and the last value as it comes, `exception` (a CodeError), then one `result` with the CodeResult, or one `error` with an Error body.',
);

export const CodeOutput = named(
  'CodeOutput',
  z.strictObject({
    is_main_result: described(z.boolean(), 'True for the value of the cell\'s last expression; false for a display (a shown figure, display()).'),
    data: described(z.record(z.string(), z.unknown()), 'A MIME bundle: text/plain always, and what the value renders as (image/png and image/svg+xml base64/text, text/html, application/json, text/latex, text/markdown, e2b/chart for a matplotlib figure\'s data).'),
  }),
);

export const CodeError = named(
  'CodeError',
  z.strictObject({ name: z.string(), value: z.string(), traceback: described(z.string(), 'Plain text (no terminal colours).') }),
  'An exception the cell raised: its class, message and traceback.',
);

export const CodeResult = named(
  'CodeResult',
  z.strictObject({
    context: described(z.string().nullable(), 'The context the cell ran in.'),
    results: z.array(CodeOutput),
    stdout: z.string(),
    stderr: z.string(),
    error: CodeError.nullable(),
    execution_count: described(z.number().int().nullable(), 'The context\'s cell counter (IPython\'s In [n]).'),
    timed_out: described(z.boolean(), 'The cell ran past timeout_secs and was interrupted; error is then the interruption.'),
    duration_ms: z.number().int(),
    seed: described(z.string().nullable(), 'The seed given, or null.'),
  }),
);

export const CodeContext = named(
  'CodeContext',
  z.strictObject({ id: z.string(), language: z.string(), cwd: z.string() }),
  'A kernel with its own state and working directory.',
);

export const CodeContextList = named('CodeContextList', z.strictObject({ contexts: z.array(CodeContext) }));

export const CreateCodeContext = named(
  'CreateCodeContext',
  z.strictObject({
    language: codeLanguage('Default: the image\'s first kernel, python where there is one.').optional(),
    cwd: described(z.string().min(1).max(4096), 'Its working directory (must exist); default the home (/root, or /home/user where there is one).').optional(),
  }),
);

export const CodeStreamText = z.strictObject({ text: z.string() });
