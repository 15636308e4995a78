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
  user_not_found: 404,
  snapshot_not_found: 404,
  context_not_found: 404,
  permission_denied: 403,
  method_not_allowed: 405,
  invalid_state: 409,
  conflict: 409,
  snapshot_mismatch: 409,
  sandbox_restored: 409,
  network_unavailable: 409,
  code_unavailable: 409,
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
  quota_exceeded: 429,
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

/**
 * An operation a message points its reader to ("list yours with …"), named by its operation id in
 * the REST table (src/api/routes.ts), with the path parameters it is called with. Each door names it
 * its own way: REST by method and path, MCP by its tool, E2B's door by the SDK call.
 */
export interface See { op: string; params?: Record<string, string> }
/** A message's text and the operations it points to, in order. */
export type MessagePart = string | { see: See };
/** How a door names an operation; undefined when it has none, and the pointer is left out. */
export type DoorNames = (s: See) => string | undefined;

/** The pointer to an operation inside a `msg` template: `List yours${see('listSandboxes')}.` */
export function see(op: string, params?: Record<string, string>): { see: See } {
  return { see: params ? { op, params } : { op } };
}

/**
 * A door-neutral message: the values are text, except `see(…)` pointers, which each door renders as
 * " with <its name for the operation>" (nothing where it has none, and in `message`).
 */
export function msg(strings: TemplateStringsArray, ...values: unknown[]): MessagePart[] {
  const parts: MessagePart[] = [strings[0]];
  values.forEach((v, i) => {
    if (v && typeof v === 'object' && 'see' in v) parts.push(v as { see: See });
    else parts.push(String(v));
    parts.push(strings[i + 1]);
  });
  return parts;
}

function render(parts: MessagePart[], names?: DoorNames): string {
  return parts.map((p) => {
    if (typeof p === 'string') return p;
    const name = typeof names === 'function' ? names(p.see) : undefined; // JSON.stringify passes a key
    return name ? ` with ${name}` : '';
  }).join('');
}

export class CollimateError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  /** Seconds a client should wait before retrying (429/503). */
  readonly retryAfterSecs?: number;
  /** Extra machine-readable detail, safe to send to clients. */
  readonly details?: Record<string, unknown>;
  /** The message with its pointers to operations (`msg`); `message` is it without them. */
  readonly parts?: MessagePart[];

  constructor(code: ErrorCode, message: string | MessagePart[], opts: { retryAfterSecs?: number; details?: Record<string, unknown>; cause?: unknown } = {}) {
    super(typeof message === 'string' ? message : render(message), opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'CollimateError';
    this.code = code;
    this.status = ERROR_CODES[code];
    this.retryAfterSecs = opts.retryAfterSecs;
    this.details = opts.details;
    if (typeof message !== 'string') this.parts = message;
  }

  /** The message as a door shows it: the operations it points to named by that door. */
  text(names?: DoorNames): string {
    return this.parts ? render(this.parts, names) : this.message;
  }

  /** The HTTP headers every door sends with this error, whatever the shape of its body: Retry-After for now. */
  headers(): Record<string, string> {
    return this.retryAfterSecs !== undefined ? { 'retry-after': String(this.retryAfterSecs) } : {};
  }

  /** The error body REST (and what shares its shape) sends, with the message as `names` words it. */
  toJSON(names?: DoorNames): { error: { code: ErrorCode; message: string } & Record<string, unknown> } {
    return { error: { code: this.code, message: this.text(names), ...(this.details ?? {}) } };
  }
}

export function sandboxNotFound(id: string): CollimateError {
  return new CollimateError('sandbox_not_found', msg`No sandbox with id ${id}. List yours${see('listSandboxes')}.`);
}

export function snapshotNotFound(id: string): CollimateError {
  return new CollimateError('snapshot_not_found', msg`No snapshot with id ${id}. List yours${see('listSnapshots')}.`);
}

/** A sandbox that ended other than by its tenant's delete (its VM died): not found, saying why. */
export function sandboxEnded(id: string, reason: string): CollimateError {
  return new CollimateError('sandbox_not_found', `Sandbox ${id} no longer exists: ${reason}. Its resources were reclaimed; create or fork a new one.`);
}

/** A create from an environment that is not baked (yet): retry while it bakes, not once it failed. */
export function environmentNotReady(name: string, state: string, error?: string | null): CollimateError {
  return new CollimateError(
    'template_not_ready',
    msg`Environment ${name} is ${state}${error ? ` (${error})` : ''}; create sandboxes from it once it shows state ready (watch it${see('getEnvironment', { name })}).`,
    state === 'failed' ? {} : { retryAfterSecs: 10 },
  );
}

export function invalidState(id: string, state: string, operation: string, allowed: readonly string[]): CollimateError {
  return new CollimateError(
    'invalid_state',
    state === 'suspended'
      ? msg`Sandbox ${id} is ${state}; ${operation} needs it to be ${allowed.join(' or ')}. Resume it first${see('resumeSandbox', { id })}.`
      : `Sandbox ${id} is ${state}; ${operation} needs it to be ${allowed.join(' or ')}.`,
    { details: { state } },
  );
}
