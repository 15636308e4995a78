/**
 * Origin validation for the MCP endpoint (the Streamable HTTP transport spec requires it, against DNS
 * rebinding: a web page must not drive a local server through the user's browser). Requests without
 * an Origin header (every non-browser client) pass; browser origins must be loopback or listed.
 */
const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]', '::1']);

/** Extra allowed origins from COLLIMATE_MCP_ALLOWED_ORIGINS (comma-separated, e.g. https://app.example.com). */
export function allowedOriginsFromEnv(env: NodeJS.ProcessEnv = process.env): string[] {
  return (env.COLLIMATE_MCP_ALLOWED_ORIGINS ?? '')
    .split(',')
    .map((s) => s.trim().replace(/\/+$/, '').toLowerCase())
    .filter(Boolean);
}

export function originAllowed(origin: string | undefined, allowed: readonly string[]): boolean {
  if (origin === undefined) return true;
  const o = origin.trim().replace(/\/+$/, '').toLowerCase();
  if (allowed.includes(o)) return true;
  let url: URL;
  try {
    url = new URL(o);
  } catch {
    return false; // includes the opaque origin "null"
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return false;
  return LOOPBACK_HOSTS.has(url.hostname) || url.hostname.endsWith('.localhost');
}
