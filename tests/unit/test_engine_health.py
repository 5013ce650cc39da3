"""Honest capacity on the FakeBackend and a FakeClock: the host's capacity
estimate, the AIMD start window and the degraded-engine state, in-doubt
sandboxes settled as soon as the engine answers, and acquires that end in a
typed answer naming the cause instead of a hang."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import socket

import aiohttp
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd.app import ENGINE_SERVICE, build_app
from sandboxd.backends.base import HostFacts, Limits
from sandboxd.backends.fake import FakeBackend
from sandboxd.clock import FakeClock
from sandboxd.core import capacity
from sandboxd.core.lifecycle import State
from sandboxd.core.pools.config import PoolConfig
from sandboxd.core.pools.congestion import Call, CongestionConfig, EngineHealth
from sandboxd.errors import DeadlineExceeded, ResourceExhausted
from sandboxd.telemetry.status import run_status
from tests.unit.conftest import IMAGE, MakeControl, make_settings, wait_for

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


def test_a_host_that_reserves_requests_shares_memory_that_many_ways() -> None:
    # Kubernetes' scheduler reserves each Pod's request (here the whole limit):
    # the server's memory_overcommit cannot make more fit.
    facts = HostFacts(memory_bytes=10 << 30, nodes=3, memory_share=1.0)
    est = capacity.estimate(facts, Limits(memory_bytes=1 << 30, pids=0), overcommit=4.0)
    assert (est.per_node, est.sandboxes, est.bound_by) == (9, 27, "memory")
    halved = capacity.estimate(dataclasses.replace(facts, memory_share=0.5), Limits(memory_bytes=1 << 30))
    assert halved.per_node == 18
    assert "these 3 nodes hold ~27" in capacity.refusal(100, est)
    assert "you need 12 nodes like these" in capacity.refusal(100, est)
    quota = capacity.estimate(
        dataclasses.replace(facts, quota_max=5, quota_detail="ResourceQuota q: pods 5"),
        Limits(memory_bytes=1 << 30),
    )
    assert (quota.sandboxes, quota.bound_by) == (5, "quota")
    assert capacity.refusal(8, quota).startswith("8 asked, the quotas allow ~5 (ResourceQuota q: pods 5")


def test_capacity_says_how_many_nodes_a_run_needs() -> None:
    est = capacity.estimate(HostFacts(engine_max=300, engine_starts_per_second=5.0), Limits())
    assert est.nodes_for(960) == 4 and est.starts_per_second == 5.0
    text = capacity.refusal(960, est)
    assert text.startswith("960 asked, this host holds ~300 (bound by engine")
    assert "you need 4 nodes like this one" in text
    assert capacity.estimate(HostFacts(), Limits()).sandboxes == 0  # nothing known: no ceiling


# -- the AIMD window and the degraded state ----------------------------------------------


def test_window_grows_past_max_starting_while_creates_stay_fast_and_it_binds() -> None:
    clock = FakeClock()
    in_flight = [0]
    h = EngineHealth(clock.monotonic, lambda: in_flight[0], CongestionConfig(most=20))
    assert h.limit(8) == 8  # the pools' max_starting to begin with
    for _ in range(10):
        h.observe(Call.CREATE, 0.5)  # fast, but only one start in flight: no reason to grow
    assert h.limit(8) == 8 and h.grows == 0
    for _ in range(4):
        in_flight[0] = h.limit(8) - 1  # the window binds: the others and this one filled it
        h.observe(Call.CREATE, 0.6)  # within 1.5x the fastest (0.5 s): slow start, +1 each
    assert h.limit(8) == 12
    in_flight[0] = 11
    h.observe(Call.CREATE, 0.9)  # 1.8x the fastest: the engine is busy, hold
    assert h.limit(8) == 12
    in_flight[0] = 5
    h.observe(Call.CREATE, 0.5)  # fast, but the window does not bind: hold
    assert h.limit(8) == 12
    for _ in range(20):
        in_flight[0] = h.limit(8) - 1
        h.observe(Call.CREATE, 0.5)
    assert h.limit(8) == 20  # never past `most`
    assert h.limit(8, ceiling=10) == 10  # a hard ceiling (max_total_starting) still binds
    assert not h.degraded


def test_window_halves_on_slow_creates_then_grows_back_additively() -> None:
    clock = FakeClock()
    in_flight = [7]
    h = EngineHealth(clock.monotonic, lambda: in_flight[0], CongestionConfig(slow_seconds=10.0, most=8))
    assert h.limit(8) == 8
    for _ in range(5):
        h.observe(Call.CREATE, 0.5)
    assert h.limit(8) == 8  # `most` = max_starting: a fixed window unless cut
    h.observe(Call.CREATE, 12.0)  # slow: half the window
    assert h.limit(8) == 4 and h.cuts == 1
    h.observe(Call.CREATE, 12.0)  # the same slow burst: no second cut within a round trip
    assert h.limit(8) == 4 and h.cuts == 1
    clock.advance(2.0)
    h.observe(Call.CREATE, 3.0)  # 6x the 0.5 s baseline: slow too
    assert h.limit(8) == 2 and h.cuts == 2
    assert h.limit(16) == 2  # a pool added after a cut does not undo it
    # Past the cut's threshold, additive increase: about one per window's worth
    # of fast creates (2 + 1/2 + 1/2.5 + 1/2.9).
    for _ in range(3):
        h.observe(Call.CREATE, 0.5)
    assert h.limit(8) == 3
    for _ in range(30):
        h.observe(Call.CREATE, 0.5)
    assert h.limit(8) == 8
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


# -- the window on the control plane -------------------------------------------------------


@pytest.mark.parametrize(("limit", "grows"), [(64, True), (0, False)])
async def test_a_burst_starts_more_than_max_starting_while_creates_stay_fast(
    make_control: MakeControl, limit: int, grows: bool
) -> None:
    backend = FakeBackend(start_delay=0.02)  # creates overlap (an instant one never does)
    h = await make_control(
        backend=backend,
        pools__max_starting=2,
        pools__max_starting_limit=limit,
        pools__liveness_interval_seconds=0.0,
    )
    pool = await h.pool(min_ready=40, max_size=40)
    await wait_for(lambda: pool.ready == 40, what="warmed")
    window = h.control.reconciler.start_window()
    if grows:
        assert window > 2 and backend.max_concurrent_creates > 2
    else:  # max_starting_limit 0: a fixed window of max_starting
        assert window == 2 and backend.max_concurrent_creates <= 2


async def test_a_deadline_spent_waiting_for_starts_names_the_start_rate(make_control: MakeControl) -> None:
    clock = FakeClock()
    backend = FakeBackend()
    h = await make_control(
        clock=clock, backend=backend, pools__max_starting=2, pools__liveness_interval_seconds=0.0
    )
    backend.wedge()  # creates accepted and in flight; none has timed out yet
    pool = await h.pool(min_ready=0, max_size=8)
    task = asyncio.ensure_future(h.acquire(n=3, timeout=2.0))
    await wait_for(lambda: pool.waiting == 1 and pool.creating == 2, what="starting")
    clock.advance(2.0)
    with pytest.raises(DeadlineExceeded, match="start-up: the engine starts 2 at a time.*owed 3 more"):
        await task
    assert not h.control.reconciler.health.degraded
    assert pool.count(State.LEASED) == 0 and not h.control.leases.all()
    backend.unwedge()


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


async def test_a_destroy_without_answer_stays_in_doubt_until_a_listing_settles_it(
    make_control: MakeControl,
) -> None:
    clock = FakeClock()
    backend = FakeBackend()
    h = await make_control(
        clock=clock,
        backend=backend,
        pools__create_timeout_seconds=5.0,
        pools__max_total_sandboxes=2,
        pools__liveness_interval_seconds=0.0,
    )
    reconciler = h.control.reconciler
    pool = await h.pool(min_ready=0, max_size=2)
    lease, records = await h.acquire(n=2)
    gone = records[0].handle
    backend.wedge()
    release = asyncio.ensure_future(h.control.release(lease.lease_id, [records[0].sandbox_id]))
    await wait_for(lambda: pool.destroying == 1, what="destroying")
    clock.advance(5.0)  # the destroy gets no answer
    await release
    await wait_for(lambda: len(reconciler.in_doubt) == 1, what="booked in doubt")
    (doubt,) = reconciler.in_doubt.entries()
    assert doubt.call is Call.DESTROY and doubt.handle == gone
    assert reconciler.health.degraded and gone in backend.sandboxes
    # In doubt, it still counts against the ceiling: nothing can take its place.
    waiter = asyncio.ensure_future(h.acquire(timeout=1.0))
    await wait_for(lambda: pool.waiting == 1, what="in line")
    clock.advance(1.0)
    with pytest.raises(DeadlineExceeded, match="engine degraded"):
        await waiter
    backend.unwedge()
    clock.advance(5.0)
    reconciler.poke()
    await wait_for(lambda: len(reconciler.in_doubt) == 0, what="settled")
    assert gone not in backend.sandboxes  # found by the listing, and removed
    assert set(backend.sandboxes) == {r.handle for r in pool.records.values()}


async def test_capacity_is_estimated_again_on_live_sandboxes_unless_an_operator_set_it(
    make_control: MakeControl,
) -> None:
    from sandboxd.core import reconciler as reconciler_module

    clock = FakeClock()
    backend = FakeBackend()
    backend.host_facts_value = HostFacts(engine_max=6)
    h = await make_control(clock=clock, backend=backend, pools__liveness_interval_seconds=0.0)
    reconciler = h.control.reconciler
    assert reconciler.budget.max_total == 6
    backend.host_facts_value = HostFacts(engine_max=4, measured=True)
    clock.advance(reconciler_module.CAPACITY_EVERY_SECONDS)
    reconciler._reestimate()  # what each pass does: due, but no sandbox to measure yet
    assert reconciler._estimating is None and reconciler.budget.max_total == 6
    await h.warm_pool(min_ready=1, max_size=2)
    reconciler.poke()
    await wait_for(lambda: reconciler.budget.max_total == 4, what="estimated again")
    assert reconciler.capacity.bound_by == "engine"
    # An operator's ceiling is never replaced by an estimate.
    clock2 = FakeClock()
    backend2 = FakeBackend()
    backend2.host_facts_value = HostFacts(engine_max=6)
    h2 = await make_control(
        clock=clock2, backend=backend2, pools__max_total_sandboxes=3, pools__liveness_interval_seconds=0.0
    )
    await h2.warm_pool(min_ready=1, max_size=2)
    backend2.host_facts_value = HostFacts(engine_max=40)
    clock2.advance(reconciler_module.CAPACITY_EVERY_SECONDS)
    h2.control.reconciler.poke()
    await wait_for(lambda: h2.control.reconciler.capacity.sandboxes == 40, what="estimated again")
    assert h2.control.reconciler.budget.max_total == 3


def test_threads_already_held_by_sandboxes_are_not_counted_twice() -> None:
    limits = Limits(memory_bytes=0, pids=80)  # budgeted at 80 + 20 = 100 threads each
    empty = HostFacts(threads_max=10_000, threads_in_use=1_000, overhead_threads=20)
    assert capacity.estimate(empty, limits).sandboxes == (9_000 - 1_000) // 100
    # 50 sandboxes later, each using 20 threads: the 50 plus what the rest
    # holds, 50 + (9000 - 2000) // 100 = 120 (not 70, their threads counted twice).
    busy = dataclasses.replace(empty, threads_in_use=1_000 + 50 * 20, sandboxes_present=50)
    assert capacity.estimate(busy, limits).sandboxes == 120


class _Unplaced(FakeBackend):
    """A fake whose sandboxes can wait for a node (Kubernetes' scheduler)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = (0, "")

    def unschedulable(self) -> tuple[int, str]:
        return self.waiting


async def test_sandboxes_waiting_for_a_node_hold_back_creates_and_refusals_say_so(
    make_control: MakeControl,
) -> None:
    clock = FakeClock()
    backend = _Unplaced()
    h = await make_control(clock=clock, backend=backend, pools__liveness_interval_seconds=0.0)
    reconciler = h.control.reconciler
    backend.waiting = (3, "0/2 nodes are available: 2 Insufficient memory.")
    pool = await h.pool(min_ready=2, max_size=4)
    assert reconciler.reconcile() == {} and pool.creating == 0  # nothing more queues behind them
    task = asyncio.ensure_future(h.acquire(timeout=2.0))
    await wait_for(lambda: pool.waiting == 1, what="in line")
    clock.advance(2.0)
    with pytest.raises(
        DeadlineExceeded, match=r"cluster full: 3 sandboxes wait for a node \(0/2 nodes are available"
    ):
        await task
    backend.waiting = (0, "")
    reconciler.poke()
    await wait_for(lambda: pool.ready == 2, what="placed again")


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


# -- where operators see it ----------------------------------------------------------------


async def test_health_metrics_healthz_and_status_say_the_engine_is_degraded_and_why() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = FakeBackend()
    app = build_app(
        make_settings(
            telemetry__metrics_port=port,
            pools__create_timeout_seconds=0.3,
            pools__create_attempts=1,
            pools__liveness_interval_seconds=0.0,
        ),
        backend=backend,
        persist=False,
    )
    await app.start()
    try:
        async with (
            grpc.aio.insecure_channel(app.address) as channel,
            aiohttp.ClientSession() as http,
        ):
            health = health_pb2_grpc.HealthStub(channel)

            async def engine_status() -> int:
                answer = await health.Check(health_pb2.HealthCheckRequest(service=ENGINE_SERVICE))
                return int(answer.status)

            async def scrape(path: str) -> str:
                async with http.get(f"http://127.0.0.1:{port}{path}") as response:
                    assert response.status == 200
                    return await response.text()

            serving = health_pb2.HealthCheckResponse.SERVING
            assert await engine_status() == serving
            assert "sandboxd_engine_degraded 0" in await scrape("/metrics")
            backend.wedge()
            await app.control.create_pool(PoolConfig("p", IMAGE, min_ready=1, max_size=2, limits=Limits()))
            await wait_for(lambda: app.control.reconciler.health.degraded, timeout=10.0, what="degraded")
            assert await engine_status() == health_pb2.HealthCheckResponse.NOT_SERVING
            assert 'sandboxd_engine_degraded{call="create"} 1' in await scrape("/metrics")
            healthz = await scrape("/healthz")
            assert healthz.startswith("ok\n") and "engine degraded for" in healthz
            assert "create calls time out (no answer in 0.3s)" in healthz
            out = io.StringIO()
            assert await run_status(app.address, once=True, out=out) == 0
            assert "ENGINE DEGRADED: engine degraded for" in out.getvalue()
            assert "create calls time out" in out.getvalue()
            # The engine answers again: a run of fast calls recovers it everywhere.
            backend.unwedge()
            await wait_for(lambda: not app.control.reconciler.health.degraded, timeout=15.0, what="recovered")
            await wait_for(lambda: app.control.get_pool("p").ready == 1, timeout=15.0, what="warm")
            assert await engine_status() == serving
            assert "sandboxd_engine_degraded 0" in await scrape("/metrics")
            assert await scrape("/healthz") == "ok\n"
            out = io.StringIO()
            assert await run_status(app.address, once=True, out=out) == 0
            assert "ENGINE DEGRADED" not in out.getvalue()
    finally:
        await app.stop(grace=0.5)
