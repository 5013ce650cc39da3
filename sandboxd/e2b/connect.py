"""The Connect protocol as the E2B SDK speaks it to envd: JSON codec, unary
calls as ``application/json`` and server streams as enveloped
``application/connect+json`` messages ending with an end-stream frame.

The SDK's envd clients are built with ``json=True``, so messages here are the
proto3 JSON mapping of envd's messages (camelCase names, bytes as base64,
int64 as strings, enums by name), built as plain dicts: the server does not
depend on the SDK's generated code."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from aiohttp import web

from sandboxd import errors

__all__ = [
    "ConnectError",
    "b64",
    "code_for",
    "end_frame",
    "error_response",
    "frame",
    "parse_stream_request",
    "parse_unary_request",
    "unb64",
]

END_STREAM = 0b10
STREAM_CONTENT_TYPE = "application/connect+json"

# Connect codes as envd answers them, and the HTTP status a unary error
# carries (the SDK reads the code from the body, the status from the line).
HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "unimplemented": 501,
    "unavailable": 503,
    "unauthenticated": 401,
}


class ConnectError(Exception):
    """An envd call's failure, with its Connect code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def code_for(e: errors.SandboxdError) -> str:
    """The Connect code that keeps a sandboxd error's meaning for the SDK.

    A sandbox lost under a call is ``aborted``: the SDK raises its generic
    ``SandboxException`` for it, never a command result."""
    if isinstance(e, errors.InvalidArgument):
        return "invalid_argument"
    if isinstance(e, errors.NotFound):
        return "not_found"
    if isinstance(e, errors.DeadlineExceeded):
        return "deadline_exceeded"
    if isinstance(e, errors.ResourceExhausted):
        return "resource_exhausted"
    if isinstance(e, errors.PermissionDenied):
        return "permission_denied"
    if isinstance(e, errors.Unauthenticated):
        return "unauthenticated"
    if isinstance(e, errors.FailedPrecondition):
        return "failed_precondition"
    if isinstance(e, errors.SandboxLost):
        return "aborted"
    if isinstance(e, errors.Unavailable):
        return "unavailable"
    return "unknown"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise ConnectError("invalid_argument", f"not base64: {e}") from e


def frame(message: dict[str, Any]) -> bytes:
    """One enveloped stream message."""
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", 0, len(data)) + data


def end_frame(error: ConnectError | None = None) -> bytes:
    """The end-stream frame: ``{}``, or the error that ended the stream."""
    body: dict[str, Any] = {} if error is None else {"error": {"code": error.code, "message": error.message}}
    data = json.dumps(body).encode()
    return struct.pack(">BI", END_STREAM, len(data)) + data


def error_response(error: ConnectError) -> web.Response:
    """A unary call's error answer."""
    return web.json_response(
        {"code": error.code, "message": error.message}, status=HTTP_STATUS.get(error.code, 500)
    )


def _object(raw: bytes) -> dict[str, Any]:
    try:
        message = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConnectError("invalid_argument", f"request is not JSON: {e}") from e
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "request must be a JSON object")
    return message


async def parse_unary_request(request: web.Request) -> dict[str, Any]:
    """A unary call's request message."""
    if not request.content_type.endswith("json"):
        raise ConnectError("invalid_argument", f"only the JSON codec is served, not {request.content_type}")
    if request.headers.get("content-encoding", "identity") != "identity":
        raise ConnectError("invalid_argument", "compressed requests are not served")
    return _object(await request.read())


async def parse_stream_request(request: web.Request) -> dict[str, Any]:
    """A server-stream call's one request message, out of its envelope."""
    if request.content_type != STREAM_CONTENT_TYPE:
        raise ConnectError(
            "invalid_argument", f"streams speak {STREAM_CONTENT_TYPE}, not {request.content_type}"
        )
    raw = await request.read()
    if len(raw) < 5:
        raise ConnectError("invalid_argument", "request envelope is truncated")
    flags, length = struct.unpack(">BI", raw[:5])
    if flags & 0b01:
        raise ConnectError("invalid_argument", "compressed requests are not served")
    if len(raw) - 5 != length:
        raise ConnectError("invalid_argument", "request envelope length does not match its body")
    return _object(raw[5:])


def stream_timeout(request: web.Request) -> float:
    """The stream's ``connect-timeout-ms`` in seconds (0 = none)."""
    raw = request.headers.get("connect-timeout-ms", "")
    if not raw:
        return 0.0
    try:
        ms = int(raw)
    except ValueError as e:
        raise ConnectError("invalid_argument", f"connect-timeout-ms is not an integer: {raw!r}") from e
    if ms < 0:
        raise ConnectError("invalid_argument", "connect-timeout-ms must not be negative")
    return ms / 1000.0
