/**
 * The tenant's sandbox events across hosts (GET /v1/events on every host), carried by PostgreSQL's
 * LISTEN/NOTIFY on one channel:
 *
 * - each host publishes its engine's persisted transitions (create, fork, suspend, resume, delete,
 *   lost) in the order they happen, one NOTIFY after another;
 * - a sweep that marks a dead host's sandboxes lost notifies through a trigger on the directory
 *   (cluster migration 2), in the sweep's own transaction, so no host has to be alive to say so;
 * - every host LISTENs on its own connection and hands each event to its open streams of that
 *   tenant, its own host's events included (they come back the same way, so each is sent once).
 *
 * As on one host nothing is replayed: an event sent while a host's listening connection is down
 * (it reconnects every second) is not delivered through that host. NOTIFY is delivered only when
 * the sending transaction commits, in commit order per sender.
 */
import pg from 'pg';
import type { SandboxTransition } from '../sandboxes/types.js';

export const EVENTS_CHANNEL = 'collimate_sandbox_events';
const RECONNECT_MS = 1_000;

type Listener = (t: SandboxTransition) => void;
type Emitter = { on?: (e: 'transition', f: (t: SandboxTransition) => void) => unknown; off?: (e: 'transition', f: (t: SandboxTransition) => void) => unknown };

export class ClusterEvents {
  private readonly listeners = new Map<string, Set<Listener>>();
  private client?: pg.Client;
  private closed = false;
  private reconnect?: NodeJS.Timeout;
  /** The tail of this host's NOTIFYs: one at a time, in the engine's order. */
  private tail: Promise<void> = Promise.resolve();
  private readonly onTransition = (t: SandboxTransition) => this.publish(t);

  private constructor(
    private readonly url: string,
    private readonly pool: pg.Pool,
    private readonly hostId: string,
    private readonly engine: Emitter,
    private readonly onError: (err: unknown, what: string) => void,
  ) {}

  /** Listens on the channel, then publishes this host's transitions. */
  static async start(opts: { url: string; pool: pg.Pool; hostId: string; engine: Emitter; onError?: (err: unknown, what: string) => void }): Promise<ClusterEvents> {
    const events = new ClusterEvents(opts.url, opts.pool, opts.hostId, opts.engine, opts.onError ?? (() => {}));
    await events.listen();
    opts.engine.on?.('transition', events.onTransition);
    return events;
  }

  /** Calls `listener` with every event of the tenant's sandboxes on any host, until unsubscribed. */
  subscribe(tenant: string, listener: Listener): () => void {
    let set = this.listeners.get(tenant);
    if (!set) this.listeners.set(tenant, (set = new Set()));
    set.add(listener);
    return () => {
      set.delete(listener);
      if (set.size === 0 && this.listeners.get(tenant) === set) this.listeners.delete(tenant);
    };
  }

  /** Resolves once every event this host published so far has been sent. */
  flushed(): Promise<void> {
    return this.tail;
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.reconnect);
    this.engine.off?.('transition', this.onTransition);
    await this.tail;
    await this.client?.end().catch(() => {});
  }

  private publish(t: SandboxTransition): void {
    const payload = JSON.stringify({ tenant: t.tenant, id: t.id, op: t.op, state: t.state, host: this.hostId });
    this.tail = this.tail.then(async () => {
      try {
        await this.pool.query('SELECT pg_notify($1, $2)', [EVENTS_CHANNEL, payload]);
      } catch (err) {
        this.onError(err, `publishing the event of sandbox ${t.id} failed`);
      }
    });
  }

  private deliver(payload: string | undefined): void {
    let e: { tenant?: unknown; id?: unknown; op?: unknown; state?: unknown };
    try {
      e = JSON.parse(payload ?? '');
    } catch {
      return;
    }
    if (typeof e.tenant !== 'string' || typeof e.id !== 'string') return;
    const set = this.listeners.get(e.tenant);
    if (!set) return;
    const t = { id: e.id, tenant: e.tenant, op: e.op, state: e.state } as SandboxTransition;
    for (const l of [...set]) l(t);
  }

  /** Connects and LISTENs; on any failure, tries again a second later (until closed). */
  private async listen(): Promise<void> {
    const client = new pg.Client({ connectionString: this.url, application_name: 'collimate-events' });
    let failed = false;
    const fail = (err?: unknown) => {
      if (failed) return;
      failed = true;
      if (this.client === client) this.client = undefined;
      void client.end().catch(() => {});
      if (this.closed) return;
      if (err) this.onError(err, 'the cluster event connection failed; reconnecting');
      clearTimeout(this.reconnect);
      this.reconnect = setTimeout(() => void this.listen(), RECONNECT_MS);
      this.reconnect.unref();
    };
    client.on('error', fail);
    client.on('end', () => fail());
    client.on('notification', (m) => {
      if (m.channel === EVENTS_CHANNEL) this.deliver(m.payload);
    });
    this.client = client;
    try {
      await client.connect();
      await client.query(`LISTEN ${EVENTS_CHANNEL}`);
    } catch (err) {
      fail(err);
    }
  }
}
