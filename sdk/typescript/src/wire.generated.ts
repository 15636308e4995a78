/**
 * The REST API's wire types, generated from its zod schemas (src/wire/schemas.ts of the server) by
 * sdk/typescript/scripts/wire-types.ts. Do not edit: the package's build writes this file again, and
 * a unit test fails when it differs from what the schemas give.
 */

export type SandboxState = "running" | "suspended" | "deleted";

/** Free-form key/value labels (at most 32; keys ^[A-Za-z0-9][A-Za-z0-9._\/-]{0,62}$, values up to 256 chars). Filter on them with ?label=k=v. */
export type Labels = Record<string, string>;

/** Every error response. 4xx are client mistakes; 5xx never echo internal causes. */
export type Error = {
  error: {
    /** Stable machine-readable code, e.g. sandbox_not_found; see src/errors.ts. */
    code: string;
    /** Human-readable; says how to fix the problem. */
    message: string;
    issues?: Array<{
      path: string;
      message: string;
    }>;
    state?: string;
    limit?: number;
    running?: number;
    [key: string]: unknown;
  };
};

/** What a sandbox may reach. Always blocked unless a listed CIDR names them: link-local and metadata addresses, private, loopback, multicast and reserved ranges; never reachable: the host, the API server and other sandboxes. Addresses a listed domain resolves to are subject to the blocked ranges too. */
export type EgressPolicy = "none" | "allow" | {
  /** Exact names ("api.example.com") or "*.suffix" (any name below suffix, not suffix itself). */
  domains?: string[];
  /** IPv4 "a.b.c.d/n" or bare addresses. */
  cidrs?: string[];
  /** TCP/UDP destination ports for every listed destination (empty or absent: any port). With no domains and no cidrs they apply to every public address. */
  ports?: number[];
} | {
  /** IPv4 "a.b.c.d/n" or bare addresses the sandbox may not reach. */
  deny: string[];
};

/** A TCP port a server listens on inside the sandbox. */
export type OpenPort = {
  port: number;
  protocol: "tcp";
  /** Where the ports proxy serves it, relative to the API base: /v1/sandboxes/{id}/ports/{port}/ (needs your key; see POST …/port-urls for a link that does not). */
  url: string;
};

export type CreatePortUrlRequest = {
  /** The port inside the sandbox. */
  port: number;
  /** Lifetime of the URL in seconds, 1..604800 (7 days); default 3600. */
  expires_in_secs?: number;
};

/** A signed, expiring URL of a sandbox port. */
export type PortUrl = {
  /** Relative to the API base: /v1/p/<token>/. Anyone holding it reaches the port without a key until it expires or the sandbox is deleted. */
  url: string;
  port: number;
  /** ISO 8601. */
  expires_at: string;
};

/** A sandbox's access tokens, issued under the calling key. */
export type SandboxTokens = {
  /** E2B's envdAccessToken (header X-Access-Token): commands and files of this sandbox. */
  envd_access_token: string;
  /** E2B's trafficAccessToken (header e2b-traffic-access-token): this sandbox's ports only. */
  traffic_access_token: string;
  /** Counts the rotations: 0 for the first tokens. */
  generation: number;
};

/** One microVM. */
export type Sandbox = {
  /** Sandbox id, e.g. sbx_9f2a1c7b3e40. */
  id: string;
  template: string;
  state: SandboxState;
  labels: Record<string, string>;
  /** ISO 8601. */
  created_at: string;
  age_secs: number;
  /** Seconds since the last exec finished (or since create). */
  idle_secs: number;
  exec_count: number;
  /** The sandbox this one was live-forked from; null for a template create. */
  parent: string | null;
  forked_at: string | null;
  children: string[];
  /** Session length in seconds: each start (create, fork, resume) sets expires_at this far ahead. */
  timeout_secs: number;
  /** When the current session started (create, fork or resume; for a suspended sandbox, its last one). ISO 8601. The tier's maximum session counts from here. */
  session_started_at: string;
  /** When the session ends: the reaper then deletes the sandbox (or suspends it, as the server is configured). session_started_at + timeout_secs, or as POST /v1/sandboxes/{id}/timeout set it. ISO 8601. */
  expires_at: string;
  /** Seconds until expires_at (0 once past it); null unless running. */
  remaining_secs: number | null;
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  egress: EgressPolicy;
  /** TCP ports a server listens on inside the sandbox, reachable through the ports proxy. GET of one sandbox reads them live; lists show the last reading. */
  ports: OpenPort[];
  /** What happens when the session ends (expires_at): `delete`, or `suspend` (resume it later; with keep_memory, with its memory and processes). */
  on_timeout: "delete" | "suspend";
  /** Whether a suspend keeps its memory and processes (true) or only its files (false: the resume boots the guest afresh from its disk). Applies to the suspend at the session's end and to a suspend that does not say. */
  keep_memory: boolean;
  /** While suspended: true if its memory and processes were kept (a resume continues them), false if only its files were (a resume boots it afresh). Null unless suspended. */
  memory_kept: boolean | null;
  /** While suspended, a request that needs it running (an exec, a file, a process, a port) resumes it first. */
  auto_resume: boolean;
  /** Its ports answer anyone, without a key, traffic token or signed URL (E2B's allowPublicTraffic). */
  public_ports: boolean;
  /** The Host header its servers see through the ports proxy, `${PORT}` replaced by the port; null: `localhost:<port>`. */
  port_host: string | null;
  /** The snapshot it was started from, or last rolled back to; null otherwise. */
  from_snapshot: string | null;
};

