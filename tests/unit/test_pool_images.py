"""Pools as templates: acquire by image, warm capacity spread over announced
images, no over-create per image, typed answers from the image cache; on the
FakeBackend with its in-memory registry and the real ImageCache."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sandboxd.backends.base import Limits
from sandboxd.backends.fake import FakeBackend
from sandboxd.clock import SystemClock
from sandboxd.core.control import ControlPlane
from sandboxd.core.images import ImageCache
from sandboxd.core.lifecycle import State
from sandboxd.core.pools import PoolConfig, WarmPool
from sandboxd.core.state import SqliteStateStore
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from tests.unit.conftest import IMAGE, make_settings, wait_for

pytestmark = pytest.mark.timeout(30)

REG = "127.0.0.1:5000/tasks"
TASK_A, TASK_B, TASK_C = f"{REG}/a:v1", f"{REG}/b:v1", f"{REG}/c:v1"

Make = Callable[..., Awaitable[ControlPlane]]


@pytest.fixture
async def make(no_task_leaks: None) -> AsyncIterator[Make]:
    """Control planes on a fake backend that holds only IMAGE, with an image cache."""
    made: list[tuple[ControlPlane, ImageCache]] = []

    async def build(backend: FakeBackend | None = None, **overrides: object) -> ControlPlane:
        backend = backend or FakeBackend(images={IMAGE})
        for image in (TASK_A, TASK_B, TASK_C):
            backend.registry.add(image, 50 << 20, shared=20 << 20)
        clock = SystemClock()
        control = ControlPlane(make_settings(**overrides), backend, SqliteStateStore(None), clock)
        cache = ImageCache(backend, clock)
        await cache.start()
        control.images = cache
        await control.start()
        made.append((control, cache))
        return control

    yield build
    for control, cache in made:
        await control.stop()
        await cache.stop()


async def template(
    control: ControlPlane, *, images: list[str] | None = None, min_ready: int = 0, max_ready: int = 0
) -> WarmPool:
    return await control.create_pool(
        PoolConfig(
            "p",
            IMAGE,
            min_ready,
            8,
            Limits(),
            max_ready=max_ready,
            images=["*"] if images is None else images,
        )
    )


def fake(control: ControlPlane) -> FakeBackend:
    assert isinstance(control.backend, FakeBackend)
    return control.backend


async def test_a_pool_serves_its_own_image_only_by_default(make: Make) -> None:
    control = await make()
    await control.create_pool(PoolConfig("p", IMAGE, 0, 4, Limits()))
    with pytest.raises(FailedPrecondition, match="serves only its own image"):
        await control.acquire("p", 1, 0, {}, 0.0, 2.0, None, image=TASK_A)
    # Spelled out, its own image is its own.
    _, records = await control.acquire("p", 1, 0, {}, 0.0, 2.0, None, image=IMAGE)
    assert records[0].image == IMAGE
    assert fake(control).registry.pulls[TASK_A] == 0


async def test_a_listed_image_is_served_and_others_are_refused(make: Make) -> None:
    control = await make()
    await template(control, images=[TASK_A])
    _, records = await control.acquire("p", 1, 0, {}, 0.0, 5.0, None, image=TASK_A)
    assert records[0].image == TASK_A
    with pytest.raises(FailedPrecondition, match="spec.images"):
        await control.acquire("p", 1, 0, {}, 0.0, 2.0, None, image=TASK_B)
    with pytest.raises(InvalidArgument, match="image"):
        await control.acquire("p", 1, 0, {}, 0.0, 2.0, None, image="bad image!")


async def test_a_bad_image_list_is_refused_at_create(make: Make) -> None:
    control = await make()
    with pytest.raises(InvalidArgument, match=r"spec.images\[1\]"):
        await template(control, images=[TASK_A, "no spaces allowed"])


async def test_acquire_by_image_pulls_once_then_starts(make: Make) -> None:
    control = await make()
    pool = await template(control)
    backend = fake(control)
    backend.registry.hold()
    acquires = [
        asyncio.create_task(control.acquire("p", 2, 0, {}, 0.0, 10.0, None, image=TASK_A)) for _ in range(3)
    ]
    await wait_for(lambda: pool.waiting == 0 and backend.registry.pulls[TASK_A] == 1, what="pull under way")
    # Nobody waits in the pool's line yet: the image comes first.
    assert pool.creating == 0 and pool.waiting == 0
    backend.registry.release()
    results = await asyncio.gather(*acquires)
    assert backend.registry.pulls[TASK_A] == 1
    records = [r for _, recs in results for r in recs]
    assert len(records) == 6 and {r.image for r in records} == {TASK_A}
    assert {backend.sandboxes[r.handle].spec.image for r in records} == {TASK_A}
    await pool.drain()
    # Exactly the six asked for: min_ready is 0 and nothing was announced.
    assert backend.creates == 6


async def test_a_missing_image_fails_at_once_and_the_pool_goes_on(make: Make) -> None:
    control = await make()
    pool = await template(control, min_ready=1)
    await wait_for(lambda: pool.ready == 1, what="own image warm")
    with pytest.raises(FailedPrecondition, match="no image"):
        await control.acquire("p", 1, 0, {}, 0.0, 60.0, None, image=f"{REG}/absent:v1")
    assert pool.permanent_error == "" and pool.waiting == 0
    _, records = await control.acquire("p", 1, 0, {}, 0.0, 5.0, None)
    assert records[0].image == IMAGE


async def test_an_unreachable_registry_is_unavailable(make: Make) -> None:
    control = await make()
    await template(control)
    fake(control).registry.unreachable = True
    with pytest.raises(Unavailable, match="cannot be reached"):
        await control.acquire("p", 1, 0, {}, 0.0, 60.0, None, image=TASK_A)


async def test_a_pull_past_the_deadline_names_the_pull(make: Make) -> None:
    control = await make()
    pool = await template(control)
    fake(control).registry.hold()
    with pytest.raises(DeadlineExceeded, match=r"pull of image .*a:v1.*did not finish"):
        await control.acquire("p", 1, 0, {}, 0.0, 0.3, None, image=TASK_A)
    assert pool.waiting == 0 and len(control.leases) == 0
    fake(control).registry.release()


async def test_a_warm_sandbox_of_the_image_is_handed_over_at_once(make: Make) -> None:
    control = await make()
    pool = await template(control, max_ready=6)
    backend = fake(control)
    pool.announce("trainer", 3, 0.0, 60.0, ((TASK_A, 2), (TASK_B, 1)))
    await wait_for(
        lambda: pool.ready_of(TASK_A) == 2 and pool.ready_of(TASK_B) == 1 and pool.creating == 0,
        what="announced images warm",
    )
    assert backend.registry.pulls[TASK_A] == 1 and backend.registry.pulls[TASK_B] == 1
    assert pool.ready_of(IMAGE) == 0
    creates = backend.creates
    backend.start_delay = 60.0  # only a warm one can answer in time
    _, records = await control.acquire("p", 2, 0, {}, 0.0, 1.0, None, image=TASK_A)
    assert {r.image for r in records} == {TASK_A}
    assert backend.creates == creates
    # Consumed: the announcement no longer asks for TASK_A, so none is re-made.
    await wait_for(lambda: TASK_A not in pool.warm_targets(), what="TASK_A's target spent")
    assert pool.warm_targets()[TASK_B] == 1
    assert pool.creating == 0 and backend.creates == creates


async def test_warm_targets_are_spread_by_demand_without_over_create(make: Make) -> None:
    control = await make()
    pool = await template(control, max_ready=4)
    backend = fake(control)
    backend.start_delay = 0.05
    pool.announce("trainer", 6, 0.0, 60.0, ((TASK_A, 3), (TASK_B, 3)))
    await wait_for(lambda: pool.ready == 4 and pool.creating == 0, what="capped warm")
    # max_ready 4 shared fairly between the two announced images.
    assert pool.warm_targets() == {TASK_A: 2, TASK_B: 2}
    assert (pool.ready_of(TASK_A), pool.ready_of(TASK_B)) == (2, 2)
    for _ in range(5):
        control.reconciler.reconcile()
    await pool.drain()
    assert backend.creates == 4
    # The cache holds both announced images as wanted.
    assert control.images is not None
    assert control.images.wanted() >= {TASK_A, TASK_B}


async def test_images_are_pinned_while_sandboxes_of_them_live(make: Make) -> None:
    control = await make()
    await template(control)
    cache = control.images
    assert cache is not None
    lease, records = await control.acquire("p", 1, 0, {}, 0.0, 5.0, None, image=TASK_C)
    assert cache._in_use[TASK_C] == 1
    await control.release(lease.lease_id, [])
    await wait_for(lambda: TASK_C not in cache._in_use, what="unpinned after release")
    assert records[0].state is State.GONE


async def test_withdrawn_demand_is_no_longer_wanted(make: Make) -> None:
    control = await make()
    pool = await template(control, max_ready=4)
    pool.announce("trainer", 2, 0.0, 60.0, ((TASK_A, 2),))
    cache = control.images
    assert cache is not None
    await wait_for(lambda: TASK_A in cache.wanted(), what="wanted")
    pool.announce("trainer", 0, 0.0, 0.0)
    control.reconciler.reconcile()
    assert TASK_A not in cache.wanted()


async def test_announced_image_counts_are_checked(make: Make) -> None:
    control = await make()
    pool = await template(control, images=[TASK_A], max_ready=4)
    with pytest.raises(InvalidArgument, match="add up to 3, above count"):
        pool.announce("trainer", 2, 0.0, 60.0, ((TASK_A, 3),))
    with pytest.raises(FailedPrecondition, match="spec.images"):
        pool.announce("trainer", 2, 0.0, 60.0, ((TASK_B, 1),))


async def test_an_acquire_joining_creates_in_flight_leaves_the_image_evictable_after(make: Make) -> None:
    control = await make()
    pool = await template(control, max_ready=4)
    backend = fake(control)
    cache = control.images
    assert cache is not None
    backend.start_delay = 0.3
    pool.announce("trainer", 2, 0.0, 60.0, ((TASK_A, 2),))
    await wait_for(lambda: pool.warm_targets().get(TASK_A) == 2 and pool.creating == 2, what="creates of A")
    assert TASK_A not in cache._ensured, "the creates' use() ended the pull's grace"
    _, records = await control.acquire("p", 2, 0, {}, 0.0, 5.0, None, image=TASK_A)
    assert {r.image for r in records} == {TASK_A}
    # Served by the creates in flight: no second ensure pins it past their lives.
    assert TASK_A not in cache._ensured


async def test_a_sandbox_adopted_after_a_restart_keeps_its_own_image(make: Make, tmp_path: Path) -> None:
    backend = FakeBackend(images={IMAGE})
    store = tmp_path / "state.sqlite3"
    clock = SystemClock()
    planes: list[tuple[ControlPlane, ImageCache]] = []

    async def plane() -> ControlPlane:
        control = ControlPlane(make_settings(), backend, SqliteStateStore(store), clock)
        cache = ImageCache(backend, clock)
        await cache.start()
        control.images = cache
        await control.start()
        planes.append((control, cache))
        return control

    for image in (TASK_A, TASK_B):
        backend.registry.add(image, 50 << 20)
    first = await plane()
    try:
        await template(first)
        lease, [rec] = await first.acquire("p", 1, 0, {}, 600.0, 5.0, None, image=TASK_A)
        # The crash: the store keeps the lease, the backend the sandbox.
        await first.pools["p"].drain()
        second = await plane()
        adopted = second.get_sandbox(rec.sandbox_id)
        assert adopted.state is State.LEASED and adopted.lease_id == lease.lease_id
        assert adopted.image == TASK_A
        assert second.images is not None and second.images._in_use[TASK_A] == 1
        assert IMAGE not in second.images._in_use
    finally:
        for control, cache in reversed(planes):
            await control.stop()
            await cache.stop()
