/**
 * A minimal WebSocket (RFC 6455) for tests, on node:http and node:net only (Node 20 has no
 * WebSocket client): the handshake, single-frame text messages, an echo server and a client.
 */
import { createHash, randomBytes } from 'node:crypto';
import { request, type IncomingHttpHeaders, type IncomingMessage, type Server } from 'node:http';
import type { Duplex } from 'node:stream';

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

export function acceptKey(key: string): string {
  return createHash('sha1').update(key + GUID).digest('base64');
}

/** One unfragmented frame; clients must mask, servers must not. */
export function encodeFrame(payload: Buffer, opcode: number, mask: boolean): Buffer {
  const len = payload.length;
  const head = len < 126 ? Buffer.from([0x80 | opcode, (mask ? 0x80 : 0) | len]) : len < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
  if (len >= 126) {
    head[0] = 0x80 | opcode;
    head[1] = (mask ? 0x80 : 0) | (len < 65536 ? 126 : 127);
    if (len < 65536) head.writeUInt16BE(len, 2);
    else head.writeBigUInt64BE(BigInt(len), 2);
  }
  if (!mask) return Buffer.concat([head, payload]);
  const key = randomBytes(4);
  const body = Buffer.from(payload);
  for (let i = 0; i < body.length; i++) body[i] ^= key[i & 3];
  return Buffer.concat([head, key, body]);
}

/** Feeds bytes in, calls `onFrame` per complete frame (payload unmasked). */
export function frameReader(onFrame: (opcode: number, payload: Buffer) => void): (chunk: Buffer) => void {
  let buf = Buffer.alloc(0);
  return (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    for (;;) {
      if (buf.length < 2) return;
      const opcode = buf[0] & 0x0f;
      const masked = (buf[1] & 0x80) !== 0;
      let len = buf[1] & 0x7f;
      let off = 2;
      if (len === 126) {
        if (buf.length < 4) return;
        len = buf.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (buf.length < 10) return;
        len = Number(buf.readBigUInt64BE(2));
        off = 10;
      }
      const need = off + (masked ? 4 : 0) + len;
      if (buf.length < need) return;
      const payload = Buffer.from(buf.subarray(off + (masked ? 4 : 0), need));
      if (masked) {
        const key = buf.subarray(off, off + 4);
        for (let i = 0; i < payload.length; i++) payload[i] ^= key[i & 3];
      }
      buf = buf.subarray(need);
      onFrame(opcode, payload);
    }
  };
}

/**
 * Makes `server` a WebSocket echo server on every path: text frames come back prefixed with
 * `echo:`; `onUpgrade` sees each handshake request (to check what the proxy forwarded).
 */
export function wsEcho(server: Server, onUpgrade: (req: IncomingMessage) => void = () => {}): void {
  server.on('upgrade', (req: IncomingMessage, socket: Duplex) => {
    onUpgrade(req);
    socket.on('error', () => {});
    // HTTP servers' sockets allow half-open: without this a client's FIN would leave it open.
    socket.on('end', () => socket.end());
    socket.write(
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
        `Sec-WebSocket-Accept: ${acceptKey(String(req.headers['sec-websocket-key']))}\r\n\r\n`,
    );
    socket.on(
      'data',
      frameReader((op, payload) => {
        if (op === 0x8) socket.end(encodeFrame(Buffer.alloc(0), 0x8, false));
        else if (op === 0x1) socket.write(encodeFrame(Buffer.concat([Buffer.from('echo:'), payload]), 0x1, false));
      }),
    );
  });
}

export interface WsClient {
  status: 101;
  headers: IncomingHttpHeaders;
  send(text: string): void;
  /** The next text message. */
  next(): Promise<string>;
  close(): void;
}

/**
 * Opens a WebSocket to `url` (http://…). Resolves once upgraded; rejects with the response's
 * status and body (`{status, body, headers}`) when the server answers without upgrading.
 */
export function wsConnect(url: string, headers: Record<string, string> = {}): Promise<WsClient> {
  const key = randomBytes(16).toString('base64');
  return new Promise((resolve, reject) => {
    const req = request(url, {
      headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': key, ...headers },
    });
    req.on('upgrade', (res, socket, head) => {
      if (res.headers['sec-websocket-accept'] !== acceptKey(key)) {
        socket.destroy();
        reject(new Error(`bad Sec-WebSocket-Accept ${res.headers['sec-websocket-accept']}`));
        return;
      }
      const messages: string[] = [];
      const waiters: Array<(m: string) => void> = [];
      const read = frameReader((op, payload) => {
        if (op !== 0x1) return;
        const m = payload.toString('utf8');
        const w = waiters.shift();
        if (w) w(m);
        else messages.push(m);
      });
      if (head.length) read(head);
      socket.on('data', read);
      socket.on('error', () => {});
      resolve({
        status: 101,
        headers: res.headers,
        send: (text) => socket.write(encodeFrame(Buffer.from(text), 0x1, true)),
        next: () => (messages.length ? Promise.resolve(messages.shift()!) : new Promise((r) => waiters.push(r))),
        close: () => socket.end(encodeFrame(Buffer.alloc(0), 0x8, true)),
      });
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => reject(Object.assign(new Error(`no upgrade: ${res.statusCode}`), { status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() })));
    });
    req.on('error', reject);
    req.end();
  });
}