/** The sandbox created (with `count`: the first of them, and all of them in `sandboxes`). */
export type CreateSandboxResponse = {
  /** Sandbox id, e.g. sbx_9f2a1c7b3e40. */
  id: string;
  template: string;
  state: SandboxState;
  labels: Record<string, string>;
  /** ISO 8601. */
  created_at: string;
  age_secs: number;
  /** Seconds since the last exec finished (or since create). */
  idle_secs: number;
  exec_count: number;
  /** The sandbox this one was live-forked from; null for a template create. */
  parent: string | null;
  forked_at: string | null;
  children: string[];
  /** Session length in seconds: each start (create, fork, resume) sets expires_at this far ahead. */
  timeout_secs: number;
  /** When the current session started (create, fork or resume; for a suspended sandbox, its last one). ISO 8601. The tier's maximum session counts from here. */
  session_started_at: string;
  /** When the session ends: the reaper then deletes the sandbox (or suspends it, as the server is configured). session_started_at + timeout_secs, or as POST /v1/sandboxes/{id}/timeout set it. ISO 8601. */
  expires_at: string;
  /** Seconds until expires_at (0 once past it); null unless running. */
  remaining_secs: number | null;
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  egress: EgressPolicy;
  /** TCP ports a server listens on inside the sandbox, reachable through the ports proxy. GET of one sandbox reads them live; lists show the last reading. */
  ports: OpenPort[];
  /** What happens when the session ends (expires_at): `delete`, or `suspend` (resume it later; with keep_memory, with its memory and processes). */
  on_timeout: "delete" | "suspend";
  /** Whether a suspend keeps its memory and processes (true) or only its files (false: the resume boots the guest afresh from its disk). Applies to the suspend at the session's end and to a suspend that does not say. */
  keep_memory: boolean;
  /** While suspended: true if its memory and processes were kept (a resume continues them), false if only its files were (a resume boots it afresh). Null unless suspended. */
  memory_kept: boolean | null;
  /** While suspended, a request that needs it running (an exec, a file, a process, a port) resumes it first. */
  auto_resume: boolean;
  /** Its ports answer anyone, without a key, traffic token or signed URL (E2B's allowPublicTraffic). */
  public_ports: boolean;
  /** The Host header its servers see through the ports proxy, `${PORT}` replaced by the port; null: `localhost:<port>`. */
  port_host: string | null;
  /** The snapshot it was started from, or last rolled back to; null otherwise. */
  from_snapshot: string | null;
  /** With `count` in the request (a start from a snapshot): every sandbox started, this one first. Absent otherwise. */
  sandboxes?: Sandbox[];
};

export type CreateSandboxRequest = {
  /** Template (or catalog image) id; see GET /v1/templates. Required unless `snapshot` is given. */
  template?: string;
  /** Start from this snapshot instead of a template: its memory, processes and files, with a fresh identity (as a fork child). Its template, shape and egress policy are the snapshot's (egress may be narrowed). Default session: the tier's, else that of the sandbox it was taken of. */
  snapshot?: string;
  /** With `snapshot`: start this many sandboxes from it, 1..64; the answer lists them all in `sandboxes`. Each counts against the tier cap. */
  count?: number;
  labels?: Labels;
  /** Session length in seconds: the sandbox is reaped this long after each start (create, resume); POST /v1/sandboxes/{id}/timeout moves the end of a running session. Default and maximum depend on the tier (demo 900, pro 86400, enterprise 604800; beyond it: 403 tier_forbidden). */
  timeout_secs?: number;
  /** Narrows the template's egress policy for this sandbox; wider than the template's is 403 egress_forbidden. Default: the template's. */
  egress?: EgressPolicy;
  /** What happens when the session ends: `delete` it, or `suspend` it (it keeps counting against the suspended quotas). Default: the server's COLLIMATE_REAP_ACTION (delete). Forks keep their parent's. */
  on_timeout?: "delete" | "suspend";
  /** Whether a suspend keeps the sandbox's memory and processes (true, the default) or only its files (false): the suspend at the session's end (on_timeout `suspend`) and one that does not say (POST /v1/sandboxes/{id}/suspend). A suspend that keeps only the files is quick and holds no RAM image on disk; its resume boots the guest afresh from its disk (a new boot_id), so its processes, open connections and what lay in /tmp, /run and /dev/shm (memory file systems) are gone. Forks keep their parent's; with `snapshot`, default the snapshot's. */
  keep_memory?: boolean;
  /** While suspended (by a timeout or a suspend), a request that needs it running — an exec, a file, a process, a port — resumes it first instead of answering 409 invalid_state. Default false. */
  auto_resume?: boolean;
  /** Its ports answer anyone through the ports proxy (`/v1/sandboxes/{id}/ports/{port}/…` and `<port>-<id>.<domain>`) without a key, traffic token or signed URL: for webhooks and public demos. Nothing else of the sandbox opens. Default false. Forks and sandboxes started from its snapshots keep it (with `snapshot`, default the snapshot's). */
  public_ports?: boolean;
  /** The Host header its servers see on requests through the ports proxy: hostname[:port], `${PORT}` replaced by the port asked for (e.g. `localhost:${PORT}`, `app.example.com`); not a host shape is 400 validation_error. Default `localhost:<port>`. Forks keep it. */
  port_host?: string;
};

