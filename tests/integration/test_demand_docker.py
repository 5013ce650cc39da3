"""A demand-following pool on the real engine: announced demand steps up and
down and the pool (its containers) follows; a warm container killed behind
the server's back is replaced."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd.app import App, build_app
from sandboxd.client import AsyncClient
from tests.integration.conftest import instance_containers, make_settings, poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.fixture
async def demand_app(tmp_path: Path, engine: docker.DockerClient, image: str) -> AsyncIterator[App]:
    settings = make_settings(
        tmp_path,
        **{
            "pools.scale_down_delay_seconds": 2.0,
            "pools.liveness_interval_seconds": 0.5,
            "pools.max_starting": 4,
        },
    )
    app = build_app(settings)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace=1)
        left = await asyncio.to_thread(instance_containers, engine, settings.instance_id)
        for c in left:
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(c.remove, force=True)
        assert not left, f"leaked containers: {[c.name for c in left]}"


async def running(engine: docker.DockerClient, app: App) -> int:
    found = await asyncio.to_thread(instance_containers, engine, app.settings.instance_id)
    return sum(1 for c in found if c.status == "running")


async def test_pool_follows_announced_demand_up_and_down(
    demand_app: App, engine: docker.DockerClient, image: str
) -> None:
    async with AsyncClient(demand_app.address) as client:
        await client.create_pool("d", image, min_ready=0, max_size=8, max_ready=6)
        pool = demand_app.control.get_pool("d")
        assert await running(engine, demand_app) == 0

        # Step up: "in ~1 s I will run 5 rollouts".
        await client.set_demand("d", 5, in_seconds=1.0, ttl=60, source="step-1")
        await poll(lambda: pool.ready == 5, timeout=90, what="5 warm")
        assert await running(engine, demand_app) == 5
        async with client.acquire_group("d", n=5, timeout=5) as group:
            assert len(group) == 5
            results = await asyncio.gather(*(sb.exec("echo ok") for sb in group))
            assert all(r.ok for r in results)
            # The step's acquires consumed the announcement: no refill behind them.
            await poll(lambda: pool.warm_target == 0, timeout=5, what="announcement consumed")

        # Between steps nothing is announced or used: scale to zero.
        await poll(
            lambda: pool.ready == 0 and not pool.records,
            timeout=60,
            what="scaled to zero",
        )
        assert await running(engine, demand_app) == 0

        # Step up again, smaller; then withdraw before it is used.
        await client.set_demand("d", 3, source="step-2")
        await poll(lambda: pool.ready == 3, timeout=90, what="3 warm")
        await client.set_demand("d", 0, source="step-2")
        await poll(lambda: not pool.records, timeout=60, what="withdrawn and scaled down")
        assert await running(engine, demand_app) == 0
        assert pool.failed_total == 0
        # Exactly what the two steps asked for was created.
        assert pool.created_total == 8


async def test_a_warm_container_killed_outside_the_server_is_replaced(
    demand_app: App, engine: docker.DockerClient, image: str
) -> None:
    async with AsyncClient(demand_app.address) as client:
        await client.create_pool("w", image, min_ready=2, max_size=4)
        pool = demand_app.control.get_pool("w")
        await poll(lambda: pool.ready == 2, timeout=90, what="2 warm")
        victim = pool.ready_records()[0]
        await asyncio.to_thread(engine.containers.get(victim.handle).kill)
        await poll(lambda: victim.sandbox_id not in pool.records, timeout=30, what="dead one dropped")
        await poll(lambda: pool.ready == 2, timeout=90, what="replaced")
        assert victim.failure_reason == "died while warm"
        async with client.acquire_group("w", n=2, timeout=5) as group:
            results = await asyncio.gather(*(sb.exec("true") for sb in group))
            assert all(r.ok for r in results)
