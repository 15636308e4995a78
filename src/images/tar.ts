import { openSync, readSync, closeSync, fstatSync } from 'node:fs';

/**
 * A small tar reader and writer (ustar with pax and GNU long-name extensions), our own so that every
 * header of an untrusted image layer passes through code that checks it before anything touches the
 * disk. The reader pulls from any async byte source; the writer builds archives in memory (tests,
 * pushes of small layers).
 */

export type TarType = 'file' | 'hardlink' | 'symlink' | 'char' | 'block' | 'dir' | 'fifo';

export interface TarHeader {
  /** As stored in the archive (pax/GNU long names applied); not yet normalized. */
  name: string;
  type: TarType;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtime: number;
  linkname: string;
  devmajor: number;
  devminor: number;
  /** Extended attributes from pax SCHILY.xattr.* records, values as raw bytes. */
  xattrs: Record<string, Buffer>;
}

export class TarError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TarError';
  }
}

const BLOCK = 512;

/** Pulls exact byte counts out of an async chunk source. */
class ByteReader {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private done = false;
  private readonly it: AsyncIterator<Buffer | Uint8Array | string>;
  consumed = 0;

  constructor(src: AsyncIterable<Buffer | Uint8Array | string>) {
    this.it = src[Symbol.asyncIterator]();
  }

  private async fill(n: number): Promise<void> {
    while (this.buffered < n && !this.done) {
      const r = await this.it.next();
      if (r.done) { this.done = true; break; }
      const b = typeof r.value === 'string' ? Buffer.from(r.value) : Buffer.isBuffer(r.value) ? r.value : Buffer.from(r.value);
      if (b.length === 0) continue;
      this.chunks.push(b);
      this.buffered += b.length;
    }
  }

  /** Exactly n bytes, or fewer only at end of input. */
  async read(n: number): Promise<Buffer> {
    await this.fill(n);
    const take = Math.min(n, this.buffered);
    const out = Buffer.allocUnsafe(take);
    let off = 0;
    while (off < take) {
      const c = this.chunks[0];
      const k = Math.min(c.length, take - off);
      c.copy(out, off, 0, k);
      off += k;
      if (k === c.length) this.chunks.shift(); else this.chunks[0] = c.subarray(k);
    }
    this.buffered -= take;
    this.consumed += take;
    return out;
  }

  /** Streams n bytes to `sink` in the source's own chunk sizes; fails on a short input. */
  async pipe(n: number, sink: (chunk: Buffer) => void): Promise<void> {
    let left = n;
    while (left > 0) {
      if (this.buffered === 0) await this.fill(1);
      if (this.buffered === 0) throw new TarError('archive ends in the middle of a file');
      const c = this.chunks[0];
      const k = Math.min(c.length, left);
      sink(c.subarray(0, k));
      if (k === c.length) this.chunks.shift(); else this.chunks[0] = c.subarray(k);
      this.buffered -= k;
      this.consumed += k;
      left -= k;
    }
  }

  /** Reads and discards whatever is left (so a hashing tee sees the whole stream). */
  async drain(): Promise<void> {
    for (;;) {
      this.chunks = [];
      this.buffered = 0;
      const r = await this.it.next();
      if (r.done) return;
    }
  }
}

function cstr(b: Buffer, off: number, len: number): string {
  const s = b.subarray(off, off + len);
  const z = s.indexOf(0);
  return (z < 0 ? s : s.subarray(0, z)).toString('utf8');
}

/** Octal (space/NUL terminated) or GNU base-256 (high bit set). */
function num(b: Buffer, off: number, len: number, field: string): number {
  const s = b.subarray(off, off + len);
  if (s[0] & 0x80) {
    if (s[0] === 0xff) throw new TarError(`negative ${field} in tar header`);
    let v = s[0] & 0x7f;
    for (let i = 1; i < s.length; i++) {
      v = v * 256 + s[i];
      if (v > Number.MAX_SAFE_INTEGER) throw new TarError(`${field} too large in tar header`);
    }
    return v;
  }
  const t = s.toString('latin1').replace(/\0.*$/s, '').trim();
  if (t === '') return 0;
  if (!/^[0-7]+$/.test(t)) throw new TarError(`malformed ${field} ${JSON.stringify(t)} in tar header`);
  const v = parseInt(t, 8);
  if (!Number.isSafeInteger(v)) throw new TarError(`${field} too large in tar header`);
  return v;
}

function checksumOk(h: Buffer): boolean {
  const stored = num(h, 148, 8, 'checksum');
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK; i++) {
    const c = i >= 148 && i < 156 ? 32 : h[i];
    unsigned += c;
    signed += c > 127 ? c - 256 : c;
  }
  return stored === unsigned || stored === signed;
}