export type SuspendRequest = {
  /** true: keep its memory and processes (a resume continues them); false: keep only its files (quick, no RAM image on disk; the resume boots it afresh from its disk, so processes and the memory file systems /tmp, /run and /dev/shm are gone). Default: the sandbox's keep_memory. */
  keep_memory?: boolean;
};

export type SetEgressRequest = {
  egress: EgressPolicy;
};

export type SetTimeoutRequest = {
  /** End the running session this many seconds from now, earlier or later than before (a lease). It may not end later than the tier's maximum session (demo 900, pro 86400, enterprise 604800 s) after the session started (session_started_at): beyond it is 403 tier_forbidden, whose max_timeout_secs is the longest still allowed. */
  timeout_secs: number;
};

export type SandboxList = {
  sandboxes: Sandbox[];
  /** Cursor for the next page (pass as ?after=), or null on the last page. */
  next: string | null;
};

export type ForkRequest = {
  /** Number of children, 1..64 (default 1). */
  count?: number;
  /** Labels for the children (default: the parent's labels). */
  labels?: Labels;
};

export type ForkResponse = {
  sandboxes: Sandbox[];
};

/** A kept moment of a sandbox: its memory, processes and files. Start sandboxes from it (POST /v1/sandboxes with `snapshot`) or roll its sandbox back to it. */
export type Snapshot = {
  /** Snapshot id, e.g. snap_4c1d9a0e7b2f3a65. */
  id: string;
  name: string | null;
  labels: Record<string, string>;
  /** The sandbox it was taken of: the one sandbox that may roll back to it. */
  sandbox_id: string;
  /** The template or environment that sandbox descends from. */
  template: string;
  /** ISO 8601. */
  created_at: string;
  /** What it occupies on the host's disk: its RAM image (zero pages are holes), device state and disk layer. */
  size_bytes: number;
  vcpus: number;
  memory_mib: number;
  disk_mib: number;
  egress: EgressPolicy;
  /** The name it is promoted under (POST /v1/snapshots/{snapshot}/promote): a template id you create sandboxes from, each started from it; null if none. */
  environment: string | null;
};

export type PromoteSnapshotRequest = {
  /** The template id to promote it under (lower-case letters, digits, ".", "_", "-"; free among the catalog, your environments and your other snapshots); null takes the name away. */
  environment: string | null;
};

export type CreateSnapshotRequest = {
  /** A name to show; not unique. */
  name?: string;
  labels?: Labels;
};

export type SnapshotList = {
  snapshots: Snapshot[];
  /** Cursor for the next page (pass as ?after=), or null on the last page. */
  next: string | null;
};

export type RestoreRequest = {
  /** A snapshot of this sandbox (one of another sandbox is 409 snapshot_mismatch). */
  snapshot: string;
};

/** A file written into the guest before the command runs. */
export type ExecFile = {
  path: string;
  content: string;
  encoding?: "utf8" | "base64";
  /** Permission bits as a number (0o755 = 493); default 0o644. */
  mode?: number;
};

/** Exactly one of command, code, commands. With `Accept: text/event-stream` the response is an SSE stream: `stdout` / `stderr` events carry `{"data": "<base64 of the raw bytes>"}`, then one `result` event carries the ExecResult, or one `error` event carries an Error body. */
export type ExecRequest = {
  /** A shell string, run by /bin/sh -c. */
  command?: string;
  /** Source run by the template's interpreter (python3 for python, node for node, bash for debian, sh for base). */
  code?: string;
  /** argv lists run in order; the first failure stops the rest. */
  commands?: string[][];
  files?: ExecFile[];
  env?: Record<string, string>;
  cwd?: string;
  stdin?: string;
  /** Seconds; default 60, max 3600. */
  timeout?: number;
  /** CRNG seed of the exec: an unsigned 64-bit integer as a decimal string, "0" to "18446744073709551615". Re-running an exec with the seed it reported, in a sandbox in the same state (e.g. a fresh fork of the same parent), replays the randomness of dynamically linked glibc programs (getrandom, /dev/urandom, Python random/os.urandom/uuid4, Node Math.random); OpenSSL-based randomness (e.g. Node crypto.randomBytes), statically linked programs and the kernel CRNG stay truly random. See docs/determinism.md. Absent: the server draws one at random; the result reports it either way. */
  seed?: string;
  /** An account of the sandbox's image (its /etc/passwd) the commands run as: its uid and groups, HOME, USER and LOGNAME, and its home as the default cwd; `files` (and the directories made for them) become its, e.g. "user" in the `debian` image; absent: root. An account the image does not have is 404 user_not_found. */
  user?: string;
};

