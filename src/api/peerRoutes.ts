/**
 * The serving side of RemoteHost (remoteHost.ts): this host's sandboxes, operated by the other hosts
 * of its cluster on their tenants' behalf. Only requests carrying the peer secret are served; the
 * tenant in each call's scope is the one the calling host authenticated, and the host runs the
 * operation on its own SandboxHost exactly as for a request that entered here.
 *
 * A placed start (create, fork, resume) says how many sandboxes it starts (`admit`): the host
 * re-checks its lease and capacity for them first and turns it away with a refusal the calling
 * host's placement understands (placement.ts hostRefused) — then it may go elsewhere. A create from
 * an environment this host lacks says which to pull (`pull`), a start from a snapshot another host
 * holds where to pull a copy of it from (`snapshot`).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { connect } from 'node:net';
import type { Duplex } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { CollimateError } from '../errors.js';
import type { FileSink, PortTarget } from '../sandboxes/types.js';
import { hostRefused } from '../service/placement.js';
import { HOST_OPERATIONS, invoke, type HostOperation, type SandboxHost } from '../service/sandboxHost.js';
import { ARGS_HEADER, decode, encode, errorOf, EXTRAS_HEADER, PEER_HOST_PATH, type HostCallExtras, type SnapshotSource } from '../cluster/remoteHost.js';
import { splice } from './portsProxy.js';

export interface PeerHostOptions {
  host: SandboxHost;
  isPeer(secret: string | string[] | undefined): boolean;
  /** The host's re-check before a placed start: a release, or why it cannot take `slots` more. */
  admit(slots: number): { release(): void } | string;
  /** Pulls an environment another host made, before a create from it. */
  pull?(tenant: string, name: string): Promise<unknown>;
  /** Pulls a copy of a snapshot another host holds, before a start from it. */
  pullSnapshot?(src: SnapshotSource): Promise<unknown>;
  /** What the host answers beside its sandboxes' operations (live stats, its environments), each a `call`. */
  calls: Record<string, (...args: any[]) => unknown>;
}

/** Largest JSON call (writeFile's bytes travel in it, base64). */
const MAX_CALL_BYTES = 96 * 1024 * 1024;

function extrasOf(req: IncomingMessage): HostCallExtras {
  const v = req.headers[EXTRAS_HEADER];
  if (typeof v !== 'string') return {};
  try {
    return JSON.parse(v) as HostCallExtras;
  } catch {
    return {};
  }
}

/** A JSON call's arguments (the server hands JSON bodies over as the bytes that came). */
/** What a peer is told of a port here: who may reach it and the Host its server sees, not where it listens (the peer tunnels). */
function portTerms(t: PortTarget): { publicPorts?: boolean; requestHost?: string } {
  return { ...(t.publicPorts === undefined ? {} : { publicPorts: t.publicPorts }), ...(t.requestHost === undefined ? {} : { requestHost: t.requestHost }) };
}

function argsOf(body: unknown): unknown[] {
  // Not parseJsonBody: Buffers and bigints travel in this JSON (remoteHost.ts encode).
  const text = Buffer.isBuffer(body) ? body.toString('utf8') : typeof body === 'string' ? body : JSON.stringify(body ?? {});
  return (decode(text || '{}').args as unknown[]) ?? [];
}

function argsHeader(req: IncomingMessage): unknown[] {
  const v = req.headers[ARGS_HEADER];
  return typeof v === 'string' ? (decode(Buffer.from(v, 'base64url').toString('utf8')).args as unknown[]) : [];
}

function ndjson(reply: FastifyReply): { line(v: unknown): Promise<void>; end(): void; res: ServerResponse } {
  reply.hijack();
  const res = reply.raw;
  res.writeHead(200, { 'content-type': 'application/x-ndjson' });
  return {
    res,
    async line(v) {
      if (!res.write(encode(v) + '\n')) await new Promise<void>((r) => {
        res.once('drain', r);
        res.once('close', r);
      });
    },
    end: () => res.end(),
  };
}

