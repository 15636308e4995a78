import { test } from 'node:test';
import assert from 'node:assert/strict';
import { announceRestore, RestoreUnacknowledgedError } from '../../../src/sandboxes/runtime.ts';
import type { AgentClient } from '../../../src/guest/agentClient.ts';

test('announceRestore: a guest that never acknowledges fails with RestoreUnacknowledgedError', async () => {
  const agent = { restored: () => new Promise(() => {}) } as unknown as AgentClient;
  const err = await announceRestore(agent, 'sbx_000000000001', { timeoutMs: 20 }).then(() => null, (e) => e);
  assert.ok(err instanceof RestoreUnacknowledgedError, String(err));
  assert.equal(err.timeoutMs, 20);
  assert.match(err.message, /did not acknowledge the restore within 20 ms/);
});

test('announceRestore: other failures of the agent are passed through as they are', async () => {
  const agent = { restored: async () => { throw new Error('agent connection closed'); } } as unknown as AgentClient;
  const err = await announceRestore(agent, 'sbx_000000000001', { timeoutMs: 1000 }).then(() => null, (e) => e);
  assert.ok(!(err instanceof RestoreUnacknowledgedError));
  assert.match(err.message, /agent connection closed/);
});

test('announceRestore: an acknowledgement in time resolves, carrying the new sandbox id', async () => {
  let seen: { sandboxId: string } | undefined;
  const agent = { restored: async (r: { sandboxId: string }) => { seen = r; } } as unknown as AgentClient;
  await announceRestore(agent, 'sbx_000000000002', { timeoutMs: 1000 });
  assert.equal(seen?.sandboxId, 'sbx_000000000002');
});