export type ExecResult = {
  stdout: string;
  stderr: string;
  /** `utf8` when the bytes were valid UTF-8, else `base64`. */
  stdout_encoding: "utf8" | "base64";
  stderr_encoding: "utf8" | "base64";
  exit_code: number;
  timed_out: boolean;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  /** With `commands`: index of the last command that ran. */
  failed_index?: number;
  signal?: number;
  /** The exec was SIGKILLed by the guest kernel's OOM killer (it used more memory than the sandbox has). Absent otherwise. */
  oom_killed?: true;
  /** The exec's processes hit its process limit inside the guest (a fork bomb, or runaway forking): the guest agent killed all of them, background ones included, and `error` says so. Absent otherwise. */
  pids_limited?: true;
  error?: string;
  /** The CRNG seed this exec ran with (the one given, or the one the server drew); pass it back as `seed` to replay it. */
  seed: string;
  timing: {
    queued_at: string;
    started_at: string;
    finished_at: string;
    queued_ms: number;
    run_ms: number;
  };
};

export type ExecChunkEvent = {
  /** Base64 of the raw bytes (chunks may split UTF-8 sequences). */
  data: string;
};

export type PutFileResponse = {
  path: string;
  size: number;
};

/** Exactly one of command, argv. The start takes its turn in the sandbox's operation queue (FIFO, like an exec) and returns once the process runs. */
export type ProcessStartRequest = {
  /** A shell string, run by /bin/sh -c. */
  command?: string;
  /** The program and its arguments; the program is looked up on PATH. */
  argv?: string[];
  env?: Record<string, string>;
  cwd?: string;
  /** Run on a pseudo-terminal of this size (default 80x24): stdout and stderr are then one stream, `pty`, and input is typed into the terminal. */
  pty?: {
    cols?: number;
    rows?: number;
  };
  /** Keep stdin open for POST …/stdin (else it reads /dev/null). A pty always takes input. */
  stdin?: boolean;
  /** A label of yours, listed with the process. */
  tag?: string;
  /** Run seeded, like an exec: user-space randomness from this CRNG seed and address-space randomization off, so the process replays. Absent: not seeded — a server, a shell or a PTY gets the kernel's randomness, and ASLR as the host sets it (COLLIMATE_GUEST_ASLR: on under KVM, off under TCG by default; docs/determinism.md). CRNG seed of the exec: an unsigned 64-bit integer as a decimal string, "0" to "18446744073709551615". Re-running an exec with the seed it reported, in a sandbox in the same state (e.g. a fresh fork of the same parent), replays the randomness of dynamically linked glibc programs (getrandom, /dev/urandom, Python random/os.urandom/uuid4, Node Math.random); OpenSSL-based randomness (e.g. Node crypto.randomBytes), statically linked programs and the kernel CRNG stay truly random. See docs/determinism.md. */
  seed?: string;
  /** An account of the sandbox's image (its /etc/passwd) the process runs as, as for an exec, e.g. "user" in the `debian` image; absent: root. An account the image does not have is 404 user_not_found. */
  user?: string;
};

/** A background process of a sandbox. */
export type Process = {
  /** The guest pid: the handle of the process in every call. */
  pid: number;
  argv: string[];
  cwd: string;
  tag: string | null;
  pty: boolean;
  /** Whether input can be sent now. */
  stdin_open: boolean;
  /** `lost`: it was running when the server last knew, and the guest no longer lists it. */
  status: "running" | "exited" | "lost";
  started_at: string;
  finished_at: string | null;
  /** 128+N if killed by signal N; null while running. */
  exit_code: number | null;
  signal: number | null;
  /** Present when its processes hit the process limit and the guest killed them. */
  pids_limited?: true;
  stdout_bytes: number;
  stderr_bytes: number;
  /** Everything it wrote, all streams: the offset its next output starts at. */
  output_bytes: number;
  /** The output the server holds, as offsets [from, to) (the last 1 MiB per process); earlier bytes are gone. */
  buffered: {
    from: number;
    to: number;
  };
};

export type ProcessList = {
  processes: Process[];
};

/** The data of an output stream's events: `stdout` / `stderr` / `pty` {data, offset}; `gap` {from, to} when output in between was dropped (written while the server was away, or older than what it keeps); `exit` {process} last; `error` an Error body. */
export type ProcessOutputEvent = {
  /** base64 of the bytes (events stdout, stderr, pty). */
  data?: string;
  /** Offset of the first byte in everything the process wrote. */
  offset?: number;
  /** gap: the first offset missing. */
  from?: number;
  /** gap: the offset output resumes at. */
  to?: number;
  process?: Process;
};

export type ProcessStdinResponse = {
  pid: number;
  written: number;
};

export type ProcessSignalRequest = {
  /** A name ("SIGTERM", "INT", "SIGKILL"…) or a number. */
  signal: string | number;
};

export type ProcessResizeRequest = {
  cols: number;
  rows: number;
};

export type ProcessWaitRequest = {
  /** Seconds to wait for the exit (default 30, max 300). */
  timeout?: number;
};

