"""Session shells of gVisor sandboxes are started by ``runsc exec`` from the
host, on pipes the control plane holds (sandboxd.backends.docker.runsc_exec),
not through the engine: what a command sees is unchanged, a session keeps
its state across a live snapshot of its sandbox, a timeout still kills only
the command, and where ``runsc exec`` cannot start a shell the engine's
stream serves instead."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd.backends.base import GVISOR
from sandboxd.backends.docker.containers import LABEL_SANDBOX
from sandboxd.backends.docker.runsc_exec import RunscExec
from sandboxd.client import AsyncClient
from tests.integration.conftest import NO_GVISOR, gvisor_registered, make_settings, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]


@pytest.fixture
async def gvisor(tmp_path: Path, engine: docker.DockerClient, image: str) -> AsyncIterator[AsyncClient]:
    if not gvisor_registered(engine):
        pytest.skip(NO_GVISOR)
    async with running_app(make_settings(tmp_path), engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("gv", image, min_ready=1, max_size=2, runtime=GVISOR)
        yield client
        await client.delete_pool("gv", force=True)


def _runsc_execs(container_id: str) -> list[str]:
    """Command lines of the `runsc exec` processes into the container that
    the control plane (in this process) started; the engine's shim runs
    `runsc exec` for its own execs too, as a child of its own."""
    found = []
    for pid in filter(str.isdigit, (p.name for p in Path("/proc").iterdir())):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"exec" in args and container_id.encode() in args:
            found.append(" ".join(a.decode(errors="replace") for a in args))
    return found


async def _container_id(engine: docker.DockerClient, sandbox_id: str) -> str:
    found = await asyncio.to_thread(
        engine.containers.list, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}
    )
    (container,) = found
    return str(container.id)


async def test_sessions_run_by_runsc_exec_as_through_the_engine(
    gvisor: AsyncClient, engine: docker.DockerClient
) -> None:
    async with gvisor.acquire("gv") as sb:
        r = await sb.exec("cd /tmp && export K=v; echo out; echo err >&2; sh -c 'exit 4'", session="s")
        assert (r.exit_code, r.stdout, r.stderr) == (4, b"out\n", b"err\n")
        assert _runsc_execs(await _container_id(engine, sb.id)), "the session's shell is a runsc exec"
        r = await sb.exec("pwd; echo $K; id -u; cat", session="s", stdin=b"in\x00put")
        uid = (await sb.exec("id -u")).stdout
        assert r.stdout == b"/tmp\nv\n" + uid + b"in\x00put", "the sandbox's user, as one-shot commands"
        timed = await sb.exec("sleep 30", session="s", timeout=1)
        assert timed.outcome == "TIMED_OUT", timed
        assert (await sb.exec("pwd", session="s")).text == "/tmp\n", "the shell outlives its command's kill"

        # A live snapshot does not wait on the shells' pipes, and they go on after it.
        snap = await gvisor.snapshot(sb.id, session="s", live=True)
        assert snap.id
        assert (await sb.exec("pwd; echo $K", session="s")).text == "/tmp\nv\n"


async def test_the_engine_stream_where_runsc_exec_cannot_start_a_shell(
    gvisor: AsyncClient, engine: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a host where the runtime's binary cannot run: it exits at once, printing nothing.
    monkeypatch.setattr(
        RunscExec, "argv", lambda self, argv, **_: ["/bin/sh", "-c", "echo runsc: refused >&2; exit 1"]
    )
    async with gvisor.acquire("gv") as sb:
        r = await sb.exec("cd /tmp; echo fine", session="s2")
        assert r.ok and r.text == "fine\n", r
        assert (await sb.exec("pwd", session="s2")).text == "/tmp\n"
        assert not _runsc_execs(await _container_id(engine, sb.id))
