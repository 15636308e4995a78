/**
 * The DNS resolver of one egress policy, on the host. Sandboxes with that policy have their DNS
 * (the gateway, port 53) DNATed here. It answers only names the policy allows (others: REFUSED),
 * forwards those to the upstream resolver, and before it hands the answer to the guest, adds the
 * A records to the asking sandbox's nftables set (so the connection that follows is allowed, and
 * only to what the name resolved to). AAAA queries get an empty answer: guests have IPv4 only.
 *
 * Runs inside the server process: one UDP socket and one TCP listener per policy on the resolver
 * address (on the host's loopback), and one UDP socket towards the upstream, so nothing is left
 * once the last sandbox goes. A sandbox asks at most QUERY_RATE queries a second (bursts to
 * QUERY_BURST) with QUERY_INFLIGHT at once and holds QUERY_TCP_CONNS TCP connections; past that
 * it is REFUSED at once, and a sandbox flooding DNS costs the host neither sockets nor upstream
 * queries.
 */
import { randomInt } from 'node:crypto';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { createServer, type Server, type Socket } from 'node:net';
import { allowlistOf, resolvesName, type EgressPolicy } from './policy.js';

const TYPE_A = 1;
const TYPE_AAAA = 28;
const TYPE_ANY = 255;
const RCODE_SERVFAIL = 2;
const RCODE_REFUSED = 5;
const UPSTREAM_TIMEOUT_MS = 3000;
/** Per sandbox: queries a second, the burst above it, upstream queries at once, TCP connections. */
export const QUERY_RATE = 50;
export const QUERY_BURST = 200;
export const QUERY_INFLIGHT = 32;
export const QUERY_TCP_CONNS = 4;

export interface DnsQuestion {
  name: string;
  type: number;
  /** Byte offset just past the question (where answers start in a response). */
  end: number;
}

/** Reads a (possibly compressed) name at `off`; returns it and the offset after it in the record. */
export function readName(msg: Buffer, off: number): { name: string; next: number } {
  const labels: string[] = [];
  let next = -1;
  let jumps = 0;
  for (;;) {
    if (off >= msg.length) throw new Error('name runs past the message');
    const len = msg[off];
    if ((len & 0xc0) === 0xc0) {
      if (off + 1 >= msg.length || ++jumps > 32) throw new Error('bad compression pointer');
      if (next < 0) next = off + 2;
      off = ((len & 0x3f) << 8) | msg[off + 1];
      continue;
    }
    if (len > 63) throw new Error('bad label');
    if (len === 0) { off += 1; break; }
    if (off + 1 + len > msg.length) throw new Error('label runs past the message');
    labels.push(msg.toString('latin1', off + 1, off + 1 + len));
    off += 1 + len;
  }
  return { name: labels.join('.').toLowerCase(), next: next < 0 ? off : next };
}

/** The first question of a query, or null if it is not a well-formed standard query. */
export function parseQuestion(msg: Buffer): DnsQuestion | null {
  try {
    if (msg.length < 12) return null;
    const flags = msg.readUInt16BE(2);
    if (flags & 0x8000 || ((flags >> 11) & 0xf) !== 0 || msg.readUInt16BE(4) !== 1) return null;
    const { name, next } = readName(msg, 12);
    if (next + 4 > msg.length) return null;
    return { name, type: msg.readUInt16BE(next), end: next + 4 };
  } catch {
    return null;
  }
}

/** A response to `query` with no answers and `rcode` (0 with no answers: "no such data"). */
export function emptyResponse(query: Buffer, q: DnsQuestion, rcode: number): Buffer {
  const out = Buffer.from(query.subarray(0, q.end));
  const rd = query.readUInt16BE(2) & 0x0100;
  out.writeUInt16BE(0x8000 | rd | 0x0080 | rcode, 2);
  out.writeUInt16BE(1, 4);
  out.writeUInt16BE(0, 6);
  out.writeUInt16BE(0, 8);
  out.writeUInt16BE(0, 10);
  return out;
}

