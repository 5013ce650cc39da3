"""Tenants over gRPC on the fake backend: authentication, isolation, quotas,
limit ceilings, per-acquire limits and pre-flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandboxd import errors
from sandboxd.app import App
from sandboxd.backends.base import Limits, SandboxSpec
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.core.tenancy import acting_as
from sandboxd.errors import ResourceExhausted
from sandboxd.settings import load_settings
from sandboxd.v1 import common_pb2
from tests.unit.conftest import MakeApp, MakeControl, wait_for

pytestmark = pytest.mark.timeout(30)

TENANTS = {
    "alice": {
        "token": "tok-alice",
        "max_sandboxes": 3,
        "max_memory_bytes": 3 * (64 << 20),
        "ceiling": {"memory_bytes": 256 << 20},
    },
    "bob": {"token": "tok-bob", "creates_per_minute": 2},
}


@pytest.fixture
async def tenant_app(make_app: MakeApp) -> App:
    return await make_app(tenants=TENANTS, backend=FakeBackend())


@pytest.fixture
async def alice(tenant_app: App) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(tenant_app.address, token="tok-alice") as c:
        yield c


@pytest.fixture
async def bob(tenant_app: App) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(tenant_app.address, token="tok-bob") as c:
        yield c


async def test_missing_or_wrong_token_is_unauthenticated(tenant_app: App) -> None:
    async with AsyncClient(tenant_app.address) as anonymous:
        with pytest.raises(errors.Unauthenticated, match="missing credentials"):
            await anonymous.list_pools()
    async with AsyncClient(tenant_app.address, token="nope") as wrong:
        with pytest.raises(errors.Unauthenticated, match="unknown token"):
            await wrong.list_pools()
    async with AsyncClient(tenant_app.address, metadata=[("authorization", "Basic abc")]) as basic:
        with pytest.raises(errors.Unauthenticated, match="Bearer"):
            await basic.list_pools()


async def test_health_needs_no_token(tenant_app: App) -> None:
    async with grpc.aio.insecure_channel(tenant_app.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_tenants_see_only_their_own(alice: AsyncClient, bob: AsyncClient) -> None:
    await alice.create_pool("work", "img", min_ready=1, max_size=3, limits={"memory_bytes": 64 << 20})
    await bob.create_pool("work", "img", min_ready=0, max_size=2)  # same name, no clash
    assert [p.spec.name for p in await alice.list_pools()] == ["work"]
    assert [p.spec.name for p in await bob.list_pools()] == ["work"]
    lease = await alice.lease("work", timeout=5)
    sid = lease.sandboxes[0].id
    assert lease.sandboxes[0].info.pool == "work"
    with pytest.raises(errors.NotFound):
        await bob.exec(sid, "true")
    with pytest.raises(errors.NotFound):
        await bob.get_sandbox(sid)
    with pytest.raises(errors.NotFound):
        await bob.heartbeat(lease.id)
    with pytest.raises(errors.NotFound):
        await bob.release(lease.id)
    assert await bob.list_sandboxes() == []
    assert (await alice.exec(sid, "echo mine")).text == "mine\n"
    await alice.release(lease.id)
    with pytest.raises(errors.NotFound):
        await bob.delete_pool("nonexistent")


async def test_over_quota_is_resource_exhausted_with_retry_after(alice: AsyncClient) -> None:
    await alice.create_pool("q", "img", min_ready=3, max_size=5, limits={"memory_bytes": 64 << 20})
    held = await alice.lease("q", n=3, lease_ttl=20, timeout=5)
    with pytest.raises(errors.ResourceExhausted, match="holds 3 of 3") as info:
        await alice.lease("q", timeout=5)
    assert info.value.retry_after is not None and 0.5 <= info.value.retry_after <= 30
    await held.release()
    again = await alice.lease("q", n=2, timeout=5)
    await again.release()


async def test_memory_quota(alice: AsyncClient) -> None:
    await alice.create_pool("big", "img", min_ready=0, max_size=5, limits={"memory_bytes": 128 << 20})
    lease = await alice.lease("big", timeout=5)
    with pytest.raises(errors.ResourceExhausted, match="memory") as info:
        await alice.lease("big", timeout=5)
    assert info.value.retry_after is not None
    # Two of 128 MiB never fit a 192 MiB quota, however much is released.
    with pytest.raises(errors.FailedPrecondition, match="max_memory_bytes"):
        await alice.lease("big", n=2, timeout=5)
    await lease.release()


async def test_creates_per_minute(bob: AsyncClient) -> None:
    await bob.create_pool("r", "img", min_ready=0, max_size=5)
    for _ in range(2):
        await (await bob.lease("r", timeout=5)).release()
    with pytest.raises(errors.ResourceExhausted, match="per minute") as info:
        await bob.lease("r", timeout=5)
    assert info.value.retry_after is not None and info.value.retry_after > 0


async def test_limits_above_the_ceiling_are_invalid(alice: AsyncClient) -> None:
    with pytest.raises(errors.InvalidArgument, match="ceiling") as info:
        await alice.create_pool("huge", "img", limits={"memory_bytes": 1 << 30})
    assert info.value.field == "spec.limits.memory_bytes"


async def test_per_acquire_limits(make_app: MakeApp) -> None:
    backend = FakeBackend()
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", "img", min_ready=1, max_size=3, limits={"memory_bytes": 256 << 20})
        async with client.acquire("p", limits={"memory_bytes": 64 << 20, "pids": 32}) as sb:
            box = next(b for b in backend.sandboxes.values() if b.spec.sandbox_id == sb.id)
            assert box.limits is not None and box.limits.memory_bytes == 64 << 20 and box.limits.pids == 32
            assert sb.info.limits.memory_bytes == 64 << 20
        with pytest.raises(errors.InvalidArgument, match="above the pool") as info:
            await client.lease("p", limits={"memory_bytes": 512 << 20}, timeout=5)
        assert info.value.field == "limits.memory_bytes"
        with pytest.raises(errors.InvalidArgument, match="workspace size"):
            await client.lease("p", limits={"disk_bytes": 1 << 20}, timeout=5)


async def test_auth_is_required_beyond_loopback_without_tokens() -> None:
    from sandboxd.app import make_authenticator

    settings = load_settings(overrides={"server.host": "0.0.0.0", "backend.kind": "fake"})
    with pytest.raises(ValueError, match="authentication is required"):
        make_authenticator(settings)
    settings.server.require_auth = False
    assert not make_authenticator(settings).required


async def test_preflight_reports_every_problem(alice: AsyncClient, tenant_app: App) -> None:
    backend = tenant_app.backend
    assert isinstance(backend, FakeBackend)
    backend.images = {"img"}
    backend.memory_bytes = 1 << 30
    report = await alice.preflight(
        image="missing:1",
        limits={"memory_bytes": 128 << 20, "lifetime_seconds": 60},
        concurrent=20,
        duration=600,
    )
    kinds = {p.kind for p in report.problems}
    names = {
        1: "IMAGE_MISSING",
        3: "QUOTA_TOO_SMALL",
        4: "CAPACITY_TOO_SMALL",
        7: "LIFETIME_TOO_SHORT",
    }
    assert {names[k] for k in kinds if k in names} == set(names.values()), report
    assert not report.ok
    assert report.capacity.memory_needed_bytes == 20 * (128 << 20)
    assert report.predicted_warm_seconds > 0
    bad = await alice.preflight(image="img", limits={"memory_bytes": 1 << 40}, concurrent=1)
    assert bad.problems[0].kind == 2 and bad.problems[0].field == "template.limits.memory_bytes"
    good = await alice.preflight(image="img", limits={"memory_bytes": 64 << 20}, concurrent=2, duration=10)
    assert good.ok, good
    with pytest.raises(errors.InvalidArgument, match="concurrent"):
        await alice.preflight(image="img", concurrent=0)
    # A pre-flight creates nothing.
    assert backend.creates == 0
    with acting_as("alice"):
        assert tenant_app.control.list_pools() == []


async def test_preflight_on_a_pool(make_app: MakeApp) -> None:
    app = await make_app()
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", "img", min_ready=0, max_size=4)
        report = await client.preflight(pool="p", concurrent=10)
        assert [p.kind for p in report.problems] == [6]
        assert "max_size" in report.problems[0].message
        with pytest.raises(errors.NotFound):
            await client.preflight(pool="nope", concurrent=1)


async def test_per_tenant_call_rate_limit(make_app: MakeApp) -> None:
    app = await make_app(tenants={"c": {"token": "tok-c", "requests_per_second": 5}})
    async with AsyncClient(app.address, token="tok-c") as c:
        with pytest.raises(errors.ResourceExhausted, match="calls per second") as info:
            for _ in range(50):
                await c.list_pools()
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 1


async def test_oversize_message_is_refused_and_nothing_breaks(make_app: MakeApp) -> None:
    app = await make_app(server__max_message_bytes=1 << 20)
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", "img", max_size=2)
        async with client.acquire("p") as sb:
            with pytest.raises(errors.SandboxdError, match="RESOURCE_EXHAUSTED|larger than"):
                await sb.write_files({"big": b"x" * (2 << 20)})
            assert (await sb.exec("echo ok")).text == "ok\n"


def _retry_trailer(e: errors.SandboxdError) -> str | None:
    """The retry-after-seconds trailer of the RPC error behind ``e``, if any."""
    cause = e.__cause__
    assert isinstance(cause, grpc.aio.AioRpcError)
    for key, value in cause.trailing_metadata() or ():
        if key == "retry-after-seconds":
            return str(value)
    return None


async def test_group_acquire_gets_only_what_the_quota_leaves(alice: AsyncClient) -> None:
    await alice.create_pool("g", "img", min_ready=5, max_size=5, limits={"memory_bytes": 64 << 20})
    first = await alice.lease("g", n=5, min_n=1, timeout=5)
    assert len(first.sandboxes) == 3  # max_sandboxes = 3, not the 5 asked for
    with pytest.raises(errors.ResourceExhausted, match="holds 3 of 3") as info:
        await alice.lease("g", n=5, min_n=1, timeout=5)
    assert info.value.retry_after is not None and _retry_trailer(info.value) is not None
    await alice.release(first.id, [first.sandboxes[0].id, first.sandboxes[1].id])
    second = await alice.lease("g", n=5, min_n=1, timeout=5)
    assert len(second.sandboxes) == 2
    assert len(await alice.list_sandboxes(state=common_pb2.SANDBOX_STATE_LEASED)) == 3
    await first.release()
    await second.release()


async def test_group_acquire_gets_only_what_the_memory_quota_leaves(alice: AsyncClient) -> None:
    # 96 MiB each: three fit max_sandboxes, two fit max_memory_bytes (192 MiB).
    await alice.create_pool("m", "img", min_ready=4, max_size=4, limits={"memory_bytes": 96 << 20})
    lease = await alice.lease("m", n=4, min_n=1, timeout=5)
    assert len(lease.sandboxes) == 2
    with pytest.raises(errors.ResourceExhausted, match="memory") as info:
        await alice.lease("m", n=2, min_n=1, timeout=5)
    assert info.value.retry_after is not None
    await lease.release()


@pytest.mark.parametrize(
    ("n", "min_n", "quota"),
    [(4, 0, "max_sandboxes"), (5, 4, "max_sandboxes"), (3, 3, "max_memory_bytes")],
)
async def test_acquire_that_can_never_fit_the_quota_is_failed_precondition(
    alice: AsyncClient, n: int, min_n: int, quota: str
) -> None:
    memory = (96 << 20) if quota == "max_memory_bytes" else (64 << 20)
    await alice.create_pool("never", "img", min_ready=0, max_size=5, limits={"memory_bytes": memory})
    with pytest.raises(errors.FailedPrecondition, match=quota) as info:
        await alice.lease("never", n=n, min_n=min_n, timeout=5)
    assert _retry_trailer(info.value) is None  # no release would ever make room
    assert await alice.list_sandboxes(state=common_pb2.SANDBOX_STATE_LEASED) == []


class _GatedCreates(FakeBackend):
    """Creates wait for ``gate``, so an acquire can be held mid-wait."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def create(self, spec: SandboxSpec) -> str:
        await self.gate.wait()
        return await super().create(spec)


async def test_concurrent_acquires_share_one_quota(make_control: MakeControl) -> None:
    backend = _GatedCreates()
    h = await make_control(backend=backend, tenants=TENANTS)
    with acting_as("alice"):
        await h.pool("c", min_ready=0, max_size=5, limits=Limits(memory_bytes=64 << 20))
        # The pool is empty: the first acquire waits for creates while the
        # second is admitted, and the quota must count what the first was granted.
        first = asyncio.create_task(h.acquire("c", 2))
        await wait_for(lambda: h.control.pools["alice/c"].waiting > 0, what="first acquire waiting")
        with pytest.raises(ResourceExhausted, match="holds 2 of 3"):
            await h.acquire("c", 2)
        backend.gate.set()
        _, records = await first
        assert len(records) == 2
        _, extra = await h.acquire("c", 3, min_n=1)
        assert len(extra) == 1
        assert h.control.usage("alice").sandboxes == 3
