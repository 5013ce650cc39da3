"""A sandbox's workspace as the control plane's host sees it (Linux): listed
and read in place, without a process in the sandbox or a byte through the
engine. A snapshot of 50 MB then costs what reading 50 MB of page cache
costs, instead of a tar streamed through an exec.

The sandbox owns these files and may change them while we look, so nothing
here resolves a path from the top: every directory is opened relative to its
parent's descriptor with O_NOFOLLOW, every file with O_NOFOLLOW and
O_NONBLOCK (a FIFO swapped in cannot block us) and checked to be a regular
file on the descriptor that is read. A symlink, however placed, is read as a
link and never followed, so nothing outside the workspace can be reached.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator

from sandboxd.backends.base import WORKSPACE

OnDir = Callable[[int, str], None]

Record = tuple[str, int, int, str, str, str, str, int]
"""(kind, mode, size, mtime, ctime, path, target, links) as the in-sandbox
listing prints the first seven: kind as find's %y, times as its %T@ (so
either source's stamps compare equal), path relative to the workspace,
target for links; links is the inode's link count (a file with several
names changes under all of them)."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = {
    stat.S_IFREG: "f",
    stat.S_IFDIR: "d",
    stat.S_IFLNK: "l",
    stat.S_IFIFO: "p",
    stat.S_IFSOCK: "s",
    stat.S_IFCHR: "c",
    stat.S_IFBLK: "b",
}


def find_time(ns: int) -> str:
    """A timestamp as find's %T@ / %C@ print it (ten fractional digits)."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}0"


def record(st: os.stat_result, path: str, target: str = "") -> Record:
    return (
        _KINDS.get(stat.S_IFMT(st.st_mode), "?"),
        st.st_mode & 0o7777,
        st.st_size,
        find_time(st.st_mtime_ns),
        find_time(st.st_ctime_ns),
        path,
        target,
        st.st_nlink,
    )


class HostWorkspace:
    """An open workspace directory; close() when done. Thread-safe: every
    call works on descriptors of its own below the root's."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, pid: int, container_id: str, workspace: str = WORKSPACE) -> HostWorkspace | None:
        """The workspace of the container whose init process is host pid
        ``pid``; None when this process cannot see it (another pid namespace,
        not privileged, the pid now belongs to something else)."""
        try:
            proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            # Opened through the same /proc entry: if the pid were reused
            # after this check, the entry would answer ESRCH, not another
            # process's files.
            if container_id not in _read_at(proc, "cgroup").decode(errors="replace"):
                return None
            fd = os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
            try:
                return cls(_open_dirs(fd, workspace.strip("/")))
            finally:
                os.close(fd)
        except OSError:
            return None
        finally:
            os.close(proc)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def __enter__(self) -> HostWorkspace:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- listing --------------------------------------------------------------

    def walk(self, on_dir: OnDir | None = None) -> tuple[float, list[Record]]:
        """(the host clock before the walk, every entry below the root).
        ``on_dir(fd, path)`` is called for each directory before it is
        listed (the top one as "")."""
        when = time.time()
        if on_dir is not None:
            on_dir(self.fd, "")
        return when, [r for r, _ in self._entries(self.fd, "", on_dir, read=False)]

    def walk_dir(self, rel: str, on_dir: OnDir | None = None) -> list[Record]:
        """The entry ``rel`` and everything below it ([] if it is gone or no
        longer a directory)."""
        try:
            fd = _open_dirs(self.fd, rel)
        except OSError:
            return []
        try:
            if on_dir is not None:
                on_dir(fd, rel)
            top = record(os.fstat(fd), rel)
            return [top, *(r for r, _ in self._entries(fd, rel + "/", on_dir, read=False))]
        finally:
            os.close(fd)

    def scan(self, on_dir: OnDir | None = None) -> Iterator[tuple[Record, bytes | None]]:
        """Every entry below the root, as walk() lists them, each regular
        file with its content (None for everything else). A file is described
        by the descriptor it is read through, stat before read: a change
        after the stat moves its ctime, so a stamp never vouches for content
        older than itself. ``on_dir`` as for walk()."""
        if on_dir is not None:
            on_dir(self.fd, "")
        return self._entries(self.fd, "", on_dir, read=True)

    def _entries(
        self, dfd: int, prefix: str, on_dir: OnDir | None, *, read: bool
    ) -> Iterator[tuple[Record, bytes | None]]:
        with os.scandir(dfd) as it:
            entries = list(it)
        for entry in entries:
            name = entry.name
            path = prefix + name
            # The directory's type field tells files apart without a call.
            if read and entry.is_file(follow_symlinks=False):
                got = _scan_file(dfd, name, path)
                if got is not None:
                    yield got
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            kind = stat.S_IFMT(st.st_mode)
            if kind == stat.S_IFLNK:
                try:
                    yield record(st, path, os.readlink(name, dir_fd=dfd)), None
                except OSError:
                    continue
            elif kind == stat.S_IFDIR:
                yield record(st, path), None
                try:
                    cfd = os.open(name, _DIR, dir_fd=dfd)
                except OSError:
                    continue  # replaced (by a link, say) since: not followed
                try:
                    if on_dir is not None:
                        on_dir(cfd, path)
                    yield from self._entries(cfd, path + "/", on_dir, read=read)
                finally:
                    os.close(cfd)
            elif read and kind == stat.S_IFREG:  # became a file since it was listed
                got = _scan_file(dfd, name, path)
                if got is not None:
                    yield got
            else:
                yield record(st, path), None

    def each_dir(self, rels: Iterable[str], on_dir: OnDir) -> bool:
        """Calls ``on_dir(fd, rel)`` for each directory ``rel`` ("": the
        top); False if one cannot be opened as a directory any more."""
        for rel in rels:
            try:
                fd = _open_dirs(self.fd, rel)
            except OSError:
                return False
            try:
                on_dir(fd, rel)
            finally:
                os.close(fd)
        return True

    def stat_many(self, rels: Iterable[str]) -> Iterator[tuple[str, Record | None]]:
        """(path, record or None if gone) for each path, a link described,
        never followed; best sorted, so that each directory is opened once for
        the paths in it."""
        with _Parents(self.fd) as parents:
            for rel in rels:
                parent, _, name = rel.rpartition("/")
                pfd = parents.open(parent)
                if pfd < 0:
                    yield rel, None
                    continue
                try:
                    st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                    target = os.readlink(name, dir_fd=pfd) if stat.S_ISLNK(st.st_mode) else ""
                except OSError:
                    yield rel, None
                    continue
                yield rel, record(st, rel, target)

    # -- reading --------------------------------------------------------------

    def read_files(self, paths: Iterable[tuple[str, int]]) -> Iterator[tuple[str, bytes | None]]:
        """(path, content) for each (path, expected size), None for one that
        is no longer a regular file. Paths of one directory are best passed
        together: its descriptor is opened once for them."""
        with _Parents(self.fd) as parents:
            for rel, size in paths:
                parent, _, name = rel.rpartition("/")
                pfd = parents.open(parent)
                yield rel, (_read_regular(pfd, name, size) if pfd >= 0 else None)


