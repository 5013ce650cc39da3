"""The reconciler and the start pipeline on the FakeBackend: pools follow
announced demand and go back down, creates in flight are counted (no
over-creation), the global budget is shared fairly, failures are retried
without a storm, dead warm sandboxes are replaced, metrics are exported."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from sandboxd.backends.base import SandboxSpec
from sandboxd.backends.fake import FakeBackend
from sandboxd.clock import FakeClock
from sandboxd.core.lifecycle import State
from sandboxd.core.reconciler import Pacer
from sandboxd.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    PermanentBackendError,
    TransientBackendError,
)
from sandboxd.telemetry import render
from tests.unit.conftest import Harness, MakeControl, wait_for

pytestmark = pytest.mark.timeout(30)


class Counting(FakeBackend):
    """Records the most sandboxes that existed (or were being created) at once."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.peak = 0

    async def create(self, spec: SandboxSpec) -> str:
        self.peak = max(self.peak, len(self.sandboxes) + self._creating + 1)
        return await super().create(spec)


class Gated(Counting):
    """Counting, its creates held until ``gate`` is set."""

    def __init__(self, gate: asyncio.Event, **kw: object) -> None:
        super().__init__(**kw)
        self.gate = gate

    async def create(self, spec: SandboxSpec) -> str:
        await self.gate.wait()
        return await super().create(spec)


