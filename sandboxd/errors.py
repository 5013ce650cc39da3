"""sandboxd's error tree. Every layer raises these; the API layer maps them to
gRPC status codes in one table (sandboxd/api/errors.py). Library errors (docker,
grpc) are wrapped with ``raise ... from e`` so they never leak upward.

    SandboxdError
    ├── InvalidArgument        bad input; names the offending field
    ├── NotFound               unknown pool / sandbox / lease / path
    ├── AlreadyExists          a pool name in use
    ├── FailedPrecondition     can never succeed in the current state
    │   └── BuildFailed          an image build failed; names the failing step
    ├── PermissionDenied       the user may not do this to that file (as in the sandbox)
    ├── ResourceExhausted      over a limit or quota; carries retry_after
    ├── DeadlineExceeded       waited as long as allowed
    ├── Unauthenticated        missing or wrong credentials
    └── BackendError           the engine failed
        ├── TransientBackendError   worth retrying (engine busy, timeout)
        │   └── Unavailable          a registry or service cannot be reached; carries retry_after
        ├── PermanentBackendError   never worth retrying (image missing, bad spec)
        └── SandboxLost              the sandbox died or vanished
"""

from __future__ import annotations


class SandboxdError(Exception):
    """Root of every error sandboxd raises on purpose."""

    def __init__(self, message: str) -> None:
        # A name that is not UTF-8 (surrogate-escaped) must not make the
        # message itself unsendable: its odd bytes are shown escaped.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.message = message


class InvalidArgument(SandboxdError):
    """The request itself is wrong; ``field`` names the part to fix, so retrying as-is never helps."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(SandboxdError):
    """The named pool, sandbox, lease or path does not exist (or no longer does)."""


class AlreadyExists(SandboxdError):
    """The name is taken; nothing was created or changed."""


class FailedPrecondition(SandboxdError):
    """The request can never succeed in the current state; retry only after that state changes."""


class BuildFailed(FailedPrecondition):
    """An image build failed at a step of its Dockerfile; ``step`` names it
    (e.g. "RUN make"), ``log_tail`` holds the build's last log lines."""

    def __init__(self, message: str, step: str = "", log_tail: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.log_tail = log_tail


class PermissionDenied(SandboxdError):
    """The sandbox's user (or its root, which has no capabilities) may not do
    this to the named file: the same refusal the sandbox's own kernel gives."""


class ResourceExhausted(SandboxdError):
    """Over a limit or quota for now; ``retry_after`` (seconds), when set, says when to try again."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceeded(SandboxdError):
    """Waited as long as the caller or the server allows, and the thing waited for never came."""


class Unauthenticated(SandboxdError):
    """Credentials are missing or wrong; the request was refused before doing anything."""


class BackendError(SandboxdError):
    """The engine (Docker, Kubernetes) failed; the subclasses say whether retrying can help."""


class TransientBackendError(BackendError):
    """The engine is busy or timed out; the same request is worth retrying."""


class Unavailable(TransientBackendError):
    """A registry or another service sandboxd depends on cannot be reached;
    ``retry_after`` (seconds), when set, says when trying again is worth it."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentBackendError(BackendError):
    """The engine refused for good (image missing, bad spec); retrying the same request never helps."""


class SandboxLost(BackendError):
    """The sandbox died or vanished under the call; its state is gone, so only a new sandbox helps."""


__all__ = [
    "AlreadyExists",
    "BackendError",
    "BuildFailed",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermanentBackendError",
    "PermissionDenied",
    "ResourceExhausted",
    "SandboxLost",
    "SandboxdError",
    "TransientBackendError",
    "Unauthenticated",
    "Unavailable",
]


def printable(text: str) -> str:
    """``text`` as it can always be sent and logged: bytes that were not
    UTF-8 (held as surrogate escapes, as os and the listings decode them)
    become ``\\xNN``, any other lone surrogate ``\\uDxxx``; valid text is
    unchanged. A status message that cannot be encoded would fail the call
    that tries to report the error."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)
