import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { homePaths } from '../host/paths.js';
import { ownStartTicks, processMatches, readClaim } from '../host/claims.js';

/**
 * Garbage collection of template RAM files on tmpfs. Every bake leaves a RAM file
 * (`artifact-<key>-<build>.mem`) that lives as long as tmpfs does; a new agent, kernel command line
 * or image makes new keys, and a deleted or rebaked environment leaves its old one, so without this
 * they pile up in /dev/shm.
 *
 * Several servers may share one cache (one host, several data directories; the test suite), so a
 * server cannot know from its own rows who needs an artifact. Each process that loads one claims
 * it: a file `users/<pid>-<start ticks>` in the artifact's directory, written before it checks
 * that the RAM file is there (ensureArtifact, TemplatePools.artifactFor). A RAM file goes only when
 * all of these hold:
 * - no live process claims its artifact (claims of dead ones are removed);
 * - nobody claimed it for `graceMs` (the mtime of its `claimed-at` file: a server restarting, or one
 *   whose environments are still being restored, is not raced);
 * - no process maps it (/proc/PID/maps: a running sandbox of an old build, a bake's VMM);
 * - it is not a bake under way (its `tmp-<build>` directory).
 * It is renamed aside first and the checks repeated before it is unlinked, so a claim that lands
 * in between puts it back. A template that needs it again later bakes it again.
 */
export function claimArtifact(root: string): void {
  const users = join(root, 'users');
  const me = `${process.pid}-${ownStartTicks()}`;
  const path = join(users, me);
  if (claimed.has(path) && existsSync(path)) return;
  mkdirSync(users, { recursive: true });
  writeFileSync(path, JSON.stringify({ pid: process.pid, startTicks: ownStartTicks() }));
  writeFileSync(join(root, 'claimed-at'), '');
  claimed.add(path);
}
const claimed = new Set<string>();

/**
 * This process no longer uses the artifact in `root` (its template was deleted or replaced): its
 * claim goes, and `claimed-at` is touched, so the collector takes the RAM file once the grace
 * period has passed since this last use, unless another process claims it or maps it by then.
 */
export function releaseArtifact(root: string): void {
  const path = join(root, 'users', `${process.pid}-${ownStartTicks()}`);
  claimed.delete(path);
  if (!existsSync(path)) return;
  rmSync(path, { force: true });
  writeFileSync(join(root, 'claimed-at'), '');
}

/** Live claims on the artifact in `root`; claims of processes that are gone are removed. */
export function liveClaims(root: string): number {
  const users = join(root, 'users');
  let live = 0;
  for (const f of existsSync(users) ? readdirSync(users) : []) {
    const owner = readClaim(join(users, f));
    if (owner && processMatches(owner)) live++;
    else rmSync(join(users, f), { force: true });
  }
  return live;
}

/** When the artifact in `root` was last claimed (ms), or 0 if never. */
function lastClaimed(root: string): number {
  try { return statSync(join(root, 'claimed-at')).mtimeMs; } catch { return 0; }
}

/** Paths of every file some process maps (from /proc/PID/maps). */
export function mappedFiles(): Set<string> {
  const out = new Set<string>();
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    let maps: string;
    try { maps = readFileSync(`/proc/${p}/maps`, 'utf8'); } catch { continue; }
    for (const line of maps.split('\n')) {
      const i = line.indexOf('/');
      if (i > 0) out.add(line.slice(i).replace(/ \(deleted\)$/, ''));
    }
  }
  return out;
}

const RAM_FILE = /^artifact-([0-9a-f]{24})-(.+)\.mem$/;
const ASIDE = /^artifact-[0-9a-f]{24}-.+\.mem\.gc-(\d+)$/;

/**
 * Removes the RAM files in `ramDir` of artifacts (in `cacheDir`) that nobody uses, as described
 * above; `keep` are this server's own. Returns the paths removed.
 */
export function collectArtifactRam(cacheDir: string, ramDir: string, keep: Set<string>, graceMs: number, now = Date.now()): string[] {
  if (!existsSync(ramDir)) return [];
  const artifacts = homePaths(cacheDir).artifacts;
  // A collector that died between its rename and its unlink left its file aside.
  for (const f of readdirSync(ramDir)) {
    const m = ASIDE.exec(f);
    if (m && !existsSync(`/proc/${m[1]}`)) rmSync(join(ramDir, f), { force: true });
  }
  const candidates = readdirSync(ramDir).flatMap((f) => {
    const m = RAM_FILE.exec(f);
    if (!m) return [];
    const path = join(ramDir, f);
    const root = join(artifacts, m[1]);
    if (keep.has(path) || existsSync(join(root, `tmp-${m[2]}`))) return [];
    return [{ path, root }];
  });
  if (candidates.length === 0) return [];
  const unused = (c: { root: string }) => liveClaims(c.root) === 0 && now - lastClaimed(c.root) >= graceMs;
  // Aside first, all at once; then one more look at the claims and mappings decides each.
  const before = mappedFiles();
  const aside = candidates.filter((c) => unused(c) && !before.has(c.path)).flatMap((c) => {
    const to = `${c.path}.gc-${process.pid}`;
    try { renameSync(c.path, to); return [{ ...c, aside: to }]; } catch { return []; }
  });
  if (aside.length === 0) return [];
  const after = mappedFiles();
  const removed: string[] = [];
  for (const c of aside) {
    if (!unused(c) || after.has(c.path) || after.has(c.aside)) {
      renameSync(c.aside, c.path);
      continue;
    }
    unlinkSync(c.aside);
    removed.push(c.path);
  }
  return removed;
}
