"""Honest capacity on the real engine: a host ceiling far below what is
asked ends in typed answers (RESOURCE_EXHAUSTED at once for what can never
fit, DEADLINE_EXCEEDED naming the host's capacity before the deadline for
what must wait), nothing stays leased, and nothing is left behind."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.client import AsyncClient
from tests.integration.conftest import instance_containers, make_settings, poll, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


async def test_past_host_capacity_acquires_end_typed_and_bounded(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    settings = make_settings(tmp_path, **{"pools.max_total_sandboxes": 3, "pools.max_starting": 2})
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        assert app.control.reconciler.capacity.sandboxes > 0  # the host's estimate is known
        await client.create_pool("cap", image, min_ready=0, max_size=8)
        with pytest.raises(errors.ResourceExhausted, match="host holds at most 3"):
            await client.lease("cap", n=4, timeout=30)
        held = await client.lease("cap", n=3, timeout=60)
        # The server answers before the client's deadline, naming the cause
        # (a client-side deadline would carry no such message).
        with pytest.raises(errors.DeadlineExceeded, match="host capacity: 3 of 3"):
            await client.lease("cap", n=1, timeout=1.5)
        pool = app.control.pools[next(k for k in app.control.pools if k.endswith("cap"))]
        assert pool.waiting == 0 and len(app.control.leases.all()) == 1
        await held.release()
        await poll(lambda: not pool.records, what="released sandboxes to go")
        assert len(app.control.reconciler.in_doubt) == 0
        assert not instance_containers(engine, settings.instance_id)
