"""Python SDK quickstart (standard library only). Install the `collimate` wheel (sdk/python:
`pip wheel --no-build-isolation --no-deps sdk/python`, then `pip install collimate-0.1.0-py3-none-any.whl`)
and run it against a server with a key:

    COLLIMATE_API_KEY=clm_... python3 quickstart.py

In this repository without installing: PYTHONPATH=sdk/python python3 docs/examples/quickstart.py
"""
import sys

from collimate import Collimate, InvalidStateError

client = Collimate()  # COLLIMATE_API_KEY, COLLIMATE_BASE_URL (default http://127.0.0.1:7070)
print("images:", ", ".join(i.id for i in client.images()))

# The with-block deletes the sandbox on exit, also on error.
with client.sandboxes.create("base", labels={"example": "quickstart"}) as sb:
    r = sb.exec('echo "hello from $(uname -s)"')
    print(r.stdout.strip(), f"(exit {r.exit_code})")

    # Stream output as it is produced.
    sb.exec("for i in 1 2 3; do echo tick $i; sleep 0.2; done", on_stdout=lambda b: sys.stdout.write(b.decode()))

    # Or iterate: chunks, then the result.
    for event in sb.exec_stream("echo out; echo err >&2"):
        print(event.type, getattr(event, "data", b"").decode().strip() or event)

    # Files persist between execs; a live fork copies them (and every running process).
    sb.files.write("/root/notes.txt", "remember me")
    (child,) = sb.fork(1)
    print("child reads:", child.files.read("/root/notes.txt").decode())
    child.delete()

    # Suspend frees a concurrency slot; exec needs the sandbox running again.
    sb.suspend()
    try:
        sb.exec("true")
    except InvalidStateError as e:
        print("while suspended:", e.code)
    sb.resume()
    print("after resume:", sb.exec("cat /root/notes.txt").stdout)
