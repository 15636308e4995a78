/**
 * Networking on real VMs: a namespace per sandbox, the egress policy enforced on the host, ports
 * of forked children. Test hosts live in network namespaces this test makes (198.51.100.10 = host
 * A, 203.0.113.10 = host B, documentation ranges), names come from a DNS server this test runs on
 * loopback (the engine's upstream).
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { createServer, type Server } from 'node:http';
import { get } from 'node:http';
import { networkInterfaces } from 'node:os';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { openEngine, testHome, assertNoLeaks } from './fixture.ts';
import { netSettings } from '../../src/config.ts';
import { homeNamespaces, netFor } from '../../src/net/netns.ts';
import type { Engine } from '../../src/sandboxes/engine.ts';
import { TenantService } from '../../src/service/tenantService.ts';
import { trustedScope } from '../../src/service/types.ts';
import { CODE_PORT } from '../../src/guest/codeServer.ts';

const sh = (c: string) => execFileSync('/bin/sh', ['-c', c], { stdio: 'pipe' }).toString();
const T = { tenant: 'net' };

/** An HTTP server in a namespace of its own that answers `name` (no reverse lookups, unlike http.server). */
const HOST_PY = `
import http.server, socketserver, sys
name, addr = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = name.encode()
        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
class S(socketserver.ThreadingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    daemon_threads = True
servers = [S((addr, p), H) for p in (80, 81)]
import threading
for s in servers[1:]: threading.Thread(target=s.serve_forever, daemon=True).start()
print('ready', flush=True)
servers[0].serve_forever()
`;

interface TestHost { ns: string; veth: string; proc: ChildProcess }

/**
 * Test hosts of an earlier run that was killed before its clean-up (a namespace's name carries the
 * pid of the test process that made it): their veths hold the gateway addresses, so the route to A
 * or B would lead to a host that is dead, or to an orphaned server of that run. Their servers are
 * stopped and their namespaces removed, which removes their veth pairs.
 */
function dropStaleHosts(): void {
  for (const line of sh('ip netns list').split('\n')) {
    const m = /^(ctest-[abc]-(\w+))\b/.exec(line);
    if (!m) continue;
    const pid = /^\d+$/.test(m[2]) ? Number(m[2]) : 0;
    if (pid === process.pid) continue;
    if (pid) try { process.kill(pid, 0); continue; } catch { /* its test process is gone */ }
    for (const p of sh(`ip netns pids ${m[1]}`).split(/\s+/).filter(Boolean)) try { process.kill(Number(p), 'SIGKILL'); } catch { /* gone */ }
    // The namespace goes away asynchronously, and its veth with it: the host end is removed now.
    const peer = (JSON.parse(sh(`ip -n ${m[1]} -j link show eth0 2>/dev/null || echo '[]'`)) as Array<{ link_index?: number }>)[0]?.link_index;
    sh(`ip netns del ${m[1]}`);
    const host = (JSON.parse(sh('ip -j link show')) as Array<{ ifindex: number; ifname: string }>).find((l) => l.ifindex === peer);
    if (host) sh(`ip link del ${host.ifname} 2>/dev/null || true`);
  }
}

async function makeHost(tag: string, name: string, ip: string, gw: string, script: string): Promise<TestHost> {
  const holder = sh(`ip -4 -o addr show to ${gw}/32`).trim();
  if (holder) throw new Error(`${gw} is already on a host interface (${holder}); a test host of another run holds it`);
  const ns = `ctest-${tag}-${process.pid}`;
  const veth = `ct${tag}${randomBytes(2).toString('hex')}`;
  sh(`ip netns add ${ns}; ip link add ${veth} type veth peer name eth0 netns ${ns}; ip addr add ${gw}/24 dev ${veth}; ip link set ${veth} up;
      ip -n ${ns} addr add ${ip}/24 dev eth0; ip -n ${ns} link set eth0 up; ip -n ${ns} link set lo up; ip -n ${ns} route add default via ${gw}`);
  const proc = spawn('ip', ['netns', 'exec', ns, '/usr/bin/python3', '-u', script, name, ip], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    proc.stdout!.on('data', (d) => { if (String(d).includes('ready')) resolve(); });
    proc.once('exit', (c) => reject(new Error(`test host ${name} exited with ${c}`)));
  });
  return { ns, veth, proc };
}

