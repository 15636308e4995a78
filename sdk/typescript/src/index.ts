/**
 * The Collimate TypeScript SDK.
 *
 *   const client = new Collimate();                     // COLLIMATE_API_KEY, COLLIMATE_BASE_URL
 *   await using sb = await client.sandboxes.create({ template: 'base' });
 *   const r = await sb.exec({ command: 'echo hi' });
 *   const cell = await sb.runCode('1 + 1');           // a stateful kernel; cell.text === '2'
 */
export { Collimate, Sandboxes, SandboxPages, Snapshots, SnapshotPages, DEFAULT_BASE_URL, type CollimateOptions } from './client.js';
export { Sandbox, SandboxFiles } from './sandbox.js';
export { SandboxProcesses, ProcessHandle } from './processes.js';
export { Execution } from './code.js';
export {
  CollimateError,
  AuthenticationError,
  NotFoundError,
  InvalidStateError,
  SnapshotMismatchError,
  SandboxRestoredError,
  ConcurrencyLimitError,
  QuotaExceededError,
  ValidationError,
  PayloadTooLargeError,
  TierForbiddenError,
  EgressForbiddenError,
  UrlExpiredError,
  NetworkUnavailableError,
  CodeUnavailableError,
  PortUnreachableError,
  PermissionDeniedError,
  FileConflictError,
  NoSpaceError,
  TimeoutError,
  ServerError,
  ConnectionError,
  ERROR_CLASSES,
  errorFromBody,
} from './errors.js';
export type * from './types.js';
