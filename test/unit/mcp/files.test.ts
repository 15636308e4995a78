/** The MCP file tools on the fake service: the same service calls and views as REST's /fs routes. */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { fixture, type Fixture } from '../api/helpers.js';

let f: Fixture;
let url: string;

before(async () => {
  f = await fixture();
  url = (await f.api.app.listen({ host: '127.0.0.1', port: 0 })) + '/mcp';
});
after(() => f.close());

const text = (r: any) => (r.content as Array<{ text: string }>)[0].text;

test('list_directory, stat_path, path_exists, make_directory, rename_path, remove_path and watch_directory', async () => {
  const key = f.key('mcp-files', 'pro');
  const c = new Client({ name: 'unit', version: '1' });
  await c.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${key}` } } }));
  try {
    const call = async (name: string, args: Record<string, unknown>) => {
      const r = await c.callTool({ name, arguments: args });
      if (!r.isError) assert.deepEqual(JSON.parse(text(r)), r.structuredContent);
      return r;
    };
    const sb = (await call('create_sandbox', { template: 'base' })).structuredContent as any;
    const id = sb.id;
    let r = await call('make_directory', { sandbox_id: id, path: 'work/in', mode: '750' });
    assert.equal((r.structuredContent as any).created, true);
    assert.equal((r.structuredContent as any).entry.path, '/root/work/in');
    assert.equal((r.structuredContent as any).entry.permissions, 'rwxr-x---');
    await call('write_file', { sandbox_id: id, path: '/root/work/in/a.txt', content: 'hello' });
    r = await call('stat_path', { sandbox_id: id, path: '/root/work/in/a.txt' });
    assert.equal((r.structuredContent as any).size, 5);
    assert.deepEqual((await call('path_exists', { sandbox_id: id, path: '/root/work/none' })).structuredContent, { path: '/root/work/none', exists: false });
    r = await call('list_directory', { sandbox_id: id, path: '/root/work', depth: 2 });
    assert.deepEqual((r.structuredContent as any).entries.map((e: any) => e.name), ['in', 'a.txt']);
    r = await call('rename_path', { sandbox_id: id, from: '/root/work/in/a.txt', to: '/root/work/b.txt' });
    assert.equal((r.structuredContent as any).path, '/root/work/b.txt');

    // A watch collects changes for its duration; the change here comes from another call meanwhile.
    const watching = call('watch_directory', { sandbox_id: id, path: '/root/work', duration_secs: 1 });
    await new Promise((res) => setTimeout(res, 200));
    await call('remove_path', { sandbox_id: id, path: '/root/work/b.txt' });
    const w = (await watching).structuredContent as any;
    assert.deepEqual(w, { path: '/root/work', events: [{ op: 'remove', name: 'b.txt' }], ended: null });

    const missing = await call('stat_path', { sandbox_id: id, path: '/root/work/b.txt' });
    assert.equal(missing.isError, true);
    assert.match(text(missing), /^file_not_found: /);
    await call('write_file', { sandbox_id: id, path: '/root/work/f', content: '' });
    assert.match(text(await call('make_directory', { sandbox_id: id, path: '/root/work/f' })), /^file_exists: /);
    assert.match(text(await call('make_directory', { sandbox_id: id, path: '/root/work/f/sub' })), /^not_a_directory: /);
    const foreign = await new Client({ name: 'other', version: '1' });
    await foreign.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${f.key('mcp-other', 'pro')}` } } }));
    assert.match(text(await foreign.callTool({ name: 'list_directory', arguments: { sandbox_id: id, path: '/' } })), /^sandbox_not_found: /);
    await foreign.close();
  } finally {
    await c.close();
  }
});