class _Parents:
    """The directory a run of paths lies in, opened once for the run (sorted
    paths keep a directory's entries together)."""

    def __init__(self, root: int) -> None:
        self._root = root
        self._path: str | None = None
        self._fd = -1

    def open(self, rel: str) -> int:
        """A descriptor of directory ``rel``; -1 if it cannot be opened."""
        if rel != self._path:
            self.close()
            self._path = rel
            with contextlib.suppress(OSError):
                self._fd = _open_dirs(self._root, rel)
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> _Parents:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _open_dirs(fd: int, rel: str) -> int:
    """A new descriptor of directory ``rel`` below ``fd``, opened one
    component at a time without following links ("" or ".": ``fd`` itself)."""
    cur = os.open(".", _DIR, dir_fd=fd)
    for part in rel.split("/") if rel and rel != "." else ():
        if part in ("", ".", ".."):
            os.close(cur)
            raise OSError(f"refusing path component {part!r}")
        try:
            nxt = os.open(part, _DIR, dir_fd=cur)
        finally:
            os.close(cur)
        cur = nxt
    return cur


def _read_at(dfd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _read_regular(dfd: int, name: str, size: int) -> bytes | None:
    """The content of regular file ``name``, read with one call when it still
    has about the ``size`` it was listed with. No fstat: what else a name can
    be here fails on read (a directory: EISDIR; a FIFO opened non-blocking
    reads empty or EAGAIN; a socket does not open; devices do not open on the
    nodev workspace), so the check would cost a call per file for nothing."""
    try:
        fd = os.open(name, _FILE, dir_fd=dfd)
    except OSError:
        return None
    try:
        return _read_fd(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _scan_file(dfd: int, name: str, path: str) -> tuple[Record, bytes] | None:
    try:
        fd = os.open(name, _FILE, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None  # replaced since it was listed
        return record(st, path), _read_fd(fd, st.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_fd(fd: int, size: int) -> bytes:
    want = size + 1 if size else 65536
    first = os.read(fd, want)
    if len(first) < want:
        return first  # a short read of a regular file is its end
    parts = [first]
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)
