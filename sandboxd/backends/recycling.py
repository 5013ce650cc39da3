"""The backend's part of recycling a sandbox: a baseline taken before any
tenant runs, and a reset in place against it (sandboxd.sandbox_reset holds
the steps and the verdict; sandboxd.core.pools.recycle decides when)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sandboxd.sandbox_reset import Baseline, ResetReport


@runtime_checkable
class InPlaceReset(Protocol):
    """A backend that can reset a used sandbox in place instead of destroying it."""

    async def take_baseline(self, handle: str, timeout: float) -> Baseline:
        """The sandbox as it is now (before any tenant ran). BackendError when
        the step fails or runs past ``timeout`` seconds."""
        ...

    async def reset_in_place(self, handle: str, baseline: Baseline, timeout: float) -> ResetReport:
        """Ends the sandbox's shells and sessions, kills every process but
        its own, removes every path of its writable mounts that ``baseline``
        does not list and every IPC object of its user, reports what it
        found, and leaves a fresh spare shell (its health check) in place.
        BackendError when the step fails or runs past ``timeout`` seconds;
        the caller destroys the sandbox then."""
        ...
