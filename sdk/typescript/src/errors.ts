/**
 * The SDK's error classes and the ONE mapping from API error codes (src/errors.ts) to them. Every
 * error the SDK throws is a CollimateError carrying the server's stable `code` and HTTP `status`
 * (0 when no HTTP response was involved: connection failures and client-side timeouts).
 */

export interface ErrorInit {
  code: string;
  status: number;
  details?: Record<string, unknown>;
  retryAfter?: number;
  cause?: unknown;
}

export class CollimateError extends Error {
  /** Status used when the error did not come with an HTTP status (an SSE `error` event). */
  static readonly defaultStatus: number = 0;
  readonly code: string;
  readonly status: number;
  /** Extra machine-readable detail from the error body (e.g. `state`, `limit`, `issues`). */
  readonly details: Record<string, unknown>;
  /**
   * Seconds to wait before retrying (from Retry-After), when the server said: a 429 concurrency_limit,
   * or a 503 such as host_at_capacity or shutting_down.
   */
  readonly retryAfter: number | undefined;

  constructor(message: string, init: ErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.status = init.status;
    this.details = init.details ?? {};
    this.retryAfter = init.retryAfter;
  }
}

/** 401: the API key is missing, unknown or revoked. */
export class AuthenticationError extends CollimateError {
  static override readonly defaultStatus = 401;
}

/** 404: no such sandbox, snapshot, template, image, file, process or code context (other tenants' ids read as not found too). */
export class NotFoundError extends CollimateError {
  static override readonly defaultStatus = 404;
}

/** 409: the sandbox is in the wrong state for the operation (e.g. exec on a suspended sandbox). */
export class InvalidStateError extends CollimateError {
  static override readonly defaultStatus = 409;
  /** The sandbox's state when the operation was refused, when the server says. */
  get state(): string | undefined {
    return typeof this.details.state === 'string' ? this.details.state : undefined;
  }
}

/**
 * 409 snapshot_mismatch: a rollback (`sb.restore`) to a snapshot of another sandbox; a sandbox rolls
 * back only to its own. Start a new sandbox from that snapshot instead (`client.sandboxes.fromSnapshot`).
 */
export class SnapshotMismatchError extends InvalidStateError {
  /** The sandbox the snapshot was taken of, when the server says. */
  get snapshotSandboxId(): string | undefined {
    return typeof this.details.snapshot_sandbox_id === 'string' ? this.details.snapshot_sandbox_id : undefined;
  }
}

/**
 * 409 sandbox_restored: the request waited on the sandbox behind a rollback to a snapshot and was not
 * done (the sandbox is now at the snapshot's moment). Send it again if it still applies.
 */
export class SandboxRestoredError extends InvalidStateError {
  /** The snapshot the sandbox was rolled back to, when the server says. */
  get snapshotId(): string | undefined {
    return typeof this.details.snapshot_id === 'string' ? this.details.snapshot_id : undefined;
  }
}

/** 429: the tier's cap on running sandboxes is reached. Suspend or delete one, then retry. */
export class ConcurrencyLimitError extends CollimateError {
  static override readonly defaultStatus = 429;
}

/**
 * 429 quota_exceeded: a per-tenant quota (suspended sandboxes, snapshots, images, environments, open
 * streams, keys) is reached; `quota` names it. Retrying does not help until something is deleted or closed.
 */
export class QuotaExceededError extends CollimateError {
  static override readonly defaultStatus = 429;
  /** Which quota (`suspended_sandboxes`, `suspended_mib`, `snapshots`, `snapshot_mib`, `images`, `environments`, `open_streams`, `keys`). */
  get quota(): string | undefined {
    return typeof this.details.quota === 'string' ? this.details.quota : undefined;
  }
}

/** 400 (and 422 for a reused Idempotency-Key): the request is malformed; `details.issues` says where. */
export class ValidationError extends CollimateError {
  static override readonly defaultStatus = 400;
}

/** 413: a body (file upload, exec files) over the server's limit. */
export class PayloadTooLargeError extends CollimateError {
  static override readonly defaultStatus = 413;
}

/** 403: the tier does not allow this (a session longer than its maximum, a non-catalog template). */
export class TierForbiddenError extends CollimateError {
  static override readonly defaultStatus = 403;
}

/** 403 egress_forbidden: the create asked for an egress policy wider than its template's. */
export class EgressForbiddenError extends TierForbiddenError {}

/** 401 url_expired: a signed port URL past its expiry. */
export class UrlExpiredError extends AuthenticationError {}

/** 409 network_unavailable: the server (or the sandbox's template) has no networking, so ports cannot be reached. */
export class NetworkUnavailableError extends InvalidStateError {}

/**
 * 409 code_unavailable: the sandbox cannot run code cells — its image has no python3 for the code
 * interpreter (use the python or node template), or its interpreter failed or stopped answering
 * (that context's state may be lost). An exception inside a cell is not this: it is the result's `error`.
 */
export class CodeUnavailableError extends InvalidStateError {}

/** 403 permission_denied: the guest refused a file operation (the agent runs as root, so: an immutable file or a read-only mount). */
export class PermissionDeniedError extends CollimateError {
  static override readonly defaultStatus = 403;
}

/**
 * 409: a file operation met something in the way — `file_exists`, `not_a_directory`, `is_a_directory`,
 * `directory_not_empty`, `file_changed` (a file shrank while it was downloaded) — or the guest's file
 * system refused it (`file_operation_failed`, 422). `code` says which.
 */
export class FileConflictError extends CollimateError {
  static override readonly defaultStatus = 409;
}

