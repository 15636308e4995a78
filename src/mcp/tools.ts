/**
 * The MCP tools: each one parses its arguments, makes one call to the tenant service — the same one
 * REST calls, so both doors share every rule and one concurrency cap — and renders the REST view.
 * Results are JSON text plus structuredContent (validated against the REST response schemas);
 * failures are `isError` results whose text starts with the API error code.
 */
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { CollimateError, sandboxNotFound, type DoorNames } from '../errors.js';
import type { TenantService } from '../service/tenantService.js';
import type { Scope } from '../service/types.js';
import { parseWith, toClientError } from '../wire/errors.js';
import * as S from '../wire/schemas.js';
import { execResultView, fileEntryView, sandboxView, snapshotView, templateView } from '../wire/views.js';
import { MAX_FORK_COUNT, type FileChange, type WatchEndReason } from '../sandboxes/types.js';
import { codeResultContent } from './codeContent.js';

export interface ToolContext {
  tenants: TenantService;
  /** The caller, authenticated by the endpoint. */
  scope: Scope;
  /** Scheme, host and port the MCP request reached the server at: absolute URLs start with it. */
  baseUrl: string;
  log?: { error: (o: object, msg: string) => void; warn: (o: object, msg: string) => void };
}

// ---------------------------------------------------------------------------------------------
// Input schemas. Field types and limits come from the REST schemas; descriptions are for agents.

const sandboxId = z.string().max(100).describe('Sandbox id, e.g. sbx_9f2a1c7b3e40 (from create_sandbox, fork_sandbox or list_sandboxes).');
const snapshotId = z.string().max(64).describe('Snapshot id, e.g. snap_4c1d9a0e7b2f3a65 (from snapshot_sandbox or list_snapshots).');
const labels = S.Labels.optional().describe('Key/value labels, e.g. {"task": "t1"}; filter on them with list_sandboxes.');
const E = S.ExecRequest.shape;
const C = S.RunCodeRequest.shape;
const codeContext = S.RunCodeRequest.shape.context.unwrap().describe('A code context id (a UUID, from create_code_context or list_code_contexts).');

