"""One run's flow over time, for the throughput-matching figures: what the
generators produced, what the queue admitted, what the trainer consumed, and
when generators and trainer were busy. Times are passed in."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.core.rollouts.figures import EventRate, TimeSplit


@dataclass(frozen=True)
class Rates:
    """The flow over one trailing window."""

    production_rate: float
    """Trajectories submitted per second."""
    keep_rate: float
    """Share of completed groups admitted."""
    effective_rate: float
    """Production after filtering (production_rate * keep_rate)."""
    consumption_rate: float
    """Trajectories acknowledged per second the trainer was busy."""
    trainer_idle_ratio: float
    generator_idle_ratio: float
    in_flight_mean: float
    """Time-weighted mean of the groups running."""
    trainer_idle_seconds: float = 0.0
    """Seconds the trainer's stream was open with no batch in hand."""
    trainer_busy_seconds: float = 0.0
    steps: int = 0
    """Batches acknowledged."""


class Throughput:
    """Counts a run's flow as it happens and reads it back as ``Rates``."""

    def __init__(self, now: float) -> None:
        self._produced = EventRate()
        self._completed = EventRate()
        self._admitted = EventRate()
        self._consumed = EventRate()
        self._steps = EventRate()
        self._trainer = TimeSplit(now, "away")
        self._generator = TimeSplit(now, "idle", 0)
        self._started_at = now
        self._ack_gap = 0.0
        self._last_ack = 0.0

    def observe(self, now: float, *, running: int, batches_out: bool, trainer_connected: bool) -> None:
        """The run's state changed: ``running`` groups, batches in the
        trainer's hands or not, a trainer stream open or not."""
        self._generator.set(now, "busy" if running else "idle", running)
        self._trainer.set(now, "busy" if batches_out else ("idle" if trainer_connected else "away"))

    def submitted(self, now: float, trajectories: int) -> None:
        """A group of ``trajectories`` came back from the generators."""
        self._produced.add(now, trajectories)
        self._completed.add(now, 1)

    def admitted(self, now: float) -> None:
        """A submitted group passed the filters."""
        self._admitted.add(now, 1)

    def acked(self, now: float, trajectories: int) -> None:
        """The trainer acknowledged a batch of ``trajectories``."""
        self._consumed.add(now, trajectories)
        self._steps.add(now, 1)
        if self._last_ack:
            gap = now - self._last_ack
            self._ack_gap = gap if not self._ack_gap else 0.8 * self._ack_gap + 0.2 * gap
        self._last_ack = now

    def retry_after(self) -> float:
        """When asking again is likely to find capacity: half the usual time
        between two acknowledged batches (the trainer frees B slots per step)."""
        gap = self._ack_gap or 1.0
        return round(min(30.0, max(0.05, gap / 2)), 3)

    def rates(self, now: float, window: float) -> Rates:
        """The flow over the ``window`` seconds before ``now``."""
        span = max(1e-9, min(window, now - self._started_at))
        produced = self._produced.total(now, window)
        completed = self._completed.total(now, window)
        admitted = self._admitted.total(now, window)
        consumed = self._consumed.total(now, window)
        trainer = self._trainer.seconds(now, window)
        generator = self._generator.seconds(now, window)
        keep = admitted / completed if completed else 1.0
        production = produced / span
        busy, idle = trainer["busy"], trainer["idle"]
        gen_total = generator["busy"] + generator["idle"]
        return Rates(
            production_rate=production,
            keep_rate=keep,
            effective_rate=keep * production,
            consumption_rate=consumed / busy if busy > 0 else 0.0,
            trainer_idle_ratio=idle / (idle + busy) if idle + busy > 0 else 0.0,
            generator_idle_ratio=generator["idle"] / gen_total if gen_total > 0 else 0.0,
            in_flight_mean=self._generator.mean_level(now, window),
            trainer_idle_seconds=idle,
            trainer_busy_seconds=busy,
            steps=int(self._steps.total(now, window)),
        )
