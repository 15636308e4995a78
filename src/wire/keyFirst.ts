/**
 * Every door checks the caller's key before it reads a byte of the body: as an `onRequest` hook,
 * which runs before Fastify parses (or buffers) it. A request without a valid key then costs a
 * lookup and is answered while its body may still be coming; its connection closes after the answer
 * instead of being read to the end.
 */
/** What the hook needs of a request and a reply (Fastify's; the doors name the types). */
interface Req { headers: Record<string, string | string[] | undefined> }
interface Reply { header(name: string, value: string): unknown }

export interface KeyFirst<S, Q extends Req, R extends Reply> {
  /** The hook to put on a route (or a scope of routes). */
  onRequest: (req: Q, reply: R) => Promise<R | undefined>;
  /** What `check` gave for this request (the hook ran: it is there). */
  scopeOf(req: Q): S;
}

/** `check` finds the caller (or throws); `refuse` answers a request it threw for, in the door's shape. */
export function keyFirst<S, Q extends Req, R extends Reply>(check: (req: Q) => Promise<S>, refuse: (req: Q, reply: R, err: unknown) => void): KeyFirst<S, Q, R> {
  const scopes = new WeakMap<Q, S>();
  return {
    async onRequest(req, reply) {
      try {
        scopes.set(req, await check(req));
        return undefined;
      } catch (err) {
        if (req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined) reply.header('connection', 'close');
        refuse(req, reply, err);
        return reply;
      }
    },
    scopeOf(req) {
      if (!scopes.has(req)) throw new Error('keyFirst: the onRequest hook did not run for this route');
      return scopes.get(req)!;
    },
  };
}
