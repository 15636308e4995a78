// Drive Collimate's MCP endpoint with the official MCP client (what an agent host does).
//   COLLIMATE_API_KEY=clm_… node --import tsx docs/examples/mcp_client.ts
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const base = process.env.COLLIMATE_BASE_URL ?? 'http://127.0.0.1:7070';
const transport = new StreamableHTTPClientTransport(new URL('/mcp', base), {
  requestInit: { headers: { authorization: `Bearer ${process.env.COLLIMATE_API_KEY}` } },
});
const client = new Client({ name: 'collimate-example', version: '1.0.0' });
await client.connect(transport);
console.log('protocol:', transport.protocolVersion);
console.log('tools:', (await client.listTools()).tools.map((t) => t.name).join(', '));

/** Calls a tool; returns its structured result or throws with the error text (e.g. "invalid_state: …"). */
async function call(name: string, args: Record<string, unknown>): Promise<any> {
  const r = await client.callTool({ name, arguments: args });
  if (r.isError) throw new Error((r.content as Array<{ text: string }>)[0].text);
  return r.structuredContent;
}

const sb = await call('create_sandbox', { template: 'base' });
console.log('created', sb.id);
console.log('exec:', (await call('exec', { sandbox_id: sb.id, command: 'echo 42 > /root/answer; cat /root/answer' })).stdout.trim());
const { sandboxes: children } = await call('fork_sandbox', { sandbox_id: sb.id, count: 2 });
for (const c of children) console.log(`child ${c.id} reads`, (await call('read_file', { sandbox_id: c.id, path: '/root/answer' })).content.trim());
for (const s of [...children, sb]) await call('delete_sandbox', { sandbox_id: s.id });
try {
  await call('get_sandbox', { sandbox_id: sb.id });
} catch (e) {
  console.log('after delete:', (e as Error).message.split(':')[0]);
}
await client.close();
