import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, statSync, writeSync, chmodSync } from 'node:fs';
import { dirname } from 'node:path';

/**
 * Environment secrets at rest: AES-256-GCM under a key kept outside the database, in its own file
 * (`<home>/secrets.key`, 32 random bytes, mode 0600, created on first use). A copy of the database
 * alone reveals nothing; the associated data binds each sealed value to its tenant and environment,
 * so a sealed blob moved to another row does not open.
 *
 * On a cluster host, `clusterKey` (the cluster's, src/cluster/secretsKey.ts) seals instead, marked
 * `c1.`, so every host of the cluster opens what any of them sealed; values the host sealed with its
 * own file before it joined (`v1.`) still open with that file. Without a cluster key nothing changes.
 */
export class SecretBox {
  private key?: Buffer;

  constructor(readonly keyPath: string, private readonly clusterKey?: Buffer) {
    if (clusterKey && clusterKey.length !== 32) throw new Error('the cluster secrets key must be 32 bytes');
  }

  private getKey(): Buffer {
    if (this.key) return this.key;
    if (!existsSync(this.keyPath)) {
      mkdirSync(dirname(this.keyPath), { recursive: true });
      try {
        const fd = openSync(this.keyPath, 'wx', 0o600);
        try { writeSync(fd, randomBytes(32)); } finally { closeSync(fd); }
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e; // another process made it first
      }
    }
    const st = statSync(this.keyPath);
    if ((st.mode & 0o077) !== 0) chmodSync(this.keyPath, 0o600);
    const key = readFileSync(this.keyPath);
    if (key.length !== 32) throw new Error(`${this.keyPath} is not a 32-byte key; move it away only if no secrets were stored with it`);
    this.key = key;
    return key;
  }

  /** `v1.<base64 iv|tag|ciphertext>` under the file's key, or `c1.<…>` under the cluster's. */
  seal(plain: Buffer, aad: string): string {
    const iv = randomBytes(12);
    const c = createCipheriv('aes-256-gcm', this.clusterKey ?? this.getKey(), iv);
    c.setAAD(Buffer.from(aad));
    const ct = Buffer.concat([c.update(plain), c.final()]);
    return `${this.clusterKey ? 'c1' : 'v1'}.${Buffer.concat([iv, c.getAuthTag(), ct]).toString('base64')}`;
  }

  open(sealed: string, aad: string): Buffer {
    const format = sealed.slice(0, 3);
    if (format !== 'v1.' && format !== 'c1.') throw new Error('unknown sealed-secret format');
    if (format === 'c1.' && !this.clusterKey) throw new Error('sealed with a cluster\'s secrets key, and this server is not a host of a cluster');
    const raw = Buffer.from(sealed.slice(3), 'base64');
    const d = createDecipheriv('aes-256-gcm', format === 'c1.' ? this.clusterKey! : this.getKey(), raw.subarray(0, 12));
    d.setAAD(Buffer.from(aad));
    d.setAuthTag(raw.subarray(12, 28));
    return Buffer.concat([d.update(raw.subarray(28)), d.final()]);
  }
}
