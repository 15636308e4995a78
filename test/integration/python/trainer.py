"""A toy trainer for the crash test: it keeps forking rollouts off a root and never cleans up, as a
trainer does mid-run. The driver SIGKILLs it and then sweeps its run id."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "sdk", "python"))

import collimate_rl as rl  # noqa: E402

fleet = rl.connect(run_id=os.environ["RUN_ID"])
root = fleet.create("base")
root.exec("echo 0 > /root/step")
print(f"root {root.id}", flush=True)
step = 0
while True:
    step += 1
    print(f"step {step}", flush=True)
    kids = root.fork(2)
    for k in kids:
        k.exec(f"echo {step} > /root/step")
    print(f"forked {step} {' '.join(k.id for k in kids)}", flush=True)
