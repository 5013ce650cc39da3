"""Per-pool isolation runtimes: the pool spec, its checks, the backends' specs."""

from __future__ import annotations

import pytest

from sandboxd.app import App
from sandboxd.backends.base import GVISOR, RUNC, Limits, SandboxSpec
from sandboxd.backends.docker.containerspec import DockerOptions, container_spec, engine_pids
from sandboxd.backends.docker.gvisor import parse_statfs
from sandboxd.backends.fake import FakeBackend
from sandboxd.backends.gvisor_pids import refused_fork
from sandboxd.backends.kubernetes.podspec import PodOptions, build_pod
from sandboxd.client import AsyncClient
from sandboxd.core.control import AcquireRequest
from sandboxd.core.pools import PoolConfig
from sandboxd.core.state import pool_from_json, pool_to_json
from sandboxd.errors import FailedPrecondition
from sandboxd.settings import load_settings
from tests.unit.conftest import IMAGE, Harness, MakeApp

pytestmark = pytest.mark.timeout(30)

LIMITS = Limits(memory_bytes=64 << 20, cpu_millis=500, pids=100, disk_bytes=16 << 20, max_files=500)


def _spec(runtime: str) -> SandboxSpec:
    return SandboxSpec("sb-1", "p", IMAGE, LIMITS, runtime=runtime)


async def test_a_gvisor_pool_keeps_its_runtime_and_drops_the_default_file_limit(h: Harness) -> None:
    pool = await h.control.create_pool(PoolConfig("g", IMAGE, 0, 2, Limits(), runtime=GVISOR))
    assert pool.config.runtime == GVISOR
    assert pool.config.limits.max_files == 0, "gVisor does not enforce a file-count limit"
    assert pool.config.limits.pids == h.settings.limits.pids
    runc = await h.control.create_pool(PoolConfig("r", IMAGE, 0, 2, Limits()))
    assert runc.config.runtime == RUNC and runc.config.limits.max_files == h.settings.limits.max_files


@pytest.mark.parametrize(
    ("runtime", "limits", "unavailable", "message"),
    [
        ("kata", Limits(), False, "unknown runtime 'kata'"),
        (GVISOR, Limits(), True, "runtime 'gvisor' is not available"),
        (GVISOR, Limits(max_files=100), False, "does not enforce a file-count limit"),
    ],
    ids=["unknown", "unavailable", "file-limit"],
)
async def test_runtimes_that_cannot_be_had_are_refused_by_name(
    h: Harness, runtime: str, limits: Limits, unavailable: bool, message: str
) -> None:
    if unavailable:
        h.backend.runtimes_available = frozenset({RUNC})
    with pytest.raises(FailedPrecondition, match=message):
        await h.control.create_pool(PoolConfig("x", IMAGE, 0, 2, limits, runtime=runtime))
    assert not h.control.list_pools()


async def test_a_gvisor_pool_refuses_per_acquire_pids(h: Harness) -> None:
    await h.control.create_pool(PoolConfig("g", IMAGE, 1, 2, Limits(), runtime=GVISOR))
    with pytest.raises(FailedPrecondition, match="fixes the pids limit"):
        await h.control.acquire(AcquireRequest("g", limits=Limits(pids=16), timeout=5))


async def test_the_runtime_survives_the_store() -> None:
    config = PoolConfig("t/g", IMAGE, 0, 2, LIMITS, runtime=GVISOR)
    assert pool_from_json(pool_to_json(config)).runtime == GVISOR


async def test_the_runtime_is_on_the_wire_and_in_preflight(make_app: MakeApp) -> None:
    backend = FakeBackend()
    app: App = await make_app(backend=backend)
    async with AsyncClient(app.address) as client:
        pool = await client.create_pool("g", IMAGE, max_size=2, runtime=GVISOR)
        assert pool.spec.runtime == GVISOR
        assert (await client.get_pool("g")).spec.runtime == GVISOR
        assert (await client.create_pool("r", IMAGE, max_size=2)).spec.runtime == RUNC
        report = await client.preflight(concurrent=1, image=IMAGE, runtime="kata")
        assert not report.ok and report.problems[0].kind == 8 and "kata" in report.problems[0].message
        backend.runtimes_available = frozenset({RUNC})
        report = await client.preflight(concurrent=1, image=IMAGE, runtime=GVISOR)
        assert [p.kind for p in report.problems] == [8] and "not available" in report.problems[0].message
        assert (await client.preflight(concurrent=1, image=IMAGE)).ok


def test_docker_spec_of_a_gvisor_sandbox() -> None:
    options = DockerOptions(instance="i", runtime="crun")
    runc = container_spec(_spec(RUNC), options, None)
    assert runc["runtime"] == "crun" and runc["pids_limit"] == 100 and "ulimits" not in runc
    gvisor = container_spec(_spec(GVISOR), options, None)
    assert gvisor["runtime"] == "runsc"
    # gVisor's own threads count on the host: room there, the limit inside.
    assert gvisor["pids_limit"] == engine_pids(GVISOR, 100) > 2 * 100
    (nproc,) = gvisor["ulimits"]
    assert (nproc["Name"], nproc["Soft"], nproc["Hard"]) == ("nproc", 100, 100)
    assert gvisor["labels"]["sandboxd.runtime"] == GVISOR
    assert engine_pids(RUNC, 100) == 100


def test_pod_spec_names_the_gvisor_runtime_class() -> None:
    opts = PodOptions(namespace="ns", instance="i", runtime_class="kata")
    assert build_pod(_spec(GVISOR), opts)["spec"]["runtimeClassName"] == "gvisor"
    assert build_pod(_spec(RUNC), opts)["spec"]["runtimeClassName"] == "kata"
    assert "runtimeClassName" not in build_pod(_spec(RUNC), PodOptions(namespace="ns", instance="i"))["spec"]


def test_settings_name_the_engines_gvisor_runtime() -> None:
    s = load_settings(
        None, {"backend.gvisor_runtime": "gvisor-systrap", "presets": [{"name": "p", "image": IMAGE}]}
    )
    assert s.backend.gvisor_runtime == "gvisor-systrap"  # type: ignore[union-attr]
    assert s.presets[0].runtime == RUNC
    k = load_settings(None, {"backend.kind": "kubernetes", "backend.gvisor_runtime_class": "runsc"})
    assert k.backend.gvisor_runtime_class == "runsc"  # type: ignore[union-attr]


def test_limits_are_named_from_inside_a_gvisor_sandbox() -> None:
    assert refused_fork(b"bash: fork: retry: Resource temporarily unavailable\n")
    assert refused_fork(b"RuntimeError: can't start new thread\n")
    assert not refused_fork(b"No space left on device\n")
    text = "/workspace 4096 4096 0 3085448 3085000\n/tmp 4096 16384 12000 99 90\nstat: cannot read\n"
    assert parse_statfs(text) == {
        "/workspace": (4096 * 4096, 0, 3085448, 3085000),
        "/tmp": (16384 * 4096, 12000 * 4096, 99, 90),
    }
