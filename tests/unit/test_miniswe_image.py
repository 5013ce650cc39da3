"""mini-swe-agent's environment ``image`` (set per SWE-bench instance by its
runner) leases a sandbox of that image from a template pool; on the fake
backend and its registry."""

from __future__ import annotations

import asyncio

import pytest

from sandboxd.adapters.miniswe import SandboxdEnvironment
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.errors import FailedPrecondition
from tests.unit.conftest import IMAGE, MakeApp

pytestmark = pytest.mark.timeout(30)

TASK = "127.0.0.1:5000/swe/sympy-42:v1"


async def test_the_environment_image_picks_the_sandbox_image(make_app: MakeApp) -> None:
    backend = FakeBackend(images={IMAGE})
    backend.registry.add(TASK, 30 << 20)
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        await client.create_pool("swe", IMAGE, max_size=2, images=["*"])
        await client.create_pool("own", IMAGE, max_size=2)
    env = await asyncio.to_thread(SandboxdEnvironment, target=app.address, pool="swe", image=TASK)
    try:
        (made,) = backend.sandboxes.values()
        assert made.spec.image == TASK and made.spec.sandbox_id == env.sandbox_id
        assert env.config.model_dump()["image"] == TASK
    finally:
        await asyncio.to_thread(env.cleanup)
    with pytest.raises(FailedPrecondition, match="serves only its own image"):
        await asyncio.to_thread(SandboxdEnvironment, target=app.address, pool="own", image=TASK)
