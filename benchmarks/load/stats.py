"""Percentiles, the run's bounds, and the recorder every operation goes through."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

MAX_ERROR_SAMPLES = 20


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; NaN when empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], not {q}")
    if not samples:
        return math.nan
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary_ms(samples_s: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean, p50, p90, p99, max in milliseconds (None when there are no samples)."""
    if not samples_s:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    ms = [s * 1000.0 for s in samples_s]
    return {
        "n": len(ms),
        "mean": round(sum(ms) / len(ms), 3),
        "p50": round(percentile(ms, 50), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
        "max": round(max(ms), 3),
    }


class Stopped(Exception):
    """The run hit its time or request bound: wind down (release what is held)."""


class OpFailed(Exception):
    """An operation failed (already recorded); the episode gives up."""


@dataclass
class Bounds:
    """The run's hard limits. ``stop`` is set when either is reached; episodes
    then skip their remaining work and release what they hold (releases are
    cleanup: counted, but never refused)."""

    max_seconds: float
    max_requests: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    requests: int = 0
    stopped_by: str = ""

    def take(self) -> None:
        """Counts one request; raises Stopped when the run must end."""
        if self.stop.is_set():
            raise Stopped(self.stopped_by)
        if self.requests >= self.max_requests:
            self.halt("max_requests")
            raise Stopped(self.stopped_by)
        self.requests += 1

    def halt(self, why: str) -> None:
        if not self.stop.is_set():
            self.stopped_by = why
            self.stop.set()


@dataclass
class Recorder:
    """Latencies per operation, errors per typed reason, and the bounds."""

    bounds: Bounds
    classify: Callable[[BaseException], str]
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    clock: Callable[[], float] = time.perf_counter

    def error(self, op: str, reason: str, detail: str = "") -> None:
        self.errors[reason] += 1
        if len(self.error_samples) < MAX_ERROR_SAMPLES:
            self.error_samples.append(f"{op}: {reason}{': ' + detail[:300] if detail else ''}")

    async def call(self, op: str, make: Callable[[], Awaitable[T]], *, cleanup: bool = False) -> T:
        """Times one operation. Raises Stopped (bound reached; nothing sent)
        or OpFailed (the error is recorded under its typed reason)."""
        if cleanup:
            self.bounds.requests += 1
        else:
            self.bounds.take()
        t0 = self.clock()
        try:
            result = await make()
        except (Stopped, asyncio.CancelledError):
            raise
        except Exception as e:
            self.error(op, self.classify(e), str(e))
            raise OpFailed(op) from e
        self.latencies.setdefault(op, []).append(self.clock() - t0)
        return result

    def summaries(self) -> dict[str, Any]:
        return {op: summary_ms(xs) for op, xs in sorted(self.latencies.items())}
