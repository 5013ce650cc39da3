"""Where a warm pool's sandboxes go when they leave their lease or the pool:
destroyed in the background (released, scaled down, lost), or, in a
recycling pool, reset in place and READY again (sandboxd.core.pools.recycle).
Mixed into WarmPool, which owns the state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sandboxd.backends.base import Backend
from sandboxd.clock import Clock
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.core.meters import PoolMeters
from sandboxd.core.pools.config import PoolConfig
from sandboxd.core.pools.demand import Demand
from sandboxd.core.pools.host import PoolHost
from sandboxd.core.pools.indoubt import destroy_or_book
from sandboxd.core.pools.lines import ImageLines
from sandboxd.core.pools.prefetch import PoolImages
from sandboxd.core.pools.recycle import RUN_KEEP_SECONDS, Recycler, RunReserve


class PoolReleasing:
    """Release, trim, loss and destruction of one pool's sandboxes, and their recycling."""

    config: PoolConfig
    records: dict[str, SandboxRecord]
    resetting: int
    _backend: Backend
    _clock: Clock
    _host: PoolHost[Any]
    _meters: PoolMeters
    _lines: ImageLines
    _demand: Demand
    _images: PoolImages
    _recycler: Recycler
    _run_reserve: RunReserve
    _leaving: set[str]
    _lost: int
    _closed: bool
    _call_timeout: float
    _creates: set[asyncio.Task[None]]
    _destroys: set[asyncio.Task[None]]
    _reset_gate: asyncio.Semaphore
    _on_change: Callable[[SandboxRecord], None]

    if TYPE_CHECKING:

        def poke(self) -> None: ...  # WarmPool's

        def _notify(self) -> None: ...  # WarmPool's

        def _occupied(self) -> int: ...  # PoolFigures'

        @staticmethod
        def _spawn(coro: Coroutine[Any, Any, None], into: set[asyncio.Task[None]]) -> None: ...

    def release(self, rec: SandboxRecord, reason: str = "") -> None:
        """Destroys a leased sandbox in the background, or in a recycling pool
        resets it in place when nothing of it is in doubt; the pool refills."""
        if rec.state not in (State.LEASED, State.READY):
            return
        why_not = self._recycler.why_not(rec) if not self._closed else "closing"
        if rec.state is State.READY:
            self._discard_ready(rec)
        was_leased = rec.state is State.LEASED
        rec.move(State.RELEASING, self._clock.time(), reason)
        if was_leased and self._recycler.enabled and why_not:
            self._recycler.note_destroyed(why_not)
        if was_leased and not why_not:
            rec.uses += 1
            rec.recycle_key = self._recycler.key_of(rec.labels)
            self.resetting += 1
            # Counted with the creates of its image: it comes back READY, so
            # a waiter's shortfall must not start a create for it as well.
            self._lines.creating[rec.image] += 1
            self._on_change(rec)
            self._spawn(self._recycle(rec), self._destroys)
            self.poke()
            return
        self._leaving.add(rec.sandbox_id)
        self._on_change(rec)
        self._spawn(self._destroy(rec), self._destroys)
        self.poke()

    async def _recycle(self, rec: SandboxRecord) -> None:
        doubt = "closing"
        try:
            # At most max_starting resets at once, as for creates: a burst of
            # releases all reset together would only slow every one of them
            # (and the engine's answers to the rollouts still running).
            async with self._reset_gate:
                if not self._closed:
                    doubt = await self._recycler.reset(rec)
        finally:
            self.resetting -= 1
            self._lines.creating[rec.image] -= 1
            if doubt or self._closed:
                self._leaving.add(rec.sandbox_id)
                self.poke()
        if doubt or self._closed:
            await self._destroy(rec)
            return
        # A reset is a start the pool did not pay a create for.
        self._demand.started(self._recycler.last_reset_seconds())
        rec.move(State.READY, self._clock.time())
        self._on_change(rec)
        if self._recycler.by_run:
            self._run_reserve.put(rec, self._clock.monotonic())
        else:
            self._lines.put(rec)
        self.poke()

    def _discard_ready(self, rec: SandboxRecord) -> None:
        if not self._run_reserve.discard(rec):
            self._lines.discard(rec)

    def expire_reserved(self, now: float) -> int:
        """Destroys same-run sandboxes whose run has not come back for them in
        time, and those that stand in the way of other runs' waiters (the
        pool at max_size); returns how many."""
        doomed = self._run_reserve.expired(now, self.config.idle_seconds or RUN_KEEP_SECONDS)
        if self._lines.waiting and self._occupied() >= self.config.max_size:
            doomed += self._run_reserve.oldest(self._lines.outstanding())
        for rec in doomed:
            # Out of the reserve already: release() finds it READY and destroys it.
            self._recycler.note_destroyed("run gone")
            self.release(rec, "its run did not come back for it")
        return len(doomed)

    def trim(self, n: int) -> int:
        """Destroys up to ``n`` READY sandboxes (the newest first), as the
        policy scales the pool down; returns how many."""
        doomed = self._lines.victims(n) if n > 0 else []
        for rec in doomed:
            self.release(rec, "scaled down")
        return len(doomed)

    def fail(self, rec: SandboxRecord, reason: str) -> None:
        """Marks a sandbox lost; it is cleaned up and the pool replaces it."""
        if rec.state not in (State.LEASED, State.READY):
            return
        kind = "died_warm" if rec.state is State.READY else "lost_leased"
        if rec.state is State.READY:
            self._discard_ready(rec)
        rec.move(State.FAILED, self._clock.time(), reason)
        self._leaving.add(rec.sandbox_id)
        self._lost += 1
        self._meters.sandbox_failures.add(1, {"pool": self.config.name, "reason": kind})
        self._on_change(rec)
        self._spawn(self._destroy(rec), self._destroys)
        self.poke()

    async def _destroy(self, rec: SandboxRecord) -> None:
        if rec.state in (State.READY, State.LEASED):
            rec.move(State.RELEASING, self._clock.time())
        self._leaving.add(rec.sandbox_id)
        try:
            if rec.handle:
                await destroy_or_book(self._backend, self._clock, self._host, self._call_timeout, rec)
        finally:
            rec.move(State.GONE, self._clock.time())
            if self.records.pop(rec.sandbox_id, None) is not None:
                self._images.unuse(rec.image)
            self._leaving.discard(rec.sandbox_id)
            self._on_change(rec)
            self.poke()

    async def drain(self) -> None:
        """Waits for background creates, resets and destroys (tests, shutdown)."""
        while self._creates or self._destroys:
            await asyncio.gather(*self._creates, *self._destroys, return_exceptions=True)
