"""Pools as templates on the real engine: task images (the sandbox image plus
a layer of their own) pushed to a real registry (Debian's docker-registry on
127.0.0.1) and removed from the engine; an acquire by image pulls and starts
one, an image the registry lacks is refused at once, an image announced
with SetDemand is pulled ahead and handed over warm, and a leased sandbox
adopted after a restart keeps its own image."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import build_app
from sandboxd.client import AsyncClient
from sandboxd.client.aio import Sandbox
from tests.integration.conftest import make_settings, poll, running_app
from tests.registry import Registry, run_registry

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

LABEL = "sandboxd-pool-images-test"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def tasks(engine: docker.DockerClient, registry: Registry, image: str) -> Iterator[list[str]]:
    """Three task images in the registry, none on the engine: each the
    sandbox image plus its own layer (a task id and 2 MB of its own)."""
    refs: list[str] = []
    for i in range(3):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            dockerfile = f"FROM {image}\nCOPY task /opt/task/\n".encode()
            for name, data in (
                ("Dockerfile", dockerfile),
                ("task/id", f"task-{i}\n".encode()),
                ("task/checkout.bin", os.urandom(2 << 20)),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        buf.seek(0)
        built, _ = engine.images.build(fileobj=buf, custom_context=True, rm=True, labels={LABEL: "1"})
        repo = registry.reference(f"swe/task-{i}")
        built.tag(repo, "v1")
        for event in engine.api.push(repo, "v1", stream=True, decode=True):
            assert "error" not in event, event
        # Its only reference: the image goes with it (the base's layers stay).
        engine.images.remove(f"{repo}:v1")
        refs.append(f"{repo}:v1")
    yield refs
    for ref in refs:
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            engine.images.remove(ref, force=True)


def on_engine(engine: docker.DockerClient, reference: str) -> bool:
    try:
        engine.images.get(reference)
        return True
    except docker.errors.ImageNotFound:
        return False


async def test_acquire_by_image_pulls_from_the_registry_and_starts_it(
    tmp_path: Path, engine: docker.DockerClient, image: str, registry: Registry, tasks: list[str]
) -> None:
    assert not on_engine(engine, tasks[0])
    async with running_app(make_settings(tmp_path), engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("swe", image, max_size=4, images=["*"])
        async with client.acquire("swe", image=tasks[0], timeout=120) as sb:
            assert sb.info.image == tasks[0]
            assert (await sb.exec(["cat", "/opt/task/id"])).text == "task-0\n"
        assert on_engine(engine, tasks[0])
        # An image the registry does not have: FAILED_PRECONDITION, not the deadline's answer.
        with pytest.raises(errors.FailedPrecondition, match="absent"):
            await client.lease("swe", image=registry.reference("swe/absent:v1"), timeout=120)
        # A pool without images serves its own only.
        await client.create_pool("own", image, max_size=2)
        with pytest.raises(errors.FailedPrecondition, match="serves only its own image"):
            await client.lease("own", image=tasks[0], timeout=10)


async def test_an_announced_image_is_pulled_ahead_and_handed_over_warm(
    tmp_path: Path, engine: docker.DockerClient, image: str, tasks: list[str]
) -> None:
    assert not on_engine(engine, tasks[1])
    async with running_app(make_settings(tmp_path), engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("swe", image, max_size=4, max_ready=4, images=["*"])
        await client.set_demand("swe", 0, ttl=120, source="queue", images={tasks[1]: 2})
        pool = app.control.get_pool("swe")
        await poll(lambda: pool.ready_of(tasks[1]) == 2, timeout=150, what="the announced image warm")
        assert on_engine(engine, tasks[1])
        cache = app.control.images
        assert cache is not None and tasks[1] in cache.wanted(), "announced: kept from eviction"
        warm = {r.sandbox_id for r in pool.ready_records()}
        created = pool.created_total
        async with client.acquire_group("swe", 2, image=tasks[1], timeout=30) as group:
            assert {sb.id for sb in group} == warm
            texts = await asyncio.gather(*(sb.exec(["cat", "/opt/task/id"]) for sb in group))
            assert [t.text for t in texts] == ["task-1\n", "task-1\n"]
        assert pool.created_total == created
        # The acquires spent the announcement: the image is no longer wanted (evictable when unused).
        await poll(lambda: tasks[1] not in cache.wanted(), what="the spent announcement withdrawn")


async def test_a_leased_sandbox_keeps_its_own_image_across_a_restart(
    tmp_path: Path, engine: docker.DockerClient, image: str, tasks: list[str]
) -> None:
    settings = make_settings(tmp_path)
    first = build_app(settings)
    await first.start()
    try:
        async with AsyncClient(first.address) as client:
            await client.create_pool("swe", image, max_size=4, images=["*"])
            lease = await client.lease("swe", image=tasks[2], lease_ttl=600, timeout=120)
            [sb] = lease.sandboxes
    finally:
        # Leased sandboxes stay on the engine for the next start to adopt.
        await first.stop(grace=1)
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        rec = app.control.get_sandbox(sb.id)
        assert rec.image == tasks[2]
        cache = app.control.images
        assert cache is not None and cache._in_use[tasks[2]] == 1, "its own image pinned, not the pool's"
        again = Sandbox(client, sb.info, lease.id)
        assert (await again.exec(["cat", "/opt/task/id"])).text == "task-2\n"
        await client.release(lease.id)


async def test_a_snapshot_of_a_task_image_sandbox_restores_onto_that_image(
    tmp_path: Path, engine: docker.DockerClient, image: str, tasks: list[str]
) -> None:
    async with running_app(make_settings(tmp_path), engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("swe", image, max_size=4, images=["*"])
        async with client.acquire("swe", image=tasks[0], timeout=120) as sb:
            assert (await sb.exec("echo patched > fix.txt")).ok
            snap = await sb.snapshot()
        # The snapshot records the sandbox's own image, not its template pool's.
        assert snap.image == tasks[0] and snap.pool == "swe"
        lease = await client.restore(snap.id, n=2, timeout=120)
        try:
            for restored in lease.sandboxes:
                assert restored.info.image == tasks[0]
                out = await restored.exec("cat /opt/task/id fix.txt")
                assert out.text == "task-0\npatched\n", out
        finally:
            await lease.release()
        # Another template pool that serves the image takes it too; one that serves
        # only its own image is refused, naming both images.
        await client.create_pool("other", image, max_size=2, images=["*"])
        lease = await client.restore(snap.id, pool="other", timeout=120)
        try:
            [restored] = lease.sandboxes
            assert restored.info.image == tasks[0] and restored.info.pool == "other"
            assert (await restored.exec("cat fix.txt")).text == "patched\n"
        finally:
            await lease.release()
        await client.create_pool("own", image, max_size=2)
        with pytest.raises(errors.FailedPrecondition, match="was taken on image"):
            await client.restore(snap.id, pool="own", timeout=30)
