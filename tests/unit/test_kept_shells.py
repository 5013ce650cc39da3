"""Kept shells (sandboxd.backends.docker.keeper) with the host's own bash
standing in for a sandbox: the keeper on a FIFO in a scratch directory, and
relays started the way the backend starts them. A relay killed whole (as a
restore kills every exec's process) leaves its shell, state and jobs
running, and a new relay attaches to it; the Docker suite does the same
across a real gVisor checkpoint and restore."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxd.backends.docker.keeper import (
    AFTER_RESTORE,
    KEPT_VAR,
    RELAY_VAR,
    keeper_command,
    parse_session_keys,
    relay_argv,
    session_key,
)
from sandboxd.backends.shell import reaper_argv
from tests.unit.conftest import wait_for

pytestmark = pytest.mark.timeout(30)

SHELL = ["bash", "--noprofile", "--norc"]


class Sandbox:
    """A scratch directory with a keeper running on its FIFO."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.workspace = root / "workspace"
        self.fifo = root / "keep"
        self.shells = root / ".sandboxd-shells"
        self.env = {**os.environ, "SANDBOXD_KEEP": str(self.fifo)}
        self.keeper: asyncio.subprocess.Process | None = None
        self.relays: list[Relay] = []

    async def start(self) -> None:
        self.workspace.mkdir()
        self.keeper = await asyncio.create_subprocess_exec(
            *keeper_command(str(self.fifo), str(self.workspace)), env=self.env, start_new_session=True
        )
        await wait_for(self.fifo.exists, what="the keeper's FIFO")

    async def relay(self, key: str, *, attach: bool = False, env: dict[str, str] | None = None) -> Relay:
        shell = reaper_argv(SHELL)
        tag = {"SANDBOXD_SESSION": key}
        argv = relay_argv(key, SHELL, in_place=shell, env=tag, cwd=str(self.workspace), attach=attach)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env={**(self.env if env is None else env), RELAY_VAR: "1"},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        relay = Relay(proc)
        self.relays.append(relay)
        relay.pid = int(await relay.line())
        return relay

    def files(self, key: str) -> list[Path]:
        """What the kept shell ``key`` has in the shells' directory."""
        return list(self.shells.glob(f"{key}.*"))

    async def kill_everything(self) -> None:
        """Every process the keeper and the relays started (their sessions
        are their own)."""
        for relay in self.relays:
            relay.cut()
            await relay.proc.wait()
        for entry in self.shells.glob("*.pid"):
            with_pgid(int(entry.read_text()), signal.SIGKILL)
        if self.keeper is not None:
            with_pgid(self.keeper.pid, signal.SIGKILL)
            await self.keeper.wait()


def with_pgid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(os.getpgid(pid), sig)


class Relay:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = 0

    async def line(self) -> str:
        assert self.proc.stdout is not None
        return (await self.proc.stdout.readline()).decode().rstrip("\n")

    async def say(self, text: str) -> str:
        """Sends a command line; the first line it prints."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.line()

    def cut(self) -> None:
        """Kills the relay and its pumps, as a restore does: nothing of it
        gets to run again."""
        with_pgid(self.proc.pid, signal.SIGKILL)

    async def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return await self.proc.wait()


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Sandbox]:
    box = Sandbox(tmp_path)
    await box.start()
    try:
        yield box
    finally:
        await box.kill_everything()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited: its parent has yet to reap it.
    return not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].startswith(" Z")


async def test_a_shell_outlives_its_relay_and_a_new_relay_attaches_to_it(sandbox: Sandbox) -> None:
    key = session_key("agent")
    first = await sandbox.relay(key)
    job = int(await first.say("X=42; f() { echo fn $X $1; }; cd /; sleep 300 >/dev/null 2>&1 & echo $!"))
    first.cut()
    await first.proc.wait()
    assert alive(first.pid) and alive(job)

    second = await sandbox.relay(key, attach=True)
    assert second.pid == first.pid, "the same shell, its pid printed as REAPER would"
    assert await second.say("f again; pwd") == "fn 42 again"
    assert await second.line() == "/"
    assert await second.say(f"grep -c {KEPT_VAR}={key} /proc/$$/environ") == "1"
    assert await second.say("exit 7") == ""
    assert await second.proc.wait() == 7
    assert not sandbox.files(key)
    assert alive(job), "the job goes on without its shell"
    os.kill(job, signal.SIGKILL)


async def test_closing_the_stream_ends_the_shell_once_its_command_has_ended(sandbox: Sandbox) -> None:
    idle = await sandbox.relay("r-idle")
    assert await idle.close() == 0
    await wait_for(lambda: not alive(idle.pid), what="the idle shell to exit")
    assert not sandbox.files("r-idle")

    busy = await sandbox.relay("r-busy")
    assert busy.proc.stdin is not None
    busy.proc.stdin.write(b"sleep 0.5; echo done\n")
    assert await busy.close() == 0
    assert await busy.line() == "done", "the command in progress ran to its end"
    assert not alive(busy.pid)


async def test_a_new_shell_replaces_one_a_lost_stream_left_under_its_key(sandbox: Sandbox) -> None:
    lost = await sandbox.relay("s-6c6f7374")
    assert await lost.say("echo $$") == str(lost.pid)
    lost.cut()
    fresh = await sandbox.relay("s-6c6f7374")
    assert fresh.pid != lost.pid
    await wait_for(lambda: not alive(lost.pid), what="the lost shell to be killed")
    assert await fresh.say("echo ${X-unset}") == "unset"
    # Asked to attach where nothing runs, a relay starts a shell too.
    other = await sandbox.relay("s-6e6f6e65", attach=True)
    assert await other.say("echo $$") == str(other.pid)


async def test_without_a_keeper_the_shell_runs_in_the_relay_itself(sandbox: Sandbox) -> None:
    env = {k: v for k, v in sandbox.env.items() if k != "SANDBOXD_KEEP"}
    plain = await sandbox.relay("s-706c61696e", env=env)
    assert plain.pid == plain.proc.pid
    assert await plain.say(f"echo ${{{KEPT_VAR}-none}}") == "none"
    assert await plain.close() == 0


async def test_after_a_restore_idle_shells_end_and_sessions_are_named(sandbox: Sandbox) -> None:
    idle = await sandbox.relay("r-0123")
    job = int(await idle.say("sleep 300 >/dev/null 2>&1 & echo $!"))
    agent = await sandbox.relay(session_key("agent.2"))
    idle.cut()
    agent.cut()
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", AFTER_RESTORE, env=sandbox.env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert parse_session_keys(out.decode()) == {"agent.2"}
    await wait_for(lambda: not alive(idle.pid), what="the idle shell to be killed")
    assert alive(agent.pid) and alive(job)
    assert not sandbox.files("r-0123")
    os.kill(job, signal.SIGKILL)


def test_session_keys_name_their_sessions() -> None:
    names = {"a", "agent-1.x_y", "Z" * 64}
    assert parse_session_keys("\n".join(session_key(n) for n in names) + "\nr-ff\ns-zz\n") == names
