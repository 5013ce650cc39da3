"""Change journals for workspaces read in place (sandboxd.backends.hostfs):
inotify watches on every directory of a workspace record which paths were
touched since the last snapshot, so the next one looks at those paths only;
its cost follows the change, not the size of the workspace.

The control plane's watches and instances come out of root's host-wide
inotify limits, which the engine and the rest of the host share, so they
are budgeted (Budget): watches per sandbox and in all, and a few
instances. Each journal gets an instance of its own while there are
instances to spare (then the least busy one is shared): a queue that
overflows breaks only the journals that share it. A journal that may have
missed something says so (``take`` returns None) and the caller walks the
whole workspace instead: when its instance's queue overflowed, a watch
would pass a budget or the kernel's limit, the sandbox made a flood of
events, or a watched directory was moved (its watches would report under
the old name). Each such fall-back is counted by reason (``degraded``).

inotify does not report writes through a shared memory mapping, and a
filesystem may update times for them lazily; so a file closed after being
opened for writing (IN_CLOSE_WRITE) is read again whatever its stamps say,
and files mapped when a snapshot is taken are found apart
(sandboxd.backends.hostmaps).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

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
# Events one journal may take between two snapshots; past it its watches
# go, so a sandbox writing one file in a loop cannot keep its instance's
# queue full for the journals that share it.
MAX_EVENTS = 200_000

WATCHED = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF
)  # fmt: skip
_EVENT = struct.Struct("iIII")
_LIMITS = Path("/proc/sys/fs/inotify")

# Why a journal stopped vouching (the labels of ``Watcher.degraded``).
OVERFLOW = "overflow"
BUDGET = "budget"
LIMIT = "limit"
FLOOD = "flood"
MOVED = "moved"
STORM = "storm"


class Budget(NamedTuple):
    """What the control plane's journals may take of the host's inotify limits."""

    watches_per_sandbox: int
    watches_total: int
    instances: int

    @classmethod
    def from_host(cls, per_sandbox: int = 0, total: int = 0, instances: int = 0) -> Budget:
        """The budget with each 0 derived from the host's limits: half of
        root's watches in all, an eighth of that per sandbox, a quarter of
        its instances (root shares both with the engine and the system)."""
        watches = _limit("max_user_watches", 8192)
        total = total or max(1, watches // 2)
        return cls(
            watches_per_sandbox=min(per_sandbox or max(1, total // 8), total),
            watches_total=total,
            instances=instances or max(1, _limit("max_user_instances", 128) // 4),
        )


def _limit(name: str, default: int) -> int:
    try:
        return max(1, int((_LIMITS / name).read_text().strip()))
    except (OSError, ValueError):
        return default


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

    def __init__(self, watcher: Watcher, instance: _Instance) -> None:
        self._watcher = watcher
        self._instance = instance
        self._changes = Changes()
        self.broken = False
        self.reason = ""
        """Why it broke, for a journal that fell back to walks ("" if closed or whole)."""
        self.wds: set[int] = set()
        self.events = 0
        self.closed = False

    def watch(self, dir_fd: int, rel: str) -> None:
        """Watches the directory open as ``dir_fd`` (``rel`` its path in the
        workspace, "" for the top). Call before listing it, so nothing
        changed after the listing goes unrecorded."""
        self._watcher.add(self, dir_fd, rel)

    def take(self) -> Changes | None:
        """What changed since the last take (and starts afresh); None if the
        journal cannot vouch for it (walk the workspace instead)."""
        self._watcher.drain(self._instance)
        changes, self._changes = self._changes, Changes()
        self.events = 0
        return None if self.broken else changes

    def _give_up(self) -> None:
        self.broken = True
        self._changes = Changes()

    def note(self, rel: str, mask: int) -> str:
        """Records one event on ``rel``; returns why it breaks the journal
        ("" if it does not): a directory moved away, too many paths or events."""
        self.events += 1
        if self.events > MAX_EVENTS:
            return FLOOD
        c = self._changes
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT):
            # A watched directory moved: the watches below it now report under a stale name.
            return MOVED if mask & IN_MOVE_SELF else ""
        if mask & IN_MOVED_FROM and mask & IN_ISDIR:
            return MOVED
        c.touched.add(rel)
        parent = rel.rpartition("/")[0]
        if mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO):
            c.touched.add(parent)  # its entry list, so its times, changed
        if mask & IN_CLOSE_WRITE:
            c.written.add(rel)
        if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            c.fresh.add(rel)
        return STORM if len(c.touched) > MAX_TOUCHED else ""

    def close(self) -> None:
        """Stops recording; a closed journal vouches for nothing any more."""
        self._watcher.forget(self)


class _Instance:
    """One inotify descriptor and the watches made on it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.wds: dict[int, tuple[Journal, str]] = {}
        self.journals = 0


