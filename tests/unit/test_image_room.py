"""Room made before a pull: the cache reserves what an image's manifest says
it lacks, evicts unused images for it before the pull begins (so the disk
never goes over the budget while it lands), counts a base it already holds
once, and lets a pull go on, saying so, when everything held is in use."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sandboxd.backends.base import RemoteImage
from sandboxd.backends.fake import FakeBackend
from sandboxd.clock import FakeClock
from sandboxd.core.images import ImageCache
from sandboxd.core.images.room import Room
from sandboxd.settings import ImageSettings
from tests.unit.conftest import wait_for

REG = "registry.test:5000"
A, B, C = (f"{REG}/task-{name}:v1" for name in "abc")
MB = 1 << 20


def settings(budget: int, ratio: float = 1.0) -> ImageSettings:
    return ImageSettings(
        cache_bytes=budget, evict_interval_seconds=0.0, docker_config="/nonexistent", unpack_ratio=ratio
    )


def engine_bytes(backend: FakeBackend) -> int:
    images = backend.engine_images.values()
    if not images:
        return 0
    return sum(i.size_bytes - i.shared_bytes for i in images) + max(i.shared_bytes for i in images)


async def pulled(cache: ImageCache, clock: FakeClock, *refs: str) -> None:
    for ref in refs:
        await cache.ensure(ref)
        clock.advance(200)  # past the grace an ensured image has before its sandbox exists


def test_need_counts_the_layers_no_held_image_has() -> None:
    room = Room(2.0)
    base = ("sha256:base", 30)
    a = RemoteImage(A, "sha256:a", 40, (base, ("sha256:a-own", 10)))
    b = RemoteImage(B, "sha256:b", 45, (base, ("sha256:b-own", 15)))
    assert room.need(a, []) == 80  # nothing known: every layer, unpacked
    room.reserve(A, a, room.need(a, []))
    assert room.need(b, []) == 30  # a pull in flight brings the base
    room.release(A)
    assert room.need(b, [A]) == 30  # so does an image on the engine
    room.forget(A)
    assert room.need(b, [A]) == 90
    assert room.need(RemoteImage(C, "sha256:c", 7), []) == 14  # no layer list: its whole size
    assert room.reserved() == 0


async def test_room_is_made_before_the_pull_lands() -> None:
    backend = FakeBackend(images=set())
    for ref in (A, B, C):
        backend.registry.add(ref, 10 * MB)
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings(25 * MB))
    await cache.start()
    try:
        await pulled(cache, clock, A, B)
        backend.registry.hold()
        ensure = asyncio.create_task(cache.ensure(C))
        await wait_for(lambda: cache.gauges()["cache_reserved_bytes"] > 0, what="room reserved for C")
        await wait_for(lambda: A not in backend.engine_images, what="A evicted before C lands")
        assert set(backend.engine_images) == {B}
        assert cache.gauges()["cache_reserved_bytes"] == 10 * MB
        backend.registry.release()
        await ensure
        assert set(backend.engine_images) == {B, C}
        assert engine_bytes(backend) <= 25 * MB
        assert cache.gauges()["cache_reserved_bytes"] == 0
    finally:
        await cache.stop()


async def test_a_base_the_cache_holds_is_not_made_room_for_again() -> None:
    backend = FakeBackend(images=set())
    for ref in (A, B, C):
        backend.registry.add(ref, 10 * MB, shared=8 * MB)
    clock = FakeClock()
    # The base once and two images' own layers.
    cache = ImageCache(backend, clock, settings(12 * MB))
    await cache.start()
    try:
        await pulled(cache, clock, A, B)
        assert engine_bytes(backend) == 12 * MB
        await pulled(cache, clock, C)
        # C brings 2 MB of its own: only the least recently used goes.
        assert set(backend.engine_images) == {B, C}
        assert [e.reference for e in cache.entries() if e.reference == A] == []
    finally:
        await cache.stop()


async def test_an_unpacking_ratio_makes_room_for_more_than_the_compressed_bytes() -> None:
    backend = FakeBackend(images=set())
    for ref in (A, B, C):
        backend.registry.add(ref, 10 * MB)
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings(35 * MB, ratio=2.0))
    await cache.start()
    try:
        await pulled(cache, clock, A, B)
        await pulled(cache, clock, C)
        # 20 MB held, 20 MB set aside for C: A had to go first.
        assert set(backend.engine_images) == {B, C}
    finally:
        await cache.stop()


async def test_without_room_the_pull_goes_on_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend(images=set())
    for ref in (A, B):
        backend.registry.add(ref, 10 * MB)
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings(15 * MB))
    await cache.start()
    try:
        await pulled(cache, clock, A)
        cache.use(A)
        with caplog.at_level(logging.WARNING, logger="sandboxd.core.images.cache"):
            await cache.ensure(B)
        assert cache.present(B)
        assert set(backend.engine_images) == {A, B}
        [warning] = [r.getMessage() for r in caplog.records if "over the" in r.getMessage()]
        assert B in warning and "in use or wanted" in warning
    finally:
        await cache.stop()


async def test_a_registry_that_cannot_size_the_image_leaves_room_to_after_the_pull() -> None:
    backend = FakeBackend(images=set())
    for ref in (A, B):
        backend.registry.add(ref, 10 * MB)
    clock = FakeClock()
    cache = ImageCache(backend, clock, settings(15 * MB))

    async def no_manifest(reference: str, auth: object) -> RemoteImage:
        from sandboxd.errors import Unavailable

        raise Unavailable("manifest API not served")

    backend.registry_image = no_manifest  # type: ignore[method-assign,assignment]
    await cache.start()
    try:
        await pulled(cache, clock, A, B)
        await wait_for(lambda: A not in backend.engine_images, what="A evicted after B landed")
        assert set(backend.engine_images) == {B}
    finally:
        await cache.stop()
