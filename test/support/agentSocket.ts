/** Connecting to a test-mode guest agent's unix socket (--serve-socket), which appears once it listens. */
import { once } from 'node:events';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

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
