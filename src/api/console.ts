/**
 * Serves the web console's bundle (dist/console, built by scripts/build-console.ts at set-up) at
 * /console. Static files only: the console talks to the same public REST API with the key its user
 * typed, so it can show nothing that key could not fetch. Its responses carry a Content-Security-
 * Policy that the bundle satisfies (scripts and connections from this origin only, no inline script).
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance, FastifyReply } from 'fastify';
import { CollimateError } from '../errors.js';
import { sendError } from './binder.js';

/** Where set-up bundles the console (relative to this file: src/api → dist/console). */
export const DEFAULT_CONSOLE_DIR = fileURLToPath(new URL('../../dist/console', import.meta.url));

/**
 * Styles may be inline: xterm.js and uPlot size their elements with style attributes. Scripts may not.
 * `connect-src 'self'` keeps every request the console makes on this server.
 */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data: blob:",
  "font-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

const FILES: Record<string, string> = {
  'index.html': 'text/html; charset=utf-8',
  'console.js': 'text/javascript; charset=utf-8',
  'console.css': 'text/css; charset=utf-8',
};

/** Registers GET /console (redirect), /console/ and its files. A missing bundle is a 503 that says how to build it. */
export function registerConsole(app: FastifyInstance, dir: string = DEFAULT_CONSOLE_DIR): void {
  // Read once: the bundle does not change under a running server.
  const files = new Map<string, Buffer>();
  for (const name of Object.keys(FILES)) {
    const p = join(dir, name);
    if (existsSync(p)) files.set(name, readFileSync(p));
  }
  const send = (reply: FastifyReply, name: string) => {
    const body = files.get(name);
    if (!body) {
      return sendError(reply, new CollimateError('not_found', 'The console is not built; run scripts/setup.sh (or node --import tsx scripts/build-console.ts) and restart the server.'));
    }
    reply
      .header('content-security-policy', CONSOLE_CSP)
      .header('x-content-type-options', 'nosniff')
      .header('referrer-policy', 'no-referrer')
      .header('cache-control', name === 'index.html' ? 'no-cache' : 'max-age=300')
      .type(FILES[name])
      .send(body);
  };
  app.get('/console', (_req, reply) => reply.redirect('/console/', 302));
  app.get('/console/', (_req, reply) => send(reply, 'index.html'));
  app.get<{ Params: { file: string } }>('/console/:file', (req, reply) => {
    if (!Object.hasOwn(FILES, req.params.file)) {
      return sendError(reply, new CollimateError('not_found', `No console file ${JSON.stringify(req.params.file.slice(0, 100))}.`));
    }
    send(reply, req.params.file);
  });
}
