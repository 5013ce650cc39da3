"""Hostile workloads against the real engine: each is contained, named with a
typed outcome, leaves the control plane responsive, and leaks nothing.

Each case runs under runc and gVisor. ``SANDBOXD_TEST_BACKEND_RUNTIMES``
(engine runtime names, comma-separated, e.g. ``crun``) adds a case per name
in which runc pools run under that engine runtime (``[backend] runtime``),
its id the name (``-k crun``); ``python -m benchmarks.runtimes`` sets it for
crun. Unset (CI), the suite is runc and gVisor only.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd.app import App
from sandboxd.backends.base import GVISOR, RUNC, RUNTIMES
from sandboxd.client import AsyncClient, Sandbox
from sandboxd.errors import FailedPrecondition
from tests.integration.conftest import (
    NO_GVISOR,
    gvisor_registered,
    instance_containers,
    make_settings,
    running_app,
)
from tests.probing import while_probing

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

LIMITS = {
    "memory_bytes": 128 << 20,
    "pids": 64,
    "disk_bytes": 16 << 20,
    "max_files": 2000,
    "output_bytes": 1 << 20,
}


BACKEND_RUNTIMES_VAR = "SANDBOXD_TEST_BACKEND_RUNTIMES"
BACKEND_RUNTIMES = tuple(
    name
    for name in os.environ.get(BACKEND_RUNTIMES_VAR, "").replace(",", " ").split()
    if name not in RUNTIMES
)
Under = tuple[str, str | None]
"""(the pools' runtime, the engine runtime runc pools run under: None = the engine default)"""


@pytest.fixture(params=[*RUNTIMES, *BACKEND_RUNTIMES])
def under(request: pytest.FixtureRequest, engine: docker.DockerClient) -> Under:
    """Each runtime in turn, then each engine runtime of BACKEND_RUNTIMES;
    gVisor is skipped where the engine lacks it."""
    name = str(request.param)
    if name in RUNTIMES:
        if name == GVISOR and not gvisor_registered(engine):
            pytest.skip(NO_GVISOR)
        return name, None
    if name not in (engine.info().get("Runtimes") or {}):
        pytest.fail(f"{BACKEND_RUNTIMES_VAR} names {name!r}, which the engine does not have")
    return RUNC, name


@pytest.fixture
def runtime(under: Under) -> str:
    return under[0]


@pytest.fixture
async def app(tmp_path: Path, engine: docker.DockerClient, image: str, under: Under) -> AsyncIterator[App]:
    """conftest's ``app``, with ``[backend] runtime`` set for an engine-runtime case."""
    _, engine_runtime = under
    overrides = {"backend.runtime": engine_runtime} if engine_runtime else {}
    async with running_app(make_settings(tmp_path, **overrides), engine) as app:
        yield app


def limits_of(runtime: str) -> dict[str, int]:
    """LIMITS as a pool of ``runtime`` may set them (gVisor refuses a file-count limit)."""
    return {k: v for k, v in LIMITS.items() if not (runtime == GVISOR and k == "max_files")}


@pytest.fixture
async def hostile_pool(client: AsyncClient, image: str, runtime: str) -> AsyncIterator[str]:
    await client.create_pool(
        "hostile", image, min_ready=2, max_size=4, limits=limits_of(runtime), runtime=runtime
    )
    yield "hostile"
    await client.delete_pool("hostile", force=True)


def assert_responsive(latencies: list[float]) -> None:
    # Generous on purpose (noisy 2-core machines): the point is that the
    # bystander kept being answered, not a latency target.
    assert latencies, "the bystander's commands were answered during the attack"
    assert max(latencies) < 10.0, f"bystander stalled: max {max(latencies):.2f}s"


@pytest.fixture
async def pair(
    client: AsyncClient, hostile_pool: str, app: App, engine: docker.DockerClient, under: Under
) -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    async with client.acquire_group(hostile_pool, n=2, timeout=60) as group:
        assert (await group[1].exec("true", session="probe")).ok
        _, engine_runtime = under
        if engine_runtime:  # the case really runs under it
            boxes = await asyncio.to_thread(instance_containers, engine, app.settings.instance_id)
            used = {b.attrs["HostConfig"].get("Runtime") for b in boxes}
            assert boxes and used == {engine_runtime}, f"sandboxes run under {used}"
        yield group[0], group[1]


async def test_fork_bomb_is_contained(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, bystander = pair
    assert (await victim.exec("cd /tmp && STEP=7", session="agent")).ok
    before = await victim.exec("ps -e -o pid=")
    attack = victim.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=5)
    result, latencies = await while_probing(bystander, attack)
    assert result.outcome == "PIDS_EXHAUSTED", result
    assert_responsive(latencies)
    after = await victim.exec("ps -e -o pid=,args=")
    assert before.ok and after.ok
    new = [line for line in after.text.splitlines() if line.split()[0] not in before.text.split()]
    # What remains new is the listing itself (its shell and ps, and the
    # shells a fresh session needs).
    bombs = [line for line in new if "bomb" in line]
    assert len(new) < 8 and not bombs, f"the bomb's processes remain: {new}"
    # A session's shell outlives a command's kill, with its state.
    assert (await victim.exec('echo "$PWD $STEP"', session="agent")).stdout == b"/tmp 7\n"


async def test_memory_hog_is_oom_killed(pair: tuple[Sandbox, Sandbox], runtime: str) -> None:
    victim, bystander = pair
    attack = victim.exec(["python3", "-c", "x = bytearray(512 << 20); print(len(x))"], timeout=60)
    result, latencies = await while_probing(bystander, attack)
    assert result.outcome == "OOM_KILLED", result
    assert_responsive(latencies)
    if runtime == GVISOR:
        # gVisor has no per-process OOM killer: the whole sandbox stops.
        assert "whole sandbox" in result.detail
        assert (await bystander.exec("echo still here")).text == "still here\n"
        return
    assert (await victim.exec("echo still here")).text == "still here\n"


async def test_file_explosion_stops_at_the_file_limit(pair: tuple[Sandbox, Sandbox], runtime: str) -> None:
    victim, bystander = pair
    script = "import os\nfor i in range(1_000_000):\n    open(f'f{i}', 'w').close()\n"
    attack = victim.exec(["python3", "-c", script], timeout=60)
    result, latencies = await while_probing(bystander, attack)
    if runtime == GVISOR:
        # No file-count limit there: each file lives in the sandbox's memory,
        # so the memory limit stops the explosion (and the sandbox).
        assert result.outcome == "OOM_KILLED", result
        assert_responsive(latencies)
        return
    assert result.outcome == "FILE_LIMIT", result
    assert_responsive(latencies)
    usage = await victim.client.usage(victim.id)
    assert usage.files_limit == LIMITS["max_files"]
    assert LIMITS["max_files"] - 10 <= usage.files <= LIMITS["max_files"]


@pytest.mark.parametrize(
    ("attack", "outcome"),
    [
        ("import os\nfor i in range(1_000_000):\n    open(f'/dev/shm/f{i}', 'w').close()\n", "FILE_LIMIT"),
        ("with open('/dev/shm/big', 'wb') as f:\n    for _ in range(100):\n        f.write(bytes(1 << 20))\n",
         "DISK_FULL"),
    ],
    ids=["files", "bytes"],
)  # fmt: skip
async def test_dev_shm_is_limited_like_the_workspace(
    pair: tuple[Sandbox, Sandbox], attack: str, outcome: str, runtime: str
) -> None:
    # /dev/shm is writable (POSIX semaphores, shared memory) but bounded in
    # files and bytes: a loop there ends at its limit, not at the memory cgroup.
    victim, bystander = pair
    result, latencies = await while_probing(bystander, victim.exec(["python3", "-c", attack], timeout=60))
    if runtime == GVISOR and outcome == "FILE_LIMIT":
        # As in the workspace: the memory limit bounds the file count there.
        assert result.outcome == "OOM_KILLED", result
        assert latencies, "the bystander's commands were answered during the attack"
        return
    assert result.outcome == outcome, result
    assert "/dev/shm" in result.detail, result
    assert latencies, "the bystander's commands were answered during the attack"
    count = await victim.exec("ls -A /dev/shm | wc -l")
    assert count.ok and 1 <= int(count.text) <= 4096
    assert (await victim.exec("echo still here")).text == "still here\n"


async def test_a_full_mnt_is_disk_full_naming_it(pair: tuple[Sandbox, Sandbox]) -> None:
    # /mnt is scratch outside the workspace where programs expect to write
    # (SandboxFusion's own tests do): a fill ends at its bound and is named
    # like a full workspace, not left a plain failure.
    victim, bystander = pair
    attack = "with open('/mnt/big', 'wb') as f:\n    for _ in range(100):\n        f.write(bytes(1 << 20))\n"
    result, latencies = await while_probing(bystander, victim.exec(["python3", "-c", attack], timeout=60))
    assert result.outcome == "DISK_FULL" and "/mnt is full" in result.detail, result
    assert latencies, "the bystander's commands were answered during the attack"
    assert (await victim.exec("rm /mnt/big && echo still here")).text == "still here\n"
    # The bystander's /mnt is its own.
    assert (await bystander.exec("ls -A /mnt | wc -l")).text == "0\n"


async def test_disk_fill_is_disk_full(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, bystander = pair
    attack = victim.exec("dd if=/dev/zero of=big bs=1M count=100", timeout=60)
    result, latencies = await while_probing(bystander, attack)
    assert result.outcome == "DISK_FULL", result
    assert_responsive(latencies)
    usage = await victim.client.usage(victim.id)
    assert usage.disk_bytes >= LIMITS["disk_bytes"] - (1 << 20)


async def test_endless_output_is_truncated(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, bystander = pair
    attack = victim.exec("yes hostile", timeout=60, session="s")
    result, latencies = await while_probing(bystander, attack)
    assert result.outcome == "OUTPUT_TRUNCATED" and len(result.stdout) == LIMITS["output_bytes"]
    assert_responsive(latencies)


async def test_sigterm_ignorer_and_background_sleeper_die_at_timeout(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, bystander = pair
    attack = victim.exec("trap '' TERM INT; (sleep 600 &); sleep 600", timeout=1)
    result, latencies = await while_probing(bystander, attack)
    assert result.outcome == "TIMED_OUT", result
    assert_responsive(latencies)
    left = await victim.exec("ps -eo args --no-headers | grep -c '^sleep 600' || true")
    assert left.text.strip() == "0"


async def test_no_network(pair: tuple[Sandbox, Sandbox]) -> None:
    victim, _ = pair
    code = (
        "import socket\n"
        "for host, port in [('127.0.0.1', 50051), ('10.0.0.1', 80), ('1.1.1.1', 53)]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), 2)\n"
        "        print('connected', host)\n"
        "    except OSError as e:\n"
        "        print('refused', host, e.errno)\n"
    )
    r = await victim.exec(["python3", "-c", code], timeout=30)
    assert r.ok and "connected" not in r.text
    ifaces = await victim.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1")
    assert ifaces.text.split() == ["lo"], "only loopback inside the sandbox"


async def test_usage_reports_memory_and_pids(client: AsyncClient, hostile_pool: str) -> None:
    async with client.acquire(hostile_pool) as sb:
        await sb.exec(["python3", "-c", "x = bytearray(40 << 20)"])
        usage = await client.usage(sb.id)
        assert usage.memory_peak_bytes >= 40 << 20
        assert usage.pids >= 1
        assert usage.disk_limit_bytes == LIMITS["disk_bytes"]


async def test_per_acquire_limits_lower_the_pool_limits(
    client: AsyncClient, hostile_pool: str, runtime: str
) -> None:
    if runtime == GVISOR:
        # The pids limit is fixed when a gVisor sandbox starts: refused, named.
        with pytest.raises(FailedPrecondition, match="fixes the pids limit"):
            async with client.acquire(hostile_pool, limits={"pids": 16}):
                pass
        async with client.acquire(hostile_pool, limits={"memory_bytes": 48 << 20}) as sb:
            r = await sb.exec(["python3", "-c", "x = bytearray(80 << 20)"], timeout=30)
            assert r.outcome == "OOM_KILLED", r
        return
    async with client.acquire(hostile_pool, limits={"memory_bytes": 48 << 20, "pids": 16}) as sb:
        r = await sb.exec(["python3", "-c", "x = bytearray(80 << 20)"], timeout=30)
        assert r.outcome == "OOM_KILLED", r
        r = await sb.exec("for i in $(seq 1 40); do sleep 5 & done; wait", timeout=3)
        assert r.outcome == "PIDS_EXHAUSTED", r


async def test_responsiveness_baseline_is_sane(pair: tuple[Sandbox, Sandbox]) -> None:
    # Documents the normal round trip the assertions above are generous against.
    _, bystander = pair
    samples = []
    for _ in range(20):
        t0 = time.perf_counter()
        assert (await bystander.exec("true", session="probe")).ok
        samples.append(time.perf_counter() - t0)
    assert statistics.median(samples) < 1.0
