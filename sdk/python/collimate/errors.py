"""The SDK's exception classes and the ONE mapping from API error codes (src/errors.ts) to them.

Every error the SDK raises is a :class:`CollimateError` carrying the server's stable ``code`` and
HTTP ``status`` (0 when no HTTP response was involved: connection failures, client-side timeouts).
The classes and the mapping mirror the TypeScript SDK (sdk/typescript/src/errors.ts).
"""
from __future__ import annotations

import email.utils
import time
from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "CollimateError",
    "AuthenticationError",
    "NotFoundError",
    "InvalidStateError",
    "SnapshotMismatchError",
    "SandboxRestoredError",
    "ConcurrencyLimitError",
    "QuotaExceededError",
    "ValidationError",
    "PayloadTooLargeError",
    "TierForbiddenError",
    "EgressForbiddenError",
    "UrlExpiredError",
    "NetworkUnavailableError",
    "PortUnreachableError",
    "PermissionDeniedError",
    "FileConflictError",
    "NoSpaceError",
    "TimeoutError",
    "ServerError",
    "ConnectionError",
    "ERROR_CLASSES",
    "error_from_body",
]


class CollimateError(Exception):
    """Base class. ``code`` is the API's stable error code, ``status`` the HTTP status (0 if none)."""

    default_status = 0

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int,
        details: Optional[Dict[str, Any]] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details: Dict[str, Any] = dict(details or {})
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


class AuthenticationError(CollimateError):
    """401: the API key is missing, unknown or revoked."""

    default_status = 401


class NotFoundError(CollimateError):
    """404: no such sandbox, snapshot, template, image, file, process or code context (other tenants' ids read as not found too)."""

    default_status = 404


class InvalidStateError(CollimateError):
    """409: the sandbox is in the wrong state for the operation (e.g. exec while suspended)."""

    default_status = 409

    @property
    def state(self) -> Optional[str]:
        s = self.details.get("state")
        return s if isinstance(s, str) else None


class SnapshotMismatchError(InvalidStateError):
    """409 snapshot_mismatch: a rollback (``sb.restore``) to a snapshot of another sandbox; a sandbox
    rolls back only to its own. Start a new sandbox from it instead (``client.sandboxes.from_snapshot``)."""

    @property
    def snapshot_sandbox_id(self) -> Optional[str]:
        """The sandbox the snapshot was taken of, when the server says."""
        s = self.details.get("snapshot_sandbox_id")
        return s if isinstance(s, str) else None


class SandboxRestoredError(InvalidStateError):
    """409 sandbox_restored: the request waited on the sandbox behind a rollback to a snapshot and was
    not done (the sandbox is now at the snapshot's moment). Send it again if it still applies."""

    @property
    def snapshot_id(self) -> Optional[str]:
        """The snapshot the sandbox was rolled back to, when the server says."""
        s = self.details.get("snapshot_id")
        return s if isinstance(s, str) else None


class ConcurrencyLimitError(CollimateError):
    """429: the tier's cap on running sandboxes is reached; ``retry_after`` is in seconds."""

    default_status = 429


class QuotaExceededError(CollimateError):
    """429 quota_exceeded: a per-tenant quota is reached; ``quota`` names it (``suspended_sandboxes``,
    ``suspended_mib``, ``snapshots``, ``snapshot_mib``, ``images``, ``environments``, ``open_streams``,
    ``keys``). Retrying does not help until something is deleted or closed."""

    default_status = 429

    @property
    def quota(self) -> Optional[str]:
        q = self.details.get("quota")
        return q if isinstance(q, str) else None


class ValidationError(CollimateError):
    """400 (and 422 for a reused Idempotency-Key): the request is malformed; ``details['issues']`` says where."""

    default_status = 400


class PayloadTooLargeError(CollimateError):
    """413: a body over the server's limit."""

    default_status = 413


class TierForbiddenError(CollimateError):
    """403: the tier does not allow this (a session over its maximum, a non-catalog template)."""

    default_status = 403


class EgressForbiddenError(TierForbiddenError):
    """403 egress_forbidden: the create asked for an egress policy wider than its template's."""


class UrlExpiredError(AuthenticationError):
    """401 url_expired: a signed port URL past its expiry."""


class NetworkUnavailableError(InvalidStateError):
    """409 network_unavailable: the server (or the sandbox's template) has no networking, so ports cannot be reached."""


class CodeUnavailableError(InvalidStateError):
    """409 code_unavailable: the sandbox cannot run code cells: its image has no python3 for the code
    interpreter (use the python or node template), or its interpreter failed or stopped answering
    (that context's state may be lost). An exception inside a cell is not this: it is the result's ``error``."""


class PermissionDeniedError(CollimateError):
    """403 permission_denied: the guest refused a file operation (an immutable file, a read-only mount)."""

    default_status = 403


class FileConflictError(CollimateError):
    """409: a file operation met something in the way (``file_exists``, ``not_a_directory``,
    ``is_a_directory``, ``directory_not_empty``, ``file_changed``) or the guest's file system refused
    it (``file_operation_failed``, 422). ``code`` says which."""

    default_status = 409


