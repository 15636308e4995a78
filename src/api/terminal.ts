/**
 * The web terminal's WebSocket: GET /v1/sandboxes/{id}/processes/{pid}/terminal with Upgrade:
 * websocket bridges a PTY process. Browsers cannot set an Authorization header on a WebSocket, so
 * the key comes as a subprotocol `bearer.<key>` beside `collimate.terminal` (the one the server
 * selects, so the key is never echoed back); it is never in the URL and never logged.
 *
 * Frames: server → client, binary: the terminal's output (everything the server still holds first,
 * then live); text: JSON `{"type":"exit","process":Process}` before a normal close, or
 * `{"type":"error","error":{code,message}}`. Client → server, binary: keystrokes, written to the
 * terminal in order; text: JSON `{"type":"resize","cols","rows"}`. Closing the socket leaves the
 * process running (signal it to end it).
 */
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer, type WebSocket } from 'ws';
import { z } from 'zod';
import { CollimateError } from '../errors.js';
import type { TenantService } from '../service/tenantService.js';
import type { Scope } from '../service/types.js';
import { restNames } from './routes.js';
import { toClientError, type ErrorLog } from '../wire/errors.js';
import * as S from '../wire/schemas.js';

export const TERMINAL_SUBPROTOCOL = 'collimate.terminal';
const TERMINAL_PATH = /^\/v1\/sandboxes\/([^/?#]+)\/processes\/([^/?#]+)\/terminal\/?(?:\?.*)?$/;
/** Output waiting to be sent past which the terminal stops reading more (a client that reads slowly). */
const PENDING_MAX = 4 * 1024 * 1024;
/** Keystroke bytes waiting to go into the process before the client's socket is paused. */
const INPUT_PENDING_MAX = 1024 * 1024;

const ResizeMessage = z.strictObject({ type: z.literal('resize'), cols: z.number().int().min(1).max(65535), rows: z.number().int().min(1).max(65535) });

export function notATerminal(pid: number): CollimateError {
  return new CollimateError('not_a_terminal', `Process ${pid} was not started with a pty; start one with "pty": {} to attach a terminal.`);
}

export function isTerminalPath(url: string): boolean {
  return TERMINAL_PATH.test(url);
}

/** The API key among the offered subprotocols (`bearer.<key>`), if there is one. */
export function keyFromSubprotocols(header: string | string[] | undefined): string | undefined {
  const offered = (Array.isArray(header) ? header.join(',') : header ?? '').split(',').map((p) => p.trim());
  return offered.find((p) => p.startsWith('bearer.'))?.slice('bearer.'.length) || undefined;
}

/**
 * What would make the WebSocket library refuse the handshake (RFC 6455 §4.2.1), as the door's own
 * error: the library answers those in text/plain-like HTML of its own, and this door's refusals are
 * JSON errors like every other (routes.ts processTerminal).
 */
export function handshakeProblem(req: IncomingMessage): CollimateError | null {
  if (req.method !== 'GET') return new CollimateError('method_not_allowed', 'A WebSocket opens with GET.');
  const key = req.headers['sec-websocket-key'];
  const version = req.headers['sec-websocket-version'];
  if (typeof key !== 'string' || !/^[+/0-9A-Za-z]{22}==$/.test(key.trim()) || (version !== '13' && version !== '8')) {
    return new CollimateError('validation_error', 'Not a WebSocket handshake: send Sec-WebSocket-Version: 13 and Sec-WebSocket-Key, 16 random bytes in base64 (RFC 6455).');
  }
  const offered = String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim());
  if (offered.some((p) => !/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(p)) || new Set(offered).size !== offered.length) {
    return new CollimateError('validation_error', `Sec-WebSocket-Protocol must list distinct tokens: ${TERMINAL_SUBPROTOCOL} and bearer.<key>.`);
  }
  return null;
}

export interface TerminalBridge {
  /** Handles an upgrade to a terminal path; `reject` answers a refused one over HTTP. */
  handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer, reject: (socket: Duplex, err: CollimateError) => void): void;
  closeAll(): void;
}

