"""A session command's stdin and a one-shot command's length, through a real
bash: stdin of any accepted size reaches the command byte for byte (and
leaves the shell's input in step whatever the command does with it), and a
command past the kernel's limit on one argument still runs."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from collections.abc import AsyncIterator

import pytest

from sandboxd.backends.shell import (
    MAX_ARG,
    SCRIPT_ON_STDIN,
    SESSION_PRELUDE,
    SESSION_SHELL,
    bash_argv,
    oneshot_argv,
    session_command,
    session_frame,
    stdin_frames,
)
from sandboxd.core import validation as v
from sandboxd.errors import InvalidArgument

pytestmark = pytest.mark.timeout(120)

MAX_STDIN = 16 << 20
"""The server's default cap (ExecSettings.max_stdin_bytes)."""


class Shell:
    """A session shell as sandboxd drives one: the prelude, then frames."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.n = 0

    async def run(self, command: str, stdin: bytes = b"", cwd: str = "") -> tuple[bytes, bytes, int]:
        """(stdout, stderr, exit status) of one command."""
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self.n += 1
        marker = f"__SBXD_{self.n:016x}__".encode()
        line = session_command(command, tag="t", marker=marker.decode(), cwd=cwd, env={}, stdin=stdin)
        self.proc.stdin.write(session_frame(line) + (stdin_frames(stdin) if stdin else b""))
        await self.proc.stdin.drain()
        out, err = await asyncio.gather(_until(self.proc.stdout, marker), _until(self.proc.stderr, marker))
        status = out[out.rindex(marker) + len(marker) :].split()
        return out[: out.rindex(marker)], err[: err.rindex(marker)], int(status[0])


async def _until(stream: asyncio.StreamReader, marker: bytes) -> bytes:
    """What ``stream`` gives up to the line that ends with the marker's status."""
    data = b""
    while True:
        chunk = await stream.read(1 << 16)
        assert chunk, f"stream ended before {marker!r}: {data[-300:]!r}"
        data += chunk
        at = data.rfind(marker)
        if at >= 0 and data.endswith(b"\n"):
            return data


