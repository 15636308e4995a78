"""Search and fan-out helpers (mirroring sdk/typescript/src/rl/helpers.ts). Each deletes what it forked or
created, also when a step raises; only a winner you ask to keep survives."""
from __future__ import annotations

import concurrent.futures
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, List, Mapping, Optional, Sequence, TypeVar

from collimate import NotFoundError, Sandbox

from .fleet import RUN_LABEL, Fleet

__all__ = ["Scored", "BestOfN", "TreeSearchResult", "best_of_n", "tree_search", "map", "map_sandboxes", "sweep"]

T = TypeVar("T")
R = TypeVar("R")


def _delete_quietly(sb: Sandbox) -> None:
    try:
        sb.delete()
    except NotFoundError:
        pass


def _delete_all(sandboxes: Iterable[Sandbox]) -> None:
    """Deletes them all (in parallel); raises the first failure other than already-gone."""
    items = list(sandboxes)
    if not items:
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
        errors = [f.exception() for f in [pool.submit(_delete_quietly, sb) for sb in items]]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


def _finite(x: float) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else -math.inf


@dataclass
class Scored(Generic[R]):
    index: int
    result: R
    score: float


@dataclass
class BestOfN(Generic[R]):
    winner: Scored[R]
    all: List[Scored[R]]
    #: The winning child, alive, when ``keep_winner=True``.
    sandbox: Optional[Sandbox] = None


def best_of_n(
    parent: Sandbox,
    n: int,
    step: Callable[[Sandbox, int], R],
    score: Callable[[R], float],
    *,
    keep_winner: bool = False,
    labels: Optional[Mapping[str, str]] = None,
) -> BestOfN[R]:
    """Forks ``parent`` into ``n`` live children, runs ``step(child, i)`` in each (threads), scores
    the results and picks the highest (ties: lowest index). Losers are deleted, the winner too
    unless ``keep_winner``. If a step or score raises, every child is deleted and it re-raises."""
    children = parent.fork(n, labels=labels)
    keep: Optional[Sandbox] = None
    ok = False
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, n)) as pool:
            futures = [pool.submit(step, c, i) for i, c in enumerate(children)]
            concurrent.futures.wait(futures)
        for f in futures:
            if f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        scored = [Scored(i, f.result(), _finite(score(f.result()))) for i, f in enumerate(futures)]
        best = scored[0]
        for s in scored[1:]:
            if s.score > best.score:
                best = s
        if keep_winner:
            keep = children[best.index]
        ok = True
        return BestOfN(best, scored, keep)
    finally:
        try:
            _delete_all(c for c in children if c is not keep)
        except Exception:
            if ok:
                raise


@dataclass
class TreeNode(Generic[R]):
    depth: int
    path: List[int]
    parent_id: str
    result: Any = None
    score: float = -math.inf
    sandbox: Optional[Sandbox] = field(default=None, repr=False)


@dataclass
class TreeSearchResult(Generic[R]):
    best: TreeNode[R]
    #: Every evaluated node's (path, score), per level (index 0 = depth 1).
    levels: List[List[Any]]


def tree_search(
    root: Sandbox,
    *,
    expand: int,
    depth: int,
    beam: int,
    step: Callable[[Sandbox, TreeNode[R]], R],
    score: Callable[[R], float],
    keep_best: bool = False,
    labels: Optional[Mapping[str, str]] = None,
) -> TreeSearchResult[R]:
    """Beam search over live forks: each level forks every frontier node into ``expand`` children,
    runs ``step`` in each, keeps the best ``beam`` and deletes the rest; expanded nodes are deleted
    once their children exist. The root is never deleted. On error everything the search created
    is deleted and the error re-raised."""
    if expand < 1 or depth < 1 or beam < 1:
        raise ValueError("tree_search needs expand, depth and beam >= 1")
    owned: List[Sandbox] = []
    lock = threading.Lock()
    levels: List[List[Any]] = []
    frontier: List[TreeNode[R]] = [TreeNode(0, [], "", sandbox=root)]
    kept: Optional[Sandbox] = None
    ok = False

    def expand_node(node: TreeNode[R], d: int) -> List[TreeNode[R]]:
        assert node.sandbox is not None
        kids = node.sandbox.fork(expand, labels=labels)
        with lock:
            owned.extend(kids)
        out = [TreeNode(d, node.path + [i], node.sandbox.id, sandbox=k) for i, k in enumerate(kids)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=expand) as pool:
            results = list(pool.map(lambda t: step(t.sandbox, t), out))  # type: ignore[arg-type]
        for t, r in zip(out, results):
            t.result = r
            t.score = _finite(score(r))
        return out

    try:
        for d in range(1, depth + 1):
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(frontier)) as pool:
                futures = [pool.submit(expand_node, f, d) for f in frontier]
                concurrent.futures.wait(futures)
            for f in futures:
                if f.exception() is not None:
                    raise f.exception()  # type: ignore[misc]
            scored = [t for f in futures for t in f.result()]
            levels.append([(t.path, t.score) for t in scored])
            ranked = sorted(scored, key=lambda t: -t.score)  # stable: ties keep evaluation order
            survivors, pruned = ranked[:beam], ranked[beam:]
            dead = [t.sandbox for t in pruned] + [f.sandbox for f in frontier if f.sandbox is not root]
            _delete_all(s for s in dead if s is not None)
            with lock:
                owned[:] = [s for s in owned if all(s is not x for x in dead)]
            frontier = survivors
        best = frontier[0]
        if keep_best:
            kept = best.sandbox
        else:
            best = TreeNode(best.depth, best.path, best.parent_id, best.result, best.score, None)
        ok = True
        return TreeSearchResult(best, levels)
    finally:
        try:
            _delete_all(s for s in owned if s is not kept)
        except Exception:
            if ok:
                raise


