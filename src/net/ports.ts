/** A TCP port a server listens on inside a sandbox. */
export interface OpenPort {
  port: number;
  protocol: 'tcp';
}

/**
 * The TCP ports listening on an address the host can reach (any, or the guest's own), from the
 * text of the guest's /proc/net/tcp and /proc/net/tcp6. Loopback-only listeners are left out: the
 * ports proxy reaches the guest at its network address.
 */
export function listeningPorts(procNetTcp: string): OpenPort[] {
  const ports = new Set<number>();
  for (const line of procNetTcp.split('\n')) {
    const f = line.trim().split(/\s+/);
    // sl local_address rem_address st ...; state 0A is LISTEN.
    if (f.length < 4 || f[3] !== '0A' || !f[1].includes(':')) continue;
    const [addr, portHex] = f[1].split(':');
    if (isLoopback(addr)) continue;
    const port = parseInt(portHex, 16);
    if (port > 0) ports.add(port);
  }
  return [...ports].sort((a, b) => a - b).map((port) => ({ port, protocol: 'tcp' as const }));
}

function isLoopback(hex: string): boolean {
  if (hex.length === 8) return hex.endsWith('7F'); // 127.x.x.x, little-endian
  if (hex.length === 32) {
    if (hex === '00000000000000000000000001000000') return true; // ::1
    // ::ffff:127.x.x.x
    return hex.startsWith('0000000000000000FFFF0000') && hex.endsWith('7F');
  }
  return false;
}
