/**
 * E2B's door names the operations an error message points to (errors.ts `see`) by the E2B SDK's
 * calls; operations E2B's SDK has no call for are left out of the message.
 */
import type { DoorNames } from '../errors.js';

const CALLS: Partial<Record<string, string>> = {
  listSandboxes: 'Sandbox.list()',
  resumeSandbox: 'Sandbox.connect()',
  suspendSandbox: 'sandbox.pause()',
  deleteSandbox: 'sandbox.kill()',
  listProcesses: 'sandbox.commands.list()',
  createPortUrl: 'sandbox.getHost(port)',
  listSnapshots: 'Sandbox.listSnapshots()',
  deleteSnapshot: 'Sandbox.deleteSnapshot(snapshotId)',
};

export const e2bNames: DoorNames = ({ op }) => CALLS[op];
