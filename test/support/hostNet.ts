/**
 * Machines on one machine, for cluster tests: N network namespaces the test makes, each with one
 * interface (eth0) on a bridge in the test's own namespace, on a /24 of 10.231.0.0/16 picked at
 * random (so concurrent runs rarely meet; a taken name or address makes it pick again). The bridge
 * holds .1 (the test's own address, where a PostgreSQL for the hosts can listen); machine i is .(10 + i).
 * A process started with `prefix(i)` runs in machine i's network namespace (only the network is the
 * machine's own: files, mounts and processes are shared): it sees only its eth0 and its own
 * loopback, and reaches the others and the bridge through the bridge. Root only (ip(8)).
 *
 * close() deletes the namespaces and the bridge; a test process killed before it leaves them behind
 * (`ip netns list` shows `clt…`), harmless and removable by hand.
 */
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';

export interface HostNet {
  /** The bridge's address, in the test's namespace. */
  readonly gateway: string;
  /** Machine i's address (0-based). */
  address(i: number): string;
  /** The argv prefix that runs a command in machine i's namespace. */
  prefix(i: number): string[];
  /** Machine i's namespace name. */
  netns(i: number): string;
  close(): void;
}

const IP = '/usr/sbin/ip';

function ip(args: string[]): void {
  const r = spawnSync(IP, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`ip ${args.join(' ')} failed: ${r.stderr.trim()}`);
}

/** Why machines cannot be made here, or null. */
export function hostNetUnavailable(): string | null {
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  if (!existsSync(IP)) return `${IP} is missing (apt-get install iproute2)`;
  return null;
}

export function makeHostNet(count: number): HostNet {
  for (let attempt = 1; ; attempt++) {
    const tag = randomBytes(3).toString('hex');
    const subnet = `10.231.${randomBytes(1)[0]}`;
    const bridge = `clbr${tag}`;
    const names = Array.from({ length: count }, (_, i) => `clt${tag}-${i}`);
    const made: string[] = [];
    let bridgeMade = false;
    const close = () => {
      for (const ns of made) spawnSync(IP, ['netns', 'del', ns]);
      if (bridgeMade) spawnSync(IP, ['link', 'del', bridge]);
    };
    try {
      const taken = spawnSync(IP, ['-4', 'addr', 'show'], { encoding: 'utf8' }).stdout;
      if (taken.includes(` ${subnet}.`)) throw new Error(`${subnet}.0/24 is in use here`);
      ip(['link', 'add', bridge, 'type', 'bridge']);
      bridgeMade = true;
      ip(['addr', 'add', `${subnet}.1/24`, 'dev', bridge]);
      ip(['link', 'set', bridge, 'up']);
      names.forEach((ns, i) => {
        ip(['netns', 'add', ns]);
        made.push(ns);
        const veth = `clv${tag}${i}`;
        ip(['link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
        ip(['link', 'set', veth, 'master', bridge, 'up']);
        ip(['-n', ns, 'addr', 'add', `${subnet}.${10 + i}/24`, 'dev', 'eth0']);
        ip(['-n', ns, 'link', 'set', 'eth0', 'up']);
        ip(['-n', ns, 'link', 'set', 'lo', 'up']);
        ip(['-n', ns, 'route', 'add', 'default', 'via', `${subnet}.1`]);
      });
    } catch (err) {
      close();
      if (attempt >= 5) throw err;
      continue;
    }
    return {
      gateway: `${subnet}.1`,
      address: (i) => `${subnet}.${10 + i}`,
      // nsenter, not `ip netns exec`: that also gives the process a mount namespace of its own, in
      // which the namespaces a server makes for its sandboxes (`ip netns add`) would be mounted out
      // of the next server's sight (a host restarted must find its predecessor's).
      prefix: (i) => ['/usr/bin/nsenter', `--net=/run/netns/${names[i]}`, '--'],
      netns: (i) => names[i],
      close,
    };
  }
}
