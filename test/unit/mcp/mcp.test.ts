/** The MCP endpoint on the fake service: transport gate (Origin, key, methods), tools, tier parity with REST. */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { fixture, type Fixture } from '../api/helpers.js';
import { originAllowed } from '../../../src/mcp/origin.js';

let f: Fixture;
let url: string;
const ENV = { id: 'env-mine', kind: 'environment' as const, description: 'own', interpreter: ['/bin/sh', '-c'], ready: true, vcpus: 1, memory_mib: 256 };

before(async () => {
  f = await fixture({
    fake: {
      environments: {
        'demo-t': [ENV],
        'pro-parity': [ENV],
        'ent-parity': [ENV],
      },
      templateEgress: { node: 'none' },
    },
  });
  url = (await f.api.app.listen({ host: '127.0.0.1', port: 0 })) + '/mcp';
});
after(() => f.close());

async function connect(key: string): Promise<Client> {
  const c = new Client({ name: 'unit', version: '1' });
  await c.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${key}` } } }));
  return c;
}
const text = (r: any) => (r.content as Array<{ text: string }>)[0].text;

test('originAllowed: absent and loopback pass, others only when listed', () => {
  assert.equal(originAllowed(undefined, []), true);
  for (const o of ['http://localhost', 'http://localhost:3000', 'https://127.0.0.1:8443', 'http://[::1]:7070', 'http://app.localhost']) assert.equal(originAllowed(o, []), true, o);
  for (const o of ['http://evil.example', 'null', 'file://', 'http://127.0.0.1.evil.example', 'chrome-extension://abc']) assert.equal(originAllowed(o, []), false, o);
  assert.equal(originAllowed('https://app.example.com', ['https://app.example.com']), true);
  assert.equal(originAllowed('https://APP.example.com/', ['https://app.example.com']), true);
});

test('the HTTP gate: 403 foreign Origin before auth, 401 without a valid key, 405 GET/DELETE, 400 bad JSON', async () => {
  const key = f.key('gate-t', 'pro');
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' });
  const h = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
  let r = await fetch(url, { method: 'POST', headers: { ...h, origin: 'http://evil.example' }, body });
  assert.equal(r.status, 403);
  assert.equal(((await r.json()) as any).error.code, 'origin_forbidden');
  r = await fetch(url, { method: 'POST', headers: h, body });
  assert.equal(r.status, 401);
  assert.equal(((await r.json()) as any).error.code, 'unauthorized');
  r = await fetch(url, { method: 'POST', headers: { ...h, authorization: 'Bearer clm_' + 'z'.repeat(40) }, body });
  assert.equal(r.status, 401);
  for (const method of ['GET', 'DELETE']) {
    r = await fetch(url, { method, headers: { authorization: `Bearer ${key}` } });
    assert.equal(r.status, 405);
    assert.equal(r.headers.get('allow'), 'POST');
  }
  r = await fetch(url, { method: 'POST', headers: { ...h, authorization: `Bearer ${key}` }, body: '{nope' });
  assert.equal(r.status, 400);
  assert.equal(((await r.json()) as any).error.code, -32700);
});

test('tools carry input and output schemas; results are JSON text and structuredContent', async () => {
  const c = await connect(f.key('tools-t', 'pro'));
  try {
    const { tools } = await c.listTools();
    assert.equal(tools.length, 37);
    for (const t of tools) {
      assert.ok(t.outputSchema, `${t.name} has an output schema`);
      assert.equal(t.inputSchema.additionalProperties, false, `${t.name} rejects unknown arguments`);
    }
    const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'base', labels: { k: 'v' } } })).structuredContent as any;
    assert.deepEqual(sb.labels, { k: 'v' });
    const r = await c.callTool({ name: 'exec', arguments: { sandbox_id: sb.id, command: 'echo hi' } });
    assert.equal((r.structuredContent as any).stdout, 'hi\n');
    assert.deepEqual(JSON.parse(text(r)), r.structuredContent);
    // With a progress token, exec output arrives as progress notifications before the result.
    const progress: Array<{ progress: number; message?: string }> = [];
    const streamed = await c.callTool({ name: 'exec', arguments: { sandbox_id: sb.id, command: 'echo streamed' } }, undefined, { onprogress: (p) => progress.push(p) });
    assert.equal((streamed.structuredContent as any).stdout, 'streamed\n');
    assert.equal(progress.map((p) => p.message).join(''), 'streamed\n');
    assert.equal(progress[progress.length - 1].progress, 'streamed\n'.length, 'progress counts output bytes');
    const unknownArg = await c.callTool({ name: 'exec', arguments: { sandbox_id: sb.id, command: 'echo', shell: 'bash' } });
    assert.equal(unknownArg.isError, true);
    const malformedId = await c.callTool({ name: 'get_sandbox', arguments: { sandbox_id: '../etc' } });
    assert.match(text(malformedId), /^sandbox_not_found: /);
    const other = f.key('other-t', 'pro');
    const foreign = await (await connect(other)).callTool({ name: 'get_sandbox', arguments: { sandbox_id: sb.id } });
    assert.match(text(foreign), /^sandbox_not_found: /, "another tenant's id reads as not found");
    const badLabel = await c.callTool({ name: 'list_sandboxes', arguments: { labels: { 'bad key!': 'x' } } });
    assert.match(text(badLabel), /^validation_error: /);
  } finally {
    await c.close();
  }
});

/** Asks REST and MCP the same create and asserts the same answer: the code on failure, the fields that matter on success. */
async function sameCreate(c: Client, key: string, args: Record<string, unknown>, expected: string | null): Promise<void> {
  const rest = await f.req('createSandbox', { url: '/v1/sandboxes', key, body: args });
  const m = await c.callTool({ name: 'create_sandbox', arguments: args });
  if (expected === null) {
    assert.equal(rest.statusCode, 201, rest.body);
    assert.ok(!m.isError, text(m));
    const viaMcp = m.structuredContent as any;
    for (const k of ['template', 'timeout_secs', 'egress', 'state'] as const) assert.deepEqual(viaMcp[k], rest.json()[k], `${JSON.stringify(args)}: ${k}`);
    return;
  }
  assert.equal(rest.json().error.code, expected, `REST ${JSON.stringify(args)}`);
  assert.equal(m.isError, true);
  assert.ok(text(m).startsWith(`${expected}: `), `MCP ${JSON.stringify(args)}: ${text(m)}`);
}

test('tier rules are REST\'s for every tier: same codes and results for the same creates', async () => {
  const cases: Record<string, Array<[Record<string, unknown>, string | null]>> = {
    demo: [
      [{ template: 'env-mine' }, 'template_forbidden'],
      [{ template: 'nope' }, 'template_forbidden'],
      [{ template: 'base', timeout_secs: 901 }, 'tier_forbidden'],
      [{ template: 'node', egress: 'allow' }, 'egress_forbidden'],
    ],
    pro: [
      [{ template: 'env-mine' }, null],
      [{ template: 'nope' }, 'template_not_found'],
      [{ template: 'base', timeout_secs: 86_401 }, 'tier_forbidden'],
      [{ template: 'base', timeout_secs: 86_400 }, null],
      [{ template: 'node', egress: 'allow' }, 'egress_forbidden'],
      [{ template: 'base', egress: { domains: ['pypi.org'] } }, null],
      [{ template: 'base' }, null],
    ],
    enterprise: [
      [{ template: 'env-mine' }, null],
      [{ template: 'nope' }, 'template_not_found'],
      [{ template: 'base', timeout_secs: 7 * 86_400 + 1 }, 'tier_forbidden'],
      [{ template: 'base', timeout_secs: 7 * 86_400 }, null],
      [{ template: 'node', egress: 'allow' }, 'egress_forbidden'],
    ],
  };
  for (const [tier, list] of Object.entries(cases)) {
    const tenant = tier === 'demo' ? 'demo-parity' : tier === 'pro' ? 'pro-parity' : 'ent-parity';
    const key = f.key(tenant, tier as 'demo' | 'pro' | 'enterprise');
    const c = await connect(key);
    try {
      for (const [args, expected] of list) await sameCreate(c, key, args, expected);
      // An environment of another tenant does not exist for this one, through either door.
      if (tier !== 'demo') {
        const otherKey = f.key(`nobody-${tier}`, tier as 'pro');
        const other = await connect(otherKey);
        await sameCreate(other, otherKey, { template: 'env-mine' }, 'template_not_found').finally(() => other.close());
      }
    } finally {
      await c.close();
    }
  }
});

test('set_sandbox_timeout is REST\'s lease: moves expires_at, refuses past the tier maximum and while suspended', async () => {
  const key = f.key('lease-mcp');
  const c = await connect(key);
  try {
    const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'base', timeout_secs: 60, on_timeout: 'suspend', auto_resume: true } })).structuredContent as any;
    assert.deepEqual([sb.on_timeout, sb.auto_resume], ['suspend', true], 'what its session end does, chosen through MCP as through REST');
    const before = Date.now();
    const r = await c.callTool({ name: 'set_sandbox_timeout', arguments: { sandbox_id: sb.id, timeout_secs: 600 } });
    assert.ok(!r.isError, text(r));
    const set = r.structuredContent as any;
    assert.ok(Date.parse(set.expires_at) >= before + 600_000 && Date.parse(set.expires_at) <= Date.now() + 600_000, set.expires_at);
    assert.ok(set.remaining_secs > 599 && set.remaining_secs <= 600);
    assert.equal(set.timeout_secs, 60);
    const rest = (await f.req('getSandbox', { url: `/v1/sandboxes/${sb.id}`, key })).json();
    assert.equal(rest.expires_at, set.expires_at, 'one lease, seen through both doors');
    const tooLong = await c.callTool({ name: 'set_sandbox_timeout', arguments: { sandbox_id: sb.id, timeout_secs: 901 } });
    assert.match(text(tooLong), /^tier_forbidden: .*maximum session of 900 s.* s of it are left/);
    assert.equal((await c.callTool({ name: 'set_sandbox_timeout', arguments: { sandbox_id: sb.id, timeout_secs: 0 } })).isError, true);
    await c.callTool({ name: 'suspend_sandbox', arguments: { sandbox_id: sb.id } });
    assert.match(text(await c.callTool({ name: 'set_sandbox_timeout', arguments: { sandbox_id: sb.id, timeout_secs: 60 } })), /^invalid_state: /);
    await c.callTool({ name: 'delete_sandbox', arguments: { sandbox_id: sb.id } });
  } finally {
    await c.close();
  }
});

test('one concurrency cap across both doors; fork of a suspended sandbox works through MCP', async () => {
  const key = f.key('demo-t', 'demo');
  const c = await connect(key);
  try {
    const rest = async (body: unknown) => (await f.req('createSandbox', { url: '/v1/sandboxes', key, body })).json();
    const viaRest = await rest({ template: 'base' });
    const viaMcp = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'base' } })).structuredContent as any;
    assert.equal(viaMcp.timeout_secs, 900, "the tier's default session");
    const third = await c.callTool({ name: 'create_sandbox', arguments: { template: 'base' } });
    assert.match(text(third), /^concurrency_limit: .*\(retry after 5 s\)$/);
    assert.equal((await rest({ template: 'base' })).error.code, 'concurrency_limit');
    // Suspend frees a slot through either door; resume takes it back under the same cap.
    await c.callTool({ name: 'suspend_sandbox', arguments: { sandbox_id: viaRest.id } });
    const fits = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'base' } })).structuredContent as any;
    assert.ok(fits?.id);
    const resume = await c.callTool({ name: 'resume_sandbox', arguments: { sandbox_id: viaRest.id } });
    assert.match(text(resume), /^concurrency_limit: /);
    const fork = await c.callTool({ name: 'fork_sandbox', arguments: { sandbox_id: viaMcp.id } });
    assert.match(text(fork), /^concurrency_limit: /);
    // A suspended parent can be forked: its child takes a slot like any running sandbox.
    await c.callTool({ name: 'delete_sandbox', arguments: { sandbox_id: fits.id } });
    const forkSuspended = await c.callTool({ name: 'fork_sandbox', arguments: { sandbox_id: viaRest.id } });
    assert.ok(!forkSuspended.isError, text(forkSuspended));
    const [child] = (forkSuspended.structuredContent as any).sandboxes;
    assert.equal(child.state, 'running');
    assert.equal(child.parent, viaRest.id);
    const parent = (await c.callTool({ name: 'get_sandbox', arguments: { sandbox_id: viaRest.id } })).structuredContent as any;
    assert.equal(parent.state, 'suspended');
    assert.deepEqual(parent.children, [child.id]);
  } finally {
    await c.close();
  }
});

test('creates, forks and execs through MCP count in the lifecycle histograms like REST ones', async () => {
  const count = async (name: string) => {
    const m = new RegExp(`^${name}_count(?:\\{[^}]*\\})? (\\d+)$`, 'gm');
    return [...(await f.req('metrics', { url: '/metrics' })).body.matchAll(m)].reduce((n, x) => n + Number(x[1]), 0);
  };
  const before = { create: await count('collimate_create_seconds'), fork: await count('collimate_fork_seconds'), exec: await count('collimate_exec_seconds') };
  const c = await connect(f.key('metrics-t', 'pro'));
  try {
    const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'base' } })).structuredContent as any;
    await c.callTool({ name: 'exec', arguments: { sandbox_id: sb.id, command: 'echo 1' } });
    await c.callTool({ name: 'fork_sandbox', arguments: { sandbox_id: sb.id, count: 2 } });
  } finally {
    await c.close();
  }
  assert.equal(await count('collimate_create_seconds'), before.create + 1);
  assert.equal(await count('collimate_exec_seconds'), before.exec + 1);
  assert.equal(await count('collimate_fork_seconds'), before.fork + 1);
});

test('inspect right after an exec shows it counted, through REST and MCP', async () => {
  const key = f.key('activity-t', 'pro');
  const c = await connect(key);
  try {
    const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'base' } })).structuredContent as any;
    await c.callTool({ name: 'exec', arguments: { sandbox_id: sb.id, command: 'echo 1' } });
    await f.req('execSandbox', { url: `/v1/sandboxes/${sb.id}/exec`, key, body: { command: 'echo 2' } });
    const viaMcp = (await c.callTool({ name: 'get_sandbox', arguments: { sandbox_id: sb.id } })).structuredContent as any;
    const viaRest = (await f.req('getSandbox', { url: `/v1/sandboxes/${sb.id}`, key })).json();
    assert.equal(viaMcp.exec_count, 2);
    assert.equal(viaRest.exec_count, 2);
  } finally {
    await c.close();
  }
});

test('protocol revisions: the SDK (1.32) answers 2025-11-25 by default and echoes older supported ones', async () => {
  const key = f.key('proto-t', 'pro');
  const h = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${key}` };
  const negotiated = async (v: string) => {
    const r = await fetch(url, { method: 'POST', headers: h, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: v, capabilities: {}, clientInfo: { name: 'x', version: '1' } } }) });
    return /"protocolVersion":"([^"]+)"/.exec(await r.text())?.[1];
  };
  for (const v of ['2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05']) assert.equal(await negotiated(v), v);
  assert.equal(await negotiated('1999-01-01'), '2025-11-25');
  const r = await fetch(url, { method: 'POST', headers: { ...h, 'mcp-protocol-version': '2030-01-01' }, body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }) });
  assert.equal(r.status, 400);
});

