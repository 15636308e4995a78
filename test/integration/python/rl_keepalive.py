"""Sequential RL calls over connect(): the driver counts the TCP connections the server saw."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "sdk", "python"))

import collimate_rl as rl  # noqa: E402

with rl.connect() as fleet:
    with fleet.create("base") as sb:
        for i in range(10):
            assert sb.exec(f"echo {i}").stdout == f"{i}\n"
        for k in sb.fork(1):
            assert k.exec("echo kid").stdout == "kid\n"
            k.delete()
    assert fleet.sweep(quiet_secs=0.1) == 0
    print(f"connections_opened {fleet.client.http.connections_opened}")
