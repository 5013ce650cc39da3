"""The reconciler's limits across all pools, and the pacer every backend
create attempt goes through (sandboxd.core.reconciler uses both; a pool sees
neither, only its host)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandboxd.clock import Clock, SystemClock
from sandboxd.settings import PoolSettings


@dataclass(frozen=True)
class Budget:
    """Limits across all pools; 0 = none."""

    max_total: int = 0
    """Sandboxes in any state (releasing included) across pools."""
    max_starting: int = 0
    """Sandboxes starting across pools."""
    create_rate: float = 0.0
    """Backend create attempts per second across pools."""
    create_burst: int = 0
    """Attempts the pacer lets through at once after a quiet spell (0 = one second's worth)."""
    interval: float = 0.5
    """Longest time between two passes."""
    liveness_interval: float = 5.0
    """Seconds between liveness sweeps of READY sandboxes; 0 = none."""
    call_timeout: float = 60.0
    """Longest a destroy or list call may take before it counts as unanswered."""


def budget_from(settings: PoolSettings) -> Budget:
    """The budget the server's pool settings ask for."""
    return Budget(
        max_total=settings.max_total_sandboxes,
        max_starting=settings.max_total_starting,
        create_rate=settings.max_create_rate,
        interval=settings.reconcile_interval_seconds,
        liveness_interval=settings.liveness_interval_seconds,
        call_timeout=settings.create_timeout_seconds,
    )


class Pacer:
    """A leaky bucket for backend create attempts: at most ``rate`` a second,
    with ``burst`` let through at once after a quiet spell. Callers queue in
    order. On the system clock in a server, so it paces the real engine."""

    def __init__(self, rate: float, burst: int = 0, clock: Clock | None = None) -> None:
        self.rate = rate
        self.burst = max(1, burst or math.ceil(rate))
        self._clock: Clock = clock or SystemClock()
        self._tat = 0.0
        self.waited = 0

    def reserve(self) -> float:
        """Takes the next slot; returns how long to wait for it."""
        if self.rate <= 0:
            return 0.0
        interval = 1.0 / self.rate
        now = self._clock.monotonic()
        tat = max(self._tat, now - (self.burst - 1) * interval)
        self._tat = tat + interval
        return max(0.0, tat - now)

    async def wait(self) -> None:
        """Waits for the next slot."""
        delay = self.reserve()
        if delay > 0:
            self.waited += 1
            await self._clock.sleep(delay)
