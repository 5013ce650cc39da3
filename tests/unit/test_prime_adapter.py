"""The Prime API adapter with the real prime-sandboxes SDK, on the fake
backend: what only the fake can stage (a sandbox dying under a command)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest, SandboxNotRunningError

from sandboxd import errors
from sandboxd.adapters.prime import PRIME_SERVER, PrimeSettings, make_app
from sandboxd.adapters.prime.registry import PrimeServer
from sandboxd.adapters.prime.sandbox import PrimeSandbox
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from tests.unit.conftest import MakeApp, wait_for

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def prime(
    make_app: MakeApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[web.Application, FakeBackend]]:
    backend = FakeBackend()
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", "img", min_ready=1, max_size=2)
        web_app = make_app_for(client)
        runner = web.AppRunner(web_app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("PRIME_API_BASE_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("PRIME_API_KEY", "k")
        try:
            yield web_app, backend
        finally:
            await runner.cleanup()


def make_app_for(client: AsyncClient) -> web.Application:
    return make_app(client, PrimeSettings(image_pools={"python:3.11-slim": "p"}))


async def test_a_sandbox_lost_under_a_command_is_not_running_not_a_failed_command(
    prime: tuple[web.Application, FakeBackend],
) -> None:
    web_app, backend = prime
    sdk = AsyncSandboxClient()
    try:
        sb = await sdk.create(CreateSandboxRequest(name="x", docker_image="python:3.11-slim"))
        await sdk.wait_for_creation(sb.id)
        box = web_app[PRIME_SERVER]._boxes[sb.id]
        backend.kill(next(h for h, b in backend.sandboxes.items() if b.spec.sandbox_id == box.sandbox))
        with pytest.raises(SandboxNotRunningError):
            await sdk.execute_command(sb.id, "echo never")
        got = await sdk.get(sb.id)
        assert (got.status, got.error_type) == ("ERROR", "SANDBOX_LOST")
        assert box.lease is None, "its lease was released"
    finally:
        await sdk.aclose()


async def test_a_release_refused_over_the_tenants_call_rate_is_retried(make_app: MakeApp) -> None:
    # Ending a sandbox when the tenant is over its call rate: the release answers
    # RESOURCE_EXHAUSTED with a retry hint, and must be retried, not dropped.
    app = await make_app(tenants={"t": {"token": "tk", "requests_per_second": 4}})
    async with AsyncClient(app.address, token="tk") as client:
        await client.create_pool("p", "img", min_ready=1, max_size=2)
        server = PrimeServer(client, PrimeSettings(image_pools={"python:3.11-slim": "p"}))
        box = PrimeSandbox(
            id="sb1",
            name="x",
            image="python:3.11-slim",
            cpu_cores=1,
            memory_gb=1,
            disk_size_gb=1,
            timeout_minutes=0,
            idle_timeout_minutes=None,
            env={},
            shown_env={},
            labels=[],
            token="",
        )
        server.add(box)
        await wait_for(lambda: box.status == "RUNNING", timeout=10, what="the sandbox to run")
        with pytest.raises(errors.ResourceExhausted):
            for _ in range(20):
                await client.list_pools()
        await server.close()
        assert box.lease is None and not app.control.leases.all(), app.control.leases.all()
