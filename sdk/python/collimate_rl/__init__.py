"""collimate_rl: fleets of sandboxes for training loops (standard library only).

    import collimate_rl as rl

    fleet = rl.connect()                                   # COLLIMATE_BASE_URL, COLLIMATE_API_KEY
    root = fleet.create("base")
    out = rl.best_of_n(root, 4, lambda sb, i: sb.exec(f"./try {i}"), lambda r: float(r.stdout))
    fleet.sweep()                                          # everything this run created
"""
from .fleet import RUN_LABEL, Fleet, RunSandbox, connect, new_run_id, new_seed
from .helpers import BestOfN, Scored, TreeNode, TreeSearchResult, best_of_n, map, map_sandboxes, sweep, tree_search

__all__ = [
    "RUN_LABEL",
    "Fleet",
    "RunSandbox",
    "connect",
    "new_run_id",
    "new_seed",
    "BestOfN",
    "Scored",
    "TreeNode",
    "TreeSearchResult",
    "best_of_n",
    "tree_search",
    "map",
    "map_sandboxes",
    "sweep",
]
