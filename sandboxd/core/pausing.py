"""Pause and resume of leased sandboxes: their processes frozen (no CPU) and
thawed, memory and lease kept. Only backends that can (LiveCheckpoints) and
runtimes they can do it for; the rest are refused naming which. While a
sandbox is paused the registry refuses exec, files and snapshots of it
(SandboxRecord.paused); its lease still expires unless heartbeated."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sandboxd.backends.base import LiveCheckpoints
from sandboxd.core import validation as v
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.errors import FailedPrecondition, NotFound

if TYPE_CHECKING:
    from sandboxd.core.control import ControlPlane


def live_backend(control: ControlPlane, rec: SandboxRecord, what: str) -> LiveCheckpoints:
    """The backend as LiveCheckpoints for ``rec``; FailedPrecondition naming
    the backend or the pool's runtime when it cannot ``what`` it."""
    backend = control.backend
    pool = control.registry.pools.get(rec.pool)
    runtime = pool.config.runtime if pool is not None else ""
    if not isinstance(backend, LiveCheckpoints):
        kind = type(backend).__name__.removesuffix("Backend").lower() or "this"
        raise FailedPrecondition(
            f"cannot {what} sandbox {rec.sandbox_id}: the {kind} backend cannot checkpoint or pause a "
            "running sandbox (only Docker with the gVisor runtime can); file snapshots work everywhere"
        )
    refusal = backend.live_refusal(runtime)
    if refusal:
        raise FailedPrecondition(f"cannot {what} sandbox {rec.sandbox_id}: {refusal}")
    return backend


class Pausing:
    """Pause and Resume of the current tenant's leased sandboxes, one
    transition at a time per sandbox."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control
        self._locks: dict[str, asyncio.Lock] = {}

    def _leased(self, sandbox_id: str) -> SandboxRecord:
        v.object_id("sandbox_id", sandbox_id, "sandbox")
        rec = self._control.get_sandbox(sandbox_id)
        if rec.state in (State.RELEASING, State.FAILED):
            raise NotFound(f"sandbox {sandbox_id} was {rec.failure_reason or 'released'}")
        if rec.state is not State.LEASED:
            raise FailedPrecondition(
                f"sandbox {sandbox_id} is {rec.state.name}, not LEASED; acquire it first"
            )
        return rec

    async def pause(self, sandbox_id: str) -> SandboxRecord:
        """Freezes the sandbox (a paused one stays so)."""
        rec = self._leased(sandbox_id)
        backend = live_backend(self._control, rec, "pause")
        async with self._lock(sandbox_id):
            if not rec.paused:
                with self._control.using(rec):
                    await backend.pause(rec.handle)
                rec.paused = True
        return rec

    async def resume(self, sandbox_id: str) -> SandboxRecord:
        """Thaws the sandbox (a running one stays so)."""
        rec = self._leased(sandbox_id)
        backend = live_backend(self._control, rec, "resume")
        async with self._lock(sandbox_id):
            if rec.paused:
                with self._control.using(rec):
                    await backend.resume(rec.handle)
                rec.paused = False
        return rec

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        for sid in [
            s for s, lock in self._locks.items() if not lock.locked() and not self._control.is_live(s)
        ]:
            del self._locks[sid]
        return self._locks.setdefault(sandbox_id, asyncio.Lock())
