/**
 * What a cluster host runs for the tenant-wide views besides its node (node.ts): the event bus
 * (events.ts) and the push of its metering to PostgreSQL (usage.ts). Started after the host
 * joined, stopped before it leaves (a last push included).
 */
import type { Db } from '../store/db.js';
import type { SandboxTransition } from '../sandboxes/types.js';
import { ClusterEvents } from './events.js';
import type { ClusterNode } from './node.js';
import { UsagePush } from './usage.js';

type Emitter = { on?: (e: 'transition', f: (t: SandboxTransition) => void) => unknown; off?: (e: 'transition', f: (t: SandboxTransition) => void) => unknown };

export interface ClusterViews {
  usage: UsagePush;
  events: ClusterEvents;
  /** The tenant service's event source (TenantServiceOptions.sandboxEvents). */
  sandboxEvents: (tenant: string, listener: (t: SandboxTransition) => void) => () => void;
  stop(): Promise<void>;
}

export async function startClusterViews(node: ClusterNode, engine: Emitter, db: Db, opts: { url: string; log?: (err: unknown, msg: string) => void }): Promise<ClusterViews> {
  const log = opts.log ?? (() => {});
  const events = await ClusterEvents.start({ url: opts.url, pool: node.pool, hostId: node.hostId, engine, onError: log });
  const usage = new UsagePush(node.pool, db, node.hostId, log);
  try {
    await usage.start();
  } catch (err) {
    // The database answered the join a moment ago; a failure here is retried by the timer.
    log(err, 'the first usage push failed');
  }
  return {
    usage,
    events,
    sandboxEvents: (tenant, listener) => events.subscribe(tenant, listener),
    async stop() {
      await usage.stop();
      await events.close();
    },
  };
}
