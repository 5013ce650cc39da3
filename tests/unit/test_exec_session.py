"""The shared exec layer (backends.session) over a scripted transport: how
a stream that ends early is reported, and what is killed when, and the
framing helpers it uses (execstream)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import pytest

from sandboxd.backends.base import ExecOutcome, ExecResult, ExecSpec, OutputChunk
from sandboxd.backends.execstream import FirstLine, MarkerSplitter
from sandboxd.backends.exectransport import Explain, Frame, unchanged
from sandboxd.backends.session import OneShot, ShellSession
from sandboxd.backends.shell import (
    EXEC_TAG_VAR,
    SESSION_PRELUDE,
    SESSION_TAG_VAR,
    Tree,
    session_command,
    session_frame,
    stdin_frames,
)

pytestmark = pytest.mark.timeout(10)

_MARKER = re.compile(rb"printf '%s %d[^']*' (__SBXD_[0-9a-f]+__)")


class Scripted:
    """An ExecTransport whose process answers as told: ``reply`` maps a
    command line to the frames it prints (None: the stream ends there)."""

    def __init__(self, *, clock: bool = False, code: int | None = 0, alive: bool = True) -> None:
        self.clock = clock
        self.code = code
        self.is_alive = alive
        self.frames: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.kills: list[Tree] = []
        self.settled = 0
        self.closed = False
        self.hang = False
        self.written: list[bytes] = []

    async def open(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, stdin: bool) -> None:
        self.env = dict(env)

    async def write(self, data: bytes) -> None:
        self.written.append(data)
        found = _MARKER.search(data)
        if found is None or self.hang:
            return
        marker = found.group(1)
        if b"exit 5" in data:
            await self.frames.put(None)
            return
        clock = b" 12.34 99" if self.clock else b""
        await self.frames.put((1, b"out\n" + marker + b" 0" + clock + b"\n"))
        await self.frames.put((2, marker + b"\n"))

    def finish(self) -> None:
        """The hanging command is killed: the shell prints its markers."""
        marker = _MARKER.search(self.written[-1])
        assert marker is not None
        self.frames.put_nowait((1, marker.group(1) + b" 137\n"))
        self.frames.put_nowait((2, marker.group(1) + b"\n"))

    async def close_stdin(self) -> None:
        pass

    async def read(self, timeout: float) -> Frame | TimeoutError | None:
        try:
            return await asyncio.wait_for(self.frames.get(), timeout)
        except TimeoutError as e:
            return e

    async def exit_status(self) -> tuple[int | None, str]:
        return self.code, ""

    async def kill(self, tree: Tree) -> None:
        self.kills.append(tree)
        if tree.keep_root and self.hang:
            self.finish()

    async def settle(self) -> None:
        self.settled += 1

    async def alive(self) -> bool:
        return self.is_alive

    def watch_limits(self) -> Explain:
        return unchanged

    async def close(self) -> None:
        self.closed = True
        await self.frames.put(None)


class Tasks:
    """The backend's spawn: keeps the tasks so the test can await them."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def __call__(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.ensure_future(coro))

    async def join(self) -> None:
        await asyncio.gather(*self.tasks)


async def _result(events: Any) -> ExecResult:
    result = None
    async for event in events:
        if isinstance(event, ExecResult):
            result = event
    assert result is not None
    return result


@pytest.mark.parametrize(
    ("alive", "outcome"), [(True, ExecOutcome.EXITED), (False, ExecOutcome.SANDBOX_LOST)]
)
async def test_a_one_shot_killed_with_its_sandbox_is_lost(alive: bool, outcome: ExecOutcome) -> None:
    transport = Scripted(code=137, alive=alive)
    command = OneShot(transport, ExecSpec(shell="sleep 30"), Tasks())
    await command.start()
    await transport.frames.put(None)
    result = await _result(command.follow())
    assert result.outcome is outcome
    assert result.sandbox_gone is not alive
    assert transport.closed


@pytest.mark.parametrize(
    ("alive", "outcome"), [(True, ExecOutcome.EXITED), (False, ExecOutcome.SANDBOX_LOST)]
)
async def test_a_session_shell_that_ends_is_exited_unless_the_sandbox_went(
    alive: bool, outcome: ExecOutcome
) -> None:
    transport = Scripted(code=5, alive=alive)
    session = ShellSession(transport, Tasks())
    await session.start()
    result = await _result(session.run(ExecSpec(shell="exit 5")))
    assert result.outcome is outcome
    if alive:
        assert result.exit_code == 5
    assert session.dead


async def test_a_session_timeout_kills_the_command_not_the_shell() -> None:
    transport = Scripted(clock=True)
    session = ShellSession(transport, Tasks())
    await session.start()
    assert transport.written[0].startswith(b"trap '' KILL\n"), "the job reports are silenced first"
    assert (await _result(session.run(ExecSpec(shell="true")))).outcome is ExecOutcome.EXITED
    assert transport.settled == 1
    transport.hang = True
    result = await _result(session.run(ExecSpec(shell="sleep 100", timeout=0.05)))
    assert result.outcome is ExecOutcome.TIMED_OUT and not session.dead
    (tree,) = transport.kills
    assert (tree.tag_var, tree.keep_root) == (EXEC_TAG_VAR, True)
    assert tree.since == "12.34 99", "the previous command's end bounds this one's processes"


