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

Every backend create attempt goes through one pacer (``max_create_rate``),
and a cheap liveness sweep (one backend call for all pools) replaces warm
sandboxes that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from opentelemetry.metrics import Meter

from sandboxd.backends.base import Backend, LivenessProbe
from sandboxd.clock import Clock
from sandboxd.core.lifecycle import State
from sandboxd.core.meters import PoolMeters
from sandboxd.core.pools import PoolTuning, WarmPool
from sandboxd.core.scaling import Ewma, PolicyConfig, share
from sandboxd.errors import BackendError
from sandboxd.settings import PoolSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """Limits across all pools; 0 = none."""

    max_total: int = 0
    """Sandboxes in any state (releasing included) across pools."""
    max_starting: int = 0
    """Sandboxes starting across pools."""
    create_rate: float = 0.0
    """Backend create attempts per second across pools."""
    create_burst: int = 0
    """Attempts the pacer lets through at once after a quiet spell (0 = one second's worth)."""
    interval: float = 0.5
    """Longest time between two passes."""
    liveness_interval: float = 5.0
    """Seconds between liveness sweeps of READY sandboxes; 0 = none."""


def budget_from(settings: PoolSettings) -> Budget:
    return Budget(
        max_total=settings.max_total_sandboxes,
        max_starting=settings.max_total_starting,
        create_rate=settings.max_create_rate,
        interval=settings.reconcile_interval_seconds,
        liveness_interval=settings.liveness_interval_seconds,
    )


def tuning_from(settings: PoolSettings) -> PoolTuning:
    return PoolTuning(
        policy=PolicyConfig(
            scale_down_delay=settings.scale_down_delay_seconds,
            rate_headroom=settings.rate_headroom,
            create_throughput=settings.max_create_rate,
            max_starting=settings.max_starting,
        ),
        create_attempts=settings.create_attempts,
        rate_window_seconds=settings.rate_window_seconds,
        announcement_ttl_seconds=settings.announcement_ttl_seconds,
        refill_defer_seconds=settings.refill_defer_seconds,
    )


class Pacer:
    """A leaky bucket for backend create attempts: at most ``rate`` a second,
    with ``burst`` let through at once after a quiet spell. Callers queue in
    order. It paces the real engine, so it runs on real (loop) time."""

    def __init__(self, rate: float, burst: int = 0, now: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst or math.ceil(rate))
        self._now = now
        self._tat = 0.0
        self.waited = 0

    def reserve(self) -> float:
        """Takes the next slot; returns how long to wait for it."""
        if self.rate <= 0:
            return 0.0
        interval = 1.0 / self.rate
        now = self._now()
        tat = max(self._tat, now - (self.burst - 1) * interval)
        self._tat = tat + interval
        return max(0.0, tat - now)

    async def wait(self) -> None:
        delay = self.reserve()
        if delay > 0:
            self.waited += 1
            await asyncio.sleep(delay)


class Reconciler:
    def __init__(
        self,
        backend: Backend,
        clock: Clock,
        budget: Budget | None = None,
        *,
        tuning: PoolTuning | None = None,
        meter: Meter | None = None,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self.budget = budget or Budget()
        self.tuning = tuning or PoolTuning()
        self.pools: dict[str, WarmPool] = {}
        self.meters = PoolMeters(meter, lambda: list(self.pools.values()))
        self.pacer = Pacer(self.budget.create_rate, self.budget.create_burst)
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

    @classmethod
    def from_settings(
        cls, settings: PoolSettings, backend: Backend, clock: Clock, meter: Meter | None = None
    ) -> Reconciler:
        return cls(backend, clock, budget_from(settings), tuning=tuning_from(settings), meter=meter)

    # -- PoolHost -------------------------------------------------------------

    def attach(self, pool: WarmPool) -> None:
        self.pools[pool.name] = pool
        self.poke()

    def detach(self, pool: WarmPool) -> None:
        if self.pools.get(pool.name) is pool:
            del self.pools[pool.name]
        self.poke()

    def poke(self) -> None:
        self._wake.set()
        if self._deferring and any(p.waiting for p in self.pools.values()):
            # An acquirer now waits: what was deferred may be what it needs.
            self._let_deferred_go()

    async def paced(self, deferrable: bool = False) -> None:
        if deferrable and self._urgent and self.tuning.refill_defer_seconds > 0:
            self.deferred += 1
            self._deferring += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._go.wait(), self.tuning.refill_defer_seconds)
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
        self._startup.add(seconds)

    def startup_estimate(self) -> float | None:
        return self._startup.value if self._startup.samples else None

    # -- running ----------------------------------------------------------------

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="reconciler")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self._next_sweep = loop.time() + self.budget.liveness_interval
        while True:
            # asyncio.timeout, not wait_for: a poke racing a cancel must not
            # swallow the cancel (Python 3.11's wait_for can).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sleep_for()):
                    await self._wake.wait()
            self._wake.clear()
            try:
                self.reconcile()
                if self.budget.liveness_interval > 0 and loop.time() >= self._next_sweep:
                    self._next_sweep = loop.time() + self.budget.liveness_interval
                    await self.sweep()
            except Exception:  # one bad pass must not stop scaling for good
                log.exception("reconciler pass failed")

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
            room = min(room, self.budget.max_total - sum(len(p.records) for p in pools))
        if self.budget.max_starting:
            room = min(room, self.budget.max_starting - sum(p.creating for p in pools))
        return int(max(0, min(room, 1 << 30)))

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