def map(  # noqa: A001 - the RL SDK's name for it
    items: Iterable[T],
    fn: Callable[[T], R],
    *,
    concurrency: int,
    rate_per_sec: Optional[float] = None,
) -> List[R]:
    """``fn`` over ``items`` in threads: at most ``concurrency`` running at once and at most
    ``rate_per_sec`` starts per second; results in input order. After the first failure no new
    task starts; the running ones finish and the error is re-raised."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if rate_per_sec is not None and not rate_per_sec > 0:
        raise ValueError("rate_per_sec must be > 0")
    todo = list(items)
    results: List[Any] = [None] * len(todo)
    lock = threading.Lock()
    # Starts pass one at a time, each at least 1/rate after the previous one actually started: a
    # late wake-up can delay a start but never bunch two together.
    start_lock = threading.Lock()
    state = {"next": 0, "last_start": -math.inf}
    failure: List[BaseException] = []

    def take() -> Optional[int]:
        with lock:
            if failure or state["next"] >= len(todo):
                return None
            i = int(state["next"])
            state["next"] += 1
        if rate_per_sec is not None:
            with start_lock:
                wait = state["last_start"] + 1.0 / rate_per_sec - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                state["last_start"] = time.monotonic()
        return i

    def worker() -> None:
        while True:
            i = take()
            if i is None:
                return
            with lock:
                if failure:
                    return
            try:
                results[i] = fn(todo[i])
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                with lock:
                    failure.append(e)
                return

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, len(todo)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failure:
        raise failure[0]
    return results


def map_sandboxes(
    fleet: Fleet,
    template: str,
    items: Iterable[T],
    fn: Callable[[Sandbox, T], R],
    *,
    concurrency: int,
    rate_per_sec: Optional[float] = None,
    labels: Optional[Mapping[str, str]] = None,
) -> List[R]:
    """One fresh sandbox per item (created at most ``rate_per_sec`` per second, at most
    ``concurrency`` alive), ``fn(sandbox, item)``, and the sandbox is always deleted."""

    def one(item: T) -> R:
        with fleet.create(template, labels=labels) as sb:
            return fn(sb, item)

    return map(items, one, concurrency=concurrency, rate_per_sec=rate_per_sec)


def sweep(fleet: Fleet, run_id: Optional[str] = None, *, quiet_secs: float = 2.0, max_rounds: int = 30) -> int:
    """Deletes every sandbox carrying ``{collimate_run: run_id}`` (default: the fleet's run) —
    running, suspended, forked — and every snapshot carrying it (``sandbox.snapshot()`` of a
    fleet's sandbox), e.g. after a trainer crashed. Once both lists are empty it waits
    ``quiet_secs`` and looks again (creates and snapshots in flight when the trainer died land
    late). Returns how many sandboxes and snapshots it deleted."""
    rid = run_id or fleet.run_id
    labels = {RUN_LABEL: rid}
    deleted = 0
    quiet = False

    def counted(remove: Callable[[str], None]) -> Callable[[str], int]:
        def one(ident: str) -> int:
            try:
                remove(ident)
                return 1
            except NotFoundError:
                return 0

        return one

    for _ in range(max_rounds):
        ids = fleet.list_ids(labels=labels)
        stored = fleet.list_snapshot_ids(labels=labels)
        if not ids and not stored:
            if quiet:
                return deleted
            quiet = True
            time.sleep(quiet_secs)
            continue
        quiet = False
        deleted += sum(map(ids, counted(fleet.delete_by_id), concurrency=8))
        deleted += sum(map(stored, counted(fleet.delete_snapshot), concurrency=8))
    raise RuntimeError(f"sweep({rid}): sandboxes or snapshots kept appearing after {max_rounds} rounds ({deleted} deleted)")
