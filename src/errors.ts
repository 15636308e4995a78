/**
 * The one registry of error codes. Every layer throws CollimateError; REST renders
 * `{ "error": { "code", "message" } }` with `status`, MCP returns `isError` with the same code, and the
 * SDKs map codes back to classes. Messages say how to fix the problem; internal causes are logged,
 * never sent.
 */
export const ERROR_CODES = {
  validation_error: 400,
  invalid_json: 400,
  unauthorized: 401,
  url_expired: 401,
  tier_forbidden: 403,
  template_forbidden: 403,
  egress_forbidden: 403,
  origin_forbidden: 403,
  sandbox_not_found: 404,
  template_not_found: 404,
  image_not_found: 404,
  environment_not_found: 404,
  not_found: 404,
  file_not_found: 404,
  process_not_found: 404,
  permission_denied: 403,
  method_not_allowed: 405,
  invalid_state: 409,
  conflict: 409,
  network_unavailable: 409,
  process_exited: 409,
  stdin_closed: 409,
  not_a_terminal: 409,
  too_many_processes: 409,
  command_not_found: 400,
  spawn_failed: 400,
  not_a_directory: 409,
  is_a_directory: 409,
  file_exists: 409,
  directory_not_empty: 409,
  file_changed: 409,
  file_operation_failed: 422,
  payload_too_large: 413,
  unsupported_media_type: 415,
  idempotency_key_reused: 422,
  concurrency_limit: 429,
  rate_limited: 429,
  too_many_watches: 429,
  exec_timeout: 408,
  internal_error: 500,
  agent_unavailable: 502,
  vmm_failed: 502,
  port_unreachable: 502,
  template_not_ready: 503,
  shutting_down: 503,
  host_at_capacity: 503,
  image_pull_failed: 502,
  bake_failed: 500,
  no_space: 507,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

export class CollimateError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  /** Seconds a client should wait before retrying (429/503). */
  readonly retryAfterSecs?: number;
  /** Extra machine-readable detail, safe to send to clients. */
  readonly details?: Record<string, unknown>;

  constructor(code: ErrorCode, message: string, opts: { retryAfterSecs?: number; details?: Record<string, unknown>; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'CollimateError';
    this.code = code;
    this.status = ERROR_CODES[code];
    this.retryAfterSecs = opts.retryAfterSecs;
    this.details = opts.details;
  }

  /** The HTTP headers every door sends with this error, whatever the shape of its body: Retry-After for now. */
  headers(): Record<string, string> {
    return this.retryAfterSecs !== undefined ? { 'retry-after': String(this.retryAfterSecs) } : {};
  }

  toJSON(): { error: { code: ErrorCode; message: string } & Record<string, unknown> } {
    return { error: { code: this.code, message: this.message, ...(this.details ?? {}) } };
  }
}

export function sandboxNotFound(id: string): CollimateError {
  return new CollimateError('sandbox_not_found', `No sandbox with id ${id}. List yours with GET /v1/sandboxes.`);
}

/** A sandbox that ended other than by its tenant's delete (its VM died): not found, saying why. */
export function sandboxEnded(id: string, reason: string): CollimateError {
  return new CollimateError('sandbox_not_found', `Sandbox ${id} no longer exists: ${reason}. Its resources were reclaimed; create or fork a new one.`);
}

/** A create from an environment that is not baked (yet): retry while it bakes, not once it failed. */
export function environmentNotReady(name: string, state: string, error?: string | null): CollimateError {
  return new CollimateError(
    'template_not_ready',
    `Environment ${name} is ${state}${error ? ` (${error})` : ''}; create sandboxes from it once GET /v1/environments/${name} shows state ready.`,
    state === 'failed' ? {} : { retryAfterSecs: 10 },
  );
}

export function invalidState(id: string, state: string, operation: string, allowed: readonly string[]): CollimateError {
  return new CollimateError(
    'invalid_state',
    `Sandbox ${id} is ${state}; ${operation} needs it to be ${allowed.join(' or ')}.` +
      (state === 'suspended' ? ' Resume it first with POST /v1/sandboxes/{id}/resume.' : ''),
    { details: { state } },
  );
}