/** One file-system entry as the guest sees it (a symlink itself, not what it points to). */
export type FileEntry = {
  /** Last path component. */
  name: string;
  /** Absolute guest path. */
  path: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  /** Permission bits (mode & 0o7777), e.g. 420 for 0644. */
  mode: number;
  /** The same bits as ls shows them, e.g. rw-r--r--. */
  permissions: string;
  uid: number;
  gid: number;
  /** User name of uid in the guest's /etc/passwd; empty if it has none. */
  owner: string;
  /** Group name of gid in the guest's /etc/group; empty if it has none. */
  group: string;
  /** Modification time, ISO 8601 (ms). */
  modified_at: string;
  /** Modification time in ns since the epoch, as a decimal string. */
  mtime_ns: string;
  /** Symlinks only: the target, as stored. */
  symlink_target?: string;
  /** Its extended attributes of the user.* namespace, by name without `user.` (values as UTF-8 text; at most 4 KiB of them); absent when it has none. */
  xattrs?: Record<string, string>;
};

export type FsListing = {
  path: string;
  entries: FileEntry[];
  /** More entries exist than one listing holds (5000, or 1 MiB of them); list deeper directories separately. */
  truncated: boolean;
};

export type FsExists = {
  path: string;
  exists: boolean;
};

export type FsMkdirRequest = {
  /** Guest path: absolute, or relative to /root. No NUL; at most 4095 bytes. */
  path: string;
  /** Octal permission bits, e.g. 755. */
  mode?: string;
  /** An account of the sandbox's image (its /etc/passwd) whose the directories made become (made by the guest agent, as E2B's envd makes them); a relative path is under its home, e.g. "user" in the `debian` image; absent: root. An account the image does not have is 404 user_not_found. */
  user?: string;
};

export type FsMkdirResponse = {
  /** False when the directory existed already. */
  created: boolean;
  entry: FileEntry;
};

export type FsRemoveRequest = {
  /** Guest path: absolute, or relative to /root. No NUL; at most 4095 bytes. */
  path: string;
};

export type FsRemoveResponse = {
  path: string;
  /** Entries removed (a directory counts with everything in it). */
  removed: number;
};

export type FsRenameRequest = {
  /** Guest path: absolute, or relative to /root. No NUL; at most 4095 bytes. */
  from: string;
  /** Guest path: absolute, or relative to /root. No NUL; at most 4095 bytes. */
  to: string;
};

/** The data of a watch stream's `change` event. */
export type FsChangeEvent = {
  op: "create" | "write" | "remove" | "rename" | "chmod" | "overflow";
  /** Relative to the watched directory (sub/file); empty for the directory itself. */
  name: string;
};

/** The data of a watch stream's last event, `end`. */
export type FsWatchEndEvent = {
  reason: "directory_removed" | "directory_moved" | "sandbox_suspended" | "sandbox_deleted" | "sandbox_lost" | "agent_disconnected" | "shutting_down";
};

export type Template = {
  id: string;
  /** `catalog`: kept warm by the platform; `environment`: your own (Pro); `snapshot`: one of your snapshots promoted under this name (`snapshot_id`): each sandbox created from it starts from the snapshot. */
  kind: "catalog" | "environment" | "snapshot";
  /** With kind `snapshot`: the snapshot it starts sandboxes from. */
  snapshot_id?: string;
  description: string;
  interpreter: string[];
  /** Language runtimes the image carries, by name, with their upstream versions, e.g. `{"node": "24.22.3", "npm": "11.21.2"}`. Empty when none is stated (`base`, environments). */
  runtimes: Record<string, string>;
  ready: boolean;
  vcpus: number;
  memory_mib: number;
};

export type TemplateList = {
  templates: Template[];
};

/** Where the image comes from. */
export type ImageSource = {
  kind: "oci-layout";
  /** An OCI image layout directory on the server, inside its import directory (COLLIMATE_IMPORT_DIR). */
  path: string;
  /** Picks the index entry annotated org.opencontainers.image.ref.name=tag. */
  tag?: string;
} | {
  kind: "archive";
  /** A `docker save` or OCI archive tarball (optionally gzip or zstd) inside the import directory. */
  path: string;
  /** Which image of a multi-image docker save archive (a RepoTag). */
  tag?: string;
} | {
  kind: "registry";
  /** host[:port]/name[:tag][@sha256:…]; docker.io and library/ are the defaults. */
  ref: string;
  username?: string;
  /** Password or token; used for the pull only, never stored. */
  password?: string;
};

export type CreateImageRequest = {
  source: ImageSource;
};

export type ImageLayer = {
  /** Digest of the (compressed) blob. */
  digest: string;
  /** Digest of the uncompressed tar; the layer store key. */
  diff_id: string;
  /** Blob bytes. */
  size: number;
  media_type: string;
  /** Bytes of the stored erofs layer (null until pulled). */
  stored_bytes: number | null;
};

