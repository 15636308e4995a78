/**
 * Search and fan-out helpers, written once against the Fleet / Sandbox interface so they run the same
 * over HTTP (connect) and in-process (createLocalFleet). Each one deletes what it forked or created,
 * also when a step throws: a helper never leaks sandboxes unless you ask to keep the winner.
 *
 * bestOfN and treeSearch start from an Origin: a live sandbox (its children are live forks, with its
 * memory and processes) or a stored state `{ fleet, snapshot }` (its children are started with
 * fleet.fromSnapshot, so they see the state as it was stored, whatever the sandbox it was taken of
 * did since, and that sandbox may be gone).
 */
import { NotFoundError } from '../errors.js';
import { RUN_LABEL, storedStateId, type CreateOptions, type Fleet, type Sandbox, type StoredState, type StoredStateRef, type SweepOptions } from './fleet.js';

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

async function deleteQuietly(sb: Sandbox): Promise<void> {
  try {
    await sb.delete();
  } catch (e) {
    if (!(e instanceof NotFoundError)) throw e;
  }
}

/** Deletes every sandbox; throws the first failure (other than already-gone) after trying them all. */
async function deleteAll(sandboxes: Iterable<Sandbox>): Promise<void> {
  const results = await Promise.allSettled([...sandboxes].map(deleteQuietly));
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
}

async function deleteSnapshotQuietly(fleet: Fleet, state: StoredState): Promise<void> {
  try {
    await fleet.deleteSnapshot(state);
  } catch (e) {
    if (!(e instanceof NotFoundError)) throw e;
  }
}

/** Where a helper's children start: a live sandbox (forked) or a stored state (started from it). */
export type Origin = Sandbox | { fleet: Fleet; snapshot: StoredStateRef };

function isSandbox(origin: Origin): origin is Sandbox {
  return typeof (origin as Sandbox).fork === 'function';
}

/** `n` children of `origin`, carrying the run label and `labels`. */
function spawn(origin: Origin, n: number, labels: Record<string, string> | undefined): Promise<Sandbox[]> {
  return isSandbox(origin) ? origin.fork(n, { labels }) : origin.fleet.fromSnapshot(origin.snapshot, n, { labels });
}

/** A sandbox's id, or a stored state's. */
function originId(origin: Origin): string {
  return isSandbox(origin) ? origin.id : storedStateId(origin.snapshot);
}

function finiteScore(x: number): number {
  return Number.isFinite(x) ? x : -Infinity;
}

// ---------------------------------------------------------------------------------------------
// best-of-N

export interface Scored<R> {
  index: number;
  result: R;
  score: number;
}

export interface BestOfNOptions {
  /** Keep the winning child alive and return it as `winner.sandbox` (default false: every child is deleted). */
  keepWinner?: boolean;
  /** Labels for the children (the run label is always added). */
  labels?: Record<string, string>;
}

export interface BestOfNResult<R> {
  winner: Scored<R> & { sandbox?: Sandbox };
  /** Every child's result and score, by index. */
  all: Scored<R>[];
}

/**
 * Starts `n` children of `origin` — live forks of a sandbox, or sandboxes started from a stored
 * state `{ fleet, snapshot }` — runs `step(child, i)` in each concurrently, scores each result and
 * picks the highest score (ties: lowest index). Losers are deleted; the winner too unless
 * `keepWinner`. If any step or score throws, every child is deleted and the first error is rethrown.
 * The origin (sandbox or stored state) is left as it was.
 */
