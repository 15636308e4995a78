/**
 * Another cluster host's sandboxes, as a SandboxHost (src/service/sandboxHost.ts): each operation is
 * one HTTP request to that host's peer endpoint (src/api/peerRoutes.ts), carrying the peer secret. The tenant
 * service calls it exactly as it calls this host's engine; how each operation travels is
 * HOST_OPERATIONS:
 *
 * - `call`: JSON arguments in, `{result}` or `{error}` out (Buffers as {"$b": base64});
 * - `exec`, `download`: newline-delimited JSON, output or file chunks as they come, then the result;
 *   a download is paced by its sink (the next line is read once the sink took the last);
 * - `listen`, `watch`: the same stream, open until the returned unsubscribe or close() ends it;
 * - `upload`: the arguments in a header, the bytes as the body;
 * - `tunnel` (a port): an HTTP upgrade that becomes a TCP connection to the sandbox's port.
 *
 * Errors come back as the CollimateErrors they were on the owner; a host that does not answer is
 * host_at_capacity (503, resource cluster_host) so clients retry.
 */
import { request as httpRequest, type IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { CollimateError, type ErrorCode, type MessagePart } from '../errors.js';
import type { FileChange, Scope, WatchEndReason } from '../sandboxes/types.js';
import { hostOf, type SandboxHost } from '../service/sandboxHost.js';
import { PEER_HEADER } from './peerHeader.js';

/** Where peer operations are served on every host. */
export const PEER_HOST_PATH = '/peer/v1/host';
/** The header an `upload` operation's arguments travel in (JSON, base64url). */
export const ARGS_HEADER = 'x-collimate-args';
/** The header a placed start's extras travel in (HostCallExtras, JSON). */
export const EXTRAS_HEADER = 'x-collimate-extras';

/** Where a snapshot lies: its origin host, as a placed start from it names it (snapshotPull.ts). */
export interface SnapshotSource {
  tenant: string;
  id: string;
  origin: { hostId: string; address: string };
}

/** What a placed start tells the host beside the operation: the slots it re-checks its capacity for, an environment or a snapshot to pull first. */
export interface HostCallExtras {
  admit?: number;
  pull?: { tenant: string; name: string };
  /** A start from a snapshot another host holds (snapshotPull.ts). */
  snapshot?: SnapshotSource;
}

/** JSON with Buffers ({"$b": base64}) and bigints ({"$n": decimal}, a file's mtimeNs) kept. */
export function encode(v: unknown): string {
  return JSON.stringify(v, function (this: Record<string, unknown>, key, value) {
    const raw = this[key];
    if (Buffer.isBuffer(raw) || raw instanceof Uint8Array) return { $b: Buffer.from(raw).toString('base64') };
    if (typeof raw === 'bigint') return { $n: raw.toString() };
    return value;
  });
}

export function decode(text: string): any {
  return JSON.parse(text, (_k, v) => {
    if (!v || typeof v !== 'object' || Array.isArray(v) || Object.keys(v).length !== 1) return v;
    if (typeof v.$b === 'string') return Buffer.from(v.$b, 'base64');
    if (typeof v.$n === 'string') return BigInt(v.$n);
    return v;
  });
}

export function errorOf(e: unknown): { code: string; message: string | MessagePart[]; details?: Record<string, unknown>; retryAfterSecs?: number } {
  if (e instanceof CollimateError) return { code: e.code, message: e.parts ?? e.message, ...(e.details ? { details: e.details } : {}), ...(e.retryAfterSecs !== undefined ? { retryAfterSecs: e.retryAfterSecs } : {}) };
  return { code: 'internal_error', message: 'Internal error on the host that runs this sandbox; it is in that host\'s log.' };
}

function errorFrom(e: { code: string; message: string | MessagePart[]; details?: Record<string, unknown>; retryAfterSecs?: number }): CollimateError {
  return new CollimateError(e.code as ErrorCode, e.message, { ...(e.details ? { details: e.details } : {}), ...(e.retryAfterSecs !== undefined ? { retryAfterSecs: e.retryAfterSecs } : {}) });
}

/** A host that could not be reached: for a placed create, a refusal like a full host's (the placement tries another). */
export function hostNotAnswering(address: string, cause?: unknown): CollimateError {
  return new CollimateError('host_at_capacity', `The host that holds this sandbox (${address}) does not answer; retry shortly.`, { retryAfterSecs: 5, details: { resource: 'cluster_host', refused: true }, cause });
}

/** Calls each line of a newline-delimited JSON stream in turn, waiting for each (so a slow consumer slows the sender). */
async function eachLine(res: IncomingMessage, onLine: (v: any) => void | Promise<void>): Promise<void> {
  let buf = '';
  res.setEncoding('utf8');
  for await (const chunk of res as AsyncIterable<string>) {
    buf += chunk;
    for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line) await onLine(decode(line));
    }
  }
}