/** One of your images. Its layers live once each in the server's content-addressed layer store. */
export type Image = {
  /** sha256 digest of the image manifest. */
  id: string;
  ref: string;
  source: "oci-layout" | "archive" | "registry";
  /** pulling → ready | failed. */
  state: "pulling" | "ready" | "failed";
  error: string | null;
  progress: string | null;
  layers: ImageLayer[];
  config: {
    env: string[];
    working_dir: string | null;
    user: string | null;
    /** Recorded, not run: sandboxes start from the baked ready state. */
    entrypoint: string[] | null;
    cmd: string[] | null;
  };
  /** E.g. no /bin/sh, or a User that cannot be applied. */
  warnings: string[];
  /** Layer bytes the last pull moved (0 when every layer was already held). */
  transferred_bytes: number;
  /** ISO 8601. */
  created_at: string;
  /** ISO 8601. */
  updated_at: string;
};

export type ImageList = {
  /** Catalog images, ready to run on every tier. */
  images: Template[];
  /** Your own images (Pro and Enterprise); always sent by REST. */
  own?: Image[];
};

export type CreateEnvironmentRequest = {
  /** The template id sandboxes are created with. */
  name: string;
  /** An image id (sha256:…) or the ref it was registered by. */
  image: string;
  description?: string;
  /** argv prefix that runs `code` (default ["/bin/sh", "-c"]). */
  interpreter?: string[];
  /** Shell command run once at bake (as root, with the image Env and WorkingDir); its result is in every sandbox. */
  ready_command?: string;
  /** Shell command that must exit 0 before the checkpoint. */
  ready_probe?: string;
  ready_timeout_secs?: number;
  /** Injected as environment variables into every exec. Write-only: never returned, logged, or stored in plaintext. */
  secrets?: Record<string, string>;
  /** Default 1; at most the tier maximum. */
  vcpus?: number;
  /** Default 256; at most the tier maximum. */
  memory_mib?: number;
  /** The egress policy of its sandboxes (a create may narrow it, never widen it). Default "allow". */
  egress?: EgressPolicy;
};

/** Your named configuration of an image; once ready, its name is a template id for POST /v1/sandboxes. */
export type Environment = {
  name: string;
  image: string;
  /** pending → baking → ready | failed. */
  state: "pending" | "baking" | "ready" | "failed";
  error: string | null;
  progress: string | null;
  /** The last lines of the bake log (GET …/log for all of it). */
  log_tail: string;
  description: string;
  interpreter: string[];
  ready_command: string | null;
  ready_probe: string | null;
  /** Names only; values are write-only. */
  secret_names: string[];
  vcpus: number;
  memory_mib: number;
  egress: EgressPolicy;
  /** ISO 8601. */
  created_at: string;
  /** ISO 8601. */
  updated_at: string;
};

export type EnvironmentList = {
  environments: Environment[];
};

export type UsageTotals = {
  running_secs: number;
  vcpu_secs: number;
  memory_mib_secs: number;
  disk_mib_secs: number;
  suspended_secs: number;
  /** Suspended seconds × snapshot size in MiB. */
  snapshot_mib_secs: number;
};

export type SandboxUsage = {
  id: string;
  template: string;
  running_secs: number;
  vcpu_secs: number;
  memory_mib_secs: number;
  disk_mib_secs: number;
  suspended_secs: number;
  snapshot_mib_secs: number;
};

/** Metered time in [from, to): running seconds × vCPUs / RAM MiB / disk MiB, and suspended seconds × snapshot MiB. */
export type Usage = {
  from: string;
  to: string;
  totals: UsageTotals;
  sandboxes: SandboxUsage[];
  /** With per=day: each UTC day's totals, oldest first; the first and last days clipped to [from, to). */
  days?: Array<{
    from: string;
    to: string;
    totals: UsageTotals;
  }>;
};

export type ExecLogEntry = {
  /** What ran, on one line (at most 200 characters): the command, the first line of `code` as `[code] …`, or the argv lists joined by &&. Never stdin, files or env. */
  command: string;
  exit_code: number;
  timed_out: boolean;
  /** From the request reaching the service to the result, queueing included. */
  duration_ms: number;
  /** ISO 8601. */
  started_at: string;
};

export type ExecLogList = {
  execs: ExecLogEntry[];
};

/** A sandbox's resource use over time, oldest first: sampled while it runs on the host that runs it, kept for its life (its last 12 hours), gone with it and with a server restart. */
export type SandboxMetrics = {
  /** How often a running sandbox is sampled. */
  period_secs: number;
  /** How often its disk use is read in the guest; the samples between carry the last reading. */
  disk_period_secs: number;
  samples: Array<{
    /** ISO 8601. */
    at: string;
    /** Of its vCPUs together since the sample before (100 = one vCPU busy); null for the first. */
    cpu_percent: number | null;
    /** Its VMM's resident memory. */
    memory_mib: number;
    /** Used on its root file system, as `df /` in the sandbox says (the last reading); null before the first reading, or if its guest cannot tell. */
    disk_used_bytes: number | null;
    /** The size of its root file system (`df /`); null when disk_used_bytes is. */
    disk_total_bytes: number | null;
  }>;
};

/** Severity, least first: debug, info, warn, error. */
export type LogLevel = "debug" | "info" | "warn" | "error";

