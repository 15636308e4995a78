/**
 * Search and fan-out helpers, written once against the Fleet / Sandbox interface so they run the same
 * over HTTP (connect) and in-process (createLocalFleet). Each one deletes what it forked or created,
 * also when a step throws: a helper never leaks sandboxes unless you ask to keep the winner.
 */
import { NotFoundError } from '../errors.js';
import { RUN_LABEL, type CreateOptions, type Fleet, type Sandbox, type SweepOptions } from './fleet.js';

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
 * Live-forks `parent` into `n` children, runs `step(child, i)` in each concurrently, scores each
 * result and picks the highest score (ties: lowest index). Losers are deleted; the winner too unless
 * `keepWinner`. If any step or score throws, every child is deleted and the first error is rethrown.
 * The parent is left as it was.
 */
export async function bestOfN<R>(
  parent: Sandbox,
  n: number,
  step: (sb: Sandbox, i: number) => Promise<R>,
  score: (result: R, i: number) => number,
  opts: BestOfNOptions = {},
): Promise<BestOfNResult<R>> {
  const children = await parent.fork(n, { labels: opts.labels });
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
  parentId: string;
}

export interface TreeSearchOptions<R> {
  /** Children per expanded node (k). */
  expand: number;
  /** Levels below the root. */
  depth: number;
  /** Nodes kept per level (the rest are deleted). */
  beam: number;
  /** Runs in each new child; the child starts as a live copy of its parent. */
  step: (sb: Sandbox, ctx: TreeNodeContext) => Promise<R>;
  score: (result: R, ctx: TreeNodeContext) => number;
  /** Keep the best final node alive and return it as `best.sandbox` (default false). */
  keepBest?: boolean;
  labels?: Record<string, string>;
}

export interface TreeSearchResult<R> {
  best: { result: R; score: number; path: number[]; depth: number; sandbox?: Sandbox };
  /** Scores of every node evaluated, per level (index 0 = depth 1), in evaluation order. */
  levels: Array<Array<{ path: number[]; score: number }>>;
}

interface TreeNode<R> {
  sandbox: Sandbox;
  result: R;
  score: number;
  ctx: TreeNodeContext;
}

/**
 * Beam search over live forks. Each level forks every frontier node into `expand` children, runs
 * `step` in each, scores them, keeps the best `beam` as the next frontier and deletes the rest; an
 * expanded node is deleted once its children exist (its state lives on in them). The root is never
 * deleted. At most beam × (expand + 1) sandboxes are alive at once (plus the root). On any error
 * every sandbox the search created is deleted and the error rethrown.
 */
export async function treeSearch<R>(root: Sandbox, opts: TreeSearchOptions<R>): Promise<TreeSearchResult<R>> {
  if (!(opts.expand >= 1 && opts.depth >= 1 && opts.beam >= 1)) throw new RangeError('treeSearch needs expand, depth and beam ≥ 1');
  const owned = new Set<Sandbox>();
  const levels: TreeSearchResult<R>['levels'] = [];
  let frontier: Array<{ sandbox: Sandbox; path: number[]; node?: TreeNode<R> }> = [{ sandbox: root, path: [] }];
  let kept: Sandbox | undefined;
  try {
    let scored: TreeNode<R>[] = [];
    for (let depth = 1; depth <= opts.depth; depth++) {
      const expansions = await Promise.allSettled(
        frontier.map(async (f) => {
          const kids = await f.sandbox.fork(opts.expand, { labels: opts.labels });
          kids.forEach((k) => owned.add(k));
          return Promise.all(
            kids.map(async (sandbox, i): Promise<TreeNode<R>> => {
              const ctx: TreeNodeContext = { depth, path: [...f.path, i], parentId: f.sandbox.id };
              const result = await opts.step(sandbox, ctx);
              return { sandbox, result, score: finiteScore(opts.score(result, ctx)), ctx };
            }),
          );
        }),
      );
      const failed = expansions.find((e): e is PromiseRejectedResult => e.status === 'rejected');
      if (failed) throw failed.reason;
      scored = expansions.flatMap((e) => (e as PromiseFulfilledResult<TreeNode<R>[]>).value);
      levels.push(scored.map((n) => ({ path: n.ctx.path, score: n.score })));
      // Stable sort: equal scores keep evaluation order.
      const ranked = [...scored].sort((a, b) => b.score - a.score);
      const survivors = ranked.slice(0, opts.beam);
      const pruned = ranked.slice(opts.beam).map((n) => n.sandbox);
      const expanded = frontier.map((f) => f.sandbox).filter((s) => s !== root);
      await deleteAll([...pruned, ...expanded]);
      [...pruned, ...expanded].forEach((s) => owned.delete(s));
      frontier = survivors.map((n) => ({ sandbox: n.sandbox, path: n.ctx.path, node: n }));
    }
    const best = frontier[0].node!;
    if (opts.keepBest) kept = best.sandbox;
    return {
      best: { result: best.result, score: best.score, path: best.ctx.path, depth: best.ctx.depth, sandbox: kept },
      levels,
    };
  } finally {
    await deleteAll([...owned].filter((s) => s !== kept));
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
 * Deletes every sandbox carrying `{collimate_run: runId}` — running, suspended, forked children —
 * e.g. after a trainer crashed. Creates that were in flight when it died land late, so once the
 * list is empty it waits `quietMs` and looks again. Returns how many it deleted.
 */
export async function sweep(fleet: Fleet, runId: string, opts: SweepOptions = {}): Promise<number> {
  const quietMs = opts.quietMs ?? 2000;
  const maxRounds = opts.maxRounds ?? 30;
  let deleted = 0;
  let quiet = false;
  for (let round = 0; round < maxRounds; round++) {
    const ids = await fleet.listIds({ labels: { [RUN_LABEL]: runId } });
    if (ids.length === 0) {
      if (quiet) return deleted;
      quiet = true;
      await sleep(quietMs);
      continue;
    }
    quiet = false;
    await map(
      ids,
      async (id) => {
        try {
          await fleet.deleteById(id);
          deleted++;
        } catch (e) {
          if (!(e instanceof NotFoundError)) throw e;
        }
      },
      { concurrency: 8 },
    );
  }
  throw new Error(`sweep(${runId}): sandboxes kept appearing after ${maxRounds} rounds (${deleted} deleted)`);
}
