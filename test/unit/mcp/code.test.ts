/**
 * The MCP code tools on the fake service, whose sandbox port 49999 is mapped to a stand-in for the
 * guest's code interpreter server (src/guest/code/server.py's protocol: NDJSON lines from
 * /execute?format=mime, contexts as JSON): run_code's text is what a notebook shows, each PNG is MCP
 * image content and is not repeated in structuredContent, an exception is text of the result (not
 * a tool error), the service's errors keep their codes, and the context tools reach the guest's
 * context routes.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CODE_PORT } from '../../../src/guest/codeServer.js';
import { fixture, type Fixture } from '../api/helpers.js';

/** A 1×1 PNG. */
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==';
const SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>';
const DEFAULT_CTX = '00000000-0000-4000-8000-000000000001';
const OWN_CTX = '00000000-0000-4000-8000-000000000002';

/** What a cell's source makes the stand-in answer: the NDJSON events of a real kernel for such a cell. */
const CELLS: Record<string, Array<Record<string, unknown>>> = {
  plot: [
    { type: 'stdout', text: 'plotting\n' },
    { type: 'result', is_main_result: false, data: { 'text/plain': '<Figure size 640x480 with 1 Axes>', 'image/png': PNG } },
    { type: 'result', is_main_result: true, data: { 'text/plain': '2' } },
    { type: 'number_of_executions', execution_count: 3 },
  ],
  raise: [
    { type: 'stderr', text: 'warning: about to fail\n' },
    { type: 'error', name: 'ZeroDivisionError', value: 'division by zero', traceback: 'Traceback (most recent call last):\n  Cell In[4], line 1\n    1/0\nZeroDivisionError: division by zero' },
    { type: 'number_of_executions', execution_count: 4 },
  ],
  svg: [{ type: 'result', is_main_result: true, data: { 'text/plain': '<IPython.core.display.SVG object>', 'image/svg+xml': SVG } }, { type: 'number_of_executions', execution_count: 5 }],
};

let f: Fixture;
let url: string;
let guest: Server;
/** The /execute bodies the stand-in received. */
const executed: Array<Record<string, unknown>> = [];
let contexts = [{ id: DEFAULT_CTX, language: 'python', cwd: '/root' }];

async function body(req: IncomingMessage): Promise<any> {
  let s = '';
  for await (const c of req) s += c;
  return s ? JSON.parse(s) : undefined;
}

before(async () => {
  guest = createServer(async (req, res) => {
    const b = await body(req);
    const path = req.url ?? '';
    const ctx = /^\/contexts\/([^/]+)/.exec(path)?.[1];
    if (ctx && !contexts.some((c) => c.id === ctx)) return res.writeHead(404, { 'content-type': 'text/plain' }).end(`Context ${ctx} not found`);
    if (req.method === 'POST' && path === '/execute?format=mime') {
      executed.push(b);
      if (b.code === 'crash') return res.writeHead(500, { 'content-type': 'text/plain' }).end('kernel died');
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      for (const ev of [{ type: 'context', id: b.context_id ?? DEFAULT_CTX, language: 'python' }, ...(CELLS[b.code] ?? []), { type: 'end_of_execution' }]) res.write(JSON.stringify(ev) + '\n');
      return res.end();
    }
    if (req.method === 'GET' && path === '/contexts') return res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(contexts));
    if (req.method === 'POST' && path === '/contexts') {
      const made = { id: OWN_CTX, language: b.language ?? 'python', cwd: b.cwd ?? '/root' };
      contexts.push(made);
      return res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(made));
    }
    if (req.method === 'POST' && path === `/contexts/${ctx}/restart`) return res.writeHead(200).end();
    if (req.method === 'DELETE' && ctx) {
      contexts = contexts.filter((c) => c.id !== ctx);
      return res.writeHead(204).end();
    }
    res.writeHead(400, { 'content-type': 'text/plain' }).end(`unexpected ${req.method} ${path}`);
  });
  await new Promise<void>((resolve) => guest.listen(0, '127.0.0.1', resolve));
  f = await fixture();
  f.svc.portMap.set(CODE_PORT, (guest.address() as AddressInfo).port);
  url = (await f.api.app.listen({ host: '127.0.0.1', port: 0 })) + '/mcp';
});
after(async () => {
  await f.close();
  guest.close();
});

