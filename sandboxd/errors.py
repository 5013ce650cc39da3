"""sandboxd's error tree. Every layer raises these; the API layer maps them to
gRPC status codes in one table (sandboxd/api/errors.py). Library errors (docker,
grpc) are wrapped with ``raise ... from e`` so they never leak upward.

    SandboxdError
    ├── InvalidArgument        bad input; names the offending field
    ├── NotFound               unknown pool / sandbox / lease / path
    ├── AlreadyExists          a pool name in use
    ├── FailedPrecondition     can never succeed in the current state
    ├── ResourceExhausted      over a limit or quota; carries retry_after
    ├── DeadlineExceeded       waited as long as allowed
    ├── Unauthenticated        missing or wrong credentials
    └── BackendError           the engine failed
        ├── TransientBackendError   worth retrying (engine busy, timeout)
        ├── PermanentBackendError   never worth retrying (image missing, bad spec)
        └── SandboxLost              the sandbox died or vanished
"""

from __future__ import annotations


class SandboxdError(Exception):
    """Root of every error sandboxd raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(SandboxdError):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(SandboxdError):
    pass


class AlreadyExists(SandboxdError):
    pass


class FailedPrecondition(SandboxdError):
    pass


class ResourceExhausted(SandboxdError):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceeded(SandboxdError):
    pass


class Unauthenticated(SandboxdError):
    pass


class BackendError(SandboxdError):
    pass


class TransientBackendError(BackendError):
    pass


class PermanentBackendError(BackendError):
    pass


class SandboxLost(BackendError):
    pass


__all__ = [
    "AlreadyExists",
    "BackendError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermanentBackendError",
    "ResourceExhausted",
    "SandboxLost",
    "SandboxdError",
    "TransientBackendError",
    "Unauthenticated",
]
