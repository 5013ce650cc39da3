"""The host side of gVisor session shells (sandboxd.backends.docker.runsc_exec)
with a local process standing in for ``runsc exec`` (the Docker suite runs
the real one): its pipes carry both streams and stdin, its exit code is
reaped from a pidfd on the loop, and one that outlives its pipes is killed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest

from sandboxd.backends.docker import runsc_exec
from sandboxd.backends.docker.runsc_exec import RunscExec, find_runsc

pytestmark = pytest.mark.timeout(20)


def _standing_in(monkeypatch: pytest.MonkeyPatch, script: str) -> RunscExec:
    def argv(self: RunscExec, argv: Sequence[str], **_: Any) -> list[str]:
        return ["/bin/sh", "-c", script]

    monkeypatch.setattr(RunscExec, "argv", argv)
    return RunscExec("/bin/sh", "/", "c0ffee")


async def _read_all(channel: Any) -> dict[int, bytes]:
    got: dict[int, bytes] = {1: b"", 2: b""}
    while (frame := await channel.next_frame(10.0)) is not None:
        assert isinstance(frame, tuple), frame
        got[frame[0]] += frame[1]
    return got


async def test_streams_stdin_and_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    runsc = _standing_in(monkeypatch, "read x; echo got $x; echo err >&2; exit 3")
    proc = await runsc.start(["ignored"], env={}, cwd="/", user="1000:1000")
    await proc.channel.write(b"hi\n")
    assert await _read_all(proc.channel) == {1: b"got hi\n", 2: b"err\n"}
    assert await proc.exit_code() == 3
    await proc.close()


async def test_close_kills_what_outlives_its_pipes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runsc_exec, "_EXIT_WAIT", 0.2)
    runsc = _standing_in(monkeypatch, "exec sleep 30 </dev/null >/dev/null 2>&1")
    proc = await runsc.start(["ignored"], env={}, cwd="/", user="1000:1000")
    await proc.close()
    assert proc.proc.returncode == -9


def test_runsc_is_found_only_in_a_sandbox_process() -> None:
    assert find_runsc(0, "c0ffee") is None
    # This process is no runsc sandbox: no --root among its arguments.
    assert find_runsc(os.getpid(), "c0ffee") is None


def test_the_command_line_is_runsc_exec() -> None:
    runsc = RunscExec("/usr/local/bin/runsc", "/run/state", "c0ffee")
    assert runsc.argv(["bash"], env={"A": "1"}, cwd="/workspace", user="1000:1000") == [
        "/usr/local/bin/runsc", "--root=/run/state", "exec", "--user", "1000:1000",
        "--cwd", "/workspace", "--env", "A=1", "c0ffee", "bash",
    ]  # fmt: skip
