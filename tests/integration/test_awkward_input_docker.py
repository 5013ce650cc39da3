"""Awkward input on the real engine: session stdin of every size up to the
cap arrives exactly, commands up to the documented length run one-shot and
in sessions (past it: INVALID_ARGUMENT), and a session whose cwd and
exported variable are not UTF-8 is snapshotted, listed (after a restart
too) and restored byte for byte."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import docker
import pytest

from sandboxd import errors
from sandboxd.backends.shell import MAX_ARG
from sandboxd.client import AsyncClient
from sandboxd.client.aio import Lease
from sandboxd.core import validation as v
from tests.integration.conftest import make_settings, running_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

MAX_STDIN = 16 << 20


@pytest.fixture
def runtime(each_runtime: str) -> str:
    return each_runtime


async def test_stdin_of_every_size_arrives_exactly(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        for session in ("s", ""):
            for size in (0, 1, 64 << 10, 1 << 20, 8 << 20, MAX_STDIN):
                data = os.urandom(size)
                r = await sb.exec("sha256sum", stdin=data, session=session, timeout=120)
                assert r.ok, (session, size, r.outcome, r.stderr[-300:])
                assert r.text == f"{hashlib.sha256(data).hexdigest()}  -\n", (session, size)
            with pytest.raises(errors.InvalidArgument, match="stdin"):
                await sb.exec("sha256sum", stdin=b"x" * (MAX_STDIN + 1), session=session)
        # The session is still in step with its shell after all that.
        r = await sb.exec("echo ok; echo ${__sbx_in-gone}", session="s")
        assert r.text == "ok\ngone\n"


async def test_stdin_a_command_leaves_unread_is_not_run_by_the_session(
    client: AsyncClient, pool: str
) -> None:
    async with client.acquire(pool) as sb:
        data = b"touch /workspace/INJECTED\n" * 50_000
        for command in ("true", "head -c 5 >/dev/null", "exit_now() { return 4; }; exit_now"):
            r = await sb.exec(command, stdin=data, session="s")
            assert r.outcome == "EXITED", (command, r.outcome, r.stderr[-300:])
        r = await sb.exec("ls /workspace; echo done", session="s")
        assert r.text == "done\n"


def _command_of(size: int) -> str:
    """A shell command of exactly ``size`` bytes whose output shows it ran whole."""
    head = "echo start; x=$(( 6 * 7 ))\n"
    tail = '\necho "end $x"\n'
    command = head + "#" + "é" * ((size - len(head) - len(tail) - 2) // 2)
    command += "p" * (size - len(command.encode()) - len(tail) - 1) + "\n" + tail
    assert len(command.encode()) == size
    return command


async def test_commands_up_to_the_limit_run_one_shot_and_in_sessions(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        for size in (100, MAX_ARG, MAX_ARG + 1, 512 << 10, v.MAX_COMMAND):
            command = _command_of(size)
            for session in ("", "s"):
                r = await sb.exec(command, session=session)
                assert (r.outcome, r.exit_code, r.stderr) == ("EXITED", 0, b""), (
                    size,
                    session,
                    r.stderr[-300:],
                )
                assert r.text == "start\nend 42\n", (size, session)
            # With stdin that goes through the same shells.
            r = await sb.exec(_command_of(size - 6) + "wc -c\n", stdin=b"abc")
            assert r.text == "start\nend 42\n3\n", size
            # Past 64 KiB of stdin a one-shot command runs on an exec of its own.
            big = os.urandom(100_000)
            r = await sb.exec(_command_of(size - 10) + "sha256sum\n", stdin=big)
            assert r.text == f"start\nend 42\n{hashlib.sha256(big).hexdigest()}  -\n", (size, r.stderr[-300:])
        for session in ("", "s"):
            with pytest.raises(errors.InvalidArgument, match="shell"):
                await sb.exec(_command_of(v.MAX_COMMAND + 1), session=session)
        r = await sb.exec(["printf", "%s", "x" * MAX_ARG])
        assert r.ok and len(r.stdout) == MAX_ARG
        with pytest.raises(errors.InvalidArgument, match=r"argv\[2\]"):
            await sb.exec(["printf", "%s", "x" * (MAX_ARG + 1)])


ODD_DIR = b"d\xff\n"
ODD_VALUE = b"v\xfe\x80\nx y"


async def _odd_session(client: AsyncClient, pool: str) -> Lease:
    lease = await client.lease(pool, timeout=60)
    sb = lease[0]
    r = await sb.exec(
        "mkdir -p $'/workspace/d\\xff\\n' && cd $'/workspace/d\\xff\\n' && "
        "export ODD=$'v\\xfe\\x80\\nx y' PLAIN=ok",
        session="agent",
    )
    assert r.ok, r.stderr
    return lease


async def _check_restored(client: AsyncClient, snapshot_id: str) -> None:
    restored = await client.restore(snapshot_id, timeout=60)
    try:
        r = await restored[0].exec('printf "%s\\0%s\\0%s" "$PWD" "$ODD" "$PLAIN"', session="agent")
        assert r.ok, r.stderr
        assert r.stdout.split(b"\0") == [b"/workspace/" + ODD_DIR, ODD_VALUE, b"ok"]
    finally:
        await restored.release()


async def test_session_state_that_is_not_utf8_round_trips_and_lists_after_a_restart(
    tmp_path: Path, engine: docker.DockerClient, image: str
) -> None:
    settings = make_settings(tmp_path)
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        await client.create_pool("odd", image, min_ready=1, max_size=4)
        lease = await _odd_session(client, "odd")
        snap = await lease[0].snapshot(session="agent")
        assert snap.cwd_bytes == b"/workspace/" + ODD_DIR and snap.cwd == "/workspace/d\\xff\n"
        assert snap.env_bytes["ODD"] == ODD_VALUE and snap.env["ODD"] == "v\\xfe\\x80\nx y"
        assert [s.id for s in await client.list_snapshots()] == [snap.id]
        await _check_restored(client, snap.id)
        await lease.release()
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        with contextlib.suppress(errors.AlreadyExists):  # pools are kept across a restart
            await client.create_pool("odd", image, min_ready=1, max_size=4)
        listed = await client.list_snapshots()
        assert [s.id for s in listed] == [snap.id] and listed[0].env_bytes["ODD"] == ODD_VALUE
        await _check_restored(client, snap.id)


async def test_environment_at_its_limits_reaches_the_command(client: AsyncClient, pool: str) -> None:
    # The largest variable and the largest total, with the longest command:
    # together still within what the kernel passes to a program.
    one = {"BIG": "v" * (v.MAX_ENV_ENTRY - len("BIG=") - 1)}
    total = {f"E{i}": "w" * (120 << 10) for i in range(4)}
    command = _command_of(v.MAX_COMMAND - 40) + 'printenv | wc -c | sed "s/^/n=/"\n'
    async with client.acquire(pool) as sb:
        for env in (one, total):
            want = sum(len(k) + 1 + len(val) + 1 for k, val in env.items())
            for session, stdin in (("", b""), ("", b"x" * 100_000), ("s", b"")):
                r = await sb.exec(command, env=env, session=session, stdin=stdin)
                assert r.outcome == "EXITED" and r.exit_code == 0, (session, len(stdin), r.stderr[-300:])
                lines = r.text.splitlines()
                assert lines[:2] == ["start", "end 42"] and int(lines[2][2:]) >= want, (session, lines)
        with pytest.raises(errors.InvalidArgument, match="BIG"):
            await sb.exec("true", env={"BIG": "v" * v.MAX_ENV_ENTRY})
        with pytest.raises(errors.InvalidArgument, match="env: variables total"):
            await sb.exec("true", env={**total, "E9": "w" * (120 << 10)})
