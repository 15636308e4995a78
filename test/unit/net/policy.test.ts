import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { parseEgress, widening, resolvesName, domainMatches, policyKey } from '../../../src/net/policy.ts';
import { sandboxRuleset, hostRuleset } from '../../../src/net/nft.ts';
import { listeningPorts } from '../../../src/net/ports.ts';
import { answerAddresses, emptyResponse, parseQuestion } from '../../../src/net/resolver.ts';
import { transitOf } from '../../../src/net/netns.ts';

describe('egress policy parsing', () => {
  it('normalises names, CIDRs and ports', () => {
    assert.deepEqual(parseEgress({ domains: ['API.Example.com.', '*.b.org', 'api.example.com'], cidrs: ['203.0.113.7', '10.0.0.0/8'], ports: [443, 80, 443] }), {
      domains: ['*.b.org', 'api.example.com'], cidrs: ['10.0.0.0/8', '203.0.113.7/32'], ports: [80, 443],
    });
    assert.equal(parseEgress('none'), 'none');
    assert.equal(parseEgress('allow'), 'allow');
  });
  for (const [bad, re] of [
    ['everything', /not a policy/], [{ domains: ['a..b'] }, /not a domain/], [{ domains: ['*.com'] }, /two labels/],
    [{ cidrs: ['10.0.0.1/8'] }, /host bits/], [{ cidrs: ['::1'] }, /IPv6/], [{ ports: [0] }, /not a port/],
    [{}, /allows nothing/], [{ domain: ['x.y'] }, /unknown key/], [{ domains: 'a.b' }, /array/],
  ] as const) {
    it(`refuses ${JSON.stringify(bad)}`, () => {
      assert.throws(() => parseEgress(bad), (e: any) => e.code === 'validation_error' && re.test(e.message));
    });
  }
});

describe('narrowing', () => {
  const env = parseEgress({ domains: ['*.example.com', 'pypi.org'], cidrs: ['203.0.113.0/24'], ports: [443, 80] });
  it('allows the same or narrower', () => {
    assert.equal(widening('none', env), null);
    assert.equal(widening(env, env), null);
    assert.equal(widening(parseEgress({ domains: ['api.example.com', '*.x.example.com'], cidrs: ['203.0.113.8/29'], ports: [443] }), env), null);
    assert.equal(widening(env, 'allow'), null);
  });
  it('names what would widen it', () => {
    assert.match(widening('allow', env)!, /not "allow"/);
    assert.match(widening(parseEgress({ domains: ['example.com'], ports: [443] }), env)!, /example.com/);
    assert.match(widening(parseEgress({ cidrs: ['203.0.112.0/23'], ports: [443] }), env)!, /CIDR/);
    assert.match(widening(parseEgress({ domains: ['pypi.org'] }), env)!, /only ports/);
    assert.match(widening(parseEgress({ domains: ['pypi.org'], ports: [22] }), env)!, /port 22/);
    assert.match(widening(parseEgress({ ports: [443] }), env)!, /no destinations/);
    assert.match(widening(parseEgress({ domains: ['pypi.org'] }), 'none')!, /none/);
  });
  it('matches names like the resolver does', () => {
    assert.ok(domainMatches('*.example.com', 'a.b.example.com'));
    assert.ok(!domainMatches('*.example.com', 'example.com'));
    assert.ok(!domainMatches('*.example.com', 'badexample.com'));
    assert.ok(resolvesName(env, 'PyPI.org.'));
    assert.ok(!resolvesName(env, 'evil.org'));
    assert.ok(!resolvesName('none', 'pypi.org'));
    assert.ok(resolvesName(parseEgress({ ports: [443] }), 'anything.org'), 'a destination-free allowlist resolves every name');
    assert.notEqual(policyKey(env), policyKey('allow'));
  });
});