export const INPUTS = {
  list_images: z.strictObject({}),
  create_sandbox: z.strictObject({
    template: z.string().min(1).max(128).describe('Catalog image or template id, e.g. "base" (see list_images).'),
    labels,
    timeout_secs: S.CreateSandboxRequest.shape.timeout_secs.describe(
      'Maximum session length in seconds before the sandbox is reaped; default and maximum depend on your tier (demo: 900).',
    ),
    egress: S.CreateSandboxRequest.shape.egress.describe(
      'What the sandbox may reach on the network: "none", "allow" (every public address) or {"domains": ["pypi.org", "*.pythonhosted.org"], "cidrs": [...], "ports": [443]}. ' +
        "Only narrower than the template's policy (default: the template's); wider is egress_forbidden.",
    ),
    on_timeout: S.CreateSandboxRequest.shape.on_timeout.describe(
      'What happens when its session ends: "delete" it, or "suspend" it (resume it later with its memory and processes). Default: the server\'s setting (delete).',
    ),
    auto_resume: S.CreateSandboxRequest.shape.auto_resume.describe(
      'While suspended, an exec, file, process or port request resumes it first instead of failing with invalid_state. Default false.',
    ),
  }),
  exec: z.strictObject({
    sandbox_id: sandboxId,
    command: E.command.describe('A shell string run by /bin/sh -c, e.g. "ls -la /root && echo done".'),
    code: E.code.describe("Source code run by the template's interpreter (sh for base, python3 for python, node for node, bash for debian)."),
    commands: E.commands.describe('argv lists run in order, e.g. [["mkdir","-p","/w"],["ls","/w"]]; the first failure stops the rest.'),
    files: E.files.describe('Files written before the command runs: [{path, content, encoding?: "utf8"|"base64", mode?}].'),
    env: E.env.describe('Extra environment variables.'),
    cwd: E.cwd.describe('Working directory (absolute path).'),
    stdin: E.stdin.describe('Text fed to the command on standard input.'),
    timeout: E.timeout.describe('Seconds before the command is killed (default 60, max 3600); the result then has timed_out: true, exit_code 124.'),
    seed: E.seed.describe('CRNG seed (decimal u64 string). Pass the `seed` a result reported to replay that exec in the same state; absent: a fresh one.'),
    user: E.user.describe('An account of the image to run as, e.g. "user" in the debian image (its uid, HOME and home as the cwd); absent: root.'),
  }),
  fork_sandbox: z.strictObject({
    sandbox_id: sandboxId,
    count: S.ForkRequest.shape.count.describe(`Number of children, 1..${MAX_FORK_COUNT} (default 1). Each counts against your concurrency cap.`),
    labels: S.ForkRequest.shape.labels.describe("Labels for the children, merged over the parent's."),
  }),
  suspend_sandbox: z.strictObject({
    sandbox_id: sandboxId,
    keep_memory: S.SuspendRequest.shape.keep_memory.describe(
      'true (default): keep memory and processes, and resume_sandbox continues them. false: keep only the files (quick); the resume boots it afresh, so processes and /tmp are gone.',
    ),
  }),
  resume_sandbox: z.strictObject({ sandbox_id: sandboxId }),
  set_sandbox_timeout: z.strictObject({
    sandbox_id: sandboxId,
    timeout_secs: S.SetTimeoutRequest.shape.timeout_secs.describe(
      "Seconds from now until the sandbox's session ends (more or less than it has left). The session may not run longer than your tier's maximum (demo: 900 s) from its start.",
    ),
  }),
  delete_sandbox: z.strictObject({ sandbox_id: sandboxId }),
  snapshot_sandbox: z.strictObject({
    sandbox_id: sandboxId,
    name: S.CreateSnapshotRequest.shape.name.describe('A name to show, e.g. "after-setup"; not unique.'),
    labels: S.Labels.optional().describe('Key/value labels; filter on them with list_snapshots.'),
  }),
  list_snapshots: z.strictObject({
    sandbox_id: sandboxId.optional().describe('Only snapshots of this sandbox.'),
    labels: S.Labels.optional().describe('Only snapshots with all of these labels.'),
    after: S.ListSnapshotsQuery.shape.after,
  }),
  start_from_snapshot: z.strictObject({
    snapshot_id: snapshotId,
    count: S.CreateSandboxRequest.shape.count.describe(`How many sandboxes to start, 1..${MAX_FORK_COUNT} (default 1). Each counts against your concurrency cap.`),
    labels,
    timeout_secs: S.CreateSandboxRequest.shape.timeout_secs.describe('Session length in seconds; default your tier\'s, else that of the sandbox the snapshot was taken of.'),
  }),
  restore_sandbox: z.strictObject({ sandbox_id: sandboxId, snapshot_id: snapshotId.describe('A snapshot of this same sandbox (from snapshot_sandbox).') }),
  delete_snapshot: z.strictObject({ snapshot_id: snapshotId }),
  promote_snapshot: z.strictObject({
    snapshot_id: snapshotId,
    environment: S.PromoteSnapshotRequest.shape.environment.describe('The template name to give it (lower-case letters, digits, ".", "_", "-"), or null to take its name away.'),
  }),
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
  list_directory: z.strictObject({
    sandbox_id: sandboxId,
    path: S.FsPath.describe('Directory inside the sandbox: absolute, or relative to /root.'),
    depth: z.number().int().min(1).max(32).optional().describe('Levels to list: 1 (default) its own entries, 2 theirs too, up to 32.'),
  }),
  stat_path: z.strictObject({
    sandbox_id: sandboxId,
    path: S.FsPath.describe('Path inside the sandbox: absolute, or relative to /root.'),
  }),
  path_exists: z.strictObject({
    sandbox_id: sandboxId,
    path: S.FsPath.describe('Path inside the sandbox: absolute, or relative to /root.'),
  }),
  make_directory: z.strictObject({
    sandbox_id: sandboxId,
    path: S.FsPath.describe('Directory to make, with its parents: absolute, or relative to /root.'),
    mode: S.FsMkdirRequest.shape.mode.describe('Octal permission bits, e.g. "750" (default 755).'),
  }),
  remove_path: z.strictObject({
    sandbox_id: sandboxId,
    path: S.FsPath.describe('File or directory to remove (a directory with everything in it).'),
  }),
  rename_path: z.strictObject({
    sandbox_id: sandboxId,
    from: S.FsPath.describe('What to move: absolute, or relative to /root.'),
    to: S.FsPath.describe('Its new path; a file there is replaced.'),
  }),
  watch_directory: z.strictObject({
    sandbox_id: sandboxId,
    path: S.FsPath.describe('Directory to watch: absolute, or relative to /root.'),
    recursive: z.boolean().optional().describe('Watch its subdirectories too (default false).'),
    duration_secs: z.number().min(0.1).max(60).optional().describe('How long to collect changes (default 5, at most 60).'),
    max_events: z.number().int().min(1).max(1000).optional().describe('Return as soon as this many changes were seen (default 100).'),
  }),
  start_process: z.strictObject({
    sandbox_id: sandboxId,
    command: S.ProcessStartRequest.shape.command.describe('A shell string run by /bin/sh -c, e.g. "python3 -m http.server 8000".'),
    argv: S.ProcessStartRequest.shape.argv.describe('Or the program and its arguments, e.g. ["python3", "-u", "agent.py"].'),
    env: S.ProcessStartRequest.shape.env.describe('Extra environment variables.'),
    cwd: S.ProcessStartRequest.shape.cwd.describe('Working directory (absolute path).'),
    stdin: S.ProcessStartRequest.shape.stdin.describe('Keep its standard input open for send_process_input (default: no input).'),
    pty: S.ProcessStartRequest.shape.pty.describe('Run it on a terminal of {cols, rows} (an interactive shell, a REPL); its input is then typed into the terminal.'),
    tag: S.ProcessStartRequest.shape.tag.describe('A label of yours, shown by list_processes.'),
  }),
  list_processes: z.strictObject({ sandbox_id: sandboxId }),
  read_process_output: z.strictObject({
    sandbox_id: sandboxId,
    pid: z.number().int().min(1).describe('The process (from start_process or list_processes).'),
    from: z.number().int().min(0).optional().describe('Offset to read from: the `next` of the previous call (default: the oldest output still held).'),
    max_bytes: z.number().int().min(1).max(1024 * 1024).optional().describe('At most this many bytes (default 65536).'),
    wait_secs: z.number().min(0).max(60).optional().describe('If nothing is there yet, wait up to this long for output or the exit (default 0).'),
  }),
  send_process_input: z.strictObject({
    sandbox_id: sandboxId,
    pid: z.number().int().min(1).describe('The process.'),
    input: z.string().describe('Text written to its standard input (include "\\n" to end a line); may be empty with close_stdin.'),
    close_stdin: z.boolean().optional().describe('Then end its input (on a terminal: ^D).'),
  }),
  signal_process: z.strictObject({
    sandbox_id: sandboxId,
    pid: z.number().int().min(1).describe('The process.'),
    signal: S.ProcessSignalRequest.shape.signal.describe('e.g. "SIGTERM" (ask to stop), "SIGINT" (Ctrl-C), "SIGKILL" (force).'),
  }),
  wait_process: z.strictObject({
    sandbox_id: sandboxId,
    pid: z.number().int().min(1).describe('The process.'),
    timeout_secs: S.ProcessWaitRequest.shape.timeout.describe('Seconds to wait for it to exit (default 30, max 300); it is returned still running if it has not.'),
  }),
  run_code: z.strictObject({
    sandbox_id: sandboxId,
    code: C.code.describe('The cell\'s source, e.g. "import pandas as pd\\ndf = pd.read_csv(\'/root/data.csv\')\\ndf.describe()".'),
    language: C.language.describe('"python" or "javascript": runs in that language\'s default context. Absent (and no context): python where the image has it.'),
    context: codeContext.optional().describe('Run in this context (from create_code_context) instead of the language\'s default one; not with language.'),
    env: C.env.describe('Environment variables for this cell only.'),
    timeout_secs: C.timeout_secs.describe('Seconds before the cell is interrupted (default 300, max 3600); the kernel and its state stay.'),
    seed: C.seed.describe('Reseeds Python\'s random and numpy.random (or JavaScript\'s Math.random) before the cell, as a decimal u64: the same seed in the same state replays the cell.'),
  }),
  list_code_contexts: z.strictObject({ sandbox_id: sandboxId }),
  create_code_context: z.strictObject({
    sandbox_id: sandboxId,
    language: S.CreateCodeContext.shape.language.describe('"python" (default where the image has it) or "javascript".'),
    cwd: S.CreateCodeContext.shape.cwd.describe('Its working directory, which must exist (default the home, /root).'),
  }),
  restart_code_context: z.strictObject({ sandbox_id: sandboxId, context: codeContext }),
  delete_code_context: z.strictObject({ sandbox_id: sandboxId, context: codeContext }),
} as const;