function dropHost(h: TestHost): void {
  h.proc.kill('SIGKILL');
  sh(`ip netns del ${h.ns} 2>/dev/null || true; ip link del ${h.veth} 2>/dev/null || true`);
}

/** A DNS server on loopback: a.test → A, b.test → B, meta.test → the metadata address. */
async function testDns(records: Record<string, string>): Promise<{ port: number; close(): void }> {
  const s = createSocket('udp4');
  s.on('message', (q, rinfo) => {
    let off = 12;
    const labels: string[] = [];
    while (q[off]) { labels.push(q.toString('latin1', off + 1, off + 1 + q[off])); off += q[off] + 1; }
    const qEnd = off + 5;
    const name = labels.join('.').toLowerCase();
    const type = q.readUInt16BE(off + 1);
    const ip = records[name];
    const head = Buffer.from(q.subarray(0, qEnd));
    head.writeUInt16BE(0x8180 | (ip ? 0 : 3), 2);
    head.writeUInt16BE(ip && type === 1 ? 1 : 0, 6);
    head.writeUInt32BE(0, 8);
    const parts = [head];
    if (ip && type === 1) {
      const rr = Buffer.alloc(16);
      rr.writeUInt16BE(0xc00c, 0); rr.writeUInt16BE(1, 2); rr.writeUInt16BE(1, 4); rr.writeUInt32BE(300, 6); rr.writeUInt16BE(4, 10);
      ip.split('.').forEach((o, i) => { rr[12 + i] = Number(o); });
      parts.push(rr);
    }
    s.send(Buffer.concat(parts), rinfo.port, rinfo.address);
  });
  await new Promise<void>((r) => s.bind(0, '127.0.0.1', () => r()));
  return { port: s.address().port, close: () => s.close() };
}

