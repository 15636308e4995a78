/**
 * Signed port URLs: `/v1/p/<token>/` reaches one port of one sandbox without an API key until the
 * token expires. The token is base64url of
 *   version (1 byte) | sandbox id (6 bytes, the hex of sbx_…) | port (2) | expiry, unix seconds (5) | HMAC-SHA256 (32)
 * where the HMAC covers everything before it, under a server key kept in its own file beside the
 * database (`<home>/port-urls.key`, 32 random bytes, mode 0600, created on first use). Nothing is
 * stored per URL: deleting the sandbox ends its URLs, replacing the key file ends all of them.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, statSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { CollimateError, msg, see } from '../errors.js';
import type { SandboxGrant } from './sandboxGrants.js';

const VERSION = 1;
const BODY_BYTES = 1 + 6 + 2 + 5;
const MAC_BYTES = 32;
/** The HMAC input starts with a label, so this key can never sign anything else by accident. */
const DOMAIN = Buffer.from('collimate port url\0');
/**
 * Sandbox access tokens are MACs under the same key, with a label per job: `envd` controls the
 * sandbox (E2B's envdAccessToken: commands, files), `traffic` only reaches its ports (E2B's
 * trafficAccessToken, which a browser holds). One is never the other.
 */
const SANDBOX_TOKEN_DOMAIN = { envd: Buffer.from('collimate sandbox token\0'), traffic: Buffer.from('collimate sandbox traffic token\0') } as const;
export type SandboxTokenKind = keyof typeof SANDBOX_TOKEN_DOMAIN;

export interface PortGrant {
  sandboxId: string;
  port: number;
  /** Unix seconds. */
  expiresAt: number;
}

/** Reads the key file, creating it (0600) first if it does not exist. */
function loadOrCreateKey(path: string): Buffer {
  if (!existsSync(path)) {
    mkdirSync(dirname(path), { recursive: true });
    try {
      const fd = openSync(path, 'wx', 0o600);
      try { writeSync(fd, randomBytes(32)); } finally { closeSync(fd); }
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e; // another process made it first
    }
  }
  if ((statSync(path).mode & 0o077) !== 0) chmodSync(path, 0o600);
  const key = readFileSync(path);
  if (key.length !== 32) throw new Error(`${path} is not a 32-byte key; remove it to start over (every signed port URL stops working)`);
  return key;
}

export class PortUrlSigner {
  private key?: Buffer;

  /** `keyPath` null: a key of this process only (URLs die with it). */
  constructor(private readonly keyPath: string | null, private readonly now: () => number = Date.now) {}

  /**
   * Signs and verifies with `key` from now on instead of the key file: a cluster's hosts share one
   * (derived from the cluster's peer secret), so a URL or token any host made works on every host.
   */
  useKey(key: Buffer): void {
    if (key.length !== 32) throw new Error('a port URL key is 32 bytes');
    this.key = key;
  }

  private getKey(): Buffer {
    this.key ??= this.keyPath === null ? randomBytes(32) : loadOrCreateKey(this.keyPath);
    return this.key;
  }

  private mac(body: Buffer): Buffer {
    return createHmac('sha256', this.getKey()).update(DOMAIN).update(body).digest();
  }

  sign(g: PortGrant): string {
    const m = /^sbx_([0-9a-f]{12})$/.exec(g.sandboxId);
    if (!m) throw new Error(`not a sandbox id: ${g.sandboxId}`);
    const body = Buffer.alloc(BODY_BYTES);
    body[0] = VERSION;
    Buffer.from(m[1], 'hex').copy(body, 1);
    body.writeUInt16BE(g.port, 7);
    body.writeUIntBE(g.expiresAt, 9, 5);
    return Buffer.concat([body, this.mac(body)]).toString('base64url');
  }

  /**
   * The grant a token carries. Throws 401 unauthorized for anything this server did not sign
   * (checked first, in constant time) and 401 url_expired once it has expired.
   */
  verify(token: string): PortGrant {
    const invalid = () =>
      new CollimateError('unauthorized', msg`This port URL is not valid: it was altered, truncated or signed by another server. Ask its owner for a new one${see('createPortUrl')}.`);
    if (!/^[A-Za-z0-9_-]+$/.test(token)) throw invalid();
    const raw = Buffer.from(token, 'base64url');
    if (raw.length !== BODY_BYTES + MAC_BYTES || raw.toString('base64url') !== token) throw invalid();
    const body = raw.subarray(0, BODY_BYTES);
    if (!timingSafeEqual(raw.subarray(BODY_BYTES), this.mac(body)) || body[0] !== VERSION) throw invalid();
    const grant: PortGrant = {
      sandboxId: `sbx_${body.subarray(1, 7).toString('hex')}`,
      port: body.readUInt16BE(7),
      expiresAt: body.readUIntBE(9, 5),
    };
    if (grant.expiresAt * 1000 <= this.now()) {
      throw new CollimateError('url_expired', msg`This port URL expired at ${new Date(grant.expiresAt * 1000).toISOString()}. Ask its owner for a new one${see('createPortUrl')}.`);
    }
    return grant;
  }

  /**
   * A token that grants access to one sandbox (E2B's envdAccessToken, or with `traffic` its
   * trafficAccessToken): `<generation>.<key id or ->.<MAC>`, the MAC over its id and that grant (the
   * key it was issued under, the generation). Nothing is stored per token, a forked child gets its
   * own, and a new generation or a revoked key (Accounts.sandboxScope) ends it. The grant rides in
   * the clear so that a forged token is refused by its MAC before anything is looked up.
   */
  sandboxToken(sandboxId: string, kind: SandboxTokenKind, grant: SandboxGrant): string {
    return `${grant.generation}.${grant.keyId ?? '-'}.${this.sandboxMac(sandboxId, kind, grant)}`;
  }

  private sandboxMac(sandboxId: string, kind: SandboxTokenKind, grant: SandboxGrant): string {
    return createHmac('sha256', this.getKey())
      .update(SANDBOX_TOKEN_DOMAIN[kind])
      .update(`${sandboxId}\0${grant.keyId ?? ''}\0${grant.generation}`)
      .digest('base64url');
  }

  /**
   * The grant a sandbox token was issued under, if this server made it for `sandboxId` (its MAC
   * compared in constant time); null for anything else. Whether that grant is still the sandbox's
   * (not rotated, its key not revoked) is the caller's to check.
   */
  sandboxTokenGrant(sandboxId: string, token: string, kind: SandboxTokenKind): SandboxGrant | null {
    const m = /^(\d{1,9})\.(key_[0-9a-f]{12}|-)\.([A-Za-z0-9_-]{43})$/.exec(token);
    if (!m) return null;
    const grant: SandboxGrant = { generation: Number(m[1]), keyId: m[2] === '-' ? null : m[2] };
    const want = Buffer.from(this.sandboxMac(sandboxId, kind, grant));
    const got = Buffer.from(m[3]);
    return got.length === want.length && timingSafeEqual(got, want) ? grant : null;
  }
}