const WatchResult = z.strictObject({
  path: z.string(),
  events: z.array(S.FsChangeEvent),
  ended: S.FsWatchEndEvent.shape.reason.nullable(),
});

const ProcessOutputChunk = z.strictObject({
  pid: z.number().int(),
  status: z.enum(['running', 'exited', 'lost']),
  exit_code: z.number().int().nullable(),
  output: z.string(),
  encoding: z.enum(['utf8', 'base64']),
  from: z.number().int(),
  next: z.number().int(),
  dropped_bytes: z.number().int(),
});
const ProcessInput = z.strictObject({ pid: z.number().int(), written: z.number().int(), stdin_closed: z.boolean() });

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
    'Fork a sandbox into `count` children that keep its memory, running processes and files as of now. A running parent keeps running unchanged (live fork); a suspended one stays suspended and its children start from its snapshot. Use it to try several actions from one prepared state. Returns {sandboxes: [...children]}, all running; each child counts against your cap.',
  suspend_sandbox:
    'Suspend a running sandbox to disk, memory and processes included (or, with keep_memory false, only its files); it stops counting against your concurrency cap. Returns the sandbox with state "suspended". Needs state "running".',
  resume_sandbox:
    'Resume a suspended sandbox exactly where it was (processes keep running); one suspended with only its files (memory_kept false) boots afresh on them. Takes a slot of your concurrency cap. Returns the sandbox with state "running". Needs state "suspended".',
  set_sandbox_timeout:
    'Set how long a running sandbox lives from now: its session then ends (it is deleted, or suspended if the server is set to) at `timeout_secs` from now, sooner or later than before — use it to keep a sandbox you still need, or to let one go early. ' +
    'Returns the sandbox with the new expires_at and remaining_secs. tier_forbidden when the session would run past your tier\'s maximum from its start (the error says how many seconds are left to ask for); needs state "running" (a resume starts a new session).',
  delete_sandbox: 'Delete a sandbox (running or suspended) and everything in it. Irreversible. Returns {id, deleted: true}.',
  snapshot_sandbox:
    'Keep this moment of a sandbox (running or suspended) as a snapshot: its memory, running processes and files. The sandbox runs on. ' +
    'Start any number of new sandboxes from it later (start_from_snapshot) or roll this sandbox back to it (restore_sandbox): "save here, try something, roll back". ' +
    'Returns {id, name, sandbox_id, template, size_bytes, created_at, ...}. Snapshots last until deleted (delete_snapshot) and count against your snapshot quotas.',
  list_snapshots: 'List your snapshots, by id: {snapshots: [{id, name, sandbox_id, labels, size_bytes, created_at, ...}], next}. Pass `next` as `after` for the next page.',
  start_from_snapshot:
    'Start `count` new sandboxes from a snapshot: each runs on from that moment with its memory, processes and files, and its own identity (fresh randomness and boot id). ' +
    'Returns {sandboxes: [...]}, all running; each counts against your concurrency cap.',
  restore_sandbox:
    'Roll a sandbox back, in place (same id), to one of its own snapshots: its memory, processes and files become the snapshot\'s. A running sandbox runs on from there; a suspended one stays suspended. ' +
    'Returns the sandbox. A snapshot of another sandbox is snapshot_mismatch (start a new sandbox from it instead).',
  delete_snapshot: 'Delete a snapshot. Sandboxes started from it run on. Returns {id, deleted: true}.',
  promote_snapshot:
    'Promote a snapshot to an environment: its name becomes a template, and every sandbox created with it (create_sandbox with that template) starts from the snapshot — ' +
    'a prepared state (packages installed, data loaded, a server warm) as the starting point of every new sandbox. Pass null to take the name away. Returns the snapshot with its `environment`.',
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
  list_directory:
    'List a directory in a running sandbox (works while an exec runs). Returns {path, entries: [{name, path, type: file|dir|symlink|other, size, mode, permissions, owner, group, modified_at, ...}], truncated}; at most 5000 entries. not_a_directory / file_not_found otherwise.',
  stat_path:
    'Describe one path in a running sandbox: {name, path, type, size, mode, permissions, uid, gid, owner, group, modified_at, mtime_ns, symlink_target?}. A symlink is described, not followed. file_not_found when nothing is there.',
  path_exists: 'Whether anything (file, directory, symlink) is at a path in a running sandbox. Returns {path, exists}.',
  make_directory:
    'Make a directory and any missing parents (mkdir -p) in a running sandbox. Returns {created, entry}: created is false when it existed already. file_exists when a file is in the way.',
  remove_path:
    'Remove a file, or a directory with everything in it, from a running sandbox (symlinks are removed, not followed). Irreversible. Returns {path, removed}: how many entries went.',
  rename_path: 'Rename or move a file or directory in a running sandbox (replacing a file at the destination). Returns the entry at its new path.',
  watch_directory:
    'Watch a directory in a running sandbox for `duration_secs` (default 5) and return the changes seen: {path, events: [{op: create|write|remove|rename|chmod|overflow, name}], ended}. ' +
    'Start it, then make the changes with exec in another call, or use it to wait for a background job to write its output. `ended` is why the watch stopped early (directory_removed, sandbox_suspended…), else null.',
  start_process:
    'Start a background process in a running sandbox and return at once (a server, a long job, an interactive shell or REPL): exactly one of `command` or `argv`. ' +
    'Returns {pid, status: "running", ...}; use the pid with read_process_output, send_process_input, signal_process and wait_process. It runs beside exec calls and survives suspend/resume and forks. At most 64 at once.',
  list_processes: "List a sandbox's background processes, running and recently exited: {processes: [{pid, argv, tag, status, exit_code, output_bytes, ...}]}.",
  read_process_output:
    'Read what a background process wrote (stdout and stderr, or its terminal, in order) from offset `from`. Returns {output, encoding, next, status, exit_code, dropped_bytes}: pass `next` as `from` to continue. ' +
    '`wait_secs` waits for new output (or the exit) when there is none yet. Output older than the last 1 MiB is dropped (dropped_bytes says how much was skipped).',
  send_process_input: 'Write text to the standard input of a background process started with stdin: true or pty (e.g. a command typed into a shell: "ls\\n"), and optionally close it. Returns {pid, written, stdin_closed}.',
  signal_process: 'Send a signal to a background process and its children (its process group): "SIGTERM" to ask it to stop, "SIGINT" like Ctrl-C, "SIGKILL" to force. Returns the process.',
  wait_process: 'Wait for a background process to exit, up to timeout_secs. Returns the process: status "exited" with exit_code (128+N if killed by signal N), or still "running".',
  run_code:
    'Run a cell of Python or JavaScript in a stateful kernel of a running sandbox, like a notebook: variables, imports and loaded data stay for the next call. ' +
    'Use the "python" template (IPython with numpy, pandas, matplotlib) or "node". The text content is what a notebook shows: stdout, stderr, the last expression\'s value (Out[n]), ' +
    'displays, and an exception\'s name, value and traceback (an exception is the cell\'s result, not a tool error); each plot (plt.show(), a figure as the last value) comes as image content. ' +
    'structuredContent is the full result {context, results: [{is_main_result, data: {mime: value}}], stdout, stderr, error, execution_count, timed_out, duration_ms, seed}, ' +
    'with image data pointing to the image content. Cells of one context run one at a time.',
  list_code_contexts: 'List a sandbox\'s code contexts (kernels): {contexts: [{id, language, cwd}]}: the default one of each language used so far and those made with create_code_context.',
  create_code_context:
    'Start a code context: a kernel of its own with its own variables and working directory, beside the default one. Returns {id, language, cwd}; pass the id to run_code as `context`. ' +
    'Each context is a process holding memory in the sandbox: delete_code_context when done.',
  restart_code_context: 'Restart a code context\'s kernel: its variables and imports are gone (a stuck or broken kernel starts clean), its id and cwd stay. Returns the context.',
  delete_code_context: 'Stop a code context\'s kernel and free its memory. Returns {id, deleted: true}.',
};

