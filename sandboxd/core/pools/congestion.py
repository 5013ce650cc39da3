"""How hard the engine may be pushed: a start window and the engine's
health, both fed by the latency of every create, destroy and list call.

Like TCP congestion control, the window of starts in flight moves with what
the engine answers rather than sitting at a fixed ``max_starting``:

- it starts at ``initial`` (the pools' ``max_starting``) and, while starts
  queue up behind it (it binds) and creates answer within ``grow_factor``
  times the fastest create seen lately, grows: one per success up to the last
  cut's threshold (slow start), then one per window's worth of successes
  (additive increase), up to ``most``;
- between that and slow it holds: the engine is busy, and more starts at once
  would only make each one slower (a CPU-bound engine's create time grows with
  the starts it runs);
- a slow or timed-out call halves it (multiplicative decrease), at most once
  per round trip, so one slow burst costs one cut.

The engine measured in ENGINE-LIMITS accepts far more than it can serve and,
pushed past that, wedges for good; growing only while creates stay fast, and
backing off early, is what keeps it answering.

A call that times out marks the engine *degraded* (with the reason) and pins
the window to one start at a time; a run of fast calls recovers it.
"""

from __future__ import annotations

import enum
import math
from collections import deque
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
    initial: int = 0
    """Starts in flight before anything is known; 0 = the static bound the
    first ``limit`` call names (the pools' ``max_starting``)."""
    most: int = 64
    """The window never grows past this (0 = ``initial``: a fixed window unless cut)."""
    grow_factor: float = 1.5
    """The window grows only while a create answers within this many times
    the fastest create of the last ``fastest_seconds``."""
    fastest_seconds: float = 120.0


class _RecentMinimum:
    """The smallest sample of the last ``span`` seconds (a monotone deque)."""

    def __init__(self, span: float) -> None:
        self._span = span
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, now: float, value: float) -> None:
        while self._samples and self._samples[-1][1] >= value:
            self._samples.pop()
        self._samples.append((now, value))

    def value(self, now: float) -> float | None:
        while self._samples and now - self._samples[0][0] > self._span:
            self._samples.popleft()
        return self._samples[0][1] if self._samples else None


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
        self.window = float(self.config.initial)
        """Starts allowed in flight across pools (0 until the first ``limit``)."""
        self._initial = max(1, self.config.initial)
        self._threshold = math.inf
        self._last_cut = -math.inf
        self._baseline = Ewma(0.2, 0.0)
        self._fastest = _RecentMinimum(self.config.fastest_seconds)
        self._fast_run = 0
        self.degraded = False
        self.reason = ""
        """Why the engine is degraded (or was last slow); "" once healthy."""
        self.degraded_by: Call | None = None
        """The call whose time-out degraded the engine last."""
        self.degraded_since = 0.0
        self.degraded_seconds_total = 0.0
        """Seconds spent degraded, over finished spells."""
        self.cuts = 0
        self.grows = 0
        self.timeouts = 0
        self.on_change: Callable[[bool], None] = lambda degraded: None
        """Hears each change between degraded (True) and healthy (False)."""

    # -- what the pools may do -------------------------------------------------

    @property
    def most(self) -> int:
        """The largest window the engine may reach."""
        return max(self.config.most, self._initial, 1)

    def limit(self, initial: int, ceiling: int = 0) -> int:
        """Starts allowed in flight across pools, within the hard ``ceiling``
        (0 = none); ``initial``: the window before anything is known."""
        if not self.cuts and self.window < initial:
            # Until the engine has shown strain, every pool's max_starting
            # counts (a pool added later brings its own).
            self._initial = max(1, initial)
            self.window = float(self._initial)
        allowed = max(1, int(self.window))
        return min(allowed, ceiling) if ceiling else allowed

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
        if call is Call.CREATE:
            # In flight now excludes this create; the window bound if the
            # others and this one filled it.
            binding = bool(self.window) and self._in_flight() + 1 >= int(self.window)
            self._fastest.add(self._now(), seconds)
            fastest = self._fastest.value(self._now()) or seconds
            if not self.degraded and binding and seconds <= self.config.grow_factor * fastest:
                self._grow()

    def timed_out(self, call: Call, after: float) -> None:
        """A call that did not answer within ``after`` seconds: the engine is degraded."""
        self.timeouts += 1
        self._fast_run = 0
        self.reason = f"{call.value} calls time out (no answer in {after:g}s)"
        self.degraded_by = call
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

    def _grow(self) -> None:
        if self.window >= self.most:
            return
        if self.window < self._threshold:
            self.window += 1.0  # slow start: doubles per round trip up to the threshold
        else:
            self.window += 1.0 / self.window
        self.window = min(self.window, float(self.most))
        self.grows += 1

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
        # The window only grows while it binds, so it is what was in flight
        # (before the first limit() there is no window: what is in flight).
        current = self.window or float(max(1, self._in_flight()))
        self.window = max(1.0, current / 2)
        self._threshold = self.window
        self._last_cut = now
        self.cuts += 1


def engine_gauges(meter: Meter, health: EngineHealth, **values: Callable[[], float]) -> None:
    """Exports the engine's state: ``degraded`` (labelled with the call that
    timed out), start ``window``, sandboxes ``in_doubt`` and host
    ``capacity``, each read when scraped."""
    described = {
        "window": (
            "sandboxd_engine_start_window",
            "Starts allowed in flight across pools (grows while creates stay fast, halves when slow).",
        ),
        "in_doubt": ("sandboxd_sandboxes_in_doubt", "Sandboxes whose create or destroy got no answer."),
        "capacity": ("sandboxd_host_capacity_sandboxes", "Sandboxes the host is estimated to hold."),
    }

    def observe(read: Callable[[], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda options: [Observation(read())]

    def degraded(options: CallbackOptions) -> Iterable[Observation]:
        if health.degraded and health.degraded_by is not None:
            # The call, not the reason's text: a label must have few values.
            return [Observation(1.0, {"call": health.degraded_by.value})]
        return [Observation(0.0)]

    meter.create_observable_gauge(
        "sandboxd_engine_degraded",
        callbacks=[degraded],
        description="1 while engine calls time out, labelled with the call (create, destroy, list).",
    )
    for key, read in values.items():
        name, description = described[key]
        meter.create_observable_gauge(name, callbacks=[observe(read)], description=description)
