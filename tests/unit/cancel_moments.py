"""Moments at which to cancel a call, spread over that call's own round trip
as measured on this machine. A fixed window (a few milliseconds) put every
cancellation before the answer on a slow or loaded machine, so such a test
proved nothing about a cancellation that comes once the server has granted."""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def round_trip(
    call: Callable[[], Awaitable[T]], settle: Callable[[T], Awaitable[object]], tries: int = 7
) -> float:
    """The median seconds ``call`` takes to answer, each answer handed to
    ``settle`` (a release, say) before the next try."""
    loop = asyncio.get_running_loop()
    took = []
    for _ in range(tries):
        start = loop.time()
        answer = await call()
        took.append(loop.time() - start)
        await settle(answer)
    return statistics.median(took)


def cancel_at(rng: random.Random, trip: float) -> float:
    """Seconds to wait before cancelling: from before the call leaves to well
    after a typical answer, so both sides of the answer are drawn."""
    return rng.uniform(0, 2 * trip)
