"""HTTP for the SDK over http.client with persistent (keep-alive) connections.

Connections are pooled: a request takes an idle connection (or opens one) and puts it back when the
response is fully read, so a single-threaded caller uses exactly ONE connection for its whole life,
and N threads use at most N. Retries happen only where repeating cannot do anything twice:

* ``safe`` (GETs): on connection errors and 502/503/504;
* ``idempotent`` (create, fork): the same Idempotency-Key goes with every attempt, so the server
  runs the operation once; on connection errors and 503;
* ``none`` (exec, suspend, resume, delete, file writes): never.
"""
from __future__ import annotations

import builtins
import http.client
import json
import random
import socket
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import CollimateError, ConnectionError, TimeoutError, error_from_body

__all__ = ["Transport", "Response", "SseEvent", "StreamResponse"]

QueryValue = Union[str, int, float, Sequence[str], None]

#: An idle connection older than this is closed rather than reused (the server's keep-alive
#: timeout is 72 s; staying well under it avoids racing its close).
IDLE_REUSE_SECS = 30.0


class Response:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class SseEvent:
    __slots__ = ("event", "data")

    def __init__(self, event: str, data: str) -> None:
        self.event = event
        self.data = data


_NETWORK_ERRORS = (
    http.client.HTTPException,
    builtins.ConnectionError,  # ConnectionResetError, BrokenPipeError, ConnectionRefusedError, ...
    OSError,
)


def _exchange(
    conn: http.client.HTTPConnection, method: str, target: str, body: Any, headers: Mapping[str, str], *, encode_chunked: bool = False
) -> http.client.HTTPResponse:
    """Sends a request and returns its response. A server may answer before it has read the whole
    body (413 for an upload over its limit, 404 for a sandbox that is gone) and close the
    connection: writing the rest then fails with a broken pipe or a reset while the answer waits in
    the socket. That answer is what is returned; the write's error is raised only if there is none."""
    try:
        conn.request(method, target, body=body, headers=headers, encode_chunked=encode_chunked)
    except (BrokenPipeError, ConnectionResetError) as cut:
        if body is None:
            raise
        try:
            return conn.getresponse()
        except _NETWORK_ERRORS:
            raise cut from None
    return conn.getresponse()