class NoSpaceError(CollimateError):
    """507 no_space: the sandbox's disk is full."""

    default_status = 507


class TimeoutError(CollimateError):  # noqa: A001 - mirrors the TypeScript SDK's class name
    """The client gave up waiting (its own timeout), or the server reported ``exec_timeout``."""

    default_status = 0


class ServerError(CollimateError):
    """5xx: a server or VMM failure. Safe operations were already retried."""

    default_status = 500


class PortUnreachableError(ServerError):
    """502 port_unreachable: nothing answers on that port inside the sandbox (start a server there first)."""


class ConnectionError(CollimateError):  # noqa: A001 - mirrors the TypeScript SDK's class name
    """No HTTP response at all: the server is unreachable or the connection dropped."""

    default_status = 0


#: The mapping, keyed by the server's codes (a test checks it covers every code of src/errors.ts);
#: unknown codes fall back to their HTTP status class.
ERROR_CLASSES: Dict[str, Type[CollimateError]] = {
    "validation_error": ValidationError,
    "invalid_json": ValidationError,
    "unsupported_media_type": ValidationError,
    "method_not_allowed": ValidationError,
    "idempotency_key_reused": ValidationError,
    "unauthorized": AuthenticationError,
    "url_expired": UrlExpiredError,
    "tier_forbidden": TierForbiddenError,
    "template_forbidden": TierForbiddenError,
    "origin_forbidden": TierForbiddenError,
    "egress_forbidden": EgressForbiddenError,
    "sandbox_not_found": NotFoundError,
    "template_not_found": NotFoundError,
    "image_not_found": NotFoundError,
    "environment_not_found": NotFoundError,
    "not_found": NotFoundError,
    "file_not_found": NotFoundError,
    "process_not_found": NotFoundError,
    "user_not_found": NotFoundError,
    "snapshot_not_found": NotFoundError,
    "context_not_found": NotFoundError,
    "process_exited": InvalidStateError,
    "stdin_closed": InvalidStateError,
    "not_a_terminal": InvalidStateError,
    "too_many_processes": InvalidStateError,
    "command_not_found": ValidationError,
    "spawn_failed": ValidationError,
    "permission_denied": PermissionDeniedError,
    "not_a_directory": FileConflictError,
    "is_a_directory": FileConflictError,
    "file_exists": FileConflictError,
    "directory_not_empty": FileConflictError,
    "file_changed": FileConflictError,
    "file_operation_failed": FileConflictError,
    "too_many_watches": ConcurrencyLimitError,
    "no_space": NoSpaceError,
    "invalid_state": InvalidStateError,
    "conflict": InvalidStateError,
    "snapshot_mismatch": SnapshotMismatchError,
    "sandbox_restored": SandboxRestoredError,
    "network_unavailable": NetworkUnavailableError,
    "code_unavailable": CodeUnavailableError,
    "payload_too_large": PayloadTooLargeError,
    "concurrency_limit": ConcurrencyLimitError,
    "quota_exceeded": QuotaExceededError,
    "rate_limited": ConcurrencyLimitError,
    "exec_timeout": TimeoutError,
    "internal_error": ServerError,
    "agent_unavailable": ServerError,
    "vmm_failed": ServerError,
    "port_unreachable": PortUnreachableError,
    "template_not_ready": ServerError,
    "shutting_down": ServerError,
    "host_at_capacity": ServerError,
    "image_pull_failed": ServerError,
    "bake_failed": ServerError,
}

_BY_STATUS: Dict[int, Type[CollimateError]] = {
    400: ValidationError,
    405: ValidationError,
    415: ValidationError,
    422: ValidationError,
    401: AuthenticationError,
    403: TierForbiddenError,
    404: NotFoundError,
    408: TimeoutError,
    409: InvalidStateError,
    413: PayloadTooLargeError,
    429: ConcurrencyLimitError,
}


def _class_for_status(status: int) -> Type[CollimateError]:
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, CollimateError)


def _parse_retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    try:
        n = float(value)
        return n if n >= 0 else None
    except ValueError:
        pass
    try:
        t = email.utils.parsedate_to_datetime(value).timestamp()
        return max(0.0, t - time.time())
    except (TypeError, ValueError):
        return None


def error_from_body(status: Optional[int], body: Any, retry_after: Optional[str] = None) -> CollimateError:
    """The error for an API error body ``{"error": {"code", "message", ...}}``.

    ``status`` is the HTTP status, or None when the error arrived inside a 200 SSE stream.
    """
    ra = _parse_retry_after(retry_after)
    err = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(err, Mapping) and isinstance(err.get("code"), str):
        code = err["code"]
        message = err.get("message") if isinstance(err.get("message"), str) else code
        details = {k: v for k, v in err.items() if k not in ("code", "message")}
        cls = ERROR_CLASSES.get(code) or _class_for_status(status or 0)
        return cls(message, code=code, status=status if status is not None else cls.default_status, details=details, retry_after=ra)
    s = status or 0
    text = body[:200] if isinstance(body, str) else ""
    return _class_for_status(s)(f"HTTP {s}" + (f": {text}" if text else ""), code="http_error", status=s, retry_after=ra)