class Ticking(FakeBackend):
    """Each create takes ``seconds`` on a FakeClock (so start-up latency is measured)."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__()
        self.clock = clock
        self.seconds = seconds

    async def create(self, spec: SandboxSpec) -> str:
        self.clock.advance(self.seconds)
        return await super().create(spec)


class Rejecting(FakeBackend):
    """Every create fails, transiently or for good."""

    def __init__(self, error: type[Exception], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.error = error
        self.attempts: list[float] = []

    async def create(self, spec: SandboxSpec) -> str:
        self.attempts.append(time.monotonic())
        self.creates += 1
        self._creating += 1
        self.max_concurrent_creates = max(self.max_concurrent_creates, self._creating)
        try:
            await asyncio.sleep(0)  # a yield, so attempts started together overlap
            raise self.error("the engine said no")
        finally:
            self._creating -= 1


# -- following announced demand ------------------------------------------------------


async def test_prewarm_fills_a_demand_pool_and_it_goes_back_down_after_the_delay(
    make_control: MakeControl,
) -> None:
    clock = FakeClock()
    h = await make_control(clock=clock, pools__scale_down_delay_seconds=30.0)
    pool = await h.pool(min_ready=1, max_size=16)
    await h.control.update_pool("p", None, None, max_ready=12)
    await wait_for(lambda: pool.ready == 1, what="floor")
    pool.announce("gen", 10, 0.0, 60.0)
    await wait_for(lambda: pool.ready == 10 and pool.creating == 0, what="prewarmed")
    assert pool.warm_target == 10
    # Acquires consume the announcement: what they took is not refilled.
    await h.acquire(n=4)
    await wait_for(lambda: pool.announced("gen") == 6 and pool.ready == 6, what="consumed")
    h.control.reconciler.reconcile()
    assert pool.creating == 0 and pool.warm_target == 6
    # Withdrawn: nothing more is created, but what is warm is kept for the delay ...
    pool.announce("gen", 0, 0.0, 0.0)
    clock.advance(10.0)
    h.control.reconciler.reconcile()
    assert pool.warm_target == 1 and pool.ready == 6
    # ... and destroyed down to the floor once it has passed.
    clock.advance(25.0)
    h.control.reconciler.reconcile()
    await wait_for(lambda: pool.ready == 1 and pool.count(State.RELEASING) == 0, what="scaled down")
    await pool.drain()
    assert h.backend.creates == 10  # the floor counts towards the 10 announced; none re-created


async def test_announcement_due_later_starts_warming_within_its_lead(make_control: MakeControl) -> None:
    clock = FakeClock()
    h = await make_control(clock=clock, backend=Ticking(clock, 1.0))
    pool = await h.pool(min_ready=1, max_size=64)
    await wait_for(lambda: pool.ready == 1, what="floor")  # measures a 1 s start-up
    await h.control.update_pool("p", None, None, max_ready=64)
    pool.announce("gen", 16, 120.0, 60.0)
    h.control.reconciler.reconcile()
    assert pool.warm_target == 1 and pool.creating == 0
    clock.advance(110.0)  # lead: 1 s start-up + 16 / 8 per second + 2 s margin = 5 s
    h.control.reconciler.reconcile()
    assert pool.warm_target == 1
    clock.advance(6.0)
    h.control.reconciler.reconcile()
    assert pool.warm_target == 16
    await wait_for(lambda: pool.ready == 16, what="warm by the due time")


async def test_announcing_to_a_static_pool_is_refused(h: Harness) -> None:
    pool = await h.pool(min_ready=1, max_size=4)
    with pytest.raises(FailedPrecondition, match="max_ready"):
        pool.announce("gen", 2, 0.0, 0.0)
    await h.control.update_pool("p", None, None, max_ready=4)
    with pytest.raises(InvalidArgument, match="count"):
        pool.announce("gen", 5, 0.0, 0.0)
    with pytest.raises(InvalidArgument, match="in_seconds"):
        pool.announce("gen", 1, -1.0, 0.0)


async def test_max_ready_is_validated(h: Harness) -> None:
    await h.pool(min_ready=0, max_size=4)
    with pytest.raises(InvalidArgument, match="max_ready"):
        await h.control.update_pool("p", None, None, max_ready=5)


async def test_unannounced_acquires_raise_the_rate_and_the_warm_target(make_control: MakeControl) -> None:
    clock = FakeClock()
    h = await make_control(clock=clock, backend=Ticking(clock, 0.0), pools__rate_window_seconds=10.0)
    pool = await h.pool(min_ready=0, max_size=64)
    await h.control.update_pool("p", None, None, max_ready=32)
    for _ in range(20):
        lease, _ = await h.acquire()
        await h.control.release(lease.lease_id, [])
        clock.advance(0.25)  # 4 acquires per second
    assert pool.acquire_rate == pytest.approx(4 * (1 - math.exp(-0.5)), rel=0.1)
    h.backend.seconds = 2.0  # the engine slows down: the next start-up is measured at 2 s
    await h.acquire()
    # The refill it takes starts with the reconciler's next pass (passes close together coalesce).
    await wait_for(lambda: pool.startup_seconds > 1.0, what="the slow start-up measured")
    plan = pool.replan(clock.monotonic())
    # Little's law: rate x start-up x 1.5 headroom are kept warm.
    assert plan.rate_term == math.ceil(pool.acquire_rate * pool.startup_seconds * 1.5)
    assert plan.rate_term >= 2
    assert pool.warm_target == plan.rate_term
    await wait_for(lambda: pool.ready >= plan.rate_term, what="warmed for the rate")


# -- no over-creation, no storm ---------------------------------------------------------


async def test_slow_backend_and_many_pokes_do_not_over_create(make_control: MakeControl) -> None:
    backend = Counting(start_delay=0.05)
    h = await make_control(backend=backend, pools__max_starting=4, pools__max_starting_limit=0)
    pool = await h.pool(min_ready=0, max_size=32)
    await h.control.update_pool("p", None, None, max_ready=20)
    pool.announce("gen", 20, 0.0, 60.0)
    for _ in range(50):  # stale views from many passes while creates are slow
        h.control.reconciler.reconcile()
        pool.poke()
        await asyncio.sleep(0)
    await wait_for(lambda: pool.ready == 20, timeout=10.0, what="20 ready")
    await pool.drain()
    assert backend.creates == 20
    assert backend.max_concurrent_creates == 4
    assert backend.peak == 20


async def test_transient_failures_are_retried_in_place_without_over_creation(
    make_control: MakeControl,
) -> None:
    backend = Counting()
    backend.transient_failures = 5
    h = await make_control(backend=backend, pools__max_starting=3)
    pool = await h.pool(min_ready=4, max_size=8)
    await wait_for(lambda: pool.ready == 4 and pool.creating == 0, timeout=15.0, what="recovered")
    await pool.drain()
    assert backend.creates == 4 + 5
    assert len(backend.sandboxes) == 4
    assert backend.max_concurrent_creates <= 3
    assert pool.failed_total == 5 and pool.last_error == ""


async def test_each_retry_uses_a_fresh_sandbox_name(make_control: MakeControl) -> None:
    names: list[str] = []

    class Recording(FakeBackend):
        async def create(self, spec: SandboxSpec) -> str:
            names.append(spec.sandbox_id)
            return await super().create(spec)

    backend = Recording()
    backend.transient_failures = 2  # a half-done attempt may still hold its name
    h = await make_control(backend=backend)
    pool = await h.pool(min_ready=1, max_size=2)
    await wait_for(lambda: pool.ready == 1, timeout=10.0, what="recovered")
    assert len(names) == len(set(names)) == 3
    (rec,) = pool.records.values()
    assert rec.sandbox_id == names[-1]
    assert h.control.get_sandbox(rec.sandbox_id) is rec


async def test_a_backend_that_rejects_everything_is_not_stormed(make_control: MakeControl) -> None:
    backend = Rejecting(TransientBackendError)
    h = await make_control(backend=backend, pools__max_starting=4, pools__create_attempts=3)
    pool = await h.pool(min_ready=0, max_size=64)
    waiters = [asyncio.create_task(h.acquire(n=8, timeout=1.5)) for _ in range(4)]
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, DeadlineExceeded) for r in results)
    assert "the engine said no" in str(results[0])
    # 32 sandboxes were wanted, but never more than 4 attempts at once, each
    # retried with backoff, while the pool held back new creates.
    assert backend.max_concurrent_creates <= 4
    assert len(backend.attempts) <= 40, len(backend.attempts)
    gaps = [b - a for a, b in zip(backend.attempts, backend.attempts[1:], strict=False)]
    assert sum(gaps) / max(len(gaps), 1) > 0.02
    assert pool.failed_total == len(backend.attempts)
    assert pool.count(State.LEASED) == 0 and not backend.sandboxes


async def test_a_backend_that_rejects_for_good_fails_fast(make_control: MakeControl) -> None:
    backend = Rejecting(PermanentBackendError)
    h = await make_control(backend=backend, pools__max_starting=4)
    pool = await h.pool(min_ready=0, max_size=16)
    await h.control.update_pool("p", None, None, max_ready=16)
    pool.announce("gen", 16, 0.0, 60.0)
    started = time.monotonic()
    with pytest.raises(FailedPrecondition, match="the engine said no"):
        await h.acquire(n=2, timeout=10.0)
    assert time.monotonic() - started < 2.0
    await pool.drain()
    assert backend.creates <= 4  # only those already in flight; none retried
    assert pool.creates_needed() == 0


async def test_create_failures_are_counted_by_reason(make_control: MakeControl) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    backend = FakeBackend()
    backend.transient_failures = 2
    h = await make_control(backend=backend)
    # The control plane of the harness has a no-op meter; build one with a real one.
    from sandboxd.core.control import AcquireRequest, ControlPlane
    from sandboxd.core.state import SqliteStateStore

    control = ControlPlane(
        h.settings, backend, SqliteStateStore(None), h.clock, meter=provider.get_meter("t")
    )
    await control.start()
    try:
        from sandboxd.core.pools import PoolConfig

        pool = await control.create_pool(PoolConfig("m", "img:1", 2, 4, h.settings.limits.__class__()))  # type: ignore[arg-type]
        await wait_for(lambda: pool.ready == 2, timeout=10.0, what="warm")
        await control.acquire(AcquireRequest("m", timeout=5.0))
        text = render(reader.get_metrics_data())
    finally:
        await control.stop()
        provider.shutdown()
    assert 'sandboxd_create_failures_total{pool="m",reason="transient"} 2' in text
    assert 'sandboxd_pool_sandboxes{pool="m",state="leased"} 1' in text
    assert 'sandboxd_pool_warm_target{pool="m"} 2' in text
    assert 'sandboxd_acquire_latency_seconds_count{pool="m"} 1' in text
    assert 'sandboxd_startup_latency_seconds_count{pool="m"} ' in text
    assert "# TYPE sandboxd_acquire_latency_seconds histogram" in text


# -- the global budget -----------------------------------------------------------------


async def test_total_budget_is_shared_fairly_between_pools(make_control: MakeControl) -> None:
    # One create at a time per pool, so both pools compete for the budget.
    # Creates wait until both pools exist: on a loaded host the first pool
    # could otherwise fill the budget before the second is made.
    both = asyncio.Event()
    backend = Gated(both, start_delay=0.02)
    h = await make_control(backend=backend, pools__max_total_sandboxes=6, pools__max_starting=1)
    a = await h.pool("a", min_ready=6, max_size=8)
    b = await h.pool("b", min_ready=6, max_size=8)
    both.set()
    await wait_for(lambda: a.ready + b.ready == 6 and not a.creating and not b.creating, what="budget full")
    # A pass of the background loop on the full budget, then one more here:
    # neither may create past it.
    passes = h.control.reconciler.passes
    a.poke()
    await wait_for(lambda: h.control.reconciler.passes > passes, what="a pass on the full budget")
    h.control.reconciler.reconcile()
    await a.drain()
    await b.drain()
    assert backend.peak <= 6
    assert backend.creates == 6
    assert abs(a.ready - b.ready) <= 1


async def test_total_starting_is_shared_fairly(make_control: MakeControl) -> None:
    backend = FakeBackend(start_delay=60.0)
    h = await make_control(backend=backend, pools__max_total_starting=4, pools__max_starting=8)
    a = await h.pool("a", min_ready=8, max_size=8)
    await wait_for(lambda: a.creating == 4, what="a takes all slots")
    b = await h.pool("b", min_ready=8, max_size=8)
    h.control.reconciler.reconcile()
    assert a.creating + b.creating == 4 and b.creating == 0  # no slot free yet
    # When slots free up, the pool with less in flight gets them.
    for task in list(a._creates)[:2]:
        task.cancel()
    await wait_for(lambda: b.creating == 2, what="b gets the freed slots")
    assert a.creating == 2


async def test_waiters_reclaim_warm_sandboxes_of_other_pools_when_the_budget_is_full(
    make_control: MakeControl,
) -> None:
    backend = Counting()
    h = await make_control(backend=backend, pools__max_total_sandboxes=4)
    a = await h.pool("a", min_ready=0, max_size=8)
    await h.control.update_pool("a", None, None, max_ready=8)
    a.announce("gen", 4, 0.0, 600.0)
    await wait_for(lambda: a.ready == 4, what="a warm")
    await h.pool("b", min_ready=0, max_size=8)
    _lease, records = await h.acquire("b", n=2, timeout=5.0)
    assert len(records) == 2
    assert h.control.reconciler.reclaimed >= 2
    assert backend.peak <= 4


# -- pacing and liveness ----------------------------------------------------------------


def test_pacer_lets_a_burst_through_then_paces() -> None:
    clock = FakeClock(start=100.0)
    pacer = Pacer(rate=4.0, burst=2, clock=clock)
    assert [pacer.reserve() for _ in range(4)] == [0.0, 0.0, 0.25, 0.5]
    clock.advance(10.0)  # quiet spell: the burst is available again
    assert pacer.reserve() == 0.0
    assert Pacer(rate=0.0).reserve() == 0.0


async def test_create_attempts_are_paced(make_control: MakeControl) -> None:
    h = await make_control(pools__max_create_rate=40.0)
    pool = await h.pool(min_ready=0, max_size=64)
    started = time.monotonic()
    await h.control.update_pool("p", 60, None)
    await wait_for(lambda: pool.ready == 60, timeout=10.0, what="60 ready")
    # 40 at once, then 20 more at 40 per second.
    assert time.monotonic() - started >= 0.4
    assert h.control.reconciler.pacer.waited >= 15


async def test_warm_sandboxes_that_die_are_replaced(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=3, max_size=4)
    victim = pool.ready_records()[0]
    h.backend.kill(victim.handle)
    assert await h.control.reconciler.sweep() == 1
    assert victim.state in (State.FAILED, State.GONE)
    assert victim.failure_reason == "died while warm"
    await wait_for(lambda: pool.ready == 3 and pool.creating == 0, what="replaced")
    assert victim.handle not in h.backend.sandboxes
    assert await h.control.reconciler.sweep() == 0


async def test_liveness_sweep_runs_in_the_background(make_control: MakeControl) -> None:
    h = await make_control(pools__liveness_interval_seconds=0.05)
    pool = await h.warm_pool(min_ready=2, max_size=4)
    victim = pool.ready_records()[0]
    h.backend.kill(victim.handle)
    await wait_for(lambda: victim.state is State.GONE, what="swept")
    await wait_for(lambda: pool.ready == 2, what="replaced")


async def test_refills_wait_for_urgent_work_but_creates_an_acquirer_needs_do_not(
    make_control: MakeControl,
) -> None:
    h = await make_control(pools__refill_defer_seconds=60.0)
    pool = await h.warm_pool(min_ready=2, max_size=8)
    reconciler = h.control.reconciler
    created = h.backend.creates
    with reconciler.urgent():
        await h.acquire(n=2)
        # The warm buffer is empty; topping it up waits for the urgent work.
        await wait_for(lambda: reconciler.deferred >= 1, what="a deferred refill")
        assert pool.ready == 0 and h.backend.creates == created
        # An acquirer that has to wait for a sandbox is not made to wait longer.
        lease, records = await h.acquire(n=1, timeout=3.0)
        assert len(records) == 1
    await wait_for(lambda: pool.ready == 2 and pool.creating == 0, what="refilled once calm")
    await h.control.release(lease.lease_id, [])


async def test_a_deferred_refill_goes_ahead_after_the_bound(make_control: MakeControl) -> None:
    h = await make_control(pools__refill_defer_seconds=0.2)
    pool = await h.warm_pool(min_ready=1, max_size=4)
    with h.control.reconciler.urgent():
        await h.acquire(n=1)
        await wait_for(lambda: pool.ready == 1, timeout=5.0, what="refilled despite urgent work")


# -- the injected clock drives every wait -------------------------------------------------


async def test_fake_clock_sleeps_and_timeouts_end_only_when_it_is_advanced() -> None:
    clock = FakeClock()
    sleeper = asyncio.create_task(clock.sleep(5.0))

    async def timed_out() -> bool:
        try:
            async with clock.timeout(2.0):
                await asyncio.Event().wait()
        except TimeoutError:
            return True
        return False

    timer = asyncio.create_task(timed_out())
    await asyncio.sleep(0)
    clock.advance(1.0)
    await asyncio.sleep(0)
    assert not sleeper.done() and not timer.done()
    clock.advance(1.0)
    assert await timer
    assert not sleeper.done()
    clock.advance(3.0)
    await sleeper


async def test_liveness_sweeps_wait_for_the_injected_clock(make_control: MakeControl) -> None:
    clock = FakeClock()
    h = await make_control(clock=clock, pools__liveness_interval_seconds=5.0)
    pool = await h.warm_pool(min_ready=2, max_size=4)
    reconciler = h.control.reconciler
    victim = pool.ready_records()[0]
    h.backend.kill(victim.handle)
    passes = reconciler.passes
    pool.poke()
    await wait_for(lambda: reconciler.passes > passes, what="a pass")
    assert victim.state is State.READY  # the sweep is not due on the clock yet
    clock.advance(5.0)
    await wait_for(lambda: victim.state is State.GONE, what="swept once the interval passed")
    await wait_for(lambda: pool.ready == 2, what="replaced")
