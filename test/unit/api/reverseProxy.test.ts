/** The server behind a TLS-terminating reverse proxy on the same host (docs/operations.md). */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { fixture } from './helpers.js';

test('URLs the server hands out follow X-Forwarded-Proto from a proxy on loopback', async () => {
  const f = await fixture();
  const base = await f.api.app.listen({ host: '127.0.0.1', port: 0 });
  const key = f.key('proxied', 'pro');
  const expose = async (headers: Record<string, string>) => {
    const c = new Client({ name: 'unit', version: '1' });
    await c.connect(new StreamableHTTPClientTransport(new URL(base + '/mcp'), { requestInit: { headers: { authorization: `Bearer ${key}`, ...headers } } }));
    try {
      const sb = (await c.callTool({ name: 'create_sandbox', arguments: { template: 'base' } })).structuredContent as any;
      f.svc.listen(sb.id, [8000]);
      return ((await c.callTool({ name: 'expose_port', arguments: { sandbox_id: sb.id, port: 8000 } })).structuredContent as any).url as string;
    } finally {
      await c.close();
    }
  };
  try {
    assert.match(await expose({}), new RegExp(`^${base}/v1/p/`));
    assert.match(await expose({ 'x-forwarded-proto': 'https' }), new RegExp(`^https://127\\.0\\.0\\.1:\\d+/v1/p/`));
  } finally {
    await f.close();
  }
});
