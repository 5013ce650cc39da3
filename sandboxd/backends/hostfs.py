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
A path below the root is opened with one openat2 call (RESOLVE_BENEATH, no
links) where the kernel has it, else one component at a time.

An entry that is gone (or became something else) since it was listed is
left out, as if it had been deleted first; one that is there but cannot be
read exactly (a write lease held on it, an I/O error, no descriptor left)
fails the call naming it (Unreadable): a snapshot never answers OK without
it. A file that grows while it is read is read as of its open, as ``cat``
would: the size it had then.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
import time
from collections.abc import Callable, Iterable, Iterator

from sandboxd.backends import hostmaps
from sandboxd.backends.hostread import CHUNK_BYTES as CHUNK_BYTES
from sandboxd.backends.hostread import (
    FILE_FLAGS,
    gone_or_raise,
    read_chunks,
    read_fd,
    read_regular,
    unreadable,
)
from sandboxd.backends.hostread import LARGE as LARGE
from sandboxd.backends.hostread import Large as Large
from sandboxd.backends.hostread import Unreadable as Unreadable
from sandboxd.backends.layout import WORKSPACE

OnDir = Callable[[int, str], None]

Record = tuple[str, int, int, str, str, str, str, int, int, int]
"""(kind, mode, size, mtime, ctime, path, target, links, uid, gid) as the
in-sandbox listing prints the first seven: kind as find's %y, times as its
%T@ (so either source's stamps compare equal), path relative to the
workspace, target for links; links is the inode's link count (a file with
several names changes under all of them); uid and gid as the kernel has them."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
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
    """The Record of an entry's stat, its stamps equal to what the in-sandbox listing prints."""
    return (
        _KINDS.get(stat.S_IFMT(st.st_mode), "?"),
        st.st_mode & 0o7777,
        st.st_size,
        find_time(st.st_mtime_ns),
        find_time(st.st_ctime_ns),
        path,
        target,
        st.st_nlink,
        st.st_uid,
        st.st_gid,
    )


class HostWorkspace:
    """An open workspace directory; close() when done. Thread-safe: every
    call works on descriptors of its own below the root's."""

    def __init__(self, fd: int, proc: int = -1, where: str = WORKSPACE) -> None:
        """``proc``: a /proc/<pid> directory of the container's init
        (owned: closed with the view), -1 where its processes are not seen;
        ``where``: the workspace's path as those processes see it."""
        self.fd = fd
        self.proc = proc
        self.where = where

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
                os.close(proc)
                return None
            fd = os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
            try:
                # The view keeps the process's entry: its mappings are read through it.
                view = cls(_open_dirs(fd, workspace.strip("/")), proc, workspace)
            finally:
                os.close(fd)
        except OSError:
            os.close(proc)
            return None
        return view

    def close(self) -> None:
        """Closes the root descriptor (and the process's); errors (already closed) are ignored."""
        for fd in (self.fd, self.proc):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.proc = -1

    def mapped(self) -> frozenset[str] | None:
        """Files (relative paths) that a process of the sandbox has mapped
        shared and writable now (sandboxd.backends.hostmaps); None if that
        cannot be told (no view of its processes, or one unreadable)."""
        if self.proc < 0:
            return None
        try:
            return hostmaps.mapped_files(self.proc, self.where)
        except hostmaps.Unknown:
            return None

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
        except OSError as e:
            gone_or_raise(rel, e)
            return []
        try:
            if on_dir is not None:
                on_dir(fd, rel)
            top = record(os.fstat(fd), rel)
            return [top, *(r for r, _ in self._entries(fd, rel + "/", on_dir, read=False))]
        finally:
            os.close(fd)

    def scan(
        self, on_dir: OnDir | None = None, inline_max: int = 0
    ) -> Iterator[tuple[Record, bytes | Large | None]]:
        """Every entry below the root, as walk() lists them, each regular
        file with its content (None for everything else; LARGE for a file
        above ``inline_max`` bytes, 0: no limit). A file is described
        by the descriptor it is read through, stat before read: a change
        after the stat moves its ctime, so a stamp never vouches for content
        older than itself. ``on_dir`` as for walk()."""
        if on_dir is not None:
            on_dir(self.fd, "")
        return self._entries(self.fd, "", on_dir, read=True, inline_max=inline_max)

    def _entries(
        self, dfd: int, prefix: str, on_dir: OnDir | None, *, read: bool, inline_max: int = 0
    ) -> Iterator[tuple[Record, bytes | Large | None]]:
        with os.scandir(dfd) as it:
            entries = list(it)
        for entry in entries:
            name = entry.name
            path = prefix + name
            # The directory's type field tells files apart without a call.
            if read and entry.is_file(follow_symlinks=False):
                got = _scan_file(dfd, name, path, inline_max)
                if got is not None:
                    yield got
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                gone_or_raise(path, e)
                continue  # gone since it was listed
            kind = stat.S_IFMT(st.st_mode)
            if kind == stat.S_IFLNK:
                try:
                    yield record(st, path, os.readlink(name, dir_fd=dfd)), None
                except OSError as e:
                    gone_or_raise(path, e)  # EINVAL: no longer a link
                    continue
            elif kind == stat.S_IFDIR:
                yield record(st, path), None
                try:
                    cfd = os.open(name, _DIR, dir_fd=dfd)
                except OSError as e:
                    gone_or_raise(path, e)
                    continue  # replaced (by a link, say) since: not followed
                try:
                    if on_dir is not None:
                        on_dir(cfd, path)
                    yield from self._entries(cfd, path + "/", on_dir, read=read, inline_max=inline_max)
                finally:
                    os.close(cfd)
            elif read and kind == stat.S_IFREG:  # became a file since it was listed
                got = _scan_file(dfd, name, path, inline_max)
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
                except OSError as e:
                    gone_or_raise(rel, e)
                    yield rel, None
                    continue
                yield rel, record(st, rel, target)

    # -- reading --------------------------------------------------------------

    def read_files(
        self, paths: Iterable[tuple[str, int]], inline_max: int = 0
    ) -> Iterator[tuple[str, bytes | Large | None]]:
        """(path, content) for each (path, expected size), None for one that
        is no longer a regular file, LARGE for one above ``inline_max``
        bytes (0: no limit). Paths of one directory are best passed
        together: its descriptor is opened once for them."""
        with _Parents(self.fd) as parents:
            for rel, size in paths:
                parent, _, name = rel.rpartition("/")
                pfd = parents.open(parent)
                yield rel, (read_regular(pfd, name, rel, size, inline_max) if pfd >= 0 else None)

    def open_file(self, rel: str) -> HostFile | None:
        """Regular file ``rel`` opened to be read in bounded chunks (None
        when it is gone or no longer a regular file); the caller closes it."""
        parent, _, name = rel.rpartition("/")
        try:
            pfd = _open_dirs(self.fd, parent)
        except OSError as e:
            gone_or_raise(parent, e)
            return None
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=pfd)
        except OSError as e:
            gone_or_raise(rel, e)
            return None
        finally:
            os.close(pfd)
        try:
            st = os.fstat(fd)
        except OSError as e:
            os.close(fd)
            raise unreadable(rel, e) from e
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        return HostFile(fd, record(st, rel))