export function terminalBridge(tenants: TenantService, log: ErrorLog): TerminalBridge {
  const wss = new WebSocketServer({ noServer: true, maxPayload: 1024 * 1024, handleProtocols: (protocols) => (protocols.has(TERMINAL_SUBPROTOCOL) ? TERMINAL_SUBPROTOCOL : false) });
  const open = new Set<WebSocket>();

  const bridge = (ws: WebSocket, scope: Scope, id: string, pid: number) => {
    open.add(ws);
    let unsubscribe: (() => void) | undefined;
    let closed = false;
    const fail = (err: unknown) => {
      if (ws.readyState !== ws.OPEN) return;
      const e = toClientError(err, log);
      ws.send(JSON.stringify({ type: 'error', error: e.toJSON(restNames).error }));
      ws.close(1011, e.code);
    };
    // Keystrokes are written one after another, in the order they came. A client typing (pasting)
    // faster than the terminal takes it is paused, not buffered for: reading its socket resumes
    // once what is waiting has gone in.
    let typing: Promise<unknown> = Promise.resolve();
    let waiting = 0;
    ws.on('message', (data, isBinary) => {
      const bytes = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
      if (isBinary) {
        waiting += bytes.length;
        if (waiting > INPUT_PENDING_MAX) ws.pause();
        typing = typing.then(() => tenants.sandboxes.writeProcessStdin(scope, id, pid, bytes)).catch(fail).finally(() => {
          waiting -= bytes.length;
          if (waiting <= INPUT_PENDING_MAX && ws.isPaused) ws.resume();
        });
        return;
      }
      let msg: unknown;
      try { msg = JSON.parse(bytes.toString('utf8')); } catch { msg = undefined; }
      const resize = ResizeMessage.safeParse(msg);
      if (!resize.success) return fail(new CollimateError('validation_error', 'A text frame must be {"type":"resize","cols":N,"rows":N}; keystrokes go in binary frames.'));
      typing = typing.then(() => tenants.sandboxes.resizeProcess(scope, id, pid, resize.data.cols, resize.data.rows)).catch(fail);
    });
    ws.on('close', () => {
      closed = true;
      open.delete(ws);
      unsubscribe?.();
    });
    ws.on('error', () => ws.terminate());
    tenants.sandboxes
      .watchProcessOutput(scope, id, pid, 'start', (e) => {
        if (ws.readyState !== ws.OPEN) return;
        if (e.type === 'output') {
          if (ws.bufferedAmount > PENDING_MAX) return; // a reader this slow misses output, as a terminal that scrolled
          ws.send(e.data, { binary: true });
        } else if (e.type === 'exit') {
          ws.send(JSON.stringify({ type: 'exit', process: e.process }));
          ws.close(1000, 'exited');
        }
      })
      .then((unsub) => (closed ? unsub() : (unsubscribe = unsub)), fail);
  };

  return {
    handleUpgrade(req, socket, head, reject) {
      void (async () => {
        try {
          const m = TERMINAL_PATH.exec(req.url ?? '')!;
          const scope = await tenants.accounts.authenticate(keyFromSubprotocols(req.headers['sec-websocket-protocol']));
          // A percent-encoding that decodes to nothing (`%ff`) names no sandbox; decodeURIComponent threw (a 500).
          const id = (() => { try { return decodeURIComponent(m[1]); } catch { return m[1]; } })();
          if (!S.SANDBOX_ID_RE.test(id)) throw new CollimateError('sandbox_not_found', `No sandbox with id ${id.slice(0, 100)}. List yours with GET /v1/sandboxes.`);
          if (!/^[1-9][0-9]{0,9}$/.test(m[2])) throw new CollimateError('process_not_found', 'A process is named by its pid, a positive integer.');
          const pid = Number(m[2]);
          const proc = await tenants.sandboxes.getProcess(scope, id, pid);
          if (!proc.pty) throw notATerminal(pid);
          if (!String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim()).includes(TERMINAL_SUBPROTOCOL)) {
            throw new CollimateError('validation_error', `Offer the subprotocol ${TERMINAL_SUBPROTOCOL} beside bearer.<key>.`);
          }
          tenants.quotas.holdStream(scope, socket);
          const problem = handshakeProblem(req);
          if (problem) throw problem;
          wss.handleUpgrade(req, socket, head, (ws) => bridge(ws, scope, id, pid));
        } catch (err) {
          reject(socket, toClientError(err, log));
        }
      })();
    },
    closeAll() {
      for (const ws of [...open]) ws.terminate();
      open.clear();
    },
  };
}