function ok(value: Record<string, unknown>): CallToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(value) }], structuredContent: value };
}

/** The tools an error message points to (errors.ts `see`); operations without a tool are left out of the message. */
const TOOL_OF: Partial<Record<string, keyof typeof INPUTS>> = {
  listSandboxes: 'list_sandboxes', suspendSandbox: 'suspend_sandbox', resumeSandbox: 'resume_sandbox', deleteSandbox: 'delete_sandbox',
  listProcesses: 'list_processes', listImages: 'list_images', listTemplates: 'list_images', createPortUrl: 'expose_port',
  listSnapshots: 'list_snapshots', deleteSnapshot: 'delete_snapshot', createSnapshot: 'snapshot_sandbox', createSandbox: 'start_from_snapshot',
  listCodeContexts: 'list_code_contexts', createCodeContext: 'create_code_context',
};
export const mcpNames: DoorNames = ({ op }) => (TOOL_OF[op] ? `the ${TOOL_OF[op]} tool` : undefined);

/** An error result: the text starts with the stable API code, like REST's error.code. */
export function errorResult(err: CollimateError): CallToolResult {
  const extra = err.retryAfterSecs !== undefined ? ` (retry after ${err.retryAfterSecs} s)` : '';
  return { content: [{ type: 'text', text: `${err.code}: ${err.text(mcpNames)}${extra}` }], isError: true };
}