/** The A records of a response and their smallest TTL. */
export function answerAddresses(msg: Buffer): { ips: string[]; ttl: number } {
  const ips: string[] = [];
  let ttl = Infinity;
  const qd = msg.readUInt16BE(4);
  const an = msg.readUInt16BE(6);
  let off = 12;
  for (let i = 0; i < qd; i++) off = readName(msg, off).next + 4;
  for (let i = 0; i < an; i++) {
    off = readName(msg, off).next;
    if (off + 10 > msg.length) throw new Error('answer runs past the message');
    const type = msg.readUInt16BE(off);
    const recTtl = msg.readUInt32BE(off + 4);
    const len = msg.readUInt16BE(off + 8);
    off += 10;
    if (off + len > msg.length) throw new Error('answer data runs past the message');
    if (type === TYPE_A && len === 4) {
      ips.push(`${msg[off]}.${msg[off + 1]}.${msg[off + 2]}.${msg[off + 3]}`);
      ttl = Math.min(ttl, recTtl);
    }
    off += len;
  }
  return { ips: [...new Set(ips)], ttl: ttl === Infinity ? 0 : ttl };
}

export function upstreamFromResolvConf(text: string): string {
  for (const line of text.split('\n')) {
    const m = /^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$/.exec(line);
    if (m) return `${m[1]}:53`;
  }
  return '127.0.0.1:53';
}

/**
 * Queries to the upstream over one UDP socket: each goes out under an id of its own (the guests'
 * ids may collide), and only an answer from the upstream's address and port, to a query in flight,
 * is taken; its id is put back before it goes to the guest.
 */
class Upstream {
  private readonly socket: UdpSocket;
  private readonly pending = new Map<number, { id: number; resolve(msg: Buffer): void; reject(e: Error): void; timer: NodeJS.Timeout }>();
  private readonly host: string;
  private readonly port: number;

  constructor(upstream: string) {
    const i = upstream.lastIndexOf(':');
    this.host = upstream.slice(0, i);
    this.port = Number(upstream.slice(i + 1));
    this.socket = createSocket('udp4');
    this.socket.on('error', () => { /* a bad datagram or an unreachable upstream: queries time out */ });
    this.socket.on('message', (msg, rinfo) => {
      if (msg.length < 12 || rinfo.address !== this.host || rinfo.port !== this.port) return;
      const q = this.pending.get(msg.readUInt16BE(0));
      if (!q) return;
      this.pending.delete(msg.readUInt16BE(0));
      clearTimeout(q.timer);
      const reply = Buffer.from(msg);
      reply.writeUInt16BE(q.id, 0);
      q.resolve(reply);
    });
  }

  ask(query: Buffer): Promise<Buffer> {
    if (this.pending.size >= 0xffff) return Promise.reject(new Error('too many queries in flight'));
    let wire: number;
    do wire = randomInt(0x10000); while (this.pending.has(wire));
    const out = Buffer.from(query);
    out.writeUInt16BE(wire, 0);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(wire);
        reject(new Error('upstream timed out'));
      }, UPSTREAM_TIMEOUT_MS);
      this.pending.set(wire, { id: query.readUInt16BE(0), resolve, reject, timer });
      this.socket.send(out, this.port, this.host, (err) => {
        if (!err) return;
        clearTimeout(timer);
        this.pending.delete(wire);
        reject(err);
      });
    });
  }

  close(): void {
    for (const q of this.pending.values()) {
      clearTimeout(q.timer);
      q.reject(new Error('resolver closed'));
    }
    this.pending.clear();
    this.socket.close();
  }
}

/** One sandbox's use of the resolver: a token bucket of queries, those in flight, its TCP connections. */
interface Asker { tokens: number; at: number; inflight: number; conns: number }

export interface ResolverOptions {
  policy: EgressPolicy;
  bindIp: string;
  /** "ip:port" of the resolver allowed names are forwarded to. */
  upstream: string;
  /** Called with the asking sandbox's namespace address before the answer goes back. */
  onAnswer(src: string, ips: string[], ttlSecs: number): Promise<void>;
  /** Whether `src` is one of ours (anything else is refused). */
  knows(src: string): boolean;
  /** The clock the query budgets refill by (tests stop it). Default Date.now. */
  now?: () => number;
}

export class PolicyResolver {
  private readonly conns = new Set<Socket>();
  private readonly askers = new Map<string, Asker>();
  private readonly upstream: Upstream;

  private constructor(
    private readonly opts: ResolverOptions,
    private readonly udp: UdpSocket,
    private readonly tcp: Server,
    readonly ip: string,
    readonly port: number,
  ) {
    this.upstream = new Upstream(opts.upstream);
  }

