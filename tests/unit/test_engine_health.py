"""Honest capacity on the FakeBackend and a FakeClock: the host's capacity
estimate, the AIMD start window and the degraded-engine state, in-doubt
sandboxes settled as soon as the engine answers, and acquires that end in a
typed answer naming the cause instead of a hang."""

from __future__ import annotations

import asyncio

import pytest

from sandboxd.backends.base import HostFacts, Limits
from sandboxd.backends.fake import FakeBackend
from sandboxd.clock import FakeClock
from sandboxd.core import capacity
from sandboxd.core.lifecycle import State
from sandboxd.core.pools.congestion import Call, CongestionConfig, EngineHealth
from sandboxd.errors import DeadlineExceeded, ResourceExhausted
from tests.unit.conftest import MakeControl, wait_for

pytestmark = pytest.mark.timeout(30)

MiB = 1 << 20


# -- the capacity estimate -------------------------------------------------------------


def test_capacity_is_the_smallest_of_memory_threads_and_engine() -> None:
    limits = Limits(memory_bytes=512 * MiB, pids=256)
    facts = HostFacts(
        memory_bytes=24 << 30,
        cpus=2,
        threads_max=200_000,
        threads_in_use=2_000,
        overhead_memory_bytes=16 * MiB,
        overhead_threads=16,
        engine_max=600,
    )
    # Memory: 24 GiB x 0.9 / (512 MiB / 4 + 16 MiB) = 153.
    est = capacity.estimate(facts, limits, overcommit=4.0)
    assert (est.sandboxes, est.bound_by) == (153, "memory")
    # Small sandboxes: threads (178000 / (256 / 4 + 16) = 2225) and memory
    # (24 GiB x 0.9 / 32 MiB = 691) give way to the engine's 600.
    small = capacity.estimate(facts, Limits(memory_bytes=64 * MiB, pids=256), overcommit=4.0)
    assert (small.sandboxes, small.bound_by) == (600, "engine")
    few_threads = capacity.estimate(
        HostFacts(threads_max=32_768, threads_in_use=1_000, overhead_threads=16), limits, overcommit=4.0
    )
    assert (few_threads.sandboxes, few_threads.bound_by) == ((int(32_768 * 0.9) - 1_000) // 80, "threads")


def test_capacity_says_how_many_nodes_a_run_needs() -> None:
    est = capacity.estimate(HostFacts(engine_max=300, engine_starts_per_second=5.0), Limits())
    assert est.nodes_for(960) == 4 and est.starts_per_second == 5.0
    text = capacity.refusal(960, est)
    assert text.startswith("960 asked, this host holds ~300 (bound by engine")
    assert "you need 4 nodes like this one" in text
    assert capacity.estimate(HostFacts(), Limits()).sandboxes == 0  # nothing known: no ceiling


# -- the AIMD window and the degraded state ----------------------------------------------


def test_window_halves_on_slow_creates_grows_back_and_lets_go_at_the_bound() -> None:
    clock = FakeClock()
    in_flight = [8]
    h = EngineHealth(clock.monotonic, lambda: in_flight[0], CongestionConfig(slow_seconds=10.0))
    for _ in range(5):
        h.observe(Call.CREATE, 0.5)  # fast: no window yet, the static bound applies
    assert h.limit(8) is None
    h.observe(Call.CREATE, 12.0)  # slow: half of what is in flight
    assert h.limit(8) == 4 and h.cuts == 1
    h.observe(Call.CREATE, 12.0)  # the same slow burst: no second cut within a round trip
    assert h.limit(8) == 4 and h.cuts == 1
    clock.advance(2.0)
    h.observe(Call.CREATE, 3.0)  # 6x the 0.5 s baseline: slow too
    assert h.limit(8) == 2 and h.cuts == 2
    # Additive increase: about one per window's worth of fast creates (2 + 1/2 + 1/2.5 + 1/2.9).
    for _ in range(3):
        h.observe(Call.CREATE, 0.5)
    assert h.limit(8) == 3
    for _ in range(30):
        h.observe(Call.CREATE, 0.5)
    assert h.limit(8) is None  # grown back to the static bound: it lets go
    assert not h.degraded


def test_timeouts_degrade_the_engine_until_calls_are_fast_again() -> None:
    clock = FakeClock()
    h = EngineHealth(clock.monotonic, lambda: 8, CongestionConfig(recover_after=3))
    h.timed_out(Call.DESTROY, 60.0)
    assert h.degraded and h.limit(8) == 1
    assert "destroy calls time out" in h.describe()
    clock.advance(30.0)
    assert h.describe().startswith("engine degraded for 30s")
    h.observe(Call.CREATE, 0.5)
    h.observe(Call.LIST, 0.1)
    h.failed()  # an error is no success: the run of fast calls starts again
    h.observe(Call.CREATE, 0.5)
    h.observe(Call.CREATE, 0.5)
    assert h.degraded and h.limit(8) == 1  # no growth while degraded
    h.observe(Call.LIST, 0.1)
    assert not h.degraded and h.describe() == ""
    assert h.degraded_seconds_total == 30.0


# -- the control plane on a wedged engine ------------------------------------------------


async def test_a_wedged_engine_ends_acquires_typed_and_leaves_nothing_untracked(
    make_control: MakeControl,
) -> None:
    clock = FakeClock()
    backend = FakeBackend()
    h = await make_control(
        clock=clock,
        backend=backend,
        pools__create_timeout_seconds=5.0,
        pools__create_attempts=1,
        pools__liveness_interval_seconds=0.0,
    )
    reconciler = h.control.reconciler
    backend.wedge()
    pool = await h.pool(min_ready=2, max_size=4)
    await wait_for(lambda: pool.creating == 2 and backend._creating == 2, what="creates hang")
    clock.advance(5.0)  # the create timeout
    await wait_for(lambda: pool.creating == 0 and len(reconciler.in_doubt) == 2, what="booked in doubt")
    assert reconciler.health.degraded
    assert len(backend.sandboxes) == 2  # the engine made them, and never said so
    # While degraded: one start at a time, and the acquire ends at its
    # deadline with the cause named and nothing leased.
    reconciler.reconcile()
    assert pool.creating <= 1
    task = asyncio.ensure_future(h.acquire(timeout=3.0))
    await wait_for(lambda: pool.waiting == 1, what="in line")
    clock.advance(1.0)
    assert pool.oldest_wait == 1.0
    clock.advance(2.0)
    with pytest.raises(DeadlineExceeded, match="engine degraded"):
        await task
    assert pool.count(State.LEASED) == 0 and not h.control.leases.all()
    # The engine answers again: the doubts are settled by a listing, the
    # engine recovers on fast calls, and the pool fills.
    backend.unwedge()
    clock.advance(5.0)  # hung creates time out; one more listing is due
    reconciler.poke()
    await wait_for(lambda: len(reconciler.in_doubt) == 0, what="doubts settled")
    await wait_for(lambda: pool.ready == 2, what="refilled")
    await wait_for(lambda: not reconciler.health.degraded, what="recovered")
    tracked = {r.handle for r in pool.records.values()}
    assert set(backend.sandboxes) == tracked  # no orphans


async def test_host_capacity_is_the_default_ceiling_and_refusals_name_it(make_control: MakeControl) -> None:
    clock = FakeClock()
    backend = FakeBackend()
    backend.host_facts_value = HostFacts(engine_max=4)
    h = await make_control(clock=clock, backend=backend)
    assert h.control.reconciler.budget.max_total == 4
    pool = await h.pool(min_ready=0, max_size=8)
    with pytest.raises(ResourceExhausted, match="host holds at most 4"):
        await h.acquire(n=6)
    lease, _ = await h.acquire(n=4)
    task = asyncio.ensure_future(h.acquire(timeout=2.0))
    await wait_for(lambda: pool.waiting == 1, what="in line")
    clock.advance(2.0)
    with pytest.raises(DeadlineExceeded, match="host capacity: 4 of 4 sandboxes in use"):
        await task
    assert [x.lease_id for x in h.control.leases.all()] == [lease.lease_id]


async def test_preflight_says_what_the_host_holds(make_control: MakeControl) -> None:
    from sandboxd.core.preflight import ProblemKind, preflight

    backend = FakeBackend()
    backend.host_facts_value = HostFacts(engine_max=300)
    h = await make_control(backend=backend)
    report = await preflight(h.control, pool=None, image="img", limits=None, concurrent=960, duration=0.0)
    assert report.host_sandboxes == 300
    problem = next(p for p in report.problems if "asked" in p.message)
    assert problem.kind is ProblemKind.CAPACITY_TOO_SMALL
    assert problem.message.startswith("960 asked, this host holds ~300")
    assert "you need 4 nodes like this one" in problem.message
