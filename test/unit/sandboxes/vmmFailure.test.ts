import { test } from 'node:test';
import assert from 'node:assert/strict';
import { vmmFailure } from '../../../src/sandboxes/context.ts';
import type { Running } from '../../../src/sandboxes/registry.ts';

const enoent = Object.assign(new Error("ENOENT: no such file or directory, open '/h/disks/sbx_a-1.qcow2'"), { code: 'ENOENT' });

test('an operation that a delete overtook fails as not found, not as a VMM fault over the file the delete took', () => {
  const running = (over: Partial<Running>) => ({ id: 'sbx_a', deleting: false, ...over }) as Running;
  const plain = vmmFailure('fork', enoent, running({}));
  assert.equal(plain.code, 'vmm_failed');
  assert.match(plain.message, /The fork failed inside the VMM: ENOENT/);
  assert.equal(vmmFailure('fork', enoent).code, 'vmm_failed');
  const deleted = vmmFailure('fork', enoent, running({ deleting: true }));
  assert.equal(deleted.code, 'sandbox_not_found');
  const died = vmmFailure('suspend', enoent, running({ deleting: true, lost: 'its VM exited unexpectedly' }));
  assert.equal(died.code, 'sandbox_not_found');
  assert.match(died.message, /no longer exists: its VM exited unexpectedly/);
});
