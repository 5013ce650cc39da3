"""The reconciler: carries the scaling policy's plans out for every pool,
within one global budget.

Each pass (on any change, and every ``interval`` seconds since signals decay
with time) it

1. asks the policy (sandboxd.core.scaling.decide, pure) for each pool's plan;
2. works out what each pool wants created from the plan and from what is
   already READY or in flight (creates still running are counted, so a stale
   view never over-creates), waiters' needs first;
3. splits the room left in the global budget (sandboxes across pools,
   sandboxes starting across pools) among the pools, max-min fair
   (sandboxd.core.scaling.share), waiters first, then warm targets; when the
   total budget is full and acquirers wait, it reclaims warm sandboxes of
   pools nobody waits on (counting destroys in flight);
4. destroys READY sandboxes above what each plan keeps.

Every backend create attempt goes through one pacer (``max_create_rate``);
how many run at once adapts to the engine's latency (an AIMD window,
sandboxd.core.pools.congestion, under the static ``max_starting`` bounds),
and calls that time out mark the engine degraded. Sandboxes whose create or
destroy got no answer stay booked as in doubt (sandboxd.core.pools.indoubt),
counted against the budget, until a listing settles them. A cheap liveness
sweep (one backend call for all pools) replaces warm sandboxes that died.
Every wait (passes, pacing, deferred refills) runs on the injected clock.

The reconciler is the pools' host (``sandboxd.core.pools.PoolHost``): it
depends on pools, never the other way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import replace

from opentelemetry.metrics import Meter

from sandboxd.backends.base import Backend, HostCapacity, HostFacts, LivenessProbe, SchedulingPressure
from sandboxd.clock import Clock
from sandboxd.core.budget import Budget, Pacer, budget_from
from sandboxd.core.capacity import Capacity
from sandboxd.core.lifecycle import State
from sandboxd.core.meters import PoolMeters
from sandboxd.core.pools import WarmPool
from sandboxd.core.pools.congestion import Call, CongestionConfig, EngineHealth, engine_gauges
from sandboxd.core.pools.indoubt import InDoubt
from sandboxd.core.scaling import Ewma, share
from sandboxd.core.tuning import PoolTuning, tuning_from
from sandboxd.errors import BackendError
from sandboxd.settings import PoolSettings

__all__ = ["Budget", "Pacer", "Reconciler", "budget_from"]

log = logging.getLogger(__name__)


CAPACITY_EVERY_SECONDS = 60.0
"""How often the host's capacity is estimated again while sandboxes exist."""
PASS_GAP_SECONDS = 0.005
"""Least loop time between two passes woken by pokes; CPU use, not a clock
the scaling logic reads (which is the injected one)."""


