import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { assertTenantEgress, parseEgress, parseOpenCidrs, widening, resolvesName, domainMatches, policyKey } from '../../../src/net/policy.ts';
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
    assert.deepEqual(parseEgress({ deny: ['8.8.8.8', '203.0.113.0/24', '8.8.8.8/32'] }), { deny: ['203.0.113.0/24', '8.8.8.8/32'] });
  });
  for (const [bad, re] of [
    ['everything', /not a policy/], [{ domains: ['a..b'] }, /not a domain/], [{ domains: ['*.com'] }, /two labels/],
    [{ cidrs: ['10.0.0.1/8'] }, /host bits/], [{ cidrs: ['::1'] }, /IPv6/], [{ ports: [0] }, /not a port/],
    [{}, /allows nothing/], [{ domain: ['x.y'] }, /unknown key/], [{ domains: 'a.b' }, /array/],
    [{ deny: [] }, /denies nothing/], [{ deny: ['8.8.8.8'], cidrs: ['1.1.1.1'] }, /no other keys/], [{ deny: '8.8.8.8' }, /array/],
    [{ deny: ['example.com'] }, /not an IPv4 address/], [{ deny: ['8.8.9.0/23'] }, /host bits/],
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
  it('a denylist narrows "allow"; under a denylist, only a denylist that denies at least as much, or "none"', () => {
    const deny = parseEgress({ deny: ['203.0.113.0/24'] });
    assert.equal(widening(deny, 'allow'), null);
    assert.equal(widening('none', deny), null);
    assert.equal(widening(parseEgress({ deny: ['203.0.112.0/23', '8.8.8.8'] }), deny), null, 'a wider denied range covers the environment\'s');
    assert.match(widening('allow', deny)!, /denies 203\.0\.113\.0\/24/);
    assert.match(widening(parseEgress({ deny: ['203.0.113.0/25'] }), deny)!, /denies 203\.0\.113\.0\/24, which the sandbox's denylist does not/);
    assert.match(widening(parseEgress({ cidrs: ['198.51.100.0/24'] }), deny)!, /narrow it to a denylist/);
    assert.match(widening(deny, env)!, /a denylist allows every public address/);
    assert.doesNotThrow(() => assertTenantEgress(parseEgress({ deny: ['10.0.0.0/8', '169.254.169.254'] }), []), 'denying a blocked range only closes more');
    assert.ok(resolvesName(deny, 'anything.org'));
    assert.notEqual(policyKey(deny), policyKey('allow'));
    assert.notEqual(policyKey(deny), policyKey(parseEgress({ cidrs: ['203.0.113.0/24'] })));
  });
  it('a tenant naming a blocked range is egress_forbidden, saying which and why, unless the operator opened it; link-local never', () => {
    const forbidden = (p: unknown, opened: string[], re: RegExp) => assert.throws(() => assertTenantEgress(parseEgress(p), opened), (e: any) => e.code === 'egress_forbidden' && e.status === 403 && re.test(e.message));
    forbidden({ cidrs: ['169.254.169.254/32'] }, [], /169\.254\.169\.254\/32 reaches into 169\.254\.0\.0\/16, link-local \(cloud metadata services\); it is never opened/);
    forbidden({ cidrs: ['10.0.0.0/8'] }, [], /10\.0\.0\.0\/8 reaches into 10\.0\.0\.0\/8, private addresses .*COLLIMATE_EGRESS_OPEN_CIDRS/);
    forbidden({ cidrs: ['0.0.0.0/0'] }, [], /0\.0\.0\.0\/0 reaches into 0\.0\.0\.0\/8.*use "allow"/);
    forbidden({ cidrs: ['192.168.1.0/24'] }, ['10.0.0.0/8'], /192\.168\.0\.0\/16/);
    forbidden({ cidrs: ['10.0.0.0/8'] }, ['10.20.0.0/16'], /10\.0\.0\.0\/8/); // wider than what was opened
    assert.doesNotThrow(() => assertTenantEgress(parseEgress({ cidrs: ['10.20.1.0/24', '203.0.113.0/24'] }), ['10.20.0.0/16']));
    for (const p of ['allow', 'none', { domains: ['pypi.org'] }, { ports: [443] }]) assert.doesNotThrow(() => assertTenantEgress(parseEgress(p), []));
  });
  it('the operator cannot open link-local', () => {
    assert.deepEqual(parseOpenCidrs(' 10.20.0.0/16,192.168.5.0/24 10.20.0.0/16'), ['10.20.0.0/16', '192.168.5.0/24']);
    assert.deepEqual(parseOpenCidrs(undefined), []);
    assert.throws(() => parseOpenCidrs('169.254.0.0/16'), /never opened/);
    assert.throws(() => parseOpenCidrs('128.0.0.0/1'), /never opened/);
    assert.throws(() => parseOpenCidrs('10.0.0.1/8'), /host bits/);
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
  const egressOf = (r: string) => r.slice(r.indexOf('chain egress'), r.indexOf('chain input')).split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('chain') && l !== '}');
  const BLOCKED_RULE = 'ip daddr { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.0.0.0/24, 192.168.0.0/16, 198.18.0.0/15, 224.0.0.0/4, 240.0.0.0/4 } reject with icmp type admin-prohibited';
  it('an allowlist: resolver first, host, transit and link-local never, opened CIDRs before the blocked ranges, other CIDRs and resolved names after', () => {
    const policy = parseEgress({ domains: ['a.test'], cidrs: ['10.1.0.0/16', '10.9.0.0/16', '203.0.113.0/24'], ports: [443] });
    const r = sandboxRuleset({ ...base, policy, resolver: { ip: '10.201.0.1', port: 5353 }, opened: ['10.1.0.0/16'] });
    assert.deepEqual(egressOf(r), [
      'ip daddr 10.201.0.1 meta l4proto { tcp, udp } th dport 5353 ct status dnat accept',
      'ip daddr { 192.0.2.2 } reject with icmp type admin-prohibited',
      'ip daddr 10.201.0.0/16 reject with icmp type admin-prohibited',
      'ip daddr 169.254.0.0/16 reject with icmp type admin-prohibited',
      'ip daddr { 10.1.0.0/16 } meta l4proto { tcp, udp } th dport { 443 } accept',
      BLOCKED_RULE,
      // 10.9.0.0/16 was not opened (a policy stored before the check): listed after the blocked ranges, it opens nothing of them.
      'ip daddr { 10.9.0.0/16, 203.0.113.0/24 } meta l4proto { tcp, udp } th dport { 443 } accept',
      'ip daddr @dns4 meta l4proto { tcp, udp } th dport { 443 } accept',
      'reject with icmp type admin-prohibited',
    ]);
    assert.match(r, /iifname "tap0" ip daddr 172\.16\.0\.1 udp dport 53 dnat to 10\.201\.0\.1:5353/);
    assert.match(r, /iifname "eth0" ip saddr 10\.201\.0\.5 ip daddr 10\.201\.0\.6 meta l4proto tcp dnat to 172\.16\.0\.2/);
    assert.ok(r.startsWith('table ip collimate {}\ndelete table ip collimate\n'), 'replaces the table atomically');
  });
  it('"allow" and a denylist: never the host, transit, link-local or blocked ranges, then the denied CIDRs, then everything', () => {
    const allow = egressOf(sandboxRuleset({ ...base, policy: 'allow', resolver: { ip: '10.201.0.1', port: 5353 } }));
    const deny = egressOf(sandboxRuleset({ ...base, policy: parseEgress({ deny: ['8.8.8.8', '203.0.113.0/24'] }), resolver: { ip: '10.201.0.1', port: 5353 } }));
    const head = [
      'ip daddr 10.201.0.1 meta l4proto { tcp, udp } th dport 5353 ct status dnat accept',
      'ip daddr { 192.0.2.2 } reject with icmp type admin-prohibited',
      'ip daddr 10.201.0.0/16 reject with icmp type admin-prohibited',
      'ip daddr 169.254.0.0/16 reject with icmp type admin-prohibited',
      BLOCKED_RULE,
    ];
    assert.deepEqual(allow, [...head, 'accept']);
    assert.deepEqual(deny, [...head, 'ip daddr { 203.0.113.0/24, 8.8.8.8/32 } reject with icmp type admin-prohibited', 'accept']);
  });
  it('a stored policy naming metadata and the LAN opens neither when the operator opened nothing', () => {
    const r = sandboxRuleset({ ...base, policy: { domains: [], cidrs: ['10.0.0.0/8', '169.254.169.254/32'], ports: [] } });
    const egress = egressOf(r);
    const blockedAt = egress.indexOf(BLOCKED_RULE);
    assert.ok(blockedAt > 0);
    assert.ok(egress.indexOf('ip daddr { 10.0.0.0/8, 169.254.169.254/32 } accept') > blockedAt, egress.join('\n'));
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
