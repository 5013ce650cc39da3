"""What the host can see of a container: its cgroup counters and its
workspace filesystem. Read straight from /proc and /sys when the control plane
runs on the engine's host (as root), which turns an exit status 137 or an
ENOSPC into a named reason, and lets a fork bomb be frozen and killed without
starting a process inside the sandbox (which its pids limit would refuse).

It also gives each exec stream a cgroup of its own below the container's
(a ``Cell``): the stream's first process is moved there before it runs
anything, every process it starts is born there, and nothing in the sandbox
(non-root, no capabilities, cgroupfs read-only) can move out. Freezing and
killing a cell ends every process the stream started, however they detached.

/proc and /sys reads are served from kernel memory and take microseconds, so
they are done inline rather than on a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from sandboxd.backends.base import WORKSPACE, ExecOutcome, SandboxUsage

CGROUP_ROOT = Path("/sys/fs/cgroup")
# task->flags bit of a process that has begun to exit (include/linux/sched.h).
_PF_EXITING = 0x4
# The sandbox's other writable filesystems, each with its own size and file
# limit (the backend's tmpfs mounts): filling one is named like filling the
# workspace.
SCRATCH = ("/tmp", "/dev/shm", "/mnt")


@dataclass(frozen=True)
class Counters:
    oom_kills: int
    pids_max_events: int


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _field(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def _raw_field(path: bytes, key: bytes) -> int:
    """_field of a small file read with one read(2) (a text-mode read costs
    several times more)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        data = os.read(fd, 4096)
    except OSError:
        return 0
    finally:
        os.close(fd)
    for line in data.split(b"\n"):
        name, _, value = line.partition(b" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def _int(text: str) -> int:
    with contextlib.suppress(ValueError):
        return int(text.strip())
    return 0


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after "pid (comm) ": [state, ppid, ...]; [] if gone."""
    text = _read(Path(f"/proc/{pid}/stat"))
    return text.rpartition(") ")[2].split() if text else []


def _freeze(path: Path, unified: bool, on: bool) -> bool:
    """Freezes (or thaws) the cgroup at ``path`` and all below it; whether
    the write took. Waits (briefly) for a freeze to complete: it is
    asynchronous, and only a frozen cgroup holds still."""
    if unified:
        target, value = path / "cgroup.freeze", "1" if on else "0"
    else:
        target, value = path / "freezer.state", "FROZEN" if on else "THAWED"
    try:
        target.write_text(value)
    except OSError:
        return False
    if not on:
        return True
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        if unified:
            if "frozen 1" in _read(path / "cgroup.events"):
                break
        elif _read(target).strip() == "FROZEN":
            break
    return True


class Cell:
    """A cgroup of one exec stream (see the module docstring): its first
    process (a shell, or a one-shot command) and all they start. Blocking
    calls (they freeze and wait) belong on a worker thread; ``pids`` is a
    single read."""

    def __init__(self, path: Path, parent: Path, unified: bool) -> None:
        self.path = path
        self._procs = os.fsencode(path / "cgroup.procs")
        self._parent = parent
        self._unified = unified

    def others(self, keep: int) -> bool:
        """Whether anything but ``keep`` is in it. Asked after every session
        command: a fresh open each time, as cgroup v1 serves an open file the
        pid list it read first."""
        return any(p != keep for p in self.pids())

    def enter(self, pid: int) -> bool:
        """Moves the host process ``pid`` (with its threads) in."""
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        """The host pids of the processes in it (read raw: a text-mode read
        costs ten times more)."""
        chunks: list[bytes] = []
        try:
            fd = os.open(self._procs, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        except OSError:
            pass
        finally:
            os.close(fd)
        return [int(p) for p in b"".join(chunks).split() if p.isdigit()]

    def kill(self, spare: int = 0) -> int:
        """SIGKILLs every process in it but ``spare`` (a session's shell),
        frozen first so nothing forks meanwhile; how many were signalled."""
        killed = 0
        for _ in range(5):
            victims = [p for p in self.pids() if p != spare]
            if not victims:
                break
            frozen = _freeze(self.path, self._unified, True)
            try:
                for pid in [p for p in self.pids() if p != spare]:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
            finally:
                if frozen:
                    _freeze(self.path, self._unified, False)
            if frozen:
                break
        return killed

    def settle(self, keep: int) -> None:
        """Moves every process but ``keep`` out, to the container's cgroup:
        what a command that ended left running (a daemon) is no longer part
        of the next command's tree."""
        self._move_out(keep)

    def release(self) -> None:
        """Moves whatever is left out and removes the cgroup; quiet when the
        container (and with it the cgroup) is already gone."""
        self._move_out(0)
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def _move_out(self, keep: int) -> None:
        if not [p for p in self.pids() if p != keep]:
            return
        # Frozen, nothing forks while it moves: a child born in the cell
        # after the list was read would stay behind.
        frozen = _freeze(self.path, self._unified, True)
        try:
            for _ in range(5):
                moving = [p for p in self.pids() if p != keep]
                if not moving:
                    break
                for pid in moving:
                    with contextlib.suppress(OSError):
                        (self._parent / "cgroup.procs").write_text(str(pid))
        finally:
            if frozen:
                _freeze(self.path, self._unified, False)


class ContainerProbe:
    """Host view of one container, by the host pid of its init process."""

    def __init__(self, pid: int, paths: dict[str, Path], unified: bool, started: str = "") -> None:
        """``started``: the init process's start time (/proc/<pid>/stat), to
        tell it from a later process that reuses its pid."""
        self.pid = pid
        self.writable_root = False
        """The root is bounded too (rootfs.py): named when it is full."""
        self._paths = paths
        self._counter_files: tuple[bytes, bytes] | None = None
        self._unified = unified
        self._started = started

    @classmethod
    def open(cls, pid: int) -> ContainerProbe | None:
        """None when this process cannot see the container (remote engine,
        not root, another pid namespace)."""
        text = _read(Path(f"/proc/{pid}/cgroup"))
        if not text:
            return None
        paths: dict[str, Path] = {}
        unified_path = ""
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, rel = parts
            if controllers == "":
                unified_path = rel
            for c in controllers.split(","):
                if c:
                    paths[c] = CGROUP_ROOT / c / rel.lstrip("/")
        stat = _stat_fields(pid)
        started = stat[19] if len(stat) > 19 else ""
        if "memory" in paths and paths["memory"].is_dir():
            return cls(pid, paths, unified=False, started=started)
        if unified_path and (CGROUP_ROOT / unified_path.lstrip("/")).is_dir():
            base = CGROUP_ROOT / unified_path.lstrip("/")
            paths = {"memory": base, "pids": base, "freezer": base, "cpuacct": base}
            return cls(pid, paths, unified=True, started=started)
        return None

    def running(self) -> bool:
        """Whether the container's init process still runs: not gone, not a
        zombie, not exiting. When a container is killed its init dies first
        and takes every other process with it, so a command's stream can end
        while the engine still says "running"; this already knows."""
        stat = _stat_fields(self.pid)
        if len(stat) < 20 or (self._started and stat[19] != self._started):
            return False
        try:
            exiting = int(stat[6]) & _PF_EXITING
        except ValueError:
            return True
        return stat[0] not in ("Z", "X", "x") and not exiting

    def host_pid(self, ns_pid: int) -> int | None:
        """The host pid of the container's process whose pid inside it is
        ``ns_pid`` (the last NSpid entry), or None."""
        for pid in self._procs():
            for line in _read(Path(f"/proc/{pid}/status")).splitlines():
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    if ids and ids[-1] == str(ns_pid):
                        return pid
                    break
        return None

    def cell(self) -> Cell | None:
        """A new cgroup below the container's, for one exec stream; None when
        it cannot be made (not root, cgroupfs read-only, no freezer)."""
        parent = self._paths.get("freezer")
        if parent is None:
            return None
        path = parent / f"sandboxd-{secrets.token_hex(6)}"
        try:
            path.mkdir()
        except OSError:
            return None
        return Cell(path, parent, self._unified)

    # -- counters -----------------------------------------------------------

    def counters(self) -> Counters:
        """The OOM-kill and pids-limit counters: read twice per failed command
        and once per other, so read raw from paths made once."""
        if self._counter_files is None:
            memory = self._paths["memory"] / ("memory.events" if self._unified else "memory.oom_control")
            self._counter_files = (os.fsencode(memory), os.fsencode(self._paths["pids"] / "pids.events"))
        oom_file, pids_file = self._counter_files
        return Counters(_raw_field(oom_file, b"oom_kill"), _raw_field(pids_file, b"max"))

    def workspace(self) -> os.statvfs_result | None:
        return self._statvfs(WORKSPACE)

    def _statvfs(self, path: str) -> os.statvfs_result | None:
        try:
            return os.statvfs(f"/proc/{self.pid}/root{path}")
        except OSError:
            return None

    def classify(self, before: Counters, exit_code: int, timed_out: bool) -> tuple[ExecOutcome, str] | None:
        """Why a command failed, if a limit explains it."""
        after = self.counters()
        if after.oom_kills > before.oom_kills:
            return ExecOutcome.OOM_KILLED, "a process hit the sandbox's memory limit and was killed"
        if after.pids_max_events > before.pids_max_events:
            return ExecOutcome.PIDS_EXHAUSTED, "the sandbox's process limit was reached (fork refused)"
        if exit_code == 0 or timed_out:
            return None
        for path in (WORKSPACE, *SCRATCH, *(("/",) if self.writable_root else ())):
            fs = self._statvfs(path)
            if fs is None:
                continue
            where = {WORKSPACE: "the workspace", "/": "the root filesystem"}.get(path, path)
            if fs.f_files and fs.f_ffree == 0:
                return ExecOutcome.FILE_LIMIT, f"{where} holds its maximum of {fs.f_files} files"
            if fs.f_blocks and fs.f_bavail == 0:
                return ExecOutcome.DISK_FULL, f"{where} is full ({fs.f_blocks * fs.f_frsize} bytes)"
        return None

    def usage(self) -> SandboxUsage:
        mem = self._paths["memory"]
        if self._unified:
            memory, peak = _int(_read(mem / "memory.current")), _int(_read(mem / "memory.peak"))
            cpu = _field(_read(self._paths["cpuacct"] / "cpu.stat"), "usage_usec") / 1e6
        else:
            memory, peak = (
                _int(_read(mem / "memory.usage_in_bytes")),
                _int(_read(mem / "memory.max_usage_in_bytes")),
            )
            cpu = _int(_read(self._paths.get("cpuacct", mem) / "cpuacct.usage")) / 1e9
        fs = self.workspace()
        disk_total = fs.f_blocks * fs.f_frsize if fs else 0
        disk_used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize if fs else 0
        # The root directory itself holds one inode.
        files = max(0, fs.f_files - fs.f_ffree - 1) if fs else 0
        return SandboxUsage(
            memory_bytes=memory,
            memory_peak_bytes=peak,
            pids=_int(_read(self._paths["pids"] / "pids.current")),
            disk_bytes=disk_used,
            disk_total_bytes=disk_total,
            files=files,
            files_total=fs.f_files if fs else 0,
            cpu_seconds=cpu,
        )

    # -- killing ------------------------------------------------------------

    def kill_tagged(self, tag: bytes, freeze: bool = True) -> int:
        """Freezes the container, SIGKILLs every process whose environment
        carries ``tag``, thaws it. Freezing first means nothing can fork while
        we look; without ``freeze`` (the tagged processes are in a cell,
        which is frozen for its own kill) an exec starting meanwhile is not
        refused for a paused container. Returns how many were killed."""
        frozen = self._freeze(True) if freeze else False
        killed = 0
        try:
            for _ in range(20):
                found = 0
                for pid in self._procs():
                    env = b""
                    with contextlib.suppress(OSError):
                        env = Path(f"/proc/{pid}/environ").read_bytes()
                    if tag in env.split(b"\0"):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
                            found += 1
                killed += found
                if not found or frozen:
                    break
        finally:
            if frozen:
                self._freeze(False)
        return killed

    def _procs(self) -> list[int]:
        text = _read(self._paths["pids"] / "cgroup.procs")
        return [int(p) for p in text.split() if p.isdigit()]

    def _freeze(self, on: bool) -> bool:
        path = self._paths.get("freezer")
        return path is not None and _freeze(path, self._unified, on)