export async function bestOfN<R>(
  origin: Origin,
  n: number,
  step: (sb: Sandbox, i: number) => Promise<R>,
  score: (result: R, i: number) => number,
  opts: BestOfNOptions = {},
): Promise<BestOfNResult<R>> {
  const children = await spawn(origin, n, opts.labels);
  let winner: Sandbox | undefined;
  try {
    const settled = await Promise.allSettled(children.map((c, i) => step(c, i)));
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (failed) throw failed.reason;
    const all = settled.map((s, i) => {
      const result = (s as PromiseFulfilledResult<R>).value;
      return { index: i, result, score: finiteScore(score(result, i)) };
    });
    const best = all.reduce((a, b) => (b.score > a.score ? b : a));
    if (opts.keepWinner) winner = children[best.index];
    return { winner: { ...best, sandbox: winner }, all };
  } finally {
    await deleteAll(children.filter((c) => c !== winner));
  }
}

// ---------------------------------------------------------------------------------------------
// tree search

export interface TreeNodeContext {
  /** 1 for the root's children. */
  depth: number;
  /** Child indices from the root down to this node. */
  path: number[];
  /** The parent node's sandbox id (for the root's children: the root sandbox's, or its stored state's id). */
  parentId: string;
}

export interface TreeSearchOptions<R> {
  /** Children per expanded node (k). */
  expand: number;
  /** Levels below the root. */
  depth: number;
  /** Nodes kept per level (the rest are deleted). */
  beam: number;
  /** Runs in each new child; the child starts as a copy of its parent (a live fork, or started from its stored state). */
  step: (sb: Sandbox, ctx: TreeNodeContext) => Promise<R>;
  score: (result: R, ctx: TreeNodeContext) => number;
  /** Keep the best final node alive and return it as `best.sandbox` (default false). */
  keepBest?: boolean;
  /**
   * 'sandboxes' (default): a kept node is its live sandbox, deleted once its children exist.
   * 'snapshots': every node kept in the beam is stored (a snapshot, labelled with the run label and
   * `labels`) and its sandbox deleted; its children start from the stored state. The states outlive
   * the search (returned in `levels[].snapshot` and `best.snapshot`), so a node can be expanded again
   * — `treeSearch({ fleet, snapshot }, …)`, `bestOfN(…)`, `fleet.fromSnapshot` — as many times as
   * wanted after its sandbox is gone. They count against the snapshot quotas: delete them with
   * fleet.deleteSnapshot (on an error the search deletes those it stored). Pruned nodes are not stored.
   */
  keep?: 'sandboxes' | 'snapshots';
  labels?: Record<string, string>;
}

export interface TreeSearchResult<R> {
  best: { result: R; score: number; path: number[]; depth: number; sandbox?: Sandbox; snapshot?: StoredState };
  /** Every node evaluated, per level (index 0 = depth 1), in evaluation order; with keep 'snapshots', the beam's nodes carry their stored state. */
  levels: Array<Array<{ path: number[]; score: number; snapshot?: StoredState }>>;
}

interface TreeNode<R> {
  sandbox: Sandbox;
  result: R;
  score: number;
  ctx: TreeNodeContext;
  snapshot?: StoredState;
}

/**
 * Beam search. Each level starts `expand` children of every frontier node (the root first: a live
 * sandbox or a stored state `{ fleet, snapshot }`), runs `step` in each, scores them, keeps the best
 * `beam` as the next frontier and deletes the rest. With keep 'sandboxes' (default) children are
 * live forks and an expanded node is deleted once its children exist (its state lives on in them):
 * at most beam × (expand + 1) sandboxes are alive at once (plus the root). With keep 'snapshots'
 * each beam node is stored and its sandbox deleted before the next level starts from the stored
 * states: at most beam × expand alive, and the stored states are the caller's. The root is never
 * deleted. On any error every sandbox (and stored state) the search created is deleted and the
 * error rethrown.
 */
