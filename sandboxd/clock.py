"""Injected clocks, so lease expiry and waits can be tested without sleeping."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; used for deadlines."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch; used for timestamps shown to users."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when a test says so; waiters registered with
    ``wait_until`` wake when it passes their moment."""

    def __init__(self, start: float = 1_000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._changed = asyncio.Event()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._changed.set()
        self._changed = asyncio.Event()
