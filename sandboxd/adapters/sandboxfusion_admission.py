"""Admission of ``/run_code`` programs to the sandbox host's CPUs.

SandboxFusion's compile and run time limits are wall-clock. Programs started
all at once on a host with fewer cores share them: a compile that takes two
seconds alone runs out of its ten at eight at once on two cores, and the
program is graded ``Failed`` for the service's crowding rather than its own
doing. So at most ``limit`` requests (default: the sandbox host's CPUs) run
their programs at once; the others wait in arrival order. A request takes its
run slot once it holds a prepared sandbox and keeps it through its compile and
its run, so neither limit starts before the slot is granted: the wait does not
count against them.

The wait is bounded by the request's own deadline (run-code's
``acquire_timeout`` from the request's arrival, shared with the wait for a
sandbox). Past it the request is refused as ``ResourceExhausted`` with a retry
hint (how long the queue ahead of it takes to drain at the measured hold time),
which run-code answers HTTP 504 with ``Retry-After``: the status verl retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from sandboxd import errors
from sandboxd.client import AsyncClient

__all__ = ["AdmissionStats", "RunSlots", "host_cpus"]

log = logging.getLogger(__name__)

# Weight of the newest hold in the moving mean behind the retry hint.
_HOLD_WEIGHT = 0.2
# The hold assumed before any was measured: a short program's.
_FIRST_HOLD = 1.0
# The shortest retry hint: sooner would find the queue as it was.
_MIN_RETRY = 1.0


@dataclass
class AdmissionStats:
    """How requests got their run slot: what the queue cost them."""

    admitted: int = 0
    """Requests that got a run slot."""
    waited: int = 0
    """Of those, the ones that found every slot taken and queued."""
    refused: int = 0
    """Requests whose deadline passed in the queue (answered 504)."""
    wait_seconds: float = 0.0
    """Seconds spent queued, all admitted requests together."""


async def host_cpus(client: AsyncClient, pool: str) -> int:
    """The CPUs of the host (or cluster) that runs ``pool``'s sandboxes, as the server's
    pre-flight reports its capacity; this host's CPUs when the server cannot tell."""
    try:
        report = await client.preflight(concurrent=1, pool=pool)
    except errors.SandboxdError as e:
        log.warning("pool %s: the sandbox host's CPUs are unknown (%s); using this host's", pool, e.message)
        return os.cpu_count() or 1
    if report.capacity.cpus <= 0:
        log.warning("pool %s: the server reports no CPU count; using this host's", pool)
        return os.cpu_count() or 1
    return int(report.capacity.cpus)


class RunSlots:
    """At most ``limit`` holders at once, the rest served first come first served.

    ``limit`` > 0 is fixed; 0 is found by ``resolve`` on first use (the sandbox
    host's CPUs); < 0 admits every request at once."""

    def __init__(self, limit: int = 0, resolve: Callable[[], Awaitable[int]] | None = None) -> None:
        if limit == 0 and resolve is None:
            raise ValueError("RunSlots(limit=0) needs resolve: the call that finds the limit")
        self._limit = limit
        self._resolve = resolve
        self._resolving: asyncio.Lock | None = None
        self._running = 0
        self._queue: deque[asyncio.Future[None]] = deque()
        self._hold = _FIRST_HOLD
        self.stats = AdmissionStats()

    @property
    def limit(self) -> int:
        """Requests that may run at once (0 while not yet resolved, < 0: no limit)."""
        return self._limit

    @property
    def running(self) -> int:
        """Requests holding a run slot now."""
        return self._running

    @property
    def queued(self) -> int:
        """Requests waiting for one."""
        return sum(1 for f in self._queue if not f.done())

    async def _ensure_limit(self) -> None:
        if self._limit != 0 or self._resolve is None:
            return
        if self._resolving is None:
            self._resolving = asyncio.Lock()
        async with self._resolving:
            if self._limit == 0:
                self._limit = max(1, await self._resolve())
                log.info("run-code runs at most %d programs at once", self._limit)

    def retry_after(self) -> float:
        """Seconds until a request arriving now could expect a slot: the queue ahead of
        it drained at the measured hold time."""
        if self._limit < 0:
            return _MIN_RETRY
        rounds = (self.queued + 1) / max(self._limit, 1)
        return max(_MIN_RETRY, math.ceil(rounds * self._hold))

    @contextlib.asynccontextmanager
    async def hold(self, deadline: float) -> AsyncIterator[float]:
        """Holds a run slot for the block; yields the seconds waited for it. Waits at
        most until ``deadline`` (the loop's clock), then raises ``ResourceExhausted``
        with ``retry_after``."""
        await self._ensure_limit()
        loop = asyncio.get_running_loop()
        waited = await self._acquire(deadline)
        held = loop.time()
        try:
            yield waited
        finally:
            self._hold += _HOLD_WEIGHT * ((loop.time() - held) - self._hold)
            self._release()

    async def _acquire(self, deadline: float) -> float:
        loop = asyncio.get_running_loop()
        if self._limit < 0 or (self._running < self._limit and not self.queued):
            self._running += 1
            self.stats.admitted += 1
            return 0.0
        start = loop.time()
        granted: asyncio.Future[None] = loop.create_future()
        self._queue.append(granted)
        try:
            await asyncio.wait_for(asyncio.shield(granted), max(0.0, deadline - start))
        except (TimeoutError, asyncio.CancelledError) as e:
            with contextlib.suppress(ValueError):
                self._queue.remove(granted)
            if granted.done() and not granted.cancelled():
                # Granted as it gave up: the slot goes on to the next in line.
                self._release()
            else:
                granted.cancel()
            if isinstance(e, asyncio.CancelledError):
                raise
            self.stats.refused += 1
            raise errors.ResourceExhausted(
                f"no run slot within the request's deadline: {self._running} programs run at once "
                f"(the sandbox host's CPU allows {self._limit}) and {self.queued} requests wait; "
                "retry later, or serve fewer requests at once",
                retry_after=self.retry_after(),
            ) from None
        waited = loop.time() - start
        self.stats.admitted += 1
        self.stats.waited += 1
        self.stats.wait_seconds += waited
        return waited

    def _release(self) -> None:
        self._running -= 1
        while self._queue and (self._limit < 0 or self._running < self._limit):
            nxt = self._queue.popleft()
            if not nxt.done():
                self._running += 1
                nxt.set_result(None)
