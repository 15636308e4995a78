"""RL SDK (Python): best-of-N over live forks, then a sweep of the run.
With the `collimate` wheel installed (it carries collimate_rl; see quickstart.py):

    COLLIMATE_API_KEY=clm_... python3 best_of_n.py

In this repository without installing: PYTHONPATH=sdk/python python3 docs/examples/best_of_n.py
"""
import collimate_rl as rl

fleet = rl.connect()  # one persistent keep-alive connection; every sandbox carries the run label
try:
    root = fleet.create("base")
    root.exec("echo 100 > /root/bound")  # the state every candidate inherits

    candidates = [
        "echo 89",
        "echo 99",
        "n=$(($(cat /root/bound)-1)); while [ $n -gt 1 ]; do i=2; p=1; while [ $((i*i)) -le $n ]; do "
        "if [ $((n%i)) -eq 0 ]; then p=0; break; fi; i=$((i+1)); done; [ $p = 1 ] && { echo $n; exit 0; }; n=$((n-1)); done",
        "echo 91",
    ]

    def score(r):
        n = int(r.stdout)
        return n if n > 1 and all(n % d for d in range(2, int(n**0.5) + 1)) else float("-inf")

    out = rl.best_of_n(root, len(candidates), lambda sb, i: sb.exec(candidates[i]), score)
    print("scores:", " ".join(str(s.score) for s in out.all))
    print(f"winner: candidate {out.winner.index} printed {out.winner.result.stdout.strip()}")
    root.delete()
finally:
    print("swept:", fleet.sweep())
    fleet.close()
