"""gVisor pools with live_snapshots off on the real engine and runsc: their
sandboxes start without the keeper and relay (the container idles like a
runc one, every shell a plain `runsc exec` of the control plane's), sessions
and limits work as in any gVisor sandbox, a live snapshot of one is refused
naming the setting, and a restarted server adopts one as keeper-less."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.backends.base import GVISOR, LABEL_SANDBOX, ExecResult, ExecSpec
from sandboxd.backends.docker.containers import LABEL_KEEPER
from sandboxd.backends.docker.keeper import KEEP_FIFO, RELAY_VAR
from sandboxd.client import AsyncClient
from tests.integration.conftest import NO_GVISOR, gvisor_registered, make_settings, running_app
from tests.integration.test_runsc_exec_docker import _runsc_execs

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

# Every process of the sandbox whose environment names a relay or a kept shell.
KEPT_PROCESSES = (
    "for d in /proc/[0-9]*; do tr '\\0' '\\n' < $d/environ 2>/dev/null | "
    f"grep -qE '^({RELAY_VAR}|SANDBOXD_KEPT)=' && echo ${{d#/proc/}}; done; true"
)


@pytest.fixture
async def gvisor(tmp_path: Path, engine: docker.DockerClient, image: str) -> AsyncIterator[AsyncClient]:
    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    async with running_app(make_settings(tmp_path), engine) as app, AsyncClient(app.address) as client:
        await client.create_pool(
            "bare", image, min_ready=1, max_size=2, runtime=GVISOR, live_snapshots="off", limits={"pids": 64}
        )
        yield client
        await client.delete_pool("bare", force=True)


async def _container(engine: docker.DockerClient, sandbox_id: str) -> docker.models.containers.Container:
    (container,) = await asyncio.to_thread(
        engine.containers.list, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}
    )
    return container


async def test_a_keeperless_sandbox_runs_no_keeper_and_its_sessions_work(
    gvisor: AsyncClient, engine: docker.DockerClient
) -> None:
    assert (await gvisor.get_pool("bare")).spec.live_snapshots == "off"
    async with gvisor.acquire("bare") as sb:
        container = await _container(engine, sb.id)
        assert container.attrs["HostConfig"]["Runtime"] == "runsc"
        assert container.attrs["Config"]["Cmd"] == ["sleep", "infinity"]
        assert container.labels[LABEL_KEEPER] == "false"
        r = await sb.exec(f"test -e {KEEP_FIFO} || echo no-fifo; echo ${{SANDBOXD_KEEP:-unset}}")
        assert r.text == "no-fifo\nunset\n", r
        r = await sb.exec("cd /tmp && export K=v; echo out; echo err >&2; sh -c 'exit 4'", session="s")
        assert (r.exit_code, r.stdout, r.stderr) == (4, b"out\n", b"err\n")
        execs = _runsc_execs(str(container.id))
        assert execs, "the session's shell is a runsc exec of the control plane's"
        assert not any("sandboxd-relay" in e for e in execs), execs
        assert (await sb.exec("pwd; echo $K", session="s")).text == "/tmp\nv\n"
        timed = await sb.exec("sleep 30", session="s", timeout=1)
        assert timed.outcome == "TIMED_OUT", timed
        assert (await sb.exec("pwd", session="s")).text == "/tmp\n", "the shell outlives its command's kill"
        kept = await sb.exec(KEPT_PROCESSES)
        assert kept.ok and kept.text == "", f"relays or kept shells in a keeper-less sandbox: {kept.text}"
        # A fork bomb meets gVisor's RLIMIT_NPROC, is named and killed from the
        # rescue session, and the sandbox's session goes on after it.
        bomb = await sb.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=5)
        assert bomb.outcome == "PIDS_EXHAUSTED", bomb
        assert (await sb.exec("pwd", session="s")).text == "/tmp\n"


async def test_live_snapshots_of_a_keeperless_sandbox_are_refused_naming_the_setting(
    gvisor: AsyncClient, image: str
) -> None:
    async with gvisor.acquire("bare") as sb:
        assert (await sb.exec("echo kept > notes", session="s")).ok
        with pytest.raises(errors.FailedPrecondition, match=r"spec.live_snapshots \"off\""):
            await sb.snapshot(live=True, session="s")
        with pytest.raises(errors.FailedPrecondition, match="live_snapshots"):
            await gvisor.keep(sb.id, "sleep 100")
        # A freeze needs no keeper, nor does a file snapshot; the session goes on.
        assert (await sb.pause()).paused
        assert not (await sb.resume()).paused
        assert (await sb.snapshot()).id
        assert (await sb.exec("cat notes", session="s")).text == "kept\n"
    await gvisor.create_pool("kept", image, min_ready=1, max_size=2, runtime=GVISOR)
    try:
        async with gvisor.acquire("kept") as sb:
            snap = await sb.snapshot(live=True)
        with pytest.raises(errors.FailedPrecondition, match=r"into pool 'bare'.*spec.live_snapshots"):
            await gvisor.restore(snap.id, pool="bare", timeout=60)
        assert not [s for s in await gvisor.list_sandboxes("bare") if s.state == 3], "nothing stays leased"
    finally:
        await gvisor.delete_pool("kept", force=True)


async def test_a_restarted_server_adopts_a_keeperless_sandbox_as_such(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    settings = make_settings(tmp_path)
    async with running_app(settings, engine) as first, AsyncClient(first.address) as client:
        await client.create_pool("bare", image, min_ready=1, max_size=1, runtime=GVISOR, live_snapshots="off")
        lease = await client.lease("bare", timeout=120)
        (sb,) = lease.sandboxes
        assert (await sb.exec("cd /tmp; export K=before", session="s")).ok
        # The backend of a second control plane sees only the container, as after a restart.
        fresh = type(first.control.backend)(first.control.backend._options)  # type: ignore[attr-defined]
        try:
            (handle,) = first.control.registry.handles([sb.id])
            out = b""
            async for event in fresh.exec(handle, ExecSpec(shell="echo $SANDBOXD_KEEP; pwd", session="t")):
                if isinstance(event, ExecResult):
                    assert event.exit_code == 0, event
                elif event.stream == 1:
                    out += event.data
            assert out == b"\n/workspace\n"
            with pytest.raises(errors.FailedPrecondition, match="without the keeper"):
                await fresh.checkpoint(handle, tmp_path / "image")
            assert not (tmp_path / "image").exists()
        finally:
            await fresh.close()
        await lease.release()
        await client.delete_pool("bare", force=True)