/** Sandbox ids are checked before any call: a malformed one reads as not found, like REST's path check. */
function sandboxIdOf(id: string): string {
  if (!S.SANDBOX_ID_RE.test(id)) throw sandboxNotFound(id.slice(0, 100));
  return id;
}


/** Registers every tool on `server`, bound to one authenticated caller. */
export function registerTools(server: McpServer, ctx: ToolContext): void {
  const { tenants, scope } = ctx;

  const tool = <K extends keyof typeof INPUTS>(
    name: K,
    outputSchema: z.ZodObject | undefined,
    annotations: { readOnlyHint?: boolean; destructiveHint?: boolean; idempotentHint?: boolean },
    run: (args: z.infer<(typeof INPUTS)[K]>, extra: { sendProgress?: (progress: number, message: string) => void }) => Promise<Record<string, unknown>> | Record<string, unknown>,
    /** How the value becomes the result: JSON text and structuredContent unless the tool says otherwise. */
    render: (value: any) => CallToolResult = ok,
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
          return render(await run(args, { sendProgress }));
        } catch (err) {
          return errorResult(toClientError(err, ctx.log));
        }
      }) as any,
    );
  };

  tool('list_images', S.ImageList, { readOnlyHint: true }, () => ({ images: tenants.templates.catalog(scope).map(templateView) }));

  tool('create_sandbox', S.Sandbox, { readOnlyHint: false, destructiveHint: false }, async (a) =>
    sandboxView(await tenants.sandboxes.create(scope, { template: a.template, labels: a.labels, timeoutSecs: a.timeout_secs, egress: a.egress, onTimeout: a.on_timeout, autoResume: a.auto_resume })),
  );

  tool('exec', S.ExecResult, { readOnlyHint: false, destructiveHint: true }, async (a, extra) => {
    const { sandbox_id, ...req } = a;
    const parsed = parseWith(S.ExecRequest, req, 'arguments', '');
    let bytes = 0;
    const progress = extra.sendProgress
      ? (c: Buffer) => {
          bytes += c.length;
          extra.sendProgress!(bytes, c.toString('utf8'));
        }
      : undefined;
    return execResultView(await tenants.sandboxes.exec(scope, sandboxIdOf(sandbox_id), parsed, progress ? { onStdout: progress, onStderr: progress } : undefined));
  });

  tool('fork_sandbox', S.ForkResponse, { readOnlyHint: false, destructiveHint: false }, async (a) => {
    const children = await tenants.sandboxes.fork(scope, sandboxIdOf(a.sandbox_id), { count: a.count ?? 1, labels: a.labels });
    return { sandboxes: children.map(sandboxView) };
  });

  tool('suspend_sandbox', S.Sandbox, { readOnlyHint: false, destructiveHint: false, idempotentHint: false }, async (a) =>
    sandboxView(await tenants.sandboxes.suspend(scope, sandboxIdOf(a.sandbox_id), { keepMemory: a.keep_memory })),
  );

  tool('resume_sandbox', S.Sandbox, { readOnlyHint: false, destructiveHint: false }, async (a) => sandboxView(await tenants.sandboxes.resume(scope, sandboxIdOf(a.sandbox_id))));

  tool('set_sandbox_timeout', S.Sandbox, { readOnlyHint: false, destructiveHint: false, idempotentHint: true }, async (a) =>
    sandboxView(await tenants.sandboxes.setTimeout(scope, sandboxIdOf(a.sandbox_id), a.timeout_secs)),
  );

  tool('delete_sandbox', Deleted, { readOnlyHint: false, destructiveHint: true, idempotentHint: true }, async (a) => {
    await tenants.sandboxes.delete(scope, sandboxIdOf(a.sandbox_id));
    return { id: a.sandbox_id, deleted: true };
  });

  tool('snapshot_sandbox', S.Snapshot, { readOnlyHint: false, destructiveHint: false }, async (a) =>
    snapshotView(await tenants.sandboxes.createSnapshot(scope, sandboxIdOf(a.sandbox_id), { name: a.name, labels: a.labels })),
  );

  tool('list_snapshots', S.SnapshotList, { readOnlyHint: true }, async (a) => {
    const r = await tenants.sandboxes.listSnapshots(scope, { sandboxId: a.sandbox_id, labels: a.labels, after: a.after, limit: 100 });
    return { snapshots: r.snapshots.map(snapshotView), next: r.next };
  });

  tool('start_from_snapshot', S.ForkResponse, { readOnlyHint: false, destructiveHint: false }, async (a) => {
    const started = await tenants.sandboxes.startFromSnapshot(scope, { snapshot: a.snapshot_id, count: a.count ?? 1, labels: a.labels, timeoutSecs: a.timeout_secs });
    return { sandboxes: started.map(sandboxView) };
  });

  tool('restore_sandbox', S.Sandbox, { readOnlyHint: false, destructiveHint: true }, async (a) =>
    sandboxView(await tenants.sandboxes.restore(scope, sandboxIdOf(a.sandbox_id), a.snapshot_id)),
  );

  tool('promote_snapshot', S.Snapshot, { readOnlyHint: false, idempotentHint: true }, async (a) =>
    snapshotView(await tenants.sandboxes.promoteSnapshot(scope, a.snapshot_id, a.environment)),
  );

  tool('delete_snapshot', Deleted, { readOnlyHint: false, destructiveHint: true, idempotentHint: true }, async (a) => {
    await tenants.sandboxes.deleteSnapshot(scope, a.snapshot_id);
    return { id: a.snapshot_id, deleted: true };
  });

  tool('get_sandbox', S.Sandbox, { readOnlyHint: true }, async (a) => sandboxView(await tenants.sandboxes.inspect(scope, sandboxIdOf(a.sandbox_id))));

  tool('expose_port', ExposedPort, { readOnlyHint: false, destructiveHint: false }, async (a) => {
    const info = await tenants.sandboxes.inspect(scope, sandboxIdOf(a.sandbox_id));
    const u = await tenants.sandboxes.portUrl(scope, a.sandbox_id, a.port, a.expires_in_secs);
    return { url: `${ctx.baseUrl}/v1/p/${u.token}/`, port: u.port, expires_at: new Date(u.expiresAt * 1000).toISOString(), listening: info.ports.some((p) => p.port === a.port) };
  });

  tool('list_sandboxes', S.SandboxList, { readOnlyHint: true }, async (a) => {
    for (const k of Object.keys(a.labels ?? {})) {
      if (!S.LABEL_KEY_RE.test(k)) throw new CollimateError('validation_error', `label key ${JSON.stringify(k.slice(0, 100))} must match ${S.LABEL_KEY_RE.source}.`);
    }
    const r = await tenants.sandboxes.list(scope, { state: a.state, labels: a.labels, after: a.after, limit: a.limit ?? 100 });
    return { sandboxes: r.sandboxes.map(sandboxView), next: r.next };
  });

  tool('read_file', FileContent, { readOnlyHint: true }, async (a) => {
    const data = await tenants.sandboxes.readFile(scope, sandboxIdOf(a.sandbox_id), a.path);
    const text = data.toString('utf8');
    const utf8 = Buffer.from(text, 'utf8').equals(data);
    return { path: a.path, size: data.length, encoding: utf8 ? 'utf8' : 'base64', content: utf8 ? text : data.toString('base64') };
  });

  tool('start_process', S.Process, { readOnlyHint: false, destructiveHint: true }, async (a) => {
    const { sandbox_id, ...req } = a;
    return { ...(await tenants.sandboxes.startProcess(scope, sandboxIdOf(sandbox_id), parseWith(S.ProcessStartRequest, req, 'arguments', ''))) };
  });

  tool('list_processes', S.ProcessList, { readOnlyHint: true }, async (a) => ({ processes: await tenants.sandboxes.listProcesses(scope, sandboxIdOf(a.sandbox_id)) }));

  tool('read_process_output', ProcessOutputChunk, { readOnlyHint: true }, async (a) => {
    const id = sandboxIdOf(a.sandbox_id);
    const max = a.max_bytes ?? 64 * 1024;
    const chunks: Buffer[] = [];
    let size = 0;
    let start: number | undefined;
    let next = a.from ?? 0;
    let dropped = 0;
    let wake: (() => void) | undefined;
    const stop = await tenants.sandboxes.watchProcessOutput(scope, id, a.pid, a.from ?? 'start', (e) => {
      if (e.type === 'gap') {
        if (size === 0) { dropped += e.to - e.from; next = e.to; }
      } else if (e.type === 'output' && size < max && e.offset === next) {
        const data = e.data.subarray(0, max - size);
        start ??= e.offset;
        chunks.push(data);
        size += data.length;
        next = e.offset + data.length;
      }
      wake?.();
    });
    try {
      if (size === 0 && a.wait_secs) {
        const info = await tenants.sandboxes.getProcess(scope, id, a.pid);
        if (info.status === 'running') await new Promise<void>((resolve) => { wake = resolve; setTimeout(resolve, a.wait_secs! * 1000); });
      }
    } finally {
      stop();
    }
    const info = await tenants.sandboxes.getProcess(scope, id, a.pid);
    const data = Buffer.concat(chunks, size);
    const text = data.toString('utf8');
    const utf8 = Buffer.from(text, 'utf8').equals(data);
    return {
      pid: a.pid, status: info.status, exit_code: info.exit_code, output: utf8 ? text : data.toString('base64'), encoding: utf8 ? 'utf8' : 'base64',
      from: start ?? next, next, dropped_bytes: dropped,
    };
  });

  tool('send_process_input', ProcessInput, { readOnlyHint: false, destructiveHint: true }, async (a) => {
    const id = sandboxIdOf(a.sandbox_id);
    const data = Buffer.from(a.input, 'utf8');
    const written = data.length ? await tenants.sandboxes.writeProcessStdin(scope, id, a.pid, data) : 0;
    if (a.close_stdin) await tenants.sandboxes.closeProcessStdin(scope, id, a.pid);
    return { pid: a.pid, written, stdin_closed: !!a.close_stdin };
  });

  tool('signal_process', S.Process, { readOnlyHint: false, destructiveHint: true }, async (a) => {
    const id = sandboxIdOf(a.sandbox_id);
    await tenants.sandboxes.signalProcess(scope, id, a.pid, a.signal);
    return { ...(await tenants.sandboxes.getProcess(scope, id, a.pid)) };
  });

  tool('wait_process', S.Process, { readOnlyHint: true }, async (a) => ({ ...(await tenants.sandboxes.waitProcess(scope, sandboxIdOf(a.sandbox_id), a.pid, a.timeout_secs ?? 30)) }));

  tool('write_file', S.PutFileResponse, { readOnlyHint: false, destructiveHint: true, idempotentHint: true }, async (a) => {
    const data = Buffer.from(a.content, a.encoding === 'base64' ? 'base64' : 'utf8');
    await tenants.sandboxes.writeFile(scope, sandboxIdOf(a.sandbox_id), a.path, data, a.mode === undefined ? undefined : parseInt(a.mode, 8));
    return { path: a.path, size: data.length };
  });

  tool('list_directory', S.FsListing, { readOnlyHint: true }, async (a) => {
    const listing = await tenants.sandboxes.fsList(scope, sandboxIdOf(a.sandbox_id), a.path, a.depth ?? 1);
    return { path: a.path, entries: listing.entries.map(fileEntryView), truncated: listing.truncated };
  });

  tool('stat_path', S.FileEntry, { readOnlyHint: true }, async (a) => fileEntryView(await tenants.sandboxes.fsStat(scope, sandboxIdOf(a.sandbox_id), a.path)));

  tool('path_exists', S.FsExists, { readOnlyHint: true }, async (a) => ({ path: a.path, exists: await tenants.sandboxes.fsExists(scope, sandboxIdOf(a.sandbox_id), a.path) }));

  tool('make_directory', S.FsMkdirResponse, { readOnlyHint: false, destructiveHint: false, idempotentHint: true }, async (a) => {
    const made = await tenants.sandboxes.fsMkdir(scope, sandboxIdOf(a.sandbox_id), a.path, { mode: a.mode === undefined ? undefined : parseInt(a.mode, 8) });
    return { created: made.created, entry: fileEntryView(made.entry) };
  });

  tool('remove_path', S.FsRemoveResponse, { readOnlyHint: false, destructiveHint: true, idempotentHint: false }, async (a) => {
    const { removed } = await tenants.sandboxes.fsRemove(scope, sandboxIdOf(a.sandbox_id), a.path);
    return { path: a.path, removed };
  });

  tool('rename_path', S.FileEntry, { readOnlyHint: false, destructiveHint: true }, async (a) =>
    fileEntryView(await tenants.sandboxes.fsRename(scope, sandboxIdOf(a.sandbox_id), a.from, a.to)),
  );

  tool('run_code', S.CodeResult, { readOnlyHint: false, destructiveHint: true }, async (a, extra) => {
    const { sandbox_id, timeout_secs, ...req } = a;
    let chars = 0;
    const progress = extra.sendProgress
      ? (text: string) => {
          chars += text.length;
          extra.sendProgress!(chars, text);
        }
      : undefined;
    const result = await tenants.code.run(scope, sandboxIdOf(sandbox_id), { ...req, timeoutSecs: timeout_secs }, progress ? { onStdout: progress, onStderr: progress } : undefined);
    return { ...result };
  }, codeResultContent);

  tool('list_code_contexts', S.CodeContextList, { readOnlyHint: true }, async (a) => ({ contexts: await tenants.code.contexts(scope, sandboxIdOf(a.sandbox_id)) }));

  tool('create_code_context', S.CodeContext, { readOnlyHint: false, destructiveHint: false }, async (a) => ({
    ...(await tenants.code.createContext(scope, sandboxIdOf(a.sandbox_id), { language: a.language, cwd: a.cwd })),
  }));

  tool('restart_code_context', S.CodeContext, { readOnlyHint: false, destructiveHint: true }, async (a) => ({
    ...(await tenants.code.restartContext(scope, sandboxIdOf(a.sandbox_id), a.context)),
  }));

  tool('delete_code_context', Deleted, { readOnlyHint: false, destructiveHint: true, idempotentHint: true }, async (a) => {
    await tenants.code.deleteContext(scope, sandboxIdOf(a.sandbox_id), a.context);
    return { id: a.context, deleted: true };
  });

  tool('watch_directory', WatchResult, { readOnlyHint: true }, async (a) => {
    const events: FileChange[] = [];
    const max = a.max_events ?? 100;
    let ended: WatchEndReason | null = null;
    let wake = () => {};
    const done = new Promise<void>((resolve) => (wake = resolve));
    const watch = await tenants.sandboxes.fsWatch(scope, sandboxIdOf(a.sandbox_id), a.path, a.recursive ?? false, {
      onChange: (c) => {
        if (events.length < max) events.push(c);
        if (events.length >= max) wake();
      },
      onEnd: (reason) => {
        ended = reason;
        wake();
      },
    });
    const timer = setTimeout(wake, (a.duration_secs ?? 5) * 1000);
    try {
      await done;
    } finally {
      clearTimeout(timer);
      await watch.close();
    }
    return { path: a.path, events, ended };
  });
}
