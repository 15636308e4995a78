/**
 * Wire types of the SDK, derived from the REST API's zod schemas (src/wire/schemas.ts) so the SDK can
 * never drift from the contract. Type-only: the SDK has no runtime dependency on zod.
 */
import type { z } from 'zod';
import type * as S from '../wire/schemas.js';

export type SandboxInfo = z.infer<typeof S.Sandbox>;
export type SandboxState = SandboxInfo['state'];
export type Template = z.infer<typeof S.Template>;
export type ExecFile = z.input<typeof S.ExecFile>;
/** `"none"`, `"allow"` or `{ domains?, cidrs?, ports? }`; the server answers with the normalised form. */
export type EgressPolicy = z.input<typeof S.EgressPolicy>;
/** A TCP port a server listens on inside the sandbox; `url` is where the ports proxy serves it (needs the key). */
export type OpenPort = z.infer<typeof S.OpenPort>;
export type PortUrl = z.infer<typeof S.PortUrl>;

/**
 * Exactly one of `command` (a /bin/sh -c string), `code` (run by the template's interpreter) or
 * `commands` (argv lists run in order, stopping at the first failure).
 */
export type ExecRequest = z.input<typeof S.ExecRequest> & {
  /** The exec's CRNG seed (decimal u64), passed through as-is for deterministic replay. */
  seed?: string;
};

export type ExecResult = z.infer<typeof S.ExecResult> & {
  /** The seed the exec ran with, when the server reports one. */
  seed?: string;
};

/** One event of a streamed exec: output chunks (raw bytes, possibly splitting UTF-8), then the result. */
export type ExecEvent =
  | { type: 'stdout'; data: Buffer }
  | { type: 'stderr'; data: Buffer }
  | { type: 'result'; result: ExecResult };

export interface ExecHandlers {
  onStdout?(chunk: Buffer): void;
  onStderr?(chunk: Buffer): void;
}

export interface CreateSandboxParams {
  /** Template or catalog image id (see `client.images()`), e.g. `base`. */
  template: string;
  labels?: Record<string, string>;
  /** Maximum session duration in seconds; default and maximum depend on the tier. */
  timeoutSecs?: number;
  /** Narrows the template's egress policy (wider: EgressForbiddenError). Default: the template's. */
  egress?: EgressPolicy;
}

export interface PortUrlParams {
  /** Lifetime in seconds, 1..604800 (7 days); default 3600. */
  expiresInSecs?: number;
}

export interface ListSandboxesParams {
  state?: SandboxState;
  /** Every label must match. */
  labels?: Record<string, string>;
  /** Page size, 1..1000 (default 100). */
  limit?: number;
}

export interface ForkParams {
  /** Labels for the children (merged over the parent's). */
  labels?: Record<string, string>;
}
