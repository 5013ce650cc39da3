"""A session shell's stdio on FIFOs in its sandbox's inbox, read and written
by the control plane directly: no engine, no containerd shim, no multiplexed
frames between a command and its output.

A session's commands are small writes and small reads; through the engine
each one crossed dockerd and the shim both ways, which cost more CPU than the
control plane's own work for it. The shell is still started by an engine exec
(so the engine knows its exit status and the cell contains it), but before it
runs it moves its stdin, stdout and stderr onto three FIFOs the control plane
made in the sandbox's inbox and holds open, then says so on the engine stream
(REDIRECT); from then on the engine stream carries nothing.

The inbox is mounted read-only, so nothing in the sandbox can swap a FIFO for
something else (a FIFO on a read-only mount can still be opened and written).
The names are unlinked as soon as both ends are open. Only for sandboxes whose
processes share the host's kernel (runc, crun): gVisor serves its own pipes,
not the host's FIFOs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from sandboxd.errors import TransientBackendError

# The engine stream's last line once the shell's stdio is on the FIFOs; fd 9
# is the engine's stdout, kept for that line only.
REDIRECT = 'exec 9>&1 <"$1" >"$2" 2>"$3" || exit 125; echo ready >&9; exec 9>&-; shift 3; exec "$@"'
READY = b"ready"

# Output read from the FIFOs but not yet taken by the session: past this, the
# pipes are left unread (the writer blocks) until the session catches up.
_HIGH_WATER = 1 << 20


class HostPipes:
    """Three FIFOs (stdin, stdout, stderr) made in a host directory that the
    sandbox sees at ``inside``, and the control plane's ends of them."""

    def __init__(self, host_dir: Path, inside: str) -> None:
        self._dir = host_dir
        name = f".pipe-{secrets.token_hex(8)}"
        self._names = [f"{name}.{n}" for n in range(3)]
        self.inside = [f"{inside}/{n}" for n in self._names]
        """The FIFOs' paths inside the sandbox (stdin, stdout, stderr)."""
        self._fds: list[int] = []
        self._made: list[Path] = []

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` with its stdio moved onto the FIFOs first (see REDIRECT)."""
        return ["sh", "-c", REDIRECT, "sh", *self.inside, *argv]

    def make(self) -> None:
        """Makes the FIFOs and opens our ends without blocking: stdin read-write
        (so the shell's open for reading finds a writer; the read side is
        dropped once the shell has its own, see channel), stdout and stderr
        read-only. Raises OSError."""
        try:
            for n, name in enumerate(self._names):
                path = self._dir / name
                os.mkfifo(path, 0o600)
                self._made.append(path)
                # Whoever the sandbox runs as opens them; only this sandbox sees the directory.
                os.chmod(path, 0o666)
                flags = os.O_RDWR if n == 0 else os.O_RDONLY
                fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
                self._fds.append(fd)
                if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, f"{path} is not a FIFO")
        except OSError:
            self.close()
            raise

    def channel(self) -> PipeChannel:
        """Our ends as a channel, once the shell has opened its own (READY);
        then the names can go (unlink). The write side is reopened
        write-only, so a shell that is gone makes writes fail (EPIPE) rather
        than fill the pipe."""
        rw, out, err = self._fds
        try:
            stdin = os.open(f"/proc/self/fd/{rw}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise TransientBackendError(f"cannot reopen the session's stdin pipe: {e}") from e
        os.close(rw)
        self._fds = []
        return PipeChannel(stdin, out, err)

    def unlink(self) -> None:
        """Removes the names of the FIFOs made here (open ends keep working)."""
        made, self._made = self._made, []
        for path in made:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def close(self) -> None:
        """Closes our ends and removes the names (a shell that did not start)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.unlink()


class PipeChannel:
    """A session shell's stdio on FIFOs, with the engine channel's calls:
    (stream, bytes) frames in, stdin bytes out."""

    def __init__(self, stdin: int, stdout: int, stderr: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._stdin: int | None = stdin
        self._readers = {1: stdout, 2: stderr}
        self._paused: set[int] = set()
        self._frames: collections.deque[tuple[int, bytes]] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        for stream, fd in self._readers.items():
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._readable, stream)

    def _readable(self, stream: int) -> None:
        fd = self._readers.get(stream)
        if fd is None:
            return
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._frames.append((stream, data))
            self._buffered += len(data)
            if self._buffered > _HIGH_WATER:
                self._loop.remove_reader(fd)
                self._paused.add(stream)
        else:
            self._drop(stream)
        self._wake()

    def _drop(self, stream: int) -> None:
        fd = self._readers.pop(stream)
        if stream not in self._paused:
            self._loop.remove_reader(fd)
        self._paused.discard(stream)
        os.close(fd)

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _take(self) -> tuple[int, bytes]:
        frame = self._frames.popleft()
        self._buffered -= len(frame[1])
        if self._paused and self._buffered <= _HIGH_WATER // 2:
            for stream in self._paused:
                self._loop.add_reader(self._readers[stream], self._readable, stream)
            self._paused.clear()
        return frame

    async def next_frame(self, timeout: float) -> tuple[int, bytes] | TimeoutError | None:
        """The next frame; None once both streams ended; TimeoutError when
        none came within ``timeout``."""
        deadline = self._loop.time() + max(timeout, 0)
        # One stream's end wakes us too, with the other still open: wait on.
        while not self._frames and self._readers:
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return TimeoutError()
            waiter = self._loop.create_future()
            self._waiter = waiter
            timer = self._loop.call_later(remaining, self._wake)
            try:
                await waiter
            finally:
                timer.cancel()
                if self._waiter is waiter:
                    self._waiter = None
        return self._take() if self._frames else None

    async def read_frame(self) -> tuple[int, bytes] | None:
        """The next frame, however long it takes; None at the end."""
        while True:
            frame = await self.next_frame(3600.0)
            if not isinstance(frame, TimeoutError):
                return frame

    async def write(self, data: bytes) -> None:
        """Writes all of ``data`` to the shell's stdin, waiting while the pipe
        is full; ConnectionError when the shell (every reader) is gone."""
        view = memoryview(data)
        while view:
            fd = self._stdin
            if fd is None:
                raise ConnectionError("the session's stdin is closed")
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                await self._writable(fd)
            # EPIPE arrives as BrokenPipeError, a ConnectionError.

    async def _writable(self, fd: int) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self._loop.add_writer(fd, wake)
        try:
            await ready
        finally:
            self._loop.remove_writer(fd)

    def close_stdin(self) -> None:
        """Closes our write end: the shell reads EOF."""
        fd, self._stdin = self._stdin, None
        if fd is not None:
            os.close(fd)

    async def close(self) -> None:
        """Closes every end; a waiting read returns None."""
        self.close_stdin()
        for stream in list(self._readers):
            self._drop(stream)
        self._frames.clear()
        self._buffered = 0
        self._wake()
