import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { ERROR_CODES } from '../../../src/errors.js';
import {
  AuthenticationError,
  CollimateError,
  ConcurrencyLimitError,
  ERROR_CLASSES,
  errorFromBody,
  InvalidStateError,
  NotFoundError,
  PayloadTooLargeError,
  QuotaExceededError,
  SandboxRestoredError,
  ServerError,
  SnapshotMismatchError,
  TierForbiddenError,
  ValidationError,
} from '../../../src/sdk/index.js';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));

test('the TS mapping covers every server error code, keeping code and status', () => {
  for (const [code, status] of Object.entries(ERROR_CODES)) {
    assert.ok(ERROR_CLASSES[code], `no SDK class for ${code}`);
    const e = errorFromBody(status, { error: { code, message: 'm', state: 'suspended' } });
    assert.ok(e instanceof ERROR_CLASSES[code]);
    assert.ok(e instanceof CollimateError);
    assert.equal(e.code, code);
    assert.equal(e.status, status);
    assert.equal(e.message, 'm');
    assert.equal(e.details.state, 'suspended');
  }
});

test('the classes the issue names, by status', () => {
  const cases: Array<[string, number, Function]> = [
    ['unauthorized', 401, AuthenticationError],
    ['sandbox_not_found', 404, NotFoundError],
    ['invalid_state', 409, InvalidStateError],
    ['concurrency_limit', 429, ConcurrencyLimitError],
    ['validation_error', 400, ValidationError],
    ['payload_too_large', 413, PayloadTooLargeError],
    ['tier_forbidden', 403, TierForbiddenError],
    ['internal_error', 500, ServerError],
    ['vmm_failed', 502, ServerError],
  ];
  for (const [code, status, cls] of cases) assert.ok(errorFromBody(status, { error: { code, message: '' } }) instanceof cls, code);
  const limit = errorFromBody(429, { error: { code: 'concurrency_limit', message: 'full', limit: 2 } }, '5');
  assert.ok(limit instanceof ConcurrencyLimitError);
  assert.equal(limit.retryAfter, 5);
  assert.equal(limit.details.limit, 2);
  // A 503 says when to come back too (host_at_capacity, shutting_down), as the Python SDK's retry_after does.
  const full = errorFromBody(503, { error: { code: 'host_at_capacity', message: 'tmpfs', resource: 'tmpfs' } }, '10');
  assert.ok(full instanceof ServerError);
  assert.equal(full.retryAfter, 10);
  assert.equal(full.details.resource, 'tmpfs');
  // Unknown codes fall back to their status; bodies that are not the error shape too.
  assert.ok(errorFromBody(404, { error: { code: 'brand_new_code', message: '' } }) instanceof NotFoundError);
  assert.ok(errorFromBody(503, '<html>bad gateway</html>') instanceof ServerError);
  // SSE `error` events have no status: the class's own.
  assert.equal(errorFromBody(undefined, { error: { code: 'invalid_state', message: '' } }).status, 409);
});

test('the snapshot codes: a missing snapshot is not found; a mismatch and a request dropped by a rollback are 409s saying which snapshot', () => {
  assert.ok(errorFromBody(404, { error: { code: 'snapshot_not_found', message: '' } }) instanceof NotFoundError);
  const mismatch = errorFromBody(409, { error: { code: 'snapshot_mismatch', message: 'm', snapshot_sandbox_id: 'sbx_0123456789ab' } });
  assert.ok(mismatch instanceof SnapshotMismatchError && mismatch instanceof InvalidStateError);
  assert.equal(mismatch.snapshotSandboxId, 'sbx_0123456789ab');
  const restored = errorFromBody(409, { error: { code: 'sandbox_restored', message: 'm', snapshot_id: 'snap_0123456789abcdef' } });
  assert.ok(restored instanceof SandboxRestoredError && restored instanceof InvalidStateError && !(restored instanceof SnapshotMismatchError));
  assert.equal(restored.snapshotId, 'snap_0123456789abcdef');
  const quota = errorFromBody(429, { error: { code: 'quota_exceeded', message: 'm', quota: 'snapshot_mib', limit: 4096 } });
  assert.ok(quota instanceof QuotaExceededError);
  assert.equal(quota.quota, 'snapshot_mib');
  const py = execFileSync(
    '/usr/bin/python3',
    ['-c', [
      'import collimate',
      "m = collimate.error_from_body(409, {'error': {'code': 'snapshot_mismatch', 'message': 'm', 'snapshot_sandbox_id': 'sbx_0123456789ab'}})",
      "r = collimate.error_from_body(409, {'error': {'code': 'sandbox_restored', 'message': 'm', 'snapshot_id': 'snap_0123456789abcdef'}})",
      'print(isinstance(m, collimate.InvalidStateError), m.snapshot_sandbox_id, isinstance(r, collimate.InvalidStateError), r.snapshot_id)',
    ].join('\n')],
    { env: { ...process.env, PYTHONPATH: `${ROOT}/sdk/python` } },
  ).toString();
  assert.equal(py.trim(), 'True sbx_0123456789ab True snap_0123456789abcdef');
});

test('the Python mapping is the same table (class names by code) and covers every code', () => {
  const out = execFileSync(
    '/usr/bin/python3',
    ['-c', 'import json, collimate; print(json.dumps({k: v.__name__ for k, v in collimate.ERROR_CLASSES.items()}))'],
    { env: { ...process.env, PYTHONPATH: `${ROOT}/sdk/python` } },
  ).toString();
  const py = JSON.parse(out) as Record<string, string>;
  const ts = Object.fromEntries(Object.entries(ERROR_CLASSES).map(([k, v]) => [k, v.name]));
  assert.deepEqual(py, ts);
  for (const code of Object.keys(ERROR_CODES)) assert.ok(py[code], `python lacks ${code}`);
});
