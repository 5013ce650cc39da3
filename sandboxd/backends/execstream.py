"""Pieces of the exec-stream protocol shared by every exec-capable backend:
capping captured output, finding the end marker a session prints after each
command (with the sandbox's clock after the exit status, where asked),
taking a stream's first line (its root's pid), and wording why a command was
stopped."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from sandboxd.backends.base import ExecOutcome, ExecSpec

StreamFrame = tuple[int, bytes] | TimeoutError | None
"""What an exec transport's read gives: (stream, bytes), a timeout, or the end."""


class OutputBudget:
    """Caps captured output and remembers why the command was stopped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.truncated = False

    def take(self, data: bytes) -> bytes:
        room = self.limit - self.used
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        self.used += len(data)
        return data


class MarkerSplitter:
    """Passes a stream's bytes through until the end marker; holds back a
    possible partial marker at the edge of a frame."""

    def __init__(self, marker: bytes) -> None:
        self._marker = marker
        self._pending = b""
        self._tail = b""
        self.done = False
        self.exit_code: int | None = None
        self.extra = b""
        """What followed the exit status on the marker's line."""

    def feed(self, data: bytes) -> bytes:
        if self.done:
            if self.exit_code is None:
                self._parse_code(data)
            return b""
        buf = self._pending + data
        idx = buf.find(self._marker)
        if idx < 0:
            # Hold back only a tail that could be the start of the marker, so
            # output is streamed as soon as it is known not to be part of it.
            keep = 0
            for k in range(min(len(self._marker) - 1, len(buf)), 0, -1):
                if buf.endswith(self._marker[:k]):
                    keep = k
                    break
            self._pending = buf[len(buf) - keep :] if keep else b""
            return buf[: len(buf) - keep]
        self._pending = b""
        self.done = True
        self._tail = b""
        self._parse_code(buf[idx + len(self._marker) :])
        return buf[:idx]

    def _parse_code(self, data: bytes) -> None:
        self._tail += data
        if b"\n" not in self._tail:
            return
        code, _, self.extra = self._tail.split(b"\n", 1)[0].strip().partition(b" ")
        if code:
            try:
                self.exit_code = int(code)
            except ValueError:
                self.exit_code = -1
        else:
            self.exit_code = 0


class FirstLine:
    """Takes a stream's first line off it (``value``, without the newline)
    and passes the rest through."""

    def __init__(self) -> None:
        self._pending = b""
        self.value: bytes | None = None

    def feed(self, data: bytes) -> bytes:
        """The bytes of ``data`` after the first line."""
        if self.value is not None:
            return data
        buf = self._pending + data
        end = buf.find(b"\n")
        if end < 0:
            self._pending = buf
            return b""
        self._pending = b""
        self.value = buf[:end]
        return buf[end + 1 :]


class RootPidLine:
    """Takes the first stdout line (REAPER's pid of the command's root) off an
    exec's frames, so that the user never sees it and TREE_KILL knows whom to
    spare."""

    def __init__(self) -> None:
        self._first: FirstLine | None = FirstLine()
        self.pid = 0

    async def read(
        self, next_frame: Callable[[float], Awaitable[StreamFrame]], timeout: float
    ) -> StreamFrame:
        """The next frame from ``next_frame`` with the pid line taken out,
        within ``timeout`` seconds overall."""
        deadline = time.monotonic() + timeout
        while True:
            frame = await next_frame(timeout)
            if self._first is None or not isinstance(frame, tuple) or frame[0] != 1:
                return frame
            data = self._first.feed(frame[1])
            if self._first.value is not None:
                value, self._first = self._first.value, None
                self.pid = int(value) if value.isdigit() else 0
            if data:
                return 1, data
            # Only the pid line came: the caller's deadline still holds.
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return TimeoutError()


def stop_detail(outcome: ExecOutcome, spec: ExecSpec) -> str:
    if outcome is ExecOutcome.TIMED_OUT:
        return f"killed the process tree after {spec.timeout:g}s"
    return f"output passed {spec.output_limit} bytes; killed the process tree"
