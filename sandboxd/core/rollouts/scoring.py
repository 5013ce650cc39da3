"""How a submitted group is judged: infrastructure failures masked (never
scored 0), the hard staleness bound, the zero-advantage and mean-range
filters, and the advantages of what is kept.

Pure functions of a group, the run's config and the policy version. They
mark the group's trajectories and return a ``Verdict``; the queue applies
the verdict to its counters and tables.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from sandboxd.core.rollouts.model import (
    FilterMode,
    Group,
    InfraFailure,
    Outcome,
    RunConfig,
    StalenessMode,
    Trajectory,
)
from sandboxd.errors import InvalidArgument


@dataclass
class Verdict:
    """What judging a group decided: dropped (and why) or kept, and what to count."""

    drop: str = ""
    """Why the group is dropped; "" when it is kept."""
    counts: Counter[str] = field(default_factory=Counter)
    """Filter counters to add (masked trajectories, masked groups, ...)."""
    infra_masked: int = 0
    """Trajectories masked for an infrastructure failure."""
    backfilled: bool = False
    """The drop uses one of the start version's backfills."""

    @property
    def kept(self) -> bool:
        """The group goes on (admitted, or masked but delivered)."""
        return not self.drop


def check_trajectories(trajectories: list[Trajectory]) -> None:
    """Validates a submission; names missing trajectory ids ``t<i>``."""
    if not trajectories:
        raise InvalidArgument("trajectories", "must not be empty")
    seen: set[str] = set()
    for i, t in enumerate(trajectories):
        if not t.trajectory_id:
            t.trajectory_id = f"t{i}"
        if t.trajectory_id in seen:
            raise InvalidArgument(f"trajectories[{i}].trajectory_id", f"{t.trajectory_id!r} appears twice")
        seen.add(t.trajectory_id)
        for j, s in enumerate(t.segments):
            if s.tokens < 0:
                raise InvalidArgument(f"trajectories[{i}].segments[{j}].tokens", "must be >= 0")
        if t.reward is not None and not math.isfinite(t.reward):
            raise InvalidArgument(f"trajectories[{i}].reward", "must be finite")


def bound_staleness(g: Group, config: RunConfig, version: int) -> Verdict:
    """The hard staleness bound against policy ``version``: drops the group,
    or (MASK mode) masks its stale segments and trajectories."""
    verdict = Verdict()
    floor = version - config.max_staleness
    live = [t for t in g.trajectories if not t.masked]
    if all(t.oldest_version(g.start_version) >= floor for t in live):
        return verdict
    if config.staleness_mode is StalenessMode.DROP:
        verdict.drop = "stale"
    elif config.staleness_mode is StalenessMode.MASK:
        for t in live:
            t.segment_masked = [s.policy_version < floor for s in t.segments]
            if t.oldest_version(g.start_version) < floor:
                t.mask("stale")
                verdict.counts["stale_trajectory"] += 1
        if all(t.masked for t in g.trajectories):
            verdict.drop = "stale"
    return verdict


def score(g: Group, config: RunConfig, version: int, *, may_backfill: bool) -> Verdict:
    """Masks infrastructure failures, applies the staleness bound and the
    reward filters, sets advantages and the group's outcome.
    ``may_backfill``: a filtered group may still be dropped and replaced."""
    verdict = Verdict()
    for t in g.trajectories:
        if t.failure is not InfraFailure.NONE:
            t.reward = None
            t.mask(f"infra_failure:{t.failure.name.lower()}")
            verdict.infra_masked += 1
            verdict.counts["infra_failure"] += 1
        elif t.reward is None:
            t.reward = sum(s.reward for s in t.steps)
    if all(t.masked for t in g.trajectories):
        verdict.drop = "all_infra_failed"
        return verdict
    stale = bound_staleness(g, config, version)
    verdict.counts.update(stale.counts)
    if stale.drop:
        verdict.drop = stale.drop
        return verdict
    rewards = [t.reward for t in g.trajectories if not t.masked and t.reward is not None]
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
    g.reward_mean, g.reward_std = mean, std
    reason = ""
    if std <= config.filter_epsilon:
        reason = "zero_std"
    elif config.has_mean_range and not config.filter_mean_min <= mean <= config.filter_mean_max:
        reason = "mean_out_of_range"
    if reason and config.filter_mode is not FilterMode.OFF:
        if config.filter_mode is FilterMode.DROP_AND_BACKFILL and may_backfill:
            verdict.backfilled = True
            verdict.drop = reason
            return verdict
        verdict.counts[reason] += 1
        for t in g.trajectories:
            t.mask(reason)
        g.outcome, g.reason = Outcome.MASKED, reason
        return verdict
    for t in g.trajectories:
        if not t.masked and t.reward is not None:
            t.advantage = (t.reward - mean) / (std + 1e-6) if std > 0 else 0.0
    g.outcome, g.reason = Outcome.ADMITTED, reason
    return verdict
