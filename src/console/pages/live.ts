/**
 * The tenant's live event stream (GET /v1/events): calls `onChange` (coalesced to one call per
 * animation frame) for each sandbox change, and `onOpen` once the stream is in place. A dropped
 * stream is reopened after a pause; the returned function closes it.
 */
import { streamEvents } from '../api.js';

export function followSandboxes(onChange: (ids: Set<string>) => void, onOpen: () => void = () => {}): () => void {
  const abort = new AbortController();
  let pending: Set<string> | null = null;
  const flush = () => {
    const ids = pending!;
    pending = null;
    onChange(ids);
  };
  const run = async () => {
    while (!abort.signal.aborted) {
      try {
        await streamEvents('/v1/events', (event, data) => {
          if (event !== 'sandbox') return;
          if (!pending) {
            pending = new Set();
            setTimeout(flush, 50);
          }
          pending.add(data.sandbox_id);
        }, { signal: abort.signal, onOpen });
      } catch (err) {
        if (abort.signal.aborted || (err as { status?: number }).status === 401) return;
      }
      if (!abort.signal.aborted) await new Promise((r) => setTimeout(r, 2000));
    }
  };
  void run();
  return () => abort.abort();
}
