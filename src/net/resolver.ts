/**
 * The DNS resolver of one egress policy, on the host. Sandboxes with that policy have their DNS
 * (the gateway, port 53) DNATed here. It answers only names the policy allows (others: REFUSED),
 * forwards those to the upstream resolver, and before it hands the answer to the guest, adds the
 * A records to the asking sandbox's nftables set (so the connection that follows is allowed, and
 * only to what the name resolved to). AAAA queries get an empty answer: guests have IPv4 only.
 *
 * Runs inside the server process: one UDP socket and one TCP listener per policy on the resolver
 * address (on the host's loopback), so nothing is left once the last sandbox goes.
 */
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { createServer, type Server, type Socket } from 'node:net';
import { resolvesName, type EgressPolicy } from './policy.js';

const TYPE_A = 1;
const TYPE_AAAA = 28;
const TYPE_ANY = 255;
const RCODE_SERVFAIL = 2;
const RCODE_REFUSED = 5;
const UPSTREAM_TIMEOUT_MS = 3000;

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

function askUpstream(upstream: string, query: Buffer): Promise<Buffer> {
  const i = upstream.lastIndexOf(':');
  const host = upstream.slice(0, i);
  const port = Number(upstream.slice(i + 1));
  return new Promise((resolve, reject) => {
    const s = createSocket('udp4');
    const timer = setTimeout(() => { s.close(); reject(new Error('upstream timed out')); }, UPSTREAM_TIMEOUT_MS);
    s.on('error', (e) => { clearTimeout(timer); s.close(); reject(e); });
    s.on('message', (msg) => {
      if (msg.length < 12 || msg.readUInt16BE(0) !== query.readUInt16BE(0)) return;
      clearTimeout(timer);
      s.close();
      resolve(msg);
    });
    s.send(query, port, host);
  });
}

export interface ResolverOptions {
  policy: EgressPolicy;
  bindIp: string;
  /** "ip:port" of the resolver allowed names are forwarded to. */
  upstream: string;
  /** Called with the asking sandbox's namespace address before the answer goes back. */
  onAnswer(src: string, ips: string[], ttlSecs: number): Promise<void>;
  /** Whether `src` is one of ours (anything else is refused). */
  knows(src: string): boolean;
}

export class PolicyResolver {
  private readonly conns = new Set<Socket>();

  private constructor(
    private readonly opts: ResolverOptions,
    private readonly udp: UdpSocket,
    private readonly tcp: Server,
    readonly ip: string,
    readonly port: number,
  ) {}

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
    let reply: Buffer;
    try {
      reply = await askUpstream(this.opts.upstream, msg);
      const { ips, ttl } = answerAddresses(reply);
      if (ips.length && this.opts.policy !== 'allow') await this.opts.onAnswer(src, ips, ttl);
    } catch {
      return emptyResponse(msg, q, RCODE_SERVFAIL);
    }
    return reply;
  }

  private serveTcp(s: Socket): void {
    this.conns.add(s);
    s.once('close', () => this.conns.delete(s));
    let buf = Buffer.alloc(0);
    s.setTimeout(10_000, () => s.destroy());
    s.on('error', () => s.destroy());
    s.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      if (buf.length > 65_537) { s.destroy(); return; }
      while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
        const msg = buf.subarray(2, 2 + buf.readUInt16BE(0));
        buf = buf.subarray(2 + msg.length);
        void this.answer(Buffer.from(msg), s.remoteAddress?.replace(/^::ffff:/, '') ?? '').then((reply) => {
          if (!reply || s.destroyed) return;
          const len = Buffer.alloc(2);
          len.writeUInt16BE(reply.length);
          s.write(Buffer.concat([len, reply]));
        });
      }
    });
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => this.udp.close(() => resolve()));
    // A guest may hold a TCP query connection open: it must not keep the resolver alive.
    for (const c of this.conns) c.destroy();
    await new Promise<void>((resolve) => this.tcp.close(() => resolve()));
  }
}
