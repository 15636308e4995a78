/** Connecting to a test-mode guest agent's unix socket (--serve-socket), which appears once it listens. */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import net from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildAgent } from '../../src/guest/agentBuild.js';

/** Retries for up to 10 s while the agent starts. */
export async function connectSocket(path: string): Promise<net.Socket> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      const socket = net.createConnection(path);
      await once(socket, 'connect');
      return socket;
    } catch (e) {
      if (Date.now() > deadline) throw e;
      await sleep(20);
    }
  }
}

/**
 * The guest agent built into `<workDir>/bin` and started in test mode on `<workDir>/agent.sock`
 * (with `args`, e.g. `--home DIR`); resolves once it listens.
 */
export async function startTestAgent(workDir: string, args: string[] = []): Promise<{ agent: ChildProcess; socketPath: string }> {
  const binary = await buildAgent(join(workDir, 'bin'));
  const socketPath = join(workDir, 'agent.sock');
  const agent = spawn(binary, ['--serve-socket', socketPath, ...args], { stdio: ['ignore', 'inherit', 'inherit'] });
  (await connectSocket(socketPath)).destroy();
  return { agent, socketPath };
}
