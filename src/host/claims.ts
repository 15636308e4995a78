import { closeSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, rmdirSync, statSync, unlinkSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { randomInt } from 'node:crypto';
import { CollimateError } from '../errors.js';

/**
 * Host-wide allocation of VMM uids from a range (default 200000…265535). Every VMM gets a uid of its
 * own, so that one compromised QEMU cannot signal, ptrace or read /proc/<pid>/{mem,root} of another
 * (those checks compare uids), nor open another's files. The range is shared by every Collimate
 * server on the host (several data directories, concurrent test files), so claims are files in one
 * directory on /run, created with O_EXCL: `<dir>/<uid>` holds the pid and start time of the process
 * that owns it — the server while it prepares the spawn, then the QEMU process.
 *
 * A claim is stale when its owner is gone and no process runs with that uid (an orphaned QEMU
 * whose claim still names the server that crashed keeps its uid).
 */
export interface ClaimOwner {
  pid: number;
  startTicks: string;
}

/**
 * Host-wide claims of integers from a range, one file each (see UidPool for the protocol). Also
 * used for network namespace indexes (src/net/netns.ts). `inUse` says whether a claim whose owner
 * is gone is still in use by something else (a uid with processes).
 */
export class ClaimPool {
  constructor(
    readonly dir: string, readonly base: number, readonly count: number,
    /** What one claim is, in messages, and the resource errors name. */
    private readonly kind: { what: string; resource: string } = { what: 'claim', resource: 'claims' },
    private readonly inUse: (n: number) => boolean = () => false,
  ) {
    if (!Number.isInteger(base) || base < 0 || !Number.isInteger(count) || count < 1 || base + count > 2 ** 31) {
      throw new Error(`bad claim range ${base}+${count}`);
    }
  }

  /** A free uid, claimed for `owner`. */
  claim(owner: ClaimOwner): number {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    const start = randomInt(this.count);
    for (let i = 0; i < this.count; i++) {
      const uid = this.base + ((start + i) % this.count);
      if (this.tryClaim(uid, owner)) return uid;
      if (this.reclaim(uid, owner)) return uid;
    }
    // Admission (hostCapacity.ts) refuses before this in the common case; this is the race it cannot see.
    throw new CollimateError('host_at_capacity',
      `There is no free ${this.kind.what} in ${this.base}…${this.base + this.count - 1} (${this.count} in use, by this and other servers on the host). ` +
        'Delete or suspend sandboxes to free some, or widen the range.',
      { retryAfterSecs: 5, details: { resource: this.kind.resource } });
  }

  /** Hands the claim over to the VMM process once it runs. */
  bind(uid: number, owner: ClaimOwner): void {
    const tmp = `${this.path(uid)}.${process.pid}.tmp`;
    const fd = openSync(tmp, 'w', 0o600);
    try { writeSync(fd, JSON.stringify(owner)); } finally { closeSync(fd); }
    renameSync(tmp, this.path(uid));
  }

  /**
   * Makes `uid` `owner`'s if nobody live holds it: a missing claim is made, a stale one (its owner
   * gone) taken over, one `owner` holds already kept. False while a live process holds it, or another
   * server is taking claims over right now. Whoever removes what an index names (a namespace, a
   * veth) must hold its claim first: else another server may claim the index meanwhile and lose
   * what it just made under it.
   */
  takeOver(uid: number, owner: ClaimOwner): boolean {
    return this.locked(() => {
      const cur = this.owner(uid);
      if (cur && sameOwner(cur, owner)) return true;
      if (this.tryClaim(uid, owner)) return true;
      if (!this.isStale(uid)) return false;
      try { unlinkSync(this.path(uid)); } catch { /* gone */ }
      return this.tryClaim(uid, owner);
    }) ?? false;
  }

  /** Releases `uid` if `owner` still holds it. */
  release(uid: number, owner: ClaimOwner): void {
    releaseClaim(this.path(uid), owner);
  }

  owner(uid: number): ClaimOwner | null {
    return readClaim(this.path(uid));
  }

  claimPath(uid: number): string {
    return this.path(uid);
  }

  /** How many of the range are not claimed now (a stale claim counts until it is swept or reclaimed). */
  free(): number {
    return this.count - this.claimed().filter((n) => n >= this.base && n < this.base + this.count).length;
  }

  /** Uids claimed right now (for tests and diagnostics). */
  claimed(): number[] {
    try {
      return readdirSync(this.dir).filter((n) => /^\d+$/.test(n)).map(Number);
    } catch {
      return [];
    }
  }

  private path(uid: number): string {
    return join(this.dir, String(uid));
  }

  private tryClaim(uid: number, owner: ClaimOwner): boolean {
    let fd: number;
    try {
      fd = openSync(this.path(uid), 'wx', 0o600);
    } catch {
      return false;
    }
    try { writeSync(fd, JSON.stringify(owner)); } finally { closeSync(fd); }
    return true;
  }

  /** Takes over a stale claim, under a lock so that two servers cannot both take the same one. */
  private reclaim(uid: number, owner: ClaimOwner): boolean {
    return this.locked(() => {
      if (!this.isStale(uid)) return false;
      try { unlinkSync(this.path(uid)); } catch { /* gone */ }
      return this.tryClaim(uid, owner);
    }) ?? false;
  }

  /** Removes stale claims (VMMs that died with no server to release them). Returns how many. */
  sweepStale(): number {
    return this.locked(() => {
      let n = 0;
      for (const uid of this.claimed()) {
        if (!this.isStale(uid)) continue;
        try { unlinkSync(this.path(uid)); n++; } catch { /* gone */ }
      }
      return n;
    }) ?? 0;
  }

  /** Runs `fn` holding the pool's lock; undefined if another server holds it. */
  private locked<T>(fn: () => T): T | undefined {
    const lock = join(this.dir, '.reclaim.lock');
    try {
      mkdirSync(lock);
    } catch {
      // A lock left by a crashed server expires after a few seconds.
      try { if (Date.now() - statSync(lock).mtimeMs > 5000) rmdirSync(lock); } catch { /* gone */ }
      return undefined;
    }
    try {
      return fn();
    } finally {
      try { rmdirSync(lock); } catch { /* gone */ }
    }
  }

  private isStale(uid: number): boolean {
    const o = this.owner(uid);
    // Unreadable or half-written: stale only if nothing runs as that uid.
    if (o && processMatches(o)) return false;
    return !this.inUse(uid);
  }
}

/** VMM uids (default 200000…265535): a uid some process still runs as is never reclaimed. */
export class UidPool extends ClaimPool {
  constructor(dir: string, base: number, count: number) {
    if (!Number.isInteger(base) || base < 1000 || !Number.isInteger(count) || count < 1 || base + count > 2 ** 31) {
      throw new Error(`bad VMM uid range ${base}+${count}`);
    }
    super(dir, base, count, { what: 'VMM uid', resource: 'vmm_uids' }, uidInUse);
  }
}

export function readClaim(path: string): ClaimOwner | null {
  try {
    const v = JSON.parse(readFileSync(path, 'utf8'));
    return typeof v?.pid === 'number' && typeof v?.startTicks === 'string' ? v : null;
  } catch {
    return null;
  }
}

/** Whether two claim owners are the same process (a pid alone may have been reused). */
export function sameOwner(a: ClaimOwner, b: ClaimOwner): boolean {
  return a.pid === b.pid && a.startTicks === b.startTicks;
}

/** Removes the claim file at `path` if it names `owner`: a uid someone else has since claimed is left alone. */
export function releaseClaim(path: string, owner: ClaimOwner): void {
  const cur = readClaim(path);
  if (!cur || !sameOwner(cur, owner)) return;
  try { unlinkSync(path); } catch { /* already gone */ }
}

export function processMatches(o: ClaimOwner): boolean {
  try {
    const stat = readFileSync(`/proc/${o.pid}/stat`, 'utf8');
    const rest = stat.slice(stat.lastIndexOf(')') + 2);
    if (rest[0] === 'Z') return false;
    return rest.split(' ')[19] === o.startTicks;
  } catch {
    return false;
  }
}

/** Whether process `pid` exists and is not a zombie (one killed but not yet reaped by its parent). */
export function isRunning(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

/**
 * Whether any process runs with effective uid `uid` (/proc/<pid> is owned by it). A zombie does not
 * run: a killed VMM whose parent died stays one until init reaps it.
 */
export function uidInUse(uid: number): boolean {
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      if (statSync(`/proc/${p}`).uid === uid && isRunning(Number(p))) return true;
    } catch { /* exited meanwhile */ }
  }
  return false;
}

let selfTicks: string | undefined;
/** This process's start time (clock ticks since boot), as claims record it. */
export function ownStartTicks(): string {
  if (selfTicks === undefined) {
    const stat = readFileSync('/proc/self/stat', 'utf8');
    selfTicks = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  }
  return selfTicks;
}