class HostFile:
    """A workspace file opened for a streamed read; ``record`` describes it
    as it was opened (stat before read, as scan() does)."""

    def __init__(self, fd: int, rec: Record) -> None:
        self.fd = fd
        self.record = rec

    @property
    def size(self) -> int:
        """Its size when it was opened."""
        return self.record[2]

    def chunks(self, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
        """Its content in pieces of at most ``chunk`` bytes (read_chunks)."""
        return read_chunks(self.fd, self.size, self.record[5], chunk)

    def close(self) -> None:
        """Closes the descriptor (idempotent)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class _Parents:
    """The directory a run of paths lies in, opened once for the run (sorted
    paths keep a directory's entries together)."""

    def __init__(self, root: int) -> None:
        self._root = root
        self._path: str | None = None
        self._fd = -1

    def open(self, rel: str) -> int:
        """A descriptor of directory ``rel``; -1 if it is gone (Unreadable if
        it is there but cannot be opened)."""
        if rel != self._path:
            self.close()
            self._path = rel
            try:
                self._fd = _open_dirs(self._root, rel)
            except OSError as e:
                gone_or_raise(rel, e)
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
    """A new descriptor of directory ``rel`` below ``fd``, opened without
    following links ("" or ".": ``fd`` itself): one openat2 call that the
    kernel keeps beneath ``fd`` where it has it, else one component at a time."""
    parts = rel.split("/") if rel and rel != "." else []
    for part in parts:
        if part in ("", ".", ".."):
            raise OSError(errno.EINVAL, f"refusing path component {part!r}")
    if parts and _openat2 is not None:
        got = _openat2(fd, rel)
        if got is not None:
            return got
    cur = os.open(".", _DIR, dir_fd=fd)
    for part in parts:
        try:
            nxt = os.open(part, _DIR, dir_fd=cur)
        finally:
            os.close(cur)
        cur = nxt
    return cur


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


# openat2(2) (Linux 5.6; the syscall number is 437 on x86_64 and aarch64)
# resolves a whole path in the kernel: RESOLVE_BENEATH keeps it below the
# descriptor, RESOLVE_NO_SYMLINKS refuses any link on the way (ELOOP), so
# nothing the sandbox plants can lead out, without a call per component.
_RESOLVE = 0x08 | 0x04 | 0x02  # RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())


def _load_openat2() -> Callable[[int, str], int | None] | None:
    if _SYS_OPENAT2 is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    disabled = False

    def openat2(dfd: int, rel: str) -> int | None:
        """A descriptor of directory ``rel``; None: fall back to the walk."""
        nonlocal disabled
        if disabled:
            return None
        how = _OpenHow(_DIR, 0, _RESOLVE)
        got = syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dfd),
            ctypes.c_char_p(os.fsencode(rel)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if got >= 0:
            return int(got)
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.E2BIG, errno.EPERM):
            # An older kernel, or a seccomp filter that refuses the call:
            # the component walk does the same, with more calls.
            disabled = True
            return None
        if err == errno.EAGAIN:
            return None  # a rename raced the lookup: walk instead
        raise OSError(err, os.strerror(err), rel)

    return openat2


_openat2 = _load_openat2()


def _read_at(dfd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _scan_file(dfd: int, name: str, path: str, inline_max: int = 0) -> tuple[Record, bytes | Large] | None:
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dfd)
    except OSError as e:
        gone_or_raise(path, e)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None  # replaced since it was listed
        return record(st, path), read_fd(fd, st.st_size, inline_max, exact=True)
    except OSError as e:
        raise unreadable(path, e) from e
    finally:
        os.close(fd)
