"""One pool's demand signals and the scaling policy's memory.

The pool counts its sandboxes; this keeps what the policy needs beyond those
counts: the acquire rate not covered by announcements, the start-up latency
measured, the announcements still due, and the policy's state between passes.
Time is passed in; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable

from sandboxd.core.scaling import (
    Announcement,
    Bounds,
    DecayingRate,
    Ewma,
    Plan,
    PolicyConfig,
    ScalerState,
    Signals,
    consume,
    decide,
)
from sandboxd.core.tuning import PoolTuning


class Demand:
    """What one pool has seen of its demand, and the warm target and keep the
    policy last chose from it."""

    def __init__(self, tuning: PoolTuning, min_ready: int) -> None:
        self._tuning = tuning
        self.warm_target = min_ready
        self.warm_keep = min_ready
        self.plan: Plan | None = None
        self._state = ScalerState()
        self._rate = DecayingRate(tuning.rate_window_seconds)
        self._startup = Ewma(0.5, tuning.startup_estimate_seconds, alpha_down=0.1)
        self.announcements: tuple[Announcement, ...] = ()

    def acquire_rate(self, now: float) -> float:
        """Acquires per second not covered by announcements, smoothed."""
        return self._rate.rate(now)

    def startup_seconds(self, shared: Callable[[], float | None]) -> float:
        """The pool's start-up latency estimate; until it has measured one,
        ``shared`` (an estimate across pools), if that has one."""
        if not self._startup.samples:
            estimate = shared()
            if estimate is not None:
                return estimate
        return self._startup.value

    def started(self, seconds: float) -> None:
        """One backend create of the pool took ``seconds``."""
        self._startup.add(seconds)

    def acquired(self, n: int, now: float) -> None:
        """Counts ``n`` acquires: first against announcements, the rest as rate."""
        self.announcements, covered = consume(self.announcements, n, now)
        if n > covered:
            self._rate.add(n - covered, now)

    def expire(self, now: float) -> None:
        """Drops announcements that are spent or past their lifetime."""
        self.announcements = tuple(a for a in self.announcements if a.remaining > 0 and now < a.expires)

    def replan(self, signals: Signals, bounds: Bounds, policy: PolicyConfig) -> Plan:
        """Runs the policy on ``signals`` and adopts its plan."""
        plan = decide(signals, bounds, policy, self._state)
        self._state = plan.state
        self.plan = plan
        self.warm_target = plan.target
        self.warm_keep = plan.keep
        return plan

    def announce(
        self, source: str, count: int, now: float, in_seconds: float, ttl_seconds: float
    ) -> Announcement | None:
        """Replaces ``source``'s announcement with "``count`` acquires in
        ~``in_seconds``" (0 withdraws it); returns the new one, if any."""
        kept = tuple(a for a in self.announcements if a.source != source)
        made = None
        if count:
            due = now + in_seconds
            made = Announcement(
                source, count, due, due + (ttl_seconds or self._tuning.announcement_ttl_seconds)
            )
            kept += (made,)
        self.announcements = kept
        return made

    def announced(self, source: str) -> int:
        """Acquires still expected from ``source``'s announcement."""
        return sum(a.remaining for a in self.announcements if a.source == source)

    def announced_total(self, now: float) -> int:
        """Acquires still expected from all unexpired announcements."""
        return sum(a.remaining for a in self.announcements if now < a.expires)
