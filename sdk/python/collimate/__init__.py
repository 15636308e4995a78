"""Collimate Python SDK (standard library only).

    from collimate import Collimate

    client = Collimate()                      # COLLIMATE_API_KEY, COLLIMATE_BASE_URL
    with client.sandboxes.create("base") as sb:
        print(sb.exec("echo hello").stdout)
"""
from .client import DEFAULT_BASE_URL, Collimate, Sandbox, Sandboxes, SandboxFiles, SandboxPages
from .errors import (
    ERROR_CLASSES,
    AuthenticationError,
    CollimateError,
    ConcurrencyLimitError,
    ConnectionError,
    InvalidStateError,
    NotFoundError,
    PayloadTooLargeError,
    ServerError,
    TierForbiddenError,
    TimeoutError,
    ValidationError,
    error_from_body,
)
from .types import ExecChunk, ExecResult, ExecTiming, SandboxInfo, Template

__version__ = "0.1.0"

__all__ = [
    "Collimate",
    "Sandbox",
    "Sandboxes",
    "SandboxFiles",
    "SandboxPages",
    "DEFAULT_BASE_URL",
    "ExecChunk",
    "ExecResult",
    "ExecTiming",
    "SandboxInfo",
    "Template",
    "CollimateError",
    "AuthenticationError",
    "NotFoundError",
    "InvalidStateError",
    "ConcurrencyLimitError",
    "ValidationError",
    "PayloadTooLargeError",
    "TierForbiddenError",
    "TimeoutError",
    "ServerError",
    "ConnectionError",
    "ERROR_CLASSES",
    "error_from_body",
]
