"""An acquire as the API received it, before validation (sandboxd.core.leasing serves it)."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.backends.base import Limits


@dataclass(frozen=True)
class AcquireRequest:
    """An acquire as the API received it, before validation."""

    pool: str
    n: int = 1
    """Sandboxes wanted; 0 = 1."""
    min_n: int = 0
    """At the deadline, settle for this many (0 = all or nothing)."""
    labels: dict[str, str] | None = None
    ttl: float = 0.0
    """Lease TTL in seconds; 0 = the server's default."""
    timeout: float = 0.0
    """Longest wait for sandboxes; 0 = the server's maximum."""
    call_remaining: float | None = None
    """Seconds before the caller's deadline, as the client sent it (None = none)."""
    limits: Limits | None = None
    """Lowers memory, CPU, pids, output or lifetime for these sandboxes only,
    within the pool's own limits."""
    request_id: str = ""
    """The client's id for this acquire ("" = none): a repeat answers the
    lease it was granted, and release_request frees it."""
    image: str = ""
    """The image of these sandboxes ("" = the pool's own); the pool must
    serve it (``PoolConfig.images``). Pulled first when absent, within the
    acquire's deadline."""
    network: tuple[str, ...] = ()
    """Network rules within the pool's these sandboxes run under for the
    lease (() = the pool's own): sandboxd.core.narrowing."""