/**
 * At most this many pax records apply to one entry: its own and the archive's global ones (type 'g',
 * which last to the end of the archive) counted together. Every entry's header is resolved against
 * them, so without a bound one crafted layer made each of its files cost a scan of a megabyte of
 * records.
 */
export const MAX_PAX_RECORDS = 1024;

/** Adds the records of a pax header to `into`, refusing an entry that would then have more than MAX_PAX_RECORDS. */
function addPax(into: Map<string, Buffer>, body: Buffer, others: number, global: boolean): void {
  for (const [k, v] of parsePax(body)) {
    into.set(k, v);
    if (into.size + others > MAX_PAX_RECORDS) {
      throw new TarError(`more than ${MAX_PAX_RECORDS} pax records apply to one entry${global ? ' (global headers last to the end of the archive)' : ''}`);
    }
  }
}

function parsePax(body: Buffer): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  let off = 0;
  while (off < body.length) {
    const sp = body.indexOf(0x20, off);
    if (sp < 0) break;
    const len = Number(body.subarray(off, sp).toString('latin1'));
    if (!Number.isInteger(len) || len <= 0 || off + len > body.length) throw new TarError('malformed pax header record');
    const rec = body.subarray(sp + 1, off + len - 1); // drops the trailing newline
    const eq = rec.indexOf(0x3d);
    if (eq < 0) throw new TarError('malformed pax header record');
    out.set(rec.subarray(0, eq).toString('utf8'), Buffer.from(rec.subarray(eq + 1)));
    off += len;
  }
  return out;
}

const TYPES: Record<string, TarType> = { '0': 'file', '\0': 'file', '7': 'file', '1': 'hardlink', '2': 'symlink', '3': 'char', '4': 'block', '5': 'dir', '6': 'fifo' };
/** Metadata headers (pax, GNU long names) can themselves not be huge. */
const MAX_META_BYTES = 1024 * 1024;

export interface TarEntry {
  header: TarHeader;
  /** Streams the entry's data; call at most once, before asking for the next entry. */
  read(sink: (chunk: Buffer) => void): Promise<void>;
}

/**
 * Entries of a tar stream, in order. Data an entry's consumer does not read is skipped. Throws
 * TarError on a malformed archive (bad checksum, truncated data, unsupported entry kinds such as GNU
 * sparse files). After the end-of-archive blocks the rest of the source is drained, so digests computed
 * over the stream cover every byte.
 */
