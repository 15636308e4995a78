"""The Collimate client: ``Collimate(api_key=None, base_url=None)``, then ``client.sandboxes.create(...)``.

Defaults come from ``COLLIMATE_API_KEY`` and ``COLLIMATE_BASE_URL`` (http://127.0.0.1:7070).
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import json
import os
import uuid
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ._http import Transport
from .errors import CollimateError, ConnectionError, NotFoundError, error_from_body
from .types import CodeContext, CodeError, CodeOutput, ExecChunk, ExecResult, Execution, FileEntry, OpenPort, PortResponse, SandboxInfo, SandboxLogEntry, Snapshot, Template, WatchEvent
from .processes import SandboxProcesses

__all__ = ["Collimate", "Sandboxes", "SandboxPages", "Snapshots", "SnapshotPages", "Sandbox", "SandboxFiles", "DEFAULT_BASE_URL"]

DEFAULT_BASE_URL = "http://127.0.0.1:7070"
#: Client-side slack over an exec's own timeout before the SDK gives up waiting.
EXEC_TIMEOUT_SLACK_SECS = 30.0
DEFAULT_EXEC_TIMEOUT_SECS = 60.0
DEFAULT_CODE_TIMEOUT_SECS = 300.0
#: Slack for code calls over their own time: where the template baked no interpreter the server first
#: installs and starts it (an exec of up to 330 s), and a new kernel may take up to 240 s.
CODE_SLACK_SECS = 600.0
#: Create, fork, resume, snapshots and rollbacks save or restore whole VMs: give them longer than a plain request.
LIFECYCLE_TIMEOUT_SECS = 300.0

#: A code context, by id or as the API returned it.
ContextArg = Union[str, CodeContext]
FilesArg = Union[Mapping[str, Union[str, bytes]], Sequence[Mapping[str, Any]], None]
#: A snapshot, by id or as the API returned it.
SnapshotArg = Union[str, Snapshot]


class Collimate:
    """A client for one server and API key. Thread-safe; close() (or ``with``) frees its connections."""

    def __init__(
        self,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        max_retries: int = 3,
        timeout: float = 60.0,
    ) -> None:
        self.http = Transport(
            base_url or os.environ.get("COLLIMATE_BASE_URL") or DEFAULT_BASE_URL,
            api_key if api_key is not None else os.environ.get("COLLIMATE_API_KEY"),
            max_retries=max_retries,
            timeout=timeout,
        )
        self.sandboxes = Sandboxes(self)
        self.snapshots = Snapshots(self)

    @property
    def base_url(self) -> str:
        return self.http.base_url

    def images(self) -> List[Template]:
        """Catalog images: ready to run on every tier, no build step."""
        return [Template.from_json(t) for t in self.http.json("GET", "/v1/images", retry="safe")["images"]]

    def templates(self) -> List[Template]:
        """Every template you can create from (catalog images and, on Pro, your environments)."""
        return [Template.from_json(t) for t in self.http.json("GET", "/v1/templates", retry="safe")["templates"]]

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Collimate":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _port_access(body: Dict[str, Any], public_ports: Optional[bool], port_host: Optional[str]) -> None:
    """A create's ``public_ports`` (its ports answer anyone through the ports proxy, no key or token)
    and ``port_host`` (the Host header its servers see, ``${PORT}`` replaced), when given."""
    if public_ports is not None:
        body["public_ports"] = public_ports
    if port_host is not None:
        body["port_host"] = port_host


class Sandboxes:
    def __init__(self, client: Collimate) -> None:
        self._client = client

    def _wrap(self, info: Mapping[str, Any]) -> "Sandbox":
        return Sandbox(self._client, SandboxInfo.from_json(info))

    def create(
        self,
        template: str,
        *,
        labels: Optional[Mapping[str, str]] = None,
        timeout_secs: Optional[int] = None,
        egress: Any = None,
        public_ports: Optional[bool] = None,
        port_host: Optional[str] = None,
        keep_memory: Optional[bool] = None,
    ) -> "Sandbox":
        """A running sandbox from ``template`` (e.g. ``"base"``; see ``client.images()``).

        ``egress`` narrows the template's egress policy: ``"none"``, ``"allow"`` or
        ``{"domains": [...], "cidrs": [...], "ports": [...]}`` (wider: EgressForbiddenError).
        ``timeout_secs`` is the session length each start (create, resume) gives; ``set_timeout()``
        moves the end of a running session.
        ``public_ports=True`` lets anyone reach its ports through the ports proxy without a key or
        token (nothing else of it opens; forks keep it); ``port_host`` is the Host header its servers
        see there, ``${PORT}`` replaced (e.g. ``"localhost:${PORT}"``; not a host: ValidationError).
        ``keep_memory=False``: a suspend that does not say keeps only its files, and the resume
        boots it afresh (default: memory and processes kept).
        Counts against the tier's concurrency cap (ConcurrencyLimitError with ``retry_after`` when
        full). Safe to retry: one Idempotency-Key goes with every attempt.
        """
        body: Dict[str, Any] = {"template": template}
        if labels:
            body["labels"] = dict(labels)
        if timeout_secs is not None:
            body["timeout_secs"] = timeout_secs
        if egress is not None:
            body["egress"] = egress
        if keep_memory is not None:
            body["keep_memory"] = keep_memory
        _port_access(body, public_ports, port_host)
        info = self._client.http.json(
            "POST",
            "/v1/sandboxes",
            json_body=body,
            headers={"idempotency-key": str(uuid.uuid4())},
            retry="idempotent",
            timeout=LIFECYCLE_TIMEOUT_SECS,
        )
        return self._wrap(info)

    def from_snapshot(
        self,
        snapshot: SnapshotArg,
        *,
        labels: Optional[Mapping[str, str]] = None,
        timeout_secs: Optional[int] = None,
        egress: Any = None,
        on_timeout: Optional[str] = None,
        auto_resume: Optional[bool] = None,
        public_ports: Optional[bool] = None,
        port_host: Optional[str] = None,
    ) -> "Sandbox":
        """A running sandbox started from ``snapshot`` (``sb.snapshot()``): its memory, processes and
        files, with a fresh identity, as a fork child has; its template, shape and egress policy are
        the snapshot's (``egress`` may narrow it).

        ``timeout_secs`` defaults to the tier's default session, else that of the sandbox the
        snapshot was taken of; ``on_timeout`` is ``"delete"`` or ``"suspend"``. NotFoundError
        (``snapshot_not_found``) for unknown ids and other tenants'. Counts against the tier's cap;
        safe to retry, as create is.
        """
        return self._wrap(self._start_from_snapshot(snapshot, None, labels, timeout_secs, egress, on_timeout, auto_resume, public_ports, port_host))

    def many_from_snapshot(
        self,
        snapshot: SnapshotArg,
        count: int,
        *,
        labels: Optional[Mapping[str, str]] = None,
        timeout_secs: Optional[int] = None,
        egress: Any = None,
        on_timeout: Optional[str] = None,
        auto_resume: Optional[bool] = None,
        public_ports: Optional[bool] = None,
        port_host: Optional[str] = None,
    ) -> List["Sandbox"]:
        """``count`` (1..64) running sandboxes started from one snapshot in one request, each as
        ``from_snapshot`` starts one. Each counts against the tier's cap. Safe to retry."""
        first = self._start_from_snapshot(snapshot, count, labels, timeout_secs, egress, on_timeout, auto_resume, public_ports, port_host)
        # With ``count`` the answer is the first sandbox and, in ``sandboxes``, all of them (it first).
        return [self._wrap(s) for s in first["sandboxes"]]

    def _start_from_snapshot(
        self,
        snapshot: SnapshotArg,
        count: Optional[int],
        labels: Optional[Mapping[str, str]],
        timeout_secs: Optional[int],
        egress: Any,
        on_timeout: Optional[str],
        auto_resume: Optional[bool],
        public_ports: Optional[bool] = None,
        port_host: Optional[str] = None,
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {"snapshot": _snapshot_id(snapshot)}
        if count is not None:
            body["count"] = count
        if labels:
            body["labels"] = dict(labels)
        if timeout_secs is not None:
            body["timeout_secs"] = timeout_secs
        if egress is not None:
            body["egress"] = egress
        if on_timeout is not None:
            body["on_timeout"] = on_timeout
        if auto_resume is not None:
            body["auto_resume"] = auto_resume
        _port_access(body, public_ports, port_host)
        return self._client.http.json(
            "POST",
            "/v1/sandboxes",
            json_body=body,
            headers={"idempotency-key": str(uuid.uuid4())},
            retry="idempotent",
            timeout=LIFECYCLE_TIMEOUT_SECS,
        )

    def get(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox (NotFoundError for unknown ids and other tenants')."""
        return self._wrap(self._client.http.json("GET", f"/v1/sandboxes/{_q(sandbox_id)}", retry="safe"))

    def list(
        self,
        *,
        state: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        limit: Optional[int] = None,
    ) -> "SandboxPages":
        """Your sandboxes; iterate for pages (lists of Sandbox), or call ``.all()``."""
        return SandboxPages(self, state, labels, limit)


class SandboxPages:
    def __init__(self, sandboxes: Sandboxes, state: Optional[str], labels: Optional[Mapping[str, str]], limit: Optional[int]) -> None:
        self._sandboxes = sandboxes
        self._state = state
        self._labels = dict(labels or {})
        self._limit = limit

    def __iter__(self) -> Iterator[List["Sandbox"]]:
        query = {"state": self._state, "label": _label_filter(self._labels), "limit": self._limit}
        for page in _list_pages(self._sandboxes._client.http, "/v1/sandboxes", "sandboxes", query):
            yield [self._sandboxes._wrap(s) for s in page]

    def all(self) -> List["Sandbox"]:
        return [sb for page in self for sb in page]


class Snapshots:
    """The tenant's snapshots (take one with ``sb.snapshot()``)."""

    def __init__(self, client: Collimate) -> None:
        self._client = client

    def get(self, snapshot_id: str) -> Snapshot:
        """NotFoundError (``snapshot_not_found``) for unknown ids and other tenants'."""
        return Snapshot.from_json(self._client.http.json("GET", f"/v1/snapshots/{_q(snapshot_id)}", retry="safe"))

    def list(
        self,
        *,
        sandbox_id: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        limit: Optional[int] = None,
    ) -> "SnapshotPages":
        """Your snapshots by id, optionally only those of one sandbox and with every label given;
        iterate for pages (lists of Snapshot), or call ``.all()``."""
        return SnapshotPages(self._client, sandbox_id, labels, limit)

    def delete(self, snapshot: SnapshotArg) -> None:
        """Deletes a snapshot: nothing starts from it or rolls back to it any more. Sandboxes started
        from it run on. Not retried: a repeat would raise NotFoundError."""
        self._client.http.request("DELETE", f"/v1/snapshots/{_q(_snapshot_id(snapshot))}")

    def promote(self, snapshot: SnapshotArg, environment: Optional[str]) -> Snapshot:
        """Promotes a snapshot to an environment (Pro): ``environment`` becomes a template id, and
        every sandbox created with it (``client.sandboxes.create(template=environment)``) starts from
        the snapshot. None takes the name away. ConflictError when the name is taken."""
        path = f"/v1/snapshots/{_q(_snapshot_id(snapshot))}/promote"
        return Snapshot.from_json(self._client.http.json("POST", path, json_body={"environment": environment}, retry="safe"))


class SnapshotPages:
    def __init__(self, client: Collimate, sandbox_id: Optional[str], labels: Optional[Mapping[str, str]], limit: Optional[int]) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self._labels = dict(labels or {})
        self._limit = limit

    def __iter__(self) -> Iterator[List[Snapshot]]:
        query = {"sandbox_id": self._sandbox_id, "label": _label_filter(self._labels), "limit": self._limit}
        for page in _list_pages(self._client.http, "/v1/snapshots", "snapshots", query):
            yield [Snapshot.from_json(s) for s in page]

    def all(self) -> List[Snapshot]:
        return [s for page in self for s in page]


def _list_pages(http: Transport, path: str, key: str, query: Mapping[str, Any]) -> Iterator[List[Mapping[str, Any]]]:
    """The pages of a list operation: ``{key: items, "next"}`` answers, followed by ``?after=next``
    until ``next`` is null."""
    after: Optional[str] = None
    while True:
        page = http.json("GET", path, query={**query, "after": after}, retry="safe")
        yield page[key]
        if not page.get("next") or not page[key]:
            return
        after = page["next"]


def _label_filter(labels: Mapping[str, str]) -> List[str]:
    return [f"{k}={v}" for k, v in labels.items()]


def _snapshot_id(snapshot: SnapshotArg) -> str:
    return snapshot.id if isinstance(snapshot, Snapshot) else snapshot


def _context_id(context: ContextArg) -> str:
    return context.id if isinstance(context, CodeContext) else context


def _q(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def _files_body(files: FilesArg) -> Optional[List[Dict[str, Any]]]:
    if files is None:
        return None
    if isinstance(files, Mapping):
        out = []
        for path, content in files.items():
            if isinstance(content, (bytes, bytearray)):
                out.append({"path": path, "content": base64.b64encode(bytes(content)).decode("ascii"), "encoding": "base64"})
            else:
                out.append({"path": path, "content": content})
        return out
    return [dict(f) for f in files]


class Sandbox:
    """A handle on one sandbox (a microVM). State-changing calls refresh ``info``."""

    def __init__(self, client: Collimate, info: SandboxInfo) -> None:
        self._client = client
        self.info = info
        self.files = SandboxFiles(client, info.id)
        #: Background processes: start one, list them, follow their output, send input, signal.
        self.processes = SandboxProcesses(client, info.id)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, state={self.state!r}, template={self.template!r})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def labels(self) -> Dict[str, str]:
        return self.info.labels

    @property
    def template(self) -> str:
        return self.info.template

    @property
    def parent(self) -> Optional[str]:
        return self.info.parent

    @property
    def from_snapshot(self) -> Optional[str]:
        """The snapshot this sandbox was started from, or last rolled back to (None if neither)."""
        return self.info.from_snapshot

    @property
    def egress(self) -> Any:
        """What the sandbox may reach: its template's egress policy, or the narrower one given at create."""
        return self.info.egress

    @property
    def public_ports(self) -> bool:
        """Whether its ports answer anyone, without a key or token (set at create)."""
        return self.info.public_ports

    @property
    def port_host(self) -> Optional[str]:
        """The Host header template its servers see through the ports proxy; None: ``localhost:<port>``."""
        return self.info.port_host

    def ports(self) -> List[OpenPort]:
        """The TCP ports servers listen on inside the sandbox now (re-reads it), each with the absolute
        ``url`` of the ports proxy (which needs the key; see port_url() for one that does not)."""
        self.refresh()
        return [dataclasses.replace(p, url=self._client.http.absolute(p.url)) for p in self.info.ports]

    def port_url(self, port: int, *, expires_in_secs: Optional[int] = None) -> str:
        """A signed, absolute URL of ``port`` that needs no key: anyone holding it reaches the port
        (HTTP and WebSocket) until it expires (default 1 h, at most 7 days) or the sandbox is deleted."""
        body: Dict[str, Any] = {"port": port}
        if expires_in_secs is not None:
            body["expires_in_secs"] = expires_in_secs
        r = self._client.http.json("POST", self._path("/port-urls"), json_body=body, retry="safe")
        return self._client.http.absolute(r["url"])

    def request(
        self,
        port: int,
        path: str = "/",
        *,
        method: str = "GET",
        body: Union[str, bytes, None] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> PortResponse:
        """An HTTP request to the server on ``port`` inside this running sandbox, through the ports
        proxy. Returns that server's answer whatever its status; errors of the proxy itself raise
        (PortUnreachableError when nothing listens, InvalidStateError when not running). Never retried."""
        raw = body.encode("utf-8") if isinstance(body, str) else body
        rest = path if path.startswith("/") else "/" + path
        r = self._client.http.proxy(method, self._path(f"/ports/{int(port)}{rest}"), body=raw, headers=headers, timeout=timeout)
        return PortResponse(r.status, r.headers, r.body)

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{_q(self.id)}{suffix}"

    def _wrap(self, info: Mapping[str, Any]) -> "Sandbox":
        return type(self)(self._client, SandboxInfo.from_json(info))

    def refresh(self) -> "Sandbox":
        self.info = SandboxInfo.from_json(self._client.http.json("GET", self._path(), retry="safe"))
        return self

    @staticmethod
    def _exec_body(
        command: Optional[str],
        code: Optional[str],
        commands: Optional[Sequence[Sequence[str]]],
        files: FilesArg,
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        stdin: Optional[str],
        timeout: Optional[float],
        seed: Optional[str],
        user: Optional[str] = None,
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {}
        if command is not None:
            body["command"] = command
        if code is not None:
            body["code"] = code
        if commands is not None:
            body["commands"] = [list(c) for c in commands]
        fb = _files_body(files)
        if fb is not None:
            body["files"] = fb
        if env is not None:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        if stdin is not None:
            body["stdin"] = stdin
        if timeout is not None:
            body["timeout"] = timeout
        if seed is not None:
            body["seed"] = str(seed)
        if user is not None:
            body["user"] = user
        return body

    def exec(
        self,
        command: Optional[str] = None,
        *,
        code: Optional[str] = None,
        commands: Optional[Sequence[Sequence[str]]] = None,
        files: FilesArg = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        timeout: Optional[float] = None,
        seed: Optional[str] = None,
        user: Optional[str] = None,
        on_stdout: Optional[Callable[[bytes], None]] = None,
        on_stderr: Optional[Callable[[bytes], None]] = None,
    ) -> ExecResult:
        """Runs exactly one of ``command`` (a /bin/sh -c string), ``code`` (the template's
        interpreter) or ``commands`` (argv lists in order, stopping at the first failure).

        The sandbox must be running (InvalidStateError otherwise). With ``on_stdout``/``on_stderr``
        output is streamed to them as produced. ``files`` is ``{path: str | bytes}`` or a list of
        ``{"path", "content", "encoding"?, "mode"?}``. ``user``: an account of the image the
        commands run as (its uid, HOME and home as the default cwd; ``files`` are written as it).
        Never retried.
        """
        if on_stdout is not None or on_stderr is not None:
            for ev in self.exec_stream(command, code=code, commands=commands, files=files, env=env, cwd=cwd, stdin=stdin, timeout=timeout, seed=seed, user=user):
                if isinstance(ev, ExecResult):
                    return ev
                cb = on_stdout if ev.type == "stdout" else on_stderr
                if cb is not None:
                    cb(ev.data)
            raise AssertionError("unreachable: exec_stream ends with its result")
        body = self._exec_body(command, code, commands, files, env, cwd, stdin, timeout, seed, user)
        data = self._client.http.json("POST", self._path("/exec"), json_body=body, timeout=_exec_timeout(timeout))
        return ExecResult.from_json(data)

    def exec_stream(
        self,
        command: Optional[str] = None,
        *,
        code: Optional[str] = None,
        commands: Optional[Sequence[Sequence[str]]] = None,
        files: FilesArg = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        timeout: Optional[float] = None,
        seed: Optional[str] = None,
        user: Optional[str] = None,
    ) -> Iterator[Union[ExecChunk, ExecResult]]:
        """Like exec(), as a generator: ``ExecChunk(type, data)`` items as output is produced, then
        the ``ExecResult`` (its ``type`` is ``"result"``). Stopping early stops receiving; the
        command itself runs to completion in the sandbox."""
        body = self._exec_body(command, code, commands, files, env, cwd, stdin, timeout, seed, user)
        outcome: Union[ExecResult, CollimateError, None] = None
        with contextlib.closing(self._client.http.sse("POST", self._path("/exec"), json_body=body, timeout=_exec_timeout(timeout))) as events:
            for ev in events:
                payload = json.loads(ev.data)
                if ev.event in ("stdout", "stderr"):
                    yield ExecChunk(ev.event, base64.b64decode(payload["data"]))  # type: ignore[arg-type]
                elif ev.event == "result":
                    outcome = ExecResult.from_json(payload)
                elif ev.event == "error":
                    from .errors import error_from_body

                    outcome = error_from_body(None, payload)
            # The server ends the stream right after the result: reading to the end lets the
            # connection be reused.
        if isinstance(outcome, ExecResult):
            yield outcome
            return
        if isinstance(outcome, CollimateError):
            raise outcome
        from .errors import ConnectionError

        raise ConnectionError("The exec stream ended without a result.", code="stream_ended", status=0)

    def run_code(
        self,
        code: str,
        *,
        language: Optional[str] = None,
        context: Optional[ContextArg] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_secs: Optional[float] = None,
        seed: Union[str, int, None] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        on_result: Optional[Callable[[CodeOutput], None]] = None,
        on_error: Optional[Callable[[CodeError], None]] = None,
    ) -> Execution:
        """Runs a cell of ``code`` in a kernel that keeps its state between cells (variables,
        imports, loaded data): ``language``'s default context (``"python"`` or ``"javascript"``;
        absent, python where the image has it), or ``context`` (``create_code_context``).

        The python and node templates have their kernel warm; another image gets one started by its
        first cell (CodeUnavailableError where it cannot: no python3). An exception in the cell is
        the result's ``error``, not raised. ``env`` is for this cell only; ``timeout_secs`` (default
        300, at most 3600) interrupts it (``timed_out``); ``seed`` (a u64) reseeds the language's own
        generators before it, so the same seed in the same kernel state replays it. With any
        ``on_*`` callback the cell streams and they see its output as it comes; a callback that
        raises closes the stream, which interrupts the cell, and the exception propagates. The
        sandbox must be running. Never retried.
        """
        body: Dict[str, Any] = {"code": code}
        if language is not None:
            body["language"] = language
        if context is not None:
            body["context"] = _context_id(context)
        if env is not None:
            body["env"] = dict(env)
        if timeout_secs is not None:
            body["timeout_secs"] = timeout_secs
        if seed is not None:
            body["seed"] = str(seed)
        path = self._path("/code")
        timeout = (DEFAULT_CODE_TIMEOUT_SECS if timeout_secs is None else timeout_secs) + CODE_SLACK_SECS
        if on_stdout is None and on_stderr is None and on_result is None and on_error is None:
            return Execution.from_json(self._client.http.json("POST", path, json_body=body, timeout=timeout))
        outcome: Union[Execution, CollimateError, None] = None
        with contextlib.closing(self._client.http.sse("POST", path, json_body=body, timeout=timeout)) as events:
            for ev in events:
                payload = json.loads(ev.data)
                if ev.event == "stdout" and on_stdout is not None:
                    on_stdout(payload["text"])
                elif ev.event == "stderr" and on_stderr is not None:
                    on_stderr(payload["text"])
                elif ev.event == "display" and on_result is not None:
                    on_result(CodeOutput(**payload))
                elif ev.event == "exception" and on_error is not None:
                    on_error(CodeError(**payload))
                elif ev.event == "result":
                    outcome = Execution.from_json(payload)
                elif ev.event == "error":
                    outcome = error_from_body(None, payload)
            # Read to the end, as exec_stream does, so that the connection can be reused.
        if isinstance(outcome, Execution):
            return outcome
        if isinstance(outcome, CollimateError):
            raise outcome
        raise ConnectionError("The code stream ended without a result.", code="stream_ended", status=0)

    def list_code_contexts(self) -> List[CodeContext]:
        """The code interpreter's contexts: the default ones (one per language, made by a first cell
        in it) and those created."""
        r = self._client.http.json("GET", self._path("/code/contexts"), retry="safe", timeout=CODE_SLACK_SECS)
        return [CodeContext.from_json(c) for c in r["contexts"]]

    def create_code_context(self, *, language: Optional[str] = None, cwd: Optional[str] = None) -> CodeContext:
        """Starts a context: a kernel of its own (``language``, default python where the image has
        it) with its own state and working directory ``cwd`` (must exist; default the home). Never retried."""
        body: Dict[str, Any] = {}
        if language is not None:
            body["language"] = language
        if cwd is not None:
            body["cwd"] = cwd
        return CodeContext.from_json(self._client.http.json("POST", self._path("/code/contexts"), json_body=body, timeout=CODE_SLACK_SECS))

    def restart_code_context(self, context: ContextArg) -> CodeContext:
        """Gives the context a fresh kernel: its variables are gone; same id and working directory.
        NotFoundError (``context_not_found``) if there is none."""
        path = self._path(f"/code/contexts/{_q(_context_id(context))}/restart")
        return CodeContext.from_json(self._client.http.json("POST", path, timeout=CODE_SLACK_SECS))

    def interrupt_code_context(self, context: ContextArg) -> CodeContext:
        """Interrupts the cell the context is running (Python raises KeyboardInterrupt in it); nothing when it is idle."""
        path = self._path(f"/code/contexts/{_q(_context_id(context))}/interrupt")
        return CodeContext.from_json(self._client.http.json("POST", path, timeout=CODE_SLACK_SECS))

    def remove_code_context(self, context: ContextArg) -> None:
        """Stops the context's kernel and forgets it."""
        self._client.http.request("DELETE", self._path(f"/code/contexts/{_q(_context_id(context))}"), timeout=CODE_SLACK_SECS)

    def logs(
        self,
        *,
        cursor: Union[int, datetime.datetime, None] = None,
        direction: Optional[str] = None,
        level: Optional[str] = None,
        search: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[SandboxLogEntry]:
        """What happened to the sandbox, as the server wrote it down: lifecycle changes, every exec
        (its command on one line, exit code, duration), background processes' starts and exits, the
        reaper, snapshots and failures of the guest — its last 1000 entries, never stdin, env values
        or files.

        Oldest first from ``cursor`` (ms since the epoch, or a timezone-aware datetime; inclusive),
        or newest first back from it with ``direction="backward"``; ``level`` is the least severe
        returned (``debug``, ``info``, ``warn``, ``error``), ``search`` a case-sensitive substring
        of the message, ``limit`` 1..1000. To read on, pass the last entry's time + 1 ms (− 1
        backward). A bad value raises ValidationError."""
        if isinstance(cursor, datetime.datetime):
            cursor = int(cursor.timestamp() * 1000)
        query = {"cursor": cursor, "direction": direction, "level": level, "search": search, "limit": limit}
        r = self._client.http.json("GET", self._path("/logs"), query=query, retry="safe")
        return [SandboxLogEntry.from_json(e) for e in r["logs"]]

    def fork(self, n: int = 1, *, labels: Optional[Mapping[str, str]] = None) -> List["Sandbox"]:
        """Forks this sandbox into ``n`` running children that keep its memory and processes. A
        running parent keeps running (live fork); a suspended one stays suspended. Each child
        counts against the cap. Safe to retry."""
        body: Dict[str, Any] = {"count": n}
        if labels:
            body["labels"] = dict(labels)
        r = self._client.http.json(
            "POST",
            self._path("/fork"),
            json_body=body,
            headers={"idempotency-key": str(uuid.uuid4())},
            retry="idempotent",
            timeout=LIFECYCLE_TIMEOUT_SECS,
        )
        return [self._wrap(s) for s in r["sandboxes"]]

    def snapshot(self, *, name: Optional[str] = None, labels: Optional[Mapping[str, str]] = None) -> Snapshot:
        """Keeps this moment of the running or suspended sandbox (its memory, processes and files) as
        a snapshot, kept until deleted (``client.snapshots.delete``). A running sandbox pauses as
        briefly as for a fork and runs on. Start sandboxes from it (``client.sandboxes.from_snapshot``)
        or roll this sandbox back to it (``restore``). Counts against the quotas ``snapshots`` and
        ``snapshot_mib`` (QuotaExceededError). Never retried: a repeat would keep a second snapshot."""
        body: Dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if labels:
            body["labels"] = dict(labels)
        return Snapshot.from_json(self._client.http.json("POST", self._path("/snapshots"), json_body=body, timeout=LIFECYCLE_TIMEOUT_SECS))

    def restore(self, snapshot: SnapshotArg) -> "Sandbox":
        """Rolls this sandbox back to one of its own snapshots, in place (same id): its memory,
        processes and files become the snapshot's. A running sandbox runs on from that moment; a
        suspended one stays suspended at it. Requests queued on it behind the rollback raise
        SandboxRestoredError; a snapshot of another sandbox raises SnapshotMismatchError (start a new
        sandbox from it instead). Refreshes ``info``. Never retried."""
        body = {"snapshot": _snapshot_id(snapshot)}
        self.info = SandboxInfo.from_json(self._client.http.json("POST", self._path("/restore"), json_body=body, timeout=LIFECYCLE_TIMEOUT_SECS))
        return self

    def suspend(self, *, keep_memory: Optional[bool] = None) -> "Sandbox":
        """Suspends to disk; frees its concurrency slot. Memory and processes are kept, unless
        ``keep_memory=False`` (or the sandbox's ``keep_memory``) keeps only its files: the resume then
        boots it afresh (``info.memory_kept`` says which)."""
        body = None if keep_memory is None else {"keep_memory": keep_memory}
        self.info = SandboxInfo.from_json(self._client.http.json("POST", self._path("/suspend"), json_body=body, timeout=LIFECYCLE_TIMEOUT_SECS))
        return self

    def resume(self) -> "Sandbox":
        """Resumes a suspended sandbox where it was; takes a concurrency slot."""
        self.info = SandboxInfo.from_json(self._client.http.json("POST", self._path("/resume"), timeout=LIFECYCLE_TIMEOUT_SECS))
        return self

    def set_timeout(self, timeout_secs: int) -> "Sandbox":
        """Ends this running sandbox's session ``timeout_secs`` seconds from now, sooner or later
        than before (a lease); ``info.expires_at`` and ``info.remaining_secs`` show the new end.

        The tier's maximum session counts from the session's start (``info.session_started_at``):
        past it raises TierForbiddenError whose ``details["max_timeout_secs"]`` is the most still
        allowed. InvalidStateError unless running: a resume starts a new session of
        ``info.timeout_secs``. Retried like a GET: setting it twice is setting it.
        """
        body = {"timeout_secs": timeout_secs}
        self.info = SandboxInfo.from_json(self._client.http.json("POST", self._path("/timeout"), json_body=body, retry="safe"))
        return self

    def delete(self) -> None:
        """Deletes the sandbox (running or suspended)."""
        self._client.http.request("DELETE", self._path())
        self.info = _replace_state(self.info, "deleted")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.state == "deleted":
            return
        try:
            self.delete()
        except NotFoundError:
            pass


#: Uploads and downloads: the socket timeout of each read and write (the transfer may take longer).
TRANSFER_TIMEOUT_SECS = 600.0
#: Pieces an upload from a local file is read in.
UPLOAD_PIECE_BYTES = 512 * 1024


class SandboxFiles:
    """A sandbox's files and directories. Paths are guest paths: absolute, or relative to /root
    (``read`` and ``write`` take absolute paths only, as they always have). Directory operations
    are answered while an exec runs."""

    def __init__(self, client: Collimate, sandbox_id: str) -> None:
        self._client = client
        self._id = sandbox_id

    def _path(self, rest: str) -> str:
        return f"/v1/sandboxes/{_q(self._id)}{rest}"

    def read(self, path: str) -> bytes:
        """The bytes of a file (absolute path) in the running sandbox, in memory. Large files: ``download``."""
        return self._client.http.request("GET", self._path("/files"), query={"path": path}, retry="safe").body

    def write(self, path: str, data: Union[str, bytes], *, mode: Optional[int] = None, user: Optional[str] = None) -> Dict[str, Any]:
        """Writes a file (absolute path; parent directories are created); ``mode`` e.g. 0o755.
        ``user``: an account of the image it is written as (its permissions; the new file is its)."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        query: Dict[str, Any] = {"path": path}
        if mode is not None:
            query["mode"] = format(mode, "03o")
        if user is not None:
            query["user"] = user
        return self._client.http.json("PUT", self._path("/files"), query=query, raw=raw)

    def upload(self, path: str, source: Union[bytes, Iterable[bytes], BinaryIO], *, mode: Optional[int] = None) -> Dict[str, Any]:
        """Uploads from bytes, an iterable of bytes or a binary file object without holding it in
        memory. The server writes beside ``path`` and renames over it once complete, so an
        interrupted upload leaves nothing. Over the server's limit: PayloadTooLargeError."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            body: Iterable[bytes] = [data] if data else []
        elif hasattr(source, "read"):
            f = source

            def pieces() -> Iterator[bytes]:
                while True:
                    piece = f.read(UPLOAD_PIECE_BYTES)  # type: ignore[union-attr]
                    if not piece:
                        return
                    yield piece

            body = pieces()
        else:
            body = source  # type: ignore[assignment]
        query: Dict[str, Any] = {"path": path}
        if mode is not None:
            query["mode"] = format(mode, "03o")
        with self._client.http.stream("PUT", self._path("/files"), query=query, body=body, timeout=TRANSFER_TIMEOUT_SECS) as res:
            return res.json()

    def upload_from(self, local_path: str, path: str, *, mode: Optional[int] = None) -> Dict[str, Any]:
        """Uploads a local file, streamed."""
        with open(local_path, "rb") as f:
            return self.upload(path, f, mode=mode)

    def download(self, path: str) -> Iterator[bytes]:
        """The file's bytes in pieces as they arrive (any size). Closing the iterator closes the connection."""
        with self._client.http.stream("GET", self._path("/files"), query={"path": path}, timeout=TRANSFER_TIMEOUT_SECS) as res:
            yield from res

    def download_to(self, path: str, local_path: str) -> int:
        """Downloads a file to ``local_path`` through a temporary file renamed into place once whole
        (a broken download leaves no partial file). Returns its size."""
        partial = f"{local_path}.partial-{uuid.uuid4().hex[:8]}"
        try:
            with self._client.http.stream("GET", self._path("/files"), query={"path": path}, timeout=TRANSFER_TIMEOUT_SECS) as res:
                expected = int(res.headers.get("content-length", "-1"))
                size = 0
                with open(partial, "wb") as out:
                    for piece in res:
                        out.write(piece)
                        size += len(piece)
            if expected >= 0 and size != expected:
                raise ConnectionError(f"The download of {path} broke off at {size} of {expected} bytes.", code="connection_failed", status=0)
            os.replace(partial, local_path)
            return size
        finally:
            if os.path.exists(partial):
                os.remove(partial)

    def stat(self, path: str) -> FileEntry:
        """The entry at ``path`` (a symlink is described, not followed)."""
        return FileEntry.from_json(self._client.http.json("GET", self._path("/fs/stat"), query={"path": path}, retry="safe"))

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return bool(self._client.http.json("GET", self._path("/fs/exists"), query={"path": path}, retry="safe")["exists"])

    def list(self, path: str, *, depth: int = 1) -> List[FileEntry]:
        """Entries of directory ``path``, ``depth`` levels down (at most 5000: see ``list_page``)."""
        return self.list_page(path, depth=depth)[0]

    def list_page(self, path: str, *, depth: int = 1) -> Tuple[List[FileEntry], bool]:
        """Entries and whether the listing was truncated (more than 5000, or 1 MiB of them)."""
        r = self._client.http.json("GET", self._path("/fs/list"), query={"path": path, "depth": depth}, retry="safe")
        return [FileEntry.from_json(e) for e in r["entries"]], bool(r["truncated"])

    def mkdir(self, path: str, *, mode: Optional[int] = None, user: Optional[str] = None) -> bool:
        """mkdir -p with ``mode`` (e.g. 0o750; default 0o755), as ``user`` if given (the directories
        made are its). Returns whether it was created (False: it existed)."""
        body: Dict[str, Any] = {"path": path}
        if mode is not None:
            body["mode"] = format(mode, "03o")
        if user is not None:
            body["user"] = user
        return bool(self._client.http.json("POST", self._path("/fs/mkdir"), json_body=body, retry="safe")["created"])

    def remove(self, path: str) -> int:
        """Removes a file, or a directory with everything in it (symlinks not followed). Returns the entries removed."""
        return int(self._client.http.json("POST", self._path("/fs/remove"), json_body={"path": path})["removed"])

    def rename(self, src: str, dst: str) -> FileEntry:
        """Renames (moves) ``src`` to ``dst``, replacing a file there; returns the entry at ``dst``."""
        return FileEntry.from_json(self._client.http.json("POST", self._path("/fs/rename"), json_body={"from": src, "to": dst}))

    def watch(self, path: str, *, recursive: bool = False, timeout: Optional[float] = None) -> Iterator[WatchEvent]:
        """Watches directory ``path``: yields ``change`` events, then, if the watch ends on its own
        (the directory went, the sandbox was suspended or deleted), one ``end`` event and stops.
        ``timeout``: the longest wait for the next event or keep-alive (the server pings every 15 s;
        default none). Closing the generator stops the watch."""
        query: Dict[str, Any] = {"path": path}
        if recursive:
            query["recursive"] = "true"
        for ev in self._client.http.sse("GET", self._path("/fs/watch"), query=query, timeout=timeout if timeout is not None else 3600.0):
            data = json.loads(ev.data)
            if ev.event == "change":
                yield WatchEvent(type="change", op=data.get("op"), name=data.get("name"))
            elif ev.event == "end":
                yield WatchEvent(type="end", reason=data.get("reason"))
                return
            elif ev.event == "error":
                raise error_from_body(None, data)


def _exec_timeout(timeout: Optional[float]) -> float:
    return (timeout if timeout is not None else DEFAULT_EXEC_TIMEOUT_SECS) + EXEC_TIMEOUT_SLACK_SECS


def _replace_state(info: SandboxInfo, state: str) -> SandboxInfo:
    import dataclasses

    return dataclasses.replace(info, state=state)