@pytest.fixture
async def shell() -> AsyncIterator[Shell]:
    proc = await asyncio.create_subprocess_exec(
        *SESSION_SHELL,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdin is not None
    proc.stdin.write(SESSION_PRELUDE)
    try:
        yield Shell(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@pytest.mark.parametrize("size", [1, 64 << 10, 1 << 20, 8 << 20, MAX_STDIN])
async def test_session_stdin_arrives_exactly(shell: Shell, size: int) -> None:
    data = os.urandom(size)
    out, err, code = await shell.run("sha256sum", stdin=data)
    assert (out.decode(), code, err) == (f"{hashlib.sha256(data).hexdigest()}  -\n", 0, b"")
    # The shell's input is still in step: the next command runs as sent.
    assert await shell.run("echo next") == (b"next\n", b"", 0)


async def test_session_without_stdin_reads_nothing(shell: Shell) -> None:
    assert await shell.run("wc -c") == (b"0\n", b"", 0)


async def test_every_byte_value_survives(shell: Shell) -> None:
    data = bytes(range(256)) * 3 + b"%s%n\\0\\x41\\\\%%\x00\x00\n\r\x01\x7f\x00012\x000\x007"
    out, _, code = await shell.run("od -An -v -tx1", stdin=data)
    assert code == 0 and bytes.fromhex(out.decode()) == data


@pytest.mark.parametrize(
    "command",
    ["true", "head -c 10 >/dev/null", "exit_code() { return 3; }; exit_code", "cd /nonexistent-dir"],
)
async def test_stdin_the_command_leaves_unread_is_never_run_as_commands(shell: Shell, command: str) -> None:
    # What the command does not read (none, part, a failed cd before it)
    # must not be left on the shell's input, where bash would run it.
    data = b"echo INJECTED\n" * 10_000
    _, err, _ = await shell.run(command, stdin=data)
    assert b"INJECTED" not in err
    assert await shell.run("echo after") == (b"after\n", b"", 0)
    assert await shell.run("echo ${__sbx_in-gone} ${__sbx_n-gone} ${__sbx_k-gone}") == (
        b"gone gone gone\n",
        b"",
        0,
    )


async def test_a_failed_cd_keeps_the_stdin_out_of_the_shell(shell: Shell) -> None:
    _, _, code = await shell.run("cat", stdin=b"echo INJECTED\n", cwd="/nonexistent-dir")
    assert code != 0
    assert await shell.run("echo after") == (b"after\n", b"", 0)


def test_stdin_frames_hold_no_nul_and_say_their_lengths() -> None:
    data = b"\x00%\\" * 40_000
    frames = stdin_frames(data)
    assert b"\x00" not in frames and frames.endswith(b"00000000")
    assert stdin_frames(b"") == b"00000000"


def test_stdin_at_the_cap_is_taken_and_past_it_refused() -> None:
    from sandboxd.settings import ExecSettings

    assert ExecSettings().max_stdin_bytes == MAX_STDIN


# -- one-shot command length ---------------------------------------------------


def _run_argv(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, check=False)


@pytest.mark.parametrize("size", [100, MAX_ARG, MAX_ARG + 1, 512 << 10, v.MAX_COMMAND])
def test_a_command_up_to_the_limit_runs_one_shot(size: int) -> None:
    # A comment pads the command to its size; the script's output proves it ran whole.
    head = "echo start; x=$(( 6 * 7 ))\n"
    tail = '\necho "end $x $0 $#"\n'
    command = head + "#" + "p" * (size - len(head) - len(tail) - 2) + "\n" + tail
    assert len(command.encode()) == size
    v.shell("shell", command)
    result = _run_argv(bash_argv(command))
    assert (result.returncode, result.stderr) == (0, b"")
    assert result.stdout == b"start\nend 42 bash 0\n"


def test_a_long_command_of_wide_characters_is_split_on_characters() -> None:
    command = "echo " + "é" * ((v.MAX_COMMAND - 10) // 2)
    v.shell("shell", command)
    argv = bash_argv(command)
    assert all(len(a.encode()) <= MAX_ARG for a in argv)
    result = _run_argv(argv)
    assert result.returncode == 0 and result.stdout.decode() == command[5:] + "\n"


def test_one_string_past_the_kernels_limit_fails_as_an_argument() -> None:
    # What bash_argv avoids: the same command as one argument cannot be run at all.
    command = "echo " + "x" * (MAX_ARG + 1)
    with pytest.raises(OSError, match="Argument list too long"):
        _run_argv(["bash", "-c", command])


def test_commands_past_the_limit_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="1 MiB"):
        v.shell("shell", "x" * (v.MAX_COMMAND + 1))
    with pytest.raises(InvalidArgument, match="1 MiB"):
        v.shell("shell", "é" * (v.MAX_COMMAND // 2 + 1))  # counted in bytes, not characters
    with pytest.raises(InvalidArgument, match=r"argv\[1\]: .*kernel"):
        v.argv("argv", ["echo", "x" * (MAX_ARG + 1)])
    assert v.argv("argv", ["echo", "x" * MAX_ARG]) == ("echo", "x" * MAX_ARG)


@pytest.mark.parametrize("size", [100, SCRIPT_ON_STDIN, SCRIPT_ON_STDIN + 1, v.MAX_COMMAND])
@pytest.mark.parametrize("stdin", [b"", b"abc\x00def\n", os.urandom(200_000)])
def test_a_long_one_shot_command_reaches_bash_on_its_stdin_before_the_commands_own(
    size: int, stdin: bytes
) -> None:
    head = "echo start; x=$(( 6 * 7 ))\n"
    tail = '\necho "end $x"; sha256sum\n'
    command = head + "#" + "é" * ((size - len(head) - len(tail) - 2) // 2)
    command += "p" * (size - len(command.encode()) - len(tail) - 1) + "\n" + tail
    assert len(command.encode()) == size
    argv, script = oneshot_argv(command)
    assert all(len(a.encode()) <= SCRIPT_ON_STDIN for a in argv)
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run(argv, input=script + stdin, capture_output=True, timeout=60, env=env, check=False)
    assert (result.returncode, result.stderr) == (0, b"")
    assert result.stdout.decode() == f"start\nend 42\n{hashlib.sha256(stdin).hexdigest()}  -\n"
