"""Warm pools and acquire, driven through ControlPlane on the FakeBackend."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandboxd.backends.base import SandboxSpec
from sandboxd.backends.fake import FakeBackend
from sandboxd.core.lifecycle import SandboxRecord, State
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, NotFound
from tests.unit.conftest import IMAGE, Harness, MakeControl, wait_for

pytestmark = pytest.mark.timeout(30)


async def test_pool_warms_to_min_ready_and_stops(h: Harness) -> None:
    pool = await h.pool(min_ready=3, max_size=8)
    await wait_for(lambda: pool.ready == 3 and pool.creating == 0, what="3 ready")
    await pool.drain()
    assert pool.creates_needed() == 0
    assert h.backend.creates == 3
    assert len(h.backend.sandboxes) == 3
    assert all(r.state is State.READY for r in pool.records.values())
    # Warm sandboxes are visible to the API's listing, labelled with their pool.
    listed = h.control.list_sandboxes("p", State.READY, {})
    assert {r.sandbox_id for r in listed} == set(pool.records)


async def test_acquire_hands_ready_sandboxes_at_once(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=3)
    warm_ids = {r.sandbox_id for r in pool.records.values()}
    # From now on a create takes far longer than the acquire may wait: only
    # sandboxes that are already READY can satisfy it.
    h.backend.start_delay = 60.0
    started = time.monotonic()
    lease, records = await h.acquire(n=2, timeout=0.5)
    assert time.monotonic() - started < 0.4
    assert len(records) == 2
    assert {r.sandbox_id for r in records} <= warm_ids
    assert all(r.state is State.LEASED and r.lease_id == lease.lease_id for r in records)
    assert sorted(lease.sandbox_ids) == sorted(r.sandbox_id for r in records)
    assert pool.ready == 1


async def test_acquire_waits_while_the_pool_creates(make_control: MakeControl) -> None:
    h = await make_control(backend=FakeBackend(start_delay=0.05))
    pool = await h.pool(min_ready=0, max_size=4)
    assert pool.ready == 0
    _lease, records = await h.acquire(n=3, timeout=5.0)
    assert len(records) == 3
    assert {r.state for r in records} == {State.LEASED}
    await pool.drain()
    # Exactly what the waiter needed was created: min_ready is 0.
    assert h.backend.creates == 3
    assert pool.ready == 0


async def test_group_all_or_nothing_gives_back_partial_at_deadline(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=2, max_size=4)
    warm_ids = {r.sandbox_id for r in pool.records.values()}
    h.backend.start_delay = 60.0  # the third can never arrive in time
    with pytest.raises(DeadlineExceeded, match="got 2 of 3"):
        await h.acquire(n=3, timeout=0.3)
    assert len(h.control.leases) == 0
    assert pool.waiting == 0
    assert pool.ready == 2
    ready = [r for r in pool.records.values() if r.state is State.READY]
    assert {r.sandbox_id for r in ready} == warm_ids
    assert all(r.lease_id == "" for r in ready)
    # They are usable again right away.
    _lease, records = await h.acquire(n=2, timeout=0.5)
    assert {r.sandbox_id for r in records} == warm_ids


async def test_group_at_least_min_n_succeeds_at_the_deadline(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=2, max_size=4)
    h.backend.start_delay = 60.0
    started = time.monotonic()
    lease, records = await h.acquire(n=4, min_n=2, timeout=0.3)
    assert time.monotonic() - started >= 0.25  # it waited for the rest first
    assert len(records) >= 2
    assert len(lease.sandbox_ids) == len(records)
    assert all(r.state is State.LEASED for r in records)
    assert pool.waiting == 0


async def test_n_above_max_size_fails_precondition_at_once(h: Harness) -> None:
    pool = await h.pool(min_ready=0, max_size=2)
    with pytest.raises(FailedPrecondition, match="at most 2"):
        await h.acquire(n=3, timeout=5.0)
    assert pool.waiting == 0
    assert len(h.control.leases) == 0


async def test_acquire_unknown_pool_is_not_found(h: Harness) -> None:
    with pytest.raises(NotFound, match="nope"):
        await h.acquire("nope")


async def test_waiters_are_served_first_come_first_served(make_control: MakeControl) -> None:
    # One create at a time (a fixed window), so sandboxes arrive one by one.
    h = await make_control(
        backend=FakeBackend(start_delay=0.02), pools__max_starting=1, pools__max_starting_limit=0
    )
    pool = await h.pool(min_ready=0, max_size=8)
    finished: list[str] = []

    async def take(name: str, n: int) -> list[SandboxRecord]:
        _, records = await h.acquire(n=n, timeout=10.0)
        finished.append(name)
        return records

    # A group at the head of the line must not be overtaken by the single
    # acquirers queued behind it, even though they could be satisfied sooner.
    group = asyncio.create_task(take("group", 2))
    await wait_for(lambda: pool.waiting == 1, what="group queued")
    first = asyncio.create_task(take("first", 1))
    await wait_for(lambda: pool.waiting == 2, what="first queued")
    second = asyncio.create_task(take("second", 1))
    await wait_for(lambda: pool.waiting == 3, what="second queued")
    results = await asyncio.gather(group, first, second)
    assert finished == ["group", "first", "second"]
    assert [len(r) for r in results] == [2, 1, 1]
    assert len({r.sandbox_id for rs in results for r in rs}) == 4
    assert h.backend.max_concurrent_creates == 1


async def test_a_newcomer_queues_behind_waiters(make_control: MakeControl) -> None:
    h = await make_control(
        backend=FakeBackend(start_delay=0.02), pools__max_starting=1, pools__max_starting_limit=0
    )
    pool = await h.pool(min_ready=0, max_size=8)
    waiter = asyncio.create_task(h.acquire(n=2, timeout=10.0))
    await wait_for(lambda: pool.waiting == 1, what="waiter queued")
    late = asyncio.create_task(h.acquire(n=1, timeout=10.0))
    await wait_for(lambda: pool.waiting == 2, what="late queued")
    done, _ = await asyncio.wait({waiter, late}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {waiter}
    await late


async def test_max_starting_bounds_concurrent_creates(make_control: MakeControl) -> None:
    # max_starting_limit 0: the window never grows past max_starting.
    h = await make_control(
        backend=FakeBackend(start_delay=0.05), pools__max_starting=2, pools__max_starting_limit=0
    )
    pool = await h.pool(min_ready=6, max_size=8)
    await wait_for(lambda: pool.ready == 6, what="6 ready")
    assert h.backend.max_concurrent_creates == 2
    await pool.drain()
    assert h.backend.creates == 6


async def test_no_over_creation_across_acquires_and_refills(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=3, max_size=8)
    await pool.drain()
    assert h.backend.creates == 3
    _lease, _records = await h.acquire(n=2)
    # Two were taken; the pool puts back exactly two to stay at min_ready.
    await wait_for(lambda: pool.ready == 3 and pool.creating == 0, what="refilled")
    await pool.drain()
    assert h.backend.creates == 5
    assert pool.creates_needed() == 0
    assert len(h.backend.sandboxes) == 5


async def test_release_destroys_and_the_pool_refills_with_new_sandboxes(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=2, max_size=4)
    lease, records = await h.acquire(n=2)
    taken = {r.sandbox_id for r in records}
    handles = {r.handle for r in records}
    await wait_for(lambda: pool.ready == 2, what="refill after acquire")
    destroys = h.backend.destroys
    released = await h.control.release(lease.lease_id, [])
    assert set(released) == taken
    await wait_for(lambda: h.backend.destroys == destroys + 2, what="both destroyed")
    assert not handles & set(h.backend.sandboxes)
    await wait_for(lambda: not taken & set(pool.records), what="released records gone")
    for sid in taken:
        with pytest.raises(NotFound, match="released"):
            h.control.get_sandbox(sid)
    # Never recycled: what is ready now was never leased.
    await wait_for(lambda: pool.ready == 2 and pool.creating == 0, what="refilled")
    ready_ids = {r.sandbox_id for r in pool.records.values() if r.state is State.READY}
    assert not ready_ids & taken
    assert pool.count(State.LEASED) == 0


async def test_transient_create_failures_are_retried_with_backoff(make_control: MakeControl) -> None:
    attempts: list[float] = []

    class Recording(FakeBackend):
        async def create(self, spec: SandboxSpec) -> str:
            attempts.append(time.monotonic())
            return await super().create(spec)

    backend = Recording()
    backend.transient_failures = 2
    h = await make_control(backend=backend)
    pool = await h.pool(min_ready=1, max_size=4)
    await wait_for(lambda: pool.ready == 1, timeout=10.0, what="recovered")
    assert backend.creates == 3
    assert pool.failed_total == 2
    assert pool.last_error == ""
    assert pool.permanent_error == ""
    # Backoff: 0.25 s then 0.5 s, each with jitter in [0.5, 1.5).
    assert attempts[1] - attempts[0] >= 0.12
    assert attempts[2] - attempts[1] >= 0.24
    _lease, records = await h.acquire()
    assert records[0].state is State.LEASED


async def test_transient_failures_do_not_cause_over_creation(make_control: MakeControl) -> None:
    backend = FakeBackend()
    backend.transient_failures = 1
    h = await make_control(backend=backend)
    pool = await h.pool(min_ready=2, max_size=2)
    # Poke the pool while it backs off (as acquires and status changes do).
    await wait_for(lambda: pool.failed_total == 1, what="first failure")
    pool.poke()
    await wait_for(lambda: pool.ready == 2 and pool.creating == 0, timeout=10.0, what="recovered")
    await pool.drain()
    assert pool.ready == 2
    assert len(backend.sandboxes) == 2
    assert backend.creates == 3  # two first tries (one failed) and one retry


async def test_missing_image_fails_pool_creation(make_control: MakeControl) -> None:
    h = await make_control(backend=FakeBackend(images={IMAGE}))
    with pytest.raises(FailedPrecondition, match="not present"):
        await h.pool("p", image="missing/image:1")
    assert "p" not in h.control.pools
    assert h.backend.creates == 0
    await h.pool("q", image=IMAGE)  # the present one is fine


async def test_permanent_create_failure_makes_acquire_fail_fast(make_control: MakeControl) -> None:
    backend = FakeBackend(images={IMAGE})
    h = await make_control(backend=backend)
    pool = await h.pool(min_ready=0, max_size=4)
    backend.images = set()  # the image vanished from the engine after the pool was made
    started = time.monotonic()
    with pytest.raises(FailedPrecondition, match="not present"):
        await h.acquire(timeout=20.0)
    assert time.monotonic() - started < 5.0
    assert pool.permanent_error
    assert len(h.control.leases) == 0
    # Later acquires do not even wait.
    with pytest.raises(FailedPrecondition, match="cannot create"):
        await h.acquire(timeout=20.0)
    await pool.drain()
    assert backend.creates == 1  # no retries of a permanent failure


async def test_update_pool_shrinks_and_grows(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=4, max_size=8)
    await h.control.update_pool("p", min_ready=1, max_size=None)
    assert pool.config.min_ready == 1 and pool.config.max_size == 8
    await wait_for(lambda: h.backend.destroys == 3, what="surplus destroyed")
    await wait_for(lambda: len(pool.records) == 1, what="one left")
    assert pool.ready == 1
    await h.control.update_pool("p", min_ready=3, max_size=4)
    await wait_for(lambda: pool.ready == 3 and pool.creating == 0, what="grown")
    await pool.drain()
    assert h.backend.creates == 6
    assert pool.config.max_size == 4


async def test_update_pool_does_not_touch_leased_sandboxes(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=2, max_size=4)
    lease, records = await h.acquire()
    await wait_for(lambda: pool.ready == 2 and pool.creating == 0, what="refilled")
    await h.control.update_pool("p", min_ready=0, max_size=None)
    await wait_for(lambda: pool.ready == 0 and pool.count(State.RELEASING) == 0, what="shrunk")
    assert records[0].state is State.LEASED
    assert h.control.get_lease(lease.lease_id).sandbox_ids == [records[0].sandbox_id]


async def test_delete_pool_with_leased_sandboxes_needs_force(h: Harness) -> None:
    pool = await h.warm_pool(min_ready=2, max_size=4)
    lease, records = await h.acquire()
    with pytest.raises(FailedPrecondition, match="force"):
        await h.control.delete_pool("p", force=False)
    assert h.control.get_pool("p") is pool
    assert records[0].state is State.LEASED
    await h.control.delete_pool("p", force=True)
    with pytest.raises(NotFound):
        h.control.get_pool("p")
    with pytest.raises(NotFound):
        h.control.get_lease(lease.lease_id)
    assert records[0].state is State.GONE
    assert h.backend.sandboxes == {}
    assert h.control.list_sandboxes("", None, {}) == []


async def test_delete_pool_without_leases_needs_no_force(h: Harness) -> None:
    await h.warm_pool(min_ready=2, max_size=4)
    await h.control.delete_pool("p", force=False)
    assert h.backend.sandboxes == {}
    await h.pool("p")  # the name is free again
