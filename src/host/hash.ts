import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';

/** The sha256 of `parts`, each followed by a NUL so that ('ab', 'c') and ('a', 'bc') differ. */
export function sha256Hex(...parts: (string | Buffer)[]): string {
  const h = createHash('sha256');
  for (const p of parts) { h.update(typeof p === 'string' ? Buffer.from(p) : p); h.update('\0'); }
  return h.digest('hex');
}

export function sha256File(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const h = createHash('sha256');
    createReadStream(path).on('data', (d) => h.update(d)).on('end', () => resolve(h.digest('hex'))).on('error', reject);
  });
}
