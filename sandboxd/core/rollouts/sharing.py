"""Runs sharing one fleet of sandboxes, by weight. Pure arithmetic, time passed in.

Each run is guaranteed ``floor(fleet * weight / total weight)`` sandboxes
(the remainder to the largest fractions) whenever it wants them, and may
borrow what the others leave idle. One allotment, in three passes:

1. every run is entitled to ``min(demand, guarantee)``;
2. what runs hold beyond their entitlement (borrowed sandboxes) is kept as
   far as the rest of the fleet allows; when an owner's entitlement grows
   past what is free, the borrowers holding most per unit of weight give
   back first (weighted water-filling of what is left over the holdings);
3. what is still free goes to the runs whose demand is not met, by weight.

A run holding more than it is allowed is being reclaimed from: it gets no
new slots, and ``FleetLedger`` times it from the moment the reclaim opens
until the run holds no more than its allowance, reporting which reclaims
are past the configured bound (those the service ends by parking or
cancelling, never silently).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Claim:
    """One run as the allotment sees it, in sandboxes."""

    run: str
    weight: float
    demand: int
    """Sandboxes the run would use now (its controller's concurrency times sandboxes per group)."""
    held: int
    """Sandboxes its running groups hold."""


@dataclass(frozen=True)
class Share:
    """One run's part of the fleet, in sandboxes."""

    run: str
    weight: float
    guaranteed: int
    """Its weight's share: always granted when its demand reaches it."""
    allowed: int
    """What it may hold now: its entitlement plus what it borrows."""
    usable: int
    """What it may hold at once now: ``allowed``, less what others still hold
    of it while they give it back."""
    held: int
    demand: int

    @property
    def borrowed(self) -> int:
        """Sandboxes allowed beyond its guarantee (lent by runs that leave theirs idle)."""
        return max(0, self.allowed - self.guaranteed)

    @property
    def over(self) -> int:
        """Sandboxes it holds beyond its allowance: to be given back."""
        return max(0, self.held - self.allowed)


def guarantees(fleet: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Each run's weighted share of ``fleet`` sandboxes in whole sandboxes,
    adding up to ``fleet`` (largest remainders first, ties by name)."""
    total = sum(weights.values())
    if fleet <= 0 or total <= 0:
        return {r: 0 for r in weights}
    exact = {r: fleet * w / total for r, w in weights.items()}
    out = {r: math.floor(x) for r, x in exact.items()}
    left = fleet - sum(out.values())
    for r in sorted(exact, key=lambda r: (out[r] - exact[r], r))[:left]:
        out[r] += 1
    return out


def water_fill(amount: int, wants: Mapping[str, int], weights: Mapping[str, float]) -> dict[str, int]:
    """``amount`` whole units split over ``wants`` in proportion to weight,
    none above what it wants (what one cannot take goes to the others);
    the units that do not divide evenly go to the lowest fill per weight."""
    out = {r: 0 for r in wants}
    left = max(0, amount)
    while left > 0:
        open_ = [r for r in wants if out[r] < wants[r]]
        if not open_:
            break
        total = sum(weights[r] for r in open_)
        given = 0
        for r in open_:
            take = min(wants[r] - out[r], math.floor(left * weights[r] / total))
            out[r] += take
            given += take
        if given == 0:
            # Fewer units than runs: one at a time to the least filled per weight.
            r = min(open_, key=lambda r: (out[r] / weights[r], -weights[r], r))
            out[r] += 1
            given = 1
        left -= given
    return out


def allot(fleet: int, claims: Iterable[Claim], *, borrowing: bool = True) -> dict[str, Share]:
    """Every run's share of ``fleet`` sandboxes (see the module docstring);
    without ``borrowing`` each run is held to its guarantee (static shares)."""
    cs = {c.run: c for c in claims}
    weights = {r: c.weight for r, c in cs.items()}
    guaranteed = guarantees(fleet, weights)
    entitled = {r: min(max(0, c.demand), guaranteed[r]) for r, c in cs.items()}
    allowed = dict(entitled)
    if borrowing:
        spare = fleet - sum(entitled.values())
        kept = water_fill(spare, {r: max(0, c.held - entitled[r]) for r, c in cs.items()}, weights)
        spare -= sum(kept.values())
        want = {r: max(0, c.demand - entitled[r] - kept[r]) for r, c in cs.items()}
        more = water_fill(spare, want, weights)
        allowed = {r: entitled[r] + kept[r] + more[r] for r in cs}
    free = max(0, fleet - sum(c.held for c in cs.values()))
    short = {r: max(0, allowed[r] - c.held) for r, c in cs.items()}
    now = water_fill(free, short, weights)
    return {
        r: Share(
            run=r,
            weight=c.weight,
            guaranteed=guaranteed[r],
            allowed=allowed[r],
            usable=min(allowed[r], c.held + now[r]),
            held=c.held,
            demand=c.demand,
        )
        for r, c in cs.items()
    }


@dataclass
class Reclaim:
    """Sandboxes a run is giving back: since when, and how many at the start."""

    run: str
    opened: float
    sandboxes: int


@dataclass
class FleetLedger:
    """The fleet's reclaims over time: which are open, which are overdue, how long closed ones took."""

    reclaim_seconds: float
    open: dict[str, Reclaim] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)
    """Seconds each closed reclaim took, oldest first (the last 4096)."""
    forced: int = 0
    """Reclaims the service ended by parking or cancelling groups at the bound."""

    def observe(self, now: float, shares: Mapping[str, Share]) -> None:
        """Opens a reclaim for each run now over its allowance, closes those no longer over."""
        for r, s in shares.items():
            if s.over and r not in self.open:
                self.open[r] = Reclaim(r, now, s.over)
            elif not s.over and r in self.open:
                self.durations.append(now - self.open.pop(r).opened)
                del self.durations[:-4096]
        for r in [r for r in self.open if r not in shares]:
            self.durations.append(now - self.open.pop(r).opened)

    def overdue(self, now: float) -> list[str]:
        """Runs whose reclaim has been open for the bound or longer."""
        return [r for r, rc in self.open.items() if now - rc.opened >= self.reclaim_seconds]

    def percentile(self, q: float) -> float:
        """The ``q`` quantile (0-1, nearest rank) of closed reclaims' durations; 0 before any."""
        if not self.durations:
            return 0.0
        ordered = sorted(self.durations)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