export async function* readTar(src: AsyncIterable<Buffer | Uint8Array | string>): AsyncGenerator<TarEntry> {
  const r = new ByteReader(src);
  const paxGlobal = new Map<string, Buffer>();
  let pax = new Map<string, Buffer>();
  let longName: string | undefined;
  let longLink: string | undefined;
  for (;;) {
    const h = await r.read(BLOCK);
    if (h.length === 0) throw new TarError('archive ends without the end-of-archive marker');
    if (h.length < BLOCK) throw new TarError('archive ends in the middle of a header');
    if (h.every((b) => b === 0)) {
      await r.drain();
      return;
    }
    if (!checksumOk(h)) throw new TarError(`bad tar header checksum at byte ${r.consumed - BLOCK}`);
    const flag = String.fromCharCode(h[156]);
    const size = num(h, 124, 12, 'size');
    const padded = Math.ceil(size / BLOCK) * BLOCK;
    if (flag === 'x' || flag === 'g' || flag === 'L' || flag === 'K') {
      if (size > MAX_META_BYTES) throw new TarError(`tar metadata header of ${size} bytes`);
      const body = (await r.read(padded)).subarray(0, size);
      if (body.length < size) throw new TarError('archive ends in a metadata header');
      if (flag === 'x') addPax(pax, body, paxGlobal.size, false);
      else if (flag === 'g') addPax(paxGlobal, body, pax.size, true);
      else if (flag === 'L') longName = cstr(body, 0, body.length);
      else longLink = cstr(body, 0, body.length);
      continue;
    }
    const type = TYPES[flag];
    if (!type) {
      const what = flag === 'S' ? 'GNU sparse file' : flag === 'V' ? 'volume label' : flag === 'M' ? 'multi-volume continuation' : `type ${JSON.stringify(flag)}`;
      throw new TarError(`unsupported tar entry (${what}) at byte ${r.consumed - BLOCK}`);
    }
    // The entry's own records, then the archive's global ones (looked up, not merged per entry).
    const p = { get: (k: string) => pax.get(k) ?? paxGlobal.get(k), has: (k: string) => pax.has(k) || paxGlobal.has(k) };
    const magic = h.subarray(257, 263).toString('latin1');
    const prefix = magic.startsWith('ustar') && magic !== 'ustar ' ? cstr(h, 345, 155) : '';
    const baseName = cstr(h, 0, 100);
    let name = longName ?? (prefix ? `${prefix}/${baseName}` : baseName);
    let linkname = longLink ?? cstr(h, 157, 100);
    const pnum = (k: string, dflt: number) => {
      const v = p.get(k);
      if (v === undefined) return dflt;
      const n = Number(v.toString('utf8'));
      if (!Number.isFinite(n) || n < 0) throw new TarError(`malformed pax ${k}`);
      return Math.floor(n);
    };
    if (p.has('path')) name = p.get('path')!.toString('utf8');
    if (p.has('linkpath')) linkname = p.get('linkpath')!.toString('utf8');
    const xattrs: Record<string, Buffer> = {};
    for (const m of [paxGlobal, pax]) for (const [k, v] of m) if (k.startsWith('SCHILY.xattr.')) xattrs[k.slice('SCHILY.xattr.'.length)] = v;
    const realSize = type === 'file' ? pnum('size', size) : 0;
    const header: TarHeader = {
      name, type, linkname, xattrs,
      mode: num(h, 100, 8, 'mode') & 0o7777,
      uid: pnum('uid', num(h, 108, 8, 'uid')),
      gid: pnum('gid', num(h, 116, 8, 'gid')),
      size: realSize,
      mtime: pnum('mtime', num(h, 136, 12, 'mtime')),
      devmajor: type === 'char' || type === 'block' ? num(h, 329, 8, 'devmajor') : 0,
      devminor: type === 'char' || type === 'block' ? num(h, 337, 8, 'devminor') : 0,
    };
    pax = new Map();
    longName = undefined;
    longLink = undefined;
    // Hard links and others may carry a size field; their data blocks are skipped either way.
    const dataBytes = type === 'file' ? realSize : size;
    const dataPadded = Math.ceil(dataBytes / BLOCK) * BLOCK;
    let consumed = false;
    yield {
      header,
      async read(sink) {
        if (consumed) throw new Error('tar entry read twice');
        consumed = true;
        await r.pipe(dataBytes, sink);
      },
    };
    if (!consumed) await r.pipe(dataBytes, () => {});
    await r.pipe(dataPadded - dataBytes, () => {});
  }
}

// ---- writing -------------------------------------------------------------------------------------

export interface TarWriteEntry {
  name: string;
  type?: TarType;
  data?: Buffer | string;
  mode?: number;
  uid?: number;
  gid?: number;
  mtime?: number;
  linkname?: string;
  devmajor?: number;
  devminor?: number;
  /** Declared size when it differs from data (to build deliberately broken archives). */
  size?: number;
  xattrs?: Record<string, Buffer | string>;
}

const FLAGS: Record<TarType, string> = { file: '0', hardlink: '1', symlink: '2', char: '3', block: '4', dir: '5', fifo: '6' };

function octal(b: Buffer, off: number, len: number, v: number): void {
  if (v >= 8 ** (len - 1)) {
    // base-256 for values octal cannot hold
    b[off] = 0x80;
    let x = v;
    for (let i = len - 1; i > 0; i--) { b[off + i] = x % 256; x = Math.floor(x / 256); }
    return;
  }
  b.write(v.toString(8).padStart(len - 1, '0') + '\0', off, len, 'latin1');
}

function header(e: { name: string; flag: string; size: number; mode: number; uid: number; gid: number; mtime: number; linkname: string; devmajor: number; devminor: number }): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(e.name, 0, 100, 'utf8');
  octal(h, 100, 8, e.mode);
  octal(h, 108, 8, e.uid);
  octal(h, 116, 8, e.gid);
  octal(h, 124, 12, e.size);
  octal(h, 136, 12, e.mtime);
  h[156] = e.flag.charCodeAt(0);
  h.write(e.linkname, 157, 100, 'utf8');
  h.write('ustar\0', 257, 6, 'latin1');
  h.write('00', 263, 2, 'latin1');
  octal(h, 329, 8, e.devmajor);
  octal(h, 337, 8, e.devminor);
  h.fill(32, 148, 156);
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += h[i];
  h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8, 'latin1');
  return h;
}

function paxRecord(k: string, v: Buffer): Buffer {
  const body = Buffer.concat([Buffer.from(` ${k}=`), v, Buffer.from('\n')]);
  let len = body.length + 1;
  while (String(len).length + body.length !== len) len = String(len).length + body.length;
  return Buffer.concat([Buffer.from(String(len)), body]);
}

