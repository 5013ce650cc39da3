"""Containment of a command's processes, on the real engine: whatever a
command does to leave its tree (setsid, a cleared environment, a double fork
that execs with an empty environment), a time-out, an output cap or a client
that vanishes ends all of it, in one-shot commands and sessions (which keep
their cwd and environment), without touching another exec of the same
sandbox. A sandbox that dies under a command makes it SANDBOX_LOST, and no
line of sandboxd's own shells shows up in a command's stderr.

Each test runs twice: with the control plane on the engine's host (a cgroup
per exec stream) and as through a remote engine (no host view: subreaper and
kill by tag and parentage from inside). A bystander sandbox keeps answering
throughout, and nothing is left behind (containers, cgroups)."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar, cast

import docker
import pytest

from sandboxd.app import App
from sandboxd.backends.base import LABEL_SANDBOX
from sandboxd.backends.docker.cgroups import CGROUP_ROOT, ContainerProbe
from sandboxd.client import AsyncClient, ExecResult, Sandbox
from tests.integration.conftest import make_settings, poll, running_app
from tests.probing import while_probing

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

T = TypeVar("T")

LIMITS = {"memory_bytes": 128 << 20, "pids": 128}

# Four ways out of a command's process tree, each sleeper named by its argv;
# the command goes on only once all four run, then says so.
DETACH = (
    "env -i setsid sleep 1001 & disown; "
    "(unset SANDBOXD_EXEC SANDBOXD_SESSION; setsid sleep 1002 &); "
    "(env -i sh -c 'sleep 1003 &' &); "
    "python3 -c 'import os\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    '        os.execve("/bin/sleep", ["sleep", "1004"], {})\n'
    "    os._exit(0)\n"
    "os.wait()'; "
    "until [ \"$(pgrep -c -x -f 'sleep 100[1-4]')\" = 4 ]; do sleep 0.05; done; "
    "echo started; "
)
DETACHED = r"^sleep 100[0-4]$"
# What sandboxd's own shells would print about a command: bash's job
# reports ("bash: line 3: 24 Killed ( cd -- ... )") and the wrappers' words.
WRAPPER_LINE = re.compile(rb"line \d+:|cd --|exec bash|wait \$!|SANDBOXD|__SBXD|sandboxd")


@pytest.fixture(params=["host", "engine"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """host: the control plane sees the containers' cgroups; engine: as if
    the engine were remote (no host view of any container)."""
    if request.param == "engine":
        monkeypatch.setattr(ContainerProbe, "open", classmethod(lambda cls, pid: None))
    return str(request.param)


@pytest.fixture
async def app(mode: str, tmp_path: Path, engine: docker.DockerClient, image: str) -> AsyncIterator[App]:
    async with running_app(make_settings(tmp_path), engine) as app:
        yield app


@pytest.fixture
async def pair(
    client: AsyncClient, image: str, engine: docker.DockerClient
) -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    """A victim sandbox and a bystander, both checked to leave no cgroup behind."""
    await client.create_pool("c", image, min_ready=2, max_size=6, limits=LIMITS)
    async with client.acquire_group("c", n=2, timeout=60) as group:
        assert (await group[1].exec("true", session="probe")).ok
        dirs = [await asyncio.to_thread(_cgroup_dirs, engine, sb.id) for sb in group]
        yield group[0], group[1]
        for sb in group:
            await _check_cells(engine, sb)
    for found in dirs:
        for d in found:

            def removed(d: Path = d) -> bool:
                return not d.exists()

            await poll(removed, timeout=30, what=f"{d} removed with its container")
    await client.delete_pool("c", force=True)


def _container(engine: docker.DockerClient, sandbox_id: str) -> Any:
    (found,) = engine.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"})
    return found


def _cgroup_dirs(engine: docker.DockerClient, sandbox_id: str) -> list[Path]:
    """The container's freezer cgroup and the cells below it (host only)."""
    found = _container(engine, sandbox_id)
    base = CGROUP_ROOT / "freezer" / "docker" / found.id
    return [base, *base.glob("sandboxd-*")] if base.is_dir() else []


async def _check_cells(engine: docker.DockerClient, sb: Sandbox) -> None:
    """Every cell left holds at most its shell: nothing a command started
    stays in one, and cells of closed shells are gone."""
    for d in await asyncio.to_thread(_cgroup_dirs, engine, sb.id):
        if d.name.startswith("sandboxd-"):
            procs = (d / "cgroup.procs").read_text().split()
            assert len(procs) <= 1, f"{d} holds {procs}"


