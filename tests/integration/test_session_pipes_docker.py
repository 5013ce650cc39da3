"""Session shells of runc sandboxes talk over FIFOs in the sandbox's inbox
(sandboxd.backends.docker.pipes), not through the engine: what that changes
must not be visible to a command, nothing in the sandbox can tamper with the
FIFOs, and where they cannot be used sessions still work through the engine."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from sandboxd.backends.docker.pipes import HostPipes
from sandboxd.client import AsyncClient
from tests.integration.conftest import make_settings, poll, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


async def refilled(client: AsyncClient) -> None:
    """Waits for the pool to be back at its floor: a new sandbox's shells
    hold descriptors too, which a count of ours must not take for a leak."""

    async def quiet() -> bool:
        status = (await client.get_pool("pp")).status
        return status.ready >= 1 and status.creating == 0 and status.releasing == 0

    await poll(quiet, timeout=60, what="the pool to refill")


# The shell's stdout and stderr (a command's stdin is its own).
_STDIO = "for n in 1 2; do readlink /proc/$$/fd/$n; done"


@pytest.fixture
async def piped(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> AsyncIterator[tuple[AsyncClient, Path]]:
    settings = make_settings(tmp_path)
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("pp", image, min_ready=1, max_size=4)
        yield client, Path(settings.state_dir) / "inbox"
        await client.delete_pool("pp", force=True)


async def test_session_stdio_is_on_inbox_fifos_and_names_are_gone(piped: tuple[AsyncClient, Path]) -> None:
    client, inboxes = piped
    async with client.acquire("pp") as sb:
        links = (await sb.exec(_STDIO, session="s")).text.split()
        assert len(links) == 4 and all(".sandboxd/inbox/.pipe-" in link for link in links[::2]), links
        assert not [n for n in os.listdir(inboxes / sb.id) if n.startswith(".pipe-")]
        # What a command sees is unchanged: both streams, stdin, exit status, state.
        r = await sb.exec("cd /tmp && export K=v; echo out; echo err >&2; sh -c 'exit 4'", session="s")
        assert (r.exit_code, r.stdout, r.stderr) == (4, b"out\n", b"err\n")
        r = await sb.exec("pwd; echo $K; cat", session="s", stdin=b"in\x00put")
        assert r.stdout == b"/tmp\nv\nin\x00put"
        big = await sb.exec("head -c 3000000 /dev/zero | tr '\\0' y", session="s", output_limit=4 << 20)
        assert big.ok and big.stdout == b"y" * 3_000_000


async def test_the_sandbox_cannot_touch_its_fifos(piped: tuple[AsyncClient, Path]) -> None:
    client, _ = piped
    async with client.acquire("pp") as sb:
        await sb.exec("true", session="s")
        for attack in (
            "touch /.sandboxd/inbox/.pipe-w.0",
            "mkfifo /.sandboxd/inbox/.pipe-x.1",
            "ln -s /etc/passwd /.sandboxd/inbox/.pipe-y.1",
        ):
            for user in ("", "root"):
                r = await sb.exec(attack, user=user)
                assert r.exit_code != 0 and b"Read-only file system" in r.stderr, (attack, user, r)
        # A command that closes or redirects the shell's own descriptors hurts only its session.
        r = await sb.exec("exec 1>&- 2>&-", session="s")
        assert r.outcome in ("EXITED", "SANDBOX_LOST") or r.exit_code is not None
        assert (await sb.exec("echo fine", session="s")).text == "fine\n"
        assert (await sb.exec("echo other", session="t")).text == "other\n"


async def test_sessions_use_the_engine_where_fifos_cannot_be_made(piped: tuple[AsyncClient, Path]) -> None:
    client, inboxes = piped
    async with client.acquire("pp") as sb:
        assert (await sb.exec("true", session="first")).ok  # takes the shell made with the sandbox
        # The host directory gone (a full or foreign filesystem reads the same).
        shutil.rmtree(inboxes / sb.id)
        assert (await sb.exec("echo $((6*7))", session="fresh")).text == "42\n"
        links = (await sb.exec(_STDIO, session="fresh")).text
        assert ".pipe-" not in links and "pipe:[" in links, links


async def test_engine_stream_when_pipes_are_off(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    settings = make_settings(tmp_path, **{"backend.session_pipes": False})
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("np", image, min_ready=1, max_size=2)
        async with client.acquire("np") as sb:
            links = (await sb.exec(_STDIO, session="s")).text
            assert ".pipe-" not in links and "pipe:[" in links, links
            r = await sb.exec("echo a; echo b >&2; exit 2", session="s")
            assert (r.exit_code, r.stdout, r.stderr) == (2, b"a\n", b"b\n")
        await client.delete_pool("np", force=True)


async def test_sessions_that_end_leave_no_descriptor_behind(piped: tuple[AsyncClient, Path]) -> None:
    client, _ = piped
    async with client.acquire("pp") as sb:
        assert (await sb.exec("true", session="warm")).ok

        def open_fds() -> int:
            return len(os.listdir("/proc/self/fd"))  # the server runs in this process

        await refilled(client)
        before = open_fds()
        for i in range(20):
            # Each opens a shell on three fresh FIFOs; `exit` ends it, and the session with it.
            r = await sb.exec("exit 7", session=f"s{i}")
            assert (r.outcome, r.exit_code) == ("EXITED", 7), r
        # 20 sessions held 60 FIFO ends and 20 cells; a few descriptors of other work may come and go.
        assert open_fds() - before < 10


async def test_a_sandbox_that_cannot_open_the_fifos_gets_the_engine_stream(
    piped: tuple[AsyncClient, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, inboxes = piped
    async with client.acquire("pp") as sb:
        assert (await sb.exec("true", session="first")).ok  # takes the shell made with the sandbox

        # The shell is pointed at FIFOs it cannot open (as a sandbox whose inbox is not mounted would be).
        real = HostPipes.argv
        refused = 0
        real_make = HostPipes.make

        def make(self: HostPipes) -> None:
            nonlocal refused
            refused += 1
            real_make(self)

        monkeypatch.setattr(HostPipes, "make", make)
        monkeypatch.setattr(
            HostPipes,
            "argv",
            lambda self, argv: [*real(self, argv)[:4], "/nowhere/0", "/nowhere/1", "/nowhere/2", *argv],
        )
        await refilled(client)
        before = len(os.listdir("/proc/self/fd"))
        for name in ("a", "b", "c"):
            r = await sb.exec("echo $((6*7))", session=name)
            assert (r.exit_code, r.text) == (0, "42\n"), r
            links = (await sb.exec(_STDIO, session=name)).text
            assert ".pipe-" not in links and "pipe:[" in links, links
        assert not [n for n in os.listdir(inboxes / sb.id) if n.startswith(".pipe-")], (
            "refused FIFOs are removed"
        )
        # Tried once per sandbox: the later sessions go to the engine at once.
        assert refused == 1
        # Three engine streams are open now; the refused FIFOs' ends are not.
        assert len(os.listdir("/proc/self/fd")) - before < 8
        ps = (await sb.exec("ps -eo args")).text
        assert "/nowhere/" not in ps, "the refused shell does not linger"
