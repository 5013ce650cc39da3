"""Acquire by image, announced images and pull progress through the public
client and an in-process server on the FakeBackend and its registry."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sandboxd.app import App
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from tests.unit.conftest import IMAGE, MakeApp, wait_for

pytestmark = pytest.mark.timeout(30)

TASK = "127.0.0.1:5000/swe/task-1:v1"
OTHER = "127.0.0.1:5000/swe/task-2:v1"


@pytest.fixture
async def served(make_app: MakeApp) -> AsyncIterator[tuple[App, FakeBackend, AsyncClient]]:
    backend = FakeBackend(images={IMAGE})
    backend.registry.add(TASK, 80 << 20, shared=30 << 20)
    backend.registry.add(OTHER, 60 << 20, shared=30 << 20)
    app = await make_app(backend=backend)
    client = AsyncClient(app.address)
    await client.wait_ready(5.0)
    yield app, backend, client
    await client.close()


async def test_acquire_by_image_through_the_client(served: tuple[App, FakeBackend, AsyncClient]) -> None:
    _app, backend, client = served
    created = await client.create_pool("swe", IMAGE, max_size=8, images=["*"])
    assert list(created.spec.images) == ["*"]
    async with client.acquire("swe", image=TASK, timeout=10.0) as sandbox:
        assert sandbox.info.image == TASK
        assert backend.sandboxes[next(iter(backend.sandboxes))].spec.image == TASK
    assert backend.registry.pulls[TASK] == 1


async def test_typed_answers_for_images(served: tuple[App, FakeBackend, AsyncClient]) -> None:
    _app, backend, client = served
    await client.create_pool("own", IMAGE, max_size=4)
    await client.create_pool("swe", IMAGE, max_size=4, images=["*"])
    with pytest.raises(FailedPrecondition, match="serves only its own image"):
        await client.lease("own", image=TASK, timeout=5.0)
    with pytest.raises(InvalidArgument, match="not a valid image reference"):
        await client.lease("swe", image="Not An Image", timeout=5.0)
    with pytest.raises(FailedPrecondition, match="no image"):
        await client.lease("swe", image="127.0.0.1:5000/swe/absent:v1", timeout=30.0)
    backend.registry.unreachable = True
    with pytest.raises(Unavailable) as info:
        await client.lease("swe", image=TASK, timeout=30.0)
    assert info.value.retry_after is not None
    backend.registry.unreachable = False
    backend.registry.hold()
    with pytest.raises(DeadlineExceeded, match="pull of image"):
        await client.lease("swe", image=TASK, timeout=0.3)
    backend.registry.release()


async def test_set_demand_with_images_warms_them_and_watch_shows_pulls(
    served: tuple[App, FakeBackend, AsyncClient],
) -> None:
    app, _backend, client = served
    await client.create_pool("swe", IMAGE, max_size=8, max_ready=6, images=["*"])
    scaling = await client.set_demand("swe", 0, ttl=60, source="queue", images={TASK: 2, OTHER: 1})
    assert scaling.announced == 3
    pool = app.control.get_pool("swe")
    await wait_for(lambda: pool.ready_of(TASK) == 2 and pool.ready_of(OTHER) == 1, what="both images warm")
    async for update in client.watch_pools("swe", interval=0.05):
        (shown,) = update.pools
        by_image = {i.image: i for i in shown.images}
        if by_image.get(TASK) and by_image[TASK].ready == 2:
            break
    assert by_image[OTHER].ready == 1 and by_image[TASK].warm_target == 2
    pulls = {p.image: p for p in shown.pulls}
    assert pulls[TASK].state == "done" and pulls[TASK].bytes_done == 80 << 20
    assert pulls[TASK].started.seconds > 0
    with pytest.raises(InvalidArgument, match="above count"):
        await client.set_demand("swe", 1, source="queue", images={TASK: 2})


async def test_pull_secrets_need_a_backend_that_pulls_with_them(
    served: tuple[App, FakeBackend, AsyncClient],
) -> None:
    """The fake backend, like Docker, pulls with its own credentials: a pool
    naming Secrets is refused, and nothing is made."""
    _app, _backend, client = served
    with pytest.raises(FailedPrecondition, match="image_pull_secrets"):
        await client.create_pool("swe", IMAGE, max_size=8, image_pull_secrets=["task-registry"])
    with pytest.raises(InvalidArgument) as caught:
        await client.create_pool("swe", IMAGE, max_size=8, image_pull_secrets=["UPPER"])
    assert caught.value.field == "spec.image_pull_secrets[0]"
    assert not await client.list_pools()