const pad = (n: number) => Buffer.alloc((BLOCK - (n % BLOCK)) % BLOCK);

/** An uncompressed tar archive of `entries`, with pax headers where names or xattrs need them. */
export function writeTar(entries: TarWriteEntry[]): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    const type = e.type ?? 'file';
    const data = e.data === undefined ? Buffer.alloc(0) : Buffer.from(e.data);
    const size = e.size ?? (type === 'file' ? data.length : 0);
    const recs: Buffer[] = [];
    if (Buffer.byteLength(e.name) > 99) recs.push(paxRecord('path', Buffer.from(e.name)));
    if (e.linkname && Buffer.byteLength(e.linkname) > 99) recs.push(paxRecord('linkpath', Buffer.from(e.linkname)));
    for (const [k, v] of Object.entries(e.xattrs ?? {})) recs.push(paxRecord(`SCHILY.xattr.${k}`, Buffer.from(v)));
    const common = { mode: e.mode ?? (type === 'dir' ? 0o755 : 0o644), uid: e.uid ?? 0, gid: e.gid ?? 0, mtime: e.mtime ?? 1_700_000_000, devmajor: e.devmajor ?? 0, devminor: e.devminor ?? 0 };
    if (recs.length) {
      const body = Buffer.concat(recs);
      parts.push(header({ ...common, name: 'PaxHeader', flag: 'x', size: body.length, linkname: '' }), body, pad(body.length));
    }
    parts.push(header({ ...common, name: e.name.slice(0, 99), flag: FLAGS[type], size, linkname: (e.linkname ?? '').slice(0, 99) }));
    if (type === 'file') parts.push(data, pad(data.length));
  }
  parts.push(Buffer.alloc(BLOCK * 2));
  return Buffer.concat(parts);
}

// ---- indexing a tar file on disk -----------------------------------------------------------------

export interface TarFileMember { name: string; offset: number; size: number; type: TarType; linkname: string }

/**
 * Names and data offsets of every member of an uncompressed tar file, read header by header with
 * positioned reads (member data is skipped, not read), so a multi-gigabyte `docker save` archive is
 * indexed in milliseconds.
 */
export function indexTarFile(path: string): Map<string, TarFileMember> {
  const fd = openSync(path, 'r');
  try {
    const total = fstatSync(fd).size;
    const out = new Map<string, TarFileMember>();
    let pos = 0;
    let longName: string | undefined;
    let paxPath: string | undefined;
    const h = Buffer.alloc(BLOCK);
    const readAt = (buf: Buffer, at: number) => {
      if (readSync(fd, buf, 0, buf.length, at) !== buf.length) throw new TarError('archive is truncated');
    };
    for (;;) {
      if (pos + BLOCK > total) throw new TarError('archive ends without the end-of-archive marker');
      readAt(h, pos);
      if (h.every((b) => b === 0)) return out;
      if (!checksumOk(h)) throw new TarError(`bad tar header checksum at byte ${pos}`);
      const flag = String.fromCharCode(h[156]);
      const size = num(h, 124, 12, 'size');
      const dataAt = pos + BLOCK;
      pos = dataAt + Math.ceil(size / BLOCK) * BLOCK;
      if (pos > total) throw new TarError('archive is truncated');
      if (flag === 'x' || flag === 'L') {
        if (size > MAX_META_BYTES) throw new TarError(`tar metadata header of ${size} bytes`);
        const body = Buffer.alloc(size);
        readAt(body, dataAt);
        if (flag === 'L') longName = cstr(body, 0, size);
        else { const p = parsePax(body).get('path'); if (p) paxPath = p.toString('utf8'); }
        continue;
      }
      if (flag === 'g') continue;
      const type = TYPES[flag];
      if (!type) throw new TarError(`unsupported tar entry type ${JSON.stringify(flag)} in archive`);
      const magic = h.subarray(257, 263).toString('latin1');
      const prefix = magic.startsWith('ustar') && magic !== 'ustar ' ? cstr(h, 345, 155) : '';
      const name = paxPath ?? longName ?? (prefix ? `${prefix}/${cstr(h, 0, 100)}` : cstr(h, 0, 100));
      paxPath = undefined;
      longName = undefined;
      const clean = name.replace(/^(\.\/)+/, '').replace(/\/+$/, '');
      out.set(clean, { name: clean, offset: dataAt, size: type === 'file' ? size : 0, type, linkname: cstr(h, 157, 100) });
    }
  } finally {
    closeSync(fd);
  }
}