async def test_an_abandoned_session_command_is_killed_and_the_session_kept() -> None:
    transport = Scripted()
    tasks = Tasks()
    session = ShellSession(transport, tasks)
    await session.start()
    transport.hang = True
    events = session.run(ExecSpec(shell="sleep 100", timeout=600))
    waiting = asyncio.ensure_future(events.__anext__())
    await asyncio.sleep(0)  # one turn of the loop: the command is written and read from
    assert len(transport.written) == 2
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await events.aclose()  # type: ignore[attr-defined]
    await tasks.join()
    assert [t.keep_root for t in transport.kills] == [True]
    assert not session.dead, "the shell printed its markers once the command died"
    transport.hang = False
    assert (await _result(session.run(ExecSpec(shell="true")))).outcome is ExecOutcome.EXITED


async def test_an_abandoned_one_shot_is_killed_before_its_stream_closes() -> None:
    transport = Scripted()
    tasks = Tasks()
    command = OneShot(transport, ExecSpec(shell="sleep 100", timeout=600), tasks)
    await command.start()
    await transport.frames.put((1, b"started\n"))
    events = command.follow()
    assert await events.__anext__() == OutputChunk(1, b"started\n")
    await events.aclose()  # type: ignore[attr-defined]
    await tasks.join()
    (tree,) = transport.kills
    assert (tree.tag_var, tree.keep_root) == (EXEC_TAG_VAR, False)
    assert transport.closed


async def test_a_builtin_loop_escalates_to_the_whole_session() -> None:
    transport = Scripted()
    session = ShellSession(transport, Tasks())
    await session.start()
    transport.hang = True
    transport.finish = lambda: None  # type: ignore[method-assign]
    result = await _result(session.run(ExecSpec(shell="while :; do :; done", timeout=0.05)))
    assert result.outcome is ExecOutcome.TIMED_OUT and "restarted" in result.detail
    assert [t.tag_var for t in transport.kills] == [EXEC_TAG_VAR, SESSION_TAG_VAR]
    assert session.dead and transport.closed


def test_first_line_takes_the_pid_across_frames() -> None:
    first = FirstLine()
    assert first.feed(b"12") == b"" and first.value is None
    assert first.feed(b"3\nout") == b"out" and first.value == b"123"
    assert first.feed(b"more") == b"more"


def _status(splitter: MarkerSplitter) -> tuple[int | None, bytes]:
    return splitter.exit_code, splitter.extra


def test_marker_keeps_what_follows_the_status() -> None:
    splitter = MarkerSplitter(b"__M__")
    assert splitter.feed(b"data__M") == b"data"
    assert splitter.feed(b"__ 3 45.67") == b""
    assert _status(splitter) == (None, b"")
    splitter.feed(b" 812\n")
    assert _status(splitter) == (3, b"45.67 812")


async def test_session_frames_run_in_a_real_bash_as_lines_at_its_top_level() -> None:
    # A command reaches the shell as a short call plus its line, read in one
    # go; what it does to the shell (cd, export, declare, functions) stays.
    shell = await asyncio.create_subprocess_exec(
        "bash", "--noprofile", "--norc", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert shell.stdin is not None and shell.stdout is not None
    shell.stdin.write(SESSION_PRELUDE)

    async def run(command: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> bytes:
        assert shell.stdin is not None and shell.stdout is not None
        marker = f"__SBXD_{len(command):016x}__"
        line = session_command(command, tag="t", marker=marker, cwd="", env=env or {}, stdin=stdin)
        frame = session_frame(line) + (stdin_frames(stdin) if stdin else b"")
        header = frame.split(b"\n", 1)[0]
        assert len(header) < 40, "the shell reads only a short call byte by byte"
        shell.stdin.write(frame)
        await shell.stdin.drain()
        out = b""
        while marker.encode() not in out:
            out += await asyncio.wait_for(shell.stdout.readline(), 5)
        return out.split(marker.encode())[0]

    try:
        assert await run('cd /tmp && export Q=7 && declare -A m=([k]=v) && f() { echo "f:$1"; }') == b""
        said = await run('echo "$PWD $Q ${m[k]} $ONE"; f x; echo héllo "wörld"', env={"ONE": "1"})
        assert said.decode() == "/tmp 7 v 1\nf:x\nhéllo wörld\n"
        assert await run("echo ${ONE-unset}; echo ${__sbx_line-gone}") == b"unset\ngone\n"
        big = "x" * 200_000
        assert await run("wc -c", stdin=big.encode()) == b"200000\n"
        assert await run("return 2>/dev/null; echo top-level") == b"top-level\n"
        assert shell.stdin is not None and shell.stderr is not None
        shell.stdin.close()
        await asyncio.wait_for(shell.wait(), 5)
        # Nothing but the markers on stderr: no unknown call, no line read as script.
        errors = [
            x for x in (await shell.stderr.read()).splitlines() if not re.fullmatch(rb"__SBXD_[0-9a-f]+__", x)
        ]
        assert errors == []
    finally:
        if shell.returncode is None:
            shell.kill()
            await shell.wait()