/** Runs a Python probe in the sandbox and returns its JSON. */
async function probe(engine: Engine, id: string, body: string): Promise<any> {
  const code = `
import json, socket, time, urllib.request
def tcp(host, port, timeout=4):
    t = time.time()
    try:
        socket.create_connection((host, port), timeout).close(); r = 'ok'
    except Exception as e:
        r = type(e).__name__
    return [r, round(time.time() - t, 2)]
def dns(name):
    try: return socket.gethostbyname(name)
    except Exception as e: return 'error'
def http(url):
    try: return urllib.request.urlopen(url, timeout=4).read().decode()
    except Exception as e: return 'error ' + type(e).__name__
out = {}
${body}
print(json.dumps(out))
`;
  const r = await engine.exec(id, { code, timeout: 120 }, T);
  assert.equal(r.exit_code, 0, `probe failed: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!);
}

function httpGet(host: string, port: number, path = '/'): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = get({ host, port, path, timeout: 10_000 }, (res) => {
      let body = '';
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error('timeout')));
  });
}

describe('networking', { timeout: 900_000 }, () => {
  let engine: Engine;
  let home: string;
  let hostA: TestHost;
  let hostB: TestHost;
  /** On a private address: blocked for every policy except where the operator opened it. */
  let hostC: TestHost;
  let dns: { port: number; close(): void };
  let api: Server;
  let apiPort: number;
  // The operator opened host C's address alone (COLLIMATE_EGRESS_OPEN_CIDRS) of the private ranges.
  const engineOpts = () => ({ catalog: ['base', 'python'], net: { ...netSettings(), dnsUpstream: `127.0.0.1:${dns.port}`, openCidrs: ['10.250.7.10/32'] } });
  const hostAddr = Object.values(networkInterfaces()).flat().find((a) => a && a.family === 'IPv4' && !a.internal)?.address ?? '127.0.0.1';

  before(async () => {
    home = testHome('network');
    const script = join(home, 'testhost.py');
    writeFileSync(script, HOST_PY);
    dropStaleHosts();
    hostA = await makeHost('a', 'host A', '198.51.100.10', '198.51.100.1', script);
    hostB = await makeHost('b', 'host B', '203.0.113.10', '203.0.113.1', script);
    hostC = await makeHost('c', 'host C', '10.250.7.10', '10.250.7.1', script);
    dns = await testDns({ 'a.test': '198.51.100.10', 'b.test': '203.0.113.10', 'meta.test': '169.254.169.254' });
    // Stands in for the API server: listening on every host address.
    api = createServer((_q, res) => res.end('api'));
    await new Promise<void>((r) => api.listen(0, '0.0.0.0', () => r()));
    apiPort = (api.address() as { port: number }).port;
    engine = await openEngine(home, engineOpts());
  });

  after(async () => {
    try {
      if (engine) {
        const net = await netFor(engine.cfg);
        await assertNoLeaks(engine, home);
        assert.equal(net?.resolverCount(), 0, 'resolvers left');
        assert.deepEqual(homeNamespaces(engine.cfg.homeTag), [], 'namespaces left');
      }
    } finally {
      api?.close();
      dns?.close();
      if (hostA) dropHost(hostA);
      if (hostB) dropHost(hostB);
      if (hostC) dropHost(hostC);
    }
  });

  it("releasing a gone VMM's namespace leaves the index alone once it is claimed again (the new namespace has the same name)", async () => {
    const net = (await netFor(engine.cfg))!;
    const rec = await net.acquire();
    // Its VMM ran and is gone: a process that has exited holds the claim.
    const gone = spawn('true');
    await new Promise((r) => gone.once('exit', r));
    const deadOwner = { pid: gone.pid!, startTicks: '1' };
    net.bind(rec, deadOwner);
    // The index is claimed again (the claim is stale) and its namespace made anew before the old
    // release runs, as a create or fork does while a delete is still under way.
    const holder = spawn('sleep', ['60']);
    await new Promise((r) => holder.once('spawn', r));
    const holderTicks = readFileSync(`/proc/${holder.pid}/stat`, 'utf8').split(') ')[1].split(' ')[19];
    execFileSync('/usr/sbin/ip', ['netns', 'del', rec.ns]);
    execFileSync('/usr/sbin/ip', ['netns', 'add', rec.ns]);
    const newer = { ...rec };
    (net as unknown as { made: Map<string, object> }).made.set(rec.ns, newer); // as make() records it
    net.bind(rec, { pid: holder.pid!, startTicks: holderTicks });
    try {
      await net.release(rec, deadOwner);
      assert.ok(existsSync(`/run/netns/${rec.ns}`), 'the namespace of the index\'s new holder survives the old release');
    } finally {
      holder.kill('SIGKILL');
      await new Promise((r) => holder.once('exit', r));
      await net.release(newer, { pid: holder.pid!, startTicks: holderTicks });
    }
    assert.ok(!existsSync(`/run/netns/${rec.ns}`), 'released by its holder, it goes');
  });

  it('"allow" reaches public hosts by name and address, but never the host, metadata or private ranges', async () => {
    const s = await engine.create({ template: 'python', egress: 'allow' }, T);
    assert.equal(s.egress, 'allow');
    const out = await probe(engine, s.id, `
out['a'] = http('http://a.test/')
out['b'] = http('http://203.0.113.10/')
out['meta'] = tcp('169.254.169.254', 80)
out['api_host'] = tcp('${hostAddr}', ${apiPort})
out['api_gw'] = tcp('172.16.0.1', ${apiPort})
out['api_resolver'] = tcp('10.201.0.1', ${apiPort})
out['private'] = tcp('10.255.255.1', 80)
`);
    assert.equal(out.a, 'host A');
    assert.equal(out.b, 'host B');
    for (const k of ['meta', 'api_host', 'api_gw', 'api_resolver', 'private']) assert.notEqual(out[k][0], 'ok', `${k} must be blocked: ${JSON.stringify(out[k])}`);
    await engine.delete(s.id, T);
  });

  it("a running sandbox's egress changes at once: an allowlist of host A reaches A not B; \"none\" then nothing; suspended, the change holds after the resume", async () => {
    const s = await engine.create({ template: 'python', egress: 'allow' }, T);
    try {
      const both = `out['a'] = http('http://198.51.100.10/')\nout['b'] = http('http://203.0.113.10/')`;
      assert.deepEqual(await probe(engine, s.id, both), { a: 'host A', b: 'host B' });
      assert.deepEqual((await engine.setEgress(s.id, { domains: [], cidrs: ['198.51.100.10/32'], ports: [] }, T)).egress, { domains: [], cidrs: ['198.51.100.10/32'], ports: [] });
      const narrowed = await probe(engine, s.id, both);
      assert.equal(narrowed.a, 'host A');
      assert.notEqual(narrowed.b, 'host B', `B is no longer allowed: ${JSON.stringify(narrowed.b)}`);
      await engine.setEgress(s.id, 'none', T);
      assert.notEqual((await probe(engine, s.id, `out['a'] = http('http://198.51.100.10/')`)).a, 'host A', '"none" reaches nothing');
      await engine.suspend(s.id, T);
      await engine.setEgress(s.id, { domains: [], cidrs: ['203.0.113.10/32'], ports: [] }, T);
      await engine.resume(s.id, T);
      const resumed = await probe(engine, s.id, both);
      assert.equal(resumed.b, 'host B', 'the policy set while suspended applies at the resume');
      assert.notEqual(resumed.a, 'host A');
    } finally {
      await engine.delete(s.id, T);
    }
  });

  it('a denylist reaches every public host but those it denies, by name and address, and never the blocked ranges; replaced, it holds at once', async () => {
    const s = await engine.create({ template: 'python', egress: { deny: ['203.0.113.10/32'] } }, T);
    try {
      assert.deepEqual(s.egress, { deny: ['203.0.113.10/32'] });
      const both = `out['a'] = http('http://a.test/')\nout['b'] = http('http://203.0.113.10/')\nout['meta'] = tcp('169.254.169.254', 80)\nout['private'] = tcp('10.255.255.1', 80)`;
      const denied = await probe(engine, s.id, both);
      assert.equal(denied.a, 'host A', 'a host it does not deny, by name');
      assert.notEqual(denied.b, 'host B', `the denied address: ${JSON.stringify(denied.b)}`);
      for (const k of ['meta', 'private']) assert.notEqual(denied[k][0], 'ok', `${k} stays blocked under a denylist: ${JSON.stringify(denied[k])}`);
      await engine.setEgress(s.id, { deny: ['198.51.100.10/32'] }, T);
      const swapped = await probe(engine, s.id, both);
      assert.equal(swapped.b, 'host B');
      assert.notEqual(swapped.a, 'host A', `now A is denied: ${JSON.stringify(swapped.a)}`);
    } finally {
      await engine.delete(s.id, T);
    }
  });

  it('a private address opens only where the operator opened it: a policy naming a wider private range (stored before the check) reaches nothing of it', async () => {
    // The engine takes policies as stored; the tenant service refuses unopened blocked ranges before they get here (api tests).
    const wide = await engine.create({ template: 'python', egress: { domains: [], cidrs: ['10.250.0.0/16', '169.254.169.254/32'], ports: [] } }, T);
    const narrow = await engine.create({ template: 'python', egress: { domains: [], cidrs: ['10.250.7.10/32'], ports: [] } }, T);
    try {
      const closed = await probe(engine, wide.id, `out['c'] = tcp('10.250.7.10', 81)`);
      assert.notEqual(closed.c[0], 'ok', `10.250.0.0/16 is not opened, so host C stays closed: ${JSON.stringify(closed.c)}`);
      const open = await probe(engine, narrow.id, `out['c'] = http('http://10.250.7.10:81/')`);
      assert.equal(open.c, 'host C', 'the opened address is reachable by a policy that names it');
    } finally {
      await engine.delete(wide.id, T);
      await engine.delete(narrow.id, T);
    }
  });

  it('"none": connects fail fast and DNS fails', async () => {
    const s = await engine.create({ template: 'python', egress: 'none' }, T);
    const out = await probe(engine, s.id, `
out['a'] = tcp('198.51.100.10', 80)
out['dns'] = dns('a.test')
`);
    assert.notEqual(out.a[0], 'ok');
    assert.ok(out.a[1] < 2, `connect must fail fast, took ${out.a[1]} s`);
    assert.equal(out.dns, 'error');
    await engine.delete(s.id, T);
  });

  it('an allowlist opens exactly what it names, whatever the guest does to its resolv.conf and routes', async () => {
    const s = await engine.create({ template: 'python', egress: { domains: ['a.test', 'meta.test'], cidrs: ['203.0.113.10/32'], ports: [81] } }, T);
    const out = await probe(engine, s.id, `
out['a81'] = http('http://a.test:81/')
out['a80'] = tcp('198.51.100.10', 80)
out['b81'] = http('http://203.0.113.10:81/')
out['b80'] = tcp('203.0.113.10', 80)
out['bname'] = dns('b.test')
out['meta'] = [dns('meta.test'), tcp('169.254.169.254', 81)]
out['api'] = tcp('${hostAddr}', ${apiPort})
`);
    assert.equal(out.a81, 'host A');
    assert.notEqual(out.a80[0], 'ok', 'port 80 is not in the allowlist');
    assert.equal(out.b81, 'host B');
    assert.notEqual(out.b80[0], 'ok');
    assert.equal(out.bname, 'error', 'b.test is not an allowed name');
    assert.equal(out.meta[0], '169.254.169.254', 'an allowed name resolves');
    assert.notEqual(out.meta[1][0], 'ok', 'but an allowed name does not open the metadata address');
    assert.notEqual(out.api[0], 'ok');

    // The guest rewrites its resolver and routes: nothing more opens.
    const tamper = await engine.exec(s.id, {
      command: 'echo "nameserver 203.0.113.10" > /etc/resolv.conf; ip route replace default via 172.16.0.1 dev eth0; ip addr add 203.0.113.99/24 dev eth0; ip route add 198.51.100.0/24 dev eth0; echo done',
    }, T);
    assert.match(tamper.stdout, /done/);
    const again = await probe(engine, s.id, `
out['bname'] = dns('b.test')
out['a80'] = tcp('198.51.100.10', 80)
out['b80'] = tcp('203.0.113.10', 80)
`);
    assert.equal(again.bname, 'error');
    assert.notEqual(again.a80[0], 'ok');
    assert.notEqual(again.b80[0], 'ok');
    await engine.delete(s.id, T);
  });

  it('an environment\'s ready command runs on a network under the environment\'s policy, and its sandboxes inherit it', async () => {
    const py = engine.templatePools.get('python')!;
    const fetch = (url: string) => `python3 -c "import urllib.request; open('/opt/fetched', 'w').write(urllib.request.urlopen('${url}', timeout=5).read().decode())"`;
    const recipe = (id: string, command: string, egress: any) => ({
      id, tenant: T.tenant, description: id, interpreter: ['python3', '-c'],
      layers: py.artifact.shape.layers.map((p: string) => ({ path: p, digest: `layer:${p}` })),
      vcpus: py.artifact.shape.vcpus, memoryMib: py.artifact.shape.memoryMib, diskMib: py.artifact.diskMib,
      ready: { command }, egress,
    });
    const policy = { domains: ['a.test'], cidrs: [], ports: [] };
    await engine.addTemplate(recipe('fetcher', fetch('http://a.test/'), policy), { poolSize: 1 });
    const s = await engine.create({ template: 'fetcher' }, T);
    try {
      assert.deepEqual(s.egress, policy);
      assert.equal((await engine.readFile(s.id, '/opt/fetched', T)).toString(), 'host A', 'the ready command fetched from A');
      // A create through the tenant service may only narrow the environment's policy.
      const tenants = new TenantService({ engine, db: engine.db, reconcileIntervalMs: 0 });
      try {
        await assert.rejects(tenants.sandboxes.create(trustedScope(T.tenant), { template: 'fetcher', egress: 'allow' }), (e: any) => e.code === 'egress_forbidden');
      } finally {
        tenants.close();
      }
    } finally {
      await engine.delete(s.id, T);
      await engine.removeTemplate(T.tenant, 'fetcher');
    }
    // The same ready step under a policy that does not name B fails the bake.
    await assert.rejects(engine.addTemplate(recipe('blocked', fetch('http://203.0.113.10/'), policy), { poolSize: 1 }), /ready command exited/);
  });

  it('after a server restart an adopted sandbox keeps its policy and resolves through a new resolver', async () => {
    const s = await engine.create({ template: 'python', egress: { domains: ['a.test'], cidrs: [], ports: [] } }, T);
    assert.equal((await probe(engine, s.id, `out['a'] = http('http://a.test/')`)).a, 'host A');
    // Running VMMs (and their namespaces and rules) outlive the server; its resolvers do not.
    await engine.close();
    engine = await openEngine(home, engineOpts());
    const out = await probe(engine, s.id, `
out['a'] = http('http://a.test/')
out['bname'] = dns('b.test')
out['b'] = tcp('203.0.113.10', 80)
`);
    assert.equal(out.a, 'host A', 'DNS works again through the new resolver');
    assert.equal(out.bname, 'error');
    assert.notEqual(out.b[0], 'ok');
    assert.deepEqual(engine.get(s.id, T).egress, { domains: ['a.test'], cidrs: [], ports: [] });
    await engine.delete(s.id, T);
  });

  it('a resumed sandbox keeps its policy: its new VMM\'s namespace gets it before the guest runs', async () => {
    const s = await engine.create({ template: 'python', egress: { domains: ['a.test'], cidrs: [], ports: [] } }, T);
    await engine.suspend(s.id, T);
    await engine.resume(s.id, T);
    const out = await probe(engine, s.id, `
out['a'] = http('http://a.test/')
out['bname'] = dns('b.test')
out['b'] = tcp('203.0.113.10', 80)
`);
    assert.equal(out.a, 'host A', 'the allowed name resolves and connects after the resume');
    assert.equal(out.bname, 'error');
    assert.notEqual(out.b[0], 'ok', 'what the policy does not name stays closed');
    await engine.delete(s.id, T);
  });

  it('forked children keep their parent\'s server and policy, each reachable at its own port target', async () => {
    const s = await engine.create({ template: 'python', egress: { domains: ['a.test'], cidrs: [], ports: [] } }, T);
    const start = await engine.exec(s.id, {
      command: 'mkdir -p /tmp/www && echo parent > /tmp/www/who && (cd /tmp/www && nohup python3 -m http.server 8000 >/dev/null 2>&1 &) && for i in $(seq 50); do grep -q " 00000000:1F40 " /proc/net/tcp && break; sleep 0.1; done; echo started',
    }, T);
    assert.match(start.stdout, /started/);
    const ports = await engine.openPorts(s.id, T);
    // The python image's code interpreter listens too (CODE_PORT); the test's server is the only other.
    assert.deepEqual(ports.map((p) => p.port).filter((p) => p !== CODE_PORT), [8000]);
    const kids = await engine.fork(s.id, { count: 2 }, T);
    for (const k of kids) {
      assert.deepEqual(k.egress, { domains: ['a.test'], cidrs: [], ports: [] });
      await engine.exec(k.id, { command: `echo ${k.id} > /tmp/www/who` }, T);
    }
    for (const k of kids) {
      const t = engine.portTarget(k.id, 8000, T);
      const r = await httpGet(t.host, t.port, '/who');
      assert.equal(r.body.trim(), k.id, 'each child answers with its own state');
      const out = await probe(engine, k.id, `out['a'] = http('http://a.test/')\nout['b'] = tcp('203.0.113.10', 80)`);
      assert.equal(out.a, 'host A');
      assert.notEqual(out.b[0], 'ok', 'the child inherited the allowlist');
    }
    const pt = engine.portTarget(s.id, 8000, T);
    assert.equal((await httpGet(pt.host, pt.port, '/who')).body.trim(), 'parent');
    const targets = new Set([s, ...kids].map((x) => engine.portTarget(x.id, 8000, T).host));
    assert.equal(targets.size, 3, 'every sandbox has its own address on the host');
    for (const k of kids) await engine.delete(k.id, T);
    await engine.delete(s.id, T);
  });
});
