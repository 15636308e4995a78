/**
 * Request bodies as JSON, one way for every door: UTF-8 only (RFC 8259 §8.1: replacing bad bytes with
 * U+FFFD would silently change a command or a file's content), no prototype-poisoning keys, a body
 * nested past the parser's stack refused with words, and with `contentType` a media type that is not
 * JSON refused (415). The server hands JSON bodies over as the bytes that came (src/api/server.ts);
 * its body limit applies before this.
 */
import { CollimateError } from '../errors.js';

const JSON_CT = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** The JSON value of a body; undefined for an empty one. `contentType`: check it is JSON (absent: not checked). */
export function parseJsonBody(raw: unknown, opts: { contentType?: string | false } = {}): unknown {
  if (raw === undefined || raw === null) return undefined;
  const buf = Buffer.isBuffer(raw) ? raw : Buffer.from(String(raw));
  let text: string | null = null;
  try { text = utf8.decode(buf); } catch { /* refused below, after the media type */ }
  if (text !== null && text.trim() === '') return undefined;
  const ct = opts.contentType;
  if (typeof ct === 'string' && !JSON_CT.test(ct)) {
    throw new CollimateError('unsupported_media_type', `Content-Type ${JSON.stringify(ct.slice(0, 100))} is not supported here; send application/json.`);
  }
  if (text === null) throw new CollimateError('invalid_json', 'Request body is not valid UTF-8; JSON must be sent as UTF-8.');
  try {
    return JSON.parse(text, (k, v) => {
      // Prototype poisoning guard: such keys are never valid in a request.
      if (k === '__proto__' || (k === 'constructor' && v && typeof v === 'object' && 'prototype' in v)) {
        throw new CollimateError('validation_error', `Key ${JSON.stringify(k)} is not allowed.`);
      }
      return v;
    });
  } catch (e) {
    if (e instanceof CollimateError) throw e;
    // The parser's own stack ran out: the message would say so, not what to change.
    if (e instanceof RangeError) throw new CollimateError('invalid_json', 'Request body nests arrays or objects too deeply to parse; no request here needs more than a few levels.');
    throw new CollimateError('invalid_json', `Request body is not valid JSON (${(e as Error).message}).`);
  }
}

/** A body that must be a JSON object; {} for an empty one. */
export function parseJsonObject(raw: unknown, opts: { contentType?: string | false } = {}): Record<string, unknown> {
  const v = parseJsonBody(raw, opts);
  if (v === undefined) return {};
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new CollimateError('validation_error', 'The request body must be a JSON object.');
  return v as Record<string, unknown>;
}