async function connect(): Promise<Client> {
  const c = new Client({ name: 'unit', version: '1' });
  await c.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${f.key('mcp-code', 'pro')}` } } }));
  return c;
}
const texts = (r: any): string => (r.content as Array<{ type: string; text?: string }>).filter((c) => c.type === 'text').map((c) => c.text).join('\n');

test('run_code: stdout and values as text, a PNG as image content (not repeated in structuredContent), progress as the cell prints', async () => {
  const c = await connect();
  try {
    const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'python' } })).structuredContent as any;
    const progress: string[] = [];
    const r = await c.callTool({ name: 'run_code', arguments: { sandbox_id: sb.id, code: 'plot', language: 'python', seed: '42', timeout_secs: 30 } }, undefined, { onprogress: (p) => progress.push(p.message ?? '') });
    assert.equal(r.isError, undefined);
    assert.deepEqual(executed.at(-1), { code: 'plot', language: 'python', seed: '42' });
    const content = r.content as Array<Record<string, string>>;
    assert.deepEqual(content.map((x) => x.type), ['text', 'image', 'text'], 'the image sits after the text of its own output');
    assert.deepEqual(content[1], { type: 'image', data: PNG, mimeType: 'image/png' });
    assert.equal(content[0].text, 'stdout:\nplotting\nDisplay: <Figure size 640x480 with 1 Axes>');
    assert.match(content[2].text, /^Out\[3\]: 2\n\[In \[3\], context 00000000-0000-4000-8000-000000000001, \d+ ms, seed 42\]$/);
    assert.deepEqual(progress, ['plotting\n']);

    const s = r.structuredContent as any;
    assert.equal(s.stdout, 'plotting\n');
    assert.equal(s.execution_count, 3);
    assert.equal(s.context, DEFAULT_CTX);
    assert.equal(s.error, null);
    assert.equal(s.results[0].data['text/plain'], '<Figure size 640x480 with 1 Axes>');
    assert.match(s.results[0].data['image/png'], /^\(image 1 of this result/);
    assert.ok(!JSON.stringify(s).includes(PNG), 'the PNG travels once, as image content');
    assert.deepEqual(s.results[1], { is_main_result: true, data: { 'text/plain': '2' } });
  } finally {
    await c.close();
  }
});

test('run_code: an exception is the text of the result, SVG is text, service errors keep their codes', async () => {
  const c = await connect();
  try {
    const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'python' } })).structuredContent as any;
    const raised = await c.callTool({ name: 'run_code', arguments: { sandbox_id: sb.id, code: 'raise' } });
    assert.equal(raised.isError, undefined, 'an exception in the cell is its result, as in REST');
    const t = texts(raised);
    assert.match(t, /^stderr:\nwarning: about to fail\nZeroDivisionError: division by zero\nTraceback \(most recent call last\):\n {2}Cell In\[4\], line 1\n {4}1\/0\nZeroDivisionError: division by zero\n\[In \[4\], /);
    assert.deepEqual((raised.structuredContent as any).error.name, 'ZeroDivisionError');

    const svg = await c.callTool({ name: 'run_code', arguments: { sandbox_id: sb.id, code: 'svg' } });
    assert.deepEqual((svg.content as any[]).map((x) => x.type), ['text']);
    assert.ok(texts(svg).includes(`image/svg+xml:\n${SVG}`), texts(svg));

    const crashed = await c.callTool({ name: 'run_code', arguments: { sandbox_id: sb.id, code: 'crash' } });
    assert.equal(crashed.isError, true);
    assert.match(texts(crashed), /^code_unavailable: .*kernel died/);
    const both = await c.callTool({ name: 'run_code', arguments: { sandbox_id: sb.id, code: 'plot', language: 'python', context: DEFAULT_CTX } });
    assert.match(texts(both), /^validation_error: /);
    assert.match(texts(await c.callTool({ name: 'run_code', arguments: { sandbox_id: 'sbx_000000000000', code: '1' } })), /^sandbox_not_found: /);
    await c.callTool({ name: 'suspend_sandbox', arguments: { sandbox_id: sb.id } });
    assert.match(texts(await c.callTool({ name: 'run_code', arguments: { sandbox_id: sb.id, code: 'plot' } })), /^invalid_state: /);
  } finally {
    await c.close();
  }
});

test('code contexts: create, list, run in one, restart, delete; an unknown one is context_not_found', async () => {
  const c = await connect();
  try {
    const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'python' } })).structuredContent as any;
    const made = await c.callTool({ name: 'create_code_context', arguments: { sandbox_id: sb.id, language: 'python', cwd: '/tmp' } });
    assert.deepEqual(made.structuredContent, { id: OWN_CTX, language: 'python', cwd: '/tmp' });
    const listed = (await c.callTool({ name: 'list_code_contexts', arguments: { sandbox_id: sb.id } })).structuredContent as any;
    assert.deepEqual(listed.contexts.map((x: any) => x.id), [DEFAULT_CTX, OWN_CTX]);
    const ran = await c.callTool({ name: 'run_code', arguments: { sandbox_id: sb.id, code: 'plot', context: OWN_CTX } });
    assert.equal((ran.structuredContent as any).context, OWN_CTX);
    assert.deepEqual(executed.at(-1), { code: 'plot', context_id: OWN_CTX });
    assert.deepEqual((await c.callTool({ name: 'restart_code_context', arguments: { sandbox_id: sb.id, context: OWN_CTX } })).structuredContent, { id: OWN_CTX, language: 'python', cwd: '/tmp' });
    assert.deepEqual((await c.callTool({ name: 'delete_code_context', arguments: { sandbox_id: sb.id, context: OWN_CTX } })).structuredContent, { id: OWN_CTX, deleted: true });
    assert.match(texts(await c.callTool({ name: 'restart_code_context', arguments: { sandbox_id: sb.id, context: OWN_CTX } })), /^context_not_found: /);
    const malformed = await c.callTool({ name: 'delete_code_context', arguments: { sandbox_id: sb.id, context: '../execute' } });
    assert.equal(malformed.isError, true, 'a context id is a UUID');
  } finally {
    await c.close();
  }
});
