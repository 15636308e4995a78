/**
 * The declarative route table: method, path, schemas and documented responses of every endpoint.
 * server.ts binds a handler to each operationId; openapi.ts renders the same table; tests look up the
 * response schema of (operation, status) here. Nothing here touches the service.
 */
import type { z } from 'zod';
import type { DoorNames, ErrorCode } from '../errors.js';
import * as S from '../wire/schemas.js';

export type HttpMethod = 'GET' | 'POST' | 'PUT' | 'DELETE';

/** Methods the ports proxy documents (it forwards any method the HTTP server parses). */
export const PROXY_METHODS = ['GET', 'PUT', 'POST', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS'] as const;

export interface ResponseSpec {
  description: string;
  /** JSON body schema; absent for 204 or for non-JSON bodies. */
  schema?: z.ZodType;
  /** Content type of a non-JSON body (e.g. application/octet-stream). */
  contentType?: string;
  /** text/event-stream: the schemas of its events' data (JSON), in the order they may come. */
  events?: readonly z.ZodType[];
  headers?: Record<string, string>;
}

export interface RouteSpec {
  operationId: string;
  /** `ANY`: the ports proxy (src/api/portsProxy.ts) binds it for every method, not the JSON wrapper of server.ts. */
  method: HttpMethod | 'ANY';
  /** Fastify-style path (`:id`, a trailing `*` for the rest of the path); openapi.ts renders `{id}` and `{path}`. */
  path: string;
  summary: string;
  description?: string;
  tag: 'sandboxes' | 'ports' | 'templates' | 'images' | 'environments' | 'usage' | 'account' | 'operations';
  auth: boolean;
  /** Path parameter kinds: `sandbox` ids are checked against ^sbx_[0-9a-f]{12}$ (else 404). */
  params?: Readonly<Record<string, 'sandbox' | 'snapshot' | 'template' | 'image' | 'environment' | 'port' | 'token' | 'path' | 'pid' | 'key' | 'context'>>;
  query?: z.ZodObject;
  /** `json`: a JSON body validated by `body`; `raw`: any bytes (PUT files); `stream`: any bytes, unread, for the handler to stream. */
  bodyKind?: 'json' | 'raw' | 'stream';
  body?: z.ZodType;
  /** An empty body is accepted and parsed as {}. */
  bodyOptional?: boolean;
  /** Honours the Idempotency-Key header. */
  idempotent?: boolean;
  /** Streams SSE when the client sends Accept: text/event-stream. */
  sse?: boolean;
  responses: Readonly<Record<number, ResponseSpec>>;
  /** Error codes this endpoint can return besides the generic ones (validation, auth, shutdown). */
  errors: readonly ErrorCode[];
}

const sandbox = { id: 'sandbox' } as const;
const snapshot = { snapshot: 'snapshot' } as const;
const sandboxProcess = { id: 'sandbox', pid: 'pid' } as const;
const PROCESS_ERRORS = ['sandbox_not_found', 'process_not_found'] as const;
const sandboxContext = { id: 'sandbox', context: 'context' } as const;
const CODE_ERRORS = ['sandbox_not_found', 'invalid_state', 'code_unavailable', 'network_unavailable'] as const;

/** The table with its literal types, so handlers are typed from their route's schemas (binder.ts). */
export const ROUTE_TABLE = [
  {
    operationId: 'createSandbox',
    method: 'POST',
    path: '/v1/sandboxes',
    summary: 'Create a sandbox (from a template, or N from a snapshot)',
    description:
      'Forks a warm template and returns a running sandbox. With `snapshot` instead of `template`, starts sandboxes from that snapshot: each has its memory, processes and files and a fresh identity ' +
      '(CRNG reseeded, new boot id), as a fork child does; with `count`, that many, all listed in `sandboxes`. Counts against the tier concurrency cap; refused with 503 host_at_capacity (Retry-After) when the host lacks the memory, CPU, tmpfs or disk space, or a free VMM uid or network index for it (the error\'s details name the resource). ' +
      'Honours Idempotency-Key: a retry with the same key and body returns the original response.',
    tag: 'sandboxes',
    auth: true,
    bodyKind: 'json',
    body: S.CreateSandboxRequest,
    idempotent: true,
    responses: { 201: { description: 'Created, running.', schema: S.CreateSandboxResponse } },
    errors: ['template_not_found', 'template_forbidden', 'tier_forbidden', 'egress_forbidden', 'concurrency_limit', 'template_not_ready', 'host_at_capacity', 'idempotency_key_reused', 'snapshot_not_found'],
  },
  {
    operationId: 'listSandboxes',
    method: 'GET',
    path: '/v1/sandboxes',
    summary: "List the tenant's sandboxes",
    tag: 'sandboxes',
    auth: true,
    query: S.ListSandboxesQuery,
    responses: { 200: { description: 'One page.', schema: S.SandboxList } },
    errors: [],
  },
  {
    operationId: 'getSandbox',
    method: 'GET',
    path: '/v1/sandboxes/:id',
    summary: 'Get a sandbox',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    responses: { 200: { description: 'The sandbox.', schema: S.Sandbox } },
    errors: ['sandbox_not_found'],
  },
  {
    operationId: 'execSandbox',
    method: 'POST',
    path: '/v1/sandboxes/:id/exec',
    summary: 'Run a command in a running sandbox',
    description:
      'Execs are serialized per sandbox (FIFO). With `Accept: text/event-stream` the response is an SSE stream ' +
      '(200 once the sandbox is found running): `stdout`/`stderr` events with data `{"data": base64}`, then ' +
      '`result` with the ExecResult, or `error` with an Error body.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.ExecRequest,
    sse: true,
    responses: {
      200: { description: 'The result (or an SSE stream, see description).', schema: S.ExecResult },
    },
    errors: ['sandbox_not_found', 'invalid_state', 'agent_unavailable', 'quota_exceeded', 'user_not_found', 'sandbox_restored'],
  },
  {
    operationId: 'listExecs',
    method: 'GET',
    path: '/v1/sandboxes/:id/execs',
    summary: "A sandbox's recent execs",
    description: 'The last 50 execs that ran (through REST or MCP), newest first, with exit codes and durations; kept across server restarts, gone with the sandbox.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.ExecLogQuery,
    responses: { 200: { description: 'Newest first.', schema: S.ExecLogList } },
    errors: ['sandbox_not_found'],
  },
  {
    operationId: 'getSandboxMetrics',
    method: 'GET',
    path: '/v1/sandboxes/:id/metrics',
    summary: "A sandbox's CPU, memory and disk over time",
    description: 'Samples every 5 s while it runs (none while suspended), oldest first, within `from`..`to`; a running sandbox with none yet is sampled at once. Disk use (`df /` in the sandbox) is read every 30 s, and the samples between carry the last reading.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.MetricsQuery,
    responses: { 200: { description: 'Oldest first.', schema: S.SandboxMetrics } },
    errors: ['sandbox_not_found'],
  },
  {
    operationId: 'getSandboxLogs',
    method: 'GET',
    path: '/v1/sandboxes/:id/logs',
    summary: 'What happened to a sandbox',
    description:
      `Its log, kept where it runs (the last ${S.LOG_KEPT_PER_SANDBOX} entries, across server restarts, gone with the sandbox): lifecycle changes (created, forked, suspended, resumed, rolled back), ` +
      'every exec (a one-line summary of the command, exit code, duration; warn on a non-zero exit, error on a timeout), background processes\' starts and exits, ' +
      'the reaper\'s suspend, snapshots taken, and failures of the guest. Never stdin, env values or file contents. ' +
      'Oldest first from `cursor` (ms, inclusive), or newest first back from it with `direction=backward`; `level` is the least severe returned; `search` a case-sensitive substring of the message. ' +
      'To read on, pass the last entry\'s time (ms) + 1 forward, − 1 backward.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.SandboxLogsQuery,
    responses: { 200: { description: 'In the query\'s direction.', schema: S.SandboxLogs } },
    errors: ['sandbox_not_found'],
  },
  {
    operationId: 'forkSandbox',
    method: 'POST',
    path: '/v1/sandboxes/:id/fork',
    summary: 'Fork a running or suspended sandbox into N children',
    description:
      'Children keep the parent\'s process memory and files, and run. A running parent keeps running (live fork); a suspended parent ' +
      'stays suspended (its snapshot is the fork point). Each child counts against the tier cap. Honours Idempotency-Key.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.ForkRequest,
    bodyOptional: true,
    idempotent: true,
    responses: { 201: { description: 'The children, running.', schema: S.ForkResponse } },
    errors: ['sandbox_not_found', 'invalid_state', 'concurrency_limit', 'host_at_capacity', 'idempotency_key_reused', 'sandbox_restored'],
  },
  {
    operationId: 'createSnapshot',
    method: 'POST',
    path: '/v1/sandboxes/:id/snapshots',
    summary: 'Keep this moment of a running or suspended sandbox as a snapshot',
    description:
      'Its memory, processes and files, kept until deleted (they survive server restarts). A running sandbox pauses only as long as a fork pauses it and runs on. ' +
      'Start sandboxes from it (POST /v1/sandboxes with `snapshot`, any number of times) or roll this sandbox back to it (POST /v1/sandboxes/{id}/restore). ' +
      'Counts against the quotas `snapshots` and `snapshot_mib`. Refused with 503 host_at_capacity when its RAM image could take the disk below COLLIMATE_DISK_RESERVE_MIB.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.CreateSnapshotRequest,
    bodyOptional: true,
    responses: { 201: { description: 'Taken.', schema: S.Snapshot } },
    errors: ['sandbox_not_found', 'invalid_state', 'host_at_capacity', 'quota_exceeded', 'sandbox_restored'],
  },
  {
    operationId: 'listSnapshots',
    method: 'GET',
    path: '/v1/snapshots',
    summary: "List the tenant's snapshots",
    tag: 'sandboxes',
    auth: true,
    query: S.ListSnapshotsQuery,
    responses: { 200: { description: 'One page, by id.', schema: S.SnapshotList } },
    errors: [],
  },
  {
    operationId: 'getSnapshot',
    method: 'GET',
    path: '/v1/snapshots/:snapshot',
    summary: 'Get a snapshot',
    tag: 'sandboxes',
    auth: true,
    params: snapshot,
    responses: { 200: { description: 'The snapshot.', schema: S.Snapshot } },
    errors: ['snapshot_not_found'],
  },
  {
    operationId: 'deleteSnapshot',
    method: 'DELETE',
    path: '/v1/snapshots/:snapshot',
    summary: 'Delete a snapshot',
    params: snapshot,
    description: 'No sandbox starts from it or rolls back to it any more. Sandboxes started from it run on; its files go when the last of them does.',
    tag: 'sandboxes',
    auth: true,
    responses: { 204: { description: 'Deleted.' } },
    errors: ['snapshot_not_found'],
  },
  {
    operationId: 'promoteSnapshot',
    method: 'POST',
    path: '/v1/snapshots/:snapshot/promote',
    summary: 'Promote a snapshot to an environment: a template id every new sandbox can start from',
    description:
      'Names the snapshot as a template of yours (Pro): POST /v1/sandboxes with that name as `template` starts a sandbox from the snapshot — its memory, processes and files, ' +
      'a fresh identity — as a start with `snapshot` does. Listed by GET /v1/templates with kind `snapshot`. `{"environment": null}` takes the name away; deleting the snapshot takes it too. ' +
      'The name must be free among the catalog, your environments and your other snapshots (409 conflict).',
    tag: 'sandboxes',
    auth: true,
    params: snapshot,
    bodyKind: 'json',
    body: S.PromoteSnapshotRequest,
    responses: { 200: { description: 'The snapshot, with its `environment`.', schema: S.Snapshot } },
    errors: ['snapshot_not_found', 'conflict', 'tier_forbidden'],
  },
  {
    operationId: 'restoreSandbox',
    method: 'POST',
    path: '/v1/sandboxes/:id/restore',
    summary: 'Roll a sandbox back to one of its snapshots, in place',
    description:
      'Same id; its memory, processes and files become the snapshot\'s. A running sandbox runs on from that moment; a suspended one stays suspended at it. ' +
      'Requests queued on the sandbox behind the rollback fail with 409 sandbox_restored. A snapshot of another sandbox is 409 snapshot_mismatch (start a new sandbox from it instead).',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.RestoreRequest,
    responses: { 200: { description: 'Rolled back.', schema: S.Sandbox } },
    errors: ['sandbox_not_found', 'snapshot_not_found', 'snapshot_mismatch', 'sandbox_restored', 'invalid_state', 'host_at_capacity'],
  },
  {
    operationId: 'suspendSandbox',
    method: 'POST',
    path: '/v1/sandboxes/:id/suspend',
    summary: 'Suspend a running sandbox to disk',
    description: 'Frees its concurrency slot and stops the running meter. By default (the sandbox\'s keep_memory) its memory and processes are kept, and a resume continues them; `{"keep_memory": false}` keeps only its files, and the resume boots it afresh. Refused with 503 host_at_capacity (Retry-After) when its RAM image could take the disk below COLLIMATE_DISK_RESERVE_MIB.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.SuspendRequest,
    bodyOptional: true,
    responses: { 200: { description: 'Suspended.', schema: S.Sandbox } },
    errors: ['sandbox_not_found', 'invalid_state', 'host_at_capacity', 'quota_exceeded'],
  },
  {
    operationId: 'resumeSandbox',
    method: 'POST',
    path: '/v1/sandboxes/:id/resume',
    summary: 'Resume a suspended sandbox',
    description: 'Takes a concurrency slot. Honours Idempotency-Key: a retry of a resume that succeeded gets its answer again, not invalid_state.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.EmptyQuery,
    bodyOptional: true,
    idempotent: true,
    responses: { 200: { description: 'Running again.', schema: S.Sandbox } },
    errors: ['sandbox_not_found', 'invalid_state', 'concurrency_limit', 'host_at_capacity', 'idempotency_key_reused', 'sandbox_restored'],
  },
  {
    operationId: 'setSandboxTimeout',
    method: 'POST',
    path: '/v1/sandboxes/:id/timeout',
    summary: "Set when a running sandbox's session ends: timeout_secs from now",
    description:
      'A lease: extends or shortens the session, and the reaper ends it at the new expires_at (deletes it, or suspends it as the server is configured). ' +
      "The tier's maximum session counts from the session's start (session_started_at): a timeout ending past it is 403 tier_forbidden " +
      'with `max_timeout_secs`, the longest still allowed. Only while running (409 invalid_state): a resume starts a new session of timeout_secs. Safe to retry.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.SetTimeoutRequest,
    responses: { 200: { description: 'The sandbox, with its new expires_at and remaining_secs.', schema: S.Sandbox } },
    errors: ['sandbox_not_found', 'invalid_state', 'tier_forbidden'],
  },
  {
    operationId: 'setSandboxEgress',
    method: 'PUT',
    path: '/v1/sandboxes/:id/egress',
    summary: "Replace a sandbox's egress policy while it runs or is suspended",
    description:
      "The new policy replaces the old one: a running sandbox's firewall changes at once (connections already open to a destination it " +
      "no longer allows are cut), a suspended one's when it resumes. Never wider than its template's (environment's) policy, and the " +
      "server's blocked ranges stay blocked: 403 egress_forbidden saying why. A sandbox without a network can only be given \"none\".",
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.SetEgressRequest,
    responses: { 200: { description: 'The sandbox, with its new egress.', schema: S.Sandbox } },
    errors: ['sandbox_not_found', 'invalid_state', 'egress_forbidden', 'network_unavailable'],
  },
  {
    operationId: 'deleteSandbox',
    method: 'DELETE',
    path: '/v1/sandboxes/:id',
    summary: 'Delete a sandbox',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    responses: { 204: { description: 'Deleted.' } },
    errors: ['sandbox_not_found'],
  },
  {
    operationId: 'readFile',
    method: 'GET',
    path: '/v1/sandboxes/:id/files',
    summary: 'Download a file from a sandbox',
    description:
      'Streams the file chunk by chunk, whatever its size (up to the server\'s download limit, COLLIMATE_MAX_DOWNLOAD_MIB, default 1 TiB); ' +
      'Content-Length is the size the file had when the read began. A file that shrinks while it is sent ends the response early (the connection is closed); ' +
      'one that grows is sent up to that size; a /proc or /sys file, which states size 0, is read to its end and sent without Content-Length. Errors found before the first byte (no such file, a directory) are JSON errors with their status.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.FileQuery,
    responses: { 200: { description: 'The raw bytes.', contentType: 'application/octet-stream', headers: { 'Content-Length': 'The file\'s size.', 'X-File-Mode': 'Octal permission bits of the file.' } } },
    errors: ['sandbox_not_found', 'invalid_state', 'file_not_found', 'payload_too_large', 'permission_denied'],
  },
  {
    operationId: 'writeFile',
    method: 'PUT',
    path: '/v1/sandboxes/:id/files',
    summary: 'Upload a file into a sandbox',
    description:
      'The request body is the raw file content (any content type), streamed to the guest in chunks: it is written to a temporary name beside the target ' +
      'and renamed over the target only when complete, so a failed or aborted upload leaves no file and the old one untouched. ' +
      'Missing parent directories are created. At most the server\'s upload limit (COLLIMATE_MAX_UPLOAD_MIB, default 1 GiB): larger is 413 payload_too_large. ' +
      'An upload refused part-way (over the limit, a sandbox not running) is answered once the rest of its body has been read and dropped (for up to 30 s), ' +
      'so a client that sends the whole body before it reads the answer gets the error, not a broken connection. ' +
      'The whole body must arrive within the server\'s request timeout (300 s by default).',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.PutFileQuery,
    bodyKind: 'stream',
    responses: { 200: { description: 'Written.', schema: S.PutFileResponse } },
    errors: ['sandbox_not_found', 'invalid_state', 'payload_too_large', 'is_a_directory', 'not_a_directory', 'permission_denied', 'no_space', 'user_not_found'],
  },
  {
    operationId: 'statPath',
    method: 'GET',
    path: '/v1/sandboxes/:id/fs/stat',
    summary: 'Describe a file or directory',
    description: 'The entry at `path` itself: a symlink is described, not followed (its `symlink_target` is given). Answered while an exec runs.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.FsPathQuery,
    responses: { 200: { description: 'The entry.', schema: S.FileEntry } },
    errors: ['sandbox_not_found', 'invalid_state', 'file_not_found', 'not_a_directory', 'permission_denied'],
  },
  {
    operationId: 'listDirectory',
    method: 'GET',
    path: '/v1/sandboxes/:id/fs/list',
    summary: 'List a directory',
    description:
      'Entries sorted by name, each directory\'s entries right after it when `depth` > 1; symlinks are listed, not followed. ' +
      'At most 5000 entries (or 1 MiB of them): `truncated` says more exist. Answered while an exec runs.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.FsListQuery,
    responses: { 200: { description: 'The entries.', schema: S.FsListing } },
    errors: ['sandbox_not_found', 'invalid_state', 'file_not_found', 'not_a_directory', 'permission_denied'],
  },
  {
    operationId: 'pathExists',
    method: 'GET',
    path: '/v1/sandboxes/:id/fs/exists',
    summary: 'Whether anything is at a path',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.FsPathQuery,
    responses: { 200: { description: 'Whether it exists.', schema: S.FsExists } },
    errors: ['sandbox_not_found', 'invalid_state', 'permission_denied'],
  },
  {
    operationId: 'makeDirectory',
    method: 'POST',
    path: '/v1/sandboxes/:id/fs/mkdir',
    summary: 'Make a directory and its parents',
    description: 'Like mkdir -p: every missing level gets `mode` (default 755) exactly. An existing directory is no error (`created` false); a file in the way is 409 file_exists (at the path) or not_a_directory (above it).',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.FsMkdirRequest,
    responses: { 200: { description: 'The directory.', schema: S.FsMkdirResponse } },
    errors: ['sandbox_not_found', 'invalid_state', 'file_exists', 'not_a_directory', 'permission_denied', 'no_space', 'user_not_found'],
  },
  {
    operationId: 'removePath',
    method: 'POST',
    path: '/v1/sandboxes/:id/fs/remove',
    summary: 'Remove a file or a directory tree',
    description: 'A directory is removed with everything in it; symlinks are removed, never followed, and other file systems mounted inside are not entered. Nothing there is 404 file_not_found.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.FsRemoveRequest,
    responses: { 200: { description: 'Removed.', schema: S.FsRemoveResponse } },
    errors: ['sandbox_not_found', 'invalid_state', 'file_not_found', 'not_a_directory', 'permission_denied', 'file_operation_failed'],
  },
  {
    operationId: 'renamePath',
    method: 'POST',
    path: '/v1/sandboxes/:id/fs/rename',
    summary: 'Rename or move a file or directory',
    description:
      'rename(2): atomic, and it replaces a destination file (or an empty directory, with a directory). A missing source or destination directory is 404 file_not_found; ' +
      'a non-empty destination directory 409 directory_not_empty; a file over a directory 409 is_a_directory. Answers the destination\'s entry.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.FsRenameRequest,
    responses: { 200: { description: 'The entry at its new path.', schema: S.FileEntry } },
    errors: ['sandbox_not_found', 'invalid_state', 'file_not_found', 'not_a_directory', 'is_a_directory', 'directory_not_empty', 'permission_denied', 'file_operation_failed'],
  },
  {
    operationId: 'watchDirectory',
    method: 'GET',
    path: '/v1/sandboxes/:id/fs/watch',
    summary: 'Watch a directory for changes (SSE)',
    description:
      'An SSE stream (200 once the watch is set up; errors before that are JSON with their status): `change` events with data ' +
      '{"op": create|write|remove|rename|chmod|overflow, "name": path relative to the directory}, then one `end` event {"reason"} when the watch ends ' +
      'on its own: the directory was removed or moved, the sandbox was suspended or deleted, or the server is shutting down. Closing the connection stops the watch. ' +
      'With recursive=true subdirectories are watched too, those that appear later included. A name moved away is `rename`, the name it arrives as `create`. ' +
      '`overflow`: the guest\'s event queue overflowed and events were lost. At most 32 watches per sandbox (429 too_many_watches). Events flow while an exec runs.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    query: S.FsWatchQuery,
    responses: {
      200: { description: 'Event stream: `change` events (FsChangeEvent), then `end` (FsWatchEndEvent).', contentType: 'text/event-stream', events: [S.FsChangeEvent, S.FsWatchEndEvent] },
    },
    errors: ['sandbox_not_found', 'invalid_state', 'file_not_found', 'not_a_directory', 'too_many_watches', 'permission_denied', 'quota_exceeded'],
  },
  {
    operationId: 'startProcess',
    method: 'POST',
    path: '/v1/sandboxes/:id/processes',
    summary: 'Start a background process in a running sandbox',
    description:
      'Runs beside execs and outlives the request. The start takes its turn in the sandbox\'s operation queue (FIFO, after the execs, ' +
      'file transfers, forks and suspends queued before it) and answers as soon as the process runs; everything else about a process ' +
      '(stdin, signal, resize, output, wait, listing) never waits behind an exec. At most 64 run at once per sandbox (409 too_many_processes). ' +
      'A program that is not found is 400 command_not_found. Processes survive suspend/resume and are in every fork child.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.ProcessStartRequest,
    responses: { 201: { description: 'Running.', schema: S.Process } },
    errors: ['sandbox_not_found', 'invalid_state', 'agent_unavailable', 'too_many_processes', 'command_not_found', 'spawn_failed', 'user_not_found'],
  },
  {
    operationId: 'listProcesses',
    method: 'GET',
    path: '/v1/sandboxes/:id/processes',
    summary: "A sandbox's background processes: running ones and the last 64 that exited",
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    responses: { 200: { description: 'In start order.', schema: S.ProcessList } },
    errors: ['sandbox_not_found'],
  },
  {
    operationId: 'getProcess',
    method: 'GET',
    path: '/v1/sandboxes/:id/processes/:pid',
    summary: 'A background process',
    tag: 'sandboxes',
    auth: true,
    params: sandboxProcess,
    responses: { 200: { description: 'The process.', schema: S.Process } },
    errors: [...PROCESS_ERRORS],
  },
  {
    operationId: 'processOutput',
    method: 'GET',
    path: '/v1/sandboxes/:id/processes/:pid/output',
    summary: "Stream a process's output (SSE): what the server holds, then live, then its exit",
    description:
      'An SSE stream (200 once the process is found): `stdout` / `stderr` / `pty` events with data `{"data": base64, "offset": n}`, ' +
      'a `gap` event `{"from", "to"}` for output the server no longer has (it keeps the last 1 MiB per process; output written while ' +
      'it was not connected, across a server restart, is counted but not kept), then `exit` `{"process": Process}` and the stream ends. ' +
      '`?from=start` (default) replays what is held, `now` only what comes, a number from that offset: reattach with the last offset seen + its length.',
    tag: 'sandboxes',
    auth: true,
    params: sandboxProcess,
    query: S.ProcessOutputQuery,
    sse: true,
    responses: { 200: { description: 'An SSE stream of output events (see description).', schema: S.ProcessOutputEvent } },
    errors: [...PROCESS_ERRORS, 'quota_exceeded'],
  },
  {
    operationId: 'writeProcessStdin',
    method: 'POST',
    path: '/v1/sandboxes/:id/processes/:pid/stdin',
    summary: "Send bytes to a process's stdin, streamed as they arrive",
    description:
      'The request body (any bytes, any length; chunked transfer encoding works) goes to the guest in pieces of 64 KiB as it arrives, ' +
      'each written into the process\'s stdin pipe (or terminal) before the next is read: a process that does not read holds the request. ' +
      'The process must have been started with `stdin: true` or a `pty` (else 409 stdin_closed). Does not close stdin.',
    tag: 'sandboxes',
    auth: true,
    params: sandboxProcess,
    bodyKind: 'stream',
    responses: { 200: { description: 'Written.', schema: S.ProcessStdinResponse } },
    errors: [...PROCESS_ERRORS, 'invalid_state', 'process_exited', 'stdin_closed', 'agent_unavailable'],
  },
  {
    operationId: 'closeProcessStdin',
    method: 'POST',
    path: '/v1/sandboxes/:id/processes/:pid/close-stdin',
    summary: "Close a process's stdin (end of input); on a pty, send the EOF character",
    tag: 'sandboxes',
    auth: true,
    params: sandboxProcess,
    bodyKind: 'json',
    body: S.EmptyQuery,
    bodyOptional: true,
    responses: { 200: { description: 'Closed.', schema: S.Process } },
    errors: [...PROCESS_ERRORS, 'invalid_state', 'process_exited', 'agent_unavailable'],
  },
  {
    operationId: 'signalProcess',
    method: 'POST',
    path: '/v1/sandboxes/:id/processes/:pid/signal',
    summary: "Send a signal to a process's process group",
    tag: 'sandboxes',
    auth: true,
    params: sandboxProcess,
    bodyKind: 'json',
    body: S.ProcessSignalRequest,
    responses: { 200: { description: 'Sent.', schema: S.Process } },
    errors: [...PROCESS_ERRORS, 'invalid_state', 'process_exited', 'agent_unavailable'],
  },
  {
    operationId: 'resizeProcess',
    method: 'POST',
    path: '/v1/sandboxes/:id/processes/:pid/resize',
    summary: "Resize a process's pseudo-terminal",
    tag: 'sandboxes',
    auth: true,
    params: sandboxProcess,
    bodyKind: 'json',
    body: S.ProcessResizeRequest,
    responses: { 200: { description: 'Resized (the process gets SIGWINCH).', schema: S.Process } },
    errors: [...PROCESS_ERRORS, 'invalid_state', 'process_exited', 'not_a_terminal', 'agent_unavailable'],
  },
  {
    operationId: 'waitProcess',
    method: 'POST',
    path: '/v1/sandboxes/:id/processes/:pid/wait',
    summary: 'Wait for a process to exit (long poll)',
    description: 'Answers when the process exits, or after `timeout` seconds with it still `running`: call again.',
    tag: 'sandboxes',
    auth: true,
    params: sandboxProcess,
    bodyKind: 'json',
    body: S.ProcessWaitRequest,
    bodyOptional: true,
    responses: { 200: { description: 'The process: exited, or still running when the timeout passed.', schema: S.Process } },
    errors: [...PROCESS_ERRORS],
  },
  {
    operationId: 'processTerminal',
    method: 'GET',
    path: '/v1/sandboxes/:id/processes/:pid/terminal',
    summary: 'Attach to a PTY process over a WebSocket (the web terminal)',
    description:
      'A WebSocket upgrade; a plain GET answers the process it would attach to (a check before connecting). Browsers cannot set Authorization on a WebSocket: offer the subprotocols ' +
      '`collimate.terminal` and `bearer.<key>`; the server selects `collimate.terminal` (the key is never echoed, and never in the URL). ' +
      'Server → client: binary frames are the terminal\'s output (what the server still holds, then live); a text frame ' +
      '`{"type":"exit","process":Process}` precedes a normal close, `{"type":"error","error":{code,message}}` an abnormal one. ' +
      'Client → server: binary frames are keystrokes, written in order; a text frame `{"type":"resize","cols":N,"rows":N}` resizes. ' +
      'Refusals before the upgrade are ordinary JSON errors: 401, 404 sandbox_not_found / process_not_found, 409 not_a_terminal (started without `pty`). ' +
      'Closing the socket leaves the process running.',
    tag: 'sandboxes',
    auth: true,
    params: sandboxProcess,
    responses: {
      101: { description: 'Switching Protocols: the WebSocket (see description).' },
      200: { description: 'Without Upgrade: the PTY process a WebSocket would attach to.', schema: S.Process },
    },
    errors: [...PROCESS_ERRORS, 'not_a_terminal', 'quota_exceeded'],
  },
  {
    operationId: 'runCode',
    method: 'POST',
    path: '/v1/sandboxes/:id/code',
    summary: 'Run a cell of code in a stateful kernel (the code interpreter)',
    description:
      'Runs `code` in a kernel of the sandbox that keeps its state between cells (variables, imports, loaded data): the language\'s default context, ' +
      'or a `context` made with POST /code/contexts. The python and node templates have their kernel warm from the template; another image with python3 ' +
      '(and ipykernel for Python, node for JavaScript) gets the interpreter started by its first cell (an exec; tens of seconds). Cells of one context run one ' +
      'at a time, in order. Outputs are MIME bundles: the last expression\'s value (`is_main_result`) and every display (a matplotlib figure as image/png with ' +
      'its data as e2b/chart). An exception is the result\'s `error`, not an HTTP error. With `Accept: text/event-stream` the answer streams (see RunCodeRequest); ' +
      'a client that closes the stream interrupts the cell. Needs the sandbox\'s network (the kernels\' server is reached on its port 49999).',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.RunCodeRequest,
    sse: true,
    responses: {
      200: { description: 'The cell\'s result (or an SSE stream, see RunCodeRequest).', schema: S.CodeResult, events: [S.CodeStreamText, S.CodeOutput, S.CodeError, S.CodeResult] },
    },
    errors: [...CODE_ERRORS, 'context_not_found'],
  },
  {
    operationId: 'listCodeContexts',
    method: 'GET',
    path: '/v1/sandboxes/:id/code/contexts',
    summary: "A sandbox's code contexts",
    description: 'Every context of the code interpreter: the default ones (one per language, made by a first cell in it) and those made with POST.',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    responses: { 200: { description: 'The contexts.', schema: S.CodeContextList } },
    errors: [...CODE_ERRORS],
  },
  {
    operationId: 'createCodeContext',
    method: 'POST',
    path: '/v1/sandboxes/:id/code/contexts',
    summary: 'Start a code context: a kernel of its own, with its own state and working directory',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.CreateCodeContext,
    bodyOptional: true,
    responses: { 201: { description: 'The context, its kernel started.', schema: S.CodeContext } },
    errors: [...CODE_ERRORS, 'validation_error'],
  },
  {
    operationId: 'restartCodeContext',
    method: 'POST',
    path: '/v1/sandboxes/:id/code/contexts/:context/restart',
    summary: "Restart a context's kernel: its state is gone, its id and working directory stay",
    tag: 'sandboxes',
    auth: true,
    params: sandboxContext,
    responses: { 200: { description: 'The context, with a fresh kernel.', schema: S.CodeContext } },
    errors: [...CODE_ERRORS, 'context_not_found'],
  },
  {
    operationId: 'interruptCodeContext',
    method: 'POST',
    path: '/v1/sandboxes/:id/code/contexts/:context/interrupt',
    summary: "Interrupt the cell a context runs (its kernel and state stay)",
    description: 'SIGINT to the kernel: a Python cell raises KeyboardInterrupt, a JavaScript one stops its synchronous run. The cell\'s own request then ends with that error. Nothing happens when the context is idle.',
    tag: 'sandboxes',
    auth: true,
    params: sandboxContext,
    responses: { 200: { description: 'The context.', schema: S.CodeContext } },
    errors: [...CODE_ERRORS, 'context_not_found'],
  },
  {
    operationId: 'deleteCodeContext',
    method: 'DELETE',
    path: '/v1/sandboxes/:id/code/contexts/:context',
    summary: 'Stop a context and its kernel',
    tag: 'sandboxes',
    auth: true,
    params: sandboxContext,
    responses: { 204: { description: 'Stopped.' } },
    errors: [...CODE_ERRORS, 'context_not_found'],
  },
  {
    operationId: 'createPortUrl',
    method: 'POST',
    path: '/v1/sandboxes/:id/port-urls',
    summary: 'Sign an expiring URL of a sandbox port that needs no key',
    description:
      'Returns /v1/p/<token>/: the ports proxy of that one port, for anyone holding the URL, until it expires (at most 7 days) ' +
      'or the sandbox is deleted. The token is signed by the server (HMAC-SHA256 under a key in its data directory); ' +
      'it cannot be widened to another port or sandbox. The port need not be open yet.',
    tag: 'ports',
    auth: true,
    params: sandbox,
    bodyKind: 'json',
    body: S.CreatePortUrlRequest,
    responses: { 201: { description: 'Signed.', schema: S.PortUrl } },
    errors: ['sandbox_not_found'],
  },
  {
    operationId: 'rotateSandboxTokens',
    method: 'POST',
    path: '/v1/sandboxes/:id/tokens/rotate',
    summary: "Replace a sandbox's access tokens, ending the ones issued before",
    description:
      "A sandbox's access tokens are what E2B's SDK holds once it has created or connected to it: the envd token (commands and files) " +
      'and the traffic token (its ports only, for a browser). They are issued under the key that asked for them and die when that key is ' +
      'revoked. This makes new ones under the calling key: every token issued before, and every E2B file URL signed with one, stops ' +
      'working on every host at once. Answers the new tokens and their generation (0 for the first tokens, counting up).',
    tag: 'sandboxes',
    auth: true,
    params: sandbox,
    responses: { 200: { description: 'Rotated.', schema: S.SandboxTokens } },
    errors: ['sandbox_not_found'],
  },
  {
    operationId: 'proxyPort',
    method: 'ANY',
    path: '/v1/sandboxes/:id/ports/:port/*',
    summary: 'Reach a port inside the sandbox: HTTP of any method, and WebSocket upgrades',
    description:
      'Streams the request to the server listening on `port` inside the running sandbox (path and query after the port as sent, ' +
      '`/v1/sandboxes/{id}/ports/{port}` alone is `/`) and streams its answer back: status, headers and body as the sandbox sent ' +
      'them. The Authorization header never reaches the sandbox; it sees `Host: localhost:{port}` and X-Forwarded-For, ' +
      '-Proto, -Host and -Prefix (`/v1/sandboxes/{id}/ports/{port}`). A WebSocket upgrade on this path is tunnelled both ways. ' +
      'Errors of the proxy itself carry the header `X-Collimate-Error: <code>`; nothing listening is 502 port_unreachable.',
    tag: 'ports',
    auth: true,
    params: { id: 'sandbox', port: 'port', path: 'path' },
    responses: { 200: { description: "The sandbox server's answer, streamed as it comes (any status, headers and body).", contentType: '*/*' } },
    errors: ['sandbox_not_found', 'invalid_state', 'network_unavailable', 'port_unreachable', 'quota_exceeded'],
  },
  {
    operationId: 'proxySignedPort',
    method: 'ANY',
    path: '/v1/p/:token/*',
    summary: 'Reach a sandbox port through a signed URL, without a key',
    description:
      'Like /v1/sandboxes/{id}/ports/{port}/{path} (HTTP and WebSocket), for the sandbox and port the token was signed for ' +
      '(POST /v1/sandboxes/{id}/port-urls). An expired token is 401 url_expired, an altered one 401 unauthorized, a deleted ' +
      'sandbox 404. An Authorization header that is not a Collimate key is forwarded to the sandbox.',
    tag: 'ports',
    auth: false,
    params: { token: 'token', path: 'path' },
    responses: { 200: { description: "The sandbox server's answer, streamed as it comes (any status, headers and body).", contentType: '*/*' } },
    errors: ['unauthorized', 'url_expired', 'sandbox_not_found', 'invalid_state', 'network_unavailable', 'port_unreachable', 'quota_exceeded'],
  },
  {
    operationId: 'listImages',
    method: 'GET',
    path: '/v1/images',
    summary: 'List catalog images (ready to run on every tier) and your own images',
    tag: 'images',
    auth: true,
    responses: { 200: { description: 'The catalog in `images`, your own images in `own`.', schema: S.ImageList } },
    errors: [],
  },
  {
    operationId: 'createImage',
    method: 'POST',
    path: '/v1/images',
    summary: 'Register your own OCI image (Pro, Enterprise)',
    description:
      'Resolves the source to one linux/amd64 manifest now (a bad reference, credentials, or manifest fail this request), then pulls ' +
      'the layers in the background: each blob is verified against its digest, unpacked (whiteouts, opaque directories, hard links, ' +
      'owners, modes), and stored once by diff id as a read-only erofs layer. Layers already held are not transferred again. ' +
      'Poll GET /v1/images/{id} until `state` is ready or failed. Demo keys get 403 tier_forbidden.',
    tag: 'images',
    auth: true,
    bodyKind: 'json',
    body: S.CreateImageRequest,
    responses: { 202: { description: 'Accepted: pulling (or ready, if nothing was missing).', schema: S.Image } },
    errors: ['tier_forbidden', 'image_not_found', 'image_pull_failed', 'quota_exceeded'],
  },
  {
    operationId: 'getImage',
    method: 'GET',
    path: '/v1/images/:id',
    summary: 'Get one of your images',
    tag: 'images',
    auth: true,
    params: { id: 'image' },
    responses: { 200: { description: 'The image.', schema: S.Image } },
    errors: ['image_not_found'],
  },
  {
    operationId: 'deleteImage',
    method: 'DELETE',
    path: '/v1/images/:id',
    summary: 'Forget one of your images',
    description: 'Refused (409) while an environment uses it. Layers shared with other images stay in the store; the others go once no image, sandbox or process on the host uses them (after COLLIMATE_LAYER_GRACE_SECS).',
    tag: 'images',
    auth: true,
    params: { id: 'image' },
    responses: { 204: { description: 'Deleted.' } },
    errors: ['image_not_found', 'conflict'],
  },
  {
    operationId: 'createEnvironment',
    method: 'POST',
    path: '/v1/environments',
    summary: 'Create an environment: your named configuration of an image, baked into a template (Pro, Enterprise)',
    description:
      'Bakes in the background: boots the image, runs ready_command and ready_probe once, checkpoints. Poll GET ' +
      '/v1/environments/{name} until `state` is ready (then POST /v1/sandboxes with template = name) or failed (see error and log_tail). ' +
      'Secrets are injected into every exec as environment variables and are never returned.',
    tag: 'environments',
    auth: true,
    bodyKind: 'json',
    body: S.CreateEnvironmentRequest,
    responses: { 202: { description: 'Accepted: pending or baking.', schema: S.Environment } },
    errors: ['tier_forbidden', 'image_not_found', 'conflict', 'quota_exceeded'],
  },
  {
    operationId: 'listEnvironments',
    method: 'GET',
    path: '/v1/environments',
    summary: 'List your environments',
    tag: 'environments',
    auth: true,
    responses: { 200: { description: 'Your environments.', schema: S.EnvironmentList } },
    errors: [],
  },
  {
    operationId: 'getEnvironment',
    method: 'GET',
    path: '/v1/environments/:name',
    summary: 'Get an environment',
    tag: 'environments',
    auth: true,
    params: { name: 'environment' },
    responses: { 200: { description: 'The environment.', schema: S.Environment } },
    errors: ['environment_not_found'],
  },
  {
    operationId: 'getEnvironmentLog',
    method: 'GET',
    path: '/v1/environments/:name/log',
    summary: 'The bake log of an environment',
    description:
      'Progress lines (prefixed #) and the output of the ready command and probe; the last 256 KiB. ' +
      'With `Accept: text/event-stream`, the log as it grows while the environment bakes: `log` events `{"text"}` with what was appended ' +
      '(`{"text", "reset": true}`: the whole kept log, when its tail moved on), then `end` `{"state", "error"}` once it is ready or failed (at once if it already is).',
    tag: 'environments',
    auth: true,
    params: { name: 'environment' },
    responses: { 200: { description: 'Plain text.', contentType: 'text/plain; charset=utf-8' } },
    errors: ['environment_not_found'],
  },
  {
    operationId: 'deleteEnvironment',
    method: 'DELETE',
    path: '/v1/environments/:name',
    summary: 'Delete an environment',
    description: 'Its template goes at once; sandboxes already created from it keep running.',
    tag: 'environments',
    auth: true,
    params: { name: 'environment' },
    responses: { 204: { description: 'Deleted.' } },
    errors: ['environment_not_found'],
  },
  {
    operationId: 'listTemplates',
    method: 'GET',
    path: '/v1/templates',
    summary: 'List templates you can create sandboxes from',
    tag: 'templates',
    auth: true,
    responses: { 200: { description: 'Catalog images and your environments.', schema: S.TemplateList } },
    errors: [],
  },
  {
    operationId: 'getTemplate',
    method: 'GET',
    path: '/v1/templates/:id',
    summary: 'Get a template',
    tag: 'templates',
    auth: true,
    params: { id: 'template' },
    responses: { 200: { description: 'The template.', schema: S.Template } },
    errors: ['template_not_found'],
  },
  {
    operationId: 'getUsage',
    method: 'GET',
    path: '/v1/usage',
    summary: "The tenant's metered usage",
    tag: 'usage',
    auth: true,
    query: S.UsageQuery,
    responses: { 200: { description: 'Usage in [from, to).', schema: S.UsageResponse } },
    errors: [],
  },
  {
    operationId: 'streamEvents',
    method: 'GET',
    path: '/v1/events',
    summary: "Stream the tenant's sandbox changes (SSE)",
    description:
      'An SSE stream of `sandbox` events (SandboxEvent), one per change of state once it is persisted: created, forked, suspended, resumed, deleted or lost. ' +
      'Only the tenant\'s own sandboxes. Nothing is replayed: list the sandboxes once the stream is open, then follow it. A comment every 15 s keeps proxies from closing it.',
    tag: 'sandboxes',
    auth: true,
    responses: { 200: { description: 'Event stream: `sandbox` events.', contentType: 'text/event-stream', events: [S.SandboxEvent] } },
    errors: ['quota_exceeded'],
  },
  {
    operationId: 'getLiveStats',
    method: 'GET',
    path: '/v1/stats',
    summary: "Live CPU and memory of the tenant's running sandboxes",
    description: 'One reading of every running sandbox at once (so a list need not ask per row): resident memory now, CPU since the previous reading of this endpoint.',
    tag: 'sandboxes',
    auth: true,
    responses: { 200: { description: 'One entry per running sandbox.', schema: S.LiveStats } },
    errors: [],
  },
  {
    operationId: 'listKeys',
    method: 'GET',
    path: '/v1/keys',
    summary: "List the tenant's API keys",
    description: 'Keys not revoked, oldest first; never the keys themselves, only their prefixes.',
    tag: 'account',
    auth: true,
    responses: { 200: { description: 'The keys.', schema: S.ApiKeyList } },
    errors: [],
  },
  {
    operationId: 'createKey',
    method: 'POST',
    path: '/v1/keys',
    summary: 'Create an API key for the tenant',
    description: 'The new key has the same tenant and tier as the key that asks. The key is in this answer only.',
    tag: 'account',
    auth: true,
    bodyKind: 'json',
    body: S.CreateKeyRequest,
    bodyOptional: true,
    responses: { 201: { description: 'Created.', schema: S.CreatedKey } },
    errors: ['quota_exceeded'],
  },
  {
    operationId: 'revokeKey',
    method: 'DELETE',
    path: '/v1/keys/:id',
    summary: 'Revoke one of the tenant\'s API keys',
    description: 'At once: the key gets 401 unauthorized from then on. A key may revoke itself.',
    tag: 'account',
    auth: true,
    params: { id: 'key' },
    responses: { 204: { description: 'Revoked.' } },
    errors: ['not_found'],
  },
  {
    operationId: 'getLimits',
    method: 'GET',
    path: '/v1/limits',
    summary: "The tier's limits and current concurrency",
    tag: 'account',
    auth: true,
    responses: { 200: { description: 'The limits.', schema: S.Limits } },
    errors: [],
  },
  {
    operationId: 'getOpenApi',
    method: 'GET',
    path: '/v1/openapi.json',
    summary: 'This document',
    tag: 'operations',
    auth: false,
    responses: { 200: { description: 'OpenAPI 3.1.', contentType: 'application/json' } },
    errors: [],
  },
  {
    operationId: 'health',
    method: 'GET',
    path: '/healthz',
    summary: 'Liveness and readiness',
    tag: 'operations',
    auth: false,
    responses: {
      200: { description: 'Ready: catalog templates are warm.', schema: S.Health },
      503: { description: 'Starting or shutting down.', schema: S.Health },
    },
    errors: [],
  },
  {
    operationId: 'metrics',
    method: 'GET',
    path: '/metrics',
    summary: 'Prometheus metrics',
    tag: 'operations',
    auth: false,
    responses: { 200: { description: 'Prometheus text exposition format 0.0.4.', contentType: 'text/plain; version=0.0.4' } },
    errors: [],
  },
] as const satisfies readonly RouteSpec[];

/** The same table, for code that walks every route alike (OpenAPI, the binder, tests). */
export const ROUTES: readonly RouteSpec[] = ROUTE_TABLE;

/**
 * REST's name for an operation an error message points to (errors.ts `see`): its method and path,
 * with the parameters it was called with (`GET /v1/sandboxes/sbx_…/processes`).
 */
export const restNames: DoorNames = ({ op, params }) => {
  const r = ROUTES.find((x) => x.operationId === op);
  return r && `${r.method} ${r.path.replace(/:(\w+)/g, (_, k: string) => params?.[k] ?? `{${k}}`)}`;
};

export function routeById(operationId: string): RouteSpec {
  const r = ROUTES.find((x) => x.operationId === operationId);
  if (!r) throw new Error(`unknown operation ${operationId}`);
  return r;
}

/** Matches a concrete path (no query) against the table's path patterns (a trailing `*` takes the rest). */
export function matchPath(pattern: string, path: string): Record<string, string> | null {
  const p = pattern.split('/');
  const a = path.split('/');
  if (p[p.length - 1] === '*') {
    if (a.length < p.length - 1) return null;
    const rest = a.splice(p.length - 1).join('/');
    const params = matchPath(p.slice(0, -1).join('/'), a.join('/'));
    return params && { ...params, '*': rest };
  }
  if (p.length !== a.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < p.length; i++) {
    if (p[i].startsWith(':')) {
      if (a[i] === '') return null;
      params[p[i].slice(1)] = a[i];
    } else if (p[i] !== a[i]) return null;
  }
  return params;
}

// ---- types of the table, for handlers typed from their route's schemas ----------------------------

export type Route = (typeof ROUTE_TABLE)[number];
export type OperationId = Route['operationId'];
/** The operations the JSON binder serves (the ports proxy binds the `ANY` ones itself). */
export type BoundOperationId = Exclude<Route, { method: 'ANY' }>['operationId'];
export type RouteOf<K extends OperationId> = Extract<Route, { operationId: K }>;
export type BodyOf<R> = R extends { bodyKind: 'raw' } ? Buffer : R extends { bodyKind: 'stream' } ? import('node:http').IncomingMessage : R extends { body: infer B extends z.ZodType } ? z.infer<B> : undefined;
export type QueryOf<R> = R extends { query: infer Q extends z.ZodType } ? z.infer<Q> : Record<string, never>;
export type ParamsOf<R> = R extends { params: infer P } ? { [K in keyof P]: string } : Record<string, never>;
