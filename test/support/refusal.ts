import assert from 'node:assert/strict';
import { CollimateError } from '../../src/errors.js';

/** The CollimateError `p` rejects with (a test of a refusal reads its code and details); fails the test otherwise. */
export async function refusal(p: Promise<unknown>): Promise<CollimateError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof CollimateError, String(e));
    return e;
  }
  assert.fail('expected a refusal');
}
