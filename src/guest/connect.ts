import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { AgentClient } from './agentClient.js';

export function connectUnix(path: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    s.once('connect', () => { s.removeAllListeners('error'); resolve(s); });
    s.once('error', (e) => { s.destroy(); reject(e); });
  });
}

/**
 * Connects to a guest agent's virtio-serial chardev and waits until it answers a PING. Pings are
 * retried because bytes sent before the guest opened its port may wait in QEMU until it does.
 */
export async function connectAgent(socketPath: string, timeoutMs: number): Promise<AgentClient> {
  const deadline = Date.now() + timeoutMs;
  let lastErr: unknown;
  while (Date.now() < deadline) {
    let sock: Socket;
    try {
      sock = await connectUnix(socketPath);
    } catch (e) {
      lastErr = e;
      await sleep(2);
      continue;
    }
    const client = new AgentClient(sock);
    while (Date.now() < deadline) {
      try {
        await client.ping(Math.min(1000, Math.max(50, deadline - Date.now())));
        return client;
      } catch (e) {
        lastErr = e;
        if (sock.destroyed) break;
      }
    }
    client.close();
  }
  throw new Error(`guest agent at ${socketPath} did not answer within ${timeoutMs} ms: ${String((lastErr as Error)?.message ?? lastErr)}`);
}

/**
 * For a guest that was already serving when it was checkpointed: connect and send the first request
 * at once (no PING round trip first). The guest reads it as soon as it notices the host.
 */
export async function connectRestoredAgent(socketPath: string, timeoutMs: number): Promise<AgentClient> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return new AgentClient(await connectUnix(socketPath));
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`cannot connect to guest agent at ${socketPath}: ${(e as Error).message}`);
      await sleep(1);
    }
  }
}
