"""What the host can see of a container: its cgroup counters and its
workspace filesystem. Read straight from /proc and /sys when the control plane
runs on the engine's host (as root), which turns an exit status 137 or an
ENOSPC into a named reason, and lets a fork bomb be frozen and killed without
starting a process inside the sandbox (which its pids limit would refuse).

/proc and /sys reads are served from kernel memory and take microseconds, so
they are done inline rather than on a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from sandboxd.backends.base import WORKSPACE, ExecOutcome, SandboxUsage

CGROUP_ROOT = Path("/sys/fs/cgroup")


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


def _int(text: str) -> int:
    with contextlib.suppress(ValueError):
        return int(text.strip())
    return 0


class ContainerProbe:
    """Host view of one container, by the host pid of its init process."""

    def __init__(self, pid: int, paths: dict[str, Path], unified: bool) -> None:
        self.pid = pid
        self._paths = paths
        self._unified = unified

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
        if "memory" in paths and paths["memory"].is_dir():
            return cls(pid, paths, unified=False)
        if unified_path and (CGROUP_ROOT / unified_path.lstrip("/")).is_dir():
            base = CGROUP_ROOT / unified_path.lstrip("/")
            return cls(pid, {"memory": base, "pids": base, "freezer": base, "cpuacct": base}, unified=True)
        return None

    # -- counters -----------------------------------------------------------

    def counters(self) -> Counters:
        if self._unified:
            oom = _field(_read(self._paths["memory"] / "memory.events"), "oom_kill")
        else:
            oom = _field(_read(self._paths["memory"] / "memory.oom_control"), "oom_kill")
        return Counters(oom, _field(_read(self._paths["pids"] / "pids.events"), "max"))

    def workspace(self) -> os.statvfs_result | None:
        try:
            return os.statvfs(f"/proc/{self.pid}/root{WORKSPACE}")
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
        fs = self.workspace()
        if fs is not None:
            if fs.f_files and fs.f_ffree == 0:
                return ExecOutcome.FILE_LIMIT, f"the workspace holds its maximum of {fs.f_files} files"
            if fs.f_blocks and fs.f_bavail == 0:
                return ExecOutcome.DISK_FULL, f"the workspace is full ({fs.f_blocks * fs.f_frsize} bytes)"
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

    def kill_tagged(self, tag: bytes) -> int:
        """Freezes the container, SIGKILLs every process whose environment
        carries ``tag``, thaws it. Freezing first means nothing can fork while
        we look. Returns how many processes were killed."""
        frozen = self._freeze(True)
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
        if self._unified:
            target = self._paths["freezer"] / "cgroup.freeze"
            value, state_file, want = ("1" if on else "0"), target, None
        else:
            target = self._paths.get("freezer", Path("/nonexistent")) / "freezer.state"
            value, state_file, want = ("FROZEN" if on else "THAWED"), target, ("FROZEN" if on else "THAWED")
        try:
            target.write_text(value)
        except OSError:
            return False
        if want is None or not on:
            return True
        # Freezing is asynchronous in cgroup v1: wait (briefly) until it took.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            if _read(state_file).strip() == want:
                return True
        return True
