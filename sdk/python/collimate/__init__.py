"""Collimate Python SDK (standard library only).

    from collimate import Collimate

    client = Collimate()                      # COLLIMATE_API_KEY, COLLIMATE_BASE_URL
    with client.sandboxes.create("base") as sb:
        print(sb.exec("echo hello").stdout)
"""
from .client import DEFAULT_BASE_URL, Collimate, Sandbox, Sandboxes, SandboxFiles, SandboxPages, SnapshotPages, Snapshots
from .errors import (
    ERROR_CLASSES,
    AuthenticationError,
    CollimateError,
    ConcurrencyLimitError,
    QuotaExceededError,
    ConnectionError,
    EgressForbiddenError,
    InvalidStateError,
    NetworkUnavailableError,
    SandboxRestoredError,
    SnapshotMismatchError,
    NotFoundError,
    FileConflictError,
    NoSpaceError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PortUnreachableError,
    ServerError,
    TierForbiddenError,
    TimeoutError,
    UrlExpiredError,
    ValidationError,
    error_from_body,
)
from .types import ExecChunk, ExecResult, ExecTiming, FileEntry, OpenPort, PortResponse, SandboxInfo, SandboxLogEntry, Snapshot, Template, WatchEvent
from .processes import Process, ProcessExit, ProcessGap, ProcessInfo, ProcessOutput, SandboxProcesses

__version__ = "0.1.0"

__all__ = [
    "Collimate",
    "Sandbox",
    "Sandboxes",
    "SandboxFiles",
    "SandboxPages",
    "Snapshots",
    "SnapshotPages",
    "Snapshot",
    "DEFAULT_BASE_URL",
    "ExecChunk",
    "FileEntry",
    "WatchEvent",
    "PermissionDeniedError",
    "FileConflictError",
    "NoSpaceError",
    "ExecResult",
    "ExecTiming",
    "SandboxInfo",
    "SandboxLogEntry",
    "OpenPort",
    "PortResponse",
    "Template",
    "Process",
    "ProcessInfo",
    "ProcessOutput",
    "ProcessGap",
    "ProcessExit",
    "SandboxProcesses",
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
    "TimeoutError",
    "ServerError",
    "ConnectionError",
    "ERROR_CLASSES",
    "error_from_body",
]
