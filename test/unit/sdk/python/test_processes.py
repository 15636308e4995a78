"""The Python SDK's background processes against a server run by test/unit/sdk/processes.test.ts."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402


def typing():
    yield b"one\n"
    time.sleep(0.05)
    yield b"two\n"


def main() -> None:
    client = collimate.Collimate()
    with client.sandboxes.create("base") as sb:
        p = sb.processes.start(argv=["cat"], stdin=True, tag="py")
        assert p.info.status == "running" and p.info.tag == "py", p.info
        assert p.send_stdin(typing()) == 8
        assert p.send_stdin("three\n") == 6
        p.close_stdin()
        done = p.wait(timeout=10)
        assert done.status == "exited" and done.exit_code == 0, done
        events = list(sb.processes.get(p.pid).output())
        out = b"".join(e.data for e in events if isinstance(e, collimate.ProcessOutput))
        assert out == b"one\ntwo\nthree\n", out
        assert isinstance(events[-1], collimate.ProcessExit)
        tail = b"".join(e.data for e in p.output(start=4) if isinstance(e, collimate.ProcessOutput))
        assert tail == b"two\nthree\n", tail
        assert [x.pid for x in sb.processes.list()] == [p.pid]

        tty = sb.processes.start(argv=["sh"], pty={"cols": 80, "rows": 24})
        tty.resize(100, 30)
        first = next(iter(tty.output()))
        assert first.type == "pty" and first.data == b"size 30 100\n", first
        tty.kill()
        assert tty.wait().signal == 9
        try:
            tty.signal("TERM")
            raise AssertionError("signal to an exited process")
        except collimate.InvalidStateError as e:
            assert e.code == "process_exited"
        try:
            sb.processes.get(999999)
            raise AssertionError("unknown pid")
        except collimate.NotFoundError as e:
            assert e.code == "process_not_found"
        sleeper = sb.processes.start("sleep 100")
        assert sleeper.wait(timeout=0.1).status == "running"
    print("processes ok")


if __name__ == "__main__":
    main()