export type SandboxLogEntry = {
  /** ISO 8601. */
  timestamp: string;
  level: LogLevel;
  /** What happened, for people, e.g. `Exec exited 0 in 12 ms: echo hi`. */
  message: string;
  /** The same for programs: `event` (lifecycle, exec, process, reaper, snapshot) and what it has — `op` and `state`; `command`, `exit_code`, `duration_ms`, `timed_out`; `pid`, `status`, `signal`; `error_code`… */
  fields: Record<string, string>;
};

/** What happened to a sandbox, kept where it runs (its last 1000 entries, across restarts, gone with it): lifecycle changes, execs (a one-line summary of the command, never stdin, env or files), background processes' starts and exits, the reaper's action, snapshots taken and failures of the guest. */
export type SandboxLogs = {
  logs: SandboxLogEntry[];
};

/** Live use of the host by each running sandbox. */
export type LiveStats = {
  sandboxes: Array<{
    /** Sandbox id, e.g. sbx_9f2a1c7b3e40. */
    id: string;
    /** The sandbox's VMM's CPU use since the previous reading, in % of one core; null on the first reading. */
    cpu_percent: number | null;
    /** Host memory the sandbox's VMM holds now (resident set). */
    memory_mib: number;
  }>;
};

export type ApiKey = {
  /** Key id (key_…): what DELETE /v1/keys/{id} takes. The key itself is shown once, when created. */
  id: string;
  /** The first 12 characters of the key, to tell keys apart. */
  prefix: string;
  name: string | null;
  /** ISO 8601. */
  created_at: string;
  /** Updated at most once a minute. */
  last_used_at: string | null;
};

export type ApiKeyList = {
  keys: ApiKey[];
};

export type CreateKeyRequest = {
  /** A name to recognise the key by. */
  name?: string;
};

export type CreatedKey = {
  /** The new key (clm_…). Shown only in this answer; store it now. */
  key: string;
  record: ApiKey;
};

/** The tier's limits, its quotas and current use. */
export type Limits = {
  tier: string;
  /** Running sandboxes at once (suspended ones do not count); null: no cap. */
  max_running: number | null;
  /** Running now. */
  running: number;
  /** May bake environments from its own images. */
  own_images: boolean;
  max_session_secs: number;
  default_session_secs: number | null;
  max_vcpus: number;
  max_memory_mib: number;
  /** Each quota with its limit and your use now. suspended_sandboxes; suspended_mib (each suspended sandbox at its memory plus disk size); snapshots; snapshot_mib (each snapshot at its memory size, the most its RAM image takes, plus what its files take beyond that); images; environments; open_streams (event streams, watches, process and terminal streams, E2B streams and port connections open on this host); keys (not revoked). Going past one is 429 quota_exceeded with details.quota naming it. */
  quotas: {
    suspended_sandboxes: {
      /** null: no limit. */
      limit: number | null;
      used: number;
    };
    suspended_mib: {
      /** null: no limit. */
      limit: number | null;
      used: number;
    };
    snapshots: {
      /** null: no limit. */
      limit: number | null;
      used: number;
    };
    snapshot_mib: {
      /** null: no limit. */
      limit: number | null;
      used: number;
    };
    images: {
      /** null: no limit. */
      limit: number | null;
      used: number;
    };
    environments: {
      /** null: no limit. */
      limit: number | null;
      used: number;
    };
    open_streams: {
      /** null: no limit. */
      limit: number | null;
      used: number;
    };
    keys: {
      /** null: no limit. */
      limit: number | null;
      used: number;
    };
  };
};

/** The data of a `sandbox` event on GET /v1/events. */
export type SandboxEvent = {
  /** Sandbox id, e.g. sbx_9f2a1c7b3e40. */
  sandbox_id: string;
  /** What happened; `lost`: the sandbox ended on its own (its VMM died, or it could not be restored); `move`: an operator moved it, suspended, to another cluster host (`deleted` from the host it left, then `suspended` on the one it reached); `restore`: it was rolled back to one of its snapshots. */
  op: "create" | "fork" | "suspend" | "resume" | "delete" | "lost" | "move" | "restore";
  state: SandboxState;
  /** ISO 8601. */
  at: string;
};