export async function treeSearch<R>(root: Origin, opts: TreeSearchOptions<R>): Promise<TreeSearchResult<R>> {
  if (!(opts.expand >= 1 && opts.depth >= 1 && opts.beam >= 1)) throw new RangeError('treeSearch needs expand, depth and beam ≥ 1');
  const keepSnapshots = opts.keep === 'snapshots';
  const fleet = root.fleet;
  const owned = new Set<Sandbox>();
  const stored: StoredState[] = [];
  const levels: TreeSearchResult<R>['levels'] = [];
  // A frontier entry: where its children start from, and the node it is (absent for the root).
  let frontier: Array<{ origin: Origin; id: string; path: number[]; node?: TreeNode<R> }> = [{ origin: root, id: originId(root), path: [] }];
  let kept: Sandbox | undefined;
  let ok = false;
  try {
    for (let depth = 1; depth <= opts.depth; depth++) {
      const expansions = await Promise.allSettled(
        frontier.map(async (f) => {
          const kids = await spawn(f.origin, opts.expand, opts.labels);
          kids.forEach((k) => owned.add(k));
          return Promise.all(
            kids.map(async (sandbox, i): Promise<TreeNode<R>> => {
              const ctx: TreeNodeContext = { depth, path: [...f.path, i], parentId: f.id };
              const result = await opts.step(sandbox, ctx);
              return { sandbox, result, score: finiteScore(opts.score(result, ctx)), ctx };
            }),
          );
        }),
      );
      const failed = expansions.find((e): e is PromiseRejectedResult => e.status === 'rejected');
      if (failed) throw failed.reason;
      const scored = expansions.flatMap((e) => (e as PromiseFulfilledResult<TreeNode<R>[]>).value);
      // Stable sort: equal scores keep evaluation order.
      const ranked = [...scored].sort((a, b) => b.score - a.score);
      const survivors = ranked.slice(0, opts.beam);
      const pruned = ranked.slice(opts.beam).map((n) => n.sandbox);
      const expanded = frontier.flatMap((f) => (f.node && !keepSnapshots ? [f.node.sandbox] : []));
      let done = [...pruned, ...expanded];
      if (keepSnapshots) {
        const taken = await Promise.allSettled(
          survivors.map(async (n) => {
            n.snapshot = await n.sandbox.snapshot({ name: `treeSearch node ${n.ctx.path.join('.')}`, labels: opts.labels });
            stored.push(n.snapshot);
          }),
        );
        const notTaken = taken.find((t): t is PromiseRejectedResult => t.status === 'rejected');
        if (notTaken) throw notTaken.reason;
        // The stored states carry the beam on; the last level's sandboxes stay for keepBest.
        if (depth < opts.depth) done = [...done, ...survivors.map((n) => n.sandbox)];
      }
      levels.push(scored.map((n) => ({ path: n.ctx.path, score: n.score, ...(n.snapshot ? { snapshot: n.snapshot } : {}) })));
      await deleteAll(done);
      done.forEach((s) => owned.delete(s));
      frontier = survivors.map((n) => ({
        origin: n.snapshot ? { fleet, snapshot: n.snapshot } : n.sandbox,
        id: n.sandbox.id,
        path: n.ctx.path,
        node: n,
      }));
    }
    const best = frontier[0].node!;
    if (opts.keepBest) kept = best.sandbox;
    ok = true;
    return {
      best: { result: best.result, score: best.score, path: best.ctx.path, depth: best.ctx.depth, sandbox: kept, ...(best.snapshot ? { snapshot: best.snapshot } : {}) },
      levels,
    };
  } finally {
    const cleanup = [deleteAll([...owned].filter((s) => s !== kept))];
    if (!ok) cleanup.push(Promise.all(stored.map((st) => deleteSnapshotQuietly(fleet, st))).then(() => undefined));
    const results = await Promise.allSettled(cleanup);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }
}

// ---------------------------------------------------------------------------------------------
// map with a concurrency cap and a start-rate limit

export interface MapOptions {
  /** Hard cap on tasks running at once. */
  concurrency: number;
  /** At most this many task starts per second (default: no limit). */
  ratePerSec?: number;
}

/**
 * Runs `fn` over `items` with at most `concurrency` tasks in flight and at most `ratePerSec` task
 * starts per second; results come back in input order. On the first failure no new task starts,
 * the running ones finish, and the error is rethrown.
 */
