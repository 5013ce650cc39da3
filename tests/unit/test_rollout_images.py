"""The rollout queue announces the images of granted slots' tasks to the
run's pool: those sandboxes warm (the images pulled ahead) while the
generator prepares, each slot carries its image, and the acquires of them
are warm hand-overs; over gRPC on the fake backend and its registry."""

from __future__ import annotations

import pytest

from sandboxd import errors
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient
from tests.unit.conftest import IMAGE, MakeApp, wait_for

pytestmark = pytest.mark.timeout(30)

TASKS = [f"127.0.0.1:5000/swe/task-{i}:v1" for i in range(3)]


async def test_granted_slots_warm_their_task_images(make_app: MakeApp) -> None:
    backend = FakeBackend(images={IMAGE})
    for image in TASKS:
        backend.registry.add(image, 40 << 20, shared=10 << 20)
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        r = RolloutClient(client)
        await client.create_pool("swe", IMAGE, max_size=16, max_ready=16, images=["*"])
        await r.configure("run", batch_groups=2, group_size=4, max_staleness=0, pool="swe")
        slots = await r.request_slots("run", 2, images=TASKS[:2])
        assert [s.image for s in slots] == TASKS[:2]
        pool = app.control.get_pool("swe")
        await wait_for(
            lambda: pool.ready_of(TASKS[0]) == 4 and pool.ready_of(TASKS[1]) == 4 and pool.creating == 0,
            what="both tasks' groups warm",
        )
        assert backend.registry.pulls[TASKS[0]] == 1 and backend.registry.pulls[TASKS[1]] == 1
        assert backend.registry.pulls[TASKS[2]] == 0
        assert pool.ready_of(IMAGE) == 0, "the run's concurrency is covered by the images announced"
        creates = backend.creates
        backend.start_delay = 60.0  # only warm sandboxes can answer in time
        async with client.acquire_group("swe", 4, image=slots[0].image, timeout=2.0) as group:
            assert len(group.sandboxes) == 4
        assert backend.creates == creates
        # A task image the pool does not serve is refused before any slot is granted.
        await client.create_pool("own", IMAGE, max_size=8, max_ready=8)
        await r.configure("other", batch_groups=1, group_size=2, max_staleness=0, pool="own")
        with pytest.raises(errors.FailedPrecondition, match="serves only its own image"):
            await r.request_slots("other", 1, images=[TASKS[2]])
        with pytest.raises(errors.InvalidArgument, match="2 images for 1 slots"):
            await r.request_slots("run", 1, images=TASKS[:2])
