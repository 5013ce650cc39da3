"""How hard the engine may be pushed: an AIMD start window and the engine's
health, both fed by the latency of every create, destroy and list call.

Like TCP congestion control: while calls stay fast the window of starts in
flight grows by about one per window's worth of successes (additive
increase); a slow or timed-out call halves it (multiplicative decrease), at
most once per round trip, so one slow burst costs one cut. The engine
measured in ENGINE-LIMITS accepts far more than it can serve and, pushed past
that, wedges for good; backing off early is what keeps it answering.

A call that times out marks the engine *degraded* (with the reason) and pins
the window to one start at a time; a run of fast calls recovers it. The
window only binds once the engine has shown strain: until then, and once it
has grown back to the static bounds, ``limit`` is None and the static
``max_starting`` bounds alone apply.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from sandboxd.core.scaling import Ewma


class Call(enum.Enum):
    """Which engine call an observation is about."""

    CREATE = "create"
    DESTROY = "destroy"
    LIST = "list"


@dataclass(frozen=True)
class CongestionConfig:
    """When a call counts as slow, and how the window moves."""

    slow_seconds: float = 10.0
    """A call slower than this is congestion, whatever the baseline."""
    slow_factor: float = 4.0
    """... and so is one slower than this many times the fast baseline (when above ``floor_seconds``)."""
    floor_seconds: float = 2.0
    """Calls faster than this are never slow (the baseline of an idle engine is tiny)."""
    recover_after: int = 3
    """Fast calls in a row that end a degraded spell."""


class EngineHealth:
    """The engine's start window and health, shared by every pool (the
    reconciler holds one). ``in_flight()`` counts starts in flight now."""

    def __init__(
        self,
        clock_now: Callable[[], float],
        in_flight: Callable[[], int],
        config: CongestionConfig | None = None,
    ) -> None:
        self._now = clock_now
        self._in_flight = in_flight
        self.config = config or CongestionConfig()
        self.window: float | None = None
        """Starts allowed in flight; None = only the static bounds apply."""
        self._threshold = math.inf
        self._last_cut = -math.inf
        self._baseline = Ewma(0.2, 0.0)
        self._fast_run = 0
        self.degraded = False
        self.reason = ""
        """Why the engine is degraded (or was last slow); "" once healthy."""
        self.degraded_since = 0.0
        self.degraded_seconds_total = 0.0
        """Seconds spent degraded, over finished spells."""
        self.cuts = 0
        self.timeouts = 0
        self.on_change: Callable[[bool], None] = lambda degraded: None
        """Hears each change between degraded (True) and healthy (False)."""

    # -- what the pools may do -------------------------------------------------

    def limit(self, ceiling: int) -> int | None:
        """Starts allowed in flight across pools, given the static
        ``ceiling`` (0 = none); None = no limit beyond it."""
        if self.window is None:
            return None
        if ceiling and self.window >= ceiling and not self.degraded:
            # Grown back to the static bound: the engine copes with it again.
            self.window = None
            self._threshold = math.inf
            return None
        return max(1, int(self.window))

    def degraded_for(self) -> float:
        """Seconds of the current degraded spell (0 when healthy)."""
        return max(0.0, self._now() - self.degraded_since) if self.degraded else 0.0

    def describe(self) -> str:
        """One line for status and refusals: "" when healthy."""
        if not self.degraded:
            return ""
        return f"engine degraded for {self.degraded_for():.0f}s: {self.reason}"

    # -- what the calls say ------------------------------------------------------

    def observe(self, call: Call, seconds: float) -> None:
        """A call that answered after ``seconds``."""
        if self._is_slow(seconds):
            self._fast_run = 0
            self.reason = f"{call.value} took {seconds:.1f}s"
            self._cut(seconds)
            return
        self._baseline.add(seconds)
        self._fast_run += 1
        if self.degraded and self._fast_run >= self.config.recover_after:
            self.degraded_seconds_total += self.degraded_for()
            self.degraded = False
            self.reason = ""
            self.on_change(False)
        if call is Call.CREATE and self.window is not None and not self.degraded:
            if self.window < self._threshold:
                self.window += 1.0  # slow start: doubles per round trip up to the threshold
            else:
                self.window += 1.0 / self.window

    def timed_out(self, call: Call, after: float) -> None:
        """A call that did not answer within ``after`` seconds: the engine is degraded."""
        self.timeouts += 1
        self._fast_run = 0
        self.reason = f"{call.value} calls time out (no answer in {after:g}s)"
        if not self.degraded:
            self.degraded = True
            self.degraded_since = self._now()
            self.on_change(True)
        self._cut(after, force=True)
        self.window = 1.0

    def failed(self) -> None:
        """A call the engine answered with an error: not latency, but no success either."""
        self._fast_run = 0

    # -- internals ---------------------------------------------------------------

    def _is_slow(self, seconds: float) -> bool:
        c = self.config
        if seconds <= c.floor_seconds:
            return False
        if seconds > c.slow_seconds:
            return True
        return bool(self._baseline.samples) and seconds > c.slow_factor * max(self._baseline.value, 0.01)

    def _cut(self, seconds: float, *, force: bool = False) -> None:
        now = self._now()
        # One cut per round trip: the calls of one slow burst all answer late
        # together, and halving once per answer would collapse the window.
        if not force and now - self._last_cut < max(1.0, self._baseline.value):
            return
        current = self.window if self.window is not None else float(max(1, self._in_flight()))
        self.window = max(1.0, current / 2)
        self._threshold = self.window
        self._last_cut = now
        self.cuts += 1


def engine_gauges(meter: Meter, **values: Callable[[], float]) -> None:
    """Exports the engine's state: ``degraded``, start ``window``, sandboxes
    ``in_doubt`` and host ``capacity``, each read when scraped."""
    described = {
        "degraded": ("sandboxd_engine_degraded", "1 while engine calls time out."),
        "window": (
            "sandboxd_engine_start_window",
            "Starts allowed in flight (AIMD; 0 = static bounds only).",
        ),
        "in_doubt": ("sandboxd_sandboxes_in_doubt", "Sandboxes whose create or destroy got no answer."),
        "capacity": ("sandboxd_host_capacity_sandboxes", "Sandboxes the host is estimated to hold."),
    }

    def observe(read: Callable[[], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda options: [Observation(read())]

    for key, read in values.items():
        name, description = described[key]
        meter.create_observable_gauge(name, callbacks=[observe(read)], description=description)
