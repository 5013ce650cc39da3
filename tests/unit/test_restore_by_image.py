"""A snapshot of a sandbox leased by image restores into sandboxes of that
image from a pool that serves it (the E2B API's filesystem pause and fork
of a per-task image's template), and a pool that does not serve it refuses
the restore, naming both images."""

from __future__ import annotations

import pytest

from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.errors import FailedPrecondition
from tests.unit.conftest import IMAGE, MakeApp

pytestmark = pytest.mark.timeout(30)

TASK = "127.0.0.1:5000/swe/task-1:v1"


async def test_a_per_image_snapshot_restores_into_its_image(make_app: MakeApp) -> None:
    backend = FakeBackend(images={IMAGE})
    backend.registry.add(TASK, 10 << 20)
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        await client.create_pool("swe", IMAGE, max_size=8, images=["*"])
        await client.create_pool("own", IMAGE, max_size=4)
        lease = await client.lease("swe", image=TASK, timeout=10.0)
        source = lease[0]
        assert source.info.image == TASK
        await source.write_file("kept.txt", b"state")
        snap = await source.snapshot()
        assert snap.image == TASK

        restored = await client.restore(snap.id, n=2, timeout=10.0)
        assert [s.info.image for s in restored] == [TASK, TASK]
        assert all([await s.read_file("kept.txt") == b"state" for s in restored])
        await restored.release()

        with pytest.raises(FailedPrecondition, match="taken on image"):
            await client.restore(snap.id, pool="own", timeout=10.0)
        await lease.release()
