"""Data classes for the wire shapes (the REST API's Sandbox, Snapshot, Template, ExecResult)."""
from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Mapping, Optional, Type, TypeVar

__all__ = [
    "SandboxInfo",
    "Snapshot",
    "OpenPort",
    "PortResponse",
    "Template",
    "ExecTiming",
    "ExecResult",
    "ExecChunk",
    "FileEntry",
    "WatchEvent",
    "SandboxLogEntry",
    "CodeOutput",
    "CodeError",
    "Execution",
    "CodeContext",
]

T = TypeVar("T")


def _known(cls: Type[T], data: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields of ``cls`` present in ``data``: fields the server adds later are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class OpenPort:
    """A TCP port a server listens on inside the sandbox; ``url`` is where the ports proxy serves it."""

    port: int
    protocol: str
    url: str


@dataclass(frozen=True)
class SandboxInfo:
    id: str
    template: str
    state: str
    labels: Dict[str, str]
    created_at: str
    age_secs: float
    idle_secs: float
    exec_count: int
    parent: Optional[str]
    forked_at: Optional[str]
    children: List[str]
    timeout_secs: float
    expires_at: str
    vcpus: float
    memory_mib: float
    disk_mib: float
    #: ``"none"``, ``"allow"`` or ``{"domains": [...], "cidrs": [...], "ports": [...]}``.
    egress: Any = "allow"
    #: Listening TCP ports (GET of one sandbox reads them live; lists show the last reading).
    ports: List[OpenPort] = field(default_factory=list)
    #: When the current (or, suspended, the last) session started; the tier's maximum counts from it.
    session_started_at: Optional[str] = None
    #: Seconds until ``expires_at``, when the session ends (0 once past); None unless running.
    remaining_secs: Optional[float] = None
    #: The snapshot it was started from, or last rolled back to; None if neither.
    from_snapshot: Optional[str] = None
    #: Its ports answer anyone, without a key or token (set at create; forks keep it).
    public_ports: bool = False
    #: The Host header its servers see through the ports proxy, ``${PORT}`` replaced; None: ``localhost:<port>``.
    port_host: Optional[str] = None
    #: Whether a suspend that does not say keeps its memory and processes (else only its files).
    keep_memory: bool = True
    #: While suspended: whether its memory was kept (a resume continues it) or only its files; None otherwise.
    memory_kept: Optional[bool] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SandboxInfo":
        kw = _known(cls, data)
        kw["ports"] = [OpenPort(**_known(OpenPort, p)) for p in kw.get("ports") or []]
        return cls(**kw)


@dataclass(frozen=True)
class Snapshot:
    """A kept moment of a sandbox (its memory, processes and files): start sandboxes from it
    (``client.sandboxes.from_snapshot``) or roll the sandbox it was taken of back to it (``sb.restore``)."""

    id: str
    name: Optional[str]
    labels: Dict[str, str]
    #: The sandbox it was taken of: the one sandbox that may roll back to it.
    sandbox_id: str
    template: str
    created_at: str
    #: What it occupies on the host's disk (its RAM image, device state and disk layer).
    size_bytes: int
    vcpus: float
    memory_mib: float
    disk_mib: float
    #: ``"none"``, ``"allow"``, ``{"domains": [...], "cidrs": [...], "ports": [...]}`` or ``{"deny": [...]}``.
    egress: Any = "allow"
    #: The name it is promoted under (``client.snapshots.promote``): a template id every sandbox
    #: created with starts from it; None if none.
    environment: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Snapshot":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class SandboxLogEntry:
    """One entry of a sandbox's log (``sb.logs()``)."""

    #: ISO 8601, to the millisecond.
    timestamp: str
    #: ``debug``, ``info``, ``warn`` or ``error``.
    level: str
    #: What happened, for people, e.g. ``Exec exited 0 in 12 ms: echo hi``.
    message: str
    #: The same for programs: ``event`` (lifecycle, exec, process, reaper, snapshot), ``command``, ``exit_code``, ``pid``…
    fields: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SandboxLogEntry":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Template:
    id: str
    kind: str
    description: str
    interpreter: List[str]
    ready: bool
    vcpus: float
    memory_mib: float
    #: Language runtimes the image carries, by name, with their versions, e.g. ``{"node": "24.22.3"}``.
    runtimes: Dict[str, str] = field(default_factory=dict)
    #: With kind ``snapshot``: the snapshot every sandbox made of it starts from (``client.snapshots.promote``).
    snapshot_id: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Template":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class ExecTiming:
    queued_at: str
    started_at: str
    finished_at: str
    queued_ms: float
    run_ms: float


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one exec. ``stdout``/``stderr`` are text, or base64 when ``*_encoding`` says so."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    stdout_encoding: str = "utf8"
    stderr_encoding: str = "utf8"
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    failed_index: Optional[int] = None
    signal: Optional[int] = None
    oom_killed: bool = False
    pids_limited: bool = False
    error: Optional[str] = None
    timing: Optional[ExecTiming] = None
    seed: Optional[str] = None
    type: Literal["result"] = field(default="result", init=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ExecResult":
        kw = _known(cls, data)
        kw.pop("type", None)
        if isinstance(kw.get("timing"), Mapping):
            kw["timing"] = ExecTiming(**_known(ExecTiming, kw["timing"]))
        return cls(**kw)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def stdout_bytes(self) -> bytes:
        return base64.b64decode(self.stdout) if self.stdout_encoding == "base64" else self.stdout.encode("utf-8")

    @property
    def stderr_bytes(self) -> bytes:
        return base64.b64decode(self.stderr) if self.stderr_encoding == "base64" else self.stderr.encode("utf-8")


@dataclass(frozen=True)
class CodeOutput:
    """One output of a code cell, a MIME bundle (``text/plain`` always; ``image/png``, ``text/html``…):
    the last expression's value (``is_main_result``) or a display (a shown figure, display())."""

    is_main_result: bool
    data: Dict[str, Any]

    @property
    def text(self) -> Optional[str]:
        t = self.data.get("text/plain")
        return t if isinstance(t, str) else None


@dataclass(frozen=True)
class CodeError:
    """An exception a code cell raised: its class (``name``), message (``value``) and plain-text traceback."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class Execution:
    """A code cell's outcome (``sandbox.run_code``), as the API sent it, plus ``text``. An exception in
    the cell is ``error``, not raised: the cell still ran."""

    #: The context the cell ran in.
    context: Optional[str]
    #: Displays and the main value (``is_main_result``), in the order they came.
    results: List[CodeOutput]
    stdout: str
    stderr: str
    error: Optional[CodeError]
    #: The context's cell counter (IPython's In [n]).
    execution_count: Optional[int]
    #: It ran past its timeout and was interrupted (``error`` is then the interruption).
    timed_out: bool
    duration_ms: int
    #: The seed it ran with, or None (none given).
    seed: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Execution":
        kw = _known(cls, data)
        kw["results"] = [CodeOutput(**_known(CodeOutput, r)) for r in kw["results"]]
        if isinstance(kw.get("error"), Mapping):
            kw["error"] = CodeError(**_known(CodeError, kw["error"]))
        return cls(**kw)

    @property
    def text(self) -> Optional[str]:
        """The main result's ``text/plain`` (the last expression's value as the REPL shows it); None when the cell has none."""
        main = next((r for r in self.results if r.is_main_result), None)
        return main.text if main is not None else None


@dataclass(frozen=True)
class CodeContext:
    """A kernel of the code interpreter with its own state and working directory."""

    id: str
    language: str
    cwd: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CodeContext":
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class PortResponse:
    """What the server on a sandbox port answered (through the ports proxy), whatever its status."""

    status: int
    headers: Dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        import json

        return json.loads(self.body)


@dataclass(frozen=True)
class ExecChunk:
    """A piece of streamed output: raw bytes (a chunk may split a UTF-8 sequence)."""

    type: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class FileEntry:
    """One file-system entry of a sandbox, as the guest sees it (a symlink itself, not its target)."""

    name: str
    path: str
    #: ``file``, ``dir``, ``symlink`` or ``other``.
    type: str
    size: int
    #: Permission bits, e.g. 0o644; ``permissions`` shows them as ls does (``rw-r--r--``).
    mode: int
    permissions: str
    uid: int
    gid: int
    owner: str
    group: str
    modified_at: str
    #: Modification time in ns since the epoch.
    mtime_ns: int
    symlink_target: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FileEntry":
        kw = _known(cls, data)
        kw["mtime_ns"] = int(kw["mtime_ns"])
        return cls(**kw)


@dataclass(frozen=True)
class WatchEvent:
    """An event of ``files.watch()``: ``type`` ``change`` (with ``op`` and ``name``, relative to the
    watched directory) or, last, ``end`` (with ``reason``: directory_removed, sandbox_suspended…)."""

    type: str
    op: Optional[str] = None
    name: Optional[str] = None
    reason: Optional[str] = None
