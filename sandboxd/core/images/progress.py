"""What the image cache tells watchers about its pulls and builds."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

QUEUED = "queued"
PULLING = "pulling"
DONE = "done"
FAILED = "failed"


@dataclass(frozen=True)
class PullProgress:
    """One pull (or build) in flight or recently ended, as ``WatchPool`` and
    ``sandboxd status`` show it."""

    image: str
    state: str
    """QUEUED (waiting for a pull slot), PULLING, DONE or FAILED."""
    bytes_done: int
    bytes_total: int
    """0 = not known yet."""
    started: float
    """When the pull was asked for, on the cache's clock (monotonic)."""
    detail: str = ""
    """The engine's latest word on it, or the error of a failed one."""

    def describe(self) -> str:
        """One line for a message or a status listing, e.g. "pulling 12.0 of 80.5 MB"."""
        if self.bytes_total:
            done = f"{self.bytes_done / 1e6:.1f} of {self.bytes_total / 1e6:.1f} MB"
        elif self.bytes_done:
            done = f"{self.bytes_done / 1e6:.1f} MB"
        else:
            done = "nothing fetched yet"
        text = f"{self.state}, {done}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass
class Flight:
    """One pull in progress, shared by every caller waiting for its image."""

    image: str
    started: float
    task: asyncio.Task[None] | None = None
    state: str = QUEUED
    bytes_done: int = 0
    bytes_total: int = 0
    detail: str = ""
    waiters: int = 0

    def view(self) -> PullProgress:
        """What watchers are shown of it."""
        return PullProgress(
            self.image, self.state, self.bytes_done, self.bytes_total, self.started, self.detail
        )
