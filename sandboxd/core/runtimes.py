"""Isolation runtimes a pool may ask for, and what each can enforce.

A pool names one of sandboxd.backends.base.RUNTIMES; the backend says which
it can run (IsolationRuntimes; a backend without it runs RUNC only). gVisor
keeps the workspace in its own memory and does not enforce a tmpfs inode
limit, so a file-count limit cannot be promised there: a pool that sets one
is refused, and the server default is dropped (the sandbox's memory limit
bounds the files instead, each inode living in the sandbox's memory).
"""

from __future__ import annotations

from dataclasses import replace

from sandboxd.backends.base import GVISOR, RUNC, RUNTIMES, IsolationRuntimes, Limits
from sandboxd.errors import BackendError, FailedPrecondition

__all__ = ["available_runtimes", "check_runtime", "fit_limits", "runtime_name", "runtime_refusal"]


def runtime_name(runtime: str) -> str:
    """The runtime a spec names, "" read as RUNC."""
    return runtime or RUNC


async def available_runtimes(backend: object) -> frozenset[str]:
    """The runtimes ``backend`` can start sandboxes under now."""
    if isinstance(backend, IsolationRuntimes):
        return await backend.runtimes()
    return frozenset({RUNC})


async def runtime_refusal(backend: object, runtime: str, explicit: Limits) -> str | None:
    """Why a pool of ``runtime`` with the limits the caller set (``explicit``,
    unresolved) cannot be had on ``backend``; None when it can."""
    if runtime not in RUNTIMES:
        return f"unknown runtime {runtime!r} (one of: {', '.join(RUNTIMES)})"
    if runtime == GVISOR and explicit.max_files:
        return (
            f"runtime {runtime!r} does not enforce a file-count limit (max_files); leave it 0 (the "
            "memory limit bounds the files there) or use runtime 'runc'"
        )
    if runtime == RUNC:
        # Every backend runs runc; asking the backend would make pool creation
        # depend on an API server round trip that tells nothing new.
        return None
    try:
        available = await available_runtimes(backend)
    except BackendError as e:
        return f"cannot tell whether runtime {runtime!r} is available: {e.message}"
    if runtime not in available:
        return (
            f"runtime {runtime!r} is not available on the backend (it has: {', '.join(sorted(available))}); "
            "see the README's isolation section for setting it up"
        )
    return None


async def check_runtime(backend: object, runtime: str, explicit: Limits) -> None:
    """Raises FailedPrecondition naming the runtime when runtime_refusal finds a reason."""
    reason = await runtime_refusal(backend, runtime, explicit)
    if reason is not None:
        raise FailedPrecondition(reason)


def fit_limits(runtime: str, limits: Limits) -> Limits:
    """``limits`` (resolved) as ``runtime`` enforces them: no file-count limit under gVisor."""
    return replace(limits, max_files=0) if runtime == GVISOR else limits
