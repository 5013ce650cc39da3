"""Throughput matching: a pure decision of how many groups should run at
once, from the figures, within the staleness budget.

Production is proportional to concurrency (Little's law: R_p = C / T for
rollouts lasting T), so the concurrency that makes the effective rate meet
the trainer's consumption rate is C' = C_mean * R_c / R_eff, with headroom.
The staleness gate already bounds what can be in flight; the controller
stays below that bound (more would only be refused) and above one group.
When the trainer idles it never lowers the target; when admitted work piles
up beyond a step it never raises it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerInput:
    """One run's figures and budget at a control tick: everything ``plan`` reads."""

    target: int
    """The concurrency target now."""
    in_flight_mean: float
    effective_rate: float
    consumption_rate: float
    trainer_idle_ratio: float
    queue_depth: int
    batch_groups: int
    max_staleness: int
    extra_slots: int = 0
    pool_cap: int = 0
    """Groups the pool can hold at once (0 = no limit)."""


@dataclass(frozen=True)
class ControllerTuning:
    """How hard the controller pushes: headroom over the matching rate, how far one step may move."""

    headroom: float = 1.2
    idle_tolerance: float = 0.03
    max_step_up: float = 2.0
    max_step_down: float = 0.75


@dataclass(frozen=True)
class Decision:
    """The concurrency target to run at, and why, in words for the run's status."""

    target: int
    reason: str


def staleness_cap(batch_groups: int, max_staleness: int, extra_slots: int = 0) -> int:
    """Groups that may be running or queued at once within the budget."""
    return (max_staleness + 1) * batch_groups + extra_slots


def plan(x: ControllerInput, tuning: ControllerTuning = ControllerTuning()) -> Decision:
    """The next concurrency target: always between one group and the staleness (and pool) cap."""
    cap = staleness_cap(x.batch_groups, x.max_staleness, x.extra_slots)
    if x.pool_cap:
        cap = min(cap, x.pool_cap)
    cap = max(1, cap)
    current = max(1, min(x.target, cap))
    if x.effective_rate <= 0 or x.consumption_rate <= 0:
        if x.trainer_idle_ratio > tuning.idle_tolerance and x.queue_depth == 0:
            # Nothing measured yet but the trainer waits: grow.
            return Decision(min(cap, max(current + 1, math.ceil(current * tuning.max_step_up))), "warming up")
        return Decision(current, "no rates yet")
    base = max(1.0, x.in_flight_mean)
    want = base * x.consumption_rate / x.effective_rate * tuning.headroom
    low = max(1, math.floor(current * tuning.max_step_down))
    high = max(current + 1, math.ceil(current * tuning.max_step_up))
    target = max(low, min(high, math.ceil(want)))
    if x.trainer_idle_ratio > tuning.idle_tolerance and x.queue_depth < x.batch_groups:
        target = max(target, current + 1)
        reason = f"trainer idle {x.trainer_idle_ratio:.0%}: R_eff {x.effective_rate:.2f} < R_c"
    elif x.queue_depth > x.batch_groups:
        target = min(target, current)
        reason = f"queue {x.queue_depth} > B: generator ahead"
    else:
        reason = f"matching R_c {x.consumption_rate:.2f}/s"
    target = max(1, min(cap, target))
    if target == cap and cap < want:
        reason += f" (held at the staleness cap {cap})"
    return Decision(target, reason)
