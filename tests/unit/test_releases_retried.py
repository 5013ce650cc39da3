"""A lease let go of while the server is busy is still released, not left to
its TTL: a held lease's exit, the release of what a given-up acquire was
granted, and the verifiers and rLLM adapters' close each retry a release the
server refused for now (here: over the tenant's call rate, answered
RESOURCE_EXHAUSTED with a retry hint), and one refused release does not keep
the other leases from theirs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from sandboxd import errors
from sandboxd.adapters.rllm import SandboxdSandbox
from sandboxd.adapters.verifiers import SandboxdRuntime
from sandboxd.app import App
from sandboxd.client import AsyncClient
from sandboxd.v1 import sandboxes_pb2
from tests.unit.conftest import IMAGE, MakeApp, wait_for

pytestmark = pytest.mark.timeout(60)

TENANTS = {"t": {"token": "tk", "requests_per_second": 4}}


async def _busy(client: AsyncClient) -> None:
    """Spends the tenant's call rate: its next calls are refused for a moment."""
    with pytest.raises(errors.ResourceExhausted):
        for _ in range(40):
            await client.list_pools()


@contextlib.asynccontextmanager
async def _tenants_pool(make_app: MakeApp, ready: int) -> AsyncIterator[tuple[App, AsyncClient]]:
    """A server and tenant t's client, t's pool "p" warm with ``ready`` sandboxes."""
    app = await make_app(tenants=TENANTS)
    async with AsyncClient(app.address, token="tk") as client:
        await client.create_pool("p", IMAGE, min_ready=ready, max_size=4)
        # The pool is tenant t's: looked at through the registry, not as the default tenant.
        await wait_for(
            lambda: all(pool.ready >= ready for pool in app.control.registry.pools.values()),
            what="the pool warm",
        )
        yield app, client


async def test_a_held_lease_is_released_on_exit_while_the_server_is_busy(make_app: MakeApp) -> None:
    async with _tenants_pool(make_app, 1) as (app, client):
        async with client.acquire("p", timeout=10):
            assert len(app.control.leases) == 1
            await _busy(client)
        assert not app.control.leases.all()


async def test_what_a_given_up_acquire_was_granted_is_released_while_the_server_is_busy(
    make_app: MakeApp,
) -> None:
    async with _tenants_pool(make_app, 1) as (app, client):
        # Granted, but as far as the client knows its answer was lost (the call
        # cancelled as it was answered): only the request id can free it.
        ask = sandboxes_pb2.AcquireRequest(pool="p", request_id="rq-lost-answer", timeout_seconds=5)
        await client.sandboxes.Acquire(ask, metadata=client.metadata)
        assert len(app.control.leases) == 1
        await _busy(client)
        client._give_up("rq-lost-answer")
        await client.wait_background()
        assert not app.control.leases.all()


async def test_verifiers_close_releases_every_sandbox_while_the_server_is_busy(make_app: MakeApp) -> None:
    async with _tenants_pool(make_app, 3) as (app, client):
        runtime = SandboxdRuntime(client, "p")
        ids = [await runtime.create_sandbox(timeout=10) for _ in range(3)]
        assert len(app.control.leases) == 3
        await _busy(client)
        await runtime.close()
        assert not app.control.leases.all()
        # Deleting an id close already released is a no-op.
        await runtime.delete_sandbox(ids[0])


async def test_verifiers_delete_keeps_a_lease_whose_release_was_refused(make_app: MakeApp) -> None:
    async with _tenants_pool(make_app, 1) as (app, client):
        runtime = SandboxdRuntime(client, "p")
        sandbox_id = await runtime.create_sandbox(timeout=10)
        await _busy(client)
        with pytest.raises(errors.ResourceExhausted):
            await runtime.delete_sandbox(sandbox_id)
        # Still the runtime's: its close releases it.
        await runtime.close()
        assert not app.control.leases.all()


async def test_rllm_close_releases_its_sandbox_while_the_server_is_busy(make_app: MakeApp) -> None:
    async with _tenants_pool(make_app, 1) as (app, client):
        sandbox = await asyncio.to_thread(SandboxdSandbox, "task-1", pool="p", target=app.address, token="tk")
        assert len(app.control.leases) == 1
        await _busy(client)
        await asyncio.to_thread(sandbox.close)
        assert not app.control.leases.all()
