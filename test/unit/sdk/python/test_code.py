"""The Python SDK's code cells (and collimate_rl's seeded ones) against a server run by
test/unit/sdk/code.test.ts, whose interpreter is test/support/fakeCodeServer.ts (JavaScript in node:vm)."""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402
import collimate_rl as rl  # noqa: E402


class Enough(Exception):
    pass


def stop(_text: str) -> None:
    raise Enough()


def main() -> None:
    client = collimate.Collimate()
    with client.sandboxes.create("python") as sb:
        # As JSON: state across cells, the main value as text, printed text, an exception as a result.
        first = sb.run_code("var x = 41")
        assert isinstance(first, collimate.Execution) and first.text is None, first
        second = sb.run_code('print("out"); printErr("err"); display("shown"); x + 1', env={"K": "v"}, seed=7, timeout_secs=10)
        assert second.text == "42" and second.execution_count == first.execution_count + 1, second
        assert (second.stdout, second.stderr, second.seed, second.error, second.context) == ("out\n", "err\n", "7", None, first.context), second
        assert second.results[0] == collimate.CodeOutput(False, {"text/plain": "shown", "text/html": "<b>shown</b>"}), second.results
        assert sb.run_code("typeof env.K").text == "undefined"
        raised = sb.run_code("null.y")
        assert isinstance(raised.error, collimate.CodeError) and raised.error.name == "TypeError" and raised.text is None, raised

        # Streamed: the callbacks see the output in order, then the same result.
        seen = []
        r = sb.run_code(
            'print("a"); printErr("b"); display(1); 2',
            language="javascript",
            on_stdout=lambda t: seen.append("out:" + t),
            on_stderr=lambda t: seen.append("err:" + t),
            on_result=lambda o: seen.append("result:" + o.data["text/plain"]),
        )
        assert seen == ["out:a\n", "err:b\n", "result:1", "result:2"], seen
        assert r.text == "2" and [o.text for o in r.results] == ["1", "2"], r
        errors = []
        raised = sb.run_code('throw new RangeError("no")', on_error=errors.append)
        assert errors == [raised.error] and errors[0].value == "no", errors

        # A callback that raises closes the stream (the test checks the cell was interrupted) and propagates.
        waiter = sb.create_code_context(language="javascript")
        try:
            sb.run_code("wait()", context=waiter, on_stdout=stop)
            raise AssertionError("the callback's exception propagates")
        except Enough:
            pass
        print(f"stopped context {waiter.id}")

        # Contexts.
        ctx = sb.create_code_context(language="javascript", cwd="/tmp")
        assert (ctx.language, ctx.cwd) == ("javascript", "/tmp") and re.fullmatch(r"[0-9a-f-]{36}", ctx.id), ctx
        sb.run_code("var y = 5", context=ctx)
        assert sb.run_code("y * 2", context=ctx.id).text == "10"
        assert ctx in sb.list_code_contexts()
        assert sb.restart_code_context(ctx) == ctx
        assert sb.run_code("typeof y", context=ctx).text == "undefined"
        assert sb.interrupt_code_context(ctx.id) == ctx
        sb.remove_code_context(ctx)
        assert ctx not in sb.list_code_contexts()
        for call in (lambda: sb.run_code("1", context=ctx), lambda: sb.run_code("1", context=ctx, on_stdout=print), lambda: sb.restart_code_context(ctx)):
            try:
                call()
                raise AssertionError("a removed context")
            except collimate.NotFoundError as e:
                assert e.code == "context_not_found", e

        # Errors.
        for kw in ({}, {"on_stdout": print}):
            try:
                sb.run_code("die()", **kw)  # type: ignore[arg-type]
                raise AssertionError("a dead interpreter")
            except collimate.CodeUnavailableError as e:
                assert isinstance(e, collimate.InvalidStateError) and e.code == "code_unavailable", e
        try:
            sb.run_code("1", context=waiter, language="python")
            raise AssertionError("context with language")
        except collimate.ValidationError:
            pass

    # collimate_rl: every cell runs seeded, a seed drawn when none is given; the recorded seed replays it.
    fleet = rl.Fleet(client)
    root = fleet.create("python")
    try:
        out = rl.best_of_n(root, 3, lambda kid, i: kid.run_code("Math.random()", language="javascript"), lambda r: float(r.text))
        seeds = [s.result.seed for s in out.all]
        assert all(re.fullmatch(r"\d+", s or "") for s in seeds) and len(set(seeds)) == 3, seeds
        for s in out.all:
            assert root.run_code("Math.random()", language="javascript", seed=s.result.seed).text == s.result.text
        assert root.run_code("1", seed="5").seed == "5"
    finally:
        fleet.sweep(quiet_secs=0.01)
    print("code ok")


if __name__ == "__main__":
    main()