export class RemoteHost {
  constructor(readonly hostId: string, readonly address: string, private readonly secret: string, private readonly extras: HostCallExtras = {}) {}

  /** The same host, with a placed start's extras sent along with each call. */
  placed(extras: HostCallExtras): SandboxHost {
    return new RemoteHost(this.hostId, this.address, this.secret, extras).asHost();
  }

  /** This client as a SandboxHost: every operation of HOST_OPERATIONS, sent the way it says. */
  asHost(): SandboxHost {
    return hostOf((op, how, args) => {
      const arg = 'arg' in how ? how.arg : -1;
      switch (how.kind) {
        case 'call': return this.call(op, args);
        case 'exec': return this.exec(op, args, arg);
        case 'download': return this.download(op, args, arg);
        case 'listen': return this.listen(op, args, arg);
        case 'watch': return this.watch(op, args, arg);
        case 'upload': return this.upload(op, args, arg);
        case 'tunnel': return this.tunnelTarget(args);
      }
    });
  }

  private send(op: string, body: string | AsyncIterable<Buffer | Uint8Array | string> | Buffer, headers: Record<string, string> = {}): Promise<{ res: IncomingMessage; abort: () => void }> {
    const target = new URL(this.address);
    return new Promise((resolve, reject) => {
      const req = httpRequest({
        protocol: target.protocol, hostname: target.hostname, port: target.port, method: 'POST', path: `${PEER_HOST_PATH}/${op}`,
        headers: {
          [PEER_HEADER]: this.secret,
          'content-type': typeof body === 'string' ? 'application/json' : 'application/octet-stream',
          ...(Object.keys(this.extras).length ? { [EXTRAS_HEADER]: JSON.stringify(this.extras) } : {}),
          ...headers,
        },
      }, (res) => resolve({ res, abort: () => req.destroy() }));
      req.on('error', (err) => reject(hostNotAnswering(this.address, err)));
      if (typeof body === 'string' || Buffer.isBuffer(body)) req.end(body);
      else {
        void (async () => {
          try {
            for await (const c of body) {
              if (!req.write(typeof c === 'string' ? Buffer.from(c) : c)) await new Promise((r) => req.once('drain', r));
            }
            req.end();
          } catch (err) {
            req.destroy(err as Error);
          }
        })();
      }
    });
  }

  /** Reads a whole `{result}` / `{error}` answer. */
  private async answer(res: IncomingMessage): Promise<unknown> {
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    let v: { result?: unknown; error?: Parameters<typeof errorFrom>[0] };
    try {
      v = decode(text);
    } catch {
      throw hostNotAnswering(this.address, new Error(`status ${res.statusCode}: ${text.slice(0, 200)}`));
    }
    if (v.error) throw errorFrom(v.error);
    return v.result;
  }

  /** One of the host's own calls (PeerHostOptions.calls), by name. */
  async call(op: string, args: unknown[]): Promise<unknown> {
    const { res } = await this.send(op, encode({ args }));
    return this.answer(res);
  }

  private async exec(op: string, args: unknown[], arg: number): Promise<unknown> {
    const stream = args[arg] as { onStdout?(c: Buffer): void; onStderr?(c: Buffer): void } | undefined;
    const sent = args.slice();
    sent[arg] = stream ? true : undefined;
    const { res } = await this.send(op, encode({ args: sent }));
    let out: { result?: unknown; error?: Parameters<typeof errorFrom>[0] } | undefined;
    await eachLine(res, (v) => {
      if (v.o) stream?.onStdout?.(v.o);
      else if (v.e) stream?.onStderr?.(v.e);
      else out = v;
    });
    if (!out) throw hostNotAnswering(this.address, new Error(`${op} ended without a result`));
    if (out.error) throw errorFrom(out.error);
    return out.result;
  }

  private async download(op: string, args: unknown[], arg: number): Promise<unknown> {
    const sink = args[arg] as { start?(i: { size: number; mode: number }): unknown; chunk(d: Buffer): unknown };
    const sent = args.slice();
    sent[arg] = null;
    const { res, abort } = await this.send(op, encode({ args: sent }));
    let out: { result?: unknown; error?: Parameters<typeof errorFrom>[0] } | undefined;
    try {
      await eachLine(res, async (v) => {
        if (v.start) await sink.start?.(v.start);
        else if (v.chunk) await sink.chunk(v.chunk);
        else out = v;
      });
    } catch (err) {
      abort(); // the sink failed (its client went away): the owner stops reading
      throw err;
    }
    if (!out) throw hostNotAnswering(this.address, new Error(`${op} ended without a result`));
    if (out.error) throw errorFrom(out.error);
    return out.result;
  }

