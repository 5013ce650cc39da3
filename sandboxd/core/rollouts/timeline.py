"""A rollout's life, milestone by milestone, and the distributions of the
stages between them (shared/design/RL-INTEGRATION.md: which stage the
trainer waits on).

    queued ─ slot_wait ─> granted ─ to_acquire ─> acquire requested ─ acquire ─> ready
      ─ to_first_command ─> first command ─ rollout ─> submit ─ verifier ─> scored
      ─ scoring ─> submitted ─ queue_wait ─> delivered ─ training ─> consumed

Every moment is wall-clock seconds (the sandboxes' own timestamps are), so
a trace's spans line up with the server's other spans. A milestone that did
not happen (no verifier, a group dropped at submit) leaves its stage out."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

SAMPLES_KEPT = 2048
"""Recent trajectories each stage's distribution is read from."""


@dataclass
class SandboxFacts:
    """How one sandbox of a rollout came to it, read from its lease and record."""

    sandbox_id: str
    lease_id: str
    requested_at: float
    """When the acquire that leased it was asked for (0 = not known: adopted)."""
    created_at: float
    ready_at: float
    leased_at: float
    cpu_cores: float
    memory_bytes: int
    image_pulled: bool = False
    """The acquire found the sandbox's image absent and waited for its pull."""
    first_command_at: float = 0.0
    released_at: float = 0.0
    """When the rollout gave it up, or 0 while held."""

    @property
    def warm(self) -> bool:
        """Ready before its acquire asked: handed out of the warm pool, not started for it."""
        return bool(self.requested_at) and self.ready_at <= self.requested_at


@dataclass
class Milestones:
    """One trajectory's moments; 0 = did not happen (yet)."""

    queued: float = 0.0
    granted: float = 0.0
    acquire_requested: float = 0.0
    ready: float = 0.0
    first_command: float = 0.0
    submit_called: float = 0.0
    verifier_start: float = 0.0
    verifier_end: float = 0.0
    submitted: float = 0.0
    delivered: float = 0.0
    consumed: float = 0.0


STAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("slot_wait", ("queued",), "granted"),
    ("to_acquire", ("granted",), "acquire_requested"),
    ("acquire", ("acquire_requested",), "ready"),
    ("to_first_command", ("ready",), "first_command"),
    ("rollout", ("first_command", "ready", "granted"), "submit_called"),
    ("verifier", ("verifier_start",), "verifier_end"),
    ("scoring", ("verifier_end", "submit_called"), "submitted"),
    ("queue_wait", ("submitted",), "delivered"),
    ("training", ("delivered",), "consumed"),
)
"""Each stage: its name, the milestones it may start at (the first that
happened), and the one it ends at."""

STAGE_NAMES = tuple(name for name, _, _ in STAGES)
PRODUCTION_STAGES = STAGE_NAMES[:7]
"""The stages before a rollout reaches the queue: while the trainer idles, one of them is why."""


def stage_spans(m: Milestones) -> list[tuple[str, float, float]]:
    """The stages that happened, in order, as (name, start, end); one whose
    end came before its start (a sandbox acquired before its slot) is left out."""
    out = []
    for name, starts, end_name in STAGES:
        end = getattr(m, end_name)
        start = next((getattr(m, s) for s in starts if getattr(m, s)), 0.0)
        if start and end and end >= start:
            out.append((name, start, end))
    return out


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, nearest rank; 0 for none."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class StageDistribution:
    """One stage's durations over recent trajectories, in seconds."""

    stage: str
    count: int
    p50: float
    p90: float
    p99: float
    mean: float
    max: float
    share: float
    """Its mean's share of the sum of every stage's mean."""


@dataclass(frozen=True)
class LifecycleFigures:
    """Where a run's rollouts spend their time, and how their sandboxes came."""

    stages: list[StageDistribution]
    warm_sandboxes: int
    cold_sandboxes: int
    image_pulls: int
    bottleneck: str
    """The production stage with the largest mean ("" before any)."""
    traces: int
    """Trajectories whose lifecycle ended (consumed, dropped or cancelled)."""


@dataclass
class StageSamples:
    """Recent durations per stage, and sandbox counts, for ``LifecycleFigures``."""

    samples: dict[str, deque[float]] = field(
        default_factory=lambda: {name: deque(maxlen=SAMPLES_KEPT) for name in STAGE_NAMES}
    )
    warm: int = 0
    cold: int = 0
    pulls: int = 0
    traces: int = 0

    def add(self, m: Milestones) -> None:
        """Counts one finished trajectory's stages."""
        self.traces += 1
        for name, start, end in stage_spans(m):
            self.samples[name].append(end - start)

    def add_sandbox(self, facts: SandboxFacts) -> None:
        """Counts how one rollout sandbox came (warm or cold, its image pulled or not)."""
        if not facts.requested_at:
            return
        if facts.warm:
            self.warm += 1
        else:
            self.cold += 1
        self.pulls += int(facts.image_pulled)

    def figures(self) -> LifecycleFigures:
        """The distributions now, in lifecycle order (stages with no sample have count 0)."""
        means = {n: (sum(s) / len(s) if s else 0.0) for n, s in self.samples.items()}
        total = sum(means.values())
        stages = []
        for name in STAGE_NAMES:
            ordered = sorted(self.samples[name])
            stages.append(
                StageDistribution(
                    stage=name,
                    count=len(ordered),
                    p50=percentile(ordered, 0.5),
                    p90=percentile(ordered, 0.9),
                    p99=percentile(ordered, 0.99),
                    mean=means[name],
                    max=ordered[-1] if ordered else 0.0,
                    share=means[name] / total if total > 0 else 0.0,
                )
            )
        busiest = max(PRODUCTION_STAGES, key=lambda n: means[n])
        return LifecycleFigures(
            stages=stages,
            warm_sandboxes=self.warm,
            cold_sandboxes=self.cold,
            image_pulls=self.pulls,
            bottleneck=busiest if means[busiest] > 0 else "",
            traces=self.traces,
        )
