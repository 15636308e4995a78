"""Background processes of a sandbox (``sb.processes``): started once, they run beside execs and
outlive the call that started them. A start waits its turn behind the sandbox's queued execs (like
an exec) and returns as soon as the process runs; the handle's other calls never wait behind one."""
from __future__ import annotations

import base64
import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from .types import _known

if TYPE_CHECKING:
    from .client import Collimate

__all__ = ["ProcessInfo", "ProcessOutput", "ProcessGap", "ProcessExit", "Process", "SandboxProcesses"]

#: One long poll of wait(); the server caps it at 300 s.
_WAIT_POLL_SECS = 60.0
#: Output streams run as long as the process: a day unless given.
_OUTPUT_TIMEOUT_SECS = 24 * 3600.0


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    argv: List[str]
    cwd: str
    tag: Optional[str]
    pty: bool
    stdin_open: bool
    #: ``running``, ``exited``, or ``lost`` (it was running when the server last knew and is no longer listed).
    status: str
    started_at: str
    finished_at: Optional[str]
    exit_code: Optional[int]
    signal: Optional[int]
    stdout_bytes: int
    stderr_bytes: int
    #: Everything it wrote, all streams: the offset its next output starts at.
    output_bytes: int
    #: The output the server holds, ``{"from": a, "to": b}``.
    buffered: Dict[str, int]
    pids_limited: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ProcessInfo":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class ProcessOutput:
    #: ``stdout``, ``stderr`` or ``pty``.
    type: str
    data: bytes
    #: Where ``data`` starts in everything the process wrote.
    offset: int


@dataclass(frozen=True)
class ProcessGap:
    """Output [from_offset, to_offset) is gone (written while the server was away, or older than it keeps)."""

    from_offset: int
    to_offset: int
    type: str = "gap"


@dataclass(frozen=True)
class ProcessExit:
    process: ProcessInfo
    type: str = "exit"


class SandboxProcesses:
    def __init__(self, client: "Collimate", sandbox_id: str) -> None:
        self._client = client
        self._id = sandbox_id

    def _path(self, suffix: str = "") -> str:
        from .client import _q

        return f"/v1/sandboxes/{_q(self._id)}/processes{suffix}"

    def start(
        self,
        command: Optional[str] = None,
        *,
        argv: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: bool = False,
        pty: Optional[Mapping[str, int]] = None,
        tag: Optional[str] = None,
        seed: Optional[str] = None,
        user: Optional[str] = None,
    ) -> "Process":
        """Starts ``command`` (a /bin/sh -c string) or ``argv``. ``stdin=True`` keeps its stdin open
        for send_stdin(); ``pty={"cols": 80, "rows": 24}`` runs it on a terminal (one ``pty`` output
        stream; input is typed into it). Never retried."""
        body: Dict[str, Any] = {}
        if command is not None:
            body["command"] = command
        if argv is not None:
            body["argv"] = list(argv)
        if env:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        if stdin:
            body["stdin"] = True
        if pty is not None:
            body["pty"] = dict(pty)
        if tag is not None:
            body["tag"] = tag
        if seed is not None:
            body["seed"] = seed
        if user is not None:
            body["user"] = user
        info = ProcessInfo.from_json(self._client.http.json("POST", self._path(), json_body=body))
        return Process(self._client, self._id, info)

    def list(self) -> List[ProcessInfo]:
        """Running processes and the last ones that exited, in start order."""
        r = self._client.http.json("GET", self._path(), retry="safe")
        return [ProcessInfo.from_json(p) for p in r["processes"]]

    def get(self, pid: int) -> "Process":
        """A handle on process ``pid`` (NotFoundError, code ``process_not_found``, if none)."""
        info = ProcessInfo.from_json(self._client.http.json("GET", self._path(f"/{int(pid)}"), retry="safe"))
        return Process(self._client, self._id, info)


