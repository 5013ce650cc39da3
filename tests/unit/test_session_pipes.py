"""A session shell's stdio on host FIFOs (sandboxd.backends.docker.pipes),
against real FIFOs and a real shell on this host: no engine involved."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from sandboxd.backends.docker.pipes import READY, HostPipes, PipeChannel

pytestmark = pytest.mark.timeout(30)


async def _started(tmp_path: Path, script: str) -> tuple[PipeChannel, asyncio.subprocess.Process]:
    """A shell running ``script`` with its stdio moved onto the FIFOs the way
    a sandbox's shell is (REDIRECT), and our ends as a channel."""
    pipes = HostPipes(tmp_path, str(tmp_path))
    pipes.make()
    proc = await asyncio.create_subprocess_exec(
        *pipes.argv(["sh", "-c", script]), stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == READY + b"\n"
    channel = pipes.channel()
    pipes.unlink()
    return channel, proc


async def _all_output(channel: PipeChannel) -> dict[int, bytes]:
    out = {1: b"", 2: b""}
    while (frame := await channel.next_frame(10)) is not None:
        assert not isinstance(frame, TimeoutError)
        out[frame[0]] += frame[1]
    return out


async def test_commands_in_and_both_streams_out(tmp_path: Path) -> None:
    channel, proc = await _started(tmp_path, 'while read -r l; do echo "out:$l"; echo "err:$l" >&2; done')
    assert not os.listdir(tmp_path), "the FIFOs' names are gone once both ends are open"
    await channel.write(b"a\nb\n")
    channel.close_stdin()
    assert await _all_output(channel) == {1: b"out:a\nout:b\n", 2: b"err:a\nerr:b\n"}
    assert await proc.wait() == 0
    await channel.close()


async def test_timeout_then_more_output(tmp_path: Path) -> None:
    channel, proc = await _started(tmp_path, "read -r l; echo got-$l")
    assert isinstance(await channel.next_frame(0.05), TimeoutError)
    await channel.write(b"x\n")
    assert await channel.next_frame(10) == (1, b"got-x\n")
    assert await channel.next_frame(10) is None, "the end once every writer is gone"
    await proc.wait()
    await channel.close()


async def test_large_output_arrives_whole_through_backpressure(tmp_path: Path) -> None:
    size = 8 << 20  # past the channel's high-water mark: reading pauses and resumes
    channel, proc = await _started(tmp_path, f"head -c {size} /dev/zero | tr '\\0' 'z'")
    await asyncio.sleep(0)  # nothing is read for a while: the pipes fill
    out = await _all_output(channel)
    assert out[1] == b"z" * size and out[2] == b""
    await proc.wait()
    await channel.close()


async def test_write_to_a_dead_shell_fails(tmp_path: Path) -> None:
    channel, proc = await _started(tmp_path, "exit 3")
    assert await proc.wait() == 3
    assert await channel.next_frame(10) is None
    with pytest.raises(ConnectionError):
        # A pipe holds 64 KiB: the write fails at once or once the pipe is known to have no reader.
        for _ in range(4):
            await channel.write(b"x" * (64 << 10))
    await channel.close()


async def test_close_wakes_a_waiting_read(tmp_path: Path) -> None:
    channel, proc = await _started(tmp_path, "read -r l")
    reading = asyncio.ensure_future(channel.next_frame(30))
    await asyncio.sleep(0)
    await channel.close()
    assert await asyncio.wait_for(reading, 5) is None
    await proc.wait()


def test_make_refuses_what_is_not_a_fifo(tmp_path: Path) -> None:
    pipes = HostPipes(tmp_path, "/inside")
    pipes.make()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 3 and all(stat.S_ISFIFO((tmp_path / n).stat().st_mode) for n in names)
    assert all(stat.S_IMODE((tmp_path / n).stat().st_mode) == 0o666 for n in names)
    assert pipes.argv(["bash"])[-4:] == [*(f"/inside/{n}" for n in names), "bash"]
    pipes.close()
    assert not list(tmp_path.iterdir())
    # A name taken already (by anything) is an error, never opened.
    other = HostPipes(tmp_path, "/inside")
    victim = tmp_path / (other.inside[0].rsplit("/", 1)[1])
    os.symlink("/etc/passwd", victim)
    with pytest.raises(OSError):
        other.make()
    assert victim.is_symlink(), "what was there is left alone"
