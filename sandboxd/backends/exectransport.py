"""The port an exec-capable backend implements for sandboxd.backends.session:
one process stream into one sandbox (``ExecTransport``), the frames it
reads, and the hooks around it (``Spawn`` for cleanup that outlives a
cancelled exec, ``Explain`` for naming the limit a command hit)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from sandboxd.backends.base import ExecEvent, ExecOutcome, ExecResult, OutputChunk
from sandboxd.backends.shell import Tree
from sandboxd.errors import BackendError

Frame = tuple[int, bytes]
"""(stream, data): 1 = stdout, 2 = stderr."""

Spawn = Callable[[Coroutine[Any, Any, None]], None]
"""Runs cleanup that must outlive a cancelled exec (the backend owns the task)."""

Explain = Callable[[ExecResult], ExecResult]
"""Names the limit behind a command's result, if one was hit."""


def unchanged(result: ExecResult) -> ExecResult:
    """An ``Explain`` for a backend that names no limits here."""
    return result


class ExecTransport(Protocol):
    """One process stream into one sandbox, opened once, and the few calls
    around it that exec needs. Killing and liveness reach the sandbox by
    other ways than the stream, so they work while (or after) it is stuck."""

    @property
    def clock(self) -> bool:
        """Whether kill() needs the sandbox's clock (Tree.since) to tell a
        session command's processes from earlier commands' in the shell's tree."""
        ...

    async def open(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, stdin: bool) -> None:
        """Starts ``argv`` in ``cwd`` with extra ``env``, its stdout and stderr
        (and stdin, if asked) on this stream, as the root of a process tree
        kill() can find whole. Raises the backend's errors."""
        ...

    async def write(self, data: bytes) -> None:
        """Sends bytes to the process's stdin; raises ConnectionError,
        OSError or BackendError when the stream is gone."""
        ...

    async def close_stdin(self) -> None:
        """Ends the process's stdin; output keeps flowing."""
        ...

    async def read(self, timeout: float) -> Frame | TimeoutError | None:
        """The next output frame; None at the end of the stream; TimeoutError
        when none came within ``timeout`` (a frame is never cut in half)."""
        ...

    async def exit_status(self) -> tuple[int | None, str]:
        """After the stream ended: the process's exit code (None if unknown
        or still running) and the transport's own failure message, or ""."""
        ...

    async def kill(self, tree: Tree) -> None:
        """SIGKILLs every process of ``tree`` in this stream, however it
        detached or changed its environment; quiet when the sandbox is gone
        (that ends them too)."""
        ...

    async def settle(self) -> None:
        """After a session command ended by itself: what it left running is
        no longer the next command's (a later kill spares it)."""
        ...

    async def alive(self) -> bool:
        """Whether the sandbox still runs and is not on its way out (True
        when the backend cannot tell). Only asked when something went wrong."""
        ...

    def watch_limits(self) -> Explain:
        """Called as a command starts; returns what names the limit (memory,
        processes, files, disk) its result hit, read against this moment."""
        ...

    async def close(self) -> None:
        """Closes the stream; idempotent, and safe before open. Called after
        the last kill."""
        ...


async def stdout_once_exited(
    events: AsyncIterator[ExecEvent], failed: str, error: type[BackendError]
) -> bytes:
    """A command's stdout, once it has exited 0; ``error`` saying ``failed``
    and why otherwise (the backends' own steps: resets, process listings)."""
    out, result = b"", None
    async for event in events:
        if isinstance(event, OutputChunk) and event.stream == 1:
            out += event.data
        elif isinstance(event, ExecResult):
            result = event
    if result is None or result.outcome is not ExecOutcome.EXITED or result.exit_code != 0:
        why = "no result" if result is None else f"{result.outcome.name} {result.exit_code} {result.detail}"
        raise error(f"{failed}: {why}")
    return out
