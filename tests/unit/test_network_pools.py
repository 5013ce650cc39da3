"""Pools with a network policy: rules checked, refused where not enforceable, kept across restarts."""

from __future__ import annotations

import pytest

from sandboxd.backends.base import Limits, SandboxSpec
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.core.pools.config import PoolConfig
from sandboxd.core.state import pool_from_json, pool_to_json
from sandboxd.errors import FailedPrecondition, InvalidArgument
from sandboxd.v1 import preflight_pb2
from tests.unit.conftest import IMAGE, MakeApp


class EnforcingFake(FakeBackend):
    """A fake that says it enforces policies, to see the rules reach each sandbox's spec."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[SandboxSpec] = []
        self.broken = ""

    def network_refusal(self, runtime: str) -> str | None:
        if self.broken:
            return self.broken
        return None if runtime == "runc" else f"not under {runtime}"

    async def create(self, spec: SandboxSpec) -> str:
        self.specs.append(spec)
        return await super().create(spec)


async def test_a_backend_that_cannot_enforce_refuses_the_pool(client: AsyncClient) -> None:
    with pytest.raises(FailedPrecondition, match="does not enforce network policies"):
        await client.create_pool("net", IMAGE, network=["pypi.internal"])
    assert [p.spec.name for p in await client.list_pools()] == []
    await client.create_pool("none", IMAGE)
    assert list((await client.get_pool("none")).spec.network) == []


@pytest.mark.parametrize(
    ("rule", "words"), [("*.com", "two labels"), ("host:0", "1-65535"), ("bad host", "not a host name")]
)
async def test_bad_rules_are_invalid_argument(client: AsyncClient, rule: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"spec\.network: rule .*{words}"):
        await client.create_pool("net", IMAGE, network=["ok.example", rule])


async def test_rules_reach_every_sandbox_of_the_pool(make_app: MakeApp) -> None:
    backend = EnforcingFake()
    app = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        with pytest.raises(FailedPrecondition, match="not under gvisor"):
            await client.create_pool("gv", IMAGE, runtime="gvisor", network=["a.example"])
        await client.create_pool("net", IMAGE, network=["pypi.internal", "10.0.0.0/8:8080"])
        async with client.acquire("net"):
            pass
        report = await client.preflight(concurrent=1, pool="net")
        assert report.ok and list(report.network) == ["pypi.internal", "10.0.0.0/8:8080"]
        await client.create_pool("none", IMAGE)
        assert list((await client.preflight(concurrent=1, pool="none")).network) == []
        backend.broken = "the egress tools went missing"
        report = await client.preflight(concurrent=1, pool="net")
        assert not report.ok
        assert [(p.kind, p.message, p.field) for p in report.problems] == [
            (preflight_pb2.PROBLEM_KIND_NETWORK_UNAVAILABLE, "the egress tools went missing", "spec.network")
        ]
        assert (await client.preflight(concurrent=1, pool="none")).ok
    assert backend.specs and all(s.network == ("pypi.internal", "10.0.0.0/8:8080") for s in backend.specs)


def test_rules_are_kept_with_the_pool() -> None:
    config = PoolConfig("t/net", "img", 0, 4, Limits(), network=["pypi.internal", "*.forge.example:443"])
    assert pool_from_json(pool_to_json(config)).network == config.network
    old = pool_to_json(PoolConfig("t/old", "img", 0, 4, Limits())).replace(', "network": []', "")
    assert pool_from_json(old).network == []


async def test_the_rules_label_cannot_be_set_by_a_user(client: AsyncClient) -> None:
    # Read back from containers after a restart, a forged one would give a sandbox network.
    with pytest.raises(InvalidArgument, match=r"sandboxd\.network"):
        await client.create_pool("forged", IMAGE, labels={"sandboxd.network": '["*.example.com"]'})
