import { createHash } from 'node:crypto';
import { createReadStream, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';

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

/**
 * The sha256 of a file never rewritten once built (a catalog layer), hashed once and kept beside
 * it in `<file>.sha256` with the size it had then; a record of another size is hashed again, and a
 * record that cannot be written (a read-only cache) costs a hash at the next call.
 */
export async function builtFileSha256(path: string): Promise<string> {
  const record = `${path}.sha256`;
  const size = statSync(path).size;
  try {
    const [hex, recorded] = readFileSync(record, 'utf8').trim().split(' ');
    if (Number(recorded) === size && /^[0-9a-f]{64}$/.test(hex)) return hex;
  } catch { /* never hashed */ }
  const hex = await sha256File(path);
  try {
    writeFileSync(`${record}.tmp-${process.pid}`, `${hex} ${size}\n`);
    renameSync(`${record}.tmp-${process.pid}`, record);
  } catch { /* not ours to write */ }
  return hex;
}
