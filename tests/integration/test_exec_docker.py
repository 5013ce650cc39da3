"""Exec against real containers: argv and shell, sessions, timeouts, caps."""

from __future__ import annotations

import pytest

from sandboxd.backends.base import GVISOR, SANDBOX_UID
from sandboxd.backends.uids import DEFAULT_UIDS
from sandboxd.client import AsyncClient
from tests.integration.conftest import poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


@pytest.fixture
def runtime(each_runtime: str) -> str:
    return each_runtime


async def test_argv_shell_env_cwd_stdin(client: AsyncClient, pool: str, runtime: str) -> None:
    async with client.acquire(pool) as sb:
        r = await sb.exec(["printf", "%s|", "a b", "$HOME"])
        assert r.ok and r.stdout == b"a b|$HOME|"
        r = await sb.exec("echo $FOO; pwd; echo oops >&2; exit 3", env={"FOO": "bar"}, cwd="/tmp")
        assert (r.outcome, r.exit_code) == ("EXITED", 3)
        assert r.stdout == b"bar\n/tmp\n" and r.stderr == b"oops\n"
        data = bytes(range(256)) * 4
        r = await sb.exec(["sh", "-c", "cat | od -An -tx1 | wc -w"], stdin=data)
        assert r.ok and r.text.strip() == str(len(data))
        r = await sb.exec("id -u")
        uid = int(r.text)
        if runtime == GVISOR:
            assert uid == SANDBOX_UID, "gVisor sandboxes keep the images' non-root user"
        else:
            assert DEFAULT_UIDS.base <= uid < DEFAULT_UIDS.base + DEFAULT_UIDS.count, "a uid of its own"


async def test_session_keeps_state_and_stdin(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        assert (await sb.exec("mkdir -p d/e && cd d && export X=42 && f() { echo f$1; }", session="s")).ok
        r = await sb.exec("pwd; echo $X; f 7", session="s")
        assert r.text.split() == ["/workspace/d", "42", "f7"]
        # Per-command env and stdin do not leak into the session.
        r = await sb.exec("echo $Y; cat", session="s", env={"Y": "y"}, stdin=b"in\x00put")
        assert r.stdout == b"y\nin\x00put"
        r = await sb.exec("echo [$Y]", session="s")
        assert r.text == "[]\n"
        # A different session has its own state.
        r = await sb.exec("pwd", session="other")
        assert r.text == "/workspace\n"
        # Output without a trailing newline, and an argv in a session.
        r = await sb.exec(["printf", "%s", "no-newline"], session="s")
        assert r.stdout == b"no-newline" and r.exit_code == 0
        r = await sb.exec("exit 5", session="s")
        assert (r.outcome, r.exit_code) == ("EXITED", 5)
        r = await sb.exec("pwd", session="s")
        assert r.ok and r.text == "/workspace\n", "a new session starts after the shell exited"


async def test_timeout_kills_whole_tree(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        r = await sb.exec("sleep 300 & sleep 301; echo never", timeout=1)
        assert r.outcome == "TIMED_OUT" and b"never" not in r.stdout
        left = await sb.exec("ps -eo args | grep -c '^sleep 30[01]' || true")
        assert left.text.strip() == "0", "background children were killed too"
        r = await sb.exec("trap '' TERM; sleep 300", timeout=1, session="s")
        assert r.outcome == "TIMED_OUT"
        assert (await sb.exec("echo alive", session="s")).text == "alive\n"
        # A shell builtin loop can only be stopped by restarting the session.
        r = await sb.exec("cd /tmp; while :; do :; done", timeout=1, session="s")
        assert r.outcome == "TIMED_OUT" and "restarted" in r.detail
        assert (await sb.exec("pwd", session="s")).text == "/workspace\n"


async def test_output_cap(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        for session in ("", "s"):
            r = await sb.exec("yes", output_limit=10_000, timeout=30, session=session)
            assert r.outcome == "OUTPUT_TRUNCATED" and r.output_truncated
            assert len(r.stdout) == 10_000
        assert (await sb.exec("echo ok", session="s")).text == "ok\n"


async def test_exec_stream_yields_output_before_result(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        events = [e async for e in sb.exec_stream("echo one; echo two >&2; sleep 0.2; echo three")]
        kinds = [k for k, _ in events]
        assert kinds[-1] == "result" and kinds.count("result") == 1
        out = b"".join(v for k, v in events if k == "stdout")
        assert out == b"one\nthree\n"
        assert b"".join(v for k, v in events if k == "stderr") == b"two\n"
        assert events[-1][1].ok


async def test_hardening_defaults(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        r = await sb.exec("touch /etc/x")
        # gVisor checks permissions before the mount's read-only flag.
        assert r.exit_code != 0 and (b"Read-only" in r.stderr or b"Permission denied" in r.stderr)
        r = await sb.exec("awk '$2 == \"/\" {print $4}' /proc/mounts")
        assert r.text.split(",")[0] == "ro", "the root filesystem is mounted read-only"
        r = await sb.exec(["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 1), 2)"])
        assert r.exit_code != 0, "no network"
        r = await sb.exec("grep CapEff /proc/self/status")
        assert r.text.split()[1] == "0000000000000000", "no capabilities"
        assert (
            await sb.exec("printf '#!/bin/sh\\necho ran\\n' > x.sh && chmod +x x.sh && ./x.sh")
        ).text == "ran\n"


async def test_abandoned_exec_stream_kills_the_command(client: AsyncClient, pool: str) -> None:
    async with client.acquire(pool) as sb:
        for session in ("", "s"):
            stream = sb.exec_stream("echo started; sleep 300; echo never", session=session)
            async for kind, value in stream:
                assert kind == "stdout" and value == b"started\n"
                break
            await stream.aclose()  # type: ignore[attr-defined]

            async def gone() -> bool:
                r = await sb.exec("ps -eo args --no-headers | grep -c '^sleep 300' || true")
                return r.text.strip() == "0"

            await poll(gone, timeout=20, what=f"the abandoned command to be killed (session={session!r})")
        assert (await sb.exec("pwd", session="s")).text == "/workspace\n", "the session restarts cleanly"
