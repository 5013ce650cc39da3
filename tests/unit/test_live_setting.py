"""A pool's live_snapshots setting: its default and checks, where it is
shown, what the backends are told, and the live snapshots it refuses."""

from __future__ import annotations

import pytest

from sandboxd import errors
from sandboxd.backends.base import GVISOR, KEEP_VAR, RUNC, Limits, SandboxSpec
from sandboxd.backends.docker.containerspec import LABEL_KEEPER, DockerOptions, container_spec
from sandboxd.backends.docker.keeper import KEEPER_COMMAND
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from sandboxd.core.pools import PoolConfig
from sandboxd.core.state import pool_from_json, pool_to_json
from sandboxd.core.validation import RESERVED_LABELS
from tests.unit.conftest import IMAGE, MakeApp
from tests.unit.test_live_snapshots import live_app

pytestmark = pytest.mark.timeout(60)


def _spec(runtime: str, live_snapshots: bool) -> SandboxSpec:
    return SandboxSpec("sb-1", "p", IMAGE, Limits(pids=50), runtime=runtime, live_snapshots=live_snapshots)


def test_a_keeperless_gvisor_container_idles_like_a_runc_one() -> None:
    options = DockerOptions(instance="i")
    kept = container_spec(_spec(GVISOR, True), options, None)
    assert kept["command"] == KEEPER_COMMAND and KEEP_VAR in kept["environment"]
    assert kept["labels"][LABEL_KEEPER] == "true"
    bare = container_spec(_spec(GVISOR, False), options, None)
    assert bare["command"] == ["sleep", "infinity"] and KEEP_VAR not in bare["environment"]
    assert bare["labels"][LABEL_KEEPER] == "false" and bare["runtime"] == "runsc"
    # The limits stay gVisor's.
    assert bare["ulimits"] == kept["ulimits"] and bare["pids_limit"] == kept["pids_limit"]
    assert LABEL_KEEPER not in container_spec(_spec(RUNC, True), options, None)["labels"]
    assert LABEL_KEEPER in RESERVED_LABELS, "a forged label would change how adoption treats the sandbox"


def test_the_setting_survives_the_store() -> None:
    config = PoolConfig("t/g", IMAGE, 0, 2, Limits(), runtime=GVISOR, live_snapshots="off")
    assert pool_from_json(pool_to_json(config)).live_snapshots == "off"
    # A spec saved before the setting existed reads as it was (keeper on).
    legacy = pool_to_json(PoolConfig("t/g", IMAGE, 0, 2, Limits(), runtime=GVISOR)).replace(
        ', "live_snapshots": ""', ""
    )
    assert "live_snapshots" not in legacy and pool_from_json(legacy).live_snapshots == ""


async def test_defaults_and_refusals_on_the_wire(make_app: MakeApp) -> None:
    app, backend = await live_app(make_app)
    async with AsyncClient(app.address) as client:
        assert (await client.create_pool("g", IMAGE, max_size=2, runtime=GVISOR)).spec.live_snapshots == "on"
        off = await client.create_pool("g-off", IMAGE, max_size=2, runtime=GVISOR, live_snapshots="off")
        assert off.spec.live_snapshots == "off"
        assert (await client.get_pool("g-off")).spec.live_snapshots == "off"
        assert {p.spec.name: p.spec.live_snapshots for p in await client.list_pools()} == {
            "g": "on",
            "g-off": "off",
        }
        assert (await client.create_pool("r", IMAGE, max_size=2)).spec.live_snapshots == "off"
        with pytest.raises(errors.FailedPrecondition, match=r"spec.live_snapshots \"on\".*runtime 'runc'"):
            await client.create_pool("r-on", IMAGE, max_size=2, live_snapshots="on")
        with pytest.raises(errors.InvalidArgument, match="spec.live_snapshots"):
            await client.create_pool("g-bad", IMAGE, max_size=2, runtime=GVISOR, live_snapshots="yes")
        assert {p.spec.name for p in await client.list_pools()} == {"g", "g-off", "r"}
        # What each pool's creates told the backend.
        told = {}
        for pool in ("g", "g-off", "r"):
            async with client.acquire(pool, timeout=5) as sb:
                told[pool] = backend.sandboxes[app.control.get_sandbox(sb.id).handle].spec.live_snapshots
        assert told == {"g": True, "g-off": False, "r": False}


async def test_a_backend_without_live_snapshots_defaults_off_and_refuses_on(make_app: MakeApp) -> None:
    app = await make_app(backend=FakeBackend())
    async with AsyncClient(app.address) as client:
        assert (await client.create_pool("g", IMAGE, max_size=2, runtime=GVISOR)).spec.live_snapshots == "off"
        with pytest.raises(errors.FailedPrecondition, match="FakeBackend backend takes no live snapshots"):
            await client.create_pool("g-on", IMAGE, max_size=2, runtime=GVISOR, live_snapshots="on")


async def test_a_keeperless_pool_refuses_live_snapshots_naming_the_setting(make_app: MakeApp) -> None:
    app, _ = await live_app(make_app)
    async with AsyncClient(app.address) as client:
        await client.create_pool("on", IMAGE, min_ready=1, max_size=4, runtime=GVISOR)
        await client.create_pool("off", IMAGE, min_ready=1, max_size=4, runtime=GVISOR, live_snapshots="off")
        async with client.acquire("off", timeout=5) as sb:
            refused = r"pool 'off' has spec.live_snapshots \"off\""
            with pytest.raises(errors.FailedPrecondition, match=refused):
                await sb.snapshot(live=True)
            # Freezing needs no keeper; a file snapshot neither.
            assert (await sb.pause()).paused
            assert not (await sb.resume()).paused
            assert (await sb.snapshot()).id
        async with client.acquire("on", timeout=5) as sb:
            snap = await sb.snapshot(live=True)
        with pytest.raises(errors.FailedPrecondition, match=r"into pool 'off'.*spec.live_snapshots \"off\""):
            await client.restore(snap.id, pool="off", timeout=5)
        assert not [s for s in await client.list_sandboxes("off") if s.state == 3], "nothing stays leased"
        restored = await client.restore(snap.id, timeout=5)
        await restored.release()
