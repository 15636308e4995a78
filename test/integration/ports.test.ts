/**
 * The ports proxy on real VMs, through a real API server: a `python3 -m http.server` started in
 * the background of a sandbox answers through /v1/sandboxes/{id}/ports/8000/ with the tenant's key
 * (401 without, 404 for another tenant), through a signed URL without a key, is listed in the
 * sandbox's `ports`, and a WebSocket echo server written with node:http answers through the proxy.
 * Needs networking (root, ip, nft, /dev/net/tun); skipped with the reason otherwise.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import '../../src/service/migrations.ts';
import { netSettings } from '../../src/config.ts';
import { netAvailability } from '../../src/net/netns.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { checkResponse } from '../unit/api/helpers.ts';
import { wsConnect } from '../support/ws.ts';
import { assertNoLeaks, openEngine, testHome, serveEngine, type Served } from './fixture.ts';
import { waitListening, WS_SERVER } from './guestServers.ts';

const net = netAvailability(netSettings());


describe('ports proxy on real VMs', { skip: net.enabled ? false : `networking unavailable: ${net.reason}`, timeout: 900_000 }, () => {
  let engine: Engine;
  let api: Served;
  let home: string;
  let base: string;
  let key: string;
  let otherKey: string;

  before(async () => {
    home = testHome('ports');
    engine = await openEngine(home, { catalog: ['python', 'node'], poolSize: 1 });
    api = await serveEngine(engine);
    base = await api.app.listen({ host: '127.0.0.1', port: 0 });
    key = api.keys.create({ tenant: 'acme', tier: 'pro' }).key;
    otherKey = api.keys.create({ tenant: 'globex', tier: 'pro' }).key;
  });

  after(async () => {
    if (api) await api.close(1000);
    if (engine) await assertNoLeaks(engine, home);
  });

  const call = async (op: string | null, method: string, path: string, k: string | null, body?: unknown) => {
    const res = await fetch(base + path, {
      method,
      headers: { ...(k ? { authorization: `Bearer ${k}` } : {}), ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    const headers: Record<string, string> = {};
    res.headers.forEach((v, h) => (headers[h] = v));
    if (op) checkResponse(op, { statusCode: res.status, headers, body: text, json: () => JSON.parse(text) } as any);
    return { status: res.status, headers: res.headers, text, json: () => JSON.parse(text) };
  };

  it('python3 -m http.server in the background: with the key, without, another tenant, a signed URL, and in `ports`', async () => {
    const sb = (await call('createSandbox', 'POST', '/v1/sandboxes', key, { template: 'python' })).json();
    try {
      const start = await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, key, {
        command: `mkdir -p /srv/www && echo hello-from-the-sandbox > /srv/www/hello.txt && cd /srv/www && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &) && ${waitListening(8000)}; echo started`,
      });
      assert.match(start.json().stdout, /started/);

      const listing = await call(null, 'GET', `/v1/sandboxes/${sb.id}/ports/8000/`, key);
      assert.equal(listing.status, 200, listing.text);
      assert.match(listing.text, /Directory listing for \//);
      assert.match(listing.text, /hello\.txt/);
      const file = await call(null, 'GET', `/v1/sandboxes/${sb.id}/ports/8000/hello.txt`, key);
      assert.equal(file.text, 'hello-from-the-sandbox\n');
      // http.server has no POST: its own 501 comes back as it is, not as a proxy error.
      const post = await call(null, 'POST', `/v1/sandboxes/${sb.id}/ports/8000/`, key, { x: 1 });
      assert.equal(post.status, 501);
      assert.equal(post.headers.get('x-collimate-error'), null);

      const anonymous = await call('proxyPort', 'GET', `/v1/sandboxes/${sb.id}/ports/8000/`, null);
      assert.equal(anonymous.status, 401);
      assert.equal(anonymous.json().error.code, 'unauthorized');
      const foreign = await call('proxyPort', 'GET', `/v1/sandboxes/${sb.id}/ports/8000/`, otherKey);
      assert.equal(foreign.status, 404);
      assert.equal(foreign.json().error.code, 'sandbox_not_found');
      const closed = await call(null, 'GET', `/v1/sandboxes/${sb.id}/ports/8001/`, key);
      assert.equal(closed.status, 502);
      assert.equal(closed.json().error.code, 'port_unreachable');
      assert.equal(closed.headers.get('x-collimate-error'), 'port_unreachable');

      const minted = await call('createPortUrl', 'POST', `/v1/sandboxes/${sb.id}/port-urls`, key, { port: 8000, expires_in_secs: 600 });
      assert.equal(minted.status, 201, minted.text);
      const signed = await fetch(base + minted.json().url + 'hello.txt');
      assert.equal(signed.status, 200);
      assert.equal(await signed.text(), 'hello-from-the-sandbox\n');

      const got = (await call('getSandbox', 'GET', `/v1/sandboxes/${sb.id}`, key)).json();
      assert.ok(got.ports.some((p: any) => p.port === 8000 && p.protocol === 'tcp' && p.url === `/v1/sandboxes/${sb.id}/ports/8000/`), JSON.stringify(got.ports));
    } finally {
      await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${sb.id}`, key);
    }
  });

  it('fork a sandbox with a server listening: every child answers at its own port URL with its own state, and so does the parent', async () => {
    const sb = (await call('createSandbox', 'POST', '/v1/sandboxes', key, { template: 'python' })).json();
    const ids = [sb.id];
    try {
      await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, key, {
        command: `mkdir -p /srv/www && echo ${sb.id} > /srv/www/who && cd /srv/www && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &) && ${waitListening(8000)}`,
      });
      const kids = (await call('forkSandbox', 'POST', `/v1/sandboxes/${sb.id}/fork`, key, { count: 2 })).json();
      const children: string[] = (kids.sandboxes ?? kids).map((k: any) => k.id);
      assert.equal(children.length, 2);
      ids.push(...children);
      // The server process was forked with the memory; each child changes only its own file.
      for (const c of children) await call('execSandbox', 'POST', `/v1/sandboxes/${c}/exec`, key, { command: `echo ${c} > /srv/www/who` });
      for (const id of ids) {
        const r = await call(null, 'GET', `/v1/sandboxes/${id}/ports/8000/who`, key);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.text.trim(), id, `sandbox ${id} answered with ${r.text.trim()}`);
      }
    } finally {
      for (const id of ids.reverse()) await call(null, 'DELETE', `/v1/sandboxes/${id}`, key);
    }
  });

  it('a WebSocket echo server (node:http in the node template) answers through the proxy and a signed URL; the key does not reach it', async () => {
    const sb = (await call('createSandbox', 'POST', '/v1/sandboxes', key, { template: 'node' })).json();
    try {
      const start = await call('execSandbox', 'POST', `/v1/sandboxes/${sb.id}/exec`, key, {
        command: `(nohup node /root/ws.js >/root/ws.log 2>&1 &) && ${waitListening(9000)}; echo started`,
        files: [{ path: '/root/ws.js', content: WS_SERVER }],
      });
      assert.match(start.json().stdout, /started/);
      const ws = await wsConnect(`${base}/v1/sandboxes/${sb.id}/ports/9000/chat`, { authorization: `Bearer ${key}` });
      ws.send('hello');
      assert.equal(await ws.next(), 'echo:hello');
      ws.close();
      const { url } = (await call('createPortUrl', 'POST', `/v1/sandboxes/${sb.id}/port-urls`, key, { port: 9000 })).json();
      const ws2 = await wsConnect(`${base}${url}chat`);
      ws2.send('signed');
      assert.equal(await ws2.next(), 'echo:signed');
      ws2.close();
      await assert.rejects(wsConnect(`${base}/v1/sandboxes/${sb.id}/ports/9000/chat`), (e: any) => e.status === 401);
      const plain = await call(null, 'GET', `/v1/sandboxes/${sb.id}/ports/9000/x?y=1`, key);
      assert.equal(plain.text, 'plain /x?y=1');
    } finally {
      await call('deleteSandbox', 'DELETE', `/v1/sandboxes/${sb.id}`, key);
    }
  });
});