  private async upload(op: string, args: unknown[], arg: number): Promise<unknown> {
    const data = args[arg] as AsyncIterable<Buffer | Uint8Array | string> | Buffer;
    const sent = args.slice();
    sent[arg] = null;
    const { res } = await this.send(op, data, { [ARGS_HEADER]: Buffer.from(encode({ args: sent })).toString('base64url') });
    return this.answer(res);
  }

  /** Opens a stream whose first line says whether it started; later lines go to `onLine`. */
  private async open(op: string, args: unknown[], onLine: (v: any) => void, onEnd: () => void): Promise<() => void> {
    const { res, abort } = await this.send(op, encode({ args }));
    let started: (v: unknown) => void = () => {};
    let failed: (e: unknown) => void = () => {};
    const first = new Promise((resolve, reject) => {
      started = resolve;
      failed = reject;
    });
    let opened = false;
    void eachLine(res, (v) => {
      if (!opened) {
        opened = true;
        if (v.error) failed(errorFrom(v.error));
        else started(undefined);
        return;
      }
      onLine(v);
    }).catch(() => {}).finally(() => {
      if (!opened) failed(hostNotAnswering(this.address, new Error(`${op} ended before it started`)));
      else onEnd();
    });
    await first;
    return abort;
  }

  private async listen(op: string, args: unknown[], arg: number): Promise<() => void> {
    const listener = args[arg] as (e: unknown) => void;
    const sent = args.slice();
    sent[arg] = null;
    let stopped = false;
    const abort = await this.open(op, sent, (v) => !stopped && listener(v.event), () => {});
    return () => {
      stopped = true;
      abort();
    };
  }

  private async watch(op: string, args: unknown[], arg: number): Promise<{ close(): Promise<void> }> {
    const handlers = args[arg] as { onChange(c: FileChange): void; onEnd(r: WatchEndReason): void };
    const sent = args.slice();
    sent[arg] = null;
    let closed = false;
    let ended = false;
    const end = (reason: WatchEndReason) => {
      if (closed || ended) return;
      ended = true;
      handlers.onEnd(reason);
    };
    const abort = await this.open(op, sent, (v) => {
      if (closed) return;
      if (v.change) handlers.onChange(v.change);
      else if (v.end) end(v.end);
    }, () => end('agent_disconnected'));
    return {
      close: async () => {
        closed = true;
        abort();
      },
    };
  }

  /** A port of another host's sandbox: checked there now, reached through a tunnel when connected. */
  private async tunnelTarget(args: unknown[]): Promise<{ host: string; port: number; publicPorts?: boolean; requestHost?: string; connect(): Promise<Duplex> }> {
    const [id, port, scope] = args as [string, number, Scope];
    // invalid_state, network_unavailable… are said now; who may reach the port and its Host come back.
    const terms = (await this.call('portTarget', args)) as { publicPorts?: boolean; requestHost?: string } | null;
    const target = new URL(this.address);
    return {
      ...(terms?.publicPorts === undefined ? {} : { publicPorts: terms.publicPorts }),
      ...(terms?.requestHost === undefined ? {} : { requestHost: terms.requestHost }),
      host: target.hostname,
      port: Number(target.port),
      connect: () => new Promise((resolve, reject) => {
        const req = httpRequest({
          protocol: target.protocol, hostname: target.hostname, port: target.port, method: 'GET', path: `${PEER_HOST_PATH}/tunnel`,
          headers: { [PEER_HEADER]: this.secret, connection: 'Upgrade', upgrade: 'collimate-tcp', [ARGS_HEADER]: Buffer.from(encode({ args: [id, port, scope] })).toString('base64url') },
        });
        req.on('upgrade', (_res, socket, head) => {
          if (head.length) socket.unshift(head);
          resolve(socket);
        });
        req.on('response', (res) => {
          void this.answer(res).then(() => reject(hostNotAnswering(this.address)), (err: CollimateError) => {
            // A refused connect inside the sandbox comes back as the errno the ports proxy words for its own.
            const errno = err.details?.errno;
            reject(typeof errno === 'string' ? Object.assign(new Error(err.message), { code: errno }) : err);
          });
        });
        req.on('error', (err) => reject(hostNotAnswering(this.address, err)));
        req.end();
      }),
    };
  }
}
