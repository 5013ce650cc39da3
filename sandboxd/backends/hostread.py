"""Reading one workspace file in place (sandboxd.backends.hostfs): whole
when small, in bounded pieces when large, as of its open when it grows
meanwhile (as ``cat`` would), and what the errors of an open or a read
mean: gone since it was listed (left out) or there but unreadable (the
call fails naming it)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

from sandboxd.backends.layout import WORKSPACE
from sandboxd.errors import BackendError, FailedPrecondition

FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

CHUNK_BYTES = 1 << 20
"""What one streamed read takes at most (HostFile.chunks)."""
# One read(2) returns at most this on Linux, whatever was asked: a short
# read of a file above it is not its end.
_MAX_READ = 0x7FFFF000


class Large:
    """Stands for the content of a regular file above the caller's
    ``inline_max``, left unread: stream it with HostWorkspace.open_file."""

    __slots__ = ()


LARGE = Large()

# What an open or stat of a listed name answers when the name is gone or now
# names something else (a link: ELOOP; a socket: ENXIO; a directory where a
# file was: EISDIR), or the way to it is refused (a link or ".." on it:
# EXDEV from openat2, EINVAL from the component walk): the entry changed
# since it was listed, or is none of the workspace's; nothing was lost.
_GONE = frozenset(
    {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EXDEV, errno.EINVAL}
)


class Unreadable(FailedPrecondition):
    """A workspace entry that is there but cannot be read exactly; its
    message names it and says what to do."""


def unreadable(path: str, e: OSError) -> Unreadable:
    """The Unreadable for ``path`` (relative to the workspace) failing with ``e``."""
    where = f"{WORKSPACE}/{path}" if path else WORKSPACE
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
        return Unreadable(
            f"{where} is held under a write lease (fcntl F_SETLEASE) by a process in the sandbox, so it "
            "cannot be read without breaking the lease; release the lease (F_UNLCK) or close the file, "
            "then retry"
        )
    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return Unreadable(f"{where} could not be opened ({e.strerror}): the host ran short; retry")
    return Unreadable(f"{where} could not be read ({e.strerror or e}); nothing was captured from it")


def gone_or_raise(path: str, e: OSError) -> None:
    """Returns if ``e`` says the entry is gone or changed kind; else raises Unreadable."""
    if e.errno not in _GONE:
        raise unreadable(path, e) from e


def read_regular(dfd: int, name: str, path: str, size: int, inline_max: int = 0) -> bytes | Large | None:
    """The content of regular file ``name`` (``path`` in the workspace),
    read with one call when it still has about the ``size`` it was listed
    with (LARGE above ``inline_max``). No fstat unless it turns out longer:
    what else a name can be here fails on read (a directory: EISDIR; a FIFO
    opened non-blocking reads empty or EAGAIN; a socket does not open;
    devices do not open on the nodev workspace), so the check would cost a
    call per file for nothing; a read that fails is told apart by one then."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dfd)
    except OSError as e:
        gone_or_raise(path, e)
        return None
    try:
        return read_fd(fd, size, inline_max)
    except OSError as e:
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            regular = True
        if not regular:
            return None  # a directory or FIFO now stands there
        raise unreadable(path, e) from e
    finally:
        os.close(fd)


def read_fd(fd: int, size: int, limit: int = 0, *, exact: bool = False) -> bytes | Large:
    """The content, LARGE (left unread) above ``limit`` bytes (0: no
    limit). ``exact``: ``size`` is its fstat size, and it is read up to that
    (a file appended to meanwhile is read as of the fstat, as ``cat``
    would); else ``size`` is a hint, and a file longer than it is read up
    to the size an fstat then gives."""
    if limit and size > limit:
        return LARGE
    want = min(size if exact else (size + 1 if size else 65536), _MAX_READ)
    first = os.read(fd, want) if want else b""
    if len(first) < want or (exact and len(first) == size):
        return first  # a short read (below the per-call cap) of a regular file is its end
    end = size if exact else os.fstat(fd).st_size
    if limit and end > limit:
        return LARGE  # it grew since its size was taken: the caller streams it
    parts = [first]
    total = len(first)
    while total < end and (chunk := os.read(fd, min(CHUNK_BYTES, end - total))):
        total += len(chunk)
        parts.append(chunk)
    return b"".join(parts)


def read_chunks(fd: int, size: int, path: str, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The first ``size`` bytes (its size when opened) of the regular file
    open as ``fd``, in pieces of at most ``chunk`` bytes: a file appended to
    meanwhile is read as of its open, as ``cat`` would. FailedPrecondition
    naming ``path`` if it ends before that (it was truncated while read:
    what was read is then neither the old content nor the new)."""
    offset = 0
    try:
        while offset < size and (data := os.pread(fd, min(chunk, _MAX_READ, size - offset), offset)):
            offset += len(data)
            yield data
        now = os.fstat(fd).st_size if offset < size else size
    except OSError as e:
        raise BackendError(f"reading {WORKSPACE}/{path} in place failed after {offset} bytes: {e}") from e
    if offset < size:
        raise FailedPrecondition(
            f"{WORKSPACE}/{path} shrank while it was being snapshotted ({size} bytes when opened, {offset} "
            f"read, {now} now); retry"
        )
