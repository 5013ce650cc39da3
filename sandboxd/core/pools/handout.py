"""How a pool hands out its READY sandboxes: oldest first, to acquirers in
the order they came, each getting all it asked for, or at least its
``min_n`` when its deadline comes."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sandboxd.clock import Clock
from sandboxd.core.lifecycle import SandboxRecord, State


class Shortfall(Exception):
    """An acquire's deadline passed before it got what it needed; what it
    had gathered went back to the line."""

    def __init__(self, got: int) -> None:
        super().__init__(f"got {got} sandboxes before the deadline")
        self.got = got


@dataclass
class _Waiter:
    n: int
    min_n: int
    future: asyncio.Future[list[SandboxRecord]]
    since: float = 0.0
    got: list[SandboxRecord] = field(default_factory=list)


class Handout:
    """A pool's READY sandboxes and the acquirers waiting for them.
    ``on_change`` hears of every hand-out and give-back."""

    def __init__(self, clock: Clock, on_change: Callable[[], None]) -> None:
        self._clock = clock
        self._on_change = on_change
        self._ready: deque[SandboxRecord] = deque()
        self._waiters: deque[_Waiter] = deque()

    @property
    def ready(self) -> int:
        """READY sandboxes waiting to be handed out."""
        return len(self._ready)

    @property
    def waiting(self) -> int:
        """Acquirers in line (one that failed counts until it is passed over)."""
        return len(self._waiters)

    def oldest_wait(self) -> float:
        """Seconds the longest-waiting acquirer in line has waited (0 = none waits)."""
        since = [w.since for w in self._waiters if not w.future.done()]
        return max(0.0, self._clock.monotonic() - min(since)) if since else 0.0

    def outstanding(self) -> int:
        """Sandboxes the acquirers in line are still owed."""
        return sum(w.n - len(w.got) for w in self._waiters)

    def records(self) -> list[SandboxRecord]:
        """The READY records, oldest first."""
        return list(self._ready)

    def put(self, rec: SandboxRecord) -> None:
        """Adds a sandbox that just became READY; waiters are served first."""
        self._ready.append(rec)
        self._dispatch()

    def discard(self, rec: SandboxRecord) -> None:
        """Takes ``rec`` out of the READY line, if it is in it."""
        with contextlib.suppress(ValueError):
            self._ready.remove(rec)

    def clear(self) -> None:
        """Empties the READY line (the pool is closing)."""
        self._ready.clear()

    def fail_waiters(self, error: Callable[[], Exception], *, forget: bool = False) -> None:
        """Fails every acquirer still waiting with a fresh ``error()``;
        ``forget`` also empties the line at once."""
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error())
        if forget:
            self._waiters.clear()

    async def acquire(self, n: int, min_n: int, timeout: float) -> list[SandboxRecord]:
        """Takes n READY sandboxes, waiting up to ``timeout`` seconds in line
        for them; at the deadline, at least ``min_n`` (when set) will do.
        Raises Shortfall when neither came in time."""
        if not self._waiters and len(self._ready) >= n:
            taken = [self._ready.popleft() for _ in range(n)]
            self._on_change()
            return taken
        loop = asyncio.get_running_loop()
        waiter = _Waiter(n=n, min_n=min_n, future=loop.create_future(), since=self._clock.monotonic())
        self._waiters.append(waiter)
        self._dispatch()
        self._on_change()
        try:
            async with self._clock.timeout(timeout):
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            if waiter.future.done() and not waiter.future.exception():
                return waiter.future.result()
            self._withdraw(waiter)
            if min_n and len(waiter.got) >= min_n:
                return waiter.got
            got = len(waiter.got)
            self._give_back(waiter.got)
            raise Shortfall(got) from None
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled() and not waiter.future.exception():
                self._give_back(waiter.future.result())
            else:
                self._withdraw(waiter)
                self._give_back(waiter.got)
            raise

    def _dispatch(self) -> None:
        while self._waiters and self._ready:
            waiter = self._waiters[0]
            if waiter.future.done():
                self._waiters.popleft()
                continue
            while self._ready and len(waiter.got) < waiter.n:
                waiter.got.append(self._ready.popleft())
            if len(waiter.got) == waiter.n:
                self._waiters.popleft()
                waiter.future.set_result(waiter.got)

    def _withdraw(self, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        if not waiter.future.done():
            waiter.future.cancel()

    def _give_back(self, records: list[SandboxRecord]) -> None:
        # Never handed to a client, so still clean: back to the front of the line.
        for rec in reversed(records):
            if rec.state is State.READY:
                self._ready.appendleft(rec)
        records.clear()
        self._dispatch()
        self._on_change()
