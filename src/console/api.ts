/**
 * The console's only way to the server: the public REST API and its event streams, with the key the
 * user signed in with (kept in sessionStorage, sent as Authorization: Bearer, never put in a URL).
 */
const KEY_ITEM = 'collimate.key';

export function storedKey(): string | null {
  return sessionStorage.getItem(KEY_ITEM);
}

export function storeKey(key: string): void {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function forgetKey(): void {
  sessionStorage.removeItem(KEY_ITEM);
}

/** An error answer of the API: its HTTP status, stable code and message. */
export class ApiError extends Error {
  constructor(readonly status: number, readonly code: string, message: string) {
    super(message);
  }
}

/** Called when the key is refused (401): the app signs out. */
let onUnauthorized: () => void = () => {};
export function whenUnauthorized(fn: () => void): void {
  onUnauthorized = fn;
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const key = storedKey();
  return { ...(key ? { authorization: `Bearer ${key}` } : {}), ...extra };
}

async function failure(res: Response): Promise<ApiError> {
  let code = 'http_' + res.status;
  let message = res.statusText;
  try {
    const body = await res.json();
    code = body.error?.code ?? code;
    message = body.error?.message ?? message;
  } catch { /* not JSON */ }
  if (res.status === 401) onUnauthorized();
  return new ApiError(res.status, code, message);
}

/** A request with a JSON body (or none); resolves to the parsed JSON answer (undefined for 204). */
/**
 * fetch, with a read (GET) sent again when it failed before any answer: the browser drops requests
 * in flight when the host's network changes (ERR_NETWORK_CHANGED: on a server's own host, each new
 * sandbox adds an interface), and a read is safe to repeat. Writes are never repeated.
 */
async function send(path: string, init: RequestInit): Promise<Response> {
  const reads = (init.method ?? 'GET') === 'GET' ? READ_RETRIES : 0;
  for (let attempt = 0; ; attempt++) {
    try {
      return await fetch(path, init);
    } catch (e) {
      if (attempt >= reads || (e as Error).name !== 'TypeError') throw e;
      await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
    }
  }
}
const READ_RETRIES = 2;

export async function api<T = any>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await send(path, {
    method,
    headers: headers(body === undefined ? {} : { 'content-type': 'application/json' }),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) throw await failure(res);
  if (res.status === 204) return undefined as T;
  return (await res.json()) as T;
}

/** A request with raw bytes for a body (uploads, stdin). */
export async function apiBytes<T = any>(method: string, path: string, body: BodyInit): Promise<T> {
  const res = await fetch(path, { method, headers: headers({ 'content-type': 'application/octet-stream' }), body });
  if (!res.ok) throw await failure(res);
  return (await res.json()) as T;
}

/** A response body as a Blob (downloads). */
export async function apiBlob(path: string): Promise<Blob> {
  const res = await send(path, { headers: headers() });
  if (!res.ok) throw await failure(res);
  return res.blob();
}

/**
 * Reads an SSE stream with fetch (EventSource cannot send the Authorization header): calls
 * `onEvent` per event until the stream ends or `signal` aborts. Resolves when it ends.
 */
export async function streamEvents(
  path: string,
  onEvent: (event: string, data: any) => void,
  opts: { signal: AbortSignal; method?: string; body?: unknown; onOpen?: () => void },
): Promise<void> {
  const res = await fetch(path, {
    method: opts.method ?? 'GET',
    headers: headers({ accept: 'text/event-stream', ...(opts.body === undefined ? {} : { 'content-type': 'application/json' }) }),
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
    signal: opts.signal,
  });
  if (!res.ok || !res.body) throw await failure(res);
  opts.onOpen?.();
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    for (let i; (i = buf.indexOf('\n\n')) >= 0; ) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let event = 'message';
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) event = line.slice(7);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
      }
      if (data.length) onEvent(event, JSON.parse(data.join('\n')));
    }
  }
}

/** Every sandbox of the tenant, all pages. */
export async function allSandboxes(query = ''): Promise<Sandbox[]> {
  const out: Sandbox[] = [];
  let after: string | null = null;
  do {
    const q = new URLSearchParams(query);
    q.set('limit', '1000');
    if (after) q.set('after', after);
    const page: { sandboxes: Sandbox[]; next: string | null } = await api('GET', `/v1/sandboxes?${q}`);
    out.push(...page.sandboxes);
    after = page.next;
  } while (after);
  return out;
}

/** Every snapshot of the tenant, or only those of `sandboxId`, all pages. */
export async function allSnapshots(sandboxId?: string): Promise<Snapshot[]> {
  const out: Snapshot[] = [];
  let after: string | null = null;
  do {
    const q = new URLSearchParams({ limit: '1000' });
    if (sandboxId) q.set('sandbox_id', sandboxId);
    if (after) q.set('after', after);
    const page: SnapshotList = await api('GET', `/v1/snapshots?${q}`);
    out.push(...page.snapshots);
    after = page.next;
  } while (after);
  return out;
}

/** Takes a snapshot of a running or suspended sandbox; `name` is only shown, not unique. */
export function takeSnapshot(sandboxId: string, name?: string): Promise<Snapshot> {
  return api('POST', `/v1/sandboxes/${sandboxId}/snapshots`, name ? { name } : {});
}

/** Starts `count` sandboxes from a snapshot (each with a fresh identity); resolves to all of them. */
export async function startFromSnapshot(snapshotId: string, count = 1): Promise<Sandbox[]> {
  const r = await api<CreateSandboxResponse>('POST', '/v1/sandboxes', count === 1 ? { snapshot: snapshotId } : { snapshot: snapshotId, count });
  return r.sandboxes ?? [r];
}

/** Rolls a sandbox back to one of its own snapshots, in place: its current memory, processes and files are discarded. */
export function rollBack(sandboxId: string, snapshotId: string): Promise<Sandbox> {
  return api('POST', `/v1/sandboxes/${sandboxId}/restore`, { snapshot: snapshotId });
}

export function deleteSnapshot(snapshotId: string): Promise<void> {
  return api('DELETE', `/v1/snapshots/${snapshotId}`);
}

/** Sandboxes, snapshots and metrics as the API returns them: the SDK's wire types, generated from the API's schemas. */
import type { CreateSandboxResponse, Sandbox, SandboxMetrics, Snapshot, SnapshotList } from '../../sdk/typescript/src/wire.generated.js';
export type { Sandbox, SandboxMetrics, Snapshot };
