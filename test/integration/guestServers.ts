/**
 * Servers the port tests run inside a guest: a wait for a listening port, and a WebSocket echo
 * server on node:http (the node template) that also answers plain HTTP with `plain <url>`.
 */
/** Waits (inside the guest) until something listens on `port`: /proc/net/tcp lists it in hex. */
export const waitListening = (port: number) =>
  `for i in $(seq 100); do grep -q " 00000000:${port.toString(16).toUpperCase().padStart(4, '0')} " /proc/net/tcp && break; sleep 0.1; done`;

/** A WebSocket echo server on node:http, as the guest runs it (Node has no WebSocket server built in). */
export const WS_SERVER = String.raw`
const http = require('node:http');
const crypto = require('node:crypto');
const server = http.createServer((req, res) => res.end('plain ' + req.url));
server.on('upgrade', (req, socket) => {
  const accept = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + '\r\n\r\n');
  let buf = Buffer.alloc(0);
  socket.on('end', () => socket.end());
  socket.on('error', () => {});
  socket.on('data', (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    while (buf.length >= 2) {
      const op = buf[0] & 15, masked = buf[1] & 128;
      let len = buf[1] & 127, off = 2;
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; }
      const need = off + (masked ? 4 : 0) + len;
      if (buf.length < need) return;
      const key = buf.subarray(off, off + 4);
      const data = Buffer.from(buf.subarray(off + (masked ? 4 : 0), need));
      if (masked) for (let i = 0; i < data.length; i++) data[i] ^= key[i & 3];
      buf = buf.subarray(need);
      if (op === 8) { socket.end(Buffer.from([0x88, 0])); return; }
      const out = Buffer.concat([Buffer.from('echo:' + (req.headers.authorization ? 'KEY-LEAKED:' : '')), data]);
      socket.write(Buffer.concat([Buffer.from([0x81, out.length]), out]));
    }
  });
});
server.listen(9000, '0.0.0.0');
`;