  /** `src`'s bookkeeping; an idle sandbox's is dropped (it starts again with a full bucket). */
  private asker(src: string): Asker {
    const now = (this.opts.now ?? Date.now)();
    let a = this.askers.get(src);
    if (!a) {
      if (this.askers.size > 4096) {
        for (const [k, v] of this.askers) if (v.inflight === 0 && v.conns === 0 && now - v.at > 60_000) this.askers.delete(k);
      }
      a = { tokens: QUERY_BURST, at: now, inflight: 0, conns: 0 };
      this.askers.set(src, a);
    }
    a.tokens = Math.min(QUERY_BURST, a.tokens + ((now - a.at) / 1000) * QUERY_RATE);
    a.at = now;
    return a;
  }

  static async start(opts: ResolverOptions): Promise<PolicyResolver> {
    for (let attempt = 0; ; attempt++) {
      const udp = createSocket('udp4');
      await new Promise<void>((resolve, reject) => { udp.once('error', reject); udp.bind(0, opts.bindIp, () => resolve()); });
      const port = udp.address().port;
      const tcp = createServer();
      try {
        await new Promise<void>((resolve, reject) => { tcp.once('error', reject); tcp.listen(port, opts.bindIp, () => resolve()); });
      } catch (e) {
        udp.close();
        if (attempt < 10) continue;
        throw e;
      }
      const r = new PolicyResolver(opts, udp, tcp, opts.bindIp, port);
      udp.removeAllListeners('error');
      udp.on('error', () => { /* a bad datagram; keep serving */ });
      udp.on('message', (msg, rinfo) => {
        void r.answer(msg, rinfo.address).then((reply) => { if (reply) udp.send(reply, rinfo.port, rinfo.address); });
      });
      tcp.on('connection', (s) => r.serveTcp(s));
      return r;
    }
  }

  /** The reply to one query from `src`, or null to drop it. */
  async answer(msg: Buffer, src: string): Promise<Buffer | null> {
    const q = parseQuestion(msg);
    if (!q) return null;
    if (!this.opts.knows(src)) return emptyResponse(msg, q, RCODE_REFUSED);
    if (q.type === TYPE_ANY || !resolvesName(this.opts.policy, q.name)) return emptyResponse(msg, q, RCODE_REFUSED);
    if (q.type === TYPE_AAAA) return emptyResponse(msg, q, 0);
    const a = this.asker(src);
    if (a.tokens < 1 || a.inflight >= QUERY_INFLIGHT) return emptyResponse(msg, q, RCODE_REFUSED);
    a.tokens -= 1;
    a.inflight++;
    let reply: Buffer;
    try {
      reply = await this.upstream.ask(msg);
      const { ips, ttl } = answerAddresses(reply);
      if (ips.length && allowlistOf(this.opts.policy)) await this.opts.onAnswer(src, ips, ttl);
    } catch {
      return emptyResponse(msg, q, RCODE_SERVFAIL);
    } finally {
      a.inflight--;
    }
    return reply;
  }

  private serveTcp(s: Socket): void {
    const src = s.remoteAddress?.replace(/^::ffff:/, '') ?? '';
    const a = this.asker(src);
    if (a.conns >= QUERY_TCP_CONNS) {
      s.destroy();
      return;
    }
    a.conns++;
    this.conns.add(s);
    s.once('close', () => {
      this.conns.delete(s);
      a.conns--;
    });
    let buf = Buffer.alloc(0);
    s.setTimeout(10_000, () => s.destroy());
    s.on('error', () => s.destroy());
    s.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      if (buf.length > 65_537) { s.destroy(); return; }
      while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
        const msg = buf.subarray(2, 2 + buf.readUInt16BE(0));
        buf = buf.subarray(2 + msg.length);
        void this.answer(Buffer.from(msg), src).then((reply) => {
          if (!reply || s.destroyed) return;
          const len = Buffer.alloc(2);
          len.writeUInt16BE(reply.length);
          s.write(Buffer.concat([len, reply]));
        });
      }
    });
  }

  async close(): Promise<void> {
    this.upstream.close();
    await new Promise<void>((resolve) => this.udp.close(() => resolve()));
    // A guest may hold a TCP query connection open: it must not keep the resolver alive.
    for (const c of this.conns) c.destroy();
    await new Promise<void>((resolve) => this.tcp.close(() => resolve()));
  }
}