export type Health = {
  status: "ok" | "starting" | "shutting_down";
  accel: string;
  templates_ready: boolean;
  /** `development` without KVM (TCG): QEMU does not treat TCG guest escapes as security bugs, so guests are not a security boundary. */
  mode?: "development" | "production";
  isolation?: string;
  /** Whether VMM processes run confined (own uid, no capabilities, private mount view) and which cgroup layout limits them. */
  confinement?: {
    enabled: boolean;
    cgroups?: string;
    reason?: string;
  };
  /** Whether sandboxes get a network namespace and NIC (docs/networking.md); off when the server is not root or COLLIMATE_NET=off. */
  network?: {
    enabled: boolean;
    reason?: string;
  };
  /** Warm pools: VMMs ready, the size each pool holds now and why (it follows demand, within COLLIMATE_POOL_MIN/MAX and COLLIMATE_POOL_MEMORY_MIB). Catalog templates by id; tenants' environments summed under `environments`. */
  pools?: Record<string, {
    ready: number;
    target: number;
    reason: string;
  }>;
  /** Admission by what the host has: a create, fork or resume that would take MemAvailable below the reserve, the running sandboxes' guest memory past limit_mib (COLLIMATE_HOST_MEMORY_MIB), or that arrives while CPU pressure (% of the last 10 s some task waited for a CPU) is at max; an operation that would leave less than the reserve free on the RAM files' tmpfs (a fork point, a resumed sandbox's RAM: up to its guest memory; COLLIMATE_TMPFS_RESERVE_MIB) or on the home's disk (a suspend's image; COLLIMATE_DISK_RESERVE_MIB); or one that starts more VMMs than VMM uids (COLLIMATE_VMM_UID_COUNT) or network indexes (COLLIMATE_NET_TRANSIT) are free: each gets 503 host_at_capacity with Retry-After, its details naming the resource. refusals counts them since start, by resource. */
  capacity?: {
    memory: {
      available_mib: number;
      reserve_mib: number;
      committed_mib: number;
      limit_mib: number | null;
      starting_mib: number;
    };
    cpu: {
      pressure: number | null;
      max: number | null;
    };
    tmpfs: {
      path: string;
      free_mib: number;
      reserve_mib: number;
      starting_mib: number;
    };
    disk: {
      path: string;
      free_mib: number;
      reserve_mib: number;
      starting_mib: number;
    };
    claims: {
      vmm_uids?: {
        free: number;
        total: number;
      };
      net_indexes?: {
        free: number;
        total: number;
      };
    };
    refusals: {
      memory: number;
      cpu: number;
      tmpfs: number;
      disk: number;
      vmm_uids: number;
      net_indexes: number;
    };
  };
  /** Catalog templates still being built: a first start with an empty cache serves once `base` is ready and builds the others (python, node, debian) in the background, one at a time; `building` names each with the step it is at and the seconds since its build began, `failed` each whose build failed with why. A create of one of them is 503 template_not_ready with Retry-After (a failed one is built again by it). Both empty once every catalog template is ready. */
  catalog?: {
    building: Record<string, {
      step: string;
      secs: number;
    }>;
    failed: Record<string, string>;
  };
  /** Cluster mode only (docs/cluster.md): this host's id and advertised address, the running sandboxes it takes at most (0: an API-only node), and whether it holds its lease (false: it takes no create, fork or resume until a heartbeat succeeds). */
  cluster?: {
    host_id: string;
    address: string;
    capacity: number;
    lease: boolean;
  };
};

/** With `Accept: text/event-stream` the answer is an SSE stream: `stdout` / `stderr` `{"text"}` as the cell prints, `display` (a CodeOutput) for each display and the last value as it comes, `exception` (a CodeError), then one `result` with the CodeResult, or one `error` with an Error body. */
export type RunCodeRequest = {
  /** The cell's source. */
  code: string;
  /** The kernel's language, `python` (IPython) or `javascript` (Node.js). Runs in that language's default context (made on first use). Absent (and no context): the image's first kernel, python where there is one. */
  language?: "python" | "javascript";
  /** A context made with POST /v1/sandboxes/{id}/code/contexts; not with language. */
  context?: string;
  /** Environment variables for this cell only (set before it, removed after). */
  env?: Record<string, string>;
  /** Seconds the cell may run before it is interrupted (timed_out in the result); default 300, max 3600. */
  timeout_secs?: number;
  /** Reseeds the language's own generators before the cell, as a decimal u64: Python's random and numpy.random's global state (when numpy is loaded), JavaScript's Math.random. The same seed in the same kernel state replays the cell. Absent: the generators go on as they are. See docs/code.md. */
  seed?: string;
};

export type CodeOutput = {
  /** True for the value of the cell's last expression; false for a display (a shown figure, display()). */
  is_main_result: boolean;
  /** A MIME bundle: text/plain always, and what the value renders as (image/png and image/svg+xml base64/text, text/html, application/json, text/latex, text/markdown, e2b/chart for a matplotlib figure's data). */
  data: Record<string, unknown>;
};

/** An exception the cell raised: its class, message and traceback. */
export type CodeError = {
  name: string;
  value: string;
  /** Plain text (no terminal colours). */
  traceback: string;
};

export type CodeResult = {
  /** The context the cell ran in. */
  context: string | null;
  results: CodeOutput[];
  stdout: string;
  stderr: string;
  error: CodeError | null;
  /** The context's cell counter (IPython's In [n]). */
  execution_count: number | null;
  /** The cell ran past timeout_secs and was interrupted; error is then the interruption. */
  timed_out: boolean;
  duration_ms: number;
  /** The seed given, or null. */
  seed: string | null;
};

/** A kernel with its own state and working directory. */
export type CodeContext = {
  id: string;
  language: string;
  cwd: string;
};

export type CodeContextList = {
  contexts: CodeContext[];
};

export type CreateCodeContext = {
  /** The kernel's language, `python` (IPython) or `javascript` (Node.js). Default: the image's first kernel, python where there is one. */
  language?: "python" | "javascript";
  /** Its working directory (must exist); default the home (/root, or /home/user where there is one). */
  cwd?: string;
};