class Transport:
    def __init__(self, base_url: str, api_key: Optional[str], *, max_retries: int = 3, timeout: float = 60.0) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self._api_key = api_key
        self.max_retries = max_retries
        self.timeout = timeout
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()
        #: How many TCP connections this transport has opened (for tests and diagnostics).
        self.connections_opened = 0
        self._closed = False

    # -- connections ---------------------------------------------------------------------------

    def _acquire(self, timeout: float) -> http.client.HTTPConnection:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                conn, since = self._idle.pop()
                if now - since < IDLE_REUSE_SECS and conn.sock is not None:
                    conn.timeout = timeout
                    conn.sock.settimeout(timeout)
                    return conn
                conn.close()
            self.connections_opened += 1
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self._closed:
                conn.close()
            else:
                self._idle.append((conn, time.monotonic()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    # -- requests ------------------------------------------------------------------------------

    def _target(self, path: str, query: Optional[Mapping[str, QueryValue]]) -> str:
        pairs: List[Tuple[str, str]] = []
        for k, v in (query or {}).items():
            if v is None:
                continue
            if isinstance(v, (list, tuple)):
                pairs.extend((k, str(x)) for x in v)
            else:
                pairs.append((k, str(v)))
        qs = urllib.parse.urlencode(pairs)
        return self._prefix + path + (f"?{qs}" if qs else "")

    def _headers(self, extra: Optional[Mapping[str, str]], content_type: Optional[str]) -> Dict[str, str]:
        h = {"user-agent": "collimate-python/0.1", "accept": "application/json"}
        if self._api_key:
            h["authorization"] = f"Bearer {self._api_key}"
        if content_type:
            h["content-type"] = content_type
        h.update(extra or {})
        return h

    @staticmethod
    def _encode(json_body: Any, raw: Optional[bytes]) -> Tuple[Optional[bytes], Optional[str]]:
        if json_body is not None:
            return json.dumps(json_body, separators=(",", ":")).encode("utf-8"), "application/json"
        if raw is not None:
            return raw, "application/octet-stream"
        return None, None

    def _timeout_error(self, method: str, path: str, timeout: float) -> TimeoutError:
        return TimeoutError(
            f"{method} {path} got no answer within {timeout:g} s (client-side timeout).", code="client_timeout", status=0
        )

    def _connection_error(self, e: BaseException) -> ConnectionError:
        return ConnectionError(
            f"Cannot reach {self.base_url} ({type(e).__name__}: {e}). Is the server running? Check base_url / COLLIMATE_BASE_URL.",
            code="connection_failed",
            status=0,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, QueryValue]] = None,
        json_body: Any = None,
        raw: Optional[bytes] = None,
        stream: Optional[Iterable[bytes]] = None,
        headers: Optional[Mapping[str, str]] = None,
        retry: str = "none",
        timeout: Optional[float] = None,
    ) -> Response:
        """Sends with retries per ``retry``; returns a 2xx response, raises mapped errors.
        ``stream``: a body sent chunked as the iterable produces it (never retried)."""
        t = self.timeout if timeout is None else timeout
        body: Any
        body, ctype = self._encode(json_body, raw)
        if stream is not None:
            body, ctype, retry = stream, "application/octet-stream", "none"
        hdrs = self._headers(headers, ctype)
        target = self._target(path, query)
        attempt = 0
        while True:
            wait: Optional[float] = None
            conn = self._acquire(t)
            try:
                resp = _exchange(conn, method, target, body, hdrs, encode_chunked=stream is not None)
                data = resp.read()
                status = resp.status
                rheaders = {k.lower(): v for k, v in resp.getheaders()}
            except socket.timeout:
                conn.close()
                raise self._timeout_error(method, path, t) from None
            except _NETWORK_ERRORS as e:
                conn.close()
                if retry == "none" or attempt >= self.max_retries:
                    raise self._connection_error(e) from e
            else:
                if resp.will_close:
                    conn.close()
                else:
                    self._release(conn)
                if 200 <= status < 300:
                    return Response(status, rheaders, data)
                parsed: Any = data.decode("utf-8", "replace")
                try:
                    parsed = json.loads(parsed)
                except ValueError:
                    pass
                err = error_from_body(status, parsed, rheaders.get("retry-after"))
                retryable = status in (502, 503, 504) if retry == "safe" else (status == 503 if retry == "idempotent" else False)
                if not retryable or attempt >= self.max_retries:
                    raise err
                if err.retry_after is not None and 0 < err.retry_after <= 30:
                    wait = err.retry_after
            time.sleep(wait if wait is not None else _backoff(attempt))
            attempt += 1

    def json(self, method: str, path: str, **kw: Any) -> Any:
        return self.request(method, path, **kw).json()

    def absolute(self, path: str) -> str:
        """An absolute URL of an API path (a port's ``url``, a signed port URL: relative to the API base)."""
        return self.base_url + path

    def proxy(
        self,
        method: str,
        path: str,
        *,
        body: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Response:
        """A request through the ports proxy: the sandbox server's answer whatever its status. Only
        errors of the proxy itself (marked ``X-Collimate-Error``) raise the mapped errors. Never retried."""
        t = self.timeout if timeout is None else timeout
        hdrs = {"user-agent": "collimate-python/0.1"}
        if self._api_key:
            hdrs["authorization"] = f"Bearer {self._api_key}"
        hdrs.update(headers or {})
        conn = self._acquire(t)
        try:
            conn.request(method, self._prefix + path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
        except socket.timeout:
            conn.close()
            raise self._timeout_error(method, path, t) from None
        except _NETWORK_ERRORS as e:
            conn.close()
            raise self._connection_error(e) from e
        rheaders = {k.lower(): v for k, v in resp.getheaders()}
        if resp.will_close:
            conn.close()
        else:
            self._release(conn)
        if "x-collimate-error" in rheaders:
            parsed: Any = data.decode("utf-8", "replace")
            try:
                parsed = json.loads(parsed)
            except ValueError:
                pass
            raise error_from_body(resp.status, parsed, rheaders.get("retry-after"))
        return Response(resp.status, rheaders, data)

    def stream(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, QueryValue]] = None,
        body: Optional[Iterable[bytes]] = None,
        timeout: Optional[float] = None,
    ) -> "StreamResponse":
        """A streamed exchange, never retried: ``body`` (an iterable of bytes) goes out chunked; the
        2xx response is returned with its headers, its body to be read in pieces (StreamResponse);
        errors raise the mapped errors. ``timeout`` applies to each socket read and write."""
        t = self.timeout if timeout is None else timeout
        hdrs = self._headers(None, "application/octet-stream" if body is not None else None)
        conn = self._acquire(t)
        try:
            resp = _exchange(conn, method, self._target(path, query), body, hdrs, encode_chunked=body is not None)
        except socket.timeout:
            conn.close()
            raise self._timeout_error(method, path, t) from None
        except _NETWORK_ERRORS as e:
            conn.close()
            raise self._connection_error(e) from e
        except BaseException:
            conn.close()
            raise
        if not 200 <= resp.status < 300:
            parsed: Any = resp.read().decode("utf-8", "replace")
            conn.close()
            try:
                parsed = json.loads(parsed)
            except ValueError:
                pass
            raise error_from_body(resp.status, parsed, resp.getheader("retry-after"))
        return StreamResponse(self, conn, resp, method, path, t)

    def sse(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        query: Optional[Mapping[str, QueryValue]] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[SseEvent]:
        """Yields the events of an SSE response. Never retried. Closing the generator early closes the connection."""
        t = self.timeout if timeout is None else timeout
        body, ctype = self._encode(json_body, None)
        hdrs = self._headers({"accept": "text/event-stream"}, ctype)
        conn = self._acquire(t)
        reusable = False
        try:
            try:
                conn.request(method, self._target(path, query), body=body, headers=hdrs)
                resp = conn.getresponse()
            except socket.timeout:
                raise self._timeout_error(method, path, t) from None
            except _NETWORK_ERRORS as e:
                raise self._connection_error(e) from e
            if not 200 <= resp.status < 300:
                data = resp.read()
                parsed: Any = data.decode("utf-8", "replace")
                try:
                    parsed = json.loads(parsed)
                except ValueError:
                    pass
                reusable = not resp.will_close
                raise error_from_body(resp.status, parsed, resp.getheader("retry-after"))
            event, data_lines = "message", []
            try:
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    text = line.decode("utf-8").rstrip("\r\n")
                    if text == "":
                        if data_lines:
                            yield SseEvent(event, "\n".join(data_lines))
                        event, data_lines = "message", []
                        continue
                    if text.startswith(":"):
                        continue  # comment (keep-alive ping)
                    name, _, value = text.partition(":")
                    if value.startswith(" "):
                        value = value[1:]
                    if name == "event":
                        event = value
                    elif name == "data":
                        data_lines.append(value)
            except socket.timeout:
                raise self._timeout_error(method, path, t) from None
            except _NETWORK_ERRORS as e:
                raise self._connection_error(e) from e
            reusable = not resp.will_close
        finally:
            if reusable:
                self._release(conn)
            else:
                conn.close()


def _backoff(attempt: int) -> float:
    base = min(5.0, 0.2 * (2**attempt))
    return base / 2 + random.random() * base / 2


#: How much a streamed response is read at a time.
STREAM_READ_BYTES = 256 * 1024


class StreamResponse:
    """A 2xx response whose body is read in pieces (iterate it); ``close()`` (or ``with``) closes its connection."""

    def __init__(self, transport: Transport, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, method: str, path: str, timeout: float) -> None:
        self._transport = transport
        self._conn = conn
        self._resp = resp
        self._method = method
        self._path = path
        self._timeout = timeout
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    def __iter__(self) -> Iterator[bytes]:
        try:
            while True:
                piece = self._resp.read1(STREAM_READ_BYTES)
                if not piece:
                    return
                yield piece
        except socket.timeout:
            raise self._transport._timeout_error(self._method, self._path, self._timeout) from None
        except _NETWORK_ERRORS as e:
            raise self._transport._connection_error(e) from e

    def json(self) -> Any:
        return json.loads(b"".join(self).decode("utf-8"))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "StreamResponse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