async def count(sb: Sandbox, pattern: str) -> int:
    """How many of the sandbox's processes have an argv matching ``pattern``."""
    r = await sb.exec(f"ps -eo args --no-headers | grep -cE '{pattern}' || true")
    assert r.ok, r
    return int(r.text)


async def gone(sb: Sandbox, pattern: str = DETACHED, what: str = "") -> None:
    async def none_left() -> bool:
        return await count(sb, pattern) == 0

    await poll(none_left, timeout=30, what=what or f"no process matching {pattern}")


async def probed(bystander: Sandbox, attack: Awaitable[T]) -> T:
    """``attack``'s result; the bystander was answered throughout."""
    result, latencies = await while_probing(bystander, cast(Awaitable[ExecResult], attack))
    assert latencies, "the bystander's commands were answered during the attack"
    return cast(T, result)


@pytest.mark.parametrize("session", ["", "s"], ids=["oneshot", "session"])
async def test_detached_processes_die_at_timeout(pair: tuple[Sandbox, Sandbox], session: str) -> None:
    sb, bystander = pair
    if session:
        assert (await sb.exec("cd /tmp && export KEEP=kept", session=session)).ok
    r = await probed(bystander, sb.exec(DETACH + "sleep 1000", timeout=3, session=session))
    assert r.outcome == "TIMED_OUT" and r.stdout == b"started\n", r
    await gone(sb, what="every process the timed-out command started to be gone")
    if session:
        r = await sb.exec("pwd; echo $KEEP", session=session)
        assert r.text == "/tmp\nkept\n", "the session's shell survived with its state"


@pytest.mark.parametrize("session", ["", "s"], ids=["oneshot", "session"])
async def test_detached_processes_die_at_the_output_cap(pair: tuple[Sandbox, Sandbox], session: str) -> None:
    sb, bystander = pair
    if session:
        assert (await sb.exec("cd /tmp && export KEEP=kept", session=session)).ok
    attack = sb.exec(DETACH + "yes", timeout=60, output_limit=100_000, session=session)
    r = await probed(bystander, attack)
    assert r.outcome == "OUTPUT_TRUNCATED" and r.stdout.startswith(b"started\n"), r
    await gone(sb, r"^sleep 100[0-4]$|^yes$", what="every process the truncated command started to be gone")
    if session:
        r = await sb.exec("pwd; echo $KEEP", session=session)
        assert r.text == "/tmp\nkept\n"


