"""Change journals for workspaces read in place (sandboxd.backends.hostfs):
inotify watches on every directory of a workspace record which paths were
touched since the last snapshot, so the next one looks at those paths only;
its cost follows the change, not the size of the workspace.

One inotify instance serves every workspace (instances are a scarce per-user
resource; watches are plentiful). A journal that may have missed something
says so (``take`` returns None) and the caller walks the whole workspace
instead: when the kernel's event queue overflowed, a watch could not be
added (the per-user limit), or a watched directory was moved (its watches
would report under the old name).

inotify does not report writes through a shared memory mapping, and a
filesystem may update times for them lazily; so a file closed after being
opened for writing (IN_CLOSE_WRITE) is read again whatever its stamps say.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import struct
import threading
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000

# A journal tracking more paths than this gives up (the next snapshot walks):
# its memory and the events' cost stay bounded under a file storm.
MAX_TOUCHED = 50_000

WATCHED = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF
)  # fmt: skip
_EVENT = struct.Struct("iIII")


@dataclass
class Changes:
    """Paths (relative to the workspace) touched since the journal was last
    taken. ``written``: files closed after being opened for writing (read
    again whatever their stamps say); ``fresh``: directories created or moved
    in (walked whole: what was made in them before they were watched left
    no event)."""

    touched: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    fresh: set[str] = field(default_factory=set)


class Journal:
    """The change journal of one workspace. Watches are added with
    ``watch`` (from any thread); events are applied on the event loop's
    thread (or by ``take``, which drains what is pending first)."""

    def __init__(self, watcher: Watcher) -> None:
        self._watcher = watcher
        self._changes = Changes()
        self.broken = False
        self.wds: set[int] = set()

    def watch(self, dir_fd: int, rel: str) -> None:
        """Watches the directory open as ``dir_fd`` (``rel`` its path in the
        workspace, "" for the top). Call before listing it, so nothing
        changed after the listing goes unrecorded."""
        self._watcher.add(self, dir_fd, rel)

    def take(self) -> Changes | None:
        """What changed since the last take (and starts afresh); None if the
        journal cannot vouch for it (walk the workspace instead)."""
        self._watcher.drain()
        changes, self._changes = self._changes, Changes()
        return None if self.broken else changes

    def _give_up(self) -> None:
        self.broken = True
        self._changes = Changes()

    def note(self, rel: str, mask: int) -> None:
        """Records one event on ``rel``; a directory moved away or too many paths break the journal."""
        c = self._changes
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT):
            if mask & IN_MOVE_SELF:
                self.broken = True  # the watches below it now report under a stale name
            return
        if mask & IN_MOVED_FROM and mask & IN_ISDIR:
            self.broken = True
            return
        c.touched.add(rel)
        parent = rel.rpartition("/")[0]
        if mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO):
            c.touched.add(parent)  # its entry list, so its times, changed
        if mask & IN_CLOSE_WRITE:
            c.written.add(rel)
        if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            c.fresh.add(rel)
        if len(c.touched) > MAX_TOUCHED:
            self.broken = True

    def close(self) -> None:
        """Stops recording; a closed journal vouches for nothing any more."""
        self.broken = True
        self._watcher.forget(self)


class Watcher:
    """The one inotify instance. Not started until a first watch is added;
    ``start`` hooks it to an event loop (its reader drains as events come)."""

    def __init__(self) -> None:
        self._fd = -1
        self._lock = threading.Lock()
        self._wds: dict[int, tuple[Journal, str]] = {}
        self._libc: ctypes.CDLL | None = None
        self.available = True

    def journal(self) -> Journal:
        """A new, empty journal fed by this watcher."""
        return Journal(self)

    def _ensure(self) -> int:
        if self._fd < 0 and self.available:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            except (OSError, AttributeError):
                fd = -1
            if fd < 0:
                log.warning("no inotify here: snapshots walk whole workspaces")
                self.available = False
                return -1
            self._libc, self._fd = libc, fd
        return self._fd

    @property
    def fd(self) -> int:
        """The inotify descriptor, made on first use; -1 where inotify is not available."""
        return self._ensure()

    def add(self, journal: Journal, dir_fd: int, rel: str) -> None:
        """Watches ``dir_fd`` for ``journal``; one that cannot be watched (no inotify, limit) is broken."""
        with self._lock:
            fd = self._ensure()
            if fd < 0 or journal.broken:
                journal.broken = True
                return
            assert self._libc is not None
            wd = self._libc.inotify_add_watch(fd, f"/proc/self/fd/{dir_fd}".encode(), WATCHED | IN_ONLYDIR)
            if wd < 0:
                err = ctypes.get_errno()
                if err == errno.ENOSPC:
                    log.warning("inotify watch limit reached: snapshots of this sandbox walk its workspace")
                journal.broken = True
                return
            self._wds[wd] = (journal, rel)
            journal.wds.add(wd)

    def forget(self, journal: Journal) -> None:
        """Removes the journal's watches; events still queued for them are ignored."""
        with self._lock:
            self._forget_locked(journal)

    def _forget_locked(self, journal: Journal) -> None:
        for wd in journal.wds:
            if self._wds.get(wd, (None,))[0] is journal:
                del self._wds[wd]
                if self._libc is not None and self._fd >= 0:
                    self._libc.inotify_rm_watch(self._fd, wd)
        journal.wds.clear()

    def drain(self) -> None:
        """Applies every pending event to its journal."""
        if self._fd < 0:
            return
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError as e:
                log.warning("inotify read failed (%s): journals are distrusted", e)
                self._break_all()
                return
            if not data:
                return
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        pos = 0
        with self._lock:
            while pos + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, pos)
                raw = data[pos + _EVENT.size : pos + _EVENT.size + size]
                pos += _EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    self._break_all_locked()
                    continue
                owner = self._wds.get(wd)
                if owner is None:
                    continue
                journal, rel = owner
                if mask & IN_IGNORED:  # its directory is gone (deleted, unmounted)
                    del self._wds[wd]
                    journal.wds.discard(wd)
                    continue
                name = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                path = f"{rel}/{name}" if rel and name else (name or rel)
                if path:
                    journal.note(path, mask)
                elif mask & IN_MOVE_SELF:
                    journal.broken = True
                if journal.broken and journal.wds:
                    # Nothing it records counts any more: stop the events.
                    self._forget_locked(journal)
                    journal._give_up()

    def _break_all(self) -> None:
        with self._lock:
            self._break_all_locked()

    def _break_all_locked(self) -> None:
        for journal in {j for j, _ in self._wds.values()}:
            journal.broken = True
            self._forget_locked(journal)
            journal._give_up()

    def close(self) -> None:
        """Closes the inotify instance and forgets every watch; a later ``add`` opens a new one."""
        with self._lock:
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
            self._fd = -1
            self._wds.clear()
