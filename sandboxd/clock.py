"""Injected clocks. Deadlines, timestamps, sleeps and timeouts in the core all
read one clock, so a test moves time instead of waiting for it (kopf's
looptime idea): on a ``FakeClock`` a sleep or timeout ends when the test
advances the clock past its moment, never on real time."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol


class Clock(Protocol):
    """The time source of the core: two readings, a sleep and a timeout."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; used for deadlines."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch; used for timestamps shown to users."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Returns once ``seconds`` have passed on this clock."""
        ...

    def timeout(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[object]:
        """Like ``asyncio.timeout``, measured on this clock: once ``seconds``
        pass, the block is cancelled and TimeoutError raised; None = never."""
        ...


class SystemClock:
    """The real clocks; sleeps and timeouts run on the event loop's time."""

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def time(self) -> float:
        """``time.time()``."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep(seconds)``."""
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[object]:
        """``asyncio.timeout(seconds)``."""
        return asyncio.timeout(seconds)


class _Timer:
    """A callback due at a moment of a FakeClock."""

    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that moves only when a test says so (``advance``); sleeps and
    timeouts on it end when it passes their moment. ``advance`` is called
    from the event loop that runs them."""

    def __init__(self, start: float = 1_000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._timers: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        """The fake moment."""
        return self._now

    def time(self) -> float:
        """The fake moment as wall-clock seconds."""
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Moves the clock on and wakes every sleep and timeout now due."""
        self._now += seconds
        while self._timers and self._timers[0][0] <= self._now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback()

    def _at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        # Timeouts that ended early stay queued until their moment; a loop
        # that arms one per pass without the clock moving must not pile them up.
        if len(self._timers) > 1024:
            live = [t for t in self._timers if not t[2].cancelled]
            if len(live) < len(self._timers) // 2:
                heapq.heapify(live)
                self._timers = live
        return timer

    async def sleep(self, seconds: float) -> None:
        """Returns once the clock has been advanced by ``seconds``."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self._at(self._now + seconds, wake)
        try:
            await woken
        finally:
            timer.cancel()

    def timeout(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[object]:
        """A timeout that expires when the clock is advanced past ``seconds`` from now."""
        return _FakeTimeout(self, seconds)


class _FakeTimeout:
    """``asyncio.timeout`` with its moment on a FakeClock: an open-ended
    asyncio timeout that the clock makes expire, so cancellation and the
    TimeoutError behave exactly as asyncio's."""

    def __init__(self, clock: FakeClock, seconds: float | None) -> None:
        self._clock = clock
        self._seconds = seconds
        self._inner = asyncio.timeout(None)
        self._timer: _Timer | None = None
        self._open = False

    async def __aenter__(self) -> _FakeTimeout:
        await self._inner.__aenter__()
        self._open = True
        if self._seconds is not None:
            if self._seconds <= 0:
                self._expire()
            else:
                self._timer = self._clock._at(self._clock.monotonic() + self._seconds, self._expire)
        return self

    def _expire(self) -> None:
        if self._open:
            self._inner.reschedule(asyncio.get_running_loop().time())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._open = False
        if self._timer is not None:
            self._timer.cancel()
        await self._inner.__aexit__(exc_type, exc, tb)