class Watcher:
    """The control plane's inotify instances (at most ``budget.instances``,
    made as journals need them) and the watches of every journal, within
    ``budget``. ``attach`` hooks them to an event loop (a reader per
    instance drains its events as they come)."""

    def __init__(self, budget: Budget | None = None) -> None:
        self.budget = budget or Budget.from_host()
        self._lock = threading.Lock()
        self._instances: list[_Instance] = []
        self._libc: ctypes.CDLL | None = None
        self._readers: tuple[Callable[[int, Callable[[], None]], object], Callable[[int], object]] | None = (
            None
        )
        self.available = True
        self.watches = 0
        """Watches held now, over every journal."""
        self.degraded: Counter[str] = Counter()
        """Journals that fell back to walks, by reason (OVERFLOW, BUDGET, ...)."""

    @property
    def instances(self) -> int:
        """inotify instances held now."""
        return len(self._instances)

    def attach(
        self, add: Callable[[int, Callable[[], None]], object], remove: Callable[[int], object]
    ) -> None:
        """Drains each instance (those made later too) when ``add``'s loop sees it readable."""
        with self._lock:
            self._readers = (add, remove)
            for inst in self._instances:
                add(inst.fd, self._drainer(inst))

    def _drainer(self, inst: _Instance) -> Callable[[], None]:
        return lambda: self.drain(inst)

    def journal(self) -> Journal | None:
        """A new, empty journal: on an instance of its own while the budget
        allows, else on the least busy one; None where inotify is not available."""
        with self._lock:
            inst = min(self._instances, key=lambda i: i.journals, default=None)
            if (inst is None or inst.journals) and len(self._instances) < self.budget.instances:
                inst = self._open() or inst
            if inst is None:
                return None
            inst.journals += 1
            return Journal(self, inst)

    def _open(self) -> _Instance | None:
        if not self.available:
            return None
        try:
            libc = self._libc or ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            err = ctypes.get_errno() if fd < 0 else 0
        except (OSError, AttributeError):
            fd, err = -1, errno.ENOSYS
        if fd < 0:
            if not self._instances:
                log.warning(
                    "no inotify instance (%s): snapshots walk whole workspaces", os.strerror(err)
                )  # fmt: skip
                self.available = err in (errno.EMFILE, errno.ENFILE, errno.ENOMEM)
            return None
        self._libc = libc
        inst = _Instance(fd)
        self._instances.append(inst)
        if self._readers is not None:
            self._readers[0](fd, self._drainer(inst))
        return inst

    def add(self, journal: Journal, dir_fd: int, rel: str) -> None:
        """Watches ``dir_fd`` for ``journal``; one that cannot be watched
        (a budget, the kernel's limit) is broken."""
        with self._lock:
            if journal.broken:
                return
            budget = self.budget
            if len(journal.wds) >= budget.watches_per_sandbox or self.watches >= budget.watches_total:
                self._break(journal, BUDGET)
                return
            inst = journal._instance
            assert self._libc is not None
            wd = self._libc.inotify_add_watch(
                inst.fd, f"/proc/self/fd/{dir_fd}".encode(), WATCHED | IN_ONLYDIR
            )
            if wd < 0:
                err = ctypes.get_errno()
                if err == errno.ENOSPC:
                    log.warning("inotify watch limit reached: snapshots of this sandbox walk its workspace")
                self._break(journal, LIMIT if err == errno.ENOSPC else BUDGET)
                return
            if wd not in inst.wds:
                self.watches += 1
            inst.wds[wd] = (journal, rel)
            journal.wds.add(wd)

    def forget(self, journal: Journal) -> None:
        """Closes ``journal``: its watches go; events still queued for them are ignored."""
        with self._lock:
            self._unwatch(journal)
            if not journal.closed:
                journal.closed = True
                journal._instance.journals -= 1
            journal._give_up()

    def _unwatch(self, journal: Journal) -> None:
        inst = journal._instance
        for wd in journal.wds:
            if inst.wds.get(wd, (None,))[0] is journal:
                del inst.wds[wd]
                self.watches -= 1
                if self._libc is not None and inst.fd >= 0:
                    self._libc.inotify_rm_watch(inst.fd, wd)
        journal.wds.clear()

    def _break(self, journal: Journal, reason: str) -> None:
        """``journal`` falls back to walks: nothing it records counts any more, so its events stop."""
        if not journal.broken:
            self.degraded[reason] += 1
            journal.reason = reason
            log.info("a change journal fell back to walks (%s)", reason)
        journal.broken = True
        self._unwatch(journal)
        journal._give_up()

    def drain(self, inst: _Instance | None = None) -> None:
        """Applies every pending event of ``inst`` (None: of every instance) to its journals."""
        for one in [inst] if inst is not None else list(self._instances):
            self._drain(one)

    def _drain(self, inst: _Instance) -> None:
        if inst.fd < 0:
            return
        while True:
            try:
                data = os.read(inst.fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError as e:
                log.warning("inotify read failed (%s): its journals are distrusted", e)
                with self._lock:
                    self._break_all(inst, OVERFLOW)
                return
            if not data:
                return
            self._dispatch(inst, data)

    def _dispatch(self, inst: _Instance, data: bytes) -> None:
        pos = 0
        with self._lock:
            while pos + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, pos)
                raw = data[pos + _EVENT.size : pos + _EVENT.size + size]
                pos += _EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    self._break_all(inst, OVERFLOW)
                    continue
                owner = inst.wds.get(wd)
                if owner is None:
                    continue
                journal, rel = owner
                if mask & IN_IGNORED:  # its directory is gone (deleted, unmounted)
                    del inst.wds[wd]
                    self.watches -= 1
                    journal.wds.discard(wd)
                    continue
                name = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                path = f"{rel}/{name}" if rel and name else (name or rel)
                why = journal.note(path, mask) if path else (MOVED if mask & IN_MOVE_SELF else "")
                if why:
                    self._break(journal, why)

    def _break_all(self, inst: _Instance, reason: str) -> None:
        for journal in {j for j, _ in inst.wds.values()}:
            self._break(journal, reason)

    def close(self) -> None:
        """Closes every instance and forgets every watch; a later ``journal`` opens new ones."""
        with self._lock:
            for inst in self._instances:
                if self._readers is not None:
                    with contextlib.suppress(Exception):
                        self._readers[1](inst.fd)
                for journal in {j for j, _ in inst.wds.values()}:
                    journal.broken = True
                    journal.wds.clear()
                    journal._give_up()
                with contextlib.suppress(OSError):
                    os.close(inst.fd)
                inst.fd = -1
                inst.wds.clear()
            self._instances.clear()
            self._readers = None
            self.watches = 0