test('create_sandbox takes egress; get_sandbox reads ports live; expose_port signs an absolute URL that needs no key', async () => {
  const app = createServer((req, res) => res.end(`app saw ${req.url} auth=${req.headers.authorization ?? 'none'}`));
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', r));
  const key = f.key('ports-t', 'pro');
  const c = await connect(key);
  try {
    const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'base', egress: { domains: ['PyPI.org'], ports: [443] } } })).structuredContent as any;
    assert.deepEqual(sb.egress, { domains: ['pypi.org'], cidrs: [], ports: [443] });
    const bad = await c.callTool({ name: 'create_sandbox', arguments: { template: 'base', egress: { domains: ['not a name'] } } });
    assert.equal(bad.isError, true);
    assert.match(text(bad), /not a domain name/);
    f.svc.portMap.set(8000, (app.address() as { port: number }).port);
    f.svc.listen(sb.id, [8000]);
    const got = (await c.callTool({ name: 'get_sandbox', arguments: { sandbox_id: sb.id } })).structuredContent as any;
    assert.deepEqual(got.ports, [{ port: 8000, protocol: 'tcp', url: `/v1/sandboxes/${sb.id}/ports/8000/` }]);
    const exposed = await c.callTool({ name: 'expose_port', arguments: { sandbox_id: sb.id, port: 8000, expires_in_secs: 120 } });
    const e = exposed.structuredContent as any;
    assert.ok(!exposed.isError, text(exposed));
    assert.equal(e.listening, true);
    assert.ok(e.url.startsWith(url.replace(/\/mcp$/, '') + '/v1/p/'), e.url);
    assert.ok(Math.abs(Date.parse(e.expires_at) - Date.now() - 120_000) < 5000);
    const r = await fetch(e.url + 'hello?x=1');
    assert.equal(r.status, 200);
    assert.equal(await r.text(), 'app saw /hello?x=1 auth=none');
    const notOpen = (await c.callTool({ name: 'expose_port', arguments: { sandbox_id: sb.id, port: 9000 } })).structuredContent as any;
    assert.equal(notOpen.listening, false);
    const foreign = await (await connect(f.key('other-ports-t', 'pro'))).callTool({ name: 'expose_port', arguments: { sandbox_id: sb.id, port: 8000 } });
    assert.match(text(foreign), /^sandbox_not_found: /);
  } finally {
    await c.close();
    app.closeAllConnections();
    await new Promise((r) => app.close(r));
  }
});