describe('nftables rulesets', () => {
  const base = { hostIp: '10.201.0.5', nsIp: '10.201.0.6', transitCidr: '10.201.0.0/16', hostAddrs: ['192.0.2.2'] };
  it('"none" rejects everything and has no DNS target', () => {
    const r = sandboxRuleset({ ...base, policy: 'none' });
    assert.doesNotMatch(r, /dport 53 dnat/);
    assert.match(r, /chain egress \{\n    ip daddr \{ 192\.0\.2\.2 \} reject with icmp type admin-prohibited\n    ip daddr 10\.201\.0\.0\/16 reject with icmp type admin-prohibited\n    reject with icmp type admin-prohibited\n  \}/);
  });
  it('an allowlist: resolver first, host and transit never, listed CIDRs before the blocked ranges, resolved names after', () => {
    const r = sandboxRuleset({ ...base, policy: parseEgress({ domains: ['a.test'], cidrs: ['10.1.0.0/16'], ports: [443] }), resolver: { ip: '10.201.0.1', port: 5353 } });
    const egress = r.slice(r.indexOf('chain egress'), r.indexOf('chain input')).split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('chain') && l !== '}');
    assert.deepEqual(egress, [
      'ip daddr 10.201.0.1 meta l4proto { tcp, udp } th dport 5353 ct status dnat accept',
      'ip daddr { 192.0.2.2 } reject with icmp type admin-prohibited',
      'ip daddr 10.201.0.0/16 reject with icmp type admin-prohibited',
      'ip daddr { 10.1.0.0/16 } meta l4proto { tcp, udp } th dport { 443 } accept',
      'ip daddr { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.0.0.0/24, 192.168.0.0/16, 198.18.0.0/15, 224.0.0.0/4, 240.0.0.0/4 } reject with icmp type admin-prohibited',
      'ip daddr @dns4 meta l4proto { tcp, udp } th dport { 443 } accept',
      'reject with icmp type admin-prohibited',
    ]);
    assert.match(r, /iifname "tap0" ip daddr 172\.16\.0\.1 udp dport 53 dnat to 10\.201\.0\.1:5353/);
    assert.match(r, /iifname "eth0" ip saddr 10\.201\.0\.5 ip daddr 10\.201\.0\.6 meta l4proto tcp dnat to 172\.16\.0\.2/);
    assert.ok(r.startsWith('table ip collimate {}\ndelete table ip collimate\n'), 'replaces the table atomically');
  });
  it('the host table drops sandbox-to-sandbox traffic first', () => {
    const r = hostRuleset({ transitCidr: '10.201.0.0/16', resolverIp: '10.201.0.1' });
    assert.ok(r.indexOf('iifname "clmh*" oifname "clmh*" drop') < r.indexOf('iifname "clmh*" ip saddr 10.201.0.0/16 accept'));
    assert.match(r, /ip saddr 10\.201\.0\.0\/16 oifname != "clmh\*" masquerade/);
  });
  it('transit addresses: one /30 per index', () => {
    assert.deepEqual(transitOf('10.201.0.0/16', 1), { hostIp: '10.201.0.5', nsIp: '10.201.0.6' });
    assert.deepEqual(transitOf('10.201.0.0/16', 300), { hostIp: '10.201.4.177', nsIp: '10.201.4.178' });
  });
});

describe('listening ports from /proc/net/tcp', () => {
  it('keeps LISTEN sockets on reachable addresses, drops loopback-only ones and connections', () => {
    const text = [
      '  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode',
      '   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1',
      '   1: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2',
      '   2: 0200A8C0:0050 0100A8C0:C350 01 00000000:00000000 00:00000000 00000000     0        0 3',
      '   0: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4',
      '   1: 00000000000000000000000001000000:0BB9 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5',
    ].join('\n');
    assert.deepEqual(listeningPorts(text), [{ port: 3000, protocol: 'tcp' }, { port: 8000, protocol: 'tcp' }]);
  });
});

describe('DNS wire format', () => {
  const query = (name: string, type = 1) => {
    const labels = name.split('.').flatMap((l) => [Buffer.from([l.length]), Buffer.from(l)]);
    const q = Buffer.concat([Buffer.from([0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]), ...labels, Buffer.from([0, 0, type, 0, 1])]);
    return q;
  };
  it('reads the question and builds a REFUSED answer', () => {
    const q = query('Api.Example.com');
    const p = parseQuestion(q)!;
    assert.deepEqual({ name: p.name, type: p.type }, { name: 'api.example.com', type: 1 });
    const r = emptyResponse(q, p, 5);
    assert.equal(r.readUInt16BE(0), 0x1234);
    assert.equal(r.readUInt16BE(2) & 0x800f, 0x8005);
    assert.equal(r.readUInt16BE(6), 0);
  });
  it('collects A records through compression pointers and CNAMEs', () => {
    const q = query('a.test');
    const cname = Buffer.from([0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 4, 1, 0x62, 0xc0, 14]);
    const a = Buffer.from([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 198, 51, 100, 10]);
    const resp = Buffer.concat([q, cname, a]);
    resp.writeUInt16BE(0x8180, 2);
    resp.writeUInt16BE(2, 6);
    assert.deepEqual(answerAddresses(resp), { ips: ['198.51.100.10'], ttl: 30 });
  });
  it('refuses malformed queries', () => {
    assert.equal(parseQuestion(Buffer.from([1, 2, 3])), null);
    const loop = Buffer.concat([Buffer.from([0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]), Buffer.from([0xc0, 12])]);
    assert.equal(parseQuestion(loop), null);
  });
});
