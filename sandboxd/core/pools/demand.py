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
    active_announcements,
    announced_images,
    consume,
    decide,
    image_targets,
)
from sandboxd.core.tuning import PoolTuning


class Demand:
    """What one pool has seen of its demand, and the warm target and keep the
    policy last chose from it."""

    def __init__(self, tuning: PoolTuning, min_ready: int, image: str = "") -> None:
        self._tuning = tuning
        self._image = image
        self._min_ready = min_ready
        self.warm_target = min_ready
        self.warm_keep = min_ready
        self.targets: dict[str, int] = {image: min_ready} if min_ready else {}
        """The warm target split over images (the pool's own image included)."""
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

    def acquired(self, n: int, now: float, image: str = "") -> None:
        """Counts ``n`` acquires (of ``image``, "" = the pool's own): first
        against announcements, the rest as rate."""
        self.announcements, covered = consume(self.announcements, n, now, image)
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
        active = active_announcements(signals, policy, plan.state.warming)
        self.targets = image_targets(plan.target, announced_images(active), self._image, bounds.min_ready)
        return plan

    def wanted_images(self, now: float) -> dict[str, int]:
        """Acquires expected per named image from every unexpired announcement,
        due or not (what is worth pulling ahead)."""
        return announced_images([a for a in self.announcements if now < a.expires])

    def announce(
        self,
        source: str,
        count: int,
        now: float,
        in_seconds: float,
        ttl_seconds: float,
        images: tuple[tuple[str, int], ...] = (),
    ) -> Announcement | None:
        """Replaces ``source``'s announcement with "``count`` acquires in
        ~``in_seconds``, ``images`` saying how many of which image" (0
        withdraws it); returns the new one, if any."""
        kept = tuple(a for a in self.announcements if a.source != source)
        made = None
        if count:
            due = now + in_seconds
            made = Announcement(
                source, count, due, due + (ttl_seconds or self._tuning.announcement_ttl_seconds), images
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
