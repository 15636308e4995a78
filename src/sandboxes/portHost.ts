/**
 * A sandbox's port Host: the Host header its servers see on requests through the ports proxy
 * (E2B's maskRequestHost), a template in which `${PORT}` stands for the port asked for.
 */

/** The placeholder a port Host template may hold, replaced by the port a request reaches. */
export const PORT_PLACEHOLDER = '${PORT}';
/** The longest template taken: a DNS name (253) and a port. */
export const PORT_HOST_MAX = 260;

const LABEL = '[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?';
/** hostname[:port] or [IPv6][:port], once every `${PORT}` is a port number. */
const HOST_RE = new RegExp(`^(?:${LABEL}(?:\\.${LABEL})*|\\[[0-9A-Fa-f:.]+\\])(?::\\d{1,5})?$`);

/** What is wrong with a port Host template, or undefined when it is one (a hostname[:port] shape, `${PORT}` where the port goes). */
export function portHostProblem(template: unknown): string | undefined {
  const example = 'e.g. "localhost:${PORT}" or "app.example.com"';
  if (typeof template !== 'string') return `port_host must be a string, ${example}.`;
  if (template.length === 0 || template.length > PORT_HOST_MAX) return `port_host must be 1 to ${PORT_HOST_MAX} characters, ${example}.`;
  if (/[\r\n\0]/.test(template)) return 'port_host must not contain line breaks or NUL: it becomes a Host header.';
  if (!HOST_RE.test(requestHostOf(template, 65535))) {
    return `port_host ${JSON.stringify(template.slice(0, 80))} is not a host: give hostname[:port] (letters, digits, - and _ in dot-separated labels, or [IPv6]), ${PORT_PLACEHOLDER} where the port goes, ${example}.`;
  }
  return undefined;
}

/** The Host header a request to `port` carries to the sandbox: its template with the port in it, else `localhost:<port>` (what dev servers accept). */
export function requestHostOf(template: string | null | undefined, port: number): string {
  return template ? template.split(PORT_PLACEHOLDER).join(String(port)) : `localhost:${port}`;
}