class Process:
    """A handle on one background process; calls that return it refresh ``info``."""

    def __init__(self, client: "Collimate", sandbox_id: str, info: ProcessInfo) -> None:
        self._client = client
        self.sandbox_id = sandbox_id
        self.info = info

    def __repr__(self) -> str:
        return f"Process(pid={self.pid}, status={self.info.status!r})"

    @property
    def pid(self) -> int:
        return self.info.pid

    def _path(self, suffix: str = "") -> str:
        from .client import _q

        return f"/v1/sandboxes/{_q(self.sandbox_id)}/processes/{self.info.pid}{suffix}"

    def _set(self, data: Mapping[str, Any]) -> "Process":
        self.info = ProcessInfo.from_json(data)
        return self

    def refresh(self) -> "Process":
        return self._set(self._client.http.json("GET", self._path(), retry="safe"))

    def output(self, *, start: Union[str, int] = "start", timeout: Optional[float] = None) -> Iterator[Union[ProcessOutput, ProcessGap, ProcessExit]]:
        """Its output as it comes: ``ProcessOutput`` chunks, ``ProcessGap`` for output the server no
        longer has, then ``ProcessExit``. ``start``: ``"start"`` (what the server holds, then live),
        ``"now"``, or an offset (to reattach). Stopping early detaches; the process runs on."""
        from .errors import error_from_body

        events = self._client.http.sse("GET", self._path("/output"), query={"from": str(start)}, timeout=_OUTPUT_TIMEOUT_SECS if timeout is None else timeout)
        with contextlib.closing(events):
            for ev in events:
                payload = json.loads(ev.data)
                if ev.event in ("stdout", "stderr", "pty"):
                    yield ProcessOutput(ev.event, base64.b64decode(payload["data"]), payload["offset"])
                elif ev.event == "gap":
                    yield ProcessGap(payload["from"], payload["to"])
                elif ev.event == "exit":
                    self.info = ProcessInfo.from_json(payload["process"])
                    yield ProcessExit(self.info)
                    return
                elif ev.event == "error":
                    raise error_from_body(None, payload)

    def send_stdin(self, data: Union[str, bytes, Iterable[bytes]], *, timeout: Optional[float] = None) -> int:
        """Sends bytes to its stdin (a str as UTF-8; an iterable of bytes is streamed, chunked, as it
        produces). Returns once the guest wrote it all: a process that does not read holds the call."""
        if isinstance(data, str):
            r = self._client.http.json("POST", self._path("/stdin"), raw=data.encode("utf-8"), timeout=timeout)
        elif isinstance(data, (bytes, bytearray, memoryview)):
            r = self._client.http.json("POST", self._path("/stdin"), raw=bytes(data), timeout=timeout)
        else:
            r = self._client.http.json("POST", self._path("/stdin"), stream=(bytes(c) for c in data), timeout=timeout)
        return int(r["written"])

    def close_stdin(self) -> "Process":
        """Ends its input (on a terminal: types the EOF character, ^D)."""
        return self._set(self._client.http.json("POST", self._path("/close-stdin")))

    def signal(self, signal: Union[str, int]) -> "Process":
        """Sends a signal (``"SIGTERM"``, ``"INT"``, 9…) to its process group."""
        return self._set(self._client.http.json("POST", self._path("/signal"), json_body={"signal": signal}))

    def kill(self) -> "Process":
        return self.signal("SIGKILL")

    def resize(self, cols: int, rows: int) -> "Process":
        """Resizes its terminal (a process started with ``pty``)."""
        return self._set(self._client.http.json("POST", self._path("/resize"), json_body={"cols": cols, "rows": rows}, retry="safe"))

    def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits until it exits (long polls), at most ``timeout`` seconds (None: for ever); returns it
        as it is then (``status == "running"`` if the time ran out)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _WAIT_POLL_SECS if deadline is None else max(0.0, min(_WAIT_POLL_SECS, deadline - time.monotonic()))
            self._set(self._client.http.json("POST", self._path("/wait"), json_body={"timeout": left}, retry="safe", timeout=left + 30))
            if self.info.status != "running" or (deadline is not None and time.monotonic() >= deadline):
                return self.info


