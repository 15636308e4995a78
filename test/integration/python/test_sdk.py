"""The Python SDK (collimate, collimate_rl) against a real server on real microVMs.

Driven by test/integration/sdk.test.ts, which starts the server and passes COLLIMATE_BASE_URL,
COLLIMATE_API_KEY (a pro tenant) and COLLIMATE_DEMO_KEY (a demo tenant, cap 2) in the environment.
Every test deletes what it creates; the driver checks nothing is left.
"""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402
import collimate_rl as rl  # noqa: E402
from collimate import (  # noqa: E402
    AuthenticationError,
    Collimate,
    ConcurrencyLimitError,
    ExecChunk,
    ExecResult,
    InvalidStateError,
    NotFoundError,
    TierForbiddenError,
    ValidationError,
)

BASE = os.environ["COLLIMATE_BASE_URL"]
KEY = os.environ["COLLIMATE_API_KEY"]
DEMO_KEY = os.environ["COLLIMATE_DEMO_KEY"]


def is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))


class SdkTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = Collimate()  # from the environment
        self.addCleanup(self.client.close)

    def test_lifecycle(self) -> None:
        c = self.client
        self.assertIn("base", [i.id for i in c.images()])
        with c.sandboxes.create("base", labels={"suite": "py-lifecycle"}) as sb:
            self.assertEqual(sb.state, "running")
            self.assertEqual(sb.labels["suite"], "py-lifecycle")

            r = sb.exec("echo hello; echo oops >&2; exit 3")
            self.assertIsInstance(r, ExecResult)
            self.assertEqual((r.stdout, r.stderr, r.exit_code), ("hello\n", "oops\n", 3))
            self.assertFalse(r.ok)

            r = sb.exec(code="echo $((6*7))", env={"X": "1"}, cwd="/tmp")
            self.assertEqual(r.stdout, "42\n")
            self.assertTrue((r.seed or "").isdigit(), "the server reports the seed it drew")
            self.assertEqual(sb.exec("true", seed="12345").seed, "12345")
            sb.exec("mkdir -p /root/w")
            r = sb.exec(commands=[["sh", "-c", "echo in-$(pwd)"], ["false"], ["echo", "never"]], cwd="/root/w")
            self.assertEqual((r.stdout, r.exit_code, r.failed_index), ("in-/root/w\n", 1, 1))
            r = sb.exec("cat /root/in.bin | od -An -tx1 | tr -d ' \\n'; cat", files={"/root/in.bin": b"\x00\xff"}, stdin="piped")
            self.assertEqual(r.stdout, "00ffpiped")

            # Streaming: callbacks get the output while the command still runs.
            chunks, first_at = [], []

            def on_out(b: bytes) -> None:
                first_at.append(time.monotonic())
                chunks.append(b)

            r = sb.exec("for i in 1 2 3; do echo line$i; sleep 0.3; done", on_stdout=on_out)
            done_at = time.monotonic()
            self.assertEqual(b"".join(chunks).decode(), r.stdout)
            self.assertEqual(r.stdout, "line1\nline2\nline3\n")
            self.assertGreaterEqual(len(chunks), 2, "output arrives in more than one chunk")
            self.assertLess(first_at[0], done_at - 0.4, "the first chunk arrives before the exec ends")

            events = list(sb.exec_stream("echo a; echo b >&2"))
            self.assertIsInstance(events[-1], ExecResult)
            self.assertEqual(events[-1].type, "result")
            out = b"".join(e.data for e in events[:-1] if isinstance(e, ExecChunk) and e.type == "stdout")
            err = b"".join(e.data for e in events[:-1] if isinstance(e, ExecChunk) and e.type == "stderr")
            self.assertEqual((out, err), (b"a\n", b"b\n"))

            # Files.
            blob = bytes(range(256)) * 3
            self.assertEqual(sb.files.write("/root/data/blob.bin", blob)["size"], len(blob))
            self.assertEqual(sb.files.read("/root/data/blob.bin"), blob)
            sb.files.write("/root/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
            self.assertEqual(sb.exec("/root/run.sh").stdout, "ran\n")
            with self.assertRaises(NotFoundError):
                sb.files.read("/root/missing")

            # Fork: children keep the parent's state; their writes are private.
            sb.exec("echo parent-state > /root/state")
            kids = sb.fork(2, labels={"branch": "yes"})
            try:
                self.assertEqual(len(kids), 2)
                for i, k in enumerate(kids):
                    self.assertEqual(k.parent, sb.id)
                    self.assertEqual(k.labels, {"suite": "py-lifecycle", "branch": "yes"})
                    self.assertEqual(k.exec("cat /root/state").stdout, "parent-state\n")
                    k.exec(f"echo kid{i} > /root/state")
                self.assertEqual(sb.exec("cat /root/state").stdout, "parent-state\n")
                self.assertEqual(sorted(sb.refresh().info.children), sorted(k.id for k in kids))
                self.assertEqual(len(c.sandboxes.list(labels={"suite": "py-lifecycle"}).all()), 3)
            finally:
                for k in kids:
                    k.delete()

            # Suspend / resume keep the state.
            sb.suspend()
            self.assertEqual(sb.state, "suspended")
            self.assertEqual([s.id for s in c.sandboxes.list(state="suspended", labels={"suite": "py-lifecycle"}).all()], [sb.id])
            with self.assertRaises(InvalidStateError) as cm:
                sb.exec("true")
            self.assertEqual(cm.exception.state, "suspended")
            self.assertEqual(cm.exception.status, 409)
            sb.resume()
            self.assertEqual(sb.state, "running")
            self.assertEqual(sb.exec("cat /root/state").stdout, "parent-state\n")
            sid = sb.id
        # The context manager deleted it.
        with self.assertRaises(NotFoundError):
            c.sandboxes.get(sid)
        self.assertEqual(c.http.connections_opened, 1, "one keep-alive connection served every sequential call")

    def test_code_cells(self) -> None:
        # The node template's JavaScript kernel (the TS half runs Python cells).
        with self.client.sandboxes.create("node", labels={"suite": "py-code"}) as sb:
            sb.run_code("let total = 40")
            printed = []
            r = sb.run_code('console.log("hi"); total + 2', on_stdout=printed.append)
            self.assertEqual((r.text, "".join(printed), r.error), ("42", "hi\n", None))
            ctx = sb.create_code_context(language="javascript", cwd="/tmp")
            # A context is a kernel of its own: none of the default context's state, its own cwd.
            self.assertEqual(sb.run_code("[typeof total, process.cwd()].join()", context=ctx).text, "'undefined,/tmp'")
            sb.remove_code_context(ctx)
            with self.assertRaises(NotFoundError):
                sb.run_code("1", context=ctx)

    def test_typed_errors(self) -> None:
        with self.assertRaises(AuthenticationError) as cm:
            Collimate(api_key="clm_" + "x" * 40, base_url=BASE).images()
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))
        with self.assertRaises(NotFoundError) as nf:
            self.client.sandboxes.get("sbx_000000000000")
        self.assertEqual(nf.exception.code, "sandbox_not_found")
        with self.assertRaises(NotFoundError):
            self.client.sandboxes.create("no-such-template")

        demo = Collimate(api_key=DEMO_KEY, base_url=BASE)
        self.addCleanup(demo.close)
        with self.assertRaises(TierForbiddenError):
            demo.sandboxes.create("base", timeout_secs=100_000)
        a = demo.sandboxes.create("base")
        self.addCleanup(a.delete)
        b = demo.sandboxes.create("base")
        self.addCleanup(b.delete)
        with self.assertRaises(ConcurrencyLimitError) as cl:
            demo.sandboxes.create("base")
        self.assertEqual(cl.exception.status, 429)
        self.assertIsNotNone(cl.exception.retry_after)
        self.assertGreater(cl.exception.retry_after, 0)
        with self.assertRaises(ValidationError):
            a.exec("echo", code="echo")  # exactly one of command/code/commands
        # Suspending frees a slot: the third create now fits.
        b.suspend()
        with demo.sandboxes.create("base") as third:
            self.assertEqual(third.exec("echo ok").stdout, "ok\n")

    def test_rl_best_of_n_and_tree_search(self) -> None:
        fleet = rl.connect()
        self.addCleanup(fleet.close)
        root = fleet.create("base")
        try:
            self.assertEqual(root.labels[rl.RUN_LABEL], fleet.run_id)
            root.exec("echo 100 > /root/bound")
            candidates = [
                "echo 89",
                "echo 99",
                'n=$(($(cat /root/bound)-1)); while [ $n -gt 1 ]; do i=2; p=1; while [ $((i*i)) -le $n ]; do '
                'if [ $((n%i)) -eq 0 ]; then p=0; break; fi; i=$((i+1)); done; [ $p = 1 ] && { echo $n; exit 0; }; n=$((n-1)); done',
                "echo 91",
            ]

            def score(r: ExecResult) -> float:
                n = int(r.stdout.strip())
                return float(n) if is_prime(n) else float("-inf")

            out = rl.best_of_n(root, 4, lambda sb, i: sb.exec(candidates[i]), score, keep_winner=True)
            self.assertEqual(out.winner.index, 2)
            self.assertEqual(out.winner.result.stdout, "97\n")
            self.assertEqual([s.score for s in out.all], [89.0, float("-inf"), 97.0, float("-inf")])
            self.assertIsNotNone(out.sandbox)
            assert out.sandbox is not None
            self.assertEqual(out.sandbox.labels[rl.RUN_LABEL], fleet.run_id)
            # Only the root and the kept winner remain of this run.
            self.assertEqual(sorted(fleet.list_ids(labels=fleet.run_label)), sorted([root.id, out.sandbox.id]))
            out.sandbox.delete()

            # A failing step deletes every child and re-raises.
            def boom(sb: collimate.Sandbox, i: int) -> ExecResult:
                if i == 1:
                    raise RuntimeError("step failed")
                return sb.exec("true")

            with self.assertRaises(RuntimeError):
                rl.best_of_n(root, 3, boom, lambda r: 0.0)
            self.assertEqual(fleet.list_ids(labels=fleet.run_label), [root.id])

            # Tree search: each level appends a digit; the score prefers larger numbers.
            root.exec("echo -n 1 > /root/acc")
            t = rl.tree_search(
                root,
                expand=2,
                depth=2,
                beam=1,
                step=lambda sb, node: sb.exec(f"echo -n {node.path[-1] + 1} >> /root/acc; cat /root/acc"),
                score=lambda r: float(r.stdout),
            )
            self.assertEqual(t.best.result.stdout, "122")
            self.assertEqual(t.best.path, [1, 1])
            self.assertEqual([[s for _, s in lvl] for lvl in t.levels], [[11.0, 12.0], [121.0, 122.0]])
            self.assertEqual(fleet.list_ids(labels=fleet.run_label), [root.id])
        finally:
            root.delete()

        # map: concurrency cap and rate limit, one sandbox per item, all deleted.
        live, peak = [0], [0]
        import threading

        lock = threading.Lock()

        def work(sb: collimate.Sandbox, item: int) -> str:
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])
            try:
                return sb.exec(f"echo $(({item}*{item}))").stdout.strip()
            finally:
                with lock:
                    live[0] -= 1

        t0 = time.monotonic()
        squares = rl.map_sandboxes(fleet, "base", range(5), work, concurrency=2, rate_per_sec=4)
        self.assertEqual(squares, ["0", "1", "4", "9", "16"])
        self.assertLessEqual(peak[0], 2)
        self.assertGreaterEqual(time.monotonic() - t0, 1.0, "5 starts at 4/s take at least 1 s")
        self.assertEqual(fleet.list_ids(labels=fleet.run_label), [])

    def test_sweep(self) -> None:
        fleet = rl.connect()
        self.addCleanup(fleet.close)
        a = fleet.create("base")
        a.fork(2)
        a.suspend()
        other = self.client.sandboxes.create("base", labels={"suite": "not-this-run"})
        try:
            self.assertEqual(len(fleet.list_ids(labels=fleet.run_label)), 3)
            self.assertEqual(fleet.sweep(quiet_secs=0.2), 3)
            self.assertEqual(fleet.list_ids(labels=fleet.run_label), [])
            self.assertEqual(self.client.sandboxes.get(other.id).state, "running", "other sandboxes are untouched")
        finally:
            other.delete()


if __name__ == "__main__":
    unittest.main(verbosity=2)
