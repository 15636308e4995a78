"""Python SDK pieces that need no Collimate server: the error mapping, an answer that comes before the
body is sent, and collimate_rl.map's caps."""
import os
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "sdk", "python"))

import collimate  # noqa: E402
from collimate._http import Transport  # noqa: E402
import collimate_rl as rl  # noqa: E402


class ErrorsTest(unittest.TestCase):
    def test_mapping(self) -> None:
        e = collimate.error_from_body(429, {"error": {"code": "concurrency_limit", "message": "full", "limit": 2}}, "5")
        self.assertIsInstance(e, collimate.ConcurrencyLimitError)
        self.assertEqual((e.status, e.retry_after, e.details["limit"], str(e)), (429, 5.0, 2, "concurrency_limit: full"))
        e = collimate.error_from_body(None, {"error": {"code": "invalid_state", "message": "m", "state": "suspended"}})
        self.assertIsInstance(e, collimate.InvalidStateError)
        self.assertEqual((e.status, e.state), (409, "suspended"))
        self.assertIsInstance(collimate.error_from_body(404, {"error": {"code": "brand_new", "message": ""}}), collimate.NotFoundError)
        self.assertIsInstance(collimate.error_from_body(502, "<html>"), collimate.ServerError)
        self.assertTrue(issubclass(collimate.TimeoutError, collimate.CollimateError))



class EarlyAnswerTest(unittest.TestCase):
    def test_an_answer_before_the_body_is_read_is_raised_not_a_broken_pipe(self) -> None:
        # A server that answers 413 after the headers, reads nothing of the body, and resets the
        # connection while the client is still sending (what a server does past what it discards).
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        def serve() -> None:
            conn, _ = srv.accept()
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            body = b'{"error":{"code":"payload_too_large","message":"over the limit"}}'
            conn.sendall(b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            time.sleep(0.2)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            srv.close()

        t = threading.Thread(target=serve)
        t.start()
        transport = Transport(f"http://127.0.0.1:{srv.getsockname()[1]}", "key")
        with self.assertRaises(collimate.PayloadTooLargeError) as e:
            transport.stream("PUT", "/v1/sandboxes/sbx_000000000000/files", body=(b"\0" * (512 * 1024) for _ in range(80)))
        self.assertEqual(str(e.exception), "payload_too_large: over the limit")
        t.join(5)


class MapTest(unittest.TestCase):
    def test_cap_rate_order(self) -> None:
        starts, live, peak, lock = [], [0], [0], threading.Lock()

        def f(x: int) -> int:
            with lock:
                starts.append(time.monotonic())
                live[0] += 1
                peak[0] = max(peak[0], live[0])
            time.sleep(0.15)
            with lock:
                live[0] -= 1
            return x * 10

        self.assertEqual(rl.map(range(6), f, concurrency=2, rate_per_sec=20), [0, 10, 20, 30, 40, 50])
        self.assertEqual(peak[0], 2)
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        self.assertTrue(all(g >= 0.045 for g in gaps), gaps)

    def test_stops_after_failure(self) -> None:
        started = []

        def g(x: int) -> int:
            started.append(x)
            if x == 1:
                raise ValueError("x1")
            time.sleep(0.05)
            return x

        with self.assertRaises(ValueError):
            rl.map(range(8), g, concurrency=2)
        self.assertLessEqual(len(started), 3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
