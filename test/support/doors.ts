/**
 * The three front doors — REST, MCP and E2B's API — as one small client each, with one shape of
 * outcome, so a test can run the same operations through every door and compare what a user gets:
 * `{ ok, id?, ids?, code? }` with `code` the stable error code (E2B's `error_code`, MCP's leading
 * `code:` of an error result). Talks HTTP to a running `collimate serve`.
 */
import { e2bKeyOf } from '../../src/service/keys.js';

export interface Outcome {
  ok: boolean;
  /** The sandbox made or acted on. */
  id?: string;
  /** A fork's children. */
  ids?: string[];
  /** The error code when not ok. */
  code?: string;
  /** What came back, for assertion messages. */
  raw: string;
}

export interface Door {
  name: 'rest' | 'mcp' | 'e2b';
  create(base: string, key: string, template?: string): Promise<Outcome>;
  fork(base: string, key: string, id: string, count?: number): Promise<Outcome>;
  suspend(base: string, key: string, id: string): Promise<Outcome>;
  resume(base: string, key: string, id: string): Promise<Outcome>;
  /** One sandbox started from snapshot `snapshot` (taken through REST: not every door takes them). */
  startFromSnapshot(base: string, key: string, snapshot: string): Promise<Outcome>;
  remove(base: string, key: string, id: string): Promise<Outcome>;
  /**
   * How this door's error messages name the operations they point the user to (errors.ts `see`);
   * null where the door has none and the message leaves the pointer out.
   */
  names: { suspend: string | null; resume: (id: string) => string | null; list: string | null };
}

/** One HTTP request with a key (none when ''): a string or Buffer body is sent as it is, anything else as JSON. */
export async function call(base: string, key: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(base + path, {
    method,
    headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
    body: body === undefined ? undefined : typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body),
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  let json: any = null;
  try {
    json = JSON.parse(bytes.toString('utf8'));
  } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, bytes, json };
}

const restOutcome = (r: Awaited<ReturnType<typeof call>>, ok: number): Outcome => (r.status === ok
  ? { ok: true, id: r.json?.id, ids: r.json?.sandboxes?.map((s: { id: string }) => s.id), raw: r.bytes.toString() }
  : { ok: false, code: r.json?.error?.code ?? `http_${r.status}`, raw: `${r.status} ${r.bytes.toString()}` });

export const rest: Door = {
  name: 'rest',
  create: async (base, key, template = 'base') => restOutcome(await call(base, key, 'POST', '/v1/sandboxes', { template }), 201),
  fork: async (base, key, id, count = 1) => restOutcome(await call(base, key, 'POST', `/v1/sandboxes/${id}/fork`, { count }), 201),
  suspend: async (base, key, id) => restOutcome(await call(base, key, 'POST', `/v1/sandboxes/${id}/suspend`), 200),
  resume: async (base, key, id) => restOutcome(await call(base, key, 'POST', `/v1/sandboxes/${id}/resume`), 200),
  startFromSnapshot: async (base, key, snapshot) => restOutcome(await call(base, key, 'POST', '/v1/sandboxes', { snapshot }), 201),
  remove: async (base, key, id) => restOutcome(await call(base, key, 'DELETE', `/v1/sandboxes/${id}`), 204),
  names: { suspend: 'POST /v1/sandboxes/{id}/suspend', resume: (id) => `POST /v1/sandboxes/${id}/resume`, list: 'GET /v1/sandboxes' },
};

async function tool(base: string, key: string, name: string, args: Record<string, unknown>): Promise<Outcome> {
  const r = await call(base, key, 'POST', '/mcp', { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name, arguments: args } }, { accept: 'application/json, text/event-stream' });
  const text = r.bytes.toString('utf8');
  if (r.status !== 200) return { ok: false, code: r.json?.error?.code ?? `http_${r.status}`, raw: text };
  const msg = r.json ?? JSON.parse(text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).pop()!);
  const result = msg.result as { isError?: boolean; content: Array<{ text: string }> };
  const out = result.content[0].text;
  if (result.isError) return { ok: false, code: /^([a-z_]+):/.exec(out)?.[1] ?? 'unknown', raw: out };
  const value = JSON.parse(out);
  return { ok: true, id: value.id, ids: value.sandboxes?.map((s: { id: string }) => s.id), raw: out };
}

export const mcp: Door = {
  name: 'mcp',
  create: (base, key, template = 'base') => tool(base, key, 'create_sandbox', { template }),
  fork: (base, key, id, count = 1) => tool(base, key, 'fork_sandbox', { sandbox_id: id, count }),
  suspend: (base, key, id) => tool(base, key, 'suspend_sandbox', { sandbox_id: id }),
  resume: (base, key, id) => tool(base, key, 'resume_sandbox', { sandbox_id: id }),
  startFromSnapshot: async (base, key, snapshot) => {
    const o = await tool(base, key, 'start_from_snapshot', { snapshot_id: snapshot });
    return o.ok ? { ...o, id: o.ids?.[0] } : o;
  },
  remove: (base, key, id) => tool(base, key, 'delete_sandbox', { sandbox_id: id }),
  names: { suspend: 'the suspend_sandbox tool', resume: () => 'the resume_sandbox tool', list: 'the list_sandboxes tool' },
};

async function e2bCall(base: string, key: string, method: string, path: string, body: unknown, ok: number[]): Promise<Outcome> {
  const r = await call(base, '', method, `/e2b/api${path}`, body, { 'x-api-key': e2bKeyOf(key) });
  if (!ok.includes(r.status)) return { ok: false, code: r.json?.error_code ?? `http_${r.status}`, raw: `${r.status} ${r.bytes.toString()}` };
  // A fork answers one entry per child, each a sandbox or an error.
  const entries = Array.isArray(r.json) ? (r.json as Array<{ sandbox?: { sandboxID: string }; error?: { error_code: string } }>) : undefined;
  const failed = entries?.find((e) => !e.sandbox);
  if (failed) return { ok: false, code: failed.error?.error_code ?? 'unknown', raw: r.bytes.toString() };
  return { ok: true, id: r.json?.sandboxID, ids: entries?.map((e) => e.sandbox!.sandboxID), raw: r.bytes.toString() };
}

export const e2b: Door = {
  name: 'e2b',
  create: (base, key, template = 'base') => e2bCall(base, key, 'POST', '/sandboxes', { templateID: template }, [201]),
  fork: (base, key, id, count = 1) => e2bCall(base, key, 'POST', `/sandboxes/${id}/fork`, { count }, [201]),
  suspend: (base, key, id) => e2bCall(base, key, 'POST', `/sandboxes/${id}/pause`, undefined, [204]),
  // E2B's resume of a paused sandbox (connect resumes too, and answers 200 for a running one).
  resume: (base, key, id) => e2bCall(base, key, 'POST', `/sandboxes/${id}/resume`, {}, [201]),
  // E2B starts a sandbox from a snapshot by naming the snapshot as the template.
  startFromSnapshot: (base, key, snapshot) => e2bCall(base, key, 'POST', '/sandboxes', { templateID: snapshot }, [201]),
  remove: (base, key, id) => e2bCall(base, key, 'DELETE', `/sandboxes/${id}`, undefined, [204]),
  // A pause of a paused sandbox is E2B's own message ("already paused"), with nothing to point to.
  names: { suspend: 'sandbox.pause()', resume: () => null, list: 'Sandbox.list()' },
};

export const DOORS: Door[] = [rest, mcp, e2b];