/** 507 no_space: the sandbox's disk is full; remove files or use a larger disk. */
export class NoSpaceError extends CollimateError {
  static override readonly defaultStatus = 507;
}

/** The client gave up waiting (its own timeout), or the server reported `exec_timeout`. */
export class TimeoutError extends CollimateError {
  static override readonly defaultStatus = 0;
}

/** 5xx: a server or VMM failure. Safe operations were already retried. */
export class ServerError extends CollimateError {
  static override readonly defaultStatus = 500;
}

/** 502 port_unreachable: nothing answers on that port inside the sandbox (start a server there first). */
export class PortUnreachableError extends ServerError {}

/** No HTTP response at all: the server is unreachable or the connection dropped. */
export class ConnectionError extends CollimateError {
  static override readonly defaultStatus = 0;
}

type ErrorClass = { new (message: string, init: ErrorInit): CollimateError; readonly defaultStatus: number };

/**
 * The mapping. Keyed by the server's codes (every code of src/errors.ts; a unit test checks it stays
 * complete); an unknown code falls back to its HTTP status class.
 */
export const ERROR_CLASSES: Record<string, ErrorClass> = {
  validation_error: ValidationError,
  invalid_json: ValidationError,
  unsupported_media_type: ValidationError,
  method_not_allowed: ValidationError,
  idempotency_key_reused: ValidationError,
  unauthorized: AuthenticationError,
  url_expired: UrlExpiredError,
  tier_forbidden: TierForbiddenError,
  template_forbidden: TierForbiddenError,
  origin_forbidden: TierForbiddenError,
  egress_forbidden: EgressForbiddenError,
  sandbox_not_found: NotFoundError,
  template_not_found: NotFoundError,
  image_not_found: NotFoundError,
  environment_not_found: NotFoundError,
  not_found: NotFoundError,
  file_not_found: NotFoundError,
  process_not_found: NotFoundError,
  user_not_found: NotFoundError,
  snapshot_not_found: NotFoundError,
  context_not_found: NotFoundError,
  process_exited: InvalidStateError,
  stdin_closed: InvalidStateError,
  not_a_terminal: InvalidStateError,
  too_many_processes: InvalidStateError,
  command_not_found: ValidationError,
  spawn_failed: ValidationError,
  permission_denied: PermissionDeniedError,
  not_a_directory: FileConflictError,
  is_a_directory: FileConflictError,
  file_exists: FileConflictError,
  directory_not_empty: FileConflictError,
  file_changed: FileConflictError,
  file_operation_failed: FileConflictError,
  too_many_watches: ConcurrencyLimitError,
  no_space: NoSpaceError,
  invalid_state: InvalidStateError,
  conflict: InvalidStateError,
  snapshot_mismatch: SnapshotMismatchError,
  sandbox_restored: SandboxRestoredError,
  network_unavailable: NetworkUnavailableError,
  code_unavailable: CodeUnavailableError,
  payload_too_large: PayloadTooLargeError,
  concurrency_limit: ConcurrencyLimitError,
  quota_exceeded: QuotaExceededError,
  rate_limited: ConcurrencyLimitError,
  exec_timeout: TimeoutError,
  internal_error: ServerError,
  agent_unavailable: ServerError,
  vmm_failed: ServerError,
  port_unreachable: PortUnreachableError,
  template_not_ready: ServerError,
  shutting_down: ServerError,
  host_at_capacity: ServerError,
  image_pull_failed: ServerError,
  bake_failed: ServerError,
};

function classForStatus(status: number): ErrorClass {
  if (status >= 500) return ServerError;
  switch (status) {
    case 400:
    case 405:
    case 415:
    case 422:
      return ValidationError;
    case 401:
      return AuthenticationError;
    case 403:
      return TierForbiddenError;
    case 404:
      return NotFoundError;
    case 408:
      return TimeoutError;
    case 409:
      return InvalidStateError;
    case 413:
      return PayloadTooLargeError;
    case 429:
      return ConcurrencyLimitError;
    default:
      return CollimateError;
  }
}

/**
 * Builds the error for an API error body `{ error: { code, message, ... } }`. `status` is the HTTP
 * status, or undefined when the error arrived inside a 200 SSE stream.
 */
export function errorFromBody(status: number | undefined, body: unknown, retryAfterHeader?: string | null): CollimateError {
  const e = body && typeof body === 'object' ? (body as { error?: unknown }).error : undefined;
  const retryAfter = parseRetryAfter(retryAfterHeader);
  if (e && typeof e === 'object' && typeof (e as { code?: unknown }).code === 'string') {
    const { code, message, ...details } = e as { code: string; message?: unknown } & Record<string, unknown>;
    const cls = ERROR_CLASSES[code] ?? classForStatus(status ?? 0);
    return new cls(typeof message === 'string' ? message : code, { code, status: status ?? cls.defaultStatus, details, retryAfter });
  }
  const s = status ?? 0;
  const text = typeof body === 'string' ? body.slice(0, 200) : '';
  return new (classForStatus(s))(`HTTP ${s}${text ? `: ${text}` : ''}`, { code: 'http_error', status: s, retryAfter });
}

function parseRetryAfter(v: string | null | undefined): number | undefined {
  if (v === null || v === undefined || v === '') return undefined;
  const n = Number(v);
  if (Number.isFinite(n) && n >= 0) return n;
  const t = Date.parse(v);
  return Number.isFinite(t) ? Math.max(0, Math.ceil((t - Date.now()) / 1000)) : undefined;
}
