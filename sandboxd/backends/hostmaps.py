"""Which workspace files a container's processes have mapped shared and
writable, as the host sees them (/proc/<pid>/maps of every process in the
container's cgroup).

A write through such a mapping leaves no inotify event, and the kernel
moves a file's times only on the first write to each page after the
mapping is made (a tmpfs page stays dirty for good), so neither a change
journal nor a stamp can tell that the file changed. A snapshot therefore
reads every file mapped this way again, and also those mapped at its
previous capture (a page dirtied then and written since moved nothing).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from sandboxd.backends.layout import WORKSPACE

CGROUP_ROOT = "/sys/fs/cgroup"
# Controllers whose hierarchy holds every process of a container, in the
# order they are tried under cgroup v1 (v2 has one hierarchy).
_V1_CONTROLLERS = ("pids", "memory", "cpuacct", "freezer")
_DELETED = " (deleted)"
# A vanished process or cgroup is no mapping; anything else leaves us blind.
_GONE = (errno.ENOENT, errno.ESRCH)


class Unknown(Exception):
    """The mappings of some process of the container could not be read."""


def cgroup_dir(proc_fd: int) -> str | None:
    """The cgroup directory (on this host) holding the process open as
    ``proc_fd`` (a /proc/<pid> directory) and everything it forks; None if
    none can be found."""
    try:
        text = _read_at(proc_fd, "cgroup").decode(errors="replace")
    except OSError:
        return None
    unified = ""
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":
            unified = parts[2]
        for c in parts[1].split(","):
            v1[c] = parts[2]
    for c in _V1_CONTROLLERS:
        # A process in the hierarchy's root would make every process on the
        # host look like the container's.
        if v1.get(c, "/") != "/":
            path = f"{CGROUP_ROOT}/{c}{v1[c].rstrip('/')}"
            if os.path.isdir(path):
                return path
    if unified and unified != "/":
        path = f"{CGROUP_ROOT}{unified.rstrip('/')}"
        if os.path.isdir(path):
            return path
    return None


def cgroup_pids(top: str) -> Iterator[int]:
    """Every process in cgroup ``top`` and the cgroups below it (an exec's
    own cgroup lies below its container's)."""
    for where, _, _ in os.walk(top):
        try:
            with open(os.path.join(where, "cgroup.procs"), "rb") as f:
                text = f.read()
        except OSError as e:
            if e.errno in _GONE:
                continue  # removed while walked: its processes are gone too
            raise Unknown(f"cannot list the processes of {where}: {e.strerror}") from e
        for p in text.split():
            if p.isdigit():
                yield int(p)


def namespace_pids(proc_fd: int) -> Iterator[int]:
    """Every process in the pid namespace of the one open as ``proc_fd``
    (where no cgroup directory tells them): a pass over /proc."""
    try:
        want = os.stat("ns/pid", dir_fd=proc_fd)
    except OSError as e:
        raise Unknown(f"cannot tell the sandbox's pid namespace: {e.strerror}") from e
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{name}/ns/pid")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            yield int(name)


def shared_writable(maps: bytes, where: str = WORKSPACE) -> set[str]:
    """Paths below ``where`` (relative to it) that a /proc/<pid>/maps text
    shows mapped shared and writable; a deleted file is no longer there."""
    prefix = where.rstrip("/") + "/"
    out: set[str] = set()
    for line in maps.split(b"\n"):
        fields = line.split(None, 5)
        if len(fields) < 6:
            continue
        perms = fields[1]
        if len(perms) < 4 or perms[1:2] != b"w" or perms[3:4] != b"s":
            continue
        # The kernel writes a newline in a name as the escape \012.
        path = fields[5].decode("utf-8", "surrogateescape").replace("\\012", "\n")
        if path.endswith(_DELETED) or not path.startswith(prefix):
            continue
        rel = path[len(prefix) :]
        if rel:
            out.add(rel)
    return out


def mapped_files(proc_fd: int, where: str = WORKSPACE) -> frozenset[str]:
    """Files below ``where`` (the workspace as the container sees it)
    mapped shared and writable by any process of the container whose init
    is open as ``proc_fd``; Unknown if that cannot be told (a process whose
    mappings cannot be read)."""
    top = cgroup_dir(proc_fd)
    pids = cgroup_pids(top) if top is not None else namespace_pids(proc_fd)
    out: set[str] = set()
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in _GONE:
                continue
            raise Unknown(f"cannot read the mappings of process {pid}: {e.strerror}") from e
        try:
            out |= shared_writable(_read_all(fd), where)
        except OSError as e:
            # A process that exits while read answers ESRCH or an empty read.
            if e.errno not in _GONE:
                raise Unknown(f"cannot read the mappings of process {pid}: {e.strerror}") from e
        finally:
            os.close(fd)
    return frozenset(out)


def _read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 1 << 16):
        parts.append(chunk)
    return b"".join(parts)


def _read_at(dfd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        return os.read(fd, 1 << 16)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
