"""The rollout runs of a server sharing one fleet of sandboxes ([fleet]):
each run's claim read from its queue, the allotment (sandboxd.core.rollouts.
sharing) turned into the groups each queue may start, and borrowed
sandboxes taken back within the bound.

A run's demand is its controller's concurrency (or its fixed one, or the
staleness gate's size when it has neither), in sandboxes; a run that has not asked for slots for
``idle_seconds`` wants only what it holds. What it holds is its running
groups' sandboxes. Giving back: a run over its allowance gets no new slots
while its in-flight groups finish; with partial rollouts on, the groups
over are parked at once (snapshotted, resumed when it has room again); a
reclaim still open at the bound cancels the newest groups over with the
reason "reclaimed", which the generator learns from ReportProgress and
SubmitGroup and the figures count. Nothing is ended silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandboxd.core.rollouts.queue import Cancellation, RolloutQueue
from sandboxd.core.rollouts.sharing import Claim, FleetLedger, Share, allot
from sandboxd.fleet_settings import FleetSettings

if TYPE_CHECKING:
    from sandboxd.core.rollouts.service import RolloutManager

log = logging.getLogger(__name__)

RECLAIMED = "reclaimed"
"""The reason of groups ended to give borrowed sandboxes back."""


@dataclass(frozen=True)
class FleetFigures:
    """The fleet as a whole and each run's share of it, in sandboxes."""

    sandboxes: int
    held: int
    shares: dict[str, Share]
    """By run key (``tenant/run``, or the run's name for the default tenant)."""
    reclaims_open: int
    reclaims_closed: int
    reclaims_forced: int
    """Reclaims that reached the bound and ended groups (parked or cancelled)."""
    reclaim_p50_seconds: float
    reclaim_p99_seconds: float
    reclaim_bound_seconds: float


class Fleet:
    """Every run of one RolloutManager on the shared fleet; attaches itself to the manager."""

    def __init__(self, settings: FleetSettings, manager: RolloutManager) -> None:
        self.settings = settings
        self.manager = manager
        self.ledger = FleetLedger(settings.reclaim_seconds)
        self.shares: dict[str, Share] = {}
        self._asked: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        manager.fleet = self
        for key, run in manager.runs.items():
            run.queue.fleet_seat = self.seat_for(key)

    @property
    def now(self) -> float:
        """The manager clock's monotonic time."""
        return self.manager.clock.monotonic()

    def seat_for(self, key: str) -> Callable[[RolloutQueue], int]:
        """The function the run's queue asks, when granting slots, how many
        groups it may hold at once now (asking counts as wanting slots)."""
        self._asked.setdefault(key, self.now)

        def seat(queue: RolloutQueue) -> int:
            self._asked[key] = self.now
            share = self.update().get(key)
            return share.usable // queue.config.per_group if share is not None else 0

        return seat

    def claim(self, key: str, q: RolloutQueue) -> Claim:
        """The run's weight, demand and holding now (see the module docstring)."""
        c = q.config
        per = c.per_group
        held = len(q.running) * per
        # The target, not what the staleness gate admits this instant: the gate
        # opens and closes with every step, and a demand following it would
        # lend and reclaim the same sandboxes step after step. A run that is
        # ahead of its trainer lends through its controller lowering the target.
        demand = (q.target or q.gate_size()) * per
        if self.now - self._asked.get(key, self.now) >= self.settings.idle_seconds:
            demand = held
        return Claim(key, self.settings.weight(key), demand, held)

    def update(self) -> dict[str, Share]:
        """Allots the fleet over every run now, notes each run's share for
        its figures, and opens and closes reclaims."""
        runs = {key: run.queue for key, run in self.manager.runs.items()}
        claims = [self.claim(key, q) for key, q in runs.items()]
        self.shares = allot(self.settings.sandboxes, claims, borrowing=self.settings.borrowing)
        for key, q in runs.items():
            s = self.shares[key]
            per = q.config.per_group
            q.fleet_note = (
                f"fleet: may hold {s.usable // per} groups now, {s.allowed // per} allowed "
                f"({s.guaranteed} of {self.settings.sandboxes} sandboxes guaranteed, {s.borrowed} borrowed"
                + (f", giving back {s.over}" if s.over else "")
                + ")"
            )
        self.ledger.observe(self.now, self.shares)
        return self.shares

    def reclaims(self, key: str, q: RolloutQueue) -> list[Cancellation]:
        """The groups the run ends now to give back what it holds over its
        allowance: parked at once with partial rollouts, else only once the
        reclaim has reached its bound; newest first (least work lost)."""
        share = self.shares.get(key)
        if share is None or not share.over:
            return []
        # Due at the last sweep before the bound, so that none outlasts it.
        overdue = key in self.ledger.overdue(self.now + self.interval)
        if not (q.config.partial_rollouts or overdue):
            return []
        n = math.ceil(share.over / q.config.per_group)
        # Latest started first; of those granted together, the last granted.
        newest = sorted(reversed(list(q.running.values())), key=lambda g: g.started_at, reverse=True)[:n]
        if overdue:
            self.ledger.forced += 1
        log.info("fleet: run %s gives back %d sandboxes by ending %d groups", key, share.over, len(newest))
        return [q._cancel(g, RECLAIMED) for g in newest]

    async def sweep(self) -> None:
        """One pass: allots, then ends the groups of reclaims that are due
        (through the manager, which parks or releases their sandboxes)."""
        self.update()
        for key, run in list(self.manager.runs.items()):
            if not self.shares.get(key, None) or not self.shares[key].over:
                continue
            async with run.lock:
                cancels = self.reclaims(key, run.queue)
                if cancels:
                    await self.manager._after(run, False, cancels)
        self.update()

    def start(self) -> None:
        """Starts sweeping, often enough to meet the reclaim bound."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="rollout-fleet")

    async def stop(self) -> None:
        """Stops sweeping."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def interval(self) -> float:
        """Seconds between two sweeps: a tenth of the bound, at most half a second."""
        return min(0.5, self.settings.reclaim_seconds / 10)

    async def _loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # a pass that fails is retried on the next one
                log.exception("fleet sweep failed")
            await self.manager.clock.sleep(self.interval)

    def figures(self) -> FleetFigures:
        """The fleet's figures now."""
        shares = self.update()
        return FleetFigures(
            sandboxes=self.settings.sandboxes,
            held=sum(s.held for s in shares.values()),
            shares=dict(shares),
            reclaims_open=len(self.ledger.open),
            reclaims_closed=len(self.ledger.durations),
            reclaims_forced=self.ledger.forced,
            reclaim_p50_seconds=self.ledger.percentile(0.5),
            reclaim_p99_seconds=self.ledger.percentile(0.99),
            reclaim_bound_seconds=self.settings.reclaim_seconds,
        )