export function registerPeerHost(app: FastifyInstance, opts: PeerHostOptions): void {

  app.register(async (scope) => {
    // An upload's body is the bytes themselves, read by the operation as they come.
    scope.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));
    scope.post<{ Params: { op: string } }>(`${PEER_HOST_PATH}/:op`, { bodyLimit: MAX_CALL_BYTES }, async (req, reply) => {
      if (!opts.isPeer(req.headers['x-collimate-peer'])) {
        return reply.code(401).send({ error: { code: 'unauthorized', message: 'Only the hosts of this cluster may call this.' } });
      }
      const op = req.params.op as HostOperation;
      if (Object.hasOwn(opts.calls, req.params.op)) {
        try {
          const args = argsOf(req.body);
          return reply.code(200).type('application/json').send(encode({ result: (await opts.calls[req.params.op](...args)) ?? null }));
        } catch (err) {
          return reply.code(200).type('application/json').send(encode({ error: errorOf(err) }));
        }
      }
      const how = Object.hasOwn(HOST_OPERATIONS, op) ? HOST_OPERATIONS[op] : undefined;
      if (!how) return reply.code(404).send({ error: { code: 'not_found', message: `No host operation ${op}.` } });
      const extras = extrasOf(req.raw);
      let slot: { release(): void } | undefined;
      try {
        if (extras.admit) {
          const r = opts.admit(extras.admit);
          if (typeof r === 'string') throw hostRefused(r);
          slot = r;
        }
        if (extras.pull && opts.pull) await opts.pull(extras.pull.tenant, extras.pull.name);
        if (extras.snapshot && opts.pullSnapshot) await opts.pullSnapshot(extras.snapshot);
        return await serve(req, reply, op, how.kind === 'tunnel' ? 'call' : how.kind, 'arg' in how ? how.arg : -1);
      } catch (err) {
        if (!(err instanceof CollimateError)) req.log.error({ err, op }, 'a peer\'s host operation failed');
        return reply.code(200).type('application/json').send(encode({ error: errorOf(err) }));
      } finally {
        slot?.release();
      }
    });
  });

  async function serve(req: FastifyRequest, reply: FastifyReply, op: HostOperation, kind: string, arg: number): Promise<FastifyReply> {
    const args = kind === 'upload' ? argsHeader(req.raw) : argsOf(req.body);
    const run = (a: unknown[]) => invoke(opts.host, op, a);
    switch (kind) {
      case 'call': {
        const result = await run(args);
        // A port's answer is where to connect on this host, which the caller tunnels to instead; who may reach it and its Host travel.
        return reply.code(200).type('application/json').send(encode({ result: op === 'portTarget' ? portTerms(result as PortTarget) : result ?? null }));
      }
      case 'upload': {
        args[arg] = req.body as Duplex;
        return reply.code(200).type('application/json').send(encode({ result: (await run(args)) ?? null }));
      }
      case 'exec': {
        const out = ndjson(reply);
        if (args[arg]) args[arg] = { onStdout: (c: Buffer) => void out.line({ o: c }), onStderr: (c: Buffer) => void out.line({ e: c }) };
        try {
          await out.line({ result: await run(args) });
        } catch (err) {
          await out.line({ error: errorOf(err) });
        }
        out.end();
        return reply;
      }
      case 'download': {
        const out = ndjson(reply);
        const sink: FileSink = {
          start: (info) => out.line({ start: info }),
          chunk: async (data) => {
            if (out.res.destroyed) throw new Error('the calling host went away');
            await out.line({ chunk: data });
          },
        };
        args[arg] = sink;
        try {
          await out.line({ result: await run(args) });
        } catch (err) {
          if (!out.res.destroyed) await out.line({ error: errorOf(err) });
        }
        out.end();
        return reply;
      }
      case 'listen': {
        let out: ReturnType<typeof ndjson> | undefined;
        let open = false;
        // Events that come before the stream is open (held output replayed at subscription) wait, in order.
        const early: Array<{ type: string }> = [];
        // Each line is written at once, in order; the stream ends once the exit's line is out.
        const send = (event: { type: string }) => void out!.line({ event }).then(() => event.type === 'exit' && out!.end());
        args[arg] = (event: { type: string }) => (open ? send(event) : early.push(event));
        const unsubscribe = (await run(args)) as () => void;
        out = ndjson(reply);
        out.res.on('close', unsubscribe);
        await out.line({ ok: true });
        open = true;
        early.forEach(send);
        return reply;
      }
      case 'watch': {
        let out: ReturnType<typeof ndjson> | undefined;
        let open = false;
        // As for `listen`: what comes before the stream is open waits, in order; the end ends it.
        const early: Array<{ change?: unknown; end?: string }> = [];
        const send = (line: { change?: unknown; end?: string }) => void out!.line(line).then(() => line.end !== undefined && out!.end());
        const put = (line: { change?: unknown; end?: string }) => (open ? send(line) : early.push(line));
        args[arg] = { onChange: (change: unknown) => put({ change }), onEnd: (reason: string) => put({ end: reason }) };
        const watch = (await run(args)) as { close(): Promise<void> };
        out = ndjson(reply);
        out.res.on('close', () => void watch.close().catch(() => {}));
        await out.line({ ok: true });
        open = true;
        early.forEach(send);
        return reply;
      }
      default:
        throw new Error(`host operation ${op} has an unknown kind ${kind}`);
    }
  }
}

/**
 * The peer tunnel to a sandbox port (RemoteHost's portTarget): an upgrade of GET
 * PEER_HOST_PATH/tunnel with the peer secret becomes a TCP connection to the port. Returns false for
 * any other upgrade.
 */
export function peerTunnel(opts: PeerHostOptions, tunnels: Set<Duplex>) {
  return (req: IncomingMessage, socket: Duplex, head: Buffer): boolean => {
    if (!(req.url ?? '').startsWith(`${PEER_HOST_PATH}/tunnel`)) return false;
    const refuse = (status: number, err: unknown) => {
      const body = encode({ error: errorOf(err) });
      socket.end(`HTTP/1.1 ${status} Refused\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
    };
    if (!opts.isPeer(req.headers['x-collimate-peer'])) {
      refuse(401, new CollimateError('unauthorized', 'Only the hosts of this cluster may open tunnels.'));
      return true;
    }
    void (async () => {
      const [id, port, scope] = argsHeader(req) as [string, number, { tenant: string }];
      const target = await opts.host.portTarget(id, port, scope);
      const upstream = connect({ host: target.host, port: target.port });
      // The calling host renders a connect error as for its own sandboxes (the ports proxy's words).
      const join = splice(socket, upstream, tunnels, (err) => refuse(502, new CollimateError('port_unreachable', `connect to port ${port} of sandbox ${id} failed: ${err.code ?? err.message}`, { details: { errno: err.code ?? 'ECONNRESET' } })));
      upstream.once('connect', () => {
        socket.write('HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: collimate-tcp\r\n\r\n');
        join([head]);
      });
    })().catch((err) => refuse(200, err));
    return true;
  };
}
