"""The throughput-matching figures (shared/design/RL-INTEGRATION.md): windowed
rates and time splits on an injected clock, and staleness histograms."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sandboxd.core.rollouts.cost import CostFigures
from sandboxd.core.rollouts.timeline import LifecycleFigures

HISTOGRAM_BUCKETS = 16


class EventRate:
    """Amounts stamped with a time; sums over a trailing window."""

    def __init__(self) -> None:
        self._events: deque[tuple[float, float]] = deque()

    def add(self, now: float, amount: float = 1.0) -> None:
        """Stamps ``amount`` with ``now``, which must not be earlier than the last stamp."""
        self._events.append((now, amount))

    def total(self, now: float, window: float) -> float:
        """The sum stamped within ``window`` seconds before ``now``; older amounts are dropped for good."""
        while self._events and self._events[0][0] < now - window:
            self._events.popleft()
        return sum(a for _, a in self._events)


class TimeSplit:
    """How long a value spent in each state over a trailing window, and the
    time-weighted mean of a level (e.g. groups in flight)."""

    def __init__(self, now: float, state: str, level: float = 0.0) -> None:
        self._state = state
        self._level = level
        self._since = now
        self._closed: deque[tuple[float, float, str, float]] = deque()

    @property
    def state(self) -> str:
        """The state it is in now."""
        return self._state

    def set(self, now: float, state: str | None = None, level: float | None = None) -> None:
        """Changes the state and/or level from ``now`` on (None keeps it); a no-op when neither changes."""
        new_state = self._state if state is None else state
        new_level = self._level if level is None else level
        if new_state == self._state and new_level == self._level:
            return
        if now > self._since:
            self._closed.append((self._since, now, self._state, self._level))
        self._since = now
        self._state, self._level = new_state, new_level

    def _spans(self, now: float, window: float) -> list[tuple[float, float, str, float]]:
        start = now - window
        while self._closed and self._closed[0][1] < start:
            self._closed.popleft()
        spans = [*self._closed, (self._since, now, self._state, self._level)]
        return [(max(a, start), b, s, lv) for a, b, s, lv in spans if b > max(a, start)]

    def seconds(self, now: float, window: float) -> dict[str, float]:
        """Seconds in each state over the trailing ``window``; busy, idle and away are always there."""
        out: dict[str, float] = {"busy": 0.0, "idle": 0.0, "away": 0.0}
        for a, b, s, _ in self._spans(now, window):
            out[s] = out.get(s, 0.0) + b - a
        return out

    def mean_level(self, now: float, window: float) -> float:
        """The level's time-weighted mean over the trailing ``window``; the current one if no time passed."""
        spans = self._spans(now, window)
        total = sum(b - a for a, b, _, _ in spans)
        return sum((b - a) * lv for a, b, _, lv in spans) / total if total > 0 else self._level


@dataclass
class StalenessStats:
    """How many policy versions behind the consumed samples were, not windowed; ``budget`` is S."""

    budget: int
    count: float = 0.0
    total: float = 0.0
    max: int = 0
    stale: float = 0.0
    over_budget: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * HISTOGRAM_BUCKETS)

    def add(self, staleness: int, weight: float = 1.0) -> None:
        """Counts ``weight`` samples (e.g. tokens) ``staleness`` versions old; negatives count as 0."""
        staleness = max(0, staleness)
        self.count += weight
        self.total += staleness * weight
        self.max = max(self.max, staleness)
        if staleness > 0:
            self.stale += weight
        if staleness > self.budget:
            self.over_budget += int(weight)
        self.histogram[min(staleness, HISTOGRAM_BUCKETS - 1)] += int(weight)

    @property
    def mean(self) -> float:
        """Weighted mean staleness; 0 before any sample."""
        return self.total / self.count if self.count else 0.0

    @property
    def share_stale(self) -> float:
        """Weighted share of samples at least one version old; 0 before any sample."""
        return self.stale / self.count if self.count else 0.0


@dataclass
class Figures:
    """One run's throughput-matching figures at one instant: rates over the window, staleness overall."""

    production_rate: float
    keep_rate: float
    effective_rate: float
    consumption_rate: float
    trainer_idle_ratio: float
    generator_idle_ratio: float
    queue_depth: int
    in_flight: int
    parked: int
    unacked_batches: int
    staleness_trajectory: StalenessStats
    staleness_token: StalenessStats
    staleness_env: StalenessStats
    filtered: dict[str, int]
    policy_version: int
    target_concurrency: int
    accepted_total: int
    consumed_groups: int
    infra_failures_masked: int
    window_seconds: float
    in_flight_mean: float = 0.0
    controller_reason: str = ""
    trainer_idle_seconds: float = 0.0
    """Over the window: seconds the trainer waited with its stream open."""
    trainer_busy_seconds: float = 0.0
    steps: int = 0
    """Batches acknowledged over the window."""
    lifecycle: LifecycleFigures | None = None
    """Where rollouts spend their time, stage by stage (set by the rollout service)."""
    cost: CostFigures | None = None
    """The figures in dollars at the server's prices (set by the rollout service)."""

    def line(self) -> str:
        """One line for a progress display."""
        return (
            f"v{self.policy_version} R_p {self.production_rate:.1f}/s k {self.keep_rate:.2f} "
            f"R_eff {self.effective_rate:.1f}/s R_c {self.consumption_rate:.1f}/s "
            f"idle T {self.trainer_idle_ratio:.0%} G {self.generator_idle_ratio:.0%} "
            f"queue {self.queue_depth} run {self.in_flight} target {self.target_concurrency} "
            f"stale max {self.staleness_trajectory.max} mean {self.staleness_trajectory.mean:.2f}"
        )