class Reconciler:
    """Runs every pool (the PoolHost): plans, grants creates within the
    global budget, trims surplus, paces create attempts, sweeps liveness."""

    def __init__(
        self,
        backend: Backend,
        clock: Clock,
        budget: Budget | None = None,
        *,
        tuning: PoolTuning | None = None,
        meter: Meter | None = None,
        congestion: CongestionConfig | None = None,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self.budget = budget or Budget()
        self.tuning = tuning or PoolTuning()
        self.pools: dict[str, WarmPool] = {}
        self.meters = PoolMeters(meter, lambda: list(self.pools.values()))
        self.pacer = Pacer(self.budget.create_rate, self.budget.create_burst, clock)
        self.passes = 0
        self._startup = Ewma(0.5, self.tuning.startup_estimate_seconds, alpha_down=0.1)
        self.reclaimed = 0
        self._wake = asyncio.Event()
        self._urgent = 0
        self._deferring = 0
        self._go = asyncio.Event()
        self.deferred = 0
        self._task: asyncio.Task[None] | None = None
        self._next_sweep = 0.0
        self.health = EngineHealth(
            clock.monotonic, lambda: sum(p.creating for p in self.pools.values()), congestion
        )
        """The engine's start window and health (degraded or not, and why)."""
        self.in_doubt = InDoubt(
            backend,
            clock,
            timeout=lambda: self.budget.call_timeout,
            observe=self.health.observe,
            timed_out=self.health.timed_out,
        )
        """Sandboxes whose create or destroy got no answer, until a listing settles them."""
        self.capacity = Capacity()
        """What the backend's host holds (sandboxd.core.capacity); zeros until estimated."""
        self._settling: asyncio.Task[int] | None = None
        self._next_probe = 0.0
        self._estimate: Callable[[HostFacts], Capacity] | None = None
        self._ceiling_estimated = False
        """``budget.max_total`` is the host's estimate, not an operator's: it follows re-estimates."""
        self._next_estimate = math.inf
        self._estimating: asyncio.Task[Capacity] | None = None
        if meter is not None:
            engine_gauges(
                meter,
                self.health,
                window=lambda: float(self.engine_view("")[1]),
                in_doubt=lambda: float(len(self.in_doubt)),
                capacity=lambda: float(self.capacity.sandboxes),
            )

    @classmethod
    def from_settings(
        cls, settings: PoolSettings, backend: Backend, clock: Clock, meter: Meter | None = None
    ) -> Reconciler:
        """A reconciler with the budget and tuning of the server's pool settings."""
        return cls(
            backend,
            clock,
            budget_from(settings),
            tuning=tuning_from(settings),
            meter=meter,
            congestion=CongestionConfig(
                slow_seconds=settings.engine_slow_seconds, most=settings.max_starting_limit
            ),
        )

    async def estimate_capacity(self, estimate: Callable[[HostFacts], Capacity]) -> Capacity:
        """Asks the backend for its host's facts (when it reports them) and
        keeps ``estimate(facts)``; a budget without ``max_total`` takes the
        estimate as its ceiling. The loop asks again every
        ``CAPACITY_EVERY_SECONDS`` while sandboxes exist, so overheads are
        measured on them rather than assumed, and the host's load counts.
        Never raises: unknown capacity is zeros."""
        self._estimate = estimate
        if not isinstance(self._backend, HostCapacity):
            return self.capacity
        self._next_estimate = self._clock.monotonic() + CAPACITY_EVERY_SECONDS
        try:
            async with self._clock.timeout(self.budget.call_timeout):
                facts = await self._backend.host_facts()
        except (TimeoutError, BackendError) as e:
            log.warning("host capacity unknown: %s", e or "the engine did not answer")
            return self.capacity
        before = self.capacity
        self.capacity = estimate(facts)
        if self.capacity.sandboxes and (not self.budget.max_total or self._ceiling_estimated):
            self._ceiling_estimated = True
            self.budget = replace(self.budget, max_total=self.capacity.sandboxes)
            if (before.sandboxes, before.bound_by) != (self.capacity.sandboxes, self.capacity.bound_by):
                log.info(
                    "at most %d sandboxes on this host (bound by %s: %s)",
                    self.capacity.sandboxes,
                    self.capacity.bound_by,
                    self.capacity.detail,
                )
        return self.capacity

    # -- PoolHost -------------------------------------------------------------

    def attach(self, pool: WarmPool) -> None:
        """Starts running ``pool``."""
        self.pools[pool.name] = pool
        self.poke()

    def detach(self, pool: WarmPool) -> None:
        """Stops running ``pool``."""
        if self.pools.get(pool.name) is pool:
            del self.pools[pool.name]
        self.poke()

    def poke(self) -> None:
        """Schedules a pass soon."""
        self._wake.set()
        if self._deferring and any(p.waiting for p in self.pools.values()):
            # An acquirer now waits: what was deferred may be what it needs.
            self._let_deferred_go()

    async def paced(self, deferrable: bool = False) -> None:
        """Waits for the go-ahead of one create attempt (see PoolHost.paced)."""
        if deferrable and self._urgent and self.tuning.refill_defer_seconds > 0:
            self.deferred += 1
            self._deferring += 1
            try:
                with contextlib.suppress(TimeoutError):
                    async with self._clock.timeout(self.tuning.refill_defer_seconds):
                        await self._go.wait()
            finally:
                self._deferring -= 1
        await self.pacer.wait()

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        """Marks latency-critical work (a restore extracting into sandboxes it
        has leased) during which creates that only top up warm buffers wait."""
        self._urgent += 1
        try:
            yield
        finally:
            self._urgent -= 1
            if not self._urgent:
                self._let_deferred_go()

    def _let_deferred_go(self) -> None:
        self._go.set()
        self._go = asyncio.Event()

    def observe_startup(self, seconds: float) -> None:
        """Adds a start-up latency one of the pools measured."""
        self._startup.add(seconds)

    def startup_estimate(self) -> float | None:
        """Start-up latency measured across pools; None until there is one."""
        return self._startup.value if self._startup.samples else None

    def engine_call(
        self, call: Call, seconds: float, *, timed_out: bool = False, failed: bool = False
    ) -> None:
        """How one of the pools' engine calls went (see PoolHost.engine_call)."""
        if timed_out:
            self.health.timed_out(call, seconds)
            self.poke()
        elif failed:
            self.health.failed()
        else:
            self.health.observe(call, seconds)

    def book_in_doubt(self, sandbox_id: str, pool: str, handle: str, call: Call) -> None:
        """Books a sandbox whose create or destroy got no answer (see PoolHost.book_in_doubt)."""
        self.in_doubt.add(sandbox_id, pool, handle, call)
        self.poke()

    def engine_view(self, pool: str) -> tuple[str, int, int]:
        """(why the engine is degraded, start window, sandboxes of ``pool`` in doubt)."""
        return self.health.describe(), self.start_window(), self.in_doubt.count(pool)

    def start_window(self) -> int:
        """Starts allowed in flight across pools now (see PoolHost.start_window)."""
        pools = self.pools.values()
        return self.health.limit(sum(p.max_starting for p in pools) or 1, self.budget.max_starting)

    def ceiling(self) -> int:
        """Sandboxes all pools may hold together (0 = no limit)."""
        return self.budget.max_total

    def refusal_cause(self) -> str:
        """Why acquirers are not being served, if the host knows: the engine
        degraded, the host full, or sandboxes waiting for a node; "" otherwise."""
        if self.health.degraded:
            return self.health.describe()
        if self.budget.max_total:
            held = sum(len(p.records) for p in self.pools.values()) + len(self.in_doubt)
            if held >= self.budget.max_total:
                cause = f"host capacity: {held} of {self.budget.max_total} sandboxes in use"
                if self.capacity.sandboxes:
                    cause += (
                        f" (the host holds ~{self.capacity.sandboxes}, bound by {self.capacity.bound_by})"
                    )
                return cause
        waiting, why = self._unplaced()
        if waiting:
            return f"cluster full: {waiting} sandboxes wait for a node" + (f" ({why})" if why else "")
        return ""

    # -- running ----------------------------------------------------------------

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The background loop, while it runs."""
        return self._task

    def start(self) -> asyncio.Task[None]:
        """Starts the background loop (once)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="reconciler")
        return self._task

    async def stop(self) -> None:
        """Stops the background loop."""
        if self._estimating is not None:
            self._estimating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._estimating
            self._estimating = None
        if self._settling is not None:
            self._settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._settling
            self._settling = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        clock = self._clock
        loop = asyncio.get_running_loop()
        self._next_sweep = clock.monotonic() + self.budget.liveness_interval
        last_pass = -math.inf
        while True:
            # A timeout, not wait_for: a poke racing a cancel must not
            # swallow the cancel (Python 3.11's wait_for can).
            with contextlib.suppress(TimeoutError):
                async with clock.timeout(self._sleep_for()):
                    await self._wake.wait()
            # Every acquire pokes: a burst of them (64 at once) is served by a
            # few passes, not one pass between each two answers. A poke after
            # a quiet spell is served at once.
            gap = last_pass + PASS_GAP_SECONDS - loop.time()
            if gap > 0 and self._wake.is_set():
                await asyncio.sleep(gap)
            self._wake.clear()
            last_pass = loop.time()
            try:
                self.reconcile()
                self._settle()
                self._reestimate()
                if self.budget.liveness_interval > 0 and clock.monotonic() >= self._next_sweep:
                    self._next_sweep = clock.monotonic() + self.budget.liveness_interval
                    await self.sweep()
            except Exception:  # one bad pass must not stop scaling for good
                log.exception("reconciler pass failed")

    def _reestimate(self) -> None:
        """Starts a new capacity estimate when one is due and sandboxes exist to measure."""
        if self._estimate is None or self._clock.monotonic() < self._next_estimate:
            return
        if self._estimating is not None and not self._estimating.done():
            return
        if not any(p.records for p in self.pools.values()):
            return
        self._estimating = asyncio.create_task(self.estimate_capacity(self._estimate), name="capacity")

    def _sleep_for(self) -> float:
        now = self._clock.monotonic()
        wait = self.budget.interval
        for pool in self.pools.values():
            backoff = pool.backoff_remaining(now)
            if backoff > 0:
                wait = min(wait, backoff)
        return max(wait, 0.001)

    # -- one pass -----------------------------------------------------------------

    def reconcile(self) -> dict[str, int]:
        """One pass over every pool; returns the creates started per pool."""
        self.passes += 1
        now = self._clock.monotonic()
        pools = list(self.pools.values())
        for pool in pools:
            pool.replan(now)
        urgent: dict[str, int] = {}
        warm: dict[str, int] = {}
        levels: dict[str, int] = {}
        for pool in pools:
            if pool.backoff_remaining(now) > 0:
                continue
            total = pool.creates_needed()
            first = min(total, pool.urgent_needed())
            urgent[pool.name], warm[pool.name] = first, total - first
            levels[pool.name] = pool.creating
        room = self._room(pools)
        grants = share(levels, urgent, room)
        unmet = sum(urgent.values()) - sum(grants.values())
        room -= sum(grants.values())
        more = share({k: levels[k] + grants[k] for k in levels}, warm, room)
        started: dict[str, int] = {}
        for pool in pools:
            n = grants.get(pool.name, 0) + more.get(pool.name, 0)
            if n:
                started[pool.name] = pool.start_creates(n)
        if unmet > 0 and self.budget.max_total:
            self._reclaim(pools, unmet)
        for pool in pools:
            surplus = pool.surplus()
            if surplus:
                pool.trim(surplus)
        return started

    def _room(self, pools: list[WarmPool]) -> int:
        room = math.inf
        if self.budget.max_total:
            held = sum(len(p.records) for p in pools) + len(self.in_doubt)
            room = min(room, self.budget.max_total - held)
        room = min(room, self.start_window() - sum(p.creating for p in pools))
        if self._unplaced()[0]:
            # Sandboxes already wait for a node: more would only queue behind them.
            room = 0
        return int(max(0, min(room, 1 << 30)))

    def _unplaced(self) -> tuple[int, str]:
        if isinstance(self._backend, SchedulingPressure):
            return self._backend.unschedulable()
        return 0, ""

    # -- the engine's answers -------------------------------------------------------

    def _settle(self) -> None:
        """Starts one listing that settles in-doubt sandboxes, or (degraded,
        nothing else running) probes whether the engine answers again."""
        if self._settling is not None and not self._settling.done():
            return
        now = self._clock.monotonic()
        probe = self.health.degraded and not any(p.creating for p in self.pools.values())
        if not len(self.in_doubt) and not probe:
            return
        if now < self._next_probe:
            return
        self._next_probe = now + max(1.0, self.budget.interval)
        self._settling = asyncio.create_task(self._settle_once(), name="settle-in-doubt")

    async def _settle_once(self) -> int:
        if len(self.in_doubt):
            settled = await self.in_doubt.resolve()
        else:
            settled = 0
            began = self._clock.monotonic()
            try:
                async with self._clock.timeout(self.budget.call_timeout):
                    await self._backend.list()
            except TimeoutError:
                self.health.timed_out(Call.LIST, self.budget.call_timeout)
            except BackendError:
                self.health.failed()
            else:
                self.health.observe(Call.LIST, self._clock.monotonic() - began)
        self.poke()
        return settled

    def _reclaim(self, pools: list[WarmPool], unmet: int) -> None:
        """The total budget is full while acquirers wait: destroy warm
        sandboxes of pools nobody waits on (beyond their floor), the pool
        with the most to spare first. Destroys already under way count."""
        unmet -= sum(p.destroying for p in pools)
        donors = sorted(
            (p for p in pools if not p.waiting and p.ready > p.config.min_ready),
            key=lambda p: p.ready - p.config.min_ready,
            reverse=True,
        )
        for pool in donors:
            if unmet <= 0:
                break
            n = pool.trim(min(unmet, pool.ready - pool.config.min_ready))
            self.reclaimed += n
            unmet -= n

    # -- liveness -----------------------------------------------------------------

    async def sweep(self) -> int:
        """Asks the backend, in one call, which READY sandboxes still run;
        the dead are failed (and so replaced). Returns how many died."""
        if not isinstance(self._backend, LivenessProbe):
            return 0
        ready = [(p, r) for p in list(self.pools.values()) for r in p.ready_records() if r.handle]
        if not ready:
            return 0
        try:
            alive = await self._backend.alive([r.handle for _, r in ready])
        except BackendError as e:
            log.warning("liveness sweep skipped: %s", e)
            return 0
        dead = 0
        for pool, rec in ready:
            if rec.handle not in alive and rec.state is State.READY:
                log.warning("pool %s: warm sandbox %s died; replacing it", pool.name, rec.sandbox_id)
                pool.fail(rec, "died while warm")
                dead += 1
        return dead
