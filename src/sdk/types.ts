/**
 * Wire types of the SDK, derived from the REST API's zod schemas (src/api/schemas.ts) so the SDK can
 * never drift from the contract. Type-only: the SDK has no runtime dependency on zod.
 */
import type { z } from 'zod';
import type * as S from '../api/schemas.js';

export type SandboxInfo = z.infer<typeof S.Sandbox>;
export type SandboxState = SandboxInfo['state'];
export type Template = z.infer<typeof S.Template>;
export type ExecFile = z.input<typeof S.ExecFile>;

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
