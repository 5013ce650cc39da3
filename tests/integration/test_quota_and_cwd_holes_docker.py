"""Two containment holes found by outside probes, closed on the real engine:
a group acquire cannot take more sandboxes than the tenant's quota leaves,
and an exec cwd cannot climb out of the workspace. Each time a bystander of
another tenant keeps answering and no container is left behind (the
server fixture fails the test on any leftover)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.app import App
from sandboxd.backends.base import LABEL_POOL
from sandboxd.client import AsyncClient, Sandbox
from tests.integration.conftest import instance_containers, make_settings, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

TENANTS = {
    "alice": {"token": "tok-alice", "max_sandboxes": 3, "max_memory_bytes": 3 * (128 << 20)},
    "bob": {"token": "tok-bob"},
}
LIMITS = {"memory_bytes": 128 << 20}


@pytest.fixture
async def tenant_app(tmp_path: Path, engine: docker.DockerClient, image: str) -> AsyncIterator[App]:
    # running_app fails the test if any container of this instance is left.
    async with running_app(make_settings(tmp_path, tenants=TENANTS), engine) as app:
        yield app


@pytest.fixture
async def alice(tenant_app: App) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(tenant_app.address, token="tok-alice") as c:
        yield c


@pytest.fixture
async def bystander(tenant_app: App, image: str) -> AsyncIterator[Sandbox]:
    """Bob's sandbox, leased for the whole test."""
    async with AsyncClient(tenant_app.address, token="tok-bob") as bob:
        await bob.create_pool("side", image, min_ready=1, max_size=1, limits=LIMITS)
        async with bob.acquire("side", timeout=60) as sb:
            assert (await sb.exec("echo up", session="probe")).text == "up\n"
            yield sb
        await bob.delete_pool("side", force=True)


async def _answers(sb: Sandbox) -> None:
    r = await sb.exec("echo still here", session="probe", timeout=30)
    assert r.ok and r.text == "still here\n", r


def _containers_of(engine: docker.DockerClient, app: App, pool: str) -> int:
    """Containers the engine holds for this instance's pool ``pool`` (its internal key)."""
    found = instance_containers(engine, app.settings.instance_id)
    return sum(1 for c in found if c.labels.get(LABEL_POOL) == pool)


async def test_group_acquire_stops_at_the_tenant_quota(
    tenant_app: App, alice: AsyncClient, bystander: Sandbox, engine: docker.DockerClient, image: str
) -> None:
    await alice.create_pool("q", image, min_ready=0, max_size=5, limits=LIMITS)
    lease = await alice.lease("q", n=5, min_n=1, timeout=90)
    try:
        assert len(lease.sandboxes) == 3  # max_sandboxes, not the 5 asked for
        for sb in lease.sandboxes:
            assert (await sb.exec("true")).ok
        with pytest.raises(errors.ResourceExhausted, match="holds 3 of 3") as info:
            await alice.lease("q", n=2, min_n=1, timeout=5)
        assert info.value.retry_after is not None
        with pytest.raises(errors.FailedPrecondition, match="max_sandboxes"):
            await alice.lease("q", n=4, timeout=5)
        with pytest.raises(errors.FailedPrecondition, match="max_sandboxes"):
            await alice.lease("q", n=5, min_n=4, timeout=5)
        await _answers(bystander)
        # Nothing beyond the quota was handed out, nor created for it.
        leased = [s for s in await alice.list_sandboxes("q") if s.lease_id]
        assert len(leased) == 3
        assert await asyncio.to_thread(_containers_of, engine, tenant_app, "alice/q") == 3
    finally:
        await lease.release()
    assert [s for s in await alice.list_sandboxes("q") if s.lease_id] == []
    await alice.delete_pool("q", force=True)
    await _answers(bystander)


@pytest.mark.parametrize("cwd", ["../../etc", "../../dev/shm", "x/../../..", "..", "bad\x00"])
async def test_exec_cwd_cannot_leave_the_workspace(
    alice: AsyncClient, bystander: Sandbox, image: str, cwd: str
) -> None:
    await alice.create_pool("c", image, min_ready=1, max_size=1, limits=LIMITS)
    async with alice.acquire("c", timeout=60) as sb:
        for session in ("", "s"):
            with pytest.raises(errors.InvalidArgument) as info:
                await sb.exec("touch escaped-marker; pwd", cwd=cwd, session=session)
            assert info.value.field == "cwd"
        # Refused before anything ran: no marker anywhere the command could write.
        r = await sb.exec("ls /dev/shm /tmp /workspace; find / -xdev -name escaped-marker 2>/dev/null")
        assert "escaped-marker" not in r.text, r
        await _answers(bystander)
        # The cwds that worked before still work.
        assert (await sb.exec("mkdir -p sub/d && echo ok")).ok
        for good, where in [
            ("", "/workspace"),
            ("sub", "/workspace/sub"),
            ("sub/d/..", "/workspace/sub"),
            ("/workspace/sub/d", "/workspace/sub/d"),
            ("/tmp", "/tmp"),
            ("/etc", "/etc"),
            ("/workspace/../etc", "/etc"),
        ]:
            r = await sb.exec("pwd", cwd=good)
            assert r.ok and r.text == f"{where}\n", (good, r)
        r = await sb.exec("pwd", cwd="sub", session="s")
        assert r.text == "/workspace/sub\n", r
    await alice.delete_pool("c", force=True)
    await _answers(bystander)
