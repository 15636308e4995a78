/**
 * Error rendering shared by every front door: what a client may see of anything thrown (internal
 * causes are logged, never sent), and validation failures as one `validation_error` listing the
 * offending fields. REST renders the result as `{ "error": { "code", "message" } }`, MCP as an
 * `isError` result whose text starts with the code. No HTTP framework here.
 */
import type { z } from 'zod';
import { CollimateError } from '../errors.js';

export interface ErrorLog {
  error: (o: object, msg: string) => void;
  warn?: (o: object, msg: string) => void;
}

/** One validation_error for a failed zod parse; `where` prefixes each path (body, query, arguments). */
export function validationError(where: string, issues: z.core.$ZodIssue[], hint = ' See GET /v1/openapi.json.'): CollimateError {
  const list = issues.slice(0, 20).map((i) => ({
    path: [where, ...i.path.map(String)].join('.'),
    message: i.message,
  }));
  const summary = list.map((i) => `${i.path}: ${i.message}`).join('; ');
  return new CollimateError('validation_error', `Invalid request — ${summary}.${hint}`, { details: { issues: list } });
}

/** Parses `data` with `schema` or throws validationError. */
export function parseWith<T extends z.ZodType>(schema: T, data: unknown, where: string, hint?: string): z.infer<T> {
  const r = schema.safeParse(data);
  if (!r.success) throw validationError(where, r.error.issues, hint);
  return r.data;
}

/** Maps anything thrown to a client-safe CollimateError (logging internal causes). */
export function toClientError(err: unknown, log?: ErrorLog, requestId?: string): CollimateError {
  if (err instanceof CollimateError) {
    // A refusal the client is told to retry (host_at_capacity, shutting_down) is the server doing
    // its job: a warning with what was short, not an error with a stack.
    if (err.status >= 500 && log && err.retryAfterSecs !== undefined) {
      const refusal = [{ code: err.code, details: err.details, retry_after_secs: err.retryAfterSecs }, `refused: ${err.message}`] as const;
      // Called on the logger: a pino method detached from it throws.
      if (log.warn) log.warn(...refusal);
      else log.error(...refusal);
    }
    else if (err.status >= 500 && log) log.error({ err }, `service error ${err.code}`);
    return err;
  }
  const e = err as { statusCode?: number; code?: string; message?: string };
  if (typeof e?.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    // The HTTP framework's own 4xx (body too large, bad content length, bad URL, ...).
    switch (e.statusCode) {
      case 413:
        return new CollimateError('payload_too_large', 'Request body too large. JSON bodies are limited to 16 MiB; PUT /files streams up to the server\'s upload limit (COLLIMATE_MAX_UPLOAD_MIB).');
      case 415:
        return new CollimateError('unsupported_media_type', 'Unsupported Content-Type; send application/json.');
      case 404:
        return new CollimateError('not_found', 'No such endpoint. See GET /v1/openapi.json.');
      default:
        return new CollimateError('validation_error', `Malformed request (${e.code ?? e.statusCode}). See GET /v1/openapi.json.`);
    }
  }
  log?.error({ err }, 'internal error');
  const ref = requestId ? ` (request ${requestId})` : '';
  return new CollimateError('internal_error', `Internal error${ref}; it has been logged. Retry, and report it if it persists.`);
}
