"""Clean-ups a backend leaves running when it closes: a stuck one (an exec
stream an engine never ends) is cancelled after the grace period, and a
kill by an exec of its own gives up on such a stream instead of hanging."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from sandboxd.backends.background import Background
from sandboxd.backends.docker import execs
from sandboxd.backends.docker.execs import EngineExec
from sandboxd.backends.docker.rawapi import RawEngine
from sandboxd.backends.shell import Tree

pytestmark = pytest.mark.timeout(20)


async def test_close_waits_for_tasks_that_end() -> None:
    background = Background()
    ended = asyncio.Event()

    async def short() -> None:
        await asyncio.sleep(0)
        ended.set()

    background.spawn(short())
    await background.close(grace=5.0)
    assert ended.is_set()


async def test_close_cancels_a_stuck_task_after_the_grace() -> None:
    background = Background()
    cancelled = asyncio.Event()

    async def stuck() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = background.spawn(stuck())
    await background.close(grace=0.05)
    assert cancelled.is_set() and task.cancelled()


class _NeverEnds:
    """An exec stream that never sends a frame nor ends."""

    def __init__(self) -> None:
        self.closed = False

    async def read_frame(self) -> tuple[int, bytes] | None:
        await asyncio.Event().wait()
        return None

    async def close(self) -> None:
        self.closed = True


class _Engine:
    def __init__(self) -> None:
        self.channel = _NeverEnds()

    async def exec_create(self, container: str, argv: list[str], **_: Any) -> str:
        return "exec-1"

    async def exec_start(self, exec_id: str, container: str) -> _NeverEnds:
        return self.channel

    async def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        return {"ExitCode": 0, "Running": False}


async def test_a_kill_exec_whose_stream_never_ends_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execs, "_QUIET_EXEC_TIMEOUT", 0.05)
    engine = _Engine()

    async def running(_: str) -> bool:
        return True

    with ThreadPoolExecutor(1) as pool:
        transport = EngineExec(
            cast(RawEngine, engine), "c0ffee", user="1000", probe=None, is_running=running, executor=pool
        )
        await transport.kill(Tree("TAG", "t"))
    assert engine.channel.closed


class _Writer:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None


async def test_cut_closes_every_stream_of_the_removed_container_only() -> None:
    from sandboxd.backends.docker.rawapi import EngineAddress, ExecChannel

    raw = RawEngine(EngineAddress.parse(None))
    writers = [_Writer() for _ in range(3)]
    channels = []
    for container, writer in zip(("gone", "gone", "kept"), writers, strict=True):
        streams = raw._streams.setdefault(container, set())
        channel = ExecChannel(cast(Any, asyncio.StreamReader()), cast(Any, writer), streams.discard)
        streams.add(channel)
        channels.append(channel)
    await raw.cut("gone")
    assert [w.closed for w in writers] == [True, True, False]
    assert raw._streams == {"kept": {channels[2]}}
