/**
 * A web terminal on a sandbox: a shell started as a PTY process (POST …/processes with `pty`), then
 * attached over the terminal WebSocket (…/processes/{pid}/terminal): output arrives as binary
 * frames, keystrokes leave as binary frames in the order typed, resizes as text frames. The key
 * goes as the subprotocol `bearer.<key>` (a browser cannot set Authorization on a WebSocket), never
 * in the URL. Closing the terminal hangs the shell up.
 */
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { api, storedKey } from '../api.js';

export interface WebTerminal {
  close(): void;
}

const TERMINAL_SUBPROTOCOL = 'collimate.terminal';

export async function openTerminal(el: HTMLElement, sandboxId: string, onExit: (code: number | null) => void): Promise<WebTerminal> {
  const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(el);
  fit.fit();
  const base = `/v1/sandboxes/${sandboxId}/processes`;
  const proc = await api<{ pid: number }>('POST', base, {
    argv: ['/bin/sh', '-i'],
    env: { TERM: 'xterm-256color' },
    pty: { cols: term.cols, rows: term.rows },
    tag: 'console-terminal',
  });
  const path = `${base}/${proc.pid}`;
  let closed = false;

  const url = new URL(`${path}/terminal`, location.href);
  url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const ws = new WebSocket(url, [TERMINAL_SUBPROTOCOL, `bearer.${storedKey()}`]);
  ws.binaryType = 'arraybuffer';
  ws.addEventListener('message', (e) => {
    if (e.data instanceof ArrayBuffer) return term.write(new Uint8Array(e.data));
    const msg = JSON.parse(String(e.data));
    if (msg.type === 'exit') {
      term.write(`\r\n[process exited with ${msg.process.exit_code}]\r\n`);
      onExit(msg.process.exit_code);
    } else if (msg.type === 'error') term.write(`\r\n[${msg.error.code}: ${msg.error.message}]\r\n`);
  });
  ws.addEventListener('close', () => {
    if (!closed) term.write('\r\n[disconnected]\r\n');
  });
  await new Promise<void>((resolve, reject) => {
    ws.addEventListener('open', () => resolve(), { once: true });
    ws.addEventListener('error', () => reject(new Error('The terminal connection was refused.')), { once: true });
  });

  // Ctrl+Shift+C copies the selection (Ctrl+C is the shell's interrupt); Ctrl+Shift+V and the
  // browser's own paste reach xterm.js as a paste.
  term.attachCustomKeyEventHandler((e) => {
    if (e.type === 'keydown' && e.ctrlKey && e.shiftKey && e.code === 'KeyC' && term.hasSelection()) {
      void navigator.clipboard?.writeText(term.getSelection()).catch(() => {});
      return false;
    }
    return true;
  });
  const encoder = new TextEncoder();
  const typed = term.onData((data) => ws.readyState === WebSocket.OPEN && ws.send(encoder.encode(data)));
  const resized = term.onResize(({ cols, rows }) => ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ type: 'resize', cols, rows })));
  const observer = new ResizeObserver(() => fit.fit());
  observer.observe(el);
  term.focus();

  return {
    close() {
      if (closed) return;
      closed = true;
      ws.close(1000);
      observer.disconnect();
      typed.dispose();
      resized.dispose();
      term.dispose();
      void api('POST', `${path}/signal`, { signal: 'SIGHUP' }).catch(() => {});
    },
  };
}
