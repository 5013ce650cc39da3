"""The Prime API adapter's docker_image on a template pool (one pool serving
every task image), with the real prime-sandboxes SDK on the fake backend
and its registry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest

from sandboxd.adapters.prime import PRIME_SERVER, PrimeSettings
from sandboxd.adapters.prime import make_app as make_prime_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from tests.unit.conftest import IMAGE, MakeApp

pytestmark = pytest.mark.timeout(30)

TASK = "127.0.0.1:5000/swe/django-1234:v1"


@pytest.fixture
async def prime(
    make_app: MakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[web.Application, FakeBackend, AsyncClient]]:
    backend = FakeBackend(images={IMAGE})
    backend.registry.add(TASK, 40 << 20)
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        await client.create_pool("swe", IMAGE, max_size=4, images=["*"])
        web_app = make_prime_app(client, PrimeSettings(template_pool="swe"))
        runner = web.AppRunner(web_app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("PRIME_API_BASE_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("PRIME_API_KEY", "k")
        try:
            yield web_app, backend, client
        finally:
            await runner.cleanup()


async def test_docker_image_is_acquired_from_the_template_pool(
    prime: tuple[web.Application, FakeBackend, AsyncClient],
) -> None:
    web_app, backend, client = prime
    sdk = AsyncSandboxClient()
    try:
        sb = await sdk.create(CreateSandboxRequest(name="t", docker_image=TASK))
        await sdk.wait_for_creation(sb.id)
        box = web_app[PRIME_SERVER]._boxes[sb.id]
        (made,) = [b for b in backend.sandboxes.values() if b.spec.sandbox_id == box.sandbox]
        assert made.spec.image == TASK and made.spec.pool.endswith("swe")
        assert backend.registry.pulls[TASK] == 1
        # No pool per image: the template serves it.
        assert [p.spec.name for p in await client.list_pools()] == ["swe"]
    finally:
        await sdk.aclose()


@pytest.mark.usefixtures("prime")
async def test_an_image_the_registry_lacks_is_an_image_pull_failure() -> None:
    sdk = AsyncSandboxClient()
    try:
        sb = await sdk.create(CreateSandboxRequest(name="t", docker_image="127.0.0.1:5000/swe/absent:v1"))
        deadline = time.monotonic() + 10.0
        got = await sdk.get(sb.id)
        while got.status == "PENDING":
            assert time.monotonic() < deadline, "still PENDING"
            await asyncio.sleep(0.02)  # polled under the deadline above
            got = await sdk.get(sb.id)
        assert (got.status, got.error_type) == ("ERROR", "IMAGE_PULL_FAILED")
        assert "no image" in (got.error_message or "")
    finally:
        await sdk.aclose()