VANISHING_CLIENT = """
import asyncio, sys
from sandboxd.client import AsyncClient

async def main() -> None:
    async with AsyncClient(sys.argv[1]) as client:
        stream = client.exec_stream(sys.argv[2], sys.argv[3], session=sys.argv[4], timeout=600)
        async for kind, value in stream:
            if kind == "stdout" and b"started" in value:
                print("started", flush=True)
                await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.parametrize("session", ["", "s"], ids=["oneshot", "session"])
async def test_detached_processes_die_when_the_client_vanishes(
    app: App, pair: tuple[Sandbox, Sandbox], session: str
) -> None:
    sb, bystander = pair
    if session:
        assert (await sb.exec("cd /tmp && export KEEP=kept", session=session)).ok

    async def attack() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", VANISHING_CLIENT, app.address, sb.id, DETACH + "sleep 1000", session,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"started\n"
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await gone(sb, what="every process of the vanished client's command to be gone")

    await probed(bystander, attack())
    if session:
        r = await sb.exec("pwd; echo $KEEP", session=session)
        assert r.text == "/tmp\nkept\n", "the session survived its caller's command with its state"


async def test_a_concurrent_exec_in_the_same_sandbox_is_unaffected(pair: tuple[Sandbox, Sandbox]) -> None:
    sb, bystander = pair
    # Another one-shot, running all along (until told to end) with a
    # detached child of its own; and a daemon an earlier command of the
    # session left.
    other = asyncio.create_task(
        sb.exec(
            "setsid sleep 2001 >/dev/null 2>&1 & until [ -e /tmp/go ]; do sleep 0.05; done; echo survived",
            timeout=120,
        )
    )
    assert (await sb.exec("cd /tmp && export KEEP=kept && (env -i setsid sleep 2002 &)", session="s")).ok
    await poll(lambda: _two(sb), timeout=30, what="the other exec's processes to be up")

    for session in ("", "s"):
        r = await probed(bystander, sb.exec(DETACH + "sleep 1000", timeout=3, session=session))
        assert r.outcome == "TIMED_OUT" and r.stdout == b"started\n", r
        await gone(sb, what=f"the timed-out command's processes to be gone (session={session!r})")
        assert await count(sb, "^sleep 200[12]$") == 2, "the other exec's and the earlier command's live on"
        assert not other.done()
    assert (await sb.exec("touch /tmp/go")).ok
    r = await asyncio.wait_for(other, 60)
    assert r.ok and r.text == "survived\n", r
    assert (await sb.exec("pwd; echo $KEEP", session="s")).text == "/tmp\nkept\n"


async def _two(sb: Sandbox) -> bool:
    return await count(sb, "^sleep 200[12]$") == 2


@pytest.mark.parametrize("how", ["kill", "rm"])
@pytest.mark.parametrize("kind", ["oneshot", "session", "root"])
async def test_a_sandbox_killed_under_a_command_is_sandbox_lost(
    client: AsyncClient, image: str, engine: docker.DockerClient, kind: str, how: str
) -> None:
    await client.create_pool("lost", image, min_ready=2, max_size=6, limits=LIMITS)
    async with client.acquire_group("lost", n=2, timeout=60) as (sb, bystander):
        container = await asyncio.to_thread(_container, engine, sb.id)
        kwargs: dict[str, Any] = {"session": "s"} if kind == "session" else {}
        if kind == "root":
            kwargs["user"] = "root"

        async def attack() -> ExecResult:
            result: ExecResult | None = None
            async for event, value in sb.exec_stream("echo started; sleep 30", timeout=120, **kwargs):
                if event == "stdout" and value == b"started\n":
                    if how == "kill":
                        await asyncio.to_thread(container.kill)
                    else:
                        await asyncio.to_thread(container.remove, force=True)
                elif event == "result":
                    result = value
            assert result is not None
            return result

        r = await probed(bystander, attack())
        assert r.outcome == "SANDBOX_LOST", r
        assert not WRAPPER_LINE.search(r.stderr), r.stderr
    await client.delete_pool("lost", force=True)


async def test_no_wrapper_line_in_stderr(pair: tuple[Sandbox, Sandbox], mode: str) -> None:
    sb, bystander = pair
    hog = ["python3", "-c", "x = bytearray(512 << 20)"]
    # Without the host's view the OOM kill is not named: a SIGKILL then.
    oom, oom_code = ("OOM_KILLED", -1) if mode == "host" else ("EXITED", 137)
    segv = "python3 -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'"
    cases: list[tuple[str | list[str], dict[str, Any], str, int]] = [
        ("kill -9 $$", {}, "EXITED", 137),
        (segv, {}, "EXITED", 139),
        ("sleep 100", {"timeout": 1}, "TIMED_OUT", -1),
        (hog, {"timeout": 60}, oom, oom_code),
        ("sleep 100", {"timeout": 1, "session": "s"}, "TIMED_OUT", -1),
        (hog, {"timeout": 60, "session": "s"}, oom, oom_code),
        ("kill -9 $$", {"session": "s"}, "EXITED", 137),
    ]

    async def attack() -> None:
        for command, kwargs, outcome, code in cases:
            r = await sb.exec(command, **kwargs)
            assert r.outcome == outcome, (command, kwargs, r)
            if code >= 0:
                assert r.exit_code == code, (command, r)
            assert not WRAPPER_LINE.search(r.stderr), (command, kwargs, r.stderr)
            # bash may report a job's death late, at its next command:
            # nothing shows up there either.
            after = await sb.exec("echo next", session=kwargs.get("session", ""))
            assert after.ok and after.stderr == b"", (command, kwargs, after)

    await probed(bystander, attack())
    assert (await sb.exec("pwd", session="s")).text == "/workspace\n", "a new session after kill -9 $$"


@pytest.mark.parametrize("session", ["", "s"], ids=["oneshot", "session"])
async def test_a_fork_bomb_is_still_pids_exhausted(
    pair: tuple[Sandbox, Sandbox], session: str, mode: str
) -> None:
    if mode != "host":
        pytest.skip("the pids limit is named from the host's view of the container")
    sb, bystander = pair
    r = await probed(
        bystander, sb.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=5, session=session)
    )
    assert r.outcome == "PIDS_EXHAUSTED", r
    after = await sb.exec("ps -e --no-headers | wc -l")
    assert after.ok and int(after.text) < 12, after.text