test('background processes over MCP: start, input, output read by offset (waiting for more), signal, wait, list', async () => {
  const key = f.key('proc-mcp', 'pro');
  const c = await connect(key);
  try {
    const sb = JSON.parse(text(await c.callTool({ name: 'create_sandbox', arguments: { template: 'base' } })));
    const started = await c.callTool({ name: 'start_process', arguments: { sandbox_id: sb.id, argv: ['cat'], stdin: true, tag: 'mcp' } });
    assert.ok(!started.isError, text(started));
    const p = started.structuredContent as { pid: number; status: string };
    assert.equal(p.status, 'running');
    const sent = await c.callTool({ name: 'send_process_input', arguments: { sandbox_id: sb.id, pid: p.pid, input: 'hello\n' } });
    assert.deepEqual(sent.structuredContent, { pid: p.pid, written: 6, stdin_closed: false });
    const first = (await c.callTool({ name: 'read_process_output', arguments: { sandbox_id: sb.id, pid: p.pid } })).structuredContent as any;
    assert.equal(first.output, 'hello\n');
    assert.equal(first.next, 6);
    // Nothing new yet: waits, and returns what arrives meanwhile.
    const later = c.callTool({ name: 'read_process_output', arguments: { sandbox_id: sb.id, pid: p.pid, from: first.next, wait_secs: 5 } });
    await new Promise((r) => setTimeout(r, 100));
    await c.callTool({ name: 'send_process_input', arguments: { sandbox_id: sb.id, pid: p.pid, input: 'again\n' } });
    const second = (await later).structuredContent as any;
    assert.equal(second.output, 'again\n');
    assert.equal(second.from, 6);
    assert.equal(second.next, 12);
    const listed = (await c.callTool({ name: 'list_processes', arguments: { sandbox_id: sb.id } })).structuredContent as any;
    assert.deepEqual(listed.processes.map((x: any) => x.tag), ['mcp']);
    await c.callTool({ name: 'signal_process', arguments: { sandbox_id: sb.id, pid: p.pid, signal: 'SIGTERM' } });
    const done = (await c.callTool({ name: 'wait_process', arguments: { sandbox_id: sb.id, pid: p.pid, timeout_secs: 5 } })).structuredContent as any;
    assert.equal(done.status, 'exited');
    assert.equal(done.signal, 15);
    const gone = await c.callTool({ name: 'send_process_input', arguments: { sandbox_id: sb.id, pid: p.pid, input: 'x' } });
    assert.ok(gone.isError);
    assert.match(text(gone), /^process_exited: /);
    const unknown = await c.callTool({ name: 'wait_process', arguments: { sandbox_id: sb.id, pid: 4242 } });
    assert.match(text(unknown), /^process_not_found: /);
  } finally {
    await c.close();
  }
});