export async function map<T, R>(items: Iterable<T>, fn: (item: T, index: number) => Promise<R>, opts: MapOptions): Promise<R[]> {
  const concurrency = Math.floor(opts.concurrency);
  if (!(concurrency >= 1)) throw new RangeError('map needs concurrency ≥ 1');
  const rate = opts.ratePerSec;
  if (rate !== undefined && !(rate > 0)) throw new RangeError('ratePerSec must be > 0');
  const list = [...items];
  const results = new Array<R>(list.length);
  let next = 0;
  let failure: { error: unknown } | undefined;
  // Starts pass one at a time through a chain, each at least 1/rate after the previous one actually
  // started: a late timer can delay a start but never bunch two together.
  let chain: Promise<void> = Promise.resolve();
  let lastStart = -Infinity;
  const gate = (): Promise<void> => {
    if (rate === undefined) return Promise.resolve();
    chain = chain.then(async () => {
      const wait = lastStart + 1000 / rate - Date.now();
      if (wait > 0) await sleep(wait);
      lastStart = Date.now();
    });
    return chain;
  };
  const worker = async () => {
    while (!failure && next < list.length) {
      const i = next++;
      await gate();
      if (failure) return;
      try {
        results[i] = await fn(list[i], i);
      } catch (error) {
        failure ??= { error };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, list.length) }, worker));
  if (failure) throw failure.error;
  return results;
}

export interface MapSandboxesOptions extends MapOptions, CreateOptions {}

/**
 * One fresh sandbox per item: creates it from `template` (at most `ratePerSec` creations per second,
 * at most `concurrency` sandboxes alive), runs `fn`, and always deletes it.
 */
export function mapSandboxes<T, R>(
  fleet: Fleet,
  template: string,
  items: Iterable<T>,
  fn: (sb: Sandbox, item: T, index: number) => Promise<R>,
  opts: MapSandboxesOptions,
): Promise<R[]> {
  return map(
    items,
    async (item, i) => {
      const sb = await fleet.create(template, { labels: opts.labels, timeoutSecs: opts.timeoutSecs });
      try {
        return await fn(sb, item, i);
      } finally {
        await deleteQuietly(sb);
      }
    },
    opts,
  );
}

// ---------------------------------------------------------------------------------------------
// sweep

/**
 * Deletes every sandbox carrying `{collimate_run: runId}` — running, suspended, forked children,
 * started from a stored state — and every stored state (snapshot) carrying it (`sandbox.snapshot`,
 * treeSearch's `keep: 'snapshots'`), e.g. after a trainer crashed. Creates and snapshots that were in
 * flight when it died land late, so once both lists are empty it waits `quietMs` and looks again.
 * Returns how many sandboxes and snapshots it deleted.
 */
export async function sweep(fleet: Fleet, runId: string, opts: SweepOptions = {}): Promise<number> {
  const quietMs = opts.quietMs ?? 2000;
  const maxRounds = opts.maxRounds ?? 30;
  const labels = { [RUN_LABEL]: runId };
  let deleted = 0;
  let quiet = false;
  /** Runs a delete; one already gone is not counted. */
  const counted = async (remove: () => Promise<void>) => {
    try {
      await remove();
      deleted++;
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  };
  for (let round = 0; round < maxRounds; round++) {
    const ids = await fleet.listIds({ labels });
    const stored = await fleet.listSnapshotIds({ labels });
    if (ids.length === 0 && stored.length === 0) {
      if (quiet) return deleted;
      quiet = true;
      await sleep(quietMs);
      continue;
    }
    quiet = false;
    await map(ids, (id) => counted(() => fleet.deleteById(id)), { concurrency: 8 });
    await map(stored, (id) => counted(() => fleet.deleteSnapshot(id)), { concurrency: 8 });
  }
  throw new Error(`sweep(${runId}): sandboxes or snapshots kept appearing after ${maxRounds} rounds (${deleted} deleted)`);
}
