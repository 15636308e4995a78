/**
 * A web terminal on a sandbox: a shell started as a PTY process (POST …/processes with `pty`), its
 * output streamed from GET …/processes/{pid}/output (SSE), keystrokes sent to …/stdin in order, the
 * size kept in step with …/resize. Closing it hangs the shell up.
 */
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { api, apiBytes, fromBase64, streamEvents } from '../api.js';

export interface WebTerminal {
  close(): void;
}

export async function openTerminal(el: HTMLElement, sandboxId: string, onExit: (code: number | null) => void): Promise<WebTerminal> {
  const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false });
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
  const abort = new AbortController();
  let closed = false;

  // Keystrokes go one request at a time, so they arrive in the order typed.
  let typing = Promise.resolve();
  const encoder = new TextEncoder();
  const typed = term.onData((data) => {
    const bytes = encoder.encode(data);
    typing = typing.then(() => apiBytes('POST', `${path}/stdin`, bytes)).then(() => {}, (err) => {
      if (!closed) term.write(`\r\n[input refused: ${(err as Error).message}]\r\n`);
    });
  });
  const resized = term.onResize(({ cols, rows }) => void api('POST', `${path}/resize`, { cols, rows }).catch(() => {}));
  const observer = new ResizeObserver(() => fit.fit());
  observer.observe(el);

  void streamEvents(`${path}/output`, (event, data) => {
    if (event === 'pty' || event === 'stdout' || event === 'stderr') term.write(fromBase64(data.data));
    else if (event === 'exit') {
      term.write(`\r\n[process exited with ${data.process.exit_code}]\r\n`);
      onExit(data.process.exit_code);
    }
  }, { signal: abort.signal }).catch((err) => {
    if (!abort.signal.aborted) term.write(`\r\n[output stream ended: ${(err as Error).message}]\r\n`);
  });
  term.focus();

  return {
    close() {
      if (closed) return;
      closed = true;
      abort.abort();
      observer.disconnect();
      typed.dispose();
      resized.dispose();
      term.dispose();
      void api('POST', `${path}/signal`, { signal: 'SIGHUP' }).catch(() => {});
    },
  };
}
