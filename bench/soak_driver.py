"""The Python SDK's half of the soak (bench/soak.ts starts it beside the TypeScript half).

Waves until the deadline: create -> exec -> fork(4) -> exec in the children -> suspend some ->
resume them -> exec in them -> delete all. A 503 (host_at_capacity, shutting_down: nothing was
done) is retried after its Retry-After and counted; anything else is an error, recorded, and the
wave's sandboxes are deleted before the next wave. The client retries nothing itself, so every 503
is seen here. Prints the counts as one JSON line on stdout; progress on stderr.

    PYTHONPATH=sdk/python COLLIMATE_BASE_URL=... COLLIMATE_API_KEY=... python3 bench/soak_driver.py --seconds 180
"""
import argparse
import json
import sys
import time

from collimate import Collimate, CollimateError, NotFoundError

COUNTS = {"waves": 0, "create": 0, "exec": 0, "fork": 0, "children": 0, "suspend": 0, "resume": 0, "delete": 0, "retries_503": 0}
ERRORS = []
MAX_RETRIES = 30


def op(name, fn):
    """Runs one SDK call, retrying 503s after their Retry-After; counts it once it succeeds."""
    for attempt in range(MAX_RETRIES + 1):
        try:
            result = fn()
        except CollimateError as e:
            if e.status != 503 or attempt == MAX_RETRIES:
                raise
            COUNTS["retries_503"] += 1
            time.sleep(e.retry_after if e.retry_after else 5)
            continue
        COUNTS[name] += 1
        return result


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def wave(client, n, made):
    tag = f"py-{n}"
    sb = op("create", lambda: client.sandboxes.create("base", labels={"soak": "py", "wave": str(n)}))
    made.append(sb)
    r = op("exec", lambda: sb.exec(
        f"echo {tag} > /root/state; head -c 1048576 /dev/urandom > /root/blob; "
        "(while :; do sleep 1; done) >/dev/null 2>&1 & echo $! > /root/bg.pid; echo ok"))
    expect("parent exec", (r.exit_code, r.stdout), (0, "ok\n"))
    kids = op("fork", lambda: sb.fork(4, labels={"role": "child"}))
    made.extend(kids)
    COUNTS["children"] += len(kids)
    expect("children", len(kids), 4)
    for i, k in enumerate(kids):
        r = op("exec", lambda: k.exec(f"cat /root/state; kill -0 $(cat /root/bg.pid) && echo alive; echo child-{i} > /root/state"))
        expect(f"child {i} exec", r.stdout, f"{tag}\nalive\n")
    # Suspend some: two children every wave, the parent every other wave.
    some = kids[:2] + ([sb] if n % 2 == 1 else [])
    for s in some:
        op("suspend", s.suspend)
    for s in some:
        op("resume", s.resume)
    for s in some:
        want = tag if s is sb else f"child-{kids.index(s)}"
        r = op("exec", lambda: s.exec("cat /root/state; kill -0 $(cat /root/bg.pid) && echo alive"))
        expect("exec after resume", r.stdout, f"{want}\nalive\n")
    for s in reversed(made):
        op("delete", s.delete)
    made.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, required=True)
    args = ap.parse_args()
    deadline = time.monotonic() + args.seconds
    client = Collimate(max_retries=0, timeout=300.0)
    n = 0
    while time.monotonic() < deadline:
        made = []
        try:
            wave(client, n, made)
            COUNTS["waves"] += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the wave is cleaned up
            ERRORS.append(f"wave {n}: {type(e).__name__}: {e}")
            print(f"[soak py] wave {n} failed: {e}", file=sys.stderr, flush=True)
            for s in made:
                try:
                    s.delete()
                except NotFoundError:
                    pass
                except Exception as e2:  # noqa: BLE001
                    ERRORS.append(f"wave {n} cleanup {s.id}: {e2}")
        n += 1
        print(f"[soak py] wave {n} done: {json.dumps(COUNTS)}", file=sys.stderr, flush=True)
    client.close()
    print(json.dumps({"counts": COUNTS, "errors": ERRORS}), flush=True)


if __name__ == "__main__":
    main()
